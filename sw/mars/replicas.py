"""Replica factors (paper §4 eq 9–16, 29).

All arithmetic is on integers (bytes, tokens), so the floors of eq 11 and 15 are exact.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["r_mem", "r_feasible", "r_reuse", "replica_factor", "m_node_avg"]


def r_mem(nodes: int, s_node: int, m_hist: int) -> int:
    """Eq 11: ``r_mem(c) = ⌊N·S_node / M_hist(c)⌋`` (unclamped; may be 0 or exceed N)."""
    if m_hist <= 0:
        raise ValueError("M_hist must be positive")
    return (nodes * s_node) // m_hist


def r_feasible(nodes: int, rmem: int) -> int:
    """Eq 12: ``r_c = max(1, min(N, r_mem(c)))``."""
    return max(1, min(nodes, rmem))


def r_reuse(c: int, num_chunks: int, nodes: int, alpha: float | Fraction) -> int:
    """Eq 15: ``r_reuse(c) = max(1, min(N, 1 + ⌊α·(C − c)⌋))``."""
    if not 1 <= c <= num_chunks:
        raise ValueError(f"chunk index {c} outside 1..{num_chunks}")
    a = Fraction(alpha).limit_denominator(1 << 20) if not isinstance(alpha, Fraction) else alpha
    return max(1, min(nodes, 1 + math.floor(a * (num_chunks - c))))


def replica_factor(c: int, num_chunks: int, nodes: int, rmem: int, rreuse: int) -> int:
    """Eq 16 ``r(c) = max(1, min(N, r_mem(c), r_reuse(c)))`` with eq 29 ``r(C) = 1``."""
    if c == num_chunks:
        return 1
    return max(1, min(nodes, rmem, rreuse))


def m_node_avg(m_chunk: int, nodes: int, factors) -> Fraction:
    """Eq 9: average per-node KV bytes ``(M_chunk / N)·Σ r(i)`` for the blocks held so far."""
    return Fraction(m_chunk * sum(factors), nodes)

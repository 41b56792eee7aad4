"""Token layout of one chunk over the nodes (our reading of paper §3.1, §4).

Every chunk's ``B`` tokens are spread over the ``N`` nodes; the node that computes a slice is its
permanent owner. Per chunk every node gets ``⌊B/N⌋`` or ``⌈B/N⌉`` tokens; the ``B mod N``
extra tokens go round robin (chunk ``c`` continues where chunk ``c−1`` stopped), so after every
chunk the owned token counts differ by at most one.

* ``contiguous`` (Ring Attention): node ``n`` takes the ``n``-th contiguous run of the chunk, so
  the last node's queries see the most keys of the diagonal block (causal imbalance).
* ``zigzag`` (Zigzag Attention, and MARS): the chunk is cut into ``2N`` pieces and node ``n``
  takes pieces ``n`` and ``2N−1−n``, pairing light and heavy causal work.
"""

from __future__ import annotations

__all__ = ["LAYOUTS", "node_token_counts", "chunk_ranges", "causal_keys"]

LAYOUTS = ("contiguous", "zigzag")


def node_token_counts(c: int, chunk: int, nodes: int) -> list[int]:
    """Tokens each node owns in chunk ``c`` (1-based)."""
    base, extra = divmod(chunk, nodes)
    return [base + (1 if (n - (c - 1) * extra) % nodes < extra else 0) for n in range(nodes)]


def chunk_ranges(c: int, chunk: int, nodes: int, layout: str) -> list[list[tuple[int, int]]]:
    """Per node, the global token ranges ``[start, stop)`` it owns in chunk ``c``."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}")
    counts = node_token_counts(c, chunk, nodes)
    start = (c - 1) * chunk
    out: list[list[tuple[int, int]]] = [[] for _ in range(nodes)]
    if layout == "contiguous":
        pos = start
        for n in range(nodes):
            out[n].append((pos, pos + counts[n]))
            pos += counts[n]
        return out
    pieces = [(n, (counts[n] + 1) // 2) for n in range(nodes)]
    pieces += [(n, counts[n] // 2) for n in reversed(range(nodes))]
    pos = start
    for n, size in pieces:
        if size:
            out[n].append((pos, pos + size))
        pos += size
    return out


def causal_keys(ranges) -> int:
    """Σ over the query tokens of the keys each attends to under the causal mask (token ``t``
    sees ``t + 1`` keys)."""
    return sum((b * (b + 1) - a * (a + 1)) // 2 for a, b in ranges)

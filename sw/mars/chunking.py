"""Chunk-size selection (paper §4 eq 5–8).

``B* = min B`` such that every chunk hides its KV propagation behind its attention,
``T_attn(B, c) ≥ γ·T_prop(B, r_c)`` for all ``c`` (eq 6, 7, 8), and the block fits the
propagation buffer, ``B·M_token ≤ M_buf`` (eq 5). Candidates are the divisors of ``S`` that give
every node at least one token, that keep ``L·C·N`` KV ids within ``Meta.kv_id`` and each slice's
fragments within ``Meta.seq``.

``T_prop(B, r)`` (eq 7) is evaluated on the network like ``T_comm``: each of the ``N`` slices of
a block goes down its multicast tree to the ``r − 1`` holders MARS would pick; the busiest link's
bytes over its rate is ``M_chunk·H_prop(r)/BW_eff`` and the deepest tree's latency is
``D_crit(r)·τ_link``. ``T_attn`` grows with ``c`` and ``r_c`` never grows, so the binding chunk
is usually ``c = 1``; it is reported. If no buffer-feasible ``B`` hides propagation, the largest
buffer-feasible ``B`` is chosen (most overlap possible) and the buffer is reported as binding.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .cluster import ClusterSpec
from .cost import link_loads, t_attn_eq6
from .layout import node_token_counts
from .metadata import MetaEncoder
from .model import ModelSpec
from .placement import holder_set
from .replicas import r_mem, r_reuse, replica_factor

__all__ = ["ChunkChoice", "t_prop", "choose_chunk", "chunk_candidates"]


@dataclass
class ChunkChoice:
    chunk: int
    auto: bool
    bound: str                  # "overlap" | "buffer" | "given"
    explanation: str
    binding_chunk: int | None = None
    buffer_max_tokens: int = 0
    eq5_ok: bool = True
    overlap_ok: bool = True
    rows: list = field(default_factory=list)   # (B, worst T_attn/γT_prop ratio, c at worst)


@dataclass(frozen=True)
class _Tree:
    links: frozenset


@dataclass(frozen=True)
class _T:
    tree: _Tree
    nbytes: int


def t_prop(model: ModelSpec, cluster: ClusterSpec, chunk: int, r: int) -> tuple[float, float,
                                                                                 int]:
    """Eq 7 for one block of ``chunk`` tokens at replica factor ``r``: ``(T_prop seconds,
    H_prop = mean tree edges per slice, D_crit hops)``."""
    topo, n = cluster.topology, cluster.nodes
    if r <= 1 or n == 1:
        return 0.0, 0.0, 0
    counts = node_token_counts(1, chunk, n)
    transfers, edges, depth, lat = [], 0, 0, 0.0
    for owner in range(n):
        holders = holder_set(topo, owner, r)[1:]
        tree = topo.tree(owner, holders)
        transfers.append(_T(_Tree(tree.links), counts[owner] * model.m_token))
        edges += tree.edges
        depth = max(depth, tree.depth)
        lat = max(lat, tree.latency_s)
    loads = link_loads(transfers)
    t_bw = max(b / cluster.link_bytes_per_s(lk) for lk, b in loads.items())
    return t_bw + lat, edges / n, depth


def chunk_candidates(model: ModelSpec, cluster: ClusterSpec, seq_len: int) -> list[int]:
    out = []
    for b in range(cluster.nodes, seq_len + 1):
        if seq_len % b:
            continue
        try:
            enc = MetaEncoder(model, cluster.nodes, seq_len // b, cluster.max_payload,
                              cluster.reduce_slots)
            enc.fragments(-(-b // cluster.nodes))
        except ValueError:
            continue
        out.append(b)
    return out


def _worst_ratio(model, cluster, seq_len, b, alpha, cache):
    C = seq_len // b
    worst, at = float("inf"), None
    for c in range(1, C + 1):
        rm = r_mem(cluster.nodes, cluster.kv_budget, model.m_hist(c, b))
        r = replica_factor(c, C, cluster.nodes, rm, r_reuse(c, C, cluster.nodes, alpha))
        if (b, r) not in cache:
            cache[(b, r)] = t_prop(model, cluster, b, r)[0]
        tp = cluster.gamma * cache[(b, r)]
        ratio = float("inf") if tp == 0 else t_attn_eq6(model, cluster, b, c) / tp
        if ratio < worst:
            worst, at = ratio, c
    return worst, at


def choose_chunk(model: ModelSpec, cluster: ClusterSpec, seq_len: int, alpha: float,
                 chunk: int | None = None) -> ChunkChoice:
    """Eq 8, or the checks of eq 5 and 8 for a given ``chunk``."""
    buf_max = cluster.buffer // model.m_token
    cache: dict = {}
    if chunk is not None:
        ratio, at = _worst_ratio(model, cluster, seq_len, chunk, alpha, cache)
        eq5 = chunk * model.m_token <= cluster.buffer
        notes = []
        if not eq5:
            notes.append(f"exceeds the buffer (eq 5: B·M_token = {chunk * model.m_token} B > "
                         f"M_buf = {cluster.buffer} B)")
        if ratio < 1:
            notes.append(f"propagation not hidden at chunk {at} (T_attn/γT_prop = {ratio:.3g})")
        text = f"B = {chunk} given" + ("; " + "; ".join(notes) if notes else
                                        "; fits the buffer and hides propagation (eq 5, 8)")
        return ChunkChoice(chunk, False, "given", text, at, buf_max, eq5, ratio >= 1,
                           [(chunk, ratio, at)])
    cands = chunk_candidates(model, cluster, seq_len)
    fit = [b for b in cands if b * model.m_token <= cluster.buffer]
    if not fit:
        raise ValueError(f"no chunk size fits the {cluster.buffer / 2**20:g} MiB buffer "
                         f"(eq 5: even B = {cands[0] if cands else cluster.nodes} tokens need "
                         f"more)")
    rows = []
    for b in fit:
        ratio, at = _worst_ratio(model, cluster, seq_len, b, alpha, cache)
        rows.append((b, ratio, at))
        if ratio == float("inf"):
            text = (f"B* = {b}: no replica propagation to hide (r_c = 1 at every chunk), so the "
                    f"smallest admissible B (>= 1 token per node, L*C*N within Meta.kv_id, "
                    f"fragments within Meta.seq); the buffer allows up to {buf_max} tokens")
            return ChunkChoice(b, True, "overlap", text, None, buf_max, True, True, rows)
        if ratio >= 1:
            text = (f"B* = {b}: smallest B with T_attn(B,c) >= {cluster.gamma:g}*T_prop(B,r_c) "
                    f"at every chunk (overlap bound, binding chunk c = {at}); the buffer allows "
                    f"up to {buf_max} tokens (eq 5)")
            return ChunkChoice(b, True, "overlap", text, at, buf_max, True, True, rows)
    b, ratio, at = rows[-1]
    text = (f"B* = {b}: no B within the buffer hides propagation (best T_attn/γT_prop = "
            f"{ratio:.3g} at chunk {at}); the largest B with B*M_token <= M_buf = "
            f"{cluster.buffer / 2**20:g} MiB was taken (buffer bound, eq 5)")
    return ChunkChoice(b, True, "buffer", text, at, buf_max, True, False, rows)

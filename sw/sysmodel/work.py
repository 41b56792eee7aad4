"""What one node's layer program does in one chunk step: the work counts the system model turns
into cycles. The program is the node's as built (:mod:`mcf.node.layer`, docs/node.md §3): per
layer ``JOB 2l`` (RMSNorm, requantise, Q/K/V GEMMs, RoPE, the query records), ``EMIT`` of the
slice's K/V, one ``ATTEND`` per (token, KV head) over the blocks it sees, ``JOB 2l+1`` (O
projection, residual, RMSNorm, SwiGLU MLP, residual). Every layer of a step does the same work.

Token layout (which positions a node computes in a step):

* ``plan`` — the MARS plan's ranges (:attr:`mcf.mars.schedule.Step.ranges`: zigzag for MARS,
  zigzag and PD, contiguous for ring); the KV reader fetches the causally visible keys.
* ``node-program`` — what :mod:`mcf.node.layer` runs today: node ``n``'s slice of chunk ``c`` is
  the ``n``-th contiguous run (:func:`mcf.node.layer.slice_positions`), and a token's ``ATTEND``
  reads every whole block that starts at or before it (:func:`mcf.node.layer.read_set`), masked
  keys included. The RTL layer bench ran this layout.

Prefill ATTEND records (``tile_chunk``, :func:`mcf.node.layer.prefill_tile_chunk`): ``0`` — one
PREFILL record per (token, KV head), counted by ``records``, ``pairs`` and ``kv_read_bytes``; on
a node with the tiled path in a single-softmax run, ``tile_chunk`` > 0 — one PREFILL_TILE record
per (run of at most ``tile_chunk`` consecutive tokens, KV head) over the key blocks that start
at or before its last token (``node-program``: the ``(block, slice)`` pieces of
:func:`mcf.node.layer.read_set`; ``plan``: the plan's ranges of the steps so far), its rows
(token x query head) in query tiles of :data:`mcf.abi.attend.ATTEND_TILE_ROWS` rows, each tile
against the blocks it does not lie wholly before — counted by ``tile_records``, ``tile_rows``
and ``tile_pairs`` (:func:`tile_pairs`).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ..abi.attend import ATTEND_TILE_ROWS
from ..abi.emit import kv_pair_bytes
from ..abi.kv import kv_token_bytes
from ..mars.layout import causal_keys
from ..mars.model import ModelSpec

__all__ = ["LAYOUTS", "SCOPES", "NodeWork", "linear_macs", "vector_elements", "token_ranges",
           "node_work", "keys_read_blocks", "prefill_ops", "compute_bound_s", "key_pieces",
           "tile_pairs"]

LAYOUTS = ("plan", "node-program")
SCOPES = ("model", "attention")


def linear_macs(model: ModelSpec) -> tuple[int, int]:
    """GEMM multiply-accumulates per token and layer of ``JOB 2l`` (Q, K, V) and ``JOB 2l+1``
    (O, gate, up, down)."""
    h, nq, nkv = model.hidden, model.q_heads * model.head_dim, model.kv_heads * model.head_dim
    return h * (nq + 2 * nkv), nq * h + 3 * h * model.intermediate


def prefill_ops(model: ModelSpec, seq_len: int, scope: str = "model") -> float:
    """Operations of a causal prefill of ``seq_len`` tokens over all layers: attention
    ``4·L·H_q·d`` per (query, key) pair over ``S(S+1)/2`` pairs, plus (scope ``model``) 2 per
    linear-layer weight per token (no embedding, no LM head: what a ``model`` TTFT covers)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r} (one of {', '.join(SCOPES)})")
    attn = model.attn_ops_per_pair * seq_len * (seq_len + 1) / 2
    return attn + (model.linear_ops_per_token * seq_len if scope == "model" else 0)


def compute_bound_s(model: ModelSpec, seq_len: int, nodes: int, macs_per_cycle_peak: float,
                    clock_hz: float, scope: str = "model") -> float:
    """The TTFT no schedule can beat on ``nodes`` nodes of this configuration: the prefill's
    operations (:func:`prefill_ops`) over ``N x 2 x macs_per_cycle_peak x clock_hz`` (one
    multiply-accumulate = 2 operations, every node's GEMM array at its peak every cycle, the
    work split perfectly, nothing else on the node). ``mcf model`` prints it per row as
    ``compute_bound_s``, with the configuration's peak (:attr:`NodeConfig.macs_per_cycle`)."""
    return prefill_ops(model, seq_len, scope) / (nodes * 2 * macs_per_cycle_peak * clock_hz)


def vector_elements(model: ModelSpec) -> tuple[int, int]:
    """Elements the vector unit reads per token and layer in ``JOB 2l`` and ``JOB 2l+1``: one
    per element of every VEC pass of the templates of :class:`mcf.node.layer.ModelImage`
    (``JOB 2l``: RMSNorm and requantise of the input (h each), RoPE of Q (H_q·d), RoPE of K and
    the V copy (H_kv·d each), the query requantise (H_q·d); ``JOB 2l+1``: requantise of the
    attention output (H_q·d), residual add, RMSNorm, requantise (h each), SiLU·mul and its
    requantise (intermediate each), residual add (h))."""
    h, nq, nkv = model.hidden, model.q_heads * model.head_dim, model.kv_heads * model.head_dim
    return 2 * h + 2 * nq + 2 * nkv, nq + 4 * h + 2 * model.intermediate


def token_ranges(plan, index: int, node: int, layout: str) -> list[tuple[int, int]]:
    """Positions node ``node`` computes in chunk step ``index`` (1-based) under ``layout``."""
    if layout == "plan":
        return list(plan.steps[index - 1].ranges[node])
    if layout == "node-program":
        from ..node.layer import slice_positions
        if len(plan.scheduler.pool) != plan.cluster.nodes:
            raise ValueError("the node-program layout needs every node in the prefill pool "
                             f"(policy {plan.policy!r} uses {len(plan.scheduler.pool)} of "
                             f"{plan.cluster.nodes})")
        p0, m = slice_positions(plan, index, node)
        return [(p0, p0 + m)] if m else []
    raise ValueError(f"unknown layout {layout!r} (one of {', '.join(LAYOUTS)})")


def keys_read_blocks(plan, index: int, node: int) -> int:
    """Key tokens the KV reader fetches for one KV head of node ``node``'s slice in step
    ``index`` under the node program: each token reads every whole slice of blocks ``1..index``
    that starts at or before it (:func:`mcf.node.layer.read_set` per token)."""
    from ..node.layer import slice_positions
    starts, sizes = [], []
    for b in range(1, index + 1):
        for s in range(plan.cluster.nodes):
            q0, qn = slice_positions(plan, b, s)
            if qn:
                starts.append(q0)
                sizes.append(qn)
    order = sorted(range(len(starts)), key=starts.__getitem__)
    starts = [starts[i] for i in order]
    prefix = [0]
    for i in order:
        prefix.append(prefix[-1] + sizes[i])
    p0, m = slice_positions(plan, index, node)
    return sum(prefix[bisect.bisect_right(starts, t)] for t in range(p0, p0 + m))


def key_pieces(plan, index: int, layout: str) -> list[tuple[int, int]]:
    """The KV blocks a step-``index`` ATTEND list may name, in list order, as ``(first
    position, tokens)``: every non-empty slice (``node-program``) or range (``plan``) of every
    node in steps ``1..index``."""
    out = []
    for b in range(1, index + 1):
        for s in range(plan.cluster.nodes):
            for a, e in token_ranges(plan, b, s, layout):
                if e > a:
                    out.append((a, e - a))
    return out


def tile_pairs(p0: int, n: int, heads: int, pieces) -> tuple[tuple[int, int], ...]:
    """The (query tile, block) pairs of one PREFILL_TILE record of tokens ``p0 .. p0+n-1`` with
    ``heads`` query heads over the key blocks ``pieces`` (``(first position, tokens)``, list
    order; those after the last token are not in its list): ``(rows of the tile that see the
    block, the block's keys)`` per pair, as :class:`mcf.hdl.node.tile_unit.TileUnit` issues
    them (a tile skips the blocks it lies wholly before)."""
    rows = n * heads
    out = []
    for lo in range(0, rows, ATTEND_TILE_ROWS):
        hi = min(lo + ATTEND_TILE_ROWS, rows)
        for q0, qn in pieces:
            if q0 > p0 + n - 1:
                continue
            # rows x of the tile whose token p0 + x // heads is at or after q0
            first = max(lo, (q0 - p0) * heads)
            if first < hi:
                out.append((hi - first, qn))
    return tuple(out)


@dataclass(frozen=True)
class NodeWork:
    """One node's work in one layer of one chunk step (the same in every layer)."""
    tokens: int
    macs_a: int             # JOB 2l GEMM MACs
    macs_b: int             # JOB 2l+1 GEMM MACs
    vec_a: int              # JOB 2l vector elements
    vec_b: int              # JOB 2l+1 vector elements
    records: int            # ATTEND records: tokens x H_kv
    pairs: int              # causally visible (query, key, head) triples
    kv_read_bytes: int      # KV record bytes the KV reader fetches
    emit_bytes: int         # ACT K/V bytes EMIT reads
    tile_records: int = 0   # PREFILL_TILE records (then none of the per-token ones are run)
    tile_rows: int = 0      # their query rows (token x query head)
    tile_pairs: tuple = ()  # their (query tile, block) pairs: (rows, keys) each


def node_work(model: ModelSpec, plan, index: int, node: int, layout: str,
              scope: str = "model", tile_chunk: int = 0) -> NodeWork:
    """The work of ``node`` in step ``index``. ``scope="attention"`` keeps the ATTEND records
    only (no JOBs, no EMIT): attention alone, as MARS's cost model's ``attention`` scope.
    ``tile_chunk`` > 0: the prefill ATTEND is PREFILL_TILE records of at most that many tokens
    (module docstring)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r} (one of {', '.join(SCOPES)})")
    ranges = token_ranges(plan, index, node, layout)
    tokens = sum(b - a for a, b in ranges)
    visible = causal_keys(ranges)
    keys = keys_read_blocks(plan, index, node) if layout == "node-program" else visible
    (ma, mb), (va, vb) = linear_macs(model), vector_elements(model)
    lin = 1 if scope == "model" else 0
    tiled = {}
    if tile_chunk > 0:
        pieces = key_pieces(plan, index, layout)
        g = model.q_heads // model.kv_heads
        recs, rows, pairs = 0, 0, []
        for a, e in ranges:
            for p0 in range(a, e, tile_chunk):
                n = min(tile_chunk, e - p0)
                recs += 1
                rows += n * g
                pairs += tile_pairs(p0, n, g, pieces)
        k = model.kv_heads
        tiled = {"tile_records": recs * k, "tile_rows": rows * k, "tile_pairs": tuple(pairs) * k}
    return NodeWork(
        tokens=tokens, macs_a=lin * ma * tokens, macs_b=lin * mb * tokens,
        vec_a=lin * va * tokens, vec_b=lin * vb * tokens,
        records=tokens * model.kv_heads, pairs=visible * model.q_heads,
        kv_read_bytes=keys * model.kv_heads * kv_token_bytes(model.head_dim),
        emit_bytes=lin * tokens * model.kv_heads * kv_pair_bytes(model.head_dim), **tiled)

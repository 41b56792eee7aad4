"""Golden model of tensor-parallel decode over N nodes (issue #34 item 3; docs/cluster.md
"Tensor-parallel decode: the golden model"): the Helix pattern — KV-parallel attention over the
owner-only KV, tensor-parallel projections and MLP — computed shard by shard, node by node, and
**bit-exact** with today's replicated-root decode
(:func:`mcf.golden.node_decode.golden_decode`).

Per layer of one decode token at ``position`` (every node holds the residual row ``x``):

* **replicated** — RMSNorm and the INT8 requantisation of its output (every node, same bits).
* **column-parallel** Q, K, V, gate, up — node ``i`` runs the GEMM on its rows only
  (:class:`TPSplit`): query heads ``heads[i]``, K and V rows ``kv_rows[i]``, intermediate rows
  ``inter[i]``; a GEMM's output rows are independent, so the shards are the full GEMM's rows.
  RoPE of Q on the node (its heads); the token's K and V row shards are gathered at the token's
  root (KV-stationary: the root keeps the new token's KV), which applies RoPE to K, quantises
  and lands them as today.
* **attention, KV-parallel** — every node attends with every query head over the KV it holds
  (the query shards are gathered: each head's owner multicasts its query records), the states
  of a head merge along the token root's reduction chain as in root decode (so the merged bits
  are root decode's for either softmax), and head ``h``'s normalised row is delivered to its
  owner (the final result's route).
* **row-parallel** O (input: the node's heads' attention rows) and down (input: the node's
  ``silu(gate)·up`` shard, :func:`column_ffn`; the whole FFN: :func:`tp_ffn`): the row's
  scale from a ``ReduceOp.MAX`` all-reduce of the shards' :func:`mcf.abi.tp.absmax_lanes`,
  each node's exact partial accumulator (:func:`partial_acc`) as :func:`mcf.abi.tp.acc_lanes`,
  a ``ReduceOp.SUM`` all-reduce through the NIC's golden reduction engine
  (:class:`mcf.golden.nic.ReduceModel`), then the GEMM epilogue once on every node, the
  residual add replicated.

The numerics (:mod:`mcf.abi.tp`): the single-node GEMM accumulates exact integers and rounds
once, so the split is exact for any K ranges (group-aligned or not) given the shared scale, the
two-lane SUM (exact for ``N ≤ TP_MAX_NODES``) and the one epilogue. A K range that is not on
group boundaries is run as the whole groups it touches with zero codes outside it (the engine
takes whole groups); :func:`tp_split` splits the MLP on group boundaries whenever it has at
least N groups, O's K ranges follow the heads (group-aligned when ``head_dim`` is the group, as
in Qwen2.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.meta import Collective, Meta, Op, ReduceOp
from mcf.abi.nic import LANE_BYTES, reduce_config
from mcf.abi.quant import requantize, rope_pair_order, rope_table
from mcf.abi.softmax import empty_state, pack_state
from mcf.abi.tp import (
    ACC_LANES,
    TP_MAX_NODES,
    absmax_lanes,
    acc_lanes,
    lanes_absmax,
    lanes_acc,
    requantize_with_absmax,
)
from mcf.quant import QuantWeight

from . import gemm as G
from . import vector as V
from .attention import attend_fixed, attend_max, attend_single
from .nic import Packet, ReduceModel
from .qwen_layer import LayerConfig, QuantLayer

__all__ = ["TPError", "TPSplit", "tp_split", "gemm_blob_bytes", "node_weight_bytes",
           "nic_all_reduce", "partial_acc", "RowParallel", "row_parallel", "column_ffn", "TPFFN",
           "tp_ffn", "TPDecodeLayer", "tp_layer", "TPPreAttention", "tp_pre_attention",
           "TPPostAttention",
           "tp_post_attention", "tp_golden_decode", "vocab_split", "tp_head", "slice_argmax",
           "merge_argmax"]

Range = tuple[int, int]


class TPError(ValueError):
    """A tensor-parallel decode the shapes, the node or its DDR cannot run (one line)."""


@dataclass(frozen=True)
class TPSplit:
    """Per node ``i`` the half-open ranges it owns: query heads ``heads[i]`` (Q rows, and the
    O projection's K range ``heads · head_dim``), K and V rows ``kv_rows[i]``, intermediate rows
    ``inter[i]`` (gate/up rows, the down projection's K range)."""
    nodes: int
    head_dim: int
    group: int
    heads: tuple[Range, ...]
    kv_rows: tuple[Range, ...]
    inter: tuple[Range, ...]

    def q_rows(self, i: int) -> Range:
        """Node ``i``'s Q rows = its K range of the O projection."""
        h0, h1 = self.heads[i]
        return h0 * self.head_dim, h1 * self.head_dim

    def groups(self, k: Range) -> Range:
        """The weight groups a K range touches (the node's GEMM runs whole groups)."""
        return k[0] // self.group, -(-k[1] // self.group)

    def aligned(self, k: Range) -> bool:
        return k[0] % self.group == 0 and k[1] % self.group == 0

    def head_owner(self, h: int) -> int:
        return next(i for i, (h0, h1) in enumerate(self.heads) if h0 <= h < h1)


def _even(total: int, parts: int) -> tuple[Range, ...]:
    step = total // parts
    return tuple((i * step, (i + 1) * step) for i in range(parts))


def tp_split(cfg: LayerConfig, nodes: int) -> TPSplit:
    """The split of one layer over ``nodes`` nodes, or :class:`TPError` naming the shape:

    * query heads: ``heads / N`` whole heads per node (refused otherwise);
    * K and V rows: ``kv_heads · head_dim / N`` rows per node — KV heads are neither replicated
      nor kept whole (Qwen2.5-1.5B's 2 KV heads at N = 4: half a head's rows per node), since
      the rows are gathered at the token's root before RoPE and quantisation (refused when
      ``N`` does not divide the rows);
    * intermediate rows: whole groups, as even as possible (``⌈G_I/N⌉`` on the first
      ``G_I mod N`` nodes, ``G_I = intermediate / group``) when ``G_I ≥ N``; otherwise an even
      split inside groups (refused when ``N`` does not divide ``intermediate``)."""
    if not 1 <= nodes <= TP_MAX_NODES:
        raise TPError(f"tensor-parallel decode takes 1..{TP_MAX_NODES} nodes, not {nodes} "
                      f"(the row-parallel SUM lanes would overflow)")
    if cfg.heads % nodes:
        raise TPError(f"TP over {nodes} nodes: {cfg.heads} query heads do not split into whole "
                      f"heads per node")
    kv = cfg.kv_heads * cfg.head_dim
    if kv % nodes:
        raise TPError(f"TP over {nodes} nodes: {cfg.kv_heads} KV heads x {cfg.head_dim} = {kv} "
                      f"K/V rows do not split evenly over {nodes} nodes")
    inter, g = cfg.intermediate, cfg.group
    if inter % g:
        raise TPError(f"intermediate size {inter} is not a multiple of the weight group {g}")
    groups = inter // g
    if groups >= nodes:
        base, extra = divmod(groups, nodes)
        edges = np.cumsum([0] + [base + (i < extra) for i in range(nodes)]) * g
        inter_r = tuple((int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]))
    elif inter % nodes == 0:
        inter_r = _even(inter, nodes)
    else:
        raise TPError(f"TP over {nodes} nodes: intermediate size {inter} ({groups} groups of "
                      f"{g}) does not split over {nodes} nodes")
    hp = cfg.heads // nodes
    return TPSplit(nodes, cfg.head_dim, g, tuple((i * hp, (i + 1) * hp) for i in range(nodes)),
                   _even(kv, nodes), inter_r)


# ---- bytes ---------------------------------------------------------------------------------------


def gemm_blob_bytes(rows: int, k: int, group: int) -> int:
    """Bytes of a ``rows × k`` weight matrix as the node stores it
    (:func:`mcf.quant.gemm_tile_blob`): INT4 codes, one 16-bit mantissa per row and group, one
    32-bit bias word per row."""
    return rows * k // 2 + rows * (k // group) * 2 + rows * 4


def node_weight_bytes(cfg: LayerConfig, split: TPSplit, node: int, layers: int = 1) -> int:
    """Bytes of ``node``'s shards of ``layers`` layers: its GEMM blobs (row-parallel K ranges as
    the whole groups they touch) and the two RMSNorm weights (one 32-bit word per element, as the
    node image stores them). Embedding and LM head are not included."""
    h, g = cfg.hidden, split.group
    q0, q1 = split.q_rows(node)
    k0, k1 = split.kv_rows[node]
    i0, i1 = split.inter[node]

    def padded(r: Range) -> int:
        j0, j1 = split.groups(r)
        return (j1 - j0) * g

    per = (gemm_blob_bytes(q1 - q0, h, g) + 2 * gemm_blob_bytes(k1 - k0, h, g)
           + gemm_blob_bytes(h, padded((q0, q1)), g)
           + 2 * gemm_blob_bytes(i1 - i0, h, g)
           + gemm_blob_bytes(h, padded((i0, i1)), g)
           + 2 * h * 4)
    return layers * per


# ---- the NIC's all-reduce ------------------------------------------------------------------------


def _payload(words) -> bytes:
    return (np.asarray(words, dtype=np.int64) & 0xFFFFFFFF).astype("<u4").tobytes()


def _words(payload: bytes) -> np.ndarray:
    w = np.frombuffer(payload, dtype="<u4").astype(np.int64)
    return np.where(w >= 1 << 31, w - (1 << 32), w)


def nic_all_reduce(op: ReduceOp, lanes: list, order=None,
                   max_payload: int = MAX_PAYLOAD) -> np.ndarray:
    """The all-reduce of one 32-bit-lane vector per node through the golden reduction engine
    (:class:`mcf.golden.nic.ReduceModel`, ``k = N``, final): the vector is cut into payloads of
    at most ``max_payload`` bytes (whole :data:`mcf.abi.tp.ACC_LANES` pairs), one tag each;
    ``order``: the nodes' arrival order (default by id). Returns the reduced lanes."""
    vecs = [np.asarray(v, dtype=np.int64).ravel() for v in lanes]
    n, words = len(vecs), vecs[0].size
    if any(v.size != words for v in vecs):
        raise ValueError("all-reduce contributions differ in length")
    order = range(n) if order is None else order
    per = max_payload // LANE_BYTES // ACC_LANES * ACC_LANES
    eng = ReduceModel(n_slots=1, max_payload=max_payload)
    eng.write_config(0, reduce_config(n, final=True, result_route=1))
    out = []
    for seq, w0 in enumerate(range(0, words, per)):
        res = None
        for i in order:
            part = _payload(vecs[i][w0:w0 + per])
            meta = Meta(op=Op.REDUCTION, collective=Collective.ALL_REDUCE, reduce_op=op,
                        src=i, route_id=0, seq=seq, length=len(part))
            res = eng.contribute(meta, part)
        if not isinstance(res, Packet):
            raise AssertionError(f"the reduction engine did not complete: {res!r}")
        out.append(_words(res.payload))
    return np.concatenate(out)


# ---- row-parallel GEMM ---------------------------------------------------------------------------


def partial_acc(xq, qw: QuantWeight, k: Range) -> np.ndarray:
    """One node's exact accumulator ``[M, N]`` of the K range ``k`` for INT8 codes ``xq[M, k1 −
    k0]``: the GEMM over the whole groups ``k`` touches, weight (and activation) codes outside
    ``k`` zero — what the node's engine computes on its zero-padded shard."""
    g = qw.group
    j0, j1 = k[0] // g, -(-k[1] // g)
    lo, hi = k[0] - j0 * g, k[1] - j0 * g
    xq = np.asarray(xq, dtype=np.int64)
    x = np.zeros((xq.shape[0], (j1 - j0) * g), dtype=np.int64)
    w = np.zeros((qw.q.shape[0], (j1 - j0) * g), dtype=np.int64)
    x[:, lo:hi] = xq
    w[:, lo:hi] = qw.q[:, k[0]:k[1]]
    return G.accumulate(G.group_sums(x, w, g), qw.m[:, j0:j1])


@dataclass
class RowParallel:
    """A row-parallel GEMM of one token: ``y`` the ACT output ``[1, N]`` (every node's),
    ``absmax`` the MAX all-reduce's result, ``acc`` every node's partial accumulator ``[N]``,
    ``summed`` the SUM all-reduce's lanes."""
    y: np.ndarray
    absmax: int
    acc: list[np.ndarray]
    summed: np.ndarray


def row_parallel(shards: list, qw: QuantWeight, ranges: list[Range], order=None) -> RowParallel:
    """``epilogue(Σ_i acc_i)`` of ACT input shards ``shards[i]`` (``[1, k1 − k0]`` of the
    ranges ``ranges[i]``): the scale from the MAX all-reduce, the partial accumulators summed
    by the SUM all-reduce in :func:`mcf.abi.tp.acc_lanes`, the epilogue once."""
    mx = nic_all_reduce(ReduceOp.MAX, [absmax_lanes(s) for s in shards], order)
    absmax = lanes_absmax(mx.reshape(1, 2))
    accs, scale = [], None
    for s, k in zip(shards, ranges):
        xq, xm, xe = requantize_with_absmax(s, absmax)
        if scale is not None and not (np.array_equal(scale[0], xm)
                                      and np.array_equal(scale[1], xe)):
            raise AssertionError("nodes disagree on the row's scale")
        scale = (xm, xe)
        accs.append(partial_acc(xq, qw, k)[0])
    summed = nic_all_reduce(ReduceOp.SUM, [acc_lanes(a) for a in accs], order)
    y = G.epilogue(lanes_acc(summed)[None, :], scale[0], scale[1], qw.e)
    return RowParallel(y, int(absmax[0]), accs, summed)


def _rows(qw: QuantWeight, r: Range) -> QuantWeight:
    return QuantWeight(qw.q[r[0]:r[1]], qw.m[r[0]:r[1]], qw.e, qw.group)


def _column(xq, xm, xe, qw: QuantWeight, r: Range, bias=None) -> np.ndarray:
    b = None if bias is None else np.asarray(bias)[r[0]:r[1]]
    w = _rows(qw, r)
    return G.gemm(xq, xm, xe, w.q, w.m, w.e, b, w.group)


# ---- the FFN: column-parallel gate/up, row-parallel down ---------------------------------------


def column_ffn(xq, xm, xe, gate: QuantWeight, up: QuantWeight, r: Range) -> np.ndarray:
    """One node's ``silu(gate)·up`` shard ``[M, r1 − r0]`` of the intermediate rows ``r`` from
    the replicated INT8 codes ``xq`` and scale ``xm``/``xe`` of the normed row: the GEMMs over
    rows ``r`` of W_gate and W_up (:func:`mcf.golden.gemm.gemm`, no bias), then the vector
    unit's :func:`mcf.golden.vector.silu_mul` — element for element the replicated FFN's."""
    return V.silu_mul(_column(xq, xm, xe, gate, r), _column(xq, xm, xe, up, r))


@dataclass
class TPFFN:
    """The TP FFN of one token: ``y`` the down projection's output ``[1, hidden]`` (every
    node's), ``shards`` every node's :func:`column_ffn` shard, ``down`` the row-parallel down
    GEMM."""
    y: np.ndarray
    shards: list[np.ndarray]
    down: RowParallel


def tp_ffn(xq, xm, xe, gate: QuantWeight, up: QuantWeight, down: QuantWeight,
           ranges: list[Range], order=None) -> TPFFN:
    """The FFN over ``len(ranges)`` nodes (node ``i`` owns the intermediate rows
    ``ranges[i]``): :func:`column_ffn` on every node, then :func:`row_parallel` down over the
    same ranges. Bit-exact with the replicated ``down(requantize(silu(gate)·up))``."""
    shards = [column_ffn(xq, xm, xe, gate, up, r) for r in ranges]
    d = row_parallel(shards, down, list(ranges), order)
    return TPFFN(d.y, shards, d)


# ---- one layer, all layers -----------------------------------------------------------------------


@dataclass
class TPDecodeLayer:
    """One layer of a TP decode token: ``y`` (the output row, on every node), ``att`` (the
    attention rows ``[H_q·d]``; node ``i`` holds its heads'), ``kv`` (per KV head the new
    token's INT4 record at the root), ``states`` / ``merged`` / ``queries`` as in
    :class:`mcf.golden.node_decode.GoldenDecodeLayer`, ``o`` and ``down`` the row-parallel GEMMs."""
    y: np.ndarray
    att: np.ndarray
    kv: list[bytes]
    states: dict[int, list[bytes]]
    merged: list[bytes]
    queries: list[bytes]
    o: RowParallel
    down: RowParallel


def tp_layer(x, ql: QuantLayer, cfg: LayerConfig, position: int, split: TPSplit, attention,
             order=None):
    """One layer of one token over ``split.nodes`` nodes: :func:`tp_pre_attention`, the
    attention, :func:`tp_post_attention`. ``attention(q, k, v, pos)`` takes the
    gathered post-RoPE Q ``[1, H_q·d]``, K and V ``[1, H_kv·d]`` (ACT) and returns the attention
    rows ``[1, H_q·d]`` (ACT). Returns ``(y, att, o, down)``."""
    xa = np.asarray(x, dtype=np.int64).reshape(1, -1)
    pre = tp_pre_attention(xa, ql, cfg, position, split)
    att = np.asarray(attention(pre.q, pre.k, pre.v, np.array([position])),
                     dtype=np.int64).reshape(1, -1)
    post = tp_post_attention(xa, att, ql, cfg, split, order)
    return post.y, att, post.o, post.ffn.down


@dataclass
class TPPreAttention:
    """The pre-attention half of a TP layer: ``n1`` the RMSNorm of the input row (every node's),
    ``xq`` / ``xm`` / ``xe`` its requantisation (the column GEMMs' input, every node's), the
    gathered post-RoPE ``q`` ``[1, H_q·d]``, post-RoPE ``k`` and ``v`` ``[1, H_kv·d]`` (ACT, the
    natural row order), and per node its column shards ``q_shards[i]`` (post-RoPE, its heads),
    ``k_shards[i]`` (before RoPE, rows ``kv_rows[i]``), ``v_shards[i]``."""
    n1: np.ndarray
    xq: np.ndarray
    xm: np.ndarray
    xe: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    q_shards: list[np.ndarray]
    k_shards: list[np.ndarray]
    v_shards: list[np.ndarray]


def tp_pre_attention(x, ql: QuantLayer, cfg: LayerConfig, position: int,
                     split: TPSplit) -> TPPreAttention:
    """One layer before attention over ``split.nodes`` nodes (:func:`tp_layer`'s first half):
    RMSNorm (γ1) and requantisation of the input row ``x`` (replicated), the column-parallel
    Q (heads ``split.heads[i]``, RoPE on the node), K and V (rows ``split.kv_rows[i]``) GEMMs
    with their biases, the shards gathered (the query all-gather; K and V at the token's root)
    and RoPE applied to the gathered K (a node may hold part of a KV head's rows)."""
    n = split.nodes
    xa = np.asarray(x, dtype=np.int64).reshape(1, -1)
    cos, sin = rope_table(np.array([position]), cfg.head_dim, cfg.theta)
    n1 = V.rmsnorm(xa, ql.gamma["g1"], cfg.eps)
    xq, xm, xe = requantize(n1)
    qs = [V.rope(_column(xq, xm, xe, ql.qw["q"], split.q_rows(i), ql.bias["q"]), cos, sin,
                 cfg.head_dim) for i in range(n)]
    ks = [_column(xq, xm, xe, ql.qw["k"], split.kv_rows[i], ql.bias["k"]) for i in range(n)]
    vs = [_column(xq, xm, xe, ql.qw["v"], split.kv_rows[i], ql.bias["v"]) for i in range(n)]
    k = V.rope(np.concatenate(ks, axis=1), cos, sin, cfg.head_dim)
    return TPPreAttention(n1, xq, xm, xe, np.concatenate(qs, axis=1), k,
                          np.concatenate(vs, axis=1), qs, ks, vs)


@dataclass
class TPPostAttention:
    """The post-attention half of a TP layer: ``o`` the row-parallel O GEMM, ``h`` the residual
    ``x + o.y``, ``n2`` its RMSNorm, ``ffn`` the TP FFN of ``n2``'s requantisation, ``y`` the
    layer's output ``h + ffn.y`` (every node's, ``[1, hidden]``)."""
    o: RowParallel
    h: np.ndarray
    n2: np.ndarray
    ffn: TPFFN
    y: np.ndarray


def tp_post_attention(x, att, ql: QuantLayer, cfg: LayerConfig, split: TPSplit,
                      order=None) -> TPPostAttention:
    """One layer after attention over ``split.nodes`` nodes (:func:`tp_layer`'s second half):
    O row-parallel over the heads' rows ``split.q_rows(i)`` of the attention rows ``att``
    ``[1, H_q·d]``, the residual add with the layer input ``x``, RMSNorm (γ2), requantisation,
    :func:`tp_ffn` over ``split.inter``, the residual add."""
    xa = np.asarray(x, dtype=np.int64).reshape(1, -1)
    att = np.asarray(att, dtype=np.int64).reshape(1, -1)
    o_ranges = [split.q_rows(i) for i in range(split.nodes)]
    o = row_parallel([att[:, a:b] for a, b in o_ranges], ql.qw["o"], o_ranges, order)
    h = V.residual_add(xa, o.y)
    n2 = V.rmsnorm(h, ql.gamma["g2"], cfg.eps)
    xq2, xm2, xe2 = requantize(n2)
    ffn = tp_ffn(xq2, xm2, xe2, ql.qw["gate"], ql.qw["up"], ql.qw["down"], split.inter, order)
    return TPPostAttention(o, h, n2, ffn, V.residual_add(h, ffn.y))


def _kv_parallel_attention(cfg: LayerConfig, layer: int, root: int, parents: dict[int, int],
                           blocks_of, open_block, two_phase: bool, kept: dict):
    """Every node's states over its KV for every query head, merged along the token root's
    chain (root decode's arithmetic, :func:`mcf.golden.node_decode.golden_decode`)."""
    from mcf.abi.decode_land import normalized_row

    from .node_decode import decode_head_inputs, merge_tree, with_new_token

    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
    pk = rope_pair_order(hd, hd)
    nodes = sorted({root, *parents})

    def attn(q, k, v, pos):
        kv, queries, states = [], [], {n: [None] * cfg.heads for n in nodes}
        for g in range(cfg.kv_heads):
            entry, new, qc, sq, query = decode_head_inputs(q, k, v, pos, g, hd, rep, pk, layer)
            kv.append(entry)
            queries.append(query)
            lists = {n: (with_new_token(list(blocks_of(n, layer, g)), new, open_block)
                         if n == root else list(blocks_of(n, layer, g))) for n in nodes}
            if two_phase:
                m_all = np.max([attend_max(qc[:, pk], sq, b) for b in lists.values()], axis=0)
            for n, blocks in lists.items():
                if not blocks:
                    states[n][g * rep:(g + 1) * rep] = [pack_state(*empty_state(hd))] * rep
                    continue
                if two_phase:
                    st = attend_fixed(qc[:, pk], sq, blocks, m_all)[0]
                else:
                    st = attend_single(qc[:, pk], sq, blocks, int(pos[0]), causal=False)
                states[n][g * rep:(g + 1) * rep] = [pack_state(st.m[h], st.l[h], st.o[h])
                                                    for h in range(rep)]
        merged = [merge_tree({n: states[n][h] for n in nodes}, root, parents)
                  for h in range(cfg.heads)]
        att = np.concatenate([np.frombuffer(normalized_row(m, hd), dtype="<i4")
                              for m in merged]).astype(np.int64)
        kept.update(kv=kv, states=states, merged=merged, queries=queries)
        return att.reshape(1, -1)

    return attn


def tp_golden_decode(x, layers: list[QuantLayer], cfg: LayerConfig, position: int, root: int,
                     parents: dict[int, int], blocks_of, split: TPSplit, *,
                     open_block: Range | None = None, two_phase: bool = False,
                     order=None) -> list[TPDecodeLayer]:
    """Every layer of one decode token in TP over ``split.nodes`` nodes: the arguments of
    :func:`mcf.golden.node_decode.golden_decode` (the token's ``root`` keeps its KV; ``parents``:
    the root's reduction chain; ``blocks_of(node, layer, g)``: each node's KV blocks) plus the
    ``split``; ``order``: the arrival order of the all-reduces' contributions (the result does not
    depend on it). Returns one :class:`TPDecodeLayer` per layer; the last one's ``y`` is the row the
    LM head takes."""
    nodes = sorted({root, *parents})
    if len(nodes) != split.nodes:
        raise TPError(f"the split is for {split.nodes} nodes, the reduction chain has "
                      f"{len(nodes)}")
    out = []
    xa = np.asarray(x, dtype=np.int64).reshape(1, -1)
    for li, ql in enumerate(layers):
        kept: dict = {}
        attn = _kv_parallel_attention(cfg, li, root, parents, blocks_of, open_block, two_phase,
                                      kept)
        y, att, o, down = tp_layer(xa, ql, cfg, position, split, attn, order)
        out.append(TPDecodeLayer(y[0].copy(), att[0], kept["kv"], kept["states"],
                                 kept["merged"], kept["queries"], o, down))
        xa = y
    return out


# ---- the LM head, its vocabulary split over the nodes --------------------------------------------


def vocab_split(vocab: int, nodes: int, rows: int) -> tuple[Range, ...]:
    """Node ``i``'s rows ``[v0, v1)`` of the LM head (and of the logits): whole ``rows``-row
    GEMM tiles in node order, as even as possible (``⌈T/N⌉`` tiles on the first ``T mod N``
    nodes, ``T = vocab / rows``), so no node has more than ``⌈T/N⌉·rows`` rows; refused
    (:class:`TPError`) when ``rows`` does not divide ``vocab`` or there are fewer tiles than
    nodes."""
    if vocab % rows:
        raise TPError(f"a vocabulary of {vocab}: the head GEMM takes a multiple of {rows} rows")
    tiles = vocab // rows
    if tiles < nodes:
        raise TPError(f"a vocabulary of {tiles} {rows}-row tiles does not split over {nodes} "
                      "nodes")
    base, extra = divmod(tiles, nodes)
    edges = np.cumsum([0] + [base + (i < extra) for i in range(nodes)]) * rows
    return tuple((int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]))


def tp_head(row, norm, lm_head: QuantWeight, eps: float,
            ranges: tuple[Range, ...]) -> list[np.ndarray]:
    """Every node's slice of the logits of one last-layer ACT row (every node holds it after
    the last down all-reduce): the final RMSNorm and its requantisation (replicated), then the
    head GEMM over the node's rows ``ranges[i]`` (no bias). Concatenated in node order the
    slices are :meth:`mcf.golden.model.IntModel.head`'s ACT logit codes bit for bit (a GEMM's
    output rows are independent)."""
    xa = np.asarray(row, dtype=np.int64).reshape(1, -1)
    xq, xm, xe = requantize(V.rmsnorm(xa, norm, eps))
    return [_column(xq, xm, xe, lm_head, r)[0] for r in ranges]


def slice_argmax(logits, v0: int) -> tuple[int, int]:
    """``(max logit, index)`` of one node's slice of the logits starting at row ``v0``: the
    first index of the maximum, as a global index."""
    a = np.asarray(logits, dtype=np.int64)
    i = int(np.argmax(a))
    return int(a[i]), v0 + i


def merge_argmax(pairs) -> int:
    """The token from every node's :func:`slice_argmax` pair: the largest logit, the smallest
    index among equal ones — the argmax (first index) of the whole logits row."""
    return min(pairs, key=lambda p: (-p[0], p[1]))[1]

"""The golden models of tensor-parallel decode on the node tops (issue #34, docs/cluster.md
"Tensor-parallel decode"): every node's buffers after each TP program of :mod:`mcf.node`, the
engines' golden models (:mod:`mcf.golden.vector`, :mod:`mcf.golden.gemm`, the NIC's
:func:`mcf.golden.tp_decode.nic_all_reduce`) chained over exactly the buffers the templates read
and write — what the RTL is compared with bit for bit.

* :func:`golden_step` — a row-parallel step (:mod:`mcf.node.tp`); its output equals
  :func:`mcf.golden.tp_decode.row_parallel` and the single-node GEMM of the whole K;
* :func:`golden_ffn` — the TP FFN (:mod:`mcf.node.tp_ffn`); equals
  :func:`mcf.golden.tp_decode.tp_ffn` and the replicated FFN;
* :func:`golden_post` — the post-attention half (:mod:`mcf.node.tp_layer`); equals
  :func:`mcf.golden.tp_decode.tp_post_attention`;
* :func:`golden_pre` — the pre-attention half (:mod:`mcf.node.tp_pre`); its gathered query and
  K/V records equal replicated decode's (:func:`mcf.golden.node_decode.golden_decode`), its rows
  :func:`mcf.golden.tp_decode.tp_pre_attention`'s;
* :func:`owner_merged` / :func:`owner_rows` — the attention's final states and OBUF rows at each
  head's TP owner (:mod:`mcf.node.tp_decode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..abi.decode_land import normalized_row
from ..abi.framing import MAX_PAYLOAD
from ..abi.kv import pack_kv_block, quantize_kv_rows
from ..abi.meta import ReduceOp
from ..abi.quant import requantize, rope_words
from ..abi.query import pack_query
from ..node.decode import reduction_parents
from . import gemm as G
from . import vector as V
from .node_decode import merge_tree
from .tp_decode import TPSplit, _column, nic_all_reduce

if TYPE_CHECKING:
    from ..node.tp import RowParallelImage
    from ..node.tp_ffn import TPFFNImage
    from ..node.tp_layer import TPPostImage
    from ..node.tp_pre import TPPreImage

__all__ = ["StepGolden", "golden_step", "FFNGolden", "golden_ffn", "PostGolden", "golden_post",
           "PreGolden", "golden_pre", "owner_merged", "owner_rows"]


@dataclass
class StepGolden:
    """Every node's buffers after the step, as the templates leave them: ``mx`` the ABSMAX
    lanes, ``reduced`` the MAX result (every node's MBUF slot), ``xq`` / ``x_m`` / ``x_e`` the
    REQUANT_EXT codes and scale, ``lanes`` the ``acc_out`` lanes, ``summed`` the SUM result,
    ``y`` the ``acc_in`` output rows (one per node)."""
    mx: list[np.ndarray]
    reduced: np.ndarray
    xq: list[np.ndarray]
    x_m: int
    x_e: int
    lanes: list[np.ndarray]
    summed: np.ndarray
    y: list[np.ndarray]


def golden_step(images: list[RowParallelImage], shards: list,
                max_payload: int = MAX_PAYLOAD) -> StepGolden:
    """The step's arithmetic on the nodes' padded buffers through the engines' golden models:
    ``V.absmax`` → MAX all-reduce → ``V.requantize_ext`` → ``G.partial_lanes`` on the shard weights
    → SUM all-reduce (the :func:`mcf.node.tp.sum_payloads` cut) → ``G.lanes_epilogue`` with the
    bias."""
    rows = []
    for im, s in zip(images, shards, strict=True):
        r = np.zeros((1, im.shard.kp), dtype=np.int64)
        r[0, im.shard.lo:im.shard.hi] = np.asarray(s, dtype=np.int64).ravel()
        rows.append(r)
    mx = [V.absmax(r)[0] for r in rows]
    reduced = nic_all_reduce(ReduceOp.MAX, mx, max_payload=max_payload)
    xq, scales, lanes = [], set(), []
    for im, r in zip(images, rows, strict=True):
        q, m, e = V.requantize_ext(r, reduced[None, :])
        xq.append(q[0])
        scales.add((int(m[0]), int(e[0])))
        lanes.append(G.partial_lanes(q, im.shard.qw.q, im.shard.qw.m, im.shard.qw.group)[0])
    if len(scales) != 1:
        raise AssertionError(f"the nodes' scales differ: {scales}")
    (x_m, x_e), = scales
    summed = nic_all_reduce(ReduceOp.SUM, lanes, max_payload=max_payload)
    y = [G.lanes_epilogue(summed[None, :], np.array([x_m]), np.array([x_e]), im.qw.e,
                          im.bias)[0] for im in images]
    return StepGolden(mx, reduced, xq, x_m, x_e, lanes, summed, y)


@dataclass
class FFNGolden:
    """Every node's buffers after the FFN: ``g`` / ``u`` the gate and up rows, ``s`` the SiLU
    shard, ``step`` the down step's (:class:`StepGolden`; ``step.y`` the output
    rows)."""
    g: list[np.ndarray]
    u: list[np.ndarray]
    s: list[np.ndarray]
    step: StepGolden


def golden_ffn(images: list[TPFFNImage], xq, xm, xe) -> FFNGolden:
    """The FFN's arithmetic on the nodes' buffers through the engines' golden models: per node
    :func:`mcf.golden.gemm.gemm` of the codes on its gate and up rows, ``V.silu_mul``; then
    :func:`golden_step` on the down images with the SiLU shards."""
    xq = np.asarray(xq, dtype=np.int64).reshape(1, -1)
    xm, xe = np.atleast_1d(xm), np.atleast_1d(xe)
    g = [_column(xq, xm, xe, im.gate, im.r)[0] for im in images]
    u = [_column(xq, xm, xe, im.up, im.r)[0] for im in images]
    s = [V.silu_mul(a, b) for a, b in zip(g, u, strict=True)]
    return FFNGolden(g, u, s, golden_step([im.row for im in images], s))


@dataclass
class PostGolden:
    """Every node's buffers after the half: ``o`` the O step's (:class:`StepGolden`),
    ``h`` / ``n2`` / ``y`` per node, ``xq`` / ``xm`` / ``xe`` the FFN's input (the same on every
    node), ``ffn`` the FFN's (:class:`FFNGolden`)."""
    o: StepGolden
    h: list[np.ndarray]
    n2: list[np.ndarray]
    xq: np.ndarray
    xm: int
    xe: int
    ffn: FFNGolden
    y: list[np.ndarray]


def golden_post(images: list[TPPostImage], x, att) -> PostGolden:
    """The half's arithmetic on the nodes' buffers through the engines' golden models:
    :func:`golden_step` on the O images with each node's attention rows;
    per node ``V.residual_add`` (x), ``V.rmsnorm`` (γ2), :func:`~mcf.abi.quant.requantize`;
    :func:`golden_ffn`; ``V.residual_add``."""
    x = np.asarray(x, dtype=np.int64).reshape(1, -1)
    att = np.asarray(att, dtype=np.int64).ravel()
    cfg = images[0].cfg
    o = golden_step([im.o for im in images], [att[a:b] for a, b in (im.o.k for im in images)])
    h = [V.residual_add(x, y[None, :]) for y in o.y]
    n2 = [V.rmsnorm(hi, im.ql.gamma["g2"], cfg.eps) for hi, im in zip(h, images, strict=True)]
    quant = {(q.tobytes(), int(m[0]), int(e[0])) for q, m, e in map(requantize, n2)}
    if len(quant) != 1:
        raise AssertionError("the nodes' normed rows differ")
    (raw, xm, xe), = quant
    xq = np.frombuffer(raw, dtype=np.int64)
    ffn = golden_ffn([im.ffn for im in images], xq, xm, xe)
    y = [V.residual_add(hi, d[None, :])[0] for hi, d in zip(h, ffn.step.y, strict=True)]
    return PostGolden(o, [hi[0] for hi in h], [n[0] for n in n2], xq, xm, xe, ffn, y)


@dataclass
class PreGolden:
    """Every node's buffers after the half: ``n1`` / ``xq`` / ``xm`` / ``xe`` (the same on every
    node), per node the GEMM outputs ``q`` / ``k`` / ``v`` (pair-ordered Q and K rows), ``qr``
    (Q after RoPE), ``kv`` (the ACT K/V row: per own KV head K with RoPE, then V), and per KV
    head ``g`` of the model its query record ``queries[g]`` and INT4 K/V record ``kv_records[g]``
    (K in RoPE pair order), as the head's owner writes and EMITs them."""
    n1: np.ndarray
    xq: np.ndarray
    xm: int
    xe: int
    q: list[np.ndarray]
    k: list[np.ndarray]
    v: list[np.ndarray]
    qr: list[np.ndarray]
    kv: list[np.ndarray]
    queries: list[bytes]
    kv_records: list[bytes]


def golden_pre(images: list[TPPreImage], x, position: int) -> PreGolden:
    """The half's arithmetic on the nodes' buffers through the engines' golden models:
    ``V.rmsnorm`` (γ1), :func:`~mcf.abi.quant.requantize`, per node :func:`mcf.golden.gemm.gemm`
    on its pair-ordered rows with their biases, ``V.rope_pairs`` with the node's RoPE words,
    the per-head requantisation into query records (:func:`mcf.abi.query.pack_query`) and the
    EMIT's :func:`mcf.abi.kv.quantize_kv_rows` / :func:`~mcf.abi.kv.pack_kv_block`."""
    im0 = images[0]
    cfg = im0.cfg
    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
    xa = np.asarray(x, dtype=np.int64).reshape(1, -1)
    n1 = V.rmsnorm(xa, im0.ql.gamma["g1"], cfg.eps)
    xq, xm, xe = requantize(n1)
    pos = np.array([position])
    q, k, v, qr, kv = [], [], [], [], []
    queries, records = [None] * cfg.kv_heads, [None] * cfg.kv_heads
    for im in images:
        outs = {}
        for name, r in (("q", im.q_rows), ("k", im.kv_rows), ("v", im.kv_rows)):
            qw, b = im._rows(name, r)
            outs[name] = G.gemm(xq, xm, xe, qw.q, qw.m, qw.e, b, qw.group)
        q.append(outs["q"][0])
        k.append(outs["k"][0])
        v.append(outs["v"][0])
        qri = V.rope_pairs(outs["q"], rope_words(pos, outs["q"].shape[1], hd, cfg.theta))
        kri = V.rope_pairs(outs["k"], rope_words(pos, outs["k"].shape[1], hd, cfg.theta))
        qr.append(qri[0])
        row = []
        for gl, g in enumerate(range(*im.kv_heads)):
            kg, vg = kri[:, gl * hd:(gl + 1) * hd], outs["v"][:, gl * hd:(gl + 1) * hd]
            row += [kg[0], vg[0]]
            k4, sk = quantize_kv_rows(kg)
            v4, sv = quantize_kv_rows(vg)
            records[g] = pack_kv_block(k4, sk, v4, sv)
            qc, qm, qe = requantize(qri[0, gl * rep * hd:(gl + 1) * rep * hd].reshape(rep, hd))
            queries[g] = pack_query(qc, np.stack([qm, qe], axis=-1), position, im.layer, g * rep)
        kv.append(np.concatenate(row))
    return PreGolden(n1[0], xq[0], int(xm[0]), int(xe[0]), q, k, v, qr, kv, queries, records)


def owner_merged(states: dict[int, list[bytes]], plan, split: TPSplit) -> list[bytes]:
    """Per query head the final state its owner's engine gives: ``states[node][h]`` (every node's
    state payloads, :class:`mcf.golden.node_decode.GoldenDecodeLayer`) merged along the owner's
    reduction tree, own state first, then the children's results by id."""
    out = []
    for h in range(len(next(iter(states.values())))):
        o = split.head_owner(h)
        out.append(merge_tree({n: s[h] for n, s in states.items()}, o,
                               reduction_parents(plan, o)))
    return out


def owner_rows(merged: list[bytes], head_dim: int) -> list[bytes]:
    """The OBUF row each owner's decode lander writes for each head's final state."""
    return [normalized_row(m, head_dim) for m in merged]

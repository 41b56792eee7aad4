"""Golden model of prefill attention tiled for the GEMM arrays (issue #33; paper §3.1, §5;
formats in :mod:`mcf.abi.attn_tile`).

The computation, FlashAttention-style: the rows of a prefill chunk (query token × query head of
one KV head, GQA) are cut into **query tiles** of ``q_tile`` rows; each tile runs against the KV
blocks in order (the KV extent of a tile is the KV block): ``S = Q·Kᵀ`` as an INT8 × INT4
product on the arrays (exact integer accumulators; per-channel K: the query folded once per group
header, :func:`mcf.abi.kv.fold_query`), then per row the block's scores, maximum ``m_b``,
``p = exp2_neg(m_b − t)``, ``w = v_weight(p, sv)``, ``l_b = Σ p``, ``o_b = Σ w·v`` (P·V on the
arrays in the chosen P format), then ``merge_state`` with the row's running state. Tiles whose
keys all lie after a row's position are skipped for that row; the diagonal tile masks keys with
``pos > q_pos``. MAX mode keeps the per-row maximum; FIXED mode takes every ``p`` against the
given maximum with exact wrapped sums.

With ``p_format=None`` (today's unpacked ``w``, :data:`mcf.abi.attn_tile.PV_W`) every mode gives
the bits of :mod:`mcf.golden.attention` (``attend_causal_rows`` / ``attend_single`` /
``attend_max`` / ``attend_fixed`` / ``attend_exact_rows``) for any ``q_tile``: the tiled order
only regroups independent rows, and the integer S and P·V are exact — tested in
``tests/test_attention_tiled.py``. With ``p_format=P8`` (:data:`mcf.abi.attn_tile.P8`, SINGLE
mode only) P·V takes 8-bit probabilities with a per-row, per-block shift
(:func:`mcf.abi.attn_tile.quantize_p8`); its error against float64 is bounded by those tests.

``array=True`` computes both products the way the arrays do — rows paired into one packed DSP
product, the packed sums accumulated in 48 bits and split (:func:`mcf.golden.gemm.dsp_unpack`)
— instead of a plain integer matrix product; the tests show the two agree bit for bit.

The stages the RTL (``mcf.hdl.compute.tile_*``) is compared against are functions of their own,
used by the model's loop: :func:`tile_schedule` (which rows meet which block, the causal masks),
:func:`qk_acc` (the exact ``S`` accumulators), :func:`tile_weights` (``m_b``, ``p``, ``w``,
``l_b``), :func:`p8_rows` (``s``, ``w8``),
:func:`pv_p8_acc` / :func:`pv_p8_block` (the exact P·V sums, ``o_b``), :func:`pv_w_acc` (today's
``w`` in bytes on the packed arrays).
"""

from __future__ import annotations

import numpy as np

from mcf.abi.attn_tile import (
    P8,
    PV_LIMB_BITS,
    PV_LIMBS,
    PV_SPLIT_KEYS,
    p8_row_shift,
    pv_p8_out,
    pv_pack_shift,
    qk_pack_shift,
    quantize_p8,
    w_limbs,
)
from mcf.abi.fixed import saturate, wrap
from mcf.abi.kv import q_multiplier, score, score_shift, v_weight
from mcf.abi.kv_channel import fold_query
from mcf.abi.quant import ACC_BITS
from mcf.abi.softmax import LANE_BITS, M_EMPTY, STATE_L, STATE_O, exp2_neg, merge_state

from .attention import KVChannelBlock, State, normalize_state

__all__ = ["P_FORMATS", "packed_matmul", "qk_acc", "tile_scores", "tile_weights", "p8_rows",
           "pv_p8_acc", "pv_p8_block", "pv_w_acc", "tile_block_state", "tile_schedule",
           "attend_tiled_rows", "attend_prefill_tiled"]

P_FORMATS = {"w": None, "p8": P8}
"""P·V formats by name: today's unpacked ``w`` and the 8-bit row-scaled ``P8``."""


def packed_matmul(a, w, shift: int, group: int) -> np.ndarray:
    """``a[M, K] @ w[N, K].T`` as the arrays compute it: weight rows paired into one packed
    multiplicand ``w[2i+1]·2^shift + w[2i]`` per lane, the packed products summed over each group
    of ``group`` lanes in ``ACC_BITS`` (wrapping), split into the two fields, the group sums
    added. Exact when every field's group sum fits ``shift`` signed bits."""
    a = np.asarray(a, dtype=np.int64)
    w = np.asarray(w, dtype=np.int64)
    m, k = a.shape
    n = w.shape[0]
    if n % 2:
        w = np.concatenate([w, np.zeros((1, k), dtype=np.int64)])
    if k % group:
        pad = group - k % group
        a = np.concatenate([a, np.zeros((m, pad), dtype=np.int64)], axis=1)
        w = np.concatenate([w, np.zeros((w.shape[0], pad), dtype=np.int64)], axis=1)
        k += pad
    packed = w[1::2] * (1 << shift) + w[0::2]                          # [N/2, K]
    prod = a[:, None, :] * packed[None, :, :]                          # [M, N/2, K]
    p = wrap(prod.reshape(m, packed.shape[0], k // group, group).sum(axis=3), ACC_BITS)
    low = wrap(p, shift)
    high = (p - low) >> shift
    out = np.empty((m, 2 * packed.shape[0]), dtype=np.int64)
    out[:, 0::2] = low.sum(axis=2)
    out[:, 1::2] = high.sum(axis=2)
    return out[:, :n]


def qk_acc(q, k, array: bool = False) -> np.ndarray:
    """The exact ``acc[R, T] = Σ q·k`` of query codes ``q[R, d]`` (folded, per-channel K)
    against K codes ``k[T, d]`` (with ``array``: two keys packed per DSP, the dot product over
    ``d`` one packed group, split) — what :class:`mcf.hdl.compute.tile_score.TileScore`
    emits."""
    q = np.asarray(q, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    if not array:
        return q @ k.T
    d = q.shape[1]
    return packed_matmul(q, k, qk_pack_shift(d), d)


def tile_scores(q, sq, blk, array: bool = False):
    """Scores ``t[R, T]`` of query rows ``q[R, d]`` (scales ``sq[R, 2]``) against one block
    (either KV format): ``acc = Q·Kᵀ`` exact, then :func:`mcf.abi.kv.score` with the key's
    ``sk``. A per-channel block is scored run by run of rows sharing a group header
    (:meth:`KVChannelBlock.engine_view`) with the query folded by that header."""
    q = np.asarray(q, dtype=np.int64)
    sq = np.asarray(sq, dtype=np.int64)
    d = q.shape[1]
    runs = blk.engine_view() if isinstance(blk, KVChannelBlock) else [(None, blk)]
    out = []
    for hdr, run in runs:
        qf, sf = (q, sq) if hdr is None else fold_query(q, sq, hdr)
        acc = qk_acc(qf, run.k, array)
        out.append(score(acc, np.asarray(run.sk)[None, :], q_multiplier(sf[:, 0], d)[:, None],
                         score_shift(sf[:, 1])[:, None]))
    return np.concatenate(out, axis=1) if out else np.zeros((len(q), 0), dtype=np.int64)


def p8_rows(w, p_format=P8):
    """The P rows of weights ``w[R, T]`` as the P·V arrays take them: the row shifts ``s[R]``
    (:func:`mcf.abi.attn_tile.p8_row_shift` of the row maximum) and ``w8[R, T]``
    (:func:`mcf.abi.attn_tile.quantize_p8`)."""
    w = np.asarray(w, dtype=np.int64)
    s = p8_row_shift(w.max(axis=1, initial=0), p_format)
    return s, quantize_p8(w, s[:, None], p_format)


def pv_p8_acc(w8, v, array: bool = False):
    """The exact sums ``acc[R, d] = Σ w8·v`` of P rows ``w8[R, T]`` against V codes ``v[T, d]``
    (packed two channels per DSP in groups of ``PV_SPLIT_KEYS`` keys with ``array``) — what
    :class:`mcf.hdl.compute.tile_pv.TilePV` emits."""
    w8 = np.asarray(w8, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    return (packed_matmul(w8, v.T, pv_pack_shift(PV_SPLIT_KEYS), PV_SPLIT_KEYS) if array
            else w8 @ v)


def pv_p8_block(w8, s, v, array: bool = False):
    """``o_b`` of P rows ``(s[R], w8[R, T])`` against V codes ``v[T, d]``: :func:`pv_p8_acc`
    shifted by ``2^s`` and saturated to ``STATE_O`` (what :class:`mcf.hdl.compute.tile_merge.
    TileMerge` takes into the merge)."""
    return saturate(pv_p8_out(pv_p8_acc(w8, v, array), np.asarray(s, dtype=np.int64)[:, None]),
                    STATE_O.width, signed=True)


def pv_w_acc(w, v, array: bool = False):
    """The exact sums ``Σ w·v`` of today's weights ``w[R, T]`` against V codes ``v[T, d]``; with
    ``array`` the way the packed arrays take them (:class:`mcf.hdl.compute.array_pv.ArrayPV`
    with ``p_format = PV_W``): per byte ``w_j`` (:func:`mcf.abi.attn_tile.w_limbs`) the packed
    P·V of :func:`pv_p8_acc`, the bytes' sums added as ``Σ_j 2^(8j)·acc_j``."""
    w = np.asarray(w, dtype=np.int64)
    v = np.asarray(v, dtype=np.int64)
    if not array:
        return w @ v
    limbs = w_limbs(w)
    return sum(pv_p8_acc(limbs[..., j], v, True) << (PV_LIMB_BITS * j) for j in range(PV_LIMBS))


def _pv(w, v, p_format, array: bool):
    """``o_b`` (unsaturated for today's ``w``) of weights ``w[R, T]`` and V codes ``v[T, d]``."""
    v = np.asarray(v, dtype=np.int64)
    if p_format is None:
        return pv_w_acc(w, v, array)      # in bytes on the packed arrays
    s, w8 = p8_rows(w, p_format)
    return pv_p8_block(w8, s, v, array)


def tile_weights(t, valid, sv):
    """Per row of scores ``t[R, T]`` (``valid[R, T]``) and the keys' ``sv[T]``: the block
    maximum ``m[R]`` (``M_EMPTY`` if no key is valid), ``p = exp2_neg(m − t)`` (0 where masked),
    ``w = v_weight(p, sv)`` and ``l = sat(Σ p)`` — what
    :class:`mcf.hdl.compute.tile_softmax.TileSoftmax` computes before ``w8``."""
    valid = np.broadcast_to(valid, np.shape(t))
    m = np.where(valid, t, np.iinfo(np.int64).min).max(axis=1)
    p = np.where(valid, exp2_neg(np.where(valid, m[:, None] - t, 0)), 0)
    w = v_weight(p, np.asarray(sv)[None, :])
    has = valid.any(axis=1)
    return (np.where(has, m, M_EMPTY).astype(np.int64), p, w,
            saturate(p.sum(axis=1), STATE_L.width, signed=False))


def tile_block_state(t, valid, blk, p_format=None, array: bool = False) -> State:
    """Rows' states of one block against each row's own block maximum (``valid[R, T]``);
    :func:`mcf.golden.attention.block_state` with P·V in ``p_format``. A row with no unmasked
    key gets the empty state."""
    valid = np.broadcast_to(valid, t.shape)
    m, _, w, l_sum = tile_weights(t, valid, blk.sv)
    o = _pv(w, blk.v, p_format, array)
    has = valid.any(axis=1)
    return State(m, l_sum, np.where(has[:, None], saturate(o, STATE_O.width, signed=True), 0))


def tile_schedule(q_pos, blocks: list, q_tile: int, causal: bool = True):
    """The order of the tiled computation: per query tile (``q_tile`` consecutive rows of
    positions ``q_pos[R]``), per KV block in order, the rows that run against it. Yields
    ``(tile, b, r, valid)``: the tile's rows, the block's index, the rows ``r`` of the tile not
    wholly before the block (causal; all rows otherwise; none: the pair is skipped) and their
    key mask ``valid[len(r), len(block)]`` (causal: ``pos ≤ q_pos``, the diagonal tile)."""
    q_pos = np.asarray(q_pos, dtype=np.int64)
    for lo in range(0, len(q_pos), q_tile):
        tile = np.arange(lo, min(lo + q_tile, len(q_pos)))
        for b, blk in enumerate(blocks):
            if len(blk) == 0:
                continue
            r = tile[q_pos[tile] >= int(np.min(blk.pos))] if causal else tile
            if r.size == 0:           # the tile lies wholly before the block
                continue
            pos = np.asarray(blk.pos, dtype=np.int64)
            valid = (pos[None, :] <= q_pos[r, None] if causal
                     else np.ones((r.size, len(blk)), dtype=bool))
            yield tile, b, r, valid


def attend_tiled_rows(q, sq, blocks: list, q_pos, mode: str = "single", causal: bool = True,
                      m_fix=None, p_format=None, q_tile: int = 64, array: bool = False):
    """Rows ``q[R, d]`` (scales ``sq[R, 2]``, positions ``q_pos[R]``) against ``blocks``, query
    tile by query tile. ``mode``: ``"single"`` → :class:`State` (the rows' merged states);
    ``"max"`` → ``m[R]``; ``"fixed"`` → ``(State, violations)`` against ``m_fix[R]`` (exact
    sums wrapped to 32 bits; keys above ``m_fix`` clamped to ``p = 1`` and counted).
    ``p_format``: ``None`` (today's ``w``) or :data:`mcf.abi.attn_tile.P8` (SINGLE only)."""
    if mode not in ("single", "max", "fixed"):
        raise ValueError(f"unknown mode {mode!r}")
    if p_format is not None and mode != "single":
        raise ValueError("the P8 format is defined for SINGLE mode only (FIXED keeps w)")
    q = np.asarray(q, dtype=np.int64)
    sq = np.asarray(sq, dtype=np.int64)
    rows, d = q.shape
    q_pos = np.broadcast_to(np.asarray(q_pos, dtype=np.int64), (rows,))
    run = State.empty(rows, d)
    m_max = np.full(rows, M_EMPTY, dtype=np.int64)
    if mode == "fixed":
        m_fix = np.broadcast_to(np.asarray(m_fix, dtype=np.int64), (rows,))
        l_sum = np.zeros(rows, dtype=np.int64)
        o_sum = np.zeros((rows, d), dtype=np.int64)
    bad = 0
    for _, b, r, valid in tile_schedule(q_pos, blocks, q_tile, causal):
        blk = blocks[b]
        t = tile_scores(q[r], sq[r], blk, array)
        if mode == "max":
            m_max[r] = np.maximum(m_max[r], np.where(valid, t, M_EMPTY).max(axis=1))
        elif mode == "fixed":
            dd = m_fix[r, None] - t
            bad += int(((dd < 0) & valid).sum())
            p = np.where(valid, exp2_neg(np.maximum(dd, 0)), 0)
            l_sum[r] += p.sum(axis=1)
            o_sum[r] += _pv(v_weight(p, np.asarray(blk.sv)[None, :]), blk.v, None, array)
        else:
            st = tile_block_state(t, valid, blk, p_format, array)
            mm, ll, oo = merge_state((run.m[r], run.l[r], run.o[r]), (st.m, st.l, st.o))
            run.m[r], run.l[r], run.o[r] = mm, ll, oo
    if mode == "max":
        return m_max
    if mode == "fixed":
        return State(m_fix.copy(), l_sum & ((1 << LANE_BITS) - 1),
                     wrap(o_sum, LANE_BITS, signed=True)), bad
    return run


def attend_prefill_tiled(qc, sq, blocks: list, pos, exact: bool = False, p_format=None,
                         q_tile: int = 64, array: bool = False) -> np.ndarray:
    """A prefill chunk's ``o / l`` (NORM_OUT codes ``[t, G, d]``) from INT8 query heads
    ``qc[t, G, d]`` (scales ``sq[t, G, 2]``) at positions ``pos[t]``, tiled: the counterpart of
    :func:`mcf.golden.attention.attend_prefill` (``exact``: the causal maximum first, then
    FIXED mode against it — ``p_format`` must then be ``None``)."""
    t, g, d = np.shape(qc)
    q = np.reshape(qc, (t * g, d))
    s = np.reshape(sq, (t * g, 2))
    rp = np.repeat(np.asarray(pos, dtype=np.int64), g)
    if exact:
        m = attend_tiled_rows(q, s, blocks, rp, "max", q_tile=q_tile, array=array)
        st, _ = attend_tiled_rows(q, s, blocks, rp, "fixed", m_fix=m, p_format=p_format,
                                  q_tile=q_tile, array=array)
    else:
        st = attend_tiled_rows(q, s, blocks, rp, "single", p_format=p_format, q_tile=q_tile,
                               array=array)
    return normalize_state(st).reshape(t, g, d)

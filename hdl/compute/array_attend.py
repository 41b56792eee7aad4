"""Prefill attention's chain on one set of GEMM arrays (issue #33; paper §3.1, §5;
docs/attention.md "The arrays' attention products"): S = Q·Kᵀ
(:class:`~.array_score.ArrayScore`) and P·V (:class:`~.array_pv.ArrayPV`) taking turns on the
same :class:`~.array_bank.ArrayBank` (through :class:`~.array_share.ArrayShare`), the row
softmax (:class:`~.tile_softmax.TileSoftmax`) and the merge (:class:`~.tile_merge.TileMerge`)
between and after them — :class:`~.tile_attend.TileAttention`'s rows, bit for bit, at its rate
on as many array DSPs, which S and P·V share (and can share with the GEMM)."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    P8,
    k_word_layout,
    merge_beat_layout,
    pv_word_layout,
    score_q_layout,
)

from .array_pv import ArrayPV
from .array_score import ArrayScore
from .array_share import ArrayShare
from .tile_attend import attend_chain
from .tile_merge import TileMerge
from .tile_softmax import TileSoftmax

__all__ = ["ArrayAttention"]


class ArrayAttention(wiring.Component):
    """ArrayScore → TileSoftmax → ArrayPV → TileMerge, S and P·V on one shared set of
    ``arrays`` arrays of ``array_rows × lanes`` (group ``head_dim``: one S dot product is one
    group, P·V groups are ``head_dim`` keys).

    Members
    -------
    q, k : as :class:`~.tile_attend.TileAttention` (ArrayScore's).
    v : In(stream.Signature(pv_word_layout(array_rows, lanes, max_block, rows)))
        Each block's V as array words with its counts, in the schedule's block order
        (ArrayPV's ``v``).
    o : Out(stream.Signature(merge_beat_layout(merge_lanes, rows)))
        A row's merged ``(m, l, o)`` after its final block, in beats of ``merge_lanes``
        channels (TileMerge's ``o``).
    score_st, score_res, pv_st, pv_res : ``own_arrays = False`` only
        ArrayScore's and ArrayPV's client ports (:class:`~.array_share.ArrayShare`'s
        ``c{n}_st`` / ``c{n}_res``) for arrays shared with others — the GEMM's.

    ``p_format``: P·V in :data:`~mcf.abi.attn_tile.P8` (the default), or in today's ``w``
    (:data:`~mcf.abi.attn_tile.PV_W`, its three bytes one dot product each: the rows of
    ``attend_tiled_rows(..., p_format=None)`` — today's bits — at three times the P·V steps).

    Rate: the arrays run S and P·V dot products in turn — per quad of rows and block of ``n``
    keys ``S·ceil(n / array_rows)`` steps of S and ``head_dim / array_rows · ceil(n /
    head_dim) · head_dim / lanes`` of P·V, each ``arrays · array_rows · lanes`` MACs; the row
    softmax takes ``keys`` keys per cycle. Measured in ``tests/test_array_attend.py``.
    Latency: ArrayScore's, TileSoftmax's, ArrayPV's and TileMerge's in sequence.
    """

    def __init__(self, keys: int = 4, head_dim: int = 128, lanes: int = 16,
                 max_block: int = 256, rows: int = 64, slots: int = 4, merge_lanes: int = 4,
                 tags: int = 16, arrays: int = 4, array_rows: int = 16, chain: int = 1,
                 dsp: str = "fabric", own_arrays: bool = True, p_format=P8):
        self.keys, self.head_dim, self.max_block, self.rows = keys, head_dim, max_block, rows
        self.score = ArrayScore(keys, head_dim, lanes, max_block, rows, arrays, array_rows,
                                chain, dsp, own_arrays=False)
        self.softmax = TileSoftmax(keys=keys, head_dim=head_dim, max_block=max_block,
                                   slots=slots, p_format=p_format)
        self.pv = ArrayPV(keys, head_dim, max_block, rows, arrays, array_rows, lanes,
                          group=head_dim, chain=chain, dsp=dsp, own_arrays=False,
                          p_format=p_format)
        self.merge = TileMerge(head_dim=head_dim, rows=rows, lanes=merge_lanes,
                               max_block=max_block, p_format=p_format, in_channels=array_rows)
        self.share = ArrayShare(2, arrays, array_rows, lanes, head_dim, chain, dsp) \
            if own_arrays else None
        self.tags = tags
        members = {
            "q": In(stream.Signature(score_q_layout(head_dim, max_block, rows))),
            "k": In(stream.Signature(k_word_layout(keys, head_dim, lanes, max_block, rows))),
            "v": In(stream.Signature(pv_word_layout(array_rows, lanes, max_block, rows))),
            "o": Out(stream.Signature(merge_beat_layout(merge_lanes, rows))),
        }
        if not own_arrays:
            for part in ("score", "pv"):
                members[f"{part}_st"] = getattr(self, part).signature.members["st"]
                members[f"{part}_res"] = getattr(self, part).signature.members["res"]
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        sc, pv = self.score, self.pv
        m.submodules.score, m.submodules.pv = sc, pv
        m.submodules.softmax, m.submodules.merge = self.softmax, self.merge
        if self.share is not None:
            m.submodules.share = sh = self.share
            wiring.connect(m, sc.st, sh.c0_st)
            wiring.connect(m, sh.c0_res, sc.res)
            wiring.connect(m, pv.st, sh.c1_st)
            wiring.connect(m, sh.c1_res, pv.res)
        else:
            for part, c in (("score", sc), ("pv", pv)):
                wiring.connect(m, c.st, wiring.flipped(getattr(self, f"{part}_st")))
                wiring.connect(m, wiring.flipped(getattr(self, f"{part}_res")), c.res)
        wiring.connect(m, wiring.flipped(self.q), sc.q)
        wiring.connect(m, wiring.flipped(self.k), sc.k)
        wiring.connect(m, wiring.flipped(self.v), pv.v)
        attend_chain(m, sc.o, self.softmax, pv, self.merge, self.tags)
        wiring.connect(m, self.merge.o, wiring.flipped(self.o))
        return m

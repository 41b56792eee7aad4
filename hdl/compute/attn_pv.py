"""PV bank of the attention engine (paper §5): per (V beat, head) the probability
``p = exp2_neg(m − t)``, the V-scaled weight ``w = round(p·sv >> 12)`` and ``lanes`` products
``w·v`` added into the block accumulator (read-modify-write), bit for bit as
:mod:`mcf.golden.attention` (rounding per key, exact sums)."""

from __future__ import annotations

from amaranth import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.kv import KV_ELEM, KV_SCALE
from mcf.abi.softmax import EXP_FRAC, LANE_BITS, SCORE

from .attn_score import bits_for
from .exp2 import Exp2Neg
from .fixed_ops import lane, round_shift

__all__ = ["PVPipe", "pv_issue_layout", "acc_width"]


def acc_width(max_block: int) -> int:
    """Bits of a block-accumulator lane: ``Σ w·v`` over ``max_block`` keys without overflow
    (and at least one more than a state lane)."""
    w_w = EXP_FRAC + 1 + KV_SCALE.width - KV_SCALE.frac + 1
    return max(LANE_BITS + 1, w_w + KV_ELEM.width + bits_for(max_block) + 2)


def pv_issue_layout(lanes: int, head_dim: int, max_heads: int) -> data.StructLayout:
    """One (V beat, head) pair: chunk ``c`` of a V row for head ``h``; ``ok`` = the row has a
    score (it is within the block's K rows and the block memory)."""
    return data.StructLayout({
        "valid": unsigned(1),
        "h": unsigned(bits_for(max_heads)),
        "c": unsigned(bits_for(head_dim // lanes)),
        "ok": unsigned(1),
        "v": unsigned(lanes * KV_ELEM.width),
    })


class PVPipe(wiring.Component):
    """Probability weighting and the block accumulator update (the PV multiplier bank).

    Members
    -------
    i : In(pv_issue_layout(lanes, head_dim, max_heads))
        One pair per cycle when ``valid``.
    t : In(signed(32))
        Score of the pair's (row, head), the cycle after the issue (score memory read data).
    sv, kvalid : In(unsigned(16)), In(1)
        The row's V scale and "not masked" flag, the cycle after the issue.
    m_base : In(data.ArrayLayout(signed(32), max_heads))
        Per-head maximum the exponentials are taken against (block max, or FIXED mode's ``M``),
        stable while pairs are in flight.
    fixed : In(1)
        FIXED mode: scores above ``m_base`` are clamped (``p = 1``) and flagged on ``err_max``.
    acc_addr : Out(range(max_heads · head_dim/lanes))
        Accumulator word read address, valid when ``acc_rd`` (3 cycles after the issue).
    acc_rd : Out(1)
    acc_data : In(unsigned(lanes · acc_width))
        Read data of ``acc_addr`` the cycle after (read port transparent for ``acc_wr``).
    acc_wr_en, acc_wr_addr, acc_wr_data : Out
        The updated word, 4 cycles after the issue.
    l_en, l_h, l_p : Out
        ``p`` of a (row, head) to add to the head's ``l`` (on the row's chunk 0).
    err_max : Out(1)
        One pulse per (row, head) scoring above ``m_base`` in FIXED mode.
    busy : Out(1)

    Latency: :data:`LATENCY` = 4 cycles from issue to the accumulator write; no handshake.
    """

    LATENCY = 4

    def __init__(self, head_dim: int, lanes: int, max_heads: int, max_block: int):
        self.head_dim, self.lanes = head_dim, lanes
        self.max_heads, self.max_block = max_heads, max_block
        nb = head_dim // lanes
        acc_w = acc_width(max_block)
        super().__init__({
            "i": In(pv_issue_layout(lanes, head_dim, max_heads)),
            "t": In(signed(SCORE.width)),
            "sv": In(unsigned(KV_SCALE.width)),
            "kvalid": In(1),
            "m_base": In(data.ArrayLayout(signed(SCORE.width), max_heads)),
            "fixed": In(1),
            "acc_addr": Out(range(max_heads * nb)),
            "acc_rd": Out(1),
            "acc_data": In(unsigned(lanes * acc_w)),
            "acc_wr_en": Out(1),
            "acc_wr_addr": Out(range(max_heads * nb)),
            "acc_wr_data": Out(unsigned(lanes * acc_w)),
            "l_en": Out(1),
            "l_h": Out(range(max_heads)),
            "l_p": Out(unsigned(EXP_FRAC + 1)),
            "err_max": Out(1),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G = self.head_dim, self.lanes, self.max_heads
        NB = D // L
        SW = SCORE.width
        ACC_W = acc_width(self.max_block)
        W_W = EXP_FRAC + 1 + KV_SCALE.width - KV_SCALE.frac + 1
        m.submodules.exp = exp = Exp2Neg(SW + 1)

        s1, s2, s3 = (Signal(pv_issue_layout(L, D, G), name=f"s{n}") for n in (1, 2, 3))
        m.d.sync += s1.eq(self.i)
        # S1: difference to the maximum into the exp unit; mask
        base = Array(self.m_base[h] for h in range(G))[s1.h]
        diff = Signal(signed(SW + 2))
        m.d.comb += [diff.eq(base - self.t), exp.d.eq(Mux(diff < 0, 0, diff))]
        s1_mask = ~(s1.ok & self.kvalid)
        m.d.comb += self.err_max.eq(s1.valid & self.fixed & (diff < 0) & ~s1_mask & (s1.c == 0))
        s2_mask, s3_mask = Signal(), Signal()
        s2_sv, s3_sv = Signal(KV_SCALE.width), Signal(KV_SCALE.width)
        m.d.sync += [s2.eq(s1), s2_mask.eq(s1_mask), s2_sv.eq(self.sv),
                     s3.eq(s2), s3_mask.eq(s2_mask), s3_sv.eq(s2_sv)]
        # S3: p from the exp unit, w = round(p · sv); accumulator read
        p_eff = Mux(s3_mask, 0, exp.p)
        m.d.comb += [self.acc_addr.eq(s3.h * NB + s3.c), self.acc_rd.eq(s3.valid)]
        s4 = Signal(pv_issue_layout(L, D, G))
        s4_p = Signal(EXP_FRAC + 1)
        s4_w = Signal(W_W)
        m.d.sync += [s4.eq(s3), s4_p.eq(p_eff),
                     s4_w.eq(round_shift(p_eff * s3_sv, KV_SCALE.frac))]
        # S4: o_acc += w · v, lane by lane (exact)
        new = [(lane(self.acc_data, n, ACC_W) + s4_w * lane(s4.v, n, KV_ELEM.width))[:ACC_W]
               for n in range(L)]
        m.d.comb += [
            self.acc_wr_en.eq(s4.valid), self.acc_wr_addr.eq(s4.h * NB + s4.c),
            self.acc_wr_data.eq(Cat(*new)),
            self.l_en.eq(s4.valid & (s4.c == 0)), self.l_h.eq(s4.h), self.l_p.eq(s4_p),
            self.busy.eq(s1.valid | s2.valid | s3.valid | s4.valid),
        ]
        return m

"""QK bank of the attention engine (paper §5): query memory, ``lanes`` INT8×INT4 products with
an adder tree, per-head accumulation over a K row and the log2-domain score scaling of
:func:`mcf.abi.kv.score`, bit for bit."""

from __future__ import annotations

from amaranth import Array, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.kv import (
    KV_ELEM,
    KV_SCALE,
    Q_ELEM,
    QM_SHIFT,
    SCORE_SHIFT_BASE,
    SCORE_SHIFT_MAX,
    score_const,
)
from mcf.abi.quant import SCALE_EXP_BITS, SCALE_MANT_BITS
from mcf.abi.softmax import SCORE

from .fixed_ops import lane, round_shift, round_shift_var, sat

__all__ = ["ScorePipe", "q_load_layout", "score_issue_layout", "score_out_layout", "bits_for"]


def bits_for(n: int) -> int:
    """Bits of an index ``0 .. n-1`` (at least 1)."""
    return max(1, (n - 1).bit_length())


def q_load_layout(lanes: int, head_dim: int, max_heads: int) -> data.StructLayout:
    """One query beat to store: head ``h``, chunk ``c``; the scale fields are taken on ``c = 0``."""
    return data.StructLayout({
        "en": unsigned(1),
        "h": unsigned(bits_for(max_heads)),
        "c": unsigned(bits_for(head_dim // lanes)),
        "data": unsigned(lanes * Q_ELEM.width),
        "scale_m": unsigned(SCALE_MANT_BITS),
        "scale_e": unsigned(SCALE_EXP_BITS),
    })


def score_issue_layout(lanes: int, head_dim: int, max_heads: int,
                       max_block: int) -> data.StructLayout:
    """One (K beat, head) pair: chunk ``c`` of row ``j`` against head ``h``'s query. ``ok``
    (row fits the block memory), ``kvalid`` (row not causally masked) and ``sk`` travel with it."""
    return data.StructLayout({
        "valid": unsigned(1),
        "h": unsigned(bits_for(max_heads)),
        "c": unsigned(bits_for(head_dim // lanes)),
        "j": unsigned(bits_for(max_block) + 2),
        "ok": unsigned(1),
        "kvalid": unsigned(1),
        "sk": unsigned(KV_SCALE.width),
        "k": unsigned(lanes * KV_ELEM.width),
    })


def score_out_layout(max_heads: int, max_block: int) -> data.StructLayout:
    """A finished score ``t`` of row ``j``, head ``h`` (``valid`` for one cycle)."""
    return data.StructLayout({
        "valid": unsigned(1),
        "h": unsigned(bits_for(max_heads)),
        "j": unsigned(bits_for(max_block) + 2),
        "ok": unsigned(1),
        "kvalid": unsigned(1),
        "t": signed(SCORE.width),
    })


class ScorePipe(wiring.Component):
    """Scores of K rows against the query heads of a job (the QK multiplier bank).

    Members
    -------
    load : In(q_load_layout(lanes, head_dim, max_heads))
        Stores a query beat; on its head's first beat (``c = 0``) also the head's score
        multiplier ``qm = round(m·C_d >> QM_SHIFT)`` and shift ``clamp(12 − e, 1, 62)``.
        Must not coincide with issues that read the same head.
    i : In(score_issue_layout(...))
        One (K beat, head) pair per cycle when ``valid``; a row's chunks ``c = 0 .. NB-1`` of a
        head must be issued in order (other heads may interleave).
    o : Out(score_out_layout(...))
        ``t = sat32(round(Σ q·k · sk · qm >> sh))`` of a row and head, :data:`LATENCY` cycles
        after the issue of the row's last chunk; combinational from the last stage.
    busy : Out(1)
        A pair is in flight.

    No handshake: one pair per cycle, fully pipelined (products and adder tree, accumulate,
    ×sk, ×qm, round/saturate).
    """

    LATENCY = 5

    def __init__(self, head_dim: int, lanes: int, max_heads: int, max_block: int):
        self.head_dim, self.lanes = head_dim, lanes
        self.max_heads, self.max_block = max_heads, max_block
        super().__init__({
            "load": In(q_load_layout(lanes, head_dim, max_heads)),
            "i": In(score_issue_layout(lanes, head_dim, max_heads, max_block)),
            "o": Out(score_out_layout(max_heads, max_block)),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G = self.head_dim, self.lanes, self.max_heads
        NB = D // L
        DOT_W = Q_ELEM.width + KV_ELEM.width + max(1, (D - 1).bit_length())
        SW = SCORE.width
        ld, i = self.load, self.i

        m.submodules.qmem = qmem = Memory(shape=unsigned(L * Q_ELEM.width), depth=G * NB,
                                          init=[])
        q_wr, q_rd = qmem.write_port(), qmem.read_port()
        qm = Array(Signal(signed(40), name=f"qm{h}") for h in range(G))
        qsh = Array(Signal(range(SCORE_SHIFT_MAX + 1), name=f"qsh{h}") for h in range(G))
        m.d.comb += [q_wr.addr.eq(ld.h * NB + ld.c), q_wr.data.eq(ld.data), q_wr.en.eq(ld.en)]
        with m.If(ld.en & (ld.c == 0)):
            sh = SCORE_SHIFT_BASE - ld.scale_e.as_signed()
            m.d.sync += [
                qm[ld.h].eq(round_shift(ld.scale_m * score_const(D), QM_SHIFT)),
                qsh[ld.h].eq(Mux(sh < 1, 1, Mux(sh > SCORE_SHIFT_MAX, SCORE_SHIFT_MAX, sh))),
            ]

        # S1: the issued pair with its query beat (memory read), products and adder tree
        m.d.comb += q_rd.addr.eq(i.h * NB + i.c)
        s1 = Signal.like(i)
        m.d.sync += s1.eq(i)
        prods = [lane(q_rd.data, n, Q_ELEM.width) * lane(s1.k, n, KV_ELEM.width)
                 for n in range(L)]
        while len(prods) > 1:
            prods = [prods[n] + prods[n + 1] if n + 1 < len(prods) else prods[n]
                     for n in range(0, len(prods), 2)]
        # S2: accumulate over the row's chunks, per head
        s2 = Signal.like(i)
        s2_psum = Signal(signed(DOT_W))
        m.d.sync += [s2.eq(s1), s2.k.eq(0), s2_psum.eq(prods[0])]
        dacc = Array(Signal(signed(DOT_W), name=f"dacc{h}") for h in range(G))
        dot = Mux(s2.c == 0, 0, dacc[s2.h]) + s2_psum
        with m.If(s2.valid):
            m.d.sync += dacc[s2.h].eq(dot)
        # S3, S4: acc · sk, then · qm (only the row's last chunk goes on)
        s3, s4, s5 = (Signal(score_out_layout(G, self.max_block), name=f"s{n}") for n in (3, 4, 5))
        s3_dot = Signal(signed(DOT_W))
        s3_sk = Signal(KV_SCALE.width)
        s4_p = Signal(signed(DOT_W + KV_SCALE.width + 1))
        s5_p = Signal(signed(DOT_W + KV_SCALE.width + 42))
        s5_sh = Signal(range(SCORE_SHIFT_MAX + 1))
        m.d.sync += [
            s3.valid.eq(s2.valid & (s2.c == NB - 1)), s3.h.eq(s2.h), s3.j.eq(s2.j),
            s3.ok.eq(s2.ok), s3.kvalid.eq(s2.kvalid), s3_dot.eq(dot), s3_sk.eq(s2.sk),
            s4.eq(s3), s4_p.eq(s3_dot * s3_sk),
            s5.eq(s4), s5_p.eq(s4_p * qm[s4.h]), s5_sh.eq(qsh[s4.h]),
        ]
        # S5: round, saturate
        m.d.comb += [
            self.o.valid.eq(s5.valid), self.o.h.eq(s5.h), self.o.j.eq(s5.j),
            self.o.ok.eq(s5.ok), self.o.kvalid.eq(s5.kvalid),
            self.o.t.eq(sat(round_shift_var(s5_p, s5_sh, SCORE_SHIFT_MAX), SW, True)),
            self.busy.eq(s1.valid | s2.valid | s3.valid | s4.valid | s5.valid),
        ]
        return m

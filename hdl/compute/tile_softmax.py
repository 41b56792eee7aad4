"""Row softmax of prefill attention tiled for the GEMM arrays (issue #33 step 2; paper §3.1, §5).

Between the arrays' ``S = Q·Kᵀ`` output and their P·V input: per (query row, KV block) the
scores, the block maximum, the probabilities, the row sum and the 8-bit P row with its shift —
:func:`mcf.golden.attention_tiled.tile_block_state` with ``p_format = P8`` bit for bit (formats
in :mod:`mcf.abi.attn_tile`, :mod:`mcf.abi.kv`, :mod:`mcf.abi.softmax`).
"""

from __future__ import annotations

from amaranth import Array, Module, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.attn_tile import (
    P8,
    P8_SHIFT_MAX,
    W_BITS,
    p8_beat_layout,
    pv_sum_bits,
    score_beat_layout,
)
from mcf.abi.csrmap import COUNTER_BITS
from mcf.abi.kv import (
    KV_SCALE,
    QM_SHIFT,
    SCORE_SHIFT_BASE,
    SCORE_SHIFT_MAX,
    AttnMode,
    q_multiplier,
    score_const,
)
from mcf.abi.quant import SCALE_MANT_BITS
from mcf.abi.softmax import EXP_FRAC, M_EMPTY, SCORE, STATE_L

from .exp2 import Exp2Neg
from .fixed_ops import round_shift, round_shift_var, sat

__all__ = ["TileSoftmax"]


def _max(vals):
    """Maximum of a list of values (a tree of comparators)."""
    while len(vals) > 1:
        vals = [Mux(vals[j] > vals[j + 1], vals[j], vals[j + 1]) if j + 1 < len(vals)
                else vals[j] for j in range(0, len(vals), 2)]
    return vals[0]


class TileSoftmax(wiring.Component):
    """Row softmax of the tiled prefill: S rows in, :data:`~mcf.abi.attn_tile.P8` rows and
    the rows' ``(m_b, l_b, s)`` out, ``keys`` keys per cycle.

    Per row (one query row against one KV block of up to ``max_block`` keys), three passes,
    each ``keys`` keys per cycle, through a ring of ``slots`` row buffers (a slot holds a row
    from its first beat in to its last beat read by pass 3):

    1. as the row arrives: ``t = score(acc, sk, q_multiplier(scale_m), score_shift(scale_e))``
       per key into the slot, and the block maximum ``m_b`` over unmasked keys
       (``M_EMPTY`` if none);
    2. ``p = exp2_neg(m_b − t)`` (0 if masked), ``w = v_weight(p, sv)`` into the slot,
       ``l_b = sat(Σ p)``, ``w_max``, then ``s = p8_row_shift(w_max)``;
    3. ``w8 = quantize_p8(w, s)`` out.

    The passes overlap across rows (pass 1 on row ``r+2`` while pass 2 runs row ``r+1`` and
    pass 3 row ``r``); with enough slots (Rate, below) rows follow back to back, no bubble.

    Parameters
    ----------
    keys : keys per beat (per cycle); head_dim : sets ``acc``'s width and ``q_multiplier``;
    max_block : keys of the longest row (a multiple of ``keys``); slots : row buffers;
    out_depth : the output FIFO (≥ 6; pass 3 issues a beat only with room for it);
    p_format : :data:`~mcf.abi.attn_tile.P8` (the default) or :data:`~mcf.abi.attn_tile.PV_W`
    (below).

    Members
    -------
    i : In(stream.Signature(score_beat_layout(keys, head_dim)))
        A row's beats, ``keys`` keys each, ``last`` on its final beat; a block that is not a
        whole number of beats is padded with ``masked`` keys. ``ready`` does not depend on
        ``valid``: high inside a row, and at a row's first beat while a slot is free.
    o : Out(stream.Signature(p8_beat_layout(keys)))
        The row's ``w8`` (masked keys 0), as many beats as the row came in with, ``last`` on
        the final one; ``m``, ``l``, ``s`` equal on every beat of the row. Rows in order.
        ``valid`` does not wait for ``ready``; the payload holds until taken.
    rows : Out(COUNTER_BITS)
        Rows emitted (wraps).
    err_long : Out(COUNTER_BITS)
        Rows longer than ``max_block`` keys: the beats beyond are taken and dropped, the row
        ends at its ``last`` and is emitted with its first ``max_block`` keys (wraps).
    busy : Out(1)
        A row is inside (taken and not wholly emitted).

    Rate (measured, ``tests/test_tile_softmax.py``): a burst of rows of ``N`` beats each, with
    ``valid`` and ``ready`` always high, takes **N cycles per row** (``keys`` keys per cycle,
    ``i.ready`` never falls) when ``slots · N ≥ 3N +`` :data:`HOLD`, e.g. the ``kr260`` block of
    256 keys at 4 keys per cycle (N = 64) with 4 slots. A slot is held ``3N + HOLD`` cycles, so
    with fewer slots the stage runs ``slots`` rows per ``3N + HOLD`` cycles.

    Latency: ``LATENCY + 2N`` cycles (:data:`LATENCY`) from a row's last beat taken to its last
    beat on ``o`` (``o.ready`` high): passes 1 and 2 of a row end before pass 3 starts.

    ``p_format = PV_W``: pass 3 emits today's ``w`` as it is (``s`` = 0), for P·V in bytes
    on the arrays (:class:`~.array_pv.ArrayPV` with the same ``p_format``) — today's bits —
    and the rows' ``mode`` counts (:func:`~mcf.abi.attn_tile.row_mode_fields`, read on a
    row's last beat): a FIXED row takes its ``m_fix`` for ``m_b`` (so ``p = exp2_neg(max(m_fix
    − t, 0))`` and ``m`` out is ``m_fix``), and its unmasked keys scoring above ``m_fix`` (bad
    input: ``p = 1``) are counted in ``err_fixed`` (wraps). SINGLE and MAX rows are alike here
    (MAX keeps only ``m``, in the merge). ``l`` is exact in every mode (``Σ p < 2^32``). A row
    with ``p8`` (SINGLE) goes out in P8 (its shift and ``w8``, ``p8`` set on its beats). With
    :data:`~mcf.abi.attn_tile.P8` every row is SINGLE and P8.
    """

    LATENCY = 13
    HOLD = 9

    def __init__(self, keys: int = 4, head_dim: int = 128, max_block: int = 256,
                 slots: int = 4, out_depth: int = 8, p_format=P8):
        pv_sum_bits(1, p_format)
        if keys < 1 or max_block % keys:
            raise ValueError("keys must divide max_block")
        if slots < 2 or out_depth < 6:
            raise ValueError("need at least 2 slots and an output FIFO of at least 6")
        self.keys, self.head_dim, self.max_block = keys, head_dim, max_block
        self.slots, self.out_depth = slots, out_depth
        self.beats = max_block // keys
        self.p_format = p_format
        super().__init__({
            "i": In(stream.Signature(score_beat_layout(keys, head_dim))),
            "o": Out(stream.Signature(p8_beat_layout(keys, p_format))),
            "rows": Out(COUNTER_BITS),
            "err_long": Out(COUNTER_BITS),
            **({} if p_format == P8 else {"err_fixed": Out(COUNTER_BITS)}),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        K, S, MB = self.keys, self.slots, self.beats
        SW = SCORE.width
        ctl = data.StructLayout({"valid": 1, "slot": range(S), "beat": range(MB),
                                 "first": 1, "last": 1})
        tkey = data.StructLayout({"t": signed(SW), "sv": unsigned(KV_SCALE.width),
                                  "masked": 1})
        m.submodules.tmem = tmem = Memory(shape=data.ArrayLayout(tkey, K), depth=S * MB, init=[])
        m.submodules.wmem = wmem = Memory(shape=data.ArrayLayout(unsigned(W_BITS), K),
                                          depth=S * MB, init=[])
        t_wr, t_rd = tmem.write_port(), tmem.read_port()
        w_wr, w_rd = wmem.write_port(), wmem.read_port()
        olay = p8_beat_layout(K, self.p_format)
        p8 = self.p_format == P8
        m.submodules.ofifo = ofifo = fifo.SyncFIFOBuffered(width=Shape.cast(olay).width,
                                                           depth=self.out_depth)
        m.d.comb += [self.o.payload.eq(ofifo.r_data), self.o.valid.eq(ofifo.r_rdy),
                     ofifo.r_en.eq(self.o.ready)]
        with m.If(self.o.valid & self.o.ready & self.o.payload.last):
            m.d.sync += self.rows.eq(self.rows + 1)

        # per slot: the row's beats, m_b (pass 1), l_b and s (pass 2)
        d_nb = Array(Signal(range(MB + 1), name=f"d_nb{j}") for j in range(S))
        d_m = Array(Signal(signed(SW), name=f"d_m{j}") for j in range(S))
        d_l = Array(Signal(STATE_L.width, name=f"d_l{j}") for j in range(S))
        d_s = Array(Signal(range(P8_SHIFT_MAX + 1), name=f"d_s{j}") for j in range(S))
        d_p8 = Array(Signal(name=f"d_p8{j}") for j in range(S))   # PV_W stage: the row in P8
        used = Signal(range(S + 1))            # slots taken by rows not yet read by pass 3
        scored = Signal(range(S + 1))          # rows waiting for pass 2
        weighted = Signal(range(S + 1))        # rows waiting for pass 3
        alloc, free, score_done, p2_take, weigh_done, p3_take = (
            Signal(name=n) for n in ("alloc", "free", "score_done", "p2_take", "weigh_done",
                                     "p3_take"))
        m.d.sync += [used.eq(used + alloc - free), scored.eq(scored + score_done - p2_take),
                     weighted.eq(weighted + weigh_done - p3_take)]

        # ---- pass 1: scores into the slot, the block maximum ---------------------------------
        i = self.i
        in_row, long_ = Signal(), Signal()
        wslot = Signal(range(S))
        wptr = Signal(range(S))
        wbeat = Signal(range(MB + 1))
        m.d.comb += i.ready.eq(in_row | (used != S))
        take = i.valid & i.ready
        idx = Mux(in_row, wbeat, 0)
        m.d.comb += alloc.eq(take & ~in_row)
        with m.If(alloc):
            m.d.sync += [wslot.eq(wptr), wptr.eq(Mux(wptr == S - 1, 0, wptr + 1))]
        with m.If(take):
            m.d.sync += [in_row.eq(~i.payload.last), wbeat.eq(Mux(idx == MB, MB, idx + 1)),
                         long_.eq((in_row & long_) | (idx == MB))]
        # beat control down the score pipeline: ``valid`` writes the beat, ``close`` ends the row
        # (``nb`` beats; ``long``: beats were dropped)
        sctl = data.StructLayout({"valid": 1, "close": 1, "long": 1, "first": 1,
                                  "slot": range(S), "beat": range(MB), "nb": range(MB + 1)})
        p1, p2, p3, p4 = (Signal(sctl, name=f"p{n}") for n in (1, 2, 3, 4))
        p1_in = Signal.like(i.payload)
        m.d.sync += [
            p1.valid.eq(take & (idx != MB)), p1.close.eq(take & i.payload.last),
            p1.long.eq((in_row & long_) | (idx == MB)), p1.first.eq(take & (idx == 0)),
            p1.slot.eq(Mux(in_row, wslot, wptr)), p1.beat.eq(idx),
            p1.nb.eq(Mux(idx == MB, MB, idx + 1)), p1_in.eq(i.payload),
            p2.eq(p1), p3.eq(p2), p4.eq(p3),
        ]
        # p2: acc·sk, the query's qm and shift; p3: ·qm; p4: round, saturate (mcf.abi.kv.score)
        sh = SCORE_SHIFT_BASE - p1_in.scale_e
        qm_e = round_shift(p1_in.scale_m * score_const(self.head_dim), QM_SHIFT)
        # the shift minus one (sh ≥ 1): round_half_up(x, sh) = ((x >> (sh − 1)) + 1) >> 1, a
        # shifter as wide as x instead of an adder and shifter twice as wide
        qm = Signal(int(q_multiplier((1 << SCALE_MANT_BITS) - 1, self.head_dim)).bit_length())
        qsh2 = Signal(range(SCORE_SHIFT_MAX))
        qsh3 = Signal.like(qsh2)
        m.d.sync += [qm.eq(qm_e), qsh3.eq(qsh2),
                     qsh2.eq(Mux(sh < 1, 0, Mux(sh > SCORE_SHIFT_MAX, SCORE_SHIFT_MAX, sh) - 1))]
        k2, k3, k4 = (Signal(data.ArrayLayout(tkey, K), name=f"k{n}") for n in (2, 3, 4))
        for k in range(K):
            src = p1_in.keys[k]
            x_sk = Signal((src.acc * src.sk).shape(), name=f"x_sk{k}")
            x_qm = Signal((x_sk * qm).shape(), name=f"x_qm{k}")
            m.d.sync += [
                x_sk.eq(src.acc * src.sk), x_qm.eq(x_sk * qm),
                k2[k].sv.eq(src.sv), k2[k].masked.eq(src.masked), k3[k].eq(k2[k]),
                k4[k].sv.eq(k3[k].sv), k4[k].masked.eq(k3[k].masked),
                k4[k].t.eq(sat(((x_qm >> qsh3) + 1) >> 1, SW, True)),
            ]
        m.d.comb += [t_wr.addr.eq(p4.slot * MB + p4.beat), t_wr.data.eq(k4),
                     t_wr.en.eq(p4.valid)]
        m_run = Signal(signed(SW))
        m_beat = _max([Mux(k4[k].masked, M_EMPTY, k4[k].t) for k in range(K)])
        m_new = _max([Mux(p4.first, M_EMPTY, m_run), Mux(p4.valid, m_beat, M_EMPTY)])
        m.d.sync += m_run.eq(m_new)
        m.d.comb += score_done.eq(p4.close)
        m_row = m_new
        if not p8:
            # FIXED rows: the given maximum instead of the block's; unmasked keys above it
            # counted (their d = m_fix − t < 0 is clamped to 0 in pass 2: p = 1)
            fx2, fx3, fx4 = (Signal(name=f"fx{n}") for n in (2, 3, 4))
            mf2, mf3, mf4 = (Signal(signed(SW), name=f"mf{n}") for n in (2, 3, 4))
            m.d.sync += [fx2.eq(p1_in.mode == AttnMode.FIXED), mf2.eq(p1_in.m_fix),
                         fx3.eq(fx2), mf3.eq(mf2), fx4.eq(fx3), mf4.eq(mf3)]
            over = [p4.valid & fx4 & ~k4[k].masked & (k4[k].t > mf4) for k in range(K)]
            m.d.sync += self.err_fixed.eq(self.err_fixed + sum(over))
            m_row = Mux(fx4, mf4, m_new)
            # a row in P8 on this PV_W stage (the row's p8): its shift and w8 in passes 2, 3
            q82, q83, q84 = (Signal(name=f"q8{n}") for n in (2, 3, 4))
            m.d.sync += [q82.eq(p1_in.p8), q83.eq(q82), q84.eq(q83)]
            with m.If(p4.close):
                m.d.sync += d_p8[p4.slot].eq(q84)
        with m.If(p4.close):
            m.d.sync += [d_m[p4.slot].eq(m_row), d_nb[p4.slot].eq(p4.nb)]
            with m.If(p4.long):
                m.d.sync += self.err_long.eq(self.err_long + 1)

        # ---- pass 2: p, w into the slot, l_b, w_max, s ----------------------------------------
        iss2, slot2, beat2, last2 = self._issue(m, "p2", d_nb, scored, 1, p2_take)
        m.d.comb += t_rd.addr.eq(slot2 * MB + beat2)
        r1, r2, r3, r4 = (Signal(ctl, name=f"r{n}") for n in (1, 2, 3, 4))
        r1_m = Signal(signed(SW))
        m.d.sync += [r1.valid.eq(iss2), r1.slot.eq(slot2), r1.beat.eq(beat2),
                     r1.first.eq(beat2 == 0), r1.last.eq(last2), r1_m.eq(d_m[slot2]),
                     r2.eq(r1), r3.eq(r2), r4.eq(r3)]
        # r1: m_b − t into the 2^-d units; r3: p (0 if masked), w = v_weight(p, sv); r4: write
        tk2, tk3 = (Signal(data.ArrayLayout(tkey, K), name=f"tk{n}") for n in (2, 3))
        p4 = Signal(data.ArrayLayout(unsigned(EXP_FRAC + 1), K))
        w4 = Signal(data.ArrayLayout(unsigned(W_BITS), K))
        for k in range(K):
            m.submodules[f"exp{k}"] = exp = Exp2Neg(SW + 1)
            diff = r1_m - t_rd.data[k].t
            p = Mux(tk3[k].masked, 0, exp.p)
            m.d.comb += exp.d.eq(Mux(diff < 0, 0, diff))
            m.d.sync += [tk2[k].eq(t_rd.data[k]), tk3[k].eq(tk2[k]), p4[k].eq(p),
                         w4[k].eq(round_shift(p * tk3[k].sv, KV_SCALE.frac))]
        m.d.comb += [w_wr.addr.eq(r4.slot * MB + r4.beat), w_wr.data.eq(w4),
                     w_wr.en.eq(r4.valid)]
        l_acc = Signal((self.max_block << EXP_FRAC).bit_length())
        w_max = Signal(W_BITS)
        fin, fslot = Signal(), Signal(range(S))
        with m.If(r4.valid):
            m.d.sync += [
                l_acc.eq(Mux(r4.first, 0, l_acc) + sum(p4[k] for k in range(K))),
                w_max.eq(_max([Mux(r4.first, 0, w_max)] + [w4[k] for k in range(K)])),
            ]
        m.d.sync += [fin.eq(r4.valid & r4.last), fslot.eq(r4.slot)]
        bl = Signal(range(W_BITS + 1))              # bit length of w_max
        for b in range(W_BITS):
            with m.If(w_max[b]):
                m.d.comb += bl.eq(b + 1)
        m.d.comb += weigh_done.eq(fin)
        with m.If(fin):
            m.d.sync += d_l[fslot].eq(sat(l_acc, STATE_L.width, False))
            shift = Mux(bl > P8.width, bl - P8.width, 0)
            m.d.sync += d_s[fslot].eq(shift if p8 else Mux(d_p8[fslot], shift, 0))

        # ---- pass 3: w8 = quantize_p8(w, s) into the output FIFO ------------------------------
        # issued only with room in the FIFO for every beat in flight: the pipeline never stalls
        q1_v, q2_v = Signal(), Signal()
        credit = ofifo.level + q1_v + q2_v < self.out_depth - 1
        iss3, slot3, beat3, last3 = self._issue(m, "p3", d_nb, weighted, credit, p3_take)
        m.d.comb += [w_rd.addr.eq(slot3 * MB + beat3), free.eq(iss3 & last3)]
        q1, q2 = Signal(olay), Signal(olay)        # q1: the record (w8 unused); q2: the beat
        m.d.sync += [q1_v.eq(iss3), q1.last.eq(last3), q1.m.eq(d_m[slot3]), q1.l.eq(d_l[slot3]),
                     q1.s.eq(d_s[slot3]), q1.p8.eq(1 if p8 else d_p8[slot3]), q2_v.eq(q1_v),
                     q2.m.eq(q1.m), q2.l.eq(q1.l), q2.s.eq(q1.s), q2.p8.eq(q1.p8),
                     q2.last.eq(q1.last)]
        for k in range(K):
            w8 = sat(round_shift_var(w_rd.data[k], q1.s, P8_SHIFT_MAX), P8.width, False)
            m.d.sync += q2.w8[k].eq(w8 if p8 else Mux(q1.p8, w8, w_rd.data[k]))
        m.d.comb += [ofifo.w_data.eq(q2), ofifo.w_en.eq(q2_v),
                     self.busy.eq((used != 0) | q1_v | q2_v | (ofifo.level != 0))]
        return m

    def _issue(self, m, name, d_nb, pending, can, took):
        """A pass's read side: the rows of ``pending`` slots in ring order, one beat per cycle
        while ``can``, the next row's first beat right after a row's last. Returns
        ``(issue, slot, beat, last)`` (combinational) and drives ``took`` on a row's start."""
        S, MB = self.slots, self.beats
        active = Signal(name=f"{name}_active")
        ptr, cur = Signal(range(S), name=f"{name}_ptr"), Signal(range(S), name=f"{name}_cur")
        beat = Signal(range(MB + 1), name=f"{name}_beat")
        nb = Signal(range(MB + 1), name=f"{name}_nb")
        start = ~active & (pending != 0) & can
        issue = Signal(name=f"{name}_issue")
        m.d.comb += [issue.eq((active & can) | start), took.eq(start)]
        slot = Mux(active, cur, ptr)
        b = Mux(active, beat, 0)
        last = b == Mux(active, nb, d_nb[ptr]) - 1
        with m.If(start):
            m.d.sync += [cur.eq(ptr), nb.eq(d_nb[ptr]), ptr.eq(Mux(ptr == S - 1, 0, ptr + 1))]
        with m.If(issue):
            m.d.sync += [beat.eq(b + 1), active.eq(~last)]
        return issue, slot, b, last

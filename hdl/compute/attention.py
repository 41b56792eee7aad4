"""Attention engine of the MCF node (paper §3.1, §4 end, §5): local attention over the KV blocks
a node holds, with the online softmax, grouped-query heads, causal mask and three modes.

Arithmetic, formats and the order of operations are those of :mod:`mcf.abi.kv`,
:mod:`mcf.abi.softmax` and the golden model :mod:`mcf.golden.attention`, bit for bit.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.kv import (
    KV_ELEM,
    KV_SCALE,
    Q_ELEM,
    QM_SHIFT,
    SCORE_SHIFT_BASE,
    SCORE_SHIFT_MAX,
    AttnMode,
    attn_job_layout,
    attn_status_layout,
    kv_beat_layout,
    q_beat_layout,
    score_const,
)
from mcf.abi.softmax import (
    EXP_FRAC,
    LANE_BITS,
    M_EMPTY,
    RECIP_IN_BITS,
    SCORE,
    STATE_L,
    STATE_O,
)

from .exp2 import Exp2Neg
from .recip import Recip

__all__ = ["AttentionEngine"]


def _sat(value, width: int, is_signed: bool):
    """Saturate an Amaranth value to ``width`` bits (signed or unsigned)."""
    if is_signed:
        lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
        return Mux(value > hi, hi, Mux(value < lo, lo, value))[:width]
    hi = (1 << width) - 1
    return Mux(value > hi, hi, Mux(value < 0, 0, value))[:width]


def _round_shift(value, shift: int):
    """Half-up rounding arithmetic shift by a constant (mcf.abi.fixed.round_shift)."""
    return (value + (1 << (shift - 1))) >> shift


class AttentionEngine(wiring.Component):
    """Attention over local KV blocks, one job (query token × ``heads`` query heads sharing a
    KV head) at a time. Prefill (``normalize``, ``causal``) emits ``o / l`` for the next GEMM;
    decode emits per-head partial states ``(m, l, o)`` for the NIC reduction engine.

    Members
    -------
    job : In(stream.Signature(attn_job_layout(max_heads)))
        Job descriptor (:class:`mcf.abi.kv.AttnMode`, heads, block count, query position).
    q : In(stream.Signature(q_beat_layout(lanes)))
        ``heads · head_dim/lanes`` query beats per job, head-major.
    kv : In(stream.Signature(kv_beat_layout(lanes)))
        ``n_blocks`` blocks per job: each block's K rows, then its V rows, ``last`` on its final
        beat (``mcf.abi.kv.kv_beat_layout``).
    o : Out(stream.Signature(beat_layout(data_width)))
        Payload beats for the packetizer: per job :func:`mcf.abi.kv.job_out_words` 32-bit
        little-endian words (``pack_state`` per head, or ``o/l``, or ``m``) in
        :func:`mcf.abi.kv.job_payloads` payloads (one per head for states), ``keep`` on each
        payload's final beat, ``last`` at its end.
    status : Out(attn_status_layout())
        Counters (jobs, blocks, malformed input) and ``busy``. A job with ``heads`` outside
        ``1..max_heads`` is rejected: its ``heads · head_dim/lanes`` query beats and its
        ``n_blocks`` blocks are consumed and dropped, nothing is emitted, ``err_job`` counts it.

    Throughput: one (beat, head) pair per cycle, i.e. ``lanes`` multiply-accumulates per cycle
    in both the score (QK) and the value (PV) phase (causally masked rows pass at one beat per
    cycle, unscored): ``2 · head_dim / lanes`` cycles per
    (query, key) pair per head plus per-block (pipeline drain, merge: ``heads·(head_dim/lanes ·
    (lanes/merge_lanes + 1) + 5)``) and per-job (query load, output) overheads;
    ``scripts/bench_attention.py`` measures it. ``merge_lanes`` (default ``lanes/4``) trades the
    rescaling multipliers of the merge against its cycles.
    Latency: the output of a job starts ~10 cycles after its last KV beat (SINGLE mode adds the
    last block's merge). Stream rules: ``o`` raises ``valid`` without waiting for ``ready`` and
    holds the beat; inputs are consumed only in the phase that needs them, so a source may
    present beats early. Malformed blocks (row counts, missing ``last``, rows beyond
    ``max_block``) are processed as far as they are well-formed, counted, and never hang the
    engine.
    """

    def __init__(self, head_dim: int = 128, lanes: int = 16, max_heads: int = 6,
                 max_block: int = 256, data_width: int = 64, out_fifo_depth: int = 16,
                 merge_lanes: int | None = None):
        if head_dim % lanes:
            raise ValueError("head_dim must be a multiple of lanes")
        if lanes & (lanes - 1):
            raise ValueError("lanes must be a power of two")
        if data_width % LANE_BITS:
            raise ValueError("data_width must be a multiple of 32")
        self.head_dim, self.lanes, self.max_heads = head_dim, lanes, max_heads
        self.max_block, self.data_width = max_block, data_width
        self.out_fifo_depth = out_fifo_depth
        self.merge_lanes = merge_lanes if merge_lanes is not None else max(1, lanes // 4)
        if lanes % self.merge_lanes:
            raise ValueError("merge_lanes must divide lanes")
        super().__init__({
            "job": In(stream.Signature(attn_job_layout(max_heads))),
            "q": In(stream.Signature(q_beat_layout(lanes))),
            "kv": In(stream.Signature(kv_beat_layout(lanes))),
            "o": Out(stream.Signature(beat_layout(data_width))),
            "status": Out(attn_status_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        D, L, G = self.head_dim, self.lanes, self.max_heads
        NB = D // L
        HB = max(1, (G - 1).bit_length())
        TB = max(1, (self.max_block - 1).bit_length())
        DOT_W = Q_ELEM.width + KV_ELEM.width + max(1, (D - 1).bit_length())
        W_W = EXP_FRAC + 1 + KV_SCALE.width - KV_SCALE.frac + 1      # v-weighted probability
        ACC_W = max(LANE_BITS + 1, W_W + KV_ELEM.width + TB + 2)
        SW = SCORE.width

        kvp, qp, jobp = self.kv.payload, self.q.payload, self.job.payload

        # ---------------- memories -----------------------------------------------------------
        m.submodules.qmem = qmem = Memory(shape=unsigned(L * Q_ELEM.width), depth=G * NB, init=[])
        m.submodules.smem = smem = Memory(shape=signed(SW), depth=self.max_block << HB, init=[])
        m.submodules.rmem = rmem = Memory(shape=unsigned(KV_SCALE.width + 1),
                                          depth=self.max_block, init=[])
        m.submodules.oacc = oacc = Memory(shape=unsigned(L * ACC_W), depth=G * NB, init=[])
        m.submodules.orun = orun = Memory(shape=unsigned(L * LANE_BITS), depth=G * NB, init=[])
        q_wr, q_rd = qmem.write_port(), qmem.read_port()
        s_wr, s_rd = smem.write_port(), smem.read_port()
        r_wr, r_rd = rmem.write_port(), rmem.read_port()
        r_nx = rmem.read_port()      # validity of the V row about to start (masked-row skip)
        a_wr = oacc.write_port()
        a_rd = oacc.read_port(transparent_for=(a_wr,))
        o_wr = orun.write_port()
        o_rd = orun.read_port()

        m.submodules.exp_v = exp_v = Exp2Neg(SW + 1)
        m.submodules.exp_a = exp_a = Exp2Neg(SW + 1)
        m.submodules.exp_b = exp_b = Exp2Neg(SW + 1)
        m.submodules.recip = recip = Recip()

        # ---------------- job registers -------------------------------------------------------
        mode = Signal(AttnMode)
        normalize = Signal()
        causal = Signal()
        heads = Signal(range(G + 1))
        drop_heads = Signal.like(jobp.heads)
        n_blocks = Signal(16)
        q_pos = Signal.like(jobp.q_pos)
        blk_idx = Signal(16)

        qm = Array(Signal(signed(40), name=f"qm{h}") for h in range(G))
        qsh = Array(Signal(range(SCORE_SHIFT_MAX + 1), name=f"qsh{h}") for h in range(G))
        mfix = Array(Signal(signed(SW), name=f"mfix{h}") for h in range(G))
        mblk = Array(Signal(signed(SW), name=f"mblk{h}") for h in range(G))
        mrun = Array(Signal(signed(SW), name=f"mrun{h}") for h in range(G))
        lrun = Array(Signal(unsigned(LANE_BITS), name=f"lrun{h}") for h in range(G))
        lacc = Array(Signal(unsigned(LANE_BITS), name=f"lacc{h}") for h in range(G))
        dacc = Array(Signal(signed(DOT_W), name=f"dacc{h}") for h in range(G))

        st = self.status

        # beat / row counters shared by the K and V phases
        h_cnt = Signal(HB)
        c_cnt = Signal(max(1, (NB - 1).bit_length()))
        nk = Signal(TB + 2)          # K rows seen in this block
        jv = Signal(TB + 2)          # V rows seen in this block
        row_sk = Signal(KV_SCALE.width)
        row_valid = Signal()
        qcnt = Signal(range((1 << len(jobp.heads)) * NB + 1))
        blk_end = Signal()           # the block's final beat has been consumed

        last_head = h_cnt == heads - 1
        last_c = c_cnt == NB - 1

        # ---------------- K pipeline (scores) ---------------------------------------------------
        k_issue = Signal()
        k1 = Signal()
        k1_h = Signal(HB)
        k1_first = Signal()
        k1_last = Signal()
        k1_j = Signal(TB + 2)
        k1_sk = Signal(KV_SCALE.width)
        k1_ok = Signal()
        k1_valid = Signal()
        k1_data = Signal(L * KV_ELEM.width)
        k2 = Signal()
        k2_h = Signal(HB)
        k2_first = Signal()
        k2_last = Signal()
        k2_psum = Signal(signed(DOT_W))
        k2_j = Signal(TB + 2)
        k2_sk = Signal(KV_SCALE.width)
        k2_ok = Signal()
        k2_valid = Signal()
        k3 = Signal()
        k3_h = Signal(HB)
        k3_dot = Signal(signed(DOT_W))
        k3_j = Signal(TB + 2)
        k3_sk = Signal(KV_SCALE.width)
        k3_ok = Signal()
        k3_valid = Signal()
        k4 = Signal()
        k4_h = Signal(HB)
        k4_p = Signal(signed(DOT_W + KV_SCALE.width + 1))
        k4_j = Signal(TB + 2)
        k4_ok = Signal()
        k4_valid = Signal()
        k5 = Signal()
        k5_h = Signal(HB)
        k5_p = Signal(signed(DOT_W + KV_SCALE.width + 42))
        k5_sh = Signal(range(SCORE_SHIFT_MAX + 1))
        k5_j = Signal(TB + 2)
        k5_ok = Signal()
        k5_valid = Signal()

        row_start = (c_cnt == 0) & (h_cnt == 0)
        cur_sk = Mux(row_start, kvp.scale_k, row_sk)
        pos_ok = ~causal | (kvp.pos <= q_pos)
        cur_valid = Mux(row_start, pos_ok, row_valid)
        m.d.comb += q_wr.addr.eq(qcnt), q_rd.addr.eq(h_cnt * NB + c_cnt)
        m.d.sync += [
            k1.eq(k_issue), k1_h.eq(h_cnt), k1_first.eq(c_cnt == 0), k1_last.eq(last_c),
            k1_j.eq(nk), k1_sk.eq(cur_sk), k1_ok.eq(nk < self.max_block),
            k1_valid.eq(cur_valid), k1_data.eq(kvp.data),
        ]
        k_take = Signal()            # a K beat is being processed this cycle
        with m.If(k_take & row_start):
            m.d.sync += [row_sk.eq(kvp.scale_k), row_valid.eq(pos_ok)]
            m.d.comb += [r_wr.addr.eq(nk), r_wr.data.eq(Cat(kvp.scale_v, pos_ok)),
                         r_wr.en.eq(nk < self.max_block)]
        # S1: products and adder tree
        prods = []
        for i in range(L):
            qe = q_rd.data[i * Q_ELEM.width:(i + 1) * Q_ELEM.width].as_signed()
            ke = k1_data[i * KV_ELEM.width:(i + 1) * KV_ELEM.width].as_signed()
            prods.append(qe * ke)
        while len(prods) > 1:
            prods = [prods[i] + prods[i + 1] if i + 1 < len(prods) else prods[i]
                     for i in range(0, len(prods), 2)]
        m.d.sync += [
            k2.eq(k1), k2_h.eq(k1_h), k2_first.eq(k1_first), k2_last.eq(k1_last),
            k2_psum.eq(prods[0]), k2_j.eq(k1_j), k2_sk.eq(k1_sk), k2_ok.eq(k1_ok),
            k2_valid.eq(k1_valid),
        ]
        # S2: accumulate over the row's beats, per head
        dot = Mux(k2_first, 0, dacc[k2_h]) + k2_psum
        with m.If(k2):
            m.d.sync += dacc[k2_h].eq(dot)
        m.d.sync += [
            k3.eq(k2 & k2_last), k3_h.eq(k2_h), k3_dot.eq(dot), k3_j.eq(k2_j),
            k3_sk.eq(k2_sk), k3_ok.eq(k2_ok), k3_valid.eq(k2_valid),
        ]
        # S3, S4: score scaling acc · sk · qm
        m.d.sync += [
            k4.eq(k3), k4_h.eq(k3_h), k4_p.eq(k3_dot * k3_sk), k4_j.eq(k3_j), k4_ok.eq(k3_ok),
            k4_valid.eq(k3_valid),
            k5.eq(k4), k5_h.eq(k4_h), k5_p.eq(k4_p * qm[k4_h]), k5_j.eq(k4_j), k5_ok.eq(k4_ok),
            k5_valid.eq(k4_valid), k5_sh.eq(qsh[k4_h]),
        ]
        # S5: round, saturate, store, maximum
        t_new = Signal(signed(SW))
        half = (Const(1, SCORE_SHIFT_MAX + 1) << k5_sh) >> 1
        m.d.comb += t_new.eq(_sat((k5_p + half) >> k5_sh, SW, True))
        m.d.comb += [s_wr.addr.eq(Cat(k5_h, k5_j[:TB])), s_wr.data.eq(t_new),
                     s_wr.en.eq(k5 & k5_ok)]
        with m.If(k5 & k5_ok & k5_valid):
            with m.If(t_new > mblk[k5_h]):
                m.d.sync += mblk[k5_h].eq(t_new)
            with m.If((mode == AttnMode.MAX) & (t_new > mrun[k5_h])):
                m.d.sync += mrun[k5_h].eq(t_new)
        k_busy = k1 | k2 | k3 | k4 | k5

        # ---------------- V pipeline (probabilities, weighted sums) ---------------------------
        v_issue = Signal()
        v1 = Signal()
        v1_h = Signal(HB)
        v1_c = Signal(range(NB))
        v1_ok = Signal()
        v1_data = Signal(L * KV_ELEM.width)
        v2 = Signal()
        v2_h = Signal(HB)
        v2_c = Signal(range(NB))
        v2_mask = Signal()
        v2_data = Signal(L * KV_ELEM.width)
        v2_sv = Signal(KV_SCALE.width)
        v3 = Signal()
        v3_h = Signal(HB)
        v3_c = Signal(range(NB))
        v3_mask = Signal()
        v3_data = Signal(L * KV_ELEM.width)
        v3_sv = Signal(KV_SCALE.width)
        v4 = Signal()
        v4_h = Signal(HB)
        v4_c = Signal(range(NB))
        v4_p = Signal(EXP_FRAC + 1)
        v4_data = Signal(L * KV_ELEM.width)
        v4_w = Signal(W_W)

        m.d.comb += [s_rd.addr.eq(Cat(h_cnt, jv[:TB])), r_rd.addr.eq(jv[:TB])]
        v_row_done = Signal()
        m.d.comb += r_nx.addr.eq(Mux(v_row_done, jv + 1, jv)[:TB])
        v_skip = ~r_nx.data[KV_SCALE.width] | (jv >= nk) | (jv >= self.max_block)
        m.d.sync += [
            v1.eq(v_issue), v1_h.eq(h_cnt), v1_c.eq(c_cnt),
            v1_ok.eq((jv < nk) & (jv < self.max_block)), v1_data.eq(kvp.data),
        ]
        t_old = s_rd.data
        base = Mux(mode == AttnMode.FIXED, mfix[v1_h], mblk[v1_h])
        diff = Signal(signed(SW + 2))
        m.d.comb += [diff.eq(base - t_old), exp_v.d.eq(Mux(diff < 0, 0, diff))]
        v1_rvalid = r_rd.data[KV_SCALE.width]
        v1_mask = ~(v1_ok & v1_rvalid)
        with m.If(v1 & (mode == AttnMode.FIXED) & (diff < 0) & ~v1_mask & (v1_c == 0)):
            m.d.sync += st.err_max.eq(st.err_max + 1)
        m.d.sync += [
            v2.eq(v1), v2_h.eq(v1_h), v2_c.eq(v1_c), v2_mask.eq(v1_mask), v2_data.eq(v1_data),
            v2_sv.eq(r_rd.data[:KV_SCALE.width]),
            v3.eq(v2), v3_h.eq(v2_h), v3_c.eq(v2_c), v3_mask.eq(v2_mask), v3_data.eq(v2_data),
            v3_sv.eq(v2_sv),
        ]
        p_eff = Mux(v3_mask, 0, exp_v.p)
        a_rd_addr_v = v3_h * NB + v3_c
        m.d.sync += [
            v4.eq(v3), v4_h.eq(v3_h), v4_c.eq(v3_c), v4_p.eq(p_eff), v4_data.eq(v3_data),
            v4_w.eq(_round_shift(p_eff * v3_sv, KV_SCALE.frac)),
        ]
        v_new = []
        for i in range(L):
            old = a_rd.data[i * ACC_W:(i + 1) * ACC_W].as_signed()
            ve = v4_data[i * KV_ELEM.width:(i + 1) * KV_ELEM.width].as_signed()
            v_new.append((old + v4_w * ve)[:ACC_W])
        v_busy = v1 | v2 | v3 | v4

        # ---------------- merge (SINGLE mode, per block) and output datapaths -----------------
        mh = Signal(HB)              # head being merged / output
        mc = Signal(range(NB + 1))
        m_new = Signal(signed(SW))
        fa = Signal(EXP_FRAC + 1)
        fb = Signal(EXP_FRAC + 1)
        wait = Signal(3)
        # the merge rescales ``merge_lanes`` lanes of a word per cycle (S cycles per word)
        ML = self.merge_lanes
        S = L // ML
        ms = Signal(range(S + 1))    # 0: read latency, 1..S: chunk ms-1
        m.d.comb += [exp_a.d.eq(m_new - mrun[mh]), exp_b.d.eq(m_new - mblk[mh])]
        # chunks come from the read data (first) or from shift registers holding the rest
        osh = Signal(L * LANE_BITS)
        ash = Signal(L * ACC_W)
        wbuf = Signal(L * LANE_BITS)
        o_src = Mux(ms == 1, o_rd.data, osh)
        a_src = Mux(ms == 1, a_rd.data, ash)
        chunk = []
        for i in range(ML):
            ro = o_src[i * LANE_BITS:(i + 1) * LANE_BITS].as_signed()
            bo = _sat(a_src[i * ACC_W:(i + 1) * ACC_W].as_signed(), LANE_BITS, True)
            s = _round_shift(ro * fa, EXP_FRAC) + _round_shift(bo.as_signed() * fb, EXP_FRAC)
            chunk.append(_sat(s, STATE_O.width, True))
        merged_word = Cat(wbuf[ML * LANE_BITS:], *chunk)    # chunk 0 ends up lowest
        l_merged = _sat(_round_shift(lrun[mh] * fa, EXP_FRAC)
                        + _round_shift(lacc[mh] * fb, EXP_FRAC), STATE_L.width, False)

        # output word pipeline: issue → w1 (memory data) → w2 (product) → w3 (final) → FIFO
        m.submodules.ofifo = ofifo = SyncFIFOBuffered(width=LANE_BITS + 1,
                                                      depth=self.out_fifo_depth)
        widx = Signal(range(D + 3))
        n_words = Signal(range(D + 3))
        w_issue = Signal()
        w1 = Signal()
        w1_last = Signal()
        w1_isO = Signal()
        w1_val = Signal(LANE_BITS)
        w1_lane = Signal(range(L))
        w1_fixed = Signal()
        w1_e = Signal(range(LANE_BITS))
        w1_lz = Signal()
        w2_e = Signal(range(LANE_BITS))
        w2_lz = Signal()
        w2 = Signal()
        w2_last = Signal()
        w2_isO = Signal()
        w2_val = Signal(LANE_BITS)
        w2_prod = Signal(signed(LANE_BITS + RECIP_IN_BITS + 2))
        w3 = Signal()
        w3_last = Signal()
        w3_val = Signal(LANE_BITS)
        r_val = Signal(RECIP_IN_BITS + 1)
        e_val = Signal(range(LANE_BITS))
        l_zero = Signal()
        o_first = Signal(range(3))     # index of the first o word in a head (2, or 0)
        o_idx = widx - o_first
        w_word = Signal(LANE_BITS)
        w_is_o = Signal()
        last_word = Signal()
        out_space = ofifo.level <= self.out_fifo_depth - 5
        m.d.comb += w_is_o.eq((mode != AttnMode.MAX) & (widx >= o_first))
        with m.If(widx == 0):
            m.d.comb += w_word.eq(Mux(mode == AttnMode.FIXED, mfix[mh], mrun[mh]))
        with m.Else():
            m.d.comb += w_word.eq(Mux(mode == AttnMode.FIXED, lacc[mh], lrun[mh]))
        m.d.sync += [
            w1.eq(w_issue), w1_last.eq(last_word), w1_isO.eq(w_is_o), w1_val.eq(w_word),
            w1_lane.eq(o_idx[:max(1, (L - 1).bit_length())] if L > 1 else 0),
            w1_fixed.eq(mode == AttnMode.FIXED), w1_e.eq(e_val), w1_lz.eq(l_zero),
        ]
        w1_o = Signal(LANE_BITS)
        lane_r = Array(o_rd.data[i * LANE_BITS:(i + 1) * LANE_BITS] for i in range(L))
        lane_a = Array(a_rd.data[i * ACC_W:i * ACC_W + LANE_BITS] for i in range(L))
        m.d.comb += w1_o.eq(Mux(w1_fixed, lane_a[w1_lane], lane_r[w1_lane]))
        m.d.sync += [
            w2.eq(w1), w2_last.eq(w1_last), w2_isO.eq(w1_isO),
            w2_val.eq(Mux(w1_isO, w1_o, w1_val)),
            w2_prod.eq(w1_o.as_signed() * r_val), w2_e.eq(w1_e), w2_lz.eq(w1_lz),
        ]
        norm = _sat((w2_prod + ((Const(1, 64) << w2_e) >> 1)) >> w2_e,
                    LANE_BITS, True)
        m.d.sync += [
            w3.eq(w2), w3_last.eq(w2_last),
            w3_val.eq(Mux(normalize & w2_isO, Mux(w2_lz, 0, norm), w2_val)),
        ]
        m.d.comb += [ofifo.w_data.eq(Cat(w3_val, w3_last)), ofifo.w_en.eq(w3)]
        out_busy = w1 | w2 | w3

        # ---------------- read-port / write-port arbitration ----------------------------------
        with m.If(v4):
            m.d.comb += [a_wr.addr.eq(v4_h * NB + v4_c), a_wr.data.eq(Cat(*v_new)),
                         a_wr.en.eq(1)]
            with m.If(v4_c == 0):
                m.d.sync += lacc[v4_h].eq(lacc[v4_h] + v4_p)
        cur_l = Mux(mode == AttnMode.FIXED, lacc[mh], lrun[mh])
        rd_addr = Signal(range(G * NB))
        m.d.comb += [a_rd.addr.eq(Mux(v3, a_rd_addr_v, rd_addr)), o_rd.addr.eq(rd_addr)]

        # ---------------- control FSM -------------------------------------------------------
        m.d.comb += st.busy.eq(1)
        with m.FSM(name="ctl"):
            with m.State("IDLE"):
                m.d.comb += [st.busy.eq(0), self.job.ready.eq(1)]
                with m.If(self.job.valid):
                    hv = jobp.heads
                    bad = (hv == 0) | (hv > G)
                    m.d.sync += [
                        mode.eq(jobp.mode), normalize.eq(jobp.normalize),
                        causal.eq(jobp.causal), n_blocks.eq(jobp.n_blocks),
                        q_pos.eq(jobp.q_pos), blk_idx.eq(0), qcnt.eq(0), h_cnt.eq(0),
                        c_cnt.eq(0),
                        heads.eq(hv), drop_heads.eq(hv),
                    ]
                    m.d.sync += [mrun[h].eq(M_EMPTY) for h in range(G)]
                    m.d.sync += [lrun[h].eq(0) for h in range(G)]
                    m.d.sync += [lacc[h].eq(0) for h in range(G)]
                    with m.If(bad):
                        # rejected: its query and KV beats are consumed and dropped, no output
                        m.d.sync += st.err_job.eq(st.err_job + 1)
                        m.next = "DROP_Q"
                    with m.Else():
                        m.next = "LOAD_Q"

            with m.State("DROP_Q"):
                with m.If(qcnt == drop_heads * NB):
                    with m.If(n_blocks == 0):
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "DROP_KV"
                with m.Else():
                    m.d.comb += self.q.ready.eq(1)
                    with m.If(self.q.valid):
                        m.d.sync += qcnt.eq(qcnt + 1)

            with m.State("DROP_KV"):
                m.d.comb += self.kv.ready.eq(1)
                with m.If(self.kv.valid & kvp.last):
                    m.d.sync += blk_idx.eq(blk_idx + 1)
                    with m.If(blk_idx + 1 == n_blocks):
                        m.next = "IDLE"

            with m.State("LOAD_Q"):
                # the query arrives; the accumulators of the same addresses are cleared
                m.d.comb += self.q.ready.eq(1)
                with m.If(self.q.valid):
                    m.d.comb += [q_wr.data.eq(qp.data), q_wr.en.eq(1),
                                 a_wr.addr.eq(qcnt), a_wr.data.eq(0), a_wr.en.eq(1),
                                 o_wr.addr.eq(qcnt), o_wr.data.eq(0), o_wr.en.eq(1)]
                    m.d.sync += qcnt.eq(qcnt + 1)
                    with m.If(c_cnt == 0):
                        sh = SCORE_SHIFT_BASE - qp.scale_e.as_signed()
                        m.d.sync += [
                            qm[h_cnt].eq(_round_shift(qp.scale_m * score_const(D), QM_SHIFT)),
                            qsh[h_cnt].eq(Mux(sh < 1, 1, Mux(sh > SCORE_SHIFT_MAX,
                                                              SCORE_SHIFT_MAX, sh))),
                            mfix[h_cnt].eq(qp.m_fix.as_signed()),
                        ]
                    m.d.sync += c_cnt.eq(Mux(last_c, 0, c_cnt + 1))
                    with m.If(last_c):
                        m.d.sync += h_cnt.eq(h_cnt + 1)
                    with m.If(qcnt == heads * NB - 1):
                        m.d.sync += [h_cnt.eq(0), c_cnt.eq(0)]
                        with m.If(n_blocks == 0):
                            m.next = "OUT_HEAD"
                            m.d.sync += [mh.eq(0), wait.eq(0)]
                        with m.Else():
                            m.next = "BLOCK_INIT"

            with m.State("BLOCK_INIT"):
                m.d.sync += [mblk[h].eq(M_EMPTY) for h in range(G)]
                m.d.sync += [nk.eq(0), jv.eq(0), h_cnt.eq(0), c_cnt.eq(0), blk_end.eq(0)]
                m.next = "KPHASE"

            with m.State("KPHASE"):
                with m.If(self.kv.valid & ~kvp.v):
                    # a causally masked row is not scored: one cycle per beat instead of heads
                    k_skip = Mux(row_start, ~pos_ok, ~row_valid)
                    done = k_skip | last_head
                    m.d.comb += [k_take.eq(1), k_issue.eq(~k_skip), self.kv.ready.eq(done)]
                    m.d.sync += h_cnt.eq(Mux(done, 0, h_cnt + 1))
                    with m.If(done):
                        m.d.sync += c_cnt.eq(Mux(last_c, 0, c_cnt + 1))
                        with m.If(last_c):
                            m.d.sync += nk.eq(nk + 1)
                            with m.If(nk >= self.max_block):
                                m.d.sync += st.err_rows.eq(st.err_rows + 1)
                        with m.If(kvp.last):
                            # block without V rows (legal in MAX mode)
                            m.next = "DRAIN"
                            with m.If(~last_c):
                                m.d.sync += st.err_rows.eq(st.err_rows + 1)
                with m.Elif(self.kv.valid & kvp.v & ~k_busy):
                    m.d.sync += [h_cnt.eq(0), c_cnt.eq(0)]
                    with m.If(c_cnt != 0):
                        m.d.sync += st.err_rows.eq(st.err_rows + 1)
                    with m.If(mode == AttnMode.MAX):
                        m.next = "VSKIP"
                    with m.Else():
                        m.next = "VPHASE"

            with m.State("VSKIP"):
                with m.If(self.kv.valid & kvp.v):
                    m.d.comb += self.kv.ready.eq(1)
                    with m.If(kvp.last):
                        m.next = "DRAIN"
                with m.Elif(self.kv.valid):      # next block's K row: this block lacked `last`
                    m.d.sync += st.err_rows.eq(st.err_rows + 1)
                    m.next = "DRAIN"

            with m.State("VPHASE"):
                with m.If(self.kv.valid & kvp.v):
                    # masked rows (and rows without a score) add nothing: one cycle per beat
                    done = v_skip | last_head
                    m.d.comb += [v_issue.eq(~v_skip), self.kv.ready.eq(done),
                                 v_row_done.eq(done & last_c)]
                    m.d.sync += h_cnt.eq(Mux(done, 0, h_cnt + 1))
                    with m.If(done):
                        m.d.sync += c_cnt.eq(Mux(last_c, 0, c_cnt + 1))
                        with m.If(last_c):
                            m.d.sync += jv.eq(jv + 1)
                        with m.If(kvp.last):
                            m.next = "DRAIN"
                            with m.If(~last_c):
                                m.d.sync += st.err_rows.eq(st.err_rows + 1)
                with m.Elif(self.kv.valid):      # next block's K row: this block lacked `last`
                    m.d.sync += st.err_rows.eq(st.err_rows + 1)
                    m.next = "DRAIN"

            with m.State("DRAIN"), m.If(~k_busy & ~v_busy):
                m.d.sync += [st.blocks.eq(st.blocks + 1), blk_idx.eq(blk_idx + 1),
                             mh.eq(0), wait.eq(0)]
                with m.If((mode != AttnMode.MAX) & (jv != nk)):
                    m.d.sync += st.err_rows.eq(st.err_rows + 1)
                with m.If(mode == AttnMode.SINGLE):
                    m.next = "MERGE_HEAD"
                with m.Elif(blk_idx + 1 == n_blocks):
                    m.next = "OUT_HEAD"
                with m.Else():
                    m.next = "BLOCK_INIT"

            with m.State("MERGE_HEAD"):
                # m_new, then the two scale factors through the exp units
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == 0):
                    m.d.sync += m_new.eq(Mux(mblk[mh] > mrun[mh], mblk[mh], mrun[mh]))
                with m.If(wait == Exp2Neg.LATENCY + 1):
                    m.d.sync += [fa.eq(exp_a.p), fb.eq(exp_b.p), mc.eq(0), ms.eq(0)]
                    m.next = "MERGE_RUN"

            with m.State("MERGE_RUN"):
                # read a word of the running o and of the block accumulator, rescale it chunk by
                # chunk, write the merged word and clear the accumulator word
                m.d.comb += rd_addr.eq(mh * NB + mc)
                with m.If(ms == 0):
                    m.d.sync += ms.eq(1)
                with m.Else():
                    m.d.sync += [osh.eq(o_src[ML * LANE_BITS:]), ash.eq(a_src[ML * ACC_W:]),
                                 wbuf.eq(merged_word)]
                    with m.If(ms == S):
                        m.d.comb += [o_wr.addr.eq(rd_addr), o_wr.data.eq(merged_word),
                                     o_wr.en.eq(1),
                                     a_wr.addr.eq(rd_addr), a_wr.data.eq(0), a_wr.en.eq(1)]
                        m.d.sync += [ms.eq(0), mc.eq(mc + 1)]
                        with m.If(mc == NB - 1):
                            m.d.sync += [lrun[mh].eq(l_merged), lacc[mh].eq(0),
                                         mrun[mh].eq(m_new), wait.eq(0)]
                            m.next = "MERGE_NEXT"
                    with m.Else():
                        m.d.sync += ms.eq(ms + 1)

            with m.State("MERGE_NEXT"):
                with m.If(mh == heads - 1):
                    with m.If(blk_idx == n_blocks):
                        m.d.sync += [mh.eq(0), wait.eq(0)]
                        m.next = "OUT_HEAD"
                    with m.Else():
                        m.next = "BLOCK_INIT"
                with m.Else():
                    m.d.sync += mh.eq(mh + 1)
                    m.next = "MERGE_HEAD"

            with m.State("OUT_HEAD"):
                # per head: words of this head, and the reciprocal of l when normalising
                lead = Signal(range(LANE_BITS))
                for i in range(LANE_BITS):
                    with m.If(cur_l[i]):
                        m.d.comb += lead.eq(i)
                m.d.comb += recip.x.eq(((cur_l << (RECIP_IN_BITS - 1)) >> lead)
                                       [:RECIP_IN_BITS])
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == 0):
                    m.d.sync += [e_val.eq(lead), l_zero.eq(cur_l == 0), widx.eq(0)]
                    with m.If(mode == AttnMode.MAX):
                        m.d.sync += [n_words.eq(1), o_first.eq(0)]
                    with m.Elif(normalize):
                        m.d.sync += [n_words.eq(D), o_first.eq(0)]
                    with m.Else():
                        m.d.sync += [n_words.eq(D + 2), o_first.eq(2)]
                with m.If(wait == Recip.LATENCY):
                    m.d.sync += r_val.eq(recip.r)
                    m.next = "OUT_RUN"

            with m.State("OUT_RUN"):
                m.d.comb += rd_addr.eq(mh * NB + (o_idx >> max(0, (L - 1).bit_length())))
                with m.If(out_space & ~v3):
                    per_head = (mode != AttnMode.MAX) & ~normalize
                    m.d.comb += [w_issue.eq(1),
                                 last_word.eq(((mh == heads - 1) | per_head)
                                              & (widx == n_words - 1))]
                    m.d.sync += widx.eq(widx + 1)
                    with m.If(widx == n_words - 1):
                        with m.If(mh == heads - 1):
                            m.next = "OUT_DRAIN"
                        with m.Else():
                            m.d.sync += [mh.eq(mh + 1), wait.eq(0)]
                            m.next = "OUT_HEAD"

            with m.State("OUT_DRAIN"), m.If(~out_busy):
                m.d.sync += st.jobs.eq(st.jobs + 1)
                m.next = "IDLE"

        # ---------------- packer: 32-bit words → data_width beats -----------------------------
        WPB = self.data_width // LANE_BITS
        buf = Array(Signal(LANE_BITS, name=f"pk{i}") for i in range(WPB))
        pk_cnt = Signal(range(WPB + 1))
        pk_full = Signal()
        pk_last = Signal()
        m.d.comb += [
            self.o.valid.eq(pk_full),
            self.o.payload.data.eq(Cat(*buf)),
            self.o.payload.last.eq(pk_last),
            ofifo.r_en.eq(~pk_full),
        ]
        keep = Array(Const((1 << (4 * n)) - 1, self.data_width // 8) for n in range(WPB + 1))
        m.d.comb += self.o.payload.keep.eq(keep[pk_cnt])
        with m.If(pk_full), m.If(self.o.ready):
            m.d.sync += [pk_full.eq(0), pk_cnt.eq(0)]
        with m.Elif(ofifo.r_rdy):
            word, wlast = ofifo.r_data[:LANE_BITS], ofifo.r_data[LANE_BITS]
            m.d.sync += [buf[pk_cnt].eq(word), pk_cnt.eq(pk_cnt + 1), pk_last.eq(wlast)]
            with m.If(wlast | (pk_cnt == WPB - 1)):
                m.d.sync += pk_full.eq(1)
        return m

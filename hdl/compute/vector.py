"""Vector unit: the non-GEMM, non-attention ops of a Qwen2 layer in the ABI's fixed-point
formats — residual add, SiLU-gated multiply, RoPE, RMSNorm, requantisation to INT8 (paper §5
compute engine; formats :mod:`mcf.abi.quant`; arithmetic :mod:`mcf.golden.vector` bit for bit).
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import VECTOR_STATUS
from mcf.abi.quant import (
    ACT,
    ACT_FRAC,
    GAMMA,
    NORM_IN_SHIFT,
    NORM_RECIP_BITS,
    NORM_SQRT_SHIFT,
    QMAX_SHIFT,
    RECIP_BITS,
    ROPE,
    RSQRT_MANT_BITS,
    SCALE_MANT_BITS,
    SIG_FRAC,
    SIG_INDEX_BITS,
    SIG_STEP_SHIFT,
    XQ,
    VectorOp,
    sigmoid_lut,
)

from .gemm import gemm_round_shift
from .vector_math import VectorDivider, VectorSqrt

__all__ = ["VectorUnit", "vector_out_layout"]

SS_BITS = 72
PACK = ACT.width // XQ.width        # INT8 codes of PACK code beats share one output beat


class _Kind(enum.Enum, shape=3):
    ADD = 0
    SILU = 1
    ROPE = 2
    SQ = 3       # RMSNorm pass 1: sum of squares (no output)
    MAX = 4      # requant pass 1: absmax (no output)
    NORM = 5     # RMSNorm pass 2
    REQ = 6      # requant pass 2
    SCALE = 7    # requant scale word


def vector_out_layout(lanes: int) -> data.StructLayout:
    return data.StructLayout({"data": unsigned(lanes * ACT.width), "last": unsigned(1)})


def _sat(m, value, width, name):
    out = Signal(signed(width), name=name)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    m.d.comb += out.eq(Mux(value > hi, hi, Mux(value < lo, lo, value)))
    return out


def _bitlen(m, value, name):
    """Comb bit length of an unsigned value (priority encoder)."""
    out = Signal(range(len(value) + 1), name=name)
    m.d.comb += out.eq(0)
    for i in range(len(value)):
        with m.If(value[i]):
            m.d.comb += out.eq(i + 1)
    return out


class _Port:
    def __init__(self, width, addr_width):
        self.addr = Signal(addr_width, name="buf_addr")
        self.data = Signal(width, name="buf_data")
        self.en = Signal(name="buf_en")


BUF_BANK_DEPTH = 2048
"""The token buffer is split into banks of at most this depth: yosys' Xilinx memory mapping
fails on deeper 128-bit memories (e.g. 2240 × 128 for an 8960-element token)."""


def _token_buffer(m: Module, width: int, depth: int):
    """A ``depth`` × ``width`` buffer (one write, one synchronous read port, enable-held) in
    banks of :data:`BUF_BANK_DEPTH`; returns the write and read port records."""
    bank = min(depth, BUF_BANK_DEPTH)
    n_banks = -(-depth // bank)
    lg = (bank - 1).bit_length()
    abits = max(depth - 1, 1).bit_length()
    w, r = _Port(width, abits), _Port(width, abits)
    sel = Signal(range(n_banks), name="buf_sel")
    datas = []
    for i in range(n_banks):
        mem = memory.Memory(shape=unsigned(width), depth=bank, init=[])
        m.submodules[f"buf{i}"] = mem
        wp, rp = mem.write_port(), mem.read_port()
        m.d.comb += [wp.addr.eq(w.addr), wp.data.eq(w.data),
                     wp.en.eq(w.en & ((w.addr >> lg) == i)),
                     rp.addr.eq(r.addr), rp.en.eq(r.en)]
        datas.append(rp.data)
    with m.If(r.en):
        m.d.sync += sel.eq(r.addr >> lg)
    m.d.comb += r.data.eq(Array(datas)[sel])
    return w, r


class VectorUnit(wiring.Component):
    """Token-vector ops, ``lanes`` ACT elements per beat.

    Members
    -------
    op, n_beats, eps : In
        Sampled when a token's first ``a`` beat is offered (hold them stable until then):
        the :class:`mcf.abi.quant.VectorOp`, the token length in beats
        (``N = n_beats · lanes``), RMSNorm ε as a mean-square code
        (:func:`mcf.abi.quant.norm_eps_code`).
    a : In(stream.Signature(unsigned(lanes · 32)))
        First operand (ACT codes, lane ``l`` in bits ``32l``…).
    b : In(stream.Signature(unsigned(lanes · 32)))
        Second operand: ADD — ACT; SILU_MUL — ``up`` (ACT); ROPE — :func:`rope_words`;
        RMSNORM — γ as GAMMA codes in the low 16 bits of each lane; REQUANT — unused.
    o : Out(stream.Signature(vector_out_layout))
        ``n_beats`` result beats per token, ``last`` on the token's final beat. REQUANT emits
        the INT8 codes densely packed (``4 · lanes`` per beat, ``ceil(n_beats / 4)`` beats,
        zero-padded), then one beat whose lane 0 is the scale word
        (:func:`mcf.quant.pack_token_scale`), flagged ``last``.
    status : Out(:data:`mcf.abi.compute.VECTOR_STATUS`)
        Counters: tokens completed, operand beats taken (``a`` and ``b``), result beats.

    Latency: streaming ops (ADD, SILU_MUL, ROPE) 8 cycles, one beat per cycle, one bubble
    between tokens. RMSNORM and REQUANT buffer the token (``n_max`` elements), then run a
    sequential calculation — RMSNorm: ⌊Σ/N⌋ (73 cycles), integer square root (37), ⌊2^48/rms⌋
    (73); REQUANT: ⌊2^31/m⌋ (73) — then a second pass at one beat per cycle.
    """

    def __init__(self, lanes: int = 8, n_max: int = 1536):
        if lanes % 2 or lanes & (lanes - 1) or n_max % lanes:
            raise ValueError("lanes must be a power of two ≥ 2 dividing n_max")
        self.lanes, self.n_max = lanes, n_max
        self.beats_max = n_max // lanes
        W = lanes * ACT.width
        super().__init__({
            "op": In(VectorOp), "n_beats": In(range(self.beats_max + 1)),
            "eps": In(32),
            "a": In(stream.Signature(unsigned(W))),
            "b": In(stream.Signature(unsigned(W))),
            "o": Out(stream.Signature(vector_out_layout(lanes))),
            "status": Out(VECTOR_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        st = self.status
        L = self.lanes
        lb = (L - 1).bit_length()
        en = Signal()
        m.d.comb += en.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        def lanes_of(v, w=32, sgn=True):
            return [(v[i * w:(i + 1) * w].as_signed() if sgn else v[i * w:(i + 1) * w])
                    for i in range(L)]

        # --- token control ------------------------------------------------------------------
        bw, br = _token_buffer(m, L * 32, self.beats_max)
        op = Signal(VectorOp)
        nb = Signal.like(self.n_beats)
        eps = Signal(32)
        cnt = Signal(range(self.beats_max + 1))      # beats issued in this pass
        p1_seen = Signal(range(self.beats_max + 1))  # pass-1 beats through the pipeline
        ss = Signal(SS_BITS)
        amax = Signal(32)
        tok_k = Signal(RSQRT_MANT_BITS + 1)          # multiplier of pass 2 (rm or r)
        tok_sh = Signal(6)
        scale_word = Signal(32)

        # S0 registers
        v0 = Signal()
        k0 = Signal(_Kind)
        last0 = Signal()
        x0 = Signal(L * 32)
        b0 = Signal(L * 32)
        from_buf0 = Signal()
        kk0 = Signal.like(tok_k)
        sh0 = Signal.like(tok_sh)
        x_s0 = Signal(L * 32)
        m.d.comb += x_s0.eq(Mux(from_buf0, br.data, x0))

        m.submodules.div = div = VectorDivider(SS_BITS, 40)
        m.submodules.sqrt = sq = VectorSqrt(SS_BITS)
        m.d.comb += [bw.addr.eq(cnt), bw.data.eq(self.a.payload), br.addr.eq(cnt), br.en.eq(en)]

        def issue(kind, last, from_buf=0, x=None, b=None):
            m.d.sync += [v0.eq(1), k0.eq(kind), last0.eq(last), from_buf0.eq(from_buf),
                         kk0.eq(tok_k), sh0.eq(tok_sh)]
            if x is not None:
                m.d.sync += x0.eq(x)
            if b is not None:
                m.d.sync += b0.eq(b)

        with m.If(en):
            m.d.sync += v0.eq(0)
        stream_kind = Signal(_Kind)
        m.d.comb += stream_kind.eq(Mux(op == VectorOp.ADD, _Kind.ADD,
                                       Mux(op == VectorOp.SILU_MUL, _Kind.SILU, _Kind.ROPE)))
        final = Signal()
        m.d.comb += final.eq(cnt == nb - 1)
        norm = Signal()
        m.d.comb += norm.eq(op == VectorOp.RMSNORM)
        n_elems = Signal(range(self.n_max + 1))
        m.d.comb += n_elems.eq(nb << lb)
        rinv_len = Signal(range(64))
        t_len = Signal(range(64))

        with m.FSM():
            with m.State("IDLE"):
                m.d.sync += [op.eq(self.op), nb.eq(self.n_beats), eps.eq(self.eps), cnt.eq(0),
                             p1_seen.eq(0), ss.eq(0), amax.eq(0)]
                with m.If(self.a.valid & (self.n_beats != 0)):
                    with m.If((self.op == VectorOp.RMSNORM) | (self.op == VectorOp.REQUANT)):
                        m.next = "P1"
                    with m.Elif(self.op.as_value() <= VectorOp.ROPE.value):
                        m.next = "STREAM"
            with m.State("STREAM"):
                go = Signal()
                m.d.comb += [go.eq(en & self.a.valid & self.b.valid),
                             self.a.ready.eq(go), self.b.ready.eq(go)]
                with m.If(go):
                    issue(stream_kind, final, x=self.a.payload, b=self.b.payload)
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(final):
                        m.next = "IDLE"
            with m.State("P1"):
                go = Signal()
                m.d.comb += [go.eq(en & self.a.valid), self.a.ready.eq(en),
                             bw.en.eq(go)]
                with m.If(go):
                    issue(Mux(norm, _Kind.SQ, _Kind.MAX), 0, x=self.a.payload)
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(final):
                        m.next = "DRAIN"
            with m.State("DRAIN"), m.If(p1_seen == nb):
                m.d.sync += cnt.eq(0)
                with m.If(norm):
                    m.d.comb += [div.start.eq(1), div.n.eq(ss), div.d.eq(n_elems)]
                    m.next = "NORM_DIV"
                with m.Else():
                    m.next = "REQ_NORMALISE"
            with m.State("NORM_DIV"), m.If(div.done):
                m.d.comb += [sq.start.eq(1),
                             sq.x.eq((div.q + eps) << NORM_SQRT_SHIFT)]
                m.next = "NORM_SQRT"
            with m.State("NORM_SQRT"), m.If(sq.done):
                m.d.comb += [div.start.eq(1), div.n.eq(1 << NORM_RECIP_BITS),
                             div.d.eq(Mux(sq.root == 0, 1, sq.root))]
                m.next = "NORM_RECIP"
            with m.State("NORM_RECIP"):
                rinv = div.q[:NORM_RECIP_BITS + 1]
                m.d.comb += rinv_len.eq(_bitlen(m, rinv, "rinv_len"))
                with m.If(div.done):
                    tr = rinv_len - RSQRT_MANT_BITS   # may be negative
                    with m.If(rinv_len >= RSQRT_MANT_BITS):
                        m.d.sync += tok_k.eq(rinv >> (rinv_len - RSQRT_MANT_BITS).as_unsigned())
                    with m.Else():
                        m.d.sync += tok_k.eq(rinv << (RSQRT_MANT_BITS - rinv_len).as_unsigned())
                    m.d.sync += tok_sh.eq(NORM_RECIP_BITS - ACT_FRAC - tr)
                    m.next = "P2"
            with m.State("REQ_NORMALISE"):
                m.d.comb += t_len.eq(_bitlen(m, amax, "amax_len"))
                mant = Signal(SCALE_MANT_BITS)
                with m.If(t_len >= SCALE_MANT_BITS):
                    m.d.comb += mant.eq(amax >> (t_len - SCALE_MANT_BITS).as_unsigned())
                with m.Else():
                    m.d.comb += mant.eq(amax << (SCALE_MANT_BITS - t_len).as_unsigned())
                t = t_len - SCALE_MANT_BITS
                e = t - QMAX_SHIFT - ACT_FRAC
                m.d.sync += [tok_sh.eq(RECIP_BITS - QMAX_SHIFT + t),
                             scale_word.eq(Mux(amax == 0, 0,
                                               Cat(mant, e[:8], Const(0, 8))))]
                with m.If(amax == 0):
                    m.d.sync += tok_k.eq(0)
                    m.next = "P2"
                with m.Else():
                    m.d.comb += [div.start.eq(1), div.n.eq(1 << RECIP_BITS), div.d.eq(mant)]
                    m.next = "REQ_RECIP"
            with m.State("REQ_RECIP"), m.If(div.done):
                m.d.sync += tok_k.eq(div.q)
                m.next = "P2"
            with m.State("P2"):
                go = Signal()
                m.d.comb += [go.eq(en & (~norm | self.b.valid)),
                             self.b.ready.eq(en & norm)]
                with m.If(go):
                    issue(Mux(norm, _Kind.NORM, _Kind.REQ), final, from_buf=1,
                          b=self.b.payload)
                    m.d.sync += cnt.eq(cnt + 1)
                    with m.If(final):
                        with m.If(norm):
                            m.next = "IDLE"
                        with m.Else():
                            m.next = "SCALE"
            with m.State("SCALE"), m.If(en):
                issue(_Kind.SCALE, 1, x=scale_word)
                m.next = "IDLE"

        # --- S1: products, table reads --------------------------------------------------------
        xs = lanes_of(x_s0)
        bs = lanes_of(b0, sgn=False)
        sig = sigmoid_lut()
        half = 1 << (SIG_INDEX_BITS - 1)
        v1, last1 = Signal(), Signal()
        k1 = Signal(_Kind)
        sh1 = Signal(6)
        p1 = [Signal(signed(62), name=f"p1_{i}") for i in range(L)]
        p2 = [Signal(signed(49), name=f"p2_{i}") for i in range(L)]
        x1 = [Signal(signed(32), name=f"x1_{i}") for i in range(L)]
        b1 = [Signal(32, name=f"b1_{i}") for i in range(L)]
        f1 = [Signal(SIG_STEP_SHIFT, name=f"f1_{i}") for i in range(L)]
        sig_a, sig_b = [], []
        with m.If(en):
            m.d.sync += [v1.eq(v0), k1.eq(k0), last1.eq(last0), sh1.eq(sh0)]
        for i in range(L):
            xi = xs[i]
            c = bs[i][:16].as_signed()
            s_ = bs[i][16:].as_signed()
            xsq = (xi >> NORM_IN_SHIFT)
            a_op = Signal(signed(32), name=f"ma{i}")
            b_op = Signal(signed(29), name=f"mb{i}")
            m.d.comb += [a_op.eq(Mux(k0 == _Kind.SQ, xsq, xi)),
                         b_op.eq(Mux(k0 == _Kind.SQ, xsq,
                                     Mux(k0 == _Kind.ROPE, c, kk0)))]
            partner = xs[i ^ 1]
            idx = Signal(signed(32 - SIG_STEP_SHIFT + 1), name=f"sidx{i}")
            m.d.comb += idx.eq(xi >> SIG_STEP_SHIFT)
            clip_lo = idx < -half
            clip_hi = idx >= half
            ia = Signal(range(2 * half + 1), name=f"ia{i}")
            m.d.comb += ia.eq(Mux(clip_lo, 0, Mux(clip_hi, 2 * half, idx + half)))
            rom = memory.Memory(shape=unsigned(SIG_FRAC + 1), depth=2 * half + 1,
                                init=[int(v) for v in sig])
            m.submodules[f"sig{i}"] = rom
            ra = rom.read_port()
            rb = rom.read_port()
            m.d.comb += [ra.addr.eq(ia), rb.addr.eq(Mux(ia == 2 * half, ia, ia + 1)),
                         ra.en.eq(en), rb.en.eq(en)]
            sig_a.append(ra.data)
            sig_b.append(rb.data)
            with m.If(en):
                m.d.sync += [p1[i].eq(a_op * b_op), p2[i].eq(partner * s_), x1[i].eq(xi),
                             b1[i].eq(bs[i]),
                             f1[i].eq(Mux(clip_lo | clip_hi, 0,
                                          xi[:SIG_STEP_SHIFT]))]

        # --- S2: reductions, rounding ----------------------------------------------------------
        v2, last2 = Signal(), Signal()
        k2 = Signal(_Kind)
        res2 = [Signal(32, name=f"res2_{i}") for i in range(L)]
        y2 = [Signal(signed(34), name=f"y2_{i}") for i in range(L)]
        s2 = [Signal(SIG_FRAC + 1, name=f"s2_{i}") for i in range(L)]
        x2 = [Signal(signed(32), name=f"x2_{i}") for i in range(L)]
        b2 = [Signal(32, name=f"b2_{i}") for i in range(L)]
        with m.If(en):
            m.d.sync += [v2.eq(v1), k2.eq(k1), last2.eq(last1)]
        sq_terms = []
        abs_terms = []
        for i in range(L):
            rounded = gemm_round_shift(m, p1[i], sh1, 62)
            rope_sum = Signal(signed(63), name=f"rsum{i}")
            m.d.comb += rope_sum.eq(p1[i] + p2[i] if i % 2 else p1[i] - p2[i])
            rope_r = _sat(m, gemm_round_shift(m, rope_sum, Const(ROPE.frac, 6), 63), 32,
                          f"rope{i}")
            addv = _sat(m, x1[i] + b1[i].as_signed(), 32, f"add{i}")
            q8 = _sat(m, rounded, XQ.width, f"q8_{i}")
            diff = Signal(signed(SIG_FRAC + 2), name=f"sdiff{i}")
            m.d.comb += diff.eq(sig_b[i] - sig_a[i])
            interp = Signal(SIG_FRAC + 1, name=f"interp{i}")
            m.d.comb += interp.eq(sig_a[i] + ((diff * f1[i]) >> SIG_STEP_SHIFT))
            sq_terms.append(p1[i])
            ax = Signal(32, name=f"abs{i}")
            m.d.comb += ax.eq(Mux(x1[i] < 0, -x1[i], x1[i]))
            abs_terms.append(ax)
            with m.If(en):
                m.d.sync += [x2[i].eq(x1[i]), b2[i].eq(b1[i]), s2[i].eq(interp),
                             y2[i].eq(rounded)]
                with m.Switch(k1):
                    with m.Case(_Kind.ADD):
                        m.d.sync += res2[i].eq(addv)
                    with m.Case(_Kind.ROPE):
                        m.d.sync += res2[i].eq(rope_r)
                    with m.Case(_Kind.REQ):
                        m.d.sync += res2[i].eq(q8)
                    with m.Default():
                        m.d.sync += res2[i].eq(x1[i])
        # pass-1 reductions straight into the token accumulators
        sq_sum = Signal(SS_BITS)
        m.d.comb += sq_sum.eq(sum(sq_terms))
        lane_max = abs_terms[0]
        for t_ in abs_terms[1:]:
            lane_max = Mux(t_ > lane_max, t_, lane_max)
        with m.If(en & v1):
            with m.If(k1 == _Kind.SQ):
                m.d.sync += [ss.eq(ss + sq_sum), p1_seen.eq(p1_seen + 1)]
            with m.If(k1 == _Kind.MAX):
                m.d.sync += [amax.eq(Mux(lane_max > amax, lane_max, amax)),
                             p1_seen.eq(p1_seen + 1)]

        # --- S3: second product (γ or sigmoid) -------------------------------------------------
        v3, last3 = Signal(), Signal()
        k3 = Signal(_Kind)
        p3 = [Signal(signed(53), name=f"p3_{i}") for i in range(L)]
        res3 = [Signal(32, name=f"res3_{i}") for i in range(L)]
        b3 = [Signal(32, name=f"b3_{i}") for i in range(L)]
        with m.If(en):
            m.d.sync += [v3.eq(v2), k3.eq(k2), last3.eq(last2)]
            for i in range(L):
                a3 = Mux(k2 == _Kind.NORM, y2[i], x2[i])
                g3 = Mux(k2 == _Kind.NORM, b2[i][:GAMMA.width].as_signed(), s2[i])
                m.d.sync += [p3[i].eq(a3 * g3), res3[i].eq(res2[i]), b3[i].eq(b2[i])]

        # --- S4: round, saturate ----------------------------------------------------------------
        v4, last4 = Signal(), Signal()
        k4 = Signal(_Kind)
        res4 = [Signal(32, name=f"res4_{i}") for i in range(L)]
        b4 = [Signal(32, name=f"b4_{i}") for i in range(L)]
        sh3 = Signal(6)
        m.d.comb += sh3.eq(Mux(k3 == _Kind.NORM, GAMMA.frac, SIG_FRAC))
        with m.If(en):
            m.d.sync += [v4.eq(v3), k4.eq(k3), last4.eq(last3)]
            for i in range(L):
                r = _sat(m, gemm_round_shift(m, p3[i], sh3, 53), 32, f"r4_{i}")
                m.d.sync += [res4[i].eq(Mux((k3 == _Kind.NORM) | (k3 == _Kind.SILU), r,
                                            res3[i])), b4[i].eq(b3[i])]

        # --- S5: silu · up ----------------------------------------------------------------------
        v5, last5 = Signal(), Signal()
        k5 = Signal(_Kind)
        p5 = [Signal(signed(64), name=f"p5_{i}") for i in range(L)]
        res5 = [Signal(32, name=f"res5_{i}") for i in range(L)]
        with m.If(en):
            m.d.sync += [v5.eq(v4), k5.eq(k4), last5.eq(last4)]
            for i in range(L):
                m.d.sync += [p5[i].eq(res4[i].as_signed() * b4[i].as_signed()),
                             res5[i].eq(res4[i])]

        # --- S6: round, saturate, output -------------------------------------------------------
        outs = []
        for i in range(L):
            r6 = _sat(m, gemm_round_shift(m, p5[i], Const(ACT_FRAC, 6), 64), 32, f"r6_{i}")
            outs.append(Mux(k5 == _Kind.SILU, r6, res5[i])[:32])
        # REQUANT codes are packed densely: PACK code beats of lanes·8 bits per output beat
        codes = Cat(*[res5[i][:XQ.width] for i in range(L)])
        pack = Signal(L * 32)
        pk = Signal(range(PACK))
        packed = Signal(L * 32)
        m.d.comb += packed.eq(pack)
        m.d.comb += packed.word_select(pk, L * XQ.width).eq(codes)
        with m.If(en & v5):
            with m.If(k5 == _Kind.REQ):
                with m.If((pk == PACK - 1) | last5):
                    m.d.sync += [self.o.valid.eq(1), self.o.payload.last.eq(0),
                                 self.o.payload.data.eq(packed), pack.eq(0), pk.eq(0)]
                with m.Else():
                    m.d.sync += [pack.eq(packed), pk.eq(pk + 1)]
            with m.Elif((k5 != _Kind.SQ) & (k5 != _Kind.MAX)):
                m.d.sync += [self.o.valid.eq(1), self.o.payload.last.eq(last5),
                             self.o.payload.data.eq(Cat(*outs))]
                with m.If(last5):
                    m.d.sync += st.tokens.eq(st.tokens + 1)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += st.beats_out.eq(st.beats_out + 1)
        a_in = self.a.valid & self.a.ready
        b_in = self.b.valid & self.b.ready
        m.d.sync += st.beats_in.eq(st.beats_in + a_in + b_in)
        return m

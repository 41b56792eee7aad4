"""Datapath of the vector unit (paper §5 compute engine): the six pipeline stages behind the
token control of :mod:`.vector_ctrl` — products and sigmoid table (S1), reductions and rounding
(S2), the γ or sigmoid product (S3), its rounding (S4), the SiLU · up product (S5), the final
rounding and the output register with the dense INT8 packing of REQUANT (S6). Arithmetic of
:mod:`mcf.golden.vector` bit for bit, formats of :mod:`mcf.abi.quant`.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.quant import (
    ACT,
    ACT_FRAC,
    GAMMA,
    NORM_IN_SHIFT,
    ROPE,
    RSQRT_MANT_BITS,
    SIG_FRAC,
    SIG_INDEX_BITS,
    SIG_STEP_SHIFT,
    XQ,
    sigmoid_lut,
)

from .gemm_requant import gemm_round_shift

__all__ = ["SS_BITS", "VectorBack", "VectorFront", "VectorKind", "vector_acc_layout",
           "vector_issue_layout", "vector_mid_layout", "vector_out_layout"]

SS_BITS = 72
"""Width of the RMSNorm sum-of-squares accumulator."""
PACK = ACT.width // XQ.width        # INT8 codes of PACK code beats share one output beat


class VectorKind(enum.Enum, shape=3):
    """What a beat in the pipeline is: the op of a streaming beat or the pass it belongs to."""
    ADD = 0
    SILU = 1
    ROPE = 2
    SQ = 3       # RMSNorm pass 1: sum of squares (no output)
    MAX = 4      # requant, ABSMAX pass 1: lane maxima (no output)
    NORM = 5     # RMSNorm pass 2
    REQ = 6      # requant pass 2
    SCALE = 7    # requant scale word


def vector_out_layout(lanes: int) -> data.StructLayout:
    return data.StructLayout({"data": unsigned(lanes * ACT.width), "last": unsigned(1)})


def vector_issue_layout(lanes: int) -> data.StructLayout:
    """S0, the issued beat: its kind, ``last`` of the token, operands ``x`` (ACT lanes) and
    ``b`` (second operand word), and the token's pass-2 multiplier ``k`` and shift ``sh``.
    ``rx``: the ``a`` beat taken with it (a pass-1 beat's lane maxima come from here);
    ``ride``: a REQ beat whose ``rx`` is a pass-1 beat of the next token (its lane maxima
    reach ``acc`` as a MAX beat's would)."""
    return data.StructLayout({
        "valid": 1, "kind": VectorKind, "last": 1, "ride": 1,
        "x": unsigned(lanes * 32), "b": unsigned(lanes * 32), "rx": unsigned(lanes * 32),
        "k": unsigned(RSQRT_MANT_BITS + 1), "sh": unsigned(6)})


def vector_acc_layout() -> data.StructLayout:
    """Pass-1 contribution of the beat in S1: its sum of squares and the lanes' signed maxima
    of ``x`` and ``~x`` (ABSMAX's lanes, :func:`mcf.abi.tp.absmax_lanes`; the token's absmax is
    ``max(max x, max ~x + 1)``)."""
    return data.StructLayout({"valid": 1, "kind": VectorKind, "sq": unsigned(SS_BITS),
                              "smax": signed(32), "nmax": signed(32)})


def vector_mid_layout(lanes: int) -> data.StructLayout:
    """S2 → S3: the result so far ``res``, the rounded product ``y``, the sigmoid ``s``, the
    operand ``x`` and the second operand ``b``, per lane."""
    return data.StructLayout({
        "valid": 1, "kind": VectorKind, "last": 1,
        "res": data.ArrayLayout(32, lanes), "y": data.ArrayLayout(signed(34), lanes),
        "s": data.ArrayLayout(SIG_FRAC + 1, lanes), "x": data.ArrayLayout(signed(32), lanes),
        "b": data.ArrayLayout(32, lanes)})


def _sat(m, value, width, name):
    out = Signal(signed(width), name=name)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    m.d.comb += out.eq(Mux(value > hi, hi, Mux(value < lo, lo, value)))
    return out


class VectorFront(wiring.Component):
    """Stages S1 and S2 of the vector unit.

    Members
    -------
    en : In(1)
        Pipeline enable (the output register can move); every stage register holds while low.
    s0 : In(vector_issue_layout(lanes))
        The issued beat.
    acc : Out(vector_acc_layout())
        Combinational from the S1 registers: the beat's pass-1 sum of squares and lane maxima
        (for the token accumulators, taken with ``en``; the maxima of ``rx``).
    s2 : Out(vector_mid_layout(lanes))
        The S2 registers.

    Latency: 2 cycles of ``en`` from ``s0`` to ``s2`` (S1: products ``x·k``, ``x·x``, RoPE
    products, two sigmoid table reads; S2: rounding, saturation, the streaming results).
    """

    def __init__(self, lanes: int):
        self.lanes = lanes
        super().__init__({"en": In(1), "s0": In(vector_issue_layout(lanes)),
                          "acc": Out(vector_acc_layout()),
                          "s2": Out(vector_mid_layout(lanes))})

    def elaborate(self, platform):
        m = Module()
        L, en, s0, s2 = self.lanes, self.en, self.s0, self.s2
        # --- S1: products, table reads --------------------------------------------------------
        xs = [s0.x[i * 32:(i + 1) * 32].as_signed() for i in range(L)]
        bs = [s0.b[i * 32:(i + 1) * 32] for i in range(L)]
        sig = sigmoid_lut()
        half = 1 << (SIG_INDEX_BITS - 1)
        s1 = Signal(data.StructLayout({
            "valid": 1, "kind": VectorKind, "last": 1, "sh": 6, "ride": 1,
            "p1": data.ArrayLayout(signed(62), L), "p2": data.ArrayLayout(signed(49), L),
            "x": data.ArrayLayout(signed(32), L), "b": data.ArrayLayout(32, L),
            "rx": data.ArrayLayout(signed(32), L),
            "f": data.ArrayLayout(SIG_STEP_SHIFT, L)}))
        sig_a, sig_b = [], []
        with m.If(en):
            m.d.sync += [s1.valid.eq(s0.valid), s1.kind.eq(s0.kind), s1.last.eq(s0.last),
                         s1.sh.eq(s0.sh), s1.ride.eq(s0.ride), s1.rx.eq(s0.rx)]
        for i in range(L):
            xi = xs[i]
            c = bs[i][:16].as_signed()
            s_ = bs[i][16:].as_signed()
            xsq = (xi >> NORM_IN_SHIFT)
            a_op = Signal(signed(32), name=f"ma{i}")
            b_op = Signal(signed(29), name=f"mb{i}")
            m.d.comb += [a_op.eq(Mux(s0.kind == VectorKind.SQ, xsq, xi)),
                         b_op.eq(Mux(s0.kind == VectorKind.SQ, xsq,
                                     Mux(s0.kind == VectorKind.ROPE, c, s0.k)))]
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
                m.d.sync += [s1.p1[i].eq(a_op * b_op), s1.p2[i].eq(partner * s_),
                             s1.x[i].eq(xi), s1.b[i].eq(bs[i]),
                             s1.f[i].eq(Mux(clip_lo | clip_hi, 0, xi[:SIG_STEP_SHIFT]))]

        # --- S2: reductions, rounding ----------------------------------------------------------
        with m.If(en):
            m.d.sync += [s2.valid.eq(s1.valid), s2.kind.eq(s1.kind), s2.last.eq(s1.last)]
        sq_terms = []
        for i in range(L):
            p1, p2, x1 = s1.p1[i], s1.p2[i], s1.x[i]
            rounded = gemm_round_shift(m, p1, s1.sh, 62)
            rope_sum = Signal(signed(63), name=f"rsum{i}")
            m.d.comb += rope_sum.eq(p1 + p2 if i % 2 else p1 - p2)
            rope_r = _sat(m, gemm_round_shift(m, rope_sum, Const(ROPE.frac, 6), 63), 32,
                          f"rope{i}")
            addv = _sat(m, x1 + s1.b[i].as_signed(), 32, f"add{i}")
            q8 = _sat(m, rounded, XQ.width, f"q8_{i}")
            diff = Signal(signed(SIG_FRAC + 2), name=f"sdiff{i}")
            m.d.comb += diff.eq(sig_b[i] - sig_a[i])
            interp = Signal(SIG_FRAC + 1, name=f"interp{i}")
            m.d.comb += interp.eq(sig_a[i] + ((diff * s1.f[i]) >> SIG_STEP_SHIFT))
            sq_terms.append(p1)
            with m.If(en):
                m.d.sync += [s2.x[i].eq(x1), s2.b[i].eq(s1.b[i]), s2.s[i].eq(interp),
                             s2.y[i].eq(rounded)]
                with m.Switch(s1.kind):
                    with m.Case(VectorKind.ADD):
                        m.d.sync += s2.res[i].eq(addv)
                    with m.Case(VectorKind.ROPE):
                        m.d.sync += s2.res[i].eq(rope_r)
                    with m.Case(VectorKind.REQ):
                        m.d.sync += s2.res[i].eq(q8)
                    with m.Default():
                        m.d.sync += s2.res[i].eq(x1)
        # pass-1 reductions, for the token accumulators
        def tree_max(terms):
            best = terms[0]
            for t_ in terms[1:]:
                best = Mux(t_ > best, t_, best)
            return best

        # the maxima of the a beat taken (a MAX beat's x; a ride beat's next-token beat)
        mx = [s1.rx[i] for i in range(L)]
        m.d.comb += [self.acc.valid.eq(s1.valid),
                     self.acc.kind.eq(Mux(s1.ride, VectorKind.MAX, s1.kind)),
                     self.acc.sq.eq(sum(sq_terms)),
                     self.acc.smax.eq(tree_max(mx)),
                     self.acc.nmax.eq(tree_max([~v for v in mx]))]
        return m


class VectorBack(wiring.Component):
    """Stages S3 to S6 of the vector unit and its output register.

    Members
    -------
    en : In(1)
        Pipeline enable (``~o.valid | o.ready``, computed by the owner from ``o``).
    s2 : In(vector_mid_layout(lanes))
        The S2 registers of :class:`VectorFront`.
    o : Out(stream.Signature(vector_out_layout(lanes)))
        The result beats (S6 is the output register; ``valid`` drops after a transfer unless
        a new beat is loaded). REQUANT's INT8 codes are packed densely, ``ACT.width /
        XQ.width`` code beats per output beat, the token's last one flushing a partial beat.
    token_done : Out(1)
        One-cycle strobe when a token's ``last`` beat is loaded into the output register (the
        REQUANT scale beat is the last of its token).

    Latency: 4 cycles of ``en`` from ``s2`` to ``o`` (S3: γ or sigmoid product; S4: rounding
    and saturation; S5: SiLU · up product; S6: rounding, packing, output register).
    """

    def __init__(self, lanes: int):
        self.lanes = lanes
        super().__init__({"en": In(1), "s2": In(vector_mid_layout(lanes)),
                          "o": Out(stream.Signature(vector_out_layout(lanes))),
                          "token_done": Out(1)})

    def elaborate(self, platform):
        m = Module()
        L, en, s2 = self.lanes, self.en, self.s2

        def stage(fields):
            return Signal(data.StructLayout({"valid": 1, "kind": VectorKind, "last": 1}
                                            | {n: data.ArrayLayout(w, L) for n, w in fields}))

        def advance(dst, src):
            m.d.sync += [dst.valid.eq(src.valid), dst.kind.eq(src.kind), dst.last.eq(src.last)]

        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)

        # --- S3: second product (γ or sigmoid) -------------------------------------------------
        s3 = stage((("p", signed(53)), ("res", 32), ("b", 32)))
        with m.If(en):
            advance(s3, s2)
            for i in range(L):
                a3 = Mux(s2.kind == VectorKind.NORM, s2.y[i], s2.x[i])
                g3 = Mux(s2.kind == VectorKind.NORM, s2.b[i][:GAMMA.width].as_signed(), s2.s[i])
                m.d.sync += [s3.p[i].eq(a3 * g3), s3.res[i].eq(s2.res[i]), s3.b[i].eq(s2.b[i])]

        # --- S4: round, saturate ----------------------------------------------------------------
        s4 = stage((("res", 32), ("b", 32)))
        sh3 = Signal(6)
        m.d.comb += sh3.eq(Mux(s3.kind == VectorKind.NORM, GAMMA.frac, SIG_FRAC))
        with m.If(en):
            advance(s4, s3)
            for i in range(L):
                r = _sat(m, gemm_round_shift(m, s3.p[i], sh3, 53), 32, f"r4_{i}")
                m.d.sync += [s4.res[i].eq(Mux((s3.kind == VectorKind.NORM)
                                              | (s3.kind == VectorKind.SILU), r, s3.res[i])),
                             s4.b[i].eq(s3.b[i])]

        # --- S5: silu · up ----------------------------------------------------------------------
        s5 = stage((("p", signed(64)), ("res", 32)))
        with m.If(en):
            advance(s5, s4)
            for i in range(L):
                m.d.sync += [s5.p[i].eq(s4.res[i].as_signed() * s4.b[i].as_signed()),
                             s5.res[i].eq(s4.res[i])]

        # --- S6: round, saturate, output -------------------------------------------------------
        outs = []
        for i in range(L):
            r6 = _sat(m, gemm_round_shift(m, s5.p[i], Const(ACT_FRAC, 6), 64), 32, f"r6_{i}")
            outs.append(Mux(s5.kind == VectorKind.SILU, r6, s5.res[i])[:32])
        # REQUANT codes are packed densely: PACK code beats of lanes·8 bits per output beat
        codes = Cat(*[s5.res[i][:XQ.width] for i in range(L)])
        pack = Signal(L * 32)
        pk = Signal(range(PACK))
        packed = Signal(L * 32)
        m.d.comb += packed.eq(pack)
        m.d.comb += packed.word_select(pk, L * XQ.width).eq(codes)
        with m.If(en & s5.valid):
            with m.If(s5.kind == VectorKind.REQ):
                with m.If((pk == PACK - 1) | s5.last):
                    m.d.sync += [self.o.valid.eq(1), self.o.payload.last.eq(0),
                                 self.o.payload.data.eq(packed), pack.eq(0), pk.eq(0)]
                with m.Else():
                    m.d.sync += [pack.eq(packed), pk.eq(pk + 1)]
            with m.Elif((s5.kind != VectorKind.SQ) & (s5.kind != VectorKind.MAX)):
                m.d.sync += [self.o.valid.eq(1), self.o.payload.last.eq(s5.last),
                             self.o.payload.data.eq(Cat(*outs))]
                m.d.comb += self.token_done.eq(s5.last)
        return m

"""The GEMM engine's output requantiser: an accumulator times the token scale, rounded and
saturated to ACT, plus the bias, packed into output beats (paper §5 compute engine, the
dequantising epilogue; arithmetic :func:`mcf.golden.gemm.gemm` bit for bit).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.quant import ACC_BITS, ACT, SCALE_EXP_BITS, SCALE_MANT_BITS, SHIFT_MAX

__all__ = ["GEMM_ELEMENT", "GemmRequant", "gemm_round_shift"]

GEMM_ELEMENT = data.StructLayout({
    "acc": signed(ACC_BITS),                # the element's accumulator
    "x_m": unsigned(SCALE_MANT_BITS),       # the token's scale mantissa
    "shift": signed(SCALE_EXP_BITS + 3),    # −(w_exp + x_e + ACT_FRAC), clamped here
    "bias": signed(ACT.width),              # the output row's bias (ACT)
    "raw": unsigned(1),                     # acc_out: send ``lane`` instead of the result
    "lane": signed(32),                     # acc_out: the accumulator lane sent
})
"""One output element on its way into :class:`GemmRequant`."""


def gemm_round_shift(m: Module, value, shift, width: int):
    """Comb ``round_half_even(value, shift)`` for a signed ``value`` of ``width`` bits and a
    variable ``shift`` (exact for every shift, ``0`` past the value's width).

    One barrel shift of ``value`` with a zero below it: the shifted word's low bit is the
    rounding bit, the rest the truncated quotient; the bits shifted out below the rounding
    bit are ORed through a thermometer mask (``~(ones << shift)``, no subtractor)."""
    v2 = Signal(signed(width + 1), name="rs_v2")
    sh = Signal(signed(width + 1), name="rs_sh")
    mask = Signal(width + 1, name="rs_mask")
    sticky = Signal(name="rs_sticky")
    out = Signal(signed(width + 1), name="rs_out")
    m.d.comb += [
        v2.eq(Cat(Const(0, 1), value).as_signed()),
        sh.eq(v2 >> shift),
        mask.eq(~(Const((1 << (width + 1)) - 1, width + 1) << shift)),
        sticky.eq((v2.as_unsigned() & mask).any()),
        out.eq(sh[1:].as_signed() + (sh[0] & (sticky | sh[1]))),
    ]
    return out


def _sat(m: Module, value, width: int, name: str):
    out = Signal(signed(width), name=name)
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    m.d.comb += out.eq(Mux(value > hi, hi, Mux(value < lo, lo, value)))
    return out


class GemmRequant(wiring.Component):
    """``y = sat(sat(round_half_even(acc · x_m, shift)) + bias)`` per element (or the raw
    ``lane``), packed ``beat / 32`` elements per output beat, the first in the low bits.

    Members
    -------
    i : In(stream.Signature(:data:`GEMM_ELEMENT`))
        Elements in output order. ``ready`` is ``~o.valid | o.ready``: the pipeline moves
        whenever the output register is free or being emptied (it does not depend on ``valid``).
    o : Out(stream.Signature(unsigned(beat)))
        Packed ACT results (or acc_out lanes), 32-bit little-endian lanes.

    Latency: an element taken in cycle ``t`` is in E1 (product, clamped shift) at ``t + 1``,
    in E2 (rounded, saturated, with its bias) at ``t + 2``, and in the packing register at
    ``t + 3`` — when it completes a beat, that beat is valid on ``o`` at ``t + 3``. The
    pipeline moves only while ``ready``; one element per cycle.
    """

    def __init__(self, beat: int):
        if beat % 32:
            raise ValueError("the beat must be a multiple of 32 bits")
        self.beat = beat
        super().__init__({
            "i": In(stream.Signature(GEMM_ELEMENT)),
            "o": Out(stream.Signature(unsigned(beat))),
        })

    def elaborate(self, platform):
        m = Module()
        B = self.beat
        tpb = B // 32
        e = self.i.payload
        ee = self.i.ready
        m.d.comb += ee.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        # E1: product and clamped shift
        p1 = Signal(signed(ACC_BITS + SCALE_MANT_BITS + 1))
        sh1 = Signal(range(SHIFT_MAX + 1))
        bias1 = Signal(signed(32))
        lane1 = Signal(signed(32))                  # acc_out: the lane sent instead
        raw1 = Signal()
        v1 = Signal()
        with m.If(ee):
            m.d.sync += v1.eq(self.i.valid)
            with m.If(self.i.valid):
                m.d.sync += [
                    p1.eq(e.acc * e.x_m),
                    sh1.eq(Mux(e.shift < 0, 0, Mux(e.shift > SHIFT_MAX, SHIFT_MAX, e.shift))),
                    bias1.eq(e.bias), raw1.eq(e.raw), lane1.eq(e.lane)]
        # E2: round and saturate; then bias, saturate, pack
        rounded = gemm_round_shift(m, p1, sh1, len(p1))
        y1 = _sat(m, rounded, ACT.width, "y1")
        y2 = Signal(signed(32))
        b2 = Signal(signed(32))
        v2 = Signal()
        with m.If(ee):
            m.d.sync += [y2.eq(Mux(raw1, lane1, y1)), b2.eq(Mux(raw1, 0, bias1)), v2.eq(v1)]
        ysum = Signal(signed(34))
        m.d.comb += ysum.eq(y2 + b2)
        y3 = _sat(m, ysum, ACT.width, "y3")
        pack = Signal(B)
        pidx = Signal(range(tpb))
        with m.If(ee & v2):
            m.d.sync += [pack.eq(Cat(pack[32:], y3)), pidx.eq(pidx + 1)]
            with m.If(pidx == tpb - 1):
                m.d.sync += [pidx.eq(0), self.o.valid.eq(1),
                             self.o.payload.eq(Cat(pack[32:], y3))]
        return m


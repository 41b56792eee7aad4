"""One UltraScale+ DSP48E2 slice as a multiply-add cascade stage, ``P = (D + A)·B + PCIN``
(UG579), either instantiated (the ``kr260`` bitstream) or modelled register for register (the
``sim`` configuration, Verilator and ``amaranth.sim``).

Why instantiate: yosys 0.70's ``xilinx_dsp`` packs post-adders and cascades into DSP48E1 only
(``-family xc7``); for ``xcu``/``xcup`` it leaves every adder after a multiplier in LUTs and
carry chains, so a behavioural lane sum costs ~500 LUTs per 16-lane row pair in the estimate
and in the netlist yosys would hand on. The instance puts the lane sum into the DSP column's
``PCOUT → PCIN`` cascade by construction, for the estimate and for Vivado alike; yosys checks
its port and parameter names against its ``DSP48E2`` cell library.

The slice's configuration (UG579 "DSP48E2 attributes", tables 2-7, 2-9, 2-10):

* ``AREG = BREG = DREG = 1`` (A2, B2, D registers), ``ACASCREG = BCASCREG = 1``, ``ADREG = 0``
  (pre-adder output straight into the multiplier), ``MREG = 1``, ``PREG = 1``; ``CREG``,
  ``INMODEREG``, ``OPMODEREG``, ``ALUMODEREG``, ``CARRYIN*REG`` = 0 (static control).
* ``INMODE = 0b00100``: A2 and B2 selected, D enabled, pre-adder ``D + A``;
  ``AMULTSEL = "AD"``, ``BMULTSEL = "B"``, ``PREADDINSEL = "A"``.
* ``OPMODE`` = W 00 (0) — or, for an accumulating slice, W 0·``acc`` (0 or P, the slice's own
  sum: ``P ← M + PCIN + P``), Z 001 (``PCIN``) or 000 (0, the first slice of a chain), Y 01 /
  X 01 (the multiplier's two partial products), ``ALUMODE = 0000`` (``Z + W + X + Y + CIN``),
  ``CARRYIN = 0``; ``USE_MULT = "MULTIPLY"``, ``USE_SIMD = "ONE48"``, no pattern detector.

Arithmetic (both forms): the pre-adder adds the low 27 bits of A and D into 27 bits (two's
complement wrap), the 27 × 18 signed multiplier gives 45 bits, the 48-bit post-adder wraps.
Callers keep their values inside these widths (the GEMM's packed row pairs need 24 bits).
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.hdl import ClockSignal, Const, Instance
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["Dsp48MulAdd", "PREADD_BITS", "MULT_B_BITS", "P_BITS"]

PREADD_BITS = 27          # A/D pre-adder width
MULT_B_BITS = 18          # multiplier B input
P_BITS = 48               # post-adder / P / PCIN / PCOUT

_INMODE = 0b00100
_OPMODE_M = 0b00_000_01_01        # W=0, Z=0, Y=M, X=M
_OPMODE_M_PCIN = 0b00_001_01_01   # W=0, Z=PCIN, Y=M, X=M


class Dsp48MulAdd(wiring.Component):
    """``P ← (D + A)·B (+ PCIN) (+ P)``, three register stages (input, product, sum).

    Members
    -------
    ce : In(1)
        Clock enable of every register (the pipeline's stall).
    a, d : In(signed(27))
        Pre-adder inputs.
    b : In(signed(18))
        Multiplier input.
    pcin : In(signed(48))
        The previous slice's ``pcout`` (``cascade=True`` only; must be another
        :class:`Dsp48MulAdd`'s ``pcout`` — the dedicated cascade route).
    pcout : Out(signed(48))
        The P register; to the next slice's ``pcin`` or, at a chain's end, to the fabric.
    acc, ce_p : In(1) — ``accumulate=True`` only
        ``acc``: add the P register's own value (the W multiplexer selects P) in this cycle's
        sum; ``ce_p``: clock enable of the P register alone (``ce`` still clocks the input and
        product registers), so P accumulates only the steps it is enabled for.

    Latency: 3 cycles (of ``ce``) from ``a``/``d``/``b`` to ``pcout``; ``pcin`` is added in
    the last stage, so a chain whose slice ``j`` takes its inputs ``j`` cycles late sums all
    slices' products ``3 + n − 1`` cycles after slice 0's inputs.

    ``primitive=True`` elaborates to ``Instance("DSP48E2")`` (synthesis only: simulators here
    have no DSP48E2 model); ``False`` to the same three registers in fabric logic.
    """

    def __init__(self, *, cascade: bool, primitive: bool, accumulate: bool = False):
        self.cascade, self.primitive, self.accumulate = cascade, primitive, accumulate
        super().__init__({
            "ce": In(1), "acc": In(1), "ce_p": In(1),
            "a": In(signed(PREADD_BITS)), "d": In(signed(PREADD_BITS)),
            "b": In(signed(MULT_B_BITS)),
            "pcin": In(signed(P_BITS)),
            "pcout": Out(signed(P_BITS)),
        })

    def elaborate(self, platform):
        m = Module()
        if self.primitive:
            a30 = Signal(signed(30))                # A[29:0]; the multiplier uses A[26:0]
            m.d.comb += a30.eq(self.a)
            m.submodules.dsp = self._instance(a30)
            return m
        a2, d2 = Signal(signed(PREADD_BITS)), Signal(signed(PREADD_BITS))
        b2 = Signal(signed(MULT_B_BITS))
        ad = Signal(signed(PREADD_BITS))
        mreg = Signal(signed(PREADD_BITS + MULT_B_BITS))
        ce_p = self.ce_p if self.accumulate else self.ce
        own = Mux(self.acc, self.pcout, 0) if self.accumulate else 0
        with m.If(self.ce):
            m.d.sync += [a2.eq(self.a), d2.eq(self.d), b2.eq(self.b), mreg.eq(ad * b2)]
        with m.If(ce_p):
            m.d.sync += self.pcout.eq(mreg + (self.pcin if self.cascade else 0) + own)
        m.d.comb += ad.eq(d2 + a2)      # 27-bit wrap, as the pre-adder
        return m

    def _instance(self, a30) -> Instance:
        zero = Const(0, 1)
        opmode = _OPMODE_M_PCIN if self.cascade else _OPMODE_M
        if self.accumulate:     # W[0] (OPMODE[7]) = acc: W selects P or 0
            opmode = Cat(Const(opmode, 7), self.acc, Const(0, 1))
        else:
            opmode = Const(opmode, 9)
        return Instance(
            "DSP48E2",
            p_AREG=1, p_BREG=1, p_DREG=1, p_ACASCREG=1, p_BCASCREG=1, p_ADREG=0, p_MREG=1,
            p_PREG=1, p_CREG=0, p_INMODEREG=0, p_OPMODEREG=0, p_ALUMODEREG=0,
            p_CARRYINREG=0, p_CARRYINSELREG=0,
            p_A_INPUT="DIRECT", p_B_INPUT="DIRECT", p_AMULTSEL="AD", p_BMULTSEL="B",
            p_PREADDINSEL="A", p_USE_MULT="MULTIPLY", p_USE_SIMD="ONE48",
            p_USE_PATTERN_DETECT="NO_PATDET",
            i_CLK=ClockSignal(),
            i_A=a30, i_D=self.d, i_B=self.b, i_C=Const(0, P_BITS),
            i_PCIN=self.pcin if self.cascade else Const(0, P_BITS),
            i_ACIN=Const(0, 30), i_BCIN=Const(0, MULT_B_BITS),
            i_CARRYCASCIN=zero, i_MULTSIGNIN=zero, i_CARRYIN=zero,
            i_INMODE=Const(_INMODE, 5),
            i_OPMODE=opmode,
            i_ALUMODE=Const(0, 4), i_CARRYINSEL=Const(0, 3),
            i_CEA1=self.ce, i_CEA2=self.ce, i_CEB1=self.ce, i_CEB2=self.ce, i_CED=self.ce,
            i_CEM=self.ce, i_CEP=self.ce_p if self.accumulate else self.ce,
            i_CEAD=zero, i_CEC=zero, i_CECTRL=zero, i_CEINMODE=zero, i_CEALUMODE=zero,
            i_CECARRYIN=zero,
            i_RSTA=zero, i_RSTB=zero, i_RSTC=zero, i_RSTD=zero, i_RSTM=zero, i_RSTP=zero,
            i_RSTCTRL=zero, i_RSTINMODE=zero, i_RSTALUMODE=zero, i_RSTALLCARRYIN=zero,
            o_PCOUT=self.pcout,
        )

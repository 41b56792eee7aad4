"""The packed DSP48E2 cascades the tiled prefill's two arrays share (issue #33): S = QKᵀ in
:class:`~.tile_score.TileScore` (a key pair per cascade, the query on B) and P·V in
:class:`~.tile_pv.TilePV` (a channel pair per cascade, ``w8`` on B) — one component, so the
arrays' packing, skew and accumulation are built once.
"""

from __future__ import annotations

from amaranth import Module, Shape, Signal, Value, signed
from amaranth.hdl import ShapeCastable
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from .dsp48 import P_BITS, Dsp48MulAdd

__all__ = ["PackedCascades"]


class PackedCascades(wiring.Component):
    """``pairs`` cascades of ``lanes`` :class:`~.dsp48.Dsp48MulAdd` slices, two operands per
    slice: slice ``j`` of cascade ``p`` computes ``(a[j][2p+1]·2^shift + a[j][2p])·b[j]`` (the
    GEMM arrays' packing: ``A = a[2p+1]·2^shift``, ``D = a[2p]``, ``B = b``) and the cascade sums
    its slices through ``PCOUT → PCIN``; the last slice accumulates the packed sums of the steps
    ``ce_p`` enables (``P ← M + PCIN + P`` when ``acc``, ``P ← M + PCIN`` otherwise). Lane ``j``'s
    inputs pass ``j`` skew registers (flip-flops: ``keep``, ``shreg_extract = "no"``), the form of
    ``GemmArray``'s chains. The callers split ``sums`` into the two exact halves.

    Members
    -------
    ce : In(1)
        Clock enable of every register (skew, slices): the pipeline's stall.
    a : In(data.ArrayLayout(data.ArrayLayout(a_shape, 2·pairs), lanes))
        Per lane the ``2·pairs`` operands of its slices (``a_shape``: signed, ≤ the pre-adder).
    b : In(data.ArrayLayout(b_shape, lanes))
        Per lane the multiplier operand (``b_shape`` signed, or unsigned: zero-extended).
    ce_p, acc : In(1)
        The last slices' P enable and accumulate flag, applied in cycle ``t0 + lanes + 1`` for
        the step whose ``a``, ``b`` are on the ports in cycle ``t0``; ``ce_p`` alone clocks P
        (not gated by ``ce``: a stalled cycle needs ``ce_p`` low).
    sums : Out(data.ArrayLayout(signed(48), pairs))
        The last slices' P registers (``pcout``): a step's packed sum (added to P when
        ``acc``) from cycle ``t0 + lanes + 2``.

    Latency: ``lanes + 2`` cycles (of ``ce``) from a step's inputs to its sum in ``sums``; one
    step per cycle. ``dsp = "primitive"``: DSP48E2 instances; ``"model"``: the slices' registers
    in fabric logic (simulation).
    """

    def __init__(self, *, lanes: int, pairs: int, a_shape: ShapeCastable, b_shape: ShapeCastable,
                 shift: int, dsp: str = "model"):
        if dsp not in ("model", "primitive"):
            raise ValueError("dsp must be 'model' or 'primitive'")
        self.lanes, self.pairs, self.shift, self.dsp = lanes, pairs, shift, dsp
        self.a_shape, self.b_shape = a_shape, b_shape
        super().__init__({
            "ce": In(1), "ce_p": In(1), "acc": In(1),
            "a": In(data.ArrayLayout(data.ArrayLayout(a_shape, 2 * pairs), lanes)),
            "b": In(data.ArrayLayout(b_shape, lanes)),
            "sums": Out(data.ArrayLayout(signed(P_BITS), pairs)),
        })

    def elaborate(self, platform):
        m = Module()
        L = self.lanes
        alay = data.ArrayLayout(self.a_shape, 2 * self.pairs)
        bsigned = Shape.cast(self.b_shape).signed
        ff = {"keep": 1, "shreg_extract": "no"}
        lanes = []
        for j in range(L):
            av, bv = Value.cast(self.a[j]), Value.cast(self.b[j])
            for dly in range(j):
                ad = Signal(len(av), name=f"askew{j}_{dly}", reset_less=True, attrs=ff)
                bd = Signal(len(bv), name=f"bskew{j}_{dly}", reset_less=True, attrs=ff)
                with m.If(self.ce):
                    m.d.sync += [ad.eq(av), bd.eq(bv)]
                av, bv = ad, bd
            lanes.append((alay(av), bv.as_signed() if bsigned else bv))
        for p in range(self.pairs):
            prev = None
            for j, (aj, bj) in enumerate(lanes):
                last = j == L - 1
                sl = Dsp48MulAdd(cascade=prev is not None, primitive=self.dsp == "primitive",
                                 accumulate=last)
                m.submodules[f"dsp{p}_{j}"] = sl
                m.d.comb += [sl.ce.eq(self.ce), sl.a.eq(aj[2 * p + 1] << self.shift),
                             sl.d.eq(aj[2 * p]), sl.b.eq(bj)]
                if prev is not None:
                    m.d.comb += sl.pcin.eq(prev.pcout)
                if last:
                    m.d.comb += [sl.ce_p.eq(self.ce_p), sl.acc.eq(self.acc)]
                prev = sl
            m.d.comb += self.sums[p].eq(prev.pcout)
        return m

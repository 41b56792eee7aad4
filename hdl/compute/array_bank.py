"""The GEMM's token-parallel arrays as one unit (paper §5 compute engine; docs/node.md §11,
docs/attention.md "The arrays' attention products"): ``arrays`` copies of :class:`GemmArray` in
lockstep on one weight word, each with its own activations — the form the kr260's four 16 × 16
arrays take, driven here by a client that issues whole steps (prefill attention's
:class:`~.array_score.ArrayScore`)."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.quant import GROUP_SIZE, SCALE_MANT_BITS, WEIGHT, XQ

from .gemm_array import GemmArray, result_layout

__all__ = ["ArrayBank", "bank_step_layout", "bank_result_layout"]


def bank_step_layout(arrays: int, rows: int, lanes: int) -> data.StructLayout:
    """One k-step of all arrays: the shared ``rows × lanes`` weight word (``w``, row r, lane l at
    nibble r·lanes + l), each array's ``lanes`` activations (``a[i]``), the shared scale
    mantissas and flags of :func:`~.gemm_array.step_layout`."""
    return data.StructLayout({
        "w": data.ArrayLayout(WEIGHT.width, rows * lanes),
        "a": data.ArrayLayout(lanes * XQ.width, arrays),
        "scale": data.ArrayLayout(SCALE_MANT_BITS, rows),
        "glast": 1,
        "last": 1,
        "ua": 1,
    })


def bank_result_layout(arrays: int, rows: int) -> data.ArrayLayout:
    """One dot product's ``rows`` 48-bit accumulators of every array (``[i][r]``)."""
    return data.ArrayLayout(result_layout(rows), arrays)


class ArrayBank(wiring.Component):
    """``arrays`` :class:`GemmArray` (``rows × lanes``, ``group``, ``chain``, ``dsp``) taking the
    same step in the same cycle, array ``i`` on activations ``a[i]``.

    Members
    -------
    i : In(stream.Signature(bank_step_layout(arrays, rows, lanes)))
        Steps, taken by all arrays together (the arrays' rules: ``glast``/``last``, group ends
        ``rows / scalers`` moving cycles apart, ``ua``).
    o : Out(stream.Signature(bank_result_layout(arrays, rows)))
        Every array's accumulators of a dot product, in step order.

    Latency: :class:`GemmArray`'s (``latency``) from a ``last`` step to its result. Throughput:
    one step per cycle; the arrays stall together while a result waits on ``o.ready``.
    """

    def __init__(self, arrays: int = 4, rows: int = 16, lanes: int = 16,
                 group: int = GROUP_SIZE, chain: int = 1, dsp: str = "fabric"):
        self.n_arrays, self.rows, self.lanes = arrays, rows, lanes
        self.arrays = [GemmArray(rows, lanes, group, chain, dsp) for _ in range(arrays)]
        self.latency = self.arrays[0].latency
        super().__init__({
            "i": In(stream.Signature(bank_step_layout(arrays, rows, lanes))),
            "o": Out(stream.Signature(bank_result_layout(arrays, rows))),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.i.payload
        for n, arr in enumerate(self.arrays):
            m.submodules[f"array{n}"] = arr
            m.d.comb += [arr.i.valid.eq(self.i.valid), arr.i.payload.w.eq(p.w),
                         arr.i.payload.a.eq(p.a[n]), arr.i.payload.scale.eq(p.scale),
                         arr.i.payload.glast.eq(p.glast), arr.i.payload.last.eq(p.last),
                         arr.i.payload.ua.eq(p.ua),
                         arr.o.ready.eq(self.o.ready),
                         self.o.payload[n].eq(arr.o.payload)]
        # identical inputs and ready: the arrays' i.ready and o.valid move together
        m.d.comb += [self.i.ready.eq(self.arrays[0].i.ready),
                     self.o.valid.eq(self.arrays[0].o.valid)]
        return m

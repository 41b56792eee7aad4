"""Sequential integer helpers of the vector unit (paper §5 compute engine): a restoring divider
and a digit-by-digit integer square root, one result bit per cycle, both exact (floor) — the
RMSNorm reciprocal square root and the requantisation reciprocal of :mod:`mcf.abi.quant`."""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["VectorDivider", "VectorSqrt"]


class VectorDivider(wiring.Component):
    """``q = n // d`` (unsigned; ``d = 0`` gives all ones).

    Members: ``start`` (pulse, samples ``n``/``d``), ``n``, ``d``, ``busy``, ``done`` (one-cycle
    pulse with ``q`` valid, ``q`` held until the next start), ``q_len`` (the bit length of
    ``q`` in every cycle, a register kept with it: no priority encoder after ``q``).
    Latency: ``n_width + 1`` cycles from ``start`` to ``done``.
    """

    def __init__(self, n_width: int, d_width: int):
        self.n_width, self.d_width = n_width, d_width
        super().__init__({"start": In(1), "n": In(n_width), "d": In(d_width),
                          "busy": Out(1), "done": Out(1), "q": Out(n_width),
                          "q_len": Out(range(n_width + 1))})

    def elaborate(self, platform):
        m = Module()
        W = self.n_width
        rem = Signal(self.d_width + 1)
        num = Signal(W)
        den = Signal(self.d_width)
        cnt = Signal(range(W + 1))
        m.d.sync += self.done.eq(0)
        with m.If(self.start):
            m.d.sync += [num.eq(self.n), den.eq(self.d), rem.eq(0), cnt.eq(W),
                         self.busy.eq(1), self.q.eq(0), self.q_len.eq(0)]
        with m.Elif(self.busy):
            trial = Signal(self.d_width + 2)
            m.d.comb += trial.eq((rem << 1) | num[W - 1])
            ge = trial >= den
            m.d.sync += [num.eq(num << 1), cnt.eq(cnt - 1),
                         rem.eq(trial - ge * den),
                         self.q.eq((self.q << 1) | ge),
                         # q shifts left over n_width steps from 0: its length grows by one
                         # once its leading one is in (never truncated)
                         self.q_len.eq(Mux(self.q_len != 0, self.q_len + 1, ge))]
            with m.If(cnt == 1):
                m.d.sync += [self.busy.eq(0), self.done.eq(1)]
        return m


class VectorSqrt(wiring.Component):
    """``root = isqrt(x)`` (floor).

    Members: ``start``, ``x``, ``busy``, ``done`` (pulse), ``root``.
    Latency: ``width / 2 + 1`` cycles from ``start`` to ``done``.
    """

    def __init__(self, width: int):
        if width % 2:
            width += 1
        self.width = width
        super().__init__({"start": In(1), "x": In(width), "busy": Out(1), "done": Out(1),
                          "root": Out(width // 2)})

    def elaborate(self, platform):
        m = Module()
        W = self.width
        rem = Signal(W // 2 + 2)
        num = Signal(W)
        cnt = Signal(range(W // 2 + 1))
        m.d.sync += self.done.eq(0)
        with m.If(self.start):
            m.d.sync += [num.eq(self.x), rem.eq(0), self.root.eq(0), cnt.eq(W // 2),
                         self.busy.eq(1)]
        with m.Elif(self.busy):
            cur = Signal(W // 2 + 4)
            trial = Signal(W // 2 + 4)
            m.d.comb += [cur.eq((rem << 2) | num[W - 2:]), trial.eq((self.root << 2) | 1)]
            ge = cur >= trial
            m.d.sync += [num.eq(num << 2), cnt.eq(cnt - 1),
                         rem.eq(cur - ge * trial), self.root.eq((self.root << 1) | ge)]
            with m.If(cnt == 1):
                m.d.sync += [self.busy.eq(0), self.done.eq(1)]
        return m

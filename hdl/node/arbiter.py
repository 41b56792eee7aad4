"""Packet-granular round-robin arbiter (docs/node.md §6: the parsers' outputs meet in
"packet-granular round-robin arbiters (a grant holds until ``last``)")."""

from __future__ import annotations

from amaranth import C, Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["PacketArbiter"]


class PacketArbiter(wiring.Component):
    """``n`` packet streams → one, a whole packet at a time, round robin.

    Parameters
    ----------
    n:      inputs (≥ 1).
    layout: the beat layout of every stream; it must have a ``last`` field (e.g.
            :func:`mcf.abi.framing.parsed_layout`, :func:`~mcf.abi.framing.beat_layout`).

    Members
    -------
    ``i{k}`` (k < n): ``In(stream.Signature(layout))`` — the inputs.
    ``o``: ``Out(stream.Signature(layout))`` — beats of the granted input, unchanged.

    Grant: when no packet is in progress, the first input with ``valid`` after the one granted
    last (cyclically) wins; the grant then holds from that packet's first beat until its ``last``
    beat has been transferred — packets are never interleaved, idle cycles of the granted input
    inside a packet are passed on (``o.valid`` low), other inputs wait. Once ``o.valid`` is
    raised the grant is fixed, so ``o``'s payload stays stable until the transfer (stream rule),
    whatever the other inputs do.

    Fairness: after input ``k``'s packet, inputs ``k+1, k+2, …`` take precedence over ``k``: a
    waiting input is granted after at most ``n − 1`` other packets (no starvation).

    Latency / rate: combinational (0 cycles: ``o`` is the granted input's beat, its ``ready`` is
    ``o.ready``; the grant is one-hot, the round-robin pick a prefix OR over the inputs and the
    beat an AND-OR selection, so the logic grows with log ``n``, not ``n``); 1 beat per cycle;
    **no bubble between packets** — in the cycle after a ``last`` beat is transferred, another
    waiting input's first beat is already on ``o``.
    Per input, packets leave in arrival order (a stream is never reordered).
    """

    def __init__(self, n: int, layout: data.Layout):
        if n < 1:
            raise ValueError("n must be >= 1")
        layout = data.Layout.cast(layout)
        if "last" not in dict(layout):
            raise ValueError("the beat layout needs a 'last' field")
        self._n = n
        sig = stream.Signature(layout)
        super().__init__({**{f"i{k}": In(sig) for k in range(n)}, "o": Out(sig)})

    @property
    def n(self) -> int:
        return self._n

    def inputs(self) -> list:
        return [getattr(self, f"i{k}") for k in range(self._n)]

    def elaborate(self, platform):
        m = Module()
        n, ins, o = self._n, self.inputs(), self.o
        busy = Signal()                  # a grant is held (a beat was offered, last not taken)
        cur = Signal(n)                  # the held grant, one-hot
        after = Signal(n, init=0)        # the inputs after the one granted last (bits k > it):
        #                                  first in the round robin; reset: input n-1 granted last

        # round robin in parallel: the first valid input after the last grant, else the first
        # valid one; "first" by a prefix OR (log depth), not a chain of one multiplexer per input
        req = Cat(i.valid for i in ins)

        def first(v):
            return Cat(v[k] & ~v[:k].any() if k else v[0] for k in range(n))
        ahead = req & after
        pick = Signal(n)
        m.d.comb += pick.eq(Mux(ahead.any(), first(ahead), first(req)))
        sel = Signal(n)
        m.d.comb += sel.eq(Mux(busy, cur, pick))

        # the granted input by one-hot AND-OR selection (at most one bit of sel is set)
        m.d.comb += [o.valid.eq((sel & req).any()),
                     o.payload.eq(_select(sel, [i.payload.as_value() for i in ins]))]
        m.d.comb += [ins[k].ready.eq(sel[k] & o.ready) for k in range(n)]

        done = o.valid & o.ready & o.payload.last
        with m.If(done):
            # after the input granted now: the bits above its one-hot position
            m.d.sync += [busy.eq(0),
                         after.eq(Cat(sel[:k].any() if k else C(0, 1) for k in range(n)))]
        with m.Elif(o.valid):
            m.d.sync += [busy.eq(1), cur.eq(sel)]
        return m


def _select(onehot, values):
    """``values[k]`` for the set bit ``k`` of ``onehot`` (0 when none): an OR of ANDs."""
    out = 0
    for k, v in enumerate(values):
        out = out | (v & onehot[k].replicate(len(v)))
    return out

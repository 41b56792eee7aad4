"""The node's single sink for local packets: a packet-granular demultiplexer by ``Meta.op``
(docs/node.md §5 "Landing engine", §6 rule 1; paper §5, local delivery).

Routes, counters and the golden model are :mod:`mcf.abi.local_sink`'s
(:func:`mcf.abi.local_sink.sink_route`, :class:`mcf.golden.local_sink.LocalSinkModel`).
"""

from __future__ import annotations

from amaranth import Module, Signal
from amaranth.lib import enum, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import COUNTER_BITS
from mcf.abi.directory import DIR_OP, DirOp
from mcf.abi.framing import parsed_layout
from mcf.abi.local_sink import LOCAL_SINK_STATUS
from mcf.abi.meta import InvalidateKind, Op

__all__ = ["LocalSink"]

PACKET_WIDTH = 64   # docs/node.md §1: every packet stream is 64 bits


class _Route(enum.Enum, shape=3):
    KV = 0
    DECODE = 1
    DRAIN = 2
    CONSUME = 3


class LocalSink(wiring.Component):
    """Routes each local packet whole by its first beat's ``Meta.op``.

    Members
    -------
    i : In(stream.Signature(parsed_layout(64)))
        Every packet for this node (after the packet-granular arbiter). A packet is the beats
        up to and including ``last``; nothing else about framing is assumed.
    kv : Out(stream.Signature(parsed_layout(64)))
        ``KV_REPLICA`` packets, beats unchanged (to ``LandingEngine.i``).
    decode : Out(stream.Signature(parsed_layout(64)))
        ``QUERY``, ``PARTIAL_STATE`` and ``REDUCTION`` packets, beats unchanged (to the decode
        lander).
    dir_op : Out(stream.Signature(:data:`mcf.abi.directory.DIR_OP`))
        One DRAIN of ``meta.kv_id`` (``count`` 0) per ``INVALIDATE`` packet of kind DRAIN,
        offered with its first beat; the rest of that packet is consumed (to ``Directory.op``,
        through an arbiter shared with the sequencer's FREEs).
    control : Out(COUNTER_BITS)
        CONTROL packets received (free-running, wraps): the barrier counter WAIT tests; equal
        to ``status.control``.
    status : Out(:data:`mcf.abi.local_sink.LOCAL_SINK_STATUS`)

    Latency 0: an output's ``valid``/``payload`` are the input's (combinational), and
    ``i.ready`` is the selected output's ``ready`` (or 1 for consumed beats). Throughput: one
    beat per cycle on every route, no bubble between packets; consumed packets never wait.
    A packet waits only on its own output (so the output's backpressure holds the input; the
    landing engine always drains). Counters change the cycle after a packet's first beat is
    taken.
    """

    def __init__(self):
        parsed = parsed_layout(PACKET_WIDTH)
        super().__init__({
            "i": In(stream.Signature(parsed)),
            "kv": Out(stream.Signature(parsed)),
            "decode": Out(stream.Signature(parsed)),
            "dir_op": Out(stream.Signature(DIR_OP)),
            "control": Out(COUNTER_BITS),
            "status": Out(LOCAL_SINK_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        st = self.status
        meta = self.i.payload.meta

        in_pkt = Signal()
        held = Signal(_Route)
        route = Signal(_Route)
        first_route = Signal(_Route)
        with m.Switch(meta.op):
            with m.Case(Op.KV_REPLICA):
                m.d.comb += first_route.eq(_Route.KV)
            with m.Case(Op.QUERY, Op.PARTIAL_STATE, Op.REDUCTION):
                m.d.comb += first_route.eq(_Route.DECODE)
            with m.Case(Op.INVALIDATE):
                with m.If(meta.seq == InvalidateKind.DRAIN):
                    m.d.comb += first_route.eq(_Route.DRAIN)
                with m.Else():
                    m.d.comb += first_route.eq(_Route.CONSUME)
            with m.Default():
                m.d.comb += first_route.eq(_Route.CONSUME)
        with m.If(in_pkt):
            m.d.comb += route.eq(held)
        with m.Else():
            m.d.comb += route.eq(first_route)

        m.d.comb += [self.kv.payload.eq(self.i.payload), self.decode.payload.eq(self.i.payload),
                     self.dir_op.payload.op.eq(DirOp.DRAIN),
                     self.dir_op.payload.kv_id.eq(meta.kv_id),
                     self.dir_op.payload.count.eq(0)]
        with m.Switch(route):
            with m.Case(_Route.KV):
                m.d.comb += [self.kv.valid.eq(self.i.valid), self.i.ready.eq(self.kv.ready)]
            with m.Case(_Route.DECODE):
                m.d.comb += [self.decode.valid.eq(self.i.valid),
                             self.i.ready.eq(self.decode.ready)]
            with m.Case(_Route.DRAIN):
                with m.If(in_pkt):
                    m.d.comb += self.i.ready.eq(1)
                with m.Else():
                    m.d.comb += [self.dir_op.valid.eq(self.i.valid),
                                 self.i.ready.eq(self.dir_op.ready)]
            with m.Default():
                m.d.comb += self.i.ready.eq(1)

        take = self.i.valid & self.i.ready
        with m.If(take):
            m.d.sync += [in_pkt.eq(~self.i.payload.last), held.eq(route)]
            with m.If(~in_pkt):
                m.d.sync += st.packets.eq(st.packets + 1)
                counted = {
                    "kv": meta.op == Op.KV_REPLICA,
                    "decode": (meta.op == Op.QUERY) | (meta.op == Op.PARTIAL_STATE) |
                              (meta.op == Op.REDUCTION),
                    "drains": first_route == _Route.DRAIN,
                    "drop_invalidate": (meta.op == Op.INVALIDATE) &
                                       (first_route != _Route.DRAIN),
                    "control": meta.op == Op.CONTROL,
                    "fetch_requests": meta.op == Op.FETCH_REQUEST,
                    "drop_op": meta.op.as_value() == 7,
                }
                for name, cond in counted.items():
                    with m.If(cond):
                        m.d.sync += st[name].eq(st[name] + 1)
        m.d.comb += self.control.eq(st.control)
        return m


"""Formal checks (yowasp-sby, smtbmc + yices) of the NIC engines.

* Router output ports (``prove``, k-induction, every reachable state): once an output's
  ``valid`` is high without ``ready``, it stays high next cycle with the same payload (meta,
  data, keep, last). Small instance: 2 ports + 1 local input, 8-byte packets, 2 packet slots; the
  inputs obey the stream rules (assumed) and carry arbitrary routes and lengths.
* Reduction engine (``bmc``, 12 cycles from reset: one full round for k = 3, several for
  k = 1): a result for a tag is never emitted before ``k`` contributions of that tag
  arrived since its previous result (or its watchdog trip). Instance: 2 slots, two tags,
  2-beat contributions, k chosen by the solver (1..3) and written into the configuration
  table before traffic, arbitrary watchdog timeout, arbitrary output backpressure. Lane data
  is held at 0 (the arithmetic does not decide when a result is emitted; multipliers make
  the solver slow).
"""

from __future__ import annotations

from amaranth import Module, ResetSignal, Signal
from amaranth.hdl import Assert, Assume
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.meta import ReduceOp
from mcf.abi.nic import Topology
from mcf.hdl.nic.reduce import ReduceEngine
from mcf.hdl.nic.router import Router
from mcf.sim.formal import check


def _prev(m, sig, name):
    reg = Signal.like(sig, name=f"prev_{name}")
    m.d.sync += reg.eq(sig)
    return reg


class RouterFormal(wiring.Component):
    def __init__(self):
        self._r = Router(data_width=64, n_ports=2, n_local_in=1, topology=Topology.RING,
                         max_payload=8, packet_slots=2)
        sig = self._r.signature.members
        super().__init__({n: sig[n] for n in sig if n != "status"})

    def elaborate(self, platform):
        m = Module()
        m.submodules.r = r = self._r
        for name in self.signature.members:
            member = self.signature.members[name]
            if member.flow == In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(r, name))
            else:
                wiring.connect(m, getattr(r, name), wiring.flipped(getattr(self, name)))
        m.d.comb += Assume(~ResetSignal())
        started = Signal()
        m.d.sync += started.eq(1)
        ins, outs = r.inputs(), r.outputs()
        with m.If(started):
            for k, s in enumerate(ins):
                pv, pr = _prev(m, s.valid, f"iv{k}"), _prev(m, s.ready, f"ir{k}")
                pp = _prev(m, s.payload.as_value(), f"ip{k}")
                with m.If(pv & ~pr):
                    m.d.comb += Assume(s.valid & (s.payload.as_value() == pp))
            for k, s in enumerate(outs):
                pv, pr = _prev(m, s.valid, f"ov{k}"), _prev(m, s.ready, f"or{k}")
                pp = _prev(m, s.payload.as_value(), f"op{k}")
                with m.If(pv & ~pr):
                    m.d.comb += [Assert(s.valid, f"valid dropped on output {k}"),
                                 Assert(s.payload.as_value() == pp,
                                        f"payload changed while stalled on output {k}")]
        return m


class ReduceFormal(wiring.Component):
    K_TAGS = 2

    def __init__(self):
        self._e = ReduceEngine(data_width=64, n_slots=2, max_payload=16)
        sig = self._e.signature.members
        super().__init__({n: sig[n] for n in sig if n != "status"} | {
            "trips": Out(32), "k_const": In(3)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.e = e = self._e
        wiring.connect(m, wiring.flipped(self.i), e.i)
        wiring.connect(m, e.o, wiring.flipped(self.o))
        wiring.connect(m, wiring.flipped(self.cfg_wr), e.cfg_wr)
        m.d.comb += [e.local_id.eq(self.local_id), e.timeout.eq(self.timeout),
                     self.trips.eq(e.status.watchdog_trips)]
        m.d.comb += Assume(~ResetSignal())
        i, o = self.i, self.o
        meta = i.payload.meta
        k_const = self.k_const            # a free input held constant: k chosen by the solver
        m.d.comb += Assume((k_const >= 1) & (k_const <= 3))
        configured = Signal()
        with m.If(self.cfg_wr.en):
            m.d.sync += configured.eq(1)
        m.d.comb += Assume(~self.cfg_wr.en | ((self.cfg_wr.addr == 0)
                                              & (self.cfg_wr.data.k == k_const)))
        m.d.comb += Assume(self.timeout < 12)
        # inputs: stream rules, 2-beat contributions (SUM, 16 bytes, route 0, tags 0/1)
        started = Signal()
        m.d.sync += started.eq(1)
        prev_k = _prev(m, k_const, "k")
        with m.If(started):
            m.d.comb += Assume(k_const == prev_k)
        pv, pr = _prev(m, i.valid, "iv"), _prev(m, i.ready, "ir")
        pp = _prev(m, i.payload.as_value(), "ip")
        with m.If(started & pv & ~pr):
            m.d.comb += Assume(i.valid & (i.payload.as_value() == pp))
        second = Signal()       # next input beat is the second of its packet
        pmeta = Signal.like(meta.as_value())
        with m.If(i.valid & i.ready):
            m.d.sync += [second.eq(~second), pmeta.eq(meta.as_value())]
        with m.If(i.valid):
            m.d.comb += Assume(configured & (meta.route_id == 0) & (meta.seq == 0)
                               & (meta.kv_id < self.K_TAGS) & (meta.length == 16)
                               & (meta.reduce_op == ReduceOp.SUM)
                               & (i.payload.last == second) & (i.payload.keep == 0xFF)
                               & (i.payload.data == 0))
            with m.If(second):
                m.d.comb += Assume(meta.as_value() == pmeta)
        # shadow: contributions per tag since that tag's last result / watchdog trip
        since = [Signal(4, name=f"since{t}") for t in range(self.K_TAGS)]
        head = i.valid & i.ready & ~second
        o_start = o.valid & o.ready & ~o_prev_mid(m, o)
        trip_seen = Signal()
        prev_trips = _prev(m, e.status.watchdog_trips, "trips")
        m.d.comb += trip_seen.eq(started & (e.status.watchdog_trips != prev_trips))
        for t in range(self.K_TAGS):
            base = Signal(4, name=f"base{t}")
            tripped = trip_seen & (e.status.last_trip.kv_id == t)
            emitted = o_start & (o.payload.meta.kv_id == t)
            m.d.comb += base.eq(since[t])
            with m.If(emitted):
                m.d.comb += Assert(since[t] >= k_const, f"result for tag {t} before k arrived")
            with m.If(emitted | tripped):
                m.d.comb += base.eq(0)
            with m.If(head & (meta.kv_id == t)):
                m.d.sync += since[t].eq(base + 1)
            with m.Else():
                m.d.sync += since[t].eq(base)
            m.d.comb += Assume(since[t] < 12)
        return m


def o_prev_mid(m, o):
    """High while the output is inside a result packet (a beat without last went out)."""
    mid = Signal(name="o_mid")
    with m.If(o.valid & o.ready):
        m.d.sync += mid.eq(~o.payload.last)
    return mid


def test_router_output_handshake_formal():
    check(RouterFormal(), "nic_router_formal", mode="prove", depth=6, timeout=900)


def test_reduce_never_early_formal():
    check(ReduceFormal(), "nic_reduce_formal", mode="bmc", depth=12, timeout=900)

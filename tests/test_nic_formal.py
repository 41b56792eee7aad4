"""Formal checks (yowasp-sby, smtbmc + yices) of the NIC engines.

* Router output ports (``prove``, k-induction, every reachable state): once an output's
  ``valid`` is high without ``ready``, it stays high next cycle with the same payload (meta,
  data, keep, last). Small instance: 2 ports + 1 local input, 8-byte packets, 2 packet slots; the
  inputs obey the stream rules (assumed) and carry arbitrary routes and lengths.
* Reduction engine (``prove``, k-induction: every reachable state, unbounded time): a result
  for a tag is never emitted before ``k`` well-formed contributions of that tag arrived —
  when the first beat of a result for tag ``t`` is taken on ``o``, at least ``k`` heads of
  well-formed contributions of ``t`` were accepted on ``i`` since the previous result of ``t``
  started or since the watchdog last freed a slot holding ``t``. Also proved: the status
  reports every trip, one cycle after the slot is freed (``watchdog_trips`` grows by the
  number of freed slots, ``last_trip`` names the freed tag).

  Instance: 2 slots, two tags (``kv_id`` 0/1), 2-beat contributions. k (1..3) and each tag's
  op (MAX, SUM or SOFTMAX_MERGE) are chosen by the solver and held; k is written into the
  configuration table before traffic (and may be rewritten). The inputs obey the stream rules
  (assumed) and are well-formed contributions (16 bytes, the tag's op) or malformed ones the
  engine must drop (op NONE; length 0, not a multiple of 4 or too long), which never count.
  Lane data, ``keep``, the other meta fields, the watchdog timeout (32 bits, may change every
  cycle), ``local_id`` and the output backpressure are arbitrary. ``route_id`` is 0 on every
  cycle, also without ``valid``: the engine reads its configuration entry only when it
  accepts a head, and this lets an invariant name the configured k. "Arrived" means the head
  was accepted: by design the result streams out while the k-th contribution streams in
  (result beat j leaves after input beat j; the invariants pin this too). Outside the
  instance: more tags than slots (NO_SLOT drops), unconfigured routes, a valid op or length
  differing within a tag (MISMATCH drops, or another op opening the slot), packets of other
  beat counts, k changed at run time.

  Induction closes because the harness asserts strengthening invariants over the engine's
  internal state (read through ``ReduceEngine.probe``), which are therefore proved too: the
  configured entry holds k; the packet state of S0 matches the input framing and only
  malformed contributions are dropped; the beats in pipeline stages S2, S1 and the next input
  beat alternate head / tail and a packet's beats carry its head's ``final`` flag; the output
  is inside a result iff a result's head left and its tail did not; an open slot has tag
  (route 0, seq 0, kv_id < 2), the tag's op, length 16, k = the configured k and a count in
  1..k-1; at most one open slot per tag and none while the tag's result is pending; the
  shadow count of each tag equals its open slot's count, else k while a final contribution
  was accepted but its result's first beat has not left, else 0.
  ``test_reduce_formal_covers`` shows the behaviours reachable (k = 3 results after
  backpressure, results after a watchdog trip of the tag and after a dropped contribution, a
  softmax merge); ``test_reduce_formal_catches_early_result`` shows the property failing when
  the engine is configured for k - 1 contributors.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from amaranth import Cat, Module, Mux, ResetSignal, Signal
from amaranth.hdl import Assert, Assume, Cover, Fragment
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In

from mcf.abi.meta import META, ReduceOp
from mcf.abi.nic import Topology
from mcf.hdl.nic.reduce import ReduceEngine
from mcf.hdl.nic.router import Router
from mcf.sim.formal import check


def _implies(a, b):
    return ~a | b


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
    """Harness of the reduction-engine proof (see the module docstring).

    The engine is elaborated here (``Fragment.get``) rather than left to the toolchain, so that
    ``ReduceEngine.probe`` names the internal signals of the very instance under proof; the
    invariants read them, nothing drives them. With ``covers``, ``Cover`` statements show that
    the interesting behaviours are reachable under the assumptions (no vacuous proof).
    ``invariants=False`` leaves only the property and the status checks (for BMC);
    ``k_skew`` configures the engine with ``k + k_skew`` contributors while the property still
    demands ``k`` (a negative check: the property must fail).
    """

    K_TAGS = 2
    _tag_bits = (K_TAGS - 1).bit_length()
    LENGTH = 16         # bytes per contribution: 2 beats on the 64-bit datapath

    def __init__(self, *, invariants: bool = True, covers: bool = False, k_skew: int = 0):
        self._e = ReduceEngine(data_width=64, n_slots=2, max_payload=self.LENGTH)
        self._invariants_on = invariants
        self._covers = covers
        self._k_skew = k_skew
        sig = self._e.signature.members
        super().__init__({n: sig[n] for n in sig if n != "status"} | {
            "k_const": In(3),                                     # k, chosen by the solver
            "tag_op": In(data.ArrayLayout(ReduceOp, self.K_TAGS)),  # each tag's op, likewise
        })

    def elaborate(self, platform):
        m = Module()
        e = self._e
        m.submodules.e = Fragment.get(e, platform)
        p = e.probe
        wiring.connect(m, wiring.flipped(self.i), e.i)
        wiring.connect(m, e.o, wiring.flipped(self.o))
        wiring.connect(m, wiring.flipped(self.cfg_wr), e.cfg_wr)
        m.d.comb += [e.local_id.eq(self.local_id), e.timeout.eq(self.timeout)]
        m.d.comb += Assume(~ResetSignal())
        i, o = self.i, self.o
        meta = i.payload.meta
        started = Signal()
        m.d.sync += started.eq(1)

        # ---- environment: k, configuration, input stream rules --------------------------------
        k_const = self.k_const            # a free input held constant: k chosen by the solver
        m.d.comb += Assume((k_const >= 1) & (k_const <= 3))
        prev_k = _prev(m, k_const, "k")
        prev_ops = _prev(m, self.tag_op.as_value(), "tag_op")
        with m.If(started):
            m.d.comb += Assume((k_const == prev_k) & (self.tag_op.as_value() == prev_ops))
        for t in range(self.K_TAGS):
            m.d.comb += Assume(self.tag_op[t] != ReduceOp.NONE)
        configured = Signal()
        with m.If(self.cfg_wr.en):
            m.d.sync += configured.eq(1)
        m.d.comb += Assume(~self.cfg_wr.en | ((self.cfg_wr.addr == 0)
                                              & (self.cfg_wr.data.k == k_const + self._k_skew)))
        # route_id is 0 on every cycle, not only with valid: the engine uses the configuration
        # entry it addresses only when it accepts a head, and keeping the read port on entry 0
        # lets an invariant state what that entry holds
        m.d.comb += Assume(meta.route_id == 0)
        pv, pr = _prev(m, i.valid, "iv"), _prev(m, i.ready, "ir")
        pp = _prev(m, i.payload.as_value(), "ip")
        with m.If(started & pv & ~pr):
            m.d.comb += Assume(i.valid & (i.payload.as_value() == pp))
        second = Signal()       # the next input beat is the second (last) of its packet
        pmeta = Signal.like(meta.as_value())
        with m.If(i.valid & i.ready):
            m.d.sync += [second.eq(~second), pmeta.eq(meta.as_value())]
        good = self._good(meta)
        with m.If(i.valid):
            # well-formed contributions (16 bytes, the tag's op) or malformed ones the engine
            # must drop (op NONE, or a length that is 0, not a whole lane, or too long); the
            # other meta fields, data and keep are free
            m.d.comb += Assume(configured & (meta.seq == 0) & (meta.kv_id < self.K_TAGS)
                               & (good | (meta.reduce_op == ReduceOp.NONE) | self._bad_len(meta))
                               & (i.payload.last == second))
            with m.If(second):
                m.d.comb += Assume(meta.as_value() == pmeta)

        # ---- shadow: contributions per tag; a tag is "held" from its k-th contribution until
        # its result's last beat left (docs/node.md §6 rule 2: meanwhile its contributions are
        # dropped, so they do not count) ---------------------------------------------------
        since = [Signal(3, name=f"since{t}") for t in range(self.K_TAGS)]
        held = [Signal(name=f"held{t}") for t in range(self.K_TAGS)]
        pheld = Signal()        # the contribution in S0 arrived while its tag was held
        o_mid = o_prev_mid(m, o)
        head = i.valid & i.ready & ~second & good     # malformed contributions do not count
        o_start = o.valid & o.ready & ~o_mid
        o_end = o.valid & o.ready & o.payload.last
        n_slots = len(p.s_tag)
        held_in = Signal()
        m.d.comb += held_in.eq(Mux(meta.kv_id[:self._tag_bits] == 1, held[1], held[0]))
        with m.If(i.valid & i.ready & ~second):
            m.d.sync += pheld.eq(held_in)
        for t in range(self.K_TAGS):
            tripped = Cat(p.trips[s] & (p.s_tag[s].kv_id == t) for s in range(n_slots)).any()
            is_t = o.payload.meta.kv_id == t
            with m.If(o_start & is_t):
                m.d.comb += Assert(held[t], f"result for tag {t} before k arrived")
            base = Mux(tripped, 0, since[t])
            with m.If(o_end & is_t):
                m.d.sync += [since[t].eq(0), held[t].eq(0)]
            with m.Elif(head & (meta.kv_id == t) & ~held[t]):
                m.d.sync += since[t].eq(base + 1)
                with m.If(base + 1 >= k_const):
                    m.d.sync += held[t].eq(1)
            with m.Else():
                m.d.sync += since[t].eq(base)
        # the input never waits on the output (rule 2): ready is high in every state
        m.d.comb += Assert(i.ready, "input ready does not depend on o.ready")

        # ---- the status reports every trip: counter + 1 per freed slot, tag of the last ------
        st = e.status
        # a cycle's trips reach the status one cycle later (registered), so two cycles on
        prev_trips = _prev(m, _prev(m, p.trips, "trips1"), "trips")
        prev_count = _prev(m, st.watchdog_trips, "trip_count")
        prev_tags = [_prev(m, _prev(m, p.s_tag[s].as_value(), f"tag1_{s}"), f"tag{s}")
                     for s in range(n_slots)]
        with m.If(started):
            m.d.comb += Assert(st.watchdog_trips
                               == (prev_count + sum(prev_trips[s] for s in range(n_slots)))[:32],
                               "watchdog_trips counts freed slots")
            for s in range(n_slots):
                with m.If(prev_trips[s] & (prev_trips >> (s + 1) == 0)):
                    m.d.comb += Assert(st.last_trip.as_value() == prev_tags[s],
                                       "last_trip names the freed tag")

        if self._invariants_on:
            self._invariants(m, p, since, held, pheld, k_const, configured, second, pmeta,
                             o_mid)
        if self._covers:
            self._cover(m, p, k_const, o_start, o_mid, pheld)
        return m

    def _good(self, meta):
        """A well-formed contribution: 16 bytes with its tag's op."""
        return (meta.length == self.LENGTH) & (meta.reduce_op == self._op_of(meta.kv_id))

    def _op_of(self, kv_id):
        return self.tag_op[kv_id[:self._tag_bits]]

    def _bad_len(self, meta):
        """Lengths the engine must reject whatever the op (stated here independently)."""
        n = meta.length
        return (n == 0) | (n[:2] != 0) | (n > self.LENGTH)

    def _invariants(self, m, p, since, held, pheld, k_const, configured, second, pmeta, o_mid):
        """Strengthening invariants for k-induction, asserted (hence proved) every cycle."""
        s1, s2 = p.s1, p.s2
        bb = len(s1["addr"]) - (len(p.s_tag) - 1).bit_length() - 1   # beat-index bits
        n_slots = len(p.s_tag)
        assert n_slots == 2

        def slot_of(addr):
            return addr[bb:]

        h1 = s1["valid"] & s1["head"]
        t1 = s1["valid"] & ~s1["head"]
        h2 = s2["valid"] & ~s2["last"]
        in_pkt = p.in_pkt
        pm = META(pmeta)
        # S0 inside a well-formed contribution it accepted: the next beat entering S1 is its tail
        in_good = in_pkt & ~p.c_drop
        inv = [
            # configuration entry 0 holds k once written
            (_implies(configured, p.k_in == k_const), "configured k"),
            # framing: the beats in S2, S1 and the next expected input alternate head / tail
            (in_pkt == second, "S0 packet state"),
            (_implies(in_pkt, p.c_drop == (~self._good(pm) | pheld)),
             "S0 drops malformed and held-tag contributions only"),
            (~s1["valid"] | (s1["last"] == ~s1["head"]), "S1 2-beat framing"),
            (~s1["valid"] | (s1["head"] == in_good), "S1 vs S0 framing"),
            (~(s2["valid"] & s1["valid"]) | (s2["last"] == s1["head"]), "S2 vs S1 framing"),
            (_implies(s2["valid"] & ~s1["valid"], h2 == in_good), "S2 vs S0 framing"),
            # a packet's beats carry the final flag and the slot of its head
            (_implies(h1, (s1["final"] == p.c_final)
                      & (slot_of(s1["addr"]) == p.c_slot)), "S1 head / S0"),
            (_implies(h2 & t1, (s2["final"] == s1["final"])
                      & (slot_of(s2["addr"]) == slot_of(s1["addr"]))), "S2 / S1"),
            (_implies(h2 & ~s1["valid"], (s2["final"] == p.c_final)
                      & (slot_of(s2["addr"]) == p.c_slot)), "S2 / S0"),
            # the output register: inside a result iff its head left; the reader follows it
            (o_mid == (p.o_valid & p.o_last), "o_mid"),
            (_implies(p.rd_busy, p.o_valid & ~p.o_last & (p.o_slot == p.rd_slot)
                      & (p.rd_beat == 1)), "reader busy: beat 0 on o"),
            (_implies(p.o_valid & ~p.o_last, p.rd_busy), "beat 0 on o: reader busy"),
            (p.q_level <= n_slots, "queue level"),
            (_implies(p.q_level == 2, p.q[0] != p.q[1]), "queue entries distinct"),
        ]
        in_tag = pm.kv_id
        for s in range(n_slots):
            tag = p.s_tag[s]
            tag_ok = ((tag.route_id == 0) & (tag.seq == 0) & (tag.kv_id < self.K_TAGS)
                      & (p.s_op[s] == self._op_of(tag.kv_id)) & (p.s_len[s] == self.LENGTH)
                      & (p.s_k[s] == k_const))
            is_open = p.s_valid[s] & ~p.s_done[s]
            done = p.s_done[s]
            wr = ((in_good & p.c_final & (p.c_slot == s))
                  | (s1["valid"] & s1["final"] & (slot_of(s1["addr"]) == s))
                  | (s2["valid"] & s2["final"] & (slot_of(s2["addr"]) == s)))
            queued = (((p.q_level > 0) & (p.q[0] == s)) | ((p.q_level > 1) & (p.q[1] == s)))
            reading = (p.rd_busy & (p.rd_slot == s)) | (p.o_valid & (p.o_slot == s))
            inv += [
                (_implies(done, p.s_valid[s]), f"slot {s}: complete implies busy"),
                (_implies(is_open, tag_ok & (p.s_cnt[s] >= 1) & (p.s_cnt[s] < k_const)),
                 f"open slot {s}: tag, op, length, k, 1 <= count < k"),
                (_implies(done, tag_ok & (p.s_rmeta[s].kv_id == tag.kv_id)),
                 f"complete slot {s}: tag, result meta"),
                (done == (wr | queued | reading), f"complete slot {s}: written, queued or read"),
                (~(wr & queued) & ~(wr & reading) & ~(queued & reading),
                 f"slot {s}: one place at a time"),
                (_implies(in_good & (p.c_slot == s), p.s_valid[s] & (tag.kv_id == in_tag)
                          & (p.c_final == done)), f"S0 contribution in slot {s}"),
            ]
        inv.append((_implies(p.o_valid, Mux(p.o_slot == 1, p.s_done[1], p.s_done[0])
                             & (META(p.o_meta.as_value()).kv_id
                                == Mux(p.o_slot == 1, p.s_tag[1].kv_id, p.s_tag[0].kv_id))),
                    "o carries a complete slot's result"))
        for t in range(self.K_TAGS):
            owns = [p.s_valid[s] & (p.s_tag[s].kv_id == t) for s in range(n_slots)]
            opens = [o_ & ~p.s_done[s] for s, o_ in enumerate(owns)]
            dones = [o_ & p.s_done[s] for s, o_ in enumerate(owns)]
            inv += [
                (~(owns[0] & owns[1]), f"at most one slot for tag {t}"),
                (held[t] == (dones[0] | dones[1]), f"tag {t} held iff its slot is complete"),
                (since[t] == Mux(held[t], k_const, Mux(opens[0], p.s_cnt[0],
                                                       Mux(opens[1], p.s_cnt[1], 0))),
                 f"shadow count of tag {t} = k if held / open slot count / 0"),
            ]
        for cond, name in inv:
            m.d.comb += Assert(cond, name)

    def _cover(self, m, p, k_const, o_start, o_mid, pheld):
        """Reachability of what the proof is about (``mode="cover"`` fails on a miss)."""
        o = self.o
        stalled = _prev(m, o.valid & ~o.ready, "o_stall")
        tripped_before = Signal()       # the watchdog freed a slot of tag 0 earlier
        with m.If(Cat(p.trips[s] & (p.s_tag[s].kv_id == 0) for s in range(len(p.s_tag))).any()):
            m.d.sync += tripped_before.eq(1)
        dropped_before = Signal()       # a malformed contribution was accepted and dropped
        with m.If(p.in_pkt & p.c_drop):
            m.d.sync += dropped_before.eq(1)
        m.d.comb += [
            Cover(p.s_valid.all(), "both tags open at once"),
            Cover(o_start & (k_const == 3) & stalled, "k = 3 result after backpressure"),
            Cover(o_start & (o.payload.meta.kv_id == 0) & (k_const == 2) & tripped_before,
                  "k = 2 result of a tag whose slot the watchdog freed before"),
            Cover(o_start & (k_const == 2) & dropped_before, "k = 2 result after a drop"),
            Cover(o_start & (k_const == 2) & (o.payload.meta.reduce_op == ReduceOp.SOFTMAX_MERGE),
                  "k = 2 softmax-merge result"),
            Cover(o.valid & o.ready & o_mid & (o.payload.meta.kv_id == 1), "result tail"),
            Cover(p.in_pkt & p.c_drop & pheld & (k_const == 2),
                  "a contribution of a held tag dropped"),
            Cover(self.i.valid & o.valid & ~o.ready & (p.s_cnt[0] == 1) & ~p.s_done[0]
                  & p.s_valid[0] & (k_const == 3), "merging while a result waits"),
        ]


def o_prev_mid(m, o):
    """High while the output is inside a result packet (a beat without last went out)."""
    mid = Signal(name="o_mid")
    with m.If(o.valid & o.ready):
        m.d.sync += mid.eq(~o.payload.last)
    return mid


def test_router_output_handshake_formal():
    check(RouterFormal(), "nic_router_formal", mode="prove", depth=6, timeout=900)


def test_reduce_never_early_formal():
    """Unbounded: k-induction closes at depth 2 thanks to the asserted invariants."""
    check(ReduceFormal(), "nic_reduce_formal", mode="prove", depth=3, timeout=900)


def test_reduce_formal_covers():
    """The assumptions leave the proved behaviours reachable: results for k = 3 after
    backpressure, after a watchdog trip of the tag, after a dropped malformed contribution."""
    check(ReduceFormal(covers=True), "nic_reduce_formal_cover", mode="cover", depth=16,
          timeout=900)


def test_reduce_formal_catches_early_result():
    """The property can fail: with the engine configured for k - 1 contributors while the
    harness demands k, BMC from reset finds a result emitted early (invariants off, so the
    failing check is the property itself)."""
    with pytest.raises(AssertionError) as info:
        check(ReduceFormal(invariants=False, k_skew=-1), "nic_reduce_formal_skew", mode="bmc",
              depth=10, timeout=900)
    text = str(info.value)
    assert text.startswith("formal bmc of nic_reduce_formal_skew: FAIL"), text[:400]
    src = Path(__file__).read_text().splitlines()
    line = next(n for n, ln in enumerate(src, 1) if "before k arrived" in ln and "Assert(" in ln)
    assert f"test_nic_formal.py:{line} " in text, text[-2000:]

"""Reduction engine of the MCF compute-NIC — the decode path (paper §4 end, §5: "Decode
partial-state packets are sent to the reduction engine, which performs the maximum and
summation operations required to merge distributed softmax statistics").

Element-wise MAX / SUM of 32-bit lanes and the online-softmax merge of ``(m, l, o)`` states, in
the formats and with the rounding of :mod:`mcf.abi.softmax` (exp by LUT + shift), for ``k``
contributors sharing a tag (``route_id``, ``kv_id``, ``seq``); ``k`` comes from a per-route_id
configuration table. The same engine is the max/sum all-reduce of tensor-parallel decode: the
root reduces, the router multicasts the result (or each hop of a ring reduces and forwards).
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import MAX_PAYLOAD, parsed_layout
from mcf.abi.limits import REDUCE_SLOTS
from mcf.abi.meta import META, ReduceOp
from mcf.abi.nic import (
    WATCHDOG_BITS,
    ReduceDrop,
    reduce_config_layout,
    reduce_status_layout,
    reduce_tag_layout,
)
from mcf.abi.route import route_table_depth
from mcf.abi.softmax import LANE_BITS

from .reduce_head import ReduceHead
from .reduce_lanes import ReduceLanes, reduce_s1_layout
from .reduce_out import ReduceOutput
from .router import RouteWriteSignature

__all__ = ["ReduceEngine"]


class ReduceEngine(wiring.Component):
    """Tag-matching reduction engine.

    Parameters
    ----------
    data_width:  payload bits per beat; ``data_width // 32`` lanes are reduced per cycle.
    n_slots:     tags that may be open or waiting to be sent at once (each holds one
                 ``max_payload`` accumulator buffer); the configuration's (docs/node.md §7:
                 kr260 12 = H_q of Qwen2.5-1.5B, sim 4; default
                 :data:`mcf.abi.limits.REDUCE_SLOTS`).
    max_payload: largest contribution in bytes (default :data:`mcf.abi.framing.MAX_PAYLOAD`).

    Members
    -------
    ``i``: ``In(stream.Signature(parsed_layout))`` — contributions (parser REDUCTION port).
    ``o``: ``Out(stream.Signature(parsed_layout))`` — results: one packet per completed tag, the
        final contribution's meta with ``src = local_id``, payload = the reduced lanes. If the
        route's configuration has ``final`` set, the result is final: ``reduce_op = NONE``,
        ``collective = MULTICAST``, ``route_id = result_route`` (the ABI rule of
        :func:`mcf.abi.nic.reduce_config_layout`: it is forwarded, never reduced again);
        otherwise it is a partial and keeps the contributions' fields.
    ``cfg_wr``: ``In(RouteWriteSignature(reduce_config_layout(meta_layout)))`` — one entry
        (``k``, ``final``, ``result_route``) per route_id; ``k = 0``: not configured,
        contributions are dropped. ``k`` is taken when a tag opens, ``final`` /
        ``result_route`` when its k-th contribution arrives.
    ``local_id``: ``In(node)``; ``timeout``: ``In(WATCHDOG_BITS)`` — watchdog cycles (0
        disables).
    ``status``: ``Out(reduce_status_layout(meta_layout))`` — counters and the tag of the last
        watchdog trip.

    Every width (table depth = every ``route_id``, tags, node ids, lengths) comes from
    ``meta_layout``.

    Behaviour: a contribution whose tag matches an open slot is merged into it; otherwise it
    opens a free slot (stored unchanged). Contributions are merged in arrival order with
    :func:`mcf.abi.softmax.merge_state` (``SOFTMAX_MERGE``, payload ``m, l, o[..]``) or
    :func:`mcf.abi.softmax.reduce_lanes` (``MAX`` signed, ``SUM`` wrapping). The k-th
    contribution completes the slot (the decision is taken when its head is accepted): its
    merged lanes are written back and the slot is marked complete. **The input never waits on
    the output** (docs/node.md §6 rule 2): a complete result stays in its slot, busy, until
    its last beat has left on ``o``; results leave in completion order. Meanwhile
    contributions to other slots keep merging at full rate. Malformed contributions (bad
    length, op NONE, unconfigured k, op/length differing from the open slot's) are dropped
    whole and counted (:class:`mcf.abi.nic.ReduceDrop`); so is a contribution that finds no
    slot (``NO_SLOT``): a new tag while every slot is busy (open or complete), or a
    contribution of a tag whose complete result still waits in its slot. An open slot that
    receives nothing for ``timeout`` cycles is freed and counted (``watchdog_trips``,
    ``last_trip``, one cycle after the slot is freed): a missing contributor never hangs the
    engine. A complete slot is never freed by the watchdog (its result waits only for the
    router).

    Latency / rate: ``i.ready`` is constantly high: 1 beat (all lanes) per cycle in, whatever
    ``o`` does. A result's first beat is on ``o`` 4 cycles after the k-th contribution's last
    beat was accepted (store and forward through the slot); results leave at 1 beat per cycle,
    back to back when several are complete.

    Resources (``mcf.sim.synth.resources``, ``data_width=64``, ``max_payload=2048``): 4 slots
    1,963 LUT, 1,492 FF, 8 DSP, 4 BRAM36; 12 slots 3,586 LUT, 3,027 FF, 8 DSP, 12 BRAM36 (with
    ``-uram``: 2 URAM, no BRAM). The slot memory has two read ports (merge, output), so it is
    held twice: rule 2 costs one more copy of it (before: 2 / 6 BRAM36 for 4 / 12 slots).

    Structure: :class:`~.reduce_head.ReduceHead` (configuration table, head decode),
    :class:`~.reduce_lanes.ReduceLanes` (S1 → S2 lane arithmetic) and
    :class:`~.reduce_out.ReduceOutput` (completion queue, result reader); this component keeps
    the slot table, the slot buffer, the watchdog and the counters.

    Observability: each call of :meth:`elaborate` records the internal state signals of the
    module it returns in ``self.probe`` (a namespace: configured ``k_in`` read for the current
    head, slot table ``s_valid``/``s_tag``/``s_op``/``s_len``/``s_k``/``s_cnt``, watchdog
    ``trips``, head state ``in_pkt``/``c_drop``/``c_final``/``c_slot``, pipeline registers
    ``s1``/``s2``).
    It also names ``s_done`` (complete slots), ``s_rmeta`` (their results' meta), the
    completion queue ``q``/``q_level`` and the output reader (``rd_busy``, ``rd_slot``,
    ``rd_beat``, ``o_valid``, ``o_slot``, ``o_last``, ``o_meta``; attributes of the
    :class:`~.reduce_out.ReduceOutput` instance).
    Nothing in the design reads it; a formal harness that asserts on them elaborates the engine
    itself and instantiates the returned module (``tests/test_nic_formal.py``).
    """

    def __init__(self, *, data_width: int = 64, n_slots: int = REDUCE_SLOTS,
                 max_payload: int = MAX_PAYLOAD,
                 meta_layout: data.StructLayout = META):
        if data_width % LANE_BITS or data_width < 2 * LANE_BITS:
            raise ValueError("data width must be a multiple of the 32-bit lane, >= 2 lanes")
        self._dw = data_width
        self._lanes = data_width // LANE_BITS
        self._slots = n_slots
        self._max_payload = max_payload
        bpb = data_width // 8
        beats = max(1, -(-max_payload // bpb))
        self._beat_bits = max(1, (beats - 1).bit_length())
        self._meta_layout = meta_layout
        beat = parsed_layout(data_width, meta_layout)
        super().__init__({
            "i": In(stream.Signature(beat)),
            "o": Out(stream.Signature(beat)),
            "cfg_wr": In(RouteWriteSignature(reduce_config_layout(meta_layout),
                                             route_table_depth(meta_layout))),
            "local_id": In(meta_layout["src"].width),
            "timeout": In(WATCHDOG_BITS),
            "status": Out(reduce_status_layout(meta_layout)),
        })

    @property
    def max_payload(self) -> int:
        return self._max_payload

    @property
    def n_slots(self) -> int:
        return self._slots

    def elaborate(self, platform):
        m = Module()
        S = self._slots
        i_s = self.i
        meta = i_s.payload.meta
        addr_bits = S.bit_length() + self._beat_bits

        # ---- slot table ------------------------------------------------------------------------
        # s_valid: slot busy; s_done: its result is complete (final contribution accepted) and
        # waits, in the slot, until the output has sent its last beat (docs/node.md §6 rule 2)
        kbits = reduce_config_layout(self._meta_layout)["k"].width
        s_valid = Signal(S)
        s_done = Signal(S)
        s_tag = [Signal(reduce_tag_layout(self._meta_layout), name=f"tag{s}") for s in range(S)]
        s_op = [Signal(ReduceOp, name=f"op{s}") for s in range(S)]
        s_len = [Signal.like(meta.length, name=f"len{s}") for s in range(S)]
        s_k = [Signal(kbits, name=f"k{s}") for s in range(S)]
        s_cnt = [Signal(kbits, name=f"cnt{s}") for s in range(S)]
        s_m = [Signal(signed(LANE_BITS), name=f"m{s}") for s in range(S)]
        s_timer = [Signal(WATCHDOG_BITS, name=f"timer{s}") for s in range(S)]
        # registers, not a memory: S x meta bits, and the formal proof can name them
        s_rmeta = [Signal(self._meta_layout, name=f"rmeta{s}") for s in range(S)]
        s_open = Signal(S)
        m.d.comb += s_open.eq(s_valid & ~s_done)

        # ---- S0: configuration (k per route_id), head decode ------------------------------------
        m.submodules.head = head = ReduceHead(n_slots=S, max_payload=self._max_payload,
                                              meta_layout=self._meta_layout)
        wiring.connect(m, wiring.flipped(self.cfg_wr), head.cfg_wr)
        m_in = i_s.payload.data[:LANE_BITS].as_signed()
        m.d.comb += [head.meta.eq(meta), head.m_in.eq(m_in)]
        for s in range(S):
            sl = head.slots[s]
            m.d.comb += [sl.valid.eq(s_valid[s]), sl.done.eq(s_done[s]), sl.tag.eq(s_tag[s]),
                         sl.op.eq(s_op[s]), sl.len.eq(s_len[s]), sl.k.eq(s_k[s]),
                         sl.cnt.eq(s_cnt[s]), sl.m.eq(s_m[s])]
        dec = head.dec
        k_in = dec.k
        hit, head_drop, slot_sel, final = dec.hit, dec.drop, dec.slot, dec.final

        in_pkt = Signal()         # S0 is inside a packet (head already taken): its decision hc
        hc = Signal(data.StructLayout({"drop": 1, "slot": range(S), "fresh": 1, "final": 1,
                                       "op": ReduceOp}))
        bidx = Signal(self._beat_bits)

        # rule 2: the input never waits on the output
        m.d.comb += i_s.ready.eq(1)
        fire = i_s.valid
        head_fire = fire & ~in_pkt

        # state for the packet in S0
        with m.If(fire):
            with m.If(i_s.payload.last):
                m.d.sync += [in_pkt.eq(0), bidx.eq(0)]
            with m.Else():
                m.d.sync += [in_pkt.eq(1), bidx.eq(bidx + 1)]
        with m.If(head_fire):
            m.d.sync += [hc.drop.eq(head_drop), hc.slot.eq(slot_sel), hc.fresh.eq(~hit),
                         hc.final.eq(final), hc.op.eq(meta.reduce_op)]
        cur_slot = Mux(in_pkt, hc.slot, slot_sel)

        # ---- accumulator buffer, S1 ------------------------------------------------------------
        depth = S << self._beat_bits
        m.submodules.buf = buf = Memory(shape=unsigned(self._dw), depth=depth, init=[])
        bw = buf.write_port()
        br = buf.read_port(transparent_for=(bw,))
        rd_addr = Cat(Mux(in_pkt, bidx, 0), cur_slot)
        m.d.comb += br.addr.eq(rd_addr)

        s1 = Signal(reduce_s1_layout(self._dw, addr_bits, self._meta_layout.size))
        m.d.sync += [
            s1.valid.eq(fire & ~Mux(in_pkt, hc.drop, head_drop)), s1.head.eq(~in_pkt),
            s1.fresh.eq(Mux(in_pkt, hc.fresh, ~hit)), s1.final.eq(Mux(in_pkt, hc.final, final)),
            s1.op.eq(Mux(in_pkt, hc.op, meta.reduce_op)),
            s1.addr.eq(rd_addr), s1.data.eq(i_s.payload.data),
            s1.last.eq(i_s.payload.last), s1.meta.eq(meta.as_value()),
        ]
        with m.If(head_fire):
            m.d.sync += [
                s1.da.eq((dec.m_new - dec.hit_m)[:LANE_BITS + 1]),
                s1.db.eq((dec.m_new - m_in)[:LANE_BITS + 1]),
                s1.mnew.eq(dec.m_new),
            ]

        # ---- S1 -> S2: lane arithmetic; S2 writes every beat back (a final result stays in its
        # slot); the final contribution's last beat queues the slot for the output
        m.submodules.lanes = lanes = ReduceLanes(data_width=self._dw, addr_bits=addr_bits,
                                                 meta_bits=self._meta_layout.size)
        s2 = lanes.s2
        m.d.comb += [lanes.s1.eq(s1), lanes.acc_rd.eq(br.data),
                     bw.addr.eq(s2.addr), bw.data.eq(s2.data), bw.en.eq(s2.valid)]

        # ---- output side: completed slots in completion order ----------------------------------
        m.submodules.out = out = ReduceOutput(data_width=self._dw, n_slots=S,
                                              beat_bits=self._beat_bits,
                                              meta_layout=self._meta_layout)
        obr = buf.read_port()               # sync: its data register is the output stage
        m.d.comb += [out.push.eq(s2.valid & s2.final & s2.last),
                     out.push_slot.eq(s2.addr[self._beat_bits:]),
                     out.local_id.eq(self.local_id),
                     obr.addr.eq(out.rd_addr), obr.en.eq(out.rd_en), out.rd_data.eq(obr.data)]
        m.d.comb += [out.lens[s].eq(s_len[s]) for s in range(S)]
        m.d.comb += [out.rmeta[s].eq(s_rmeta[s]) for s in range(S)]
        wiring.connect(m, out.o, wiring.flipped(self.o))

        # ---- slot table updates + watchdog -----------------------------------------------------
        trips = Signal(S)
        trip_cut = Signal(S)      # slot s is freed by the watchdog this cycle (trips, not freed)
        for s in range(S):
            # take_s == accept & dec.sel[s] == accept & (slot_sel == s) (sel is slot_sel
            # one-hot whenever the head is accepted); dec.take forms it per slot, without the
            # encoded index or the whole drop decision on the path
            take_s = head_fire & dec.take[s]
            active = (in_pkt & (hc.slot == s)) | take_s
            # the watchdog guards open slots only: a complete result waits for the output
            m.d.comb += trips[s].eq(s_open[s] & ~active & (self.timeout != 0)
                                    & (s_timer[s] >= self.timeout))
            out_free_s = out.free & (out.free_slot == s)
            m.d.comb += trip_cut[s].eq(trips[s] & ~out_free_s)
            with m.If(take_s):
                m.d.sync += [s_timer[s].eq(0), s_cnt[s].eq(dec.cnt_next), s_m[s].eq(dec.m_new)]
                with m.If(~hit):
                    m.d.sync += [s_valid[s].eq(1), s_tag[s].eq(dec.tag),
                                 s_op[s].eq(meta.reduce_op), s_len[s].eq(meta.length),
                                 s_k[s].eq(k_in)]
                with m.If(final):
                    m.d.sync += [s_done[s].eq(1), s_rmeta[s].eq(dec.res_meta)]
            with m.Elif(out_free_s):
                m.d.sync += [s_valid[s].eq(0), s_done[s].eq(0)]
            with m.Elif(active):
                m.d.sync += s_timer[s].eq(0)
            with m.Elif(trips[s]):
                m.d.sync += [s_valid[s].eq(0), s_timer[s].eq(0)]
            with m.Elif(s_open[s]):
                m.d.sync += s_timer[s].eq(s_timer[s] + 1)
        # the status reports a cycle's trips one cycle later, from registers: the head decode
        # (take → active → trips) does not reach the counter's adder or the tag tree. A tripped
        # slot keeps its tag through that cycle (a slot taken in a cycle does not trip in it).
        trips_q = Signal(S)
        cut_q = Signal(S)
        m.d.sync += [trips_q.eq(trips), cut_q.eq(trip_cut)]
        # last_trip: the tag of the highest slot tripped, by a balanced tree of (any, tag)
        # pairs (the higher half wins), not a chain of one multiplexer per slot
        level = [(cut_q[s], s_tag[s].as_value()) for s in range(S)]
        while len(level) > 1:
            nxt = [(lo[0] | hi[0], Mux(hi[0], hi[1], lo[1]))
                   for lo, hi in zip(level[0::2], level[1::2])]
            level = nxt + level[len(nxt) * 2:]
        with m.If(level[0][0]):
            m.d.sync += self.status.last_trip.eq(level[0][1])

        # ---- counters --------------------------------------------------------------------------
        st = self.status
        m.d.sync += st.watchdog_trips.eq(st.watchdog_trips + sum(trips_q[s] for s in range(S)))
        with m.If(head_fire):
            m.d.sync += st.rx_packets.eq(st.rx_packets + 1)
            for c in ReduceDrop:
                name = f"drop_{c.name.lower()}"
                with m.If(dec.cause[c.value]):
                    m.d.sync += st[name].eq(st[name] + 1)
        with m.If(self.o.valid & self.o.ready & self.o.payload.last):
            m.d.sync += st.tx_results.eq(st.tx_results + 1)

        self.probe = SimpleNamespace(
            k_in=k_in, s_valid=s_valid, s_done=s_done, s_tag=s_tag, s_op=s_op, s_len=s_len, s_k=s_k,
            s_cnt=s_cnt, trips=trips, in_pkt=in_pkt, c_drop=hc.drop, c_final=hc.final,
            c_slot=hc.slot, s1=s1, s2=s2, q=out.q, q_level=out.q_level, s_rmeta=s_rmeta,
            o_valid=out.o_valid, o_last=out.o_last, o_meta=out.o_meta, rd_busy=out.rd_busy,
            rd_slot=out.rd_slot, rd_beat=out.rd_beat, o_slot=out.o_slot, head_drop=head_drop,
            cause=dec.cause)
        return m

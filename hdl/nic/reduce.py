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

from amaranth import Cat, Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import MAX_PAYLOAD, parsed_layout
from mcf.abi.limits import REDUCE_SLOTS
from mcf.abi.meta import META, Collective, ReduceOp
from mcf.abi.nic import (
    LANE_BYTES,
    WATCHDOG_BITS,
    ReduceDrop,
    reduce_config_layout,
    reduce_status_layout,
    reduce_tag_layout,
)
from mcf.abi.route import route_table_depth
from mcf.abi.softmax import EXP_FRAC, LANE_BITS, SCORE_FRAC, STATE_L, STATE_O, exp2_lut

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
    ``last_trip``): a missing contributor never hangs the engine. A complete slot is never
    freed by the watchdog (its result waits only for the router).

    Latency / rate: ``i.ready`` is constantly high: 1 beat (all lanes) per cycle in, whatever
    ``o`` does. A result's first beat is on ``o`` 4 cycles after the k-th contribution's last
    beat was accepted (store and forward through the slot); results leave at 1 beat per cycle,
    back to back when several are complete.

    Resources (``mcf.sim.synth.resources``, ``data_width=64``, ``max_payload=2048``): 4 slots
    1,908 LUT, 1,492 FF, 8 DSP, 4 BRAM36; 12 slots 3,786 LUT, 3,027 FF, 8 DSP, 12 BRAM36 (with
    ``-uram``: 2 URAM, no BRAM). The slot memory has two read ports (merge, output), so it is
    held twice: rule 2 costs one more copy of it (before: 2 / 6 BRAM36 for 4 / 12 slots).

    Observability: each call of :meth:`elaborate` records the internal state signals of the
    module it returns in ``self.probe`` (a namespace: configured ``k_in`` read for the current
    head, slot table ``s_valid``/``s_tag``/``s_op``/``s_len``/``s_k``/``s_cnt``, watchdog
    ``trips``, head state ``in_pkt``/``c_drop``/``c_final``/``c_slot``, pipeline registers
    ``s1``/``s2``).
    It also names ``s_done`` (complete slots), ``s_rmeta`` (their results' meta), the
    completion queue ``q``/``q_level`` and the output reader (``rd_busy``, ``rd_slot``,
    ``rd_beat``, ``o_valid``, ``o_slot``, ``o_last``, ``o_meta``).
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
        S, L = self._slots, self._lanes
        i_s, o_s = self.i, self.o
        meta = i_s.payload.meta
        SOFT, MAX, SUM = ReduceOp.SOFTMAX_MERGE, ReduceOp.MAX, ReduceOp.SUM

        # ---- configuration table (k per route_id) ----------------------------------------------
        m.submodules.cfg = cfg = Memory(shape=reduce_config_layout(self._meta_layout),
                                        depth=route_table_depth(self._meta_layout), init=[])
        cw = cfg.write_port()
        m.d.comb += [cw.addr.eq(self.cfg_wr.addr), cw.data.eq(self.cfg_wr.data),
                     cw.en.eq(self.cfg_wr.en)]
        cr = cfg.read_port(domain="comb")
        m.d.comb += cr.addr.eq(meta.route_id)
        k_in = cr.data.k
        tag_layout = reduce_tag_layout(self._meta_layout)

        # ---- slot table ------------------------------------------------------------------------
        # s_valid: slot busy; s_done: its result is complete (final contribution accepted) and
        # waits, in the slot, until the output has sent its last beat (docs/node.md §6 rule 2)
        kbits = len(k_in)
        s_valid = Signal(S)
        s_done = Signal(S)
        s_tag = [Signal(tag_layout, name=f"tag{s}") for s in range(S)]
        s_op = [Signal(ReduceOp, name=f"op{s}") for s in range(S)]
        s_len = [Signal.like(meta.length, name=f"len{s}") for s in range(S)]
        s_k = [Signal(kbits, name=f"k{s}") for s in range(S)]
        s_cnt = [Signal(kbits, name=f"cnt{s}") for s in range(S)]
        s_m = [Signal(signed(LANE_BITS), name=f"m{s}") for s in range(S)]
        s_timer = [Signal(WATCHDOG_BITS, name=f"timer{s}") for s in range(S)]
        s_open = Signal(S)
        m.d.comb += s_open.eq(s_valid & ~s_done)

        tag_in = Signal(tag_layout)
        m.d.comb += [tag_in.kv_id.eq(meta.kv_id), tag_in.seq.eq(meta.seq),
                     tag_in.route_id.eq(meta.route_id)]

        # ---- pipeline registers ----------------------------------------------------------------
        in_pkt = Signal()         # S0 is inside a packet (head already taken)
        c_drop = Signal()
        c_slot = Signal(range(S))
        c_fresh = Signal()
        c_final = Signal()
        c_op = Signal(ReduceOp)
        bidx = Signal(self._beat_bits)

        s1 = {n: Signal(w, name=f"s1_{n}") for n, w in (
            ("valid", 1), ("head", 1), ("fresh", 1), ("final", 1), ("op", 2),
            ("addr", S.bit_length() + self._beat_bits), ("data", self._dw), ("last", 1),
            ("meta", self._meta_layout.size))}
        s1_da = Signal(LANE_BITS + 1)       # m_new − m_acc (≥ 0)
        s1_db = Signal(LANE_BITS + 1)       # m_new − m_in  (≥ 0)
        s1_mnew = Signal(signed(LANE_BITS))
        s2 = {n: Signal(w, name=f"s2_{n}") for n, w in (
            ("valid", 1), ("final", 1), ("addr", len(s1["addr"])), ("data", self._dw),
            ("last", 1), ("meta", self._meta_layout.size))}

        # ---- S0: head decode -------------------------------------------------------------------
        match = Signal(S)
        m.d.comb += match.eq(Cat(s_valid[s] & (s_tag[s].as_value() == tag_in.as_value())
                                 for s in range(S)))
        hits = match & ~s_done          # an open slot of this tag
        held = (match & s_done) != 0    # this tag's result still waits in its slot
        hit = hits != 0
        hit_idx = Signal(range(S))
        free_idx = Signal(range(S))
        any_free = ~s_valid.all()
        for s in reversed(range(S)):
            with m.If(hits[s]):
                m.d.comb += hit_idx.eq(s)
            with m.If(~s_valid[s]):
                m.d.comb += free_idx.eq(s)
        length = meta.length
        lane_bits = (LANE_BYTES - 1).bit_length()
        bad_len = ((length == 0) | (length[:lane_bits] != 0) | (length > self._max_payload)
                   | ((meta.reduce_op == SOFT) & (length < 2 * LANE_BYTES)))
        bad_op = meta.reduce_op == ReduceOp.NONE
        no_cfg = k_in == 0
        hit_op = Signal(ReduceOp)
        hit_len = Signal.like(length)
        hit_cnt = Signal(kbits)
        hit_k = Signal(kbits)
        hit_m = Signal(signed(LANE_BITS))
        with m.Switch(hit_idx):
            for s in range(S):
                with m.Case(s):
                    m.d.comb += [hit_op.eq(s_op[s]), hit_len.eq(s_len[s]), hit_cnt.eq(s_cnt[s]),
                                 hit_k.eq(s_k[s]), hit_m.eq(s_m[s])]
        mismatch = hit & ((hit_op != meta.reduce_op) | (hit_len != length))
        no_slot = held | (~hit & ~any_free)
        cause = Signal(len(ReduceDrop))        # one-hot, first matching cause only
        m.d.comb += cause.eq(Cat(
            bad_len, ~bad_len & bad_op, ~bad_len & ~bad_op & no_cfg,
            ~bad_len & ~bad_op & ~no_cfg & mismatch,
            ~bad_len & ~bad_op & ~no_cfg & ~mismatch & no_slot))
        head_drop = cause != 0
        slot_sel = Mux(hit, hit_idx, free_idx)
        cnt_before = Mux(hit, hit_cnt, 0)
        k_use = Mux(hit, hit_k, k_in)
        final = (cnt_before + 1) >= k_use

        m_in = i_s.payload.data[:LANE_BITS].as_signed()
        m_new = Signal(signed(LANE_BITS))
        m.d.comb += m_new.eq(Mux(hit & (hit_m > m_in), hit_m, m_in))

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
            m.d.sync += [c_drop.eq(head_drop), c_slot.eq(slot_sel), c_fresh.eq(~hit),
                         c_final.eq(final), c_op.eq(meta.reduce_op)]

        cur_drop = Mux(in_pkt, c_drop, head_drop)
        cur_slot = Mux(in_pkt, c_slot, slot_sel)
        cur_fresh = Mux(in_pkt, c_fresh, ~hit)
        cur_final = Mux(in_pkt, c_final, final)
        cur_op = Mux(in_pkt, c_op, meta.reduce_op)
        cur_bidx = Mux(in_pkt, bidx, 0)

        # a final result leaves as reduce_op NONE, MULTICAST, route_id = result_route (ABI rule,
        # mcf.abi.nic.reduce_config_layout): no engine reduces it again. The result's meta is
        # the final contribution's head meta, kept per slot until the result leaves.
        res_meta = Signal(self._meta_layout)
        m.d.comb += res_meta.eq(meta)
        with m.If(cr.data.final):
            m.d.comb += [res_meta.reduce_op.eq(ReduceOp.NONE),
                         res_meta.collective.eq(Collective.MULTICAST),
                         res_meta.route_id.eq(cr.data.result_route)]
        # registers, not a memory: S x meta bits, and the formal proof can name them
        s_rmeta = [Signal(self._meta_layout, name=f"rmeta{s}") for s in range(S)]
        accept = head_fire & ~head_drop

        # ---- accumulator buffer ----------------------------------------------------------------
        depth = S << self._beat_bits
        m.submodules.buf = buf = Memory(shape=unsigned(self._dw), depth=depth, init=[])
        bw = buf.write_port()
        br = buf.read_port(transparent_for=(bw,))
        rd_addr = Cat(cur_bidx, cur_slot)
        m.d.comb += br.addr.eq(rd_addr)

        m.d.sync += [
            s1["valid"].eq(fire & ~cur_drop),
            s1["head"].eq(~in_pkt),
            s1["fresh"].eq(cur_fresh), s1["final"].eq(cur_final), s1["op"].eq(cur_op),
            s1["addr"].eq(rd_addr), s1["data"].eq(i_s.payload.data),
            s1["last"].eq(i_s.payload.last), s1["meta"].eq(meta.as_value()),
        ]
        with m.If(head_fire):
            m.d.sync += [
                s1_da.eq((m_new - hit_m)[:LANE_BITS + 1]),
                s1_db.eq((m_new - m_in)[:LANE_BITS + 1]),
                s1_mnew.eq(m_new),
            ]

        # ---- output side: completed slots in completion order ----------------------------------
        # completion queue of slot numbers (registers: at most S entries, one per slot)
        q = [Signal(range(S), name=f"q{j}") for j in range(S)]
        q_level = Signal(range(S + 1))
        q_push = Signal()
        q_pop = Signal()
        q_in = Signal(range(S))
        lvl_after_pop = q_level - q_pop
        for j in range(S):
            nxt = q[j + 1] if j + 1 < S else q[j]
            with m.If(q_push & (lvl_after_pop == j)):
                m.d.sync += q[j].eq(q_in)
            with m.Elif(q_pop):
                m.d.sync += q[j].eq(nxt)
        m.d.sync += q_level.eq(q_level + q_push - q_pop)
        rd_busy = Signal()                  # a result is being read out of rd_slot
        rd_slot = Signal(range(S))
        rd_beat = Signal(self._beat_bits)
        o_slot = Signal(range(S))           # slot of the beat on o
        o_valid = Signal()
        o_last = Signal()
        o_keep = Signal(self._dw // 8)
        o_meta = Signal(self._meta_layout)
        nxt_slot = Mux(rd_busy, rd_slot, q[0])
        have = rd_busy | (q_level != 0)
        nxt_len = Signal.like(meta.length)
        with m.Switch(nxt_slot):
            for s in range(S):
                with m.Case(s):
                    m.d.comb += nxt_len.eq(s_len[s])
        bpb = self._dw // 8
        byte_bits = (bpb - 1).bit_length()
        nxt_lastb = ((nxt_len - 1) >> byte_bits)[:self._beat_bits]   # index of the last beat
        beat_now = Mux(rd_busy, rd_beat, 0)
        issue_last = beat_now == nxt_lastb
        rem = nxt_len[:byte_bits]
        last_keep = Mux(rem == 0, (1 << bpb) - 1, (Const(1, bpb + 1) << rem) - 1)
        nxt_meta = Signal(self._meta_layout)
        with m.Switch(nxt_slot):
            for s in range(S):
                with m.Case(s):
                    m.d.comb += nxt_meta.eq(s_rmeta[s])
        obr = buf.read_port()               # sync: its data register is the output stage
        step = ~o_valid | o_s.ready
        m.d.comb += [obr.addr.eq(Cat(beat_now, nxt_slot)), obr.en.eq(step),
                     q_pop.eq(step & ~rd_busy & (q_level != 0))]
        with m.If(step):
            m.d.sync += [o_valid.eq(have), o_slot.eq(nxt_slot), o_last.eq(issue_last),
                         o_keep.eq(Mux(issue_last, last_keep, (1 << bpb) - 1)),
                         o_meta.eq(nxt_meta)]
            with m.If(have):
                m.d.sync += [rd_busy.eq(~issue_last), rd_slot.eq(nxt_slot),
                             rd_beat.eq(beat_now + 1)]
        o_free = o_valid & o_s.ready & o_last     # the result's last beat leaves: slot free
        m.d.comb += [
            o_s.valid.eq(o_valid),
            o_s.payload.meta.eq(o_meta),
            o_s.payload.meta.src.eq(self.local_id),
            o_s.payload.data.eq(obr.data),
            o_s.payload.keep.eq(o_keep),
            o_s.payload.last.eq(o_last),
        ]

        # ---- slot table updates + watchdog -----------------------------------------------------
        trips = Signal(S)
        for s in range(S):
            active = (in_pkt & (c_slot == s)) | (accept & (slot_sel == s))
            # the watchdog guards open slots only: a complete result waits for the output
            m.d.comb += trips[s].eq(s_open[s] & ~active & (self.timeout != 0)
                                    & (s_timer[s] >= self.timeout))
            with m.If(accept & (slot_sel == s)):
                m.d.sync += [s_timer[s].eq(0), s_cnt[s].eq(cnt_before + 1), s_m[s].eq(m_new)]
                with m.If(~hit):
                    m.d.sync += [s_valid[s].eq(1), s_tag[s].eq(tag_in),
                                 s_op[s].eq(meta.reduce_op), s_len[s].eq(length),
                                 s_k[s].eq(k_in)]
                with m.If(final):
                    m.d.sync += [s_done[s].eq(1), s_rmeta[s].eq(res_meta)]
            with m.Elif(o_free & (o_slot == s)):
                m.d.sync += [s_valid[s].eq(0), s_done[s].eq(0)]
            with m.Elif(active):
                m.d.sync += s_timer[s].eq(0)
            with m.Elif(trips[s]):
                m.d.sync += [s_valid[s].eq(0), s_timer[s].eq(0),
                             self.status.last_trip.eq(s_tag[s])]
            with m.Elif(s_open[s]):
                m.d.sync += s_timer[s].eq(s_timer[s] + 1)

        # ---- S1: factors, lane arithmetic ------------------------------------------------------
        m.submodules.lut = lut = Memory(shape=unsigned(EXP_FRAC + 1), depth=1 << SCORE_FRAC,
                                        init=[int(x) for x in exp2_lut()])
        fa_r = Signal(EXP_FRAC + 1)
        fb_r = Signal(EXP_FRAC + 1)

        def exp2neg(d, name):
            rp = lut.read_port(domain="comb")
            i_part = d[SCORE_FRAC:]
            out = Signal(EXP_FRAC + 1, name=name)
            m.d.comb += [rp.addr.eq(d[:SCORE_FRAC]),
                         out.eq(Mux(i_part <= EXP_FRAC, rp.data >> i_part[:5], 0))]
            return out

        fa_h = exp2neg(s1_da, "fa_head")
        fb_h = exp2neg(s1_db, "fb_head")
        fa = Mux(s1["head"], fa_h, fa_r)
        fb = Mux(s1["head"], fb_h, fb_r)
        with m.If(s1["valid"] & s1["head"]):
            m.d.sync += [fa_r.eq(fa_h), fb_r.eq(fb_h)]

        # forwarding: S2 writes the address S1 read one cycle too late for the read port
        acc = Signal(self._dw)
        m.d.comb += acc.eq(Mux(s2["valid"] & (s2["addr"] == s1["addr"]),
                               s2["data"], br.data))
        word0 = s1["head"]      # beat 0 of a packet holds m (lane 0) and l (lane 1)
        result = Signal(self._dw)
        half = 1 << (EXP_FRAC - 1)
        for lane in range(L):
            a = acc[lane * LANE_BITS:(lane + 1) * LANE_BITS]
            b = s1["data"][lane * LANE_BITS:(lane + 1) * LANE_BITS]
            r = result[lane * LANE_BITS:(lane + 1) * LANE_BITS]
            is_m = word0 if lane == 0 else Const(0)
            is_l = word0 if lane == 1 else Const(0)
            a_ext = Mux(is_l, a.as_unsigned(), a.as_signed())
            b_ext = Mux(is_l, b.as_unsigned(), b.as_signed())
            ta = Signal(signed(LANE_BITS + 2), name=f"ta{lane}")
            tb = Signal(signed(LANE_BITS + 2), name=f"tb{lane}")
            m.d.comb += [
                ta.eq(((a_ext * fa) + half) >> EXP_FRAC),
                tb.eq(((b_ext * fb) + half) >> EXP_FRAC),
            ]
            tsum = Signal(signed(LANE_BITS + 3), name=f"tsum{lane}")
            m.d.comb += tsum.eq(ta + tb)
            sat_l = Mux(tsum > STATE_L.max_int, STATE_L.max_int, tsum)
            sat_o = Mux(tsum > STATE_O.max_int, STATE_O.max_int,
                        Mux(tsum < STATE_O.min_int, STATE_O.min_int, tsum))
            soft = Mux(is_m, s1_mnew, Mux(is_l, sat_l, sat_o))
            with m.If(s1["fresh"]):
                m.d.comb += r.eq(b)
            with m.Elif(s1["op"] == SOFT):
                m.d.comb += r.eq(soft)
            with m.Elif(s1["op"] == MAX):
                m.d.comb += r.eq(Mux(a.as_signed() > b.as_signed(), a, b))
            with m.Elif(s1["op"] == SUM):
                m.d.comb += r.eq(a + b)

        m.d.sync += [
            s2["valid"].eq(s1["valid"]), s2["final"].eq(s1["final"]), s2["addr"].eq(s1["addr"]),
            s2["data"].eq(result), s2["last"].eq(s1["last"]), s2["meta"].eq(s1["meta"]),
        ]
        # S2 writes every beat (a final result stays in its slot); the final contribution's
        # last beat queues the slot for the output
        m.d.comb += [bw.addr.eq(s2["addr"]), bw.data.eq(s2["data"]), bw.en.eq(s2["valid"]),
                     q_in.eq(s2["addr"][self._beat_bits:]),
                     q_push.eq(s2["valid"] & s2["final"] & s2["last"])]

        # ---- counters --------------------------------------------------------------------------
        st = self.status
        m.d.sync += st.watchdog_trips.eq(st.watchdog_trips + sum(trips[s] for s in range(S)))
        with m.If(head_fire):
            m.d.sync += st.rx_packets.eq(st.rx_packets + 1)
            for c in ReduceDrop:
                name = f"drop_{c.name.lower()}"
                with m.If(cause[c.value]):
                    m.d.sync += st[name].eq(st[name] + 1)
        with m.If(o_s.valid & o_s.ready & o_s.payload.last):
            m.d.sync += st.tx_results.eq(st.tx_results + 1)

        self.probe = SimpleNamespace(
            k_in=k_in, s_valid=s_valid, s_done=s_done, s_tag=s_tag, s_op=s_op, s_len=s_len, s_k=s_k,
            s_cnt=s_cnt, trips=trips, in_pkt=in_pkt, c_drop=c_drop, c_final=c_final,
            c_slot=c_slot,
            s1=s1, s2=s2, q=q, q_level=q_level, s_rmeta=s_rmeta, o_valid=o_valid, o_last=o_last,
            o_meta=o_meta, rd_busy=rd_busy, rd_slot=rd_slot, rd_beat=rd_beat,
            o_slot=o_slot, head_drop=head_drop, cause=cause)
        return m

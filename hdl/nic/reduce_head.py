"""Head decode of the reduction engine (paper §5 compute-NIC, :mod:`.reduce`): the per-route_id
configuration table and the decision taken when a contribution's head is accepted — which slot
it goes to, whether it is dropped and why (:class:`mcf.abi.nic.ReduceDrop`), whether it
completes the slot, and the merged running maximum ``m`` of the online-softmax state
(:mod:`mcf.abi.softmax`).
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.meta import Collective, ReduceOp
from mcf.abi.nic import LANE_BYTES, ReduceDrop, reduce_config_layout, reduce_tag_layout
from mcf.abi.route import route_table_depth
from mcf.abi.softmax import LANE_BITS

from .router import RouteWriteSignature

__all__ = ["ReduceHead", "reduce_decision_layout", "reduce_slot_layout"]


def reduce_slot_layout(meta_layout: data.StructLayout) -> data.StructLayout:
    """One slot of the engine's slot table, as the head decode reads it: busy (``valid``),
    complete (``done``), its tag, op, length, ``k``, contributions merged so far (``cnt``) and
    the running maximum ``m`` of a softmax merge."""
    kbits = reduce_config_layout(meta_layout)["k"].width
    return data.StructLayout({
        "valid": 1, "done": 1, "tag": reduce_tag_layout(meta_layout), "op": ReduceOp,
        "len": meta_layout["length"].shape, "k": kbits, "cnt": kbits,
        "m": signed(LANE_BITS)})


def reduce_decision_layout(meta_layout: data.StructLayout, n_slots: int) -> data.StructLayout:
    """The head decode's result: the route's configured ``k``, drop (and its one-hot ``cause``),
    ``hit`` (an open slot of the tag) and the slot used (``slot``, and one-hot ``sel``; ``take``
    = ``sel`` when not dropped, else 0, formed per slot), the tag, ``final`` (this contribution
    completes the slot), the count after it, the slot's maximum ``hit_m``, the merged maximum
    ``m_new`` and the result meta ``res_meta`` (the ABI's final-result rewrite applied when
    configured)."""
    kbits = reduce_config_layout(meta_layout)["k"].width
    return data.StructLayout({
        "k": kbits, "drop": 1, "cause": len(ReduceDrop), "hit": 1, "slot": range(n_slots),
        "sel": n_slots, "take": n_slots, "tag": reduce_tag_layout(meta_layout), "final": 1,
        "cnt_next": kbits,
        "hit_m": signed(LANE_BITS), "m_new": signed(LANE_BITS), "res_meta": meta_layout})


class ReduceHead(wiring.Component):
    """Configuration table and head decode of the reduction engine.

    Members
    -------
    cfg_wr : In(RouteWriteSignature(reduce_config_layout(meta_layout)))
        Writes one entry (``k``, ``final``, ``result_route``) of the table (one per route_id).
    meta : In(meta_layout)
        The head beat's meta (its ``route_id`` addresses the table).
    m_in : In(signed(32))
        Lane 0 of the head beat (``m`` of a softmax state).
    slots : In(data.ArrayLayout(reduce_slot_layout(meta_layout), n_slots))
        The slot table.
    dec : Out(reduce_decision_layout(meta_layout, n_slots))
        The decision. Causes in priority order: bad length (0, not whole lanes, over
        ``max_payload``, or under two lanes for a softmax merge), op NONE, ``k = 0``, op or
        length differing from the open slot's, no slot (the tag's result still waits in its
        slot, or a new tag with every slot busy); only the first is flagged. A hit takes the
        lowest matching open slot, a new tag the lowest free one.

    Latency: a table write takes effect the next cycle; the decision is combinational from
    ``meta``, ``m_in`` and ``slots``.
    """

    def __init__(self, *, n_slots: int, max_payload: int, meta_layout: data.StructLayout):
        self._slots, self._max_payload = n_slots, max_payload
        self._meta_layout = meta_layout
        super().__init__({
            "cfg_wr": In(RouteWriteSignature(reduce_config_layout(meta_layout),
                                             route_table_depth(meta_layout))),
            "meta": In(meta_layout), "m_in": In(signed(LANE_BITS)),
            "slots": In(data.ArrayLayout(reduce_slot_layout(meta_layout), n_slots)),
            "dec": Out(reduce_decision_layout(meta_layout, n_slots)),
        })

    def elaborate(self, platform):
        m = Module()
        S, meta, slots, dec = self._slots, self.meta, self.slots, self.dec
        SOFT = ReduceOp.SOFTMAX_MERGE
        m.submodules.cfg = cfg = Memory(shape=reduce_config_layout(self._meta_layout),
                                        depth=route_table_depth(self._meta_layout), init=[])
        cw = cfg.write_port()
        m.d.comb += [cw.addr.eq(self.cfg_wr.addr), cw.data.eq(self.cfg_wr.data),
                     cw.en.eq(self.cfg_wr.en)]
        cr = cfg.read_port(domain="comb")
        m.d.comb += [cr.addr.eq(meta.route_id), dec.k.eq(cr.data.k)]
        m.d.comb += [dec.tag.kv_id.eq(meta.kv_id), dec.tag.seq.eq(meta.seq),
                     dec.tag.route_id.eq(meta.route_id)]
        s_valid = Cat(slots[s].valid for s in range(S))
        match = Signal(S)
        m.d.comb += match.eq(Cat(slots[s].valid
                                 & (slots[s].tag.as_value() == dec.tag.as_value())
                                 for s in range(S)))
        s_done = Cat(slots[s].done for s in range(S))
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
        k_in = cr.data.k
        no_cfg = k_in == 0
        hit_slot = Signal(reduce_slot_layout(self._meta_layout))
        with m.Switch(hit_idx):
            for s in range(S):
                with m.Case(s):
                    m.d.comb += hit_slot.eq(slots[s])
        # per slot, in parallel with the match (not through hit_idx → hit_slot): the lowest
        # open slot of the tag (first_hit), the lowest free slot (first_free), and whether the
        # slot's op / length differ from the head's; mismatch = the first hit's
        first_hit = Signal(S)
        first_free = Signal(S)
        m.d.comb += [first_hit.eq(hits & ~Cat(hits[:s].any() for s in range(S))),
                     first_free.eq(~s_valid & ~Cat((~s_valid[:s]).any() for s in range(S)))]
        mm = Cat((slots[s].op != meta.reduce_op) | (slots[s].len != length) for s in range(S))
        mismatch = (first_hit & mm).any()
        m.d.comb += dec.sel.eq(Mux(hit, first_hit, first_free))
        no_slot = held | (~hit & ~any_free)
        m.d.comb += dec.cause.eq(Cat(
            bad_len, ~bad_len & bad_op, ~bad_len & ~bad_op & no_cfg,
            ~bad_len & ~bad_op & ~no_cfg & mismatch,
            ~bad_len & ~bad_op & ~no_cfg & ~mismatch & no_slot))
        # take = sel & ~drop, per slot from its own terms (the first hit's mismatch is its mm;
        # with a hit, no_slot is held; a free slot exists when first_free has a bit), so the
        # watchdog's "slot taken" needs no encoded cause
        ok = ~bad_len & ~bad_op & ~no_cfg & ~held
        m.d.comb += dec.take.eq(Cat(ok & ((first_hit[s] & ~mm[s]) | (~hit & first_free[s]))
                                    for s in range(S)))
        cnt_before = Mux(hit, hit_slot.cnt, 0)
        k_use = Mux(hit, hit_slot.k, k_in)
        m.d.comb += [dec.drop.eq(dec.cause != 0), dec.hit.eq(hit),
                     dec.slot.eq(Mux(hit, hit_idx, free_idx)),
                     dec.final.eq((cnt_before + 1) >= k_use), dec.cnt_next.eq(cnt_before + 1),
                     dec.hit_m.eq(hit_slot.m),
                     dec.m_new.eq(Mux(hit & (hit_slot.m > self.m_in), hit_slot.m, self.m_in))]

        # a final result leaves as reduce_op NONE, MULTICAST, route_id = result_route (ABI rule,
        # mcf.abi.nic.reduce_config_layout): no engine reduces it again
        m.d.comb += dec.res_meta.eq(meta)
        with m.If(cr.data.final):
            m.d.comb += [dec.res_meta.reduce_op.eq(ReduceOp.NONE),
                         dec.res_meta.collective.eq(Collective.MULTICAST),
                         dec.res_meta.route_id.eq(cr.data.result_route)]
        return m

"""Emission of complete gathers of the all-to-all engine (paper §5 compute-NIC,
:mod:`.all_to_all`): reads a complete slot out of the gather buffer, parts in source order, as
one packet.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import parsed_layout
from mcf.abi.meta import Collective
from mcf.abi.nic import A2A_STATUS

__all__ = ["A2AEmit", "gather_slot_layout"]


def gather_slot_layout(meta_layout: data.StructLayout) -> data.StructLayout:
    """One gather slot as the emitter reads it: complete (``done``: every part written), the
    part length ``len`` in bytes and the meta of its first part (``meta``)."""
    return data.StructLayout({"done": 1, "len": meta_layout["length"].shape,
                              "meta": meta_layout})


class A2AEmit(wiring.Component):
    """Reader of complete gathers.

    Members
    -------
    slots : In(data.ArrayLayout(gather_slot_layout(meta_layout), n_slots))
        The slot table.
    local_id : In(node); num_nodes : In(node + 1)
        Node identity (sampled when a gather starts).
    rd_addr, rd_en : Out; rd_data : In(data_width)
        The gather buffer's synchronous read port (address ``beat, src, slot``): its data
        register is the output stage.
    o : Out(stream.Signature(parsed_layout(data_width, meta_layout)))
        Gathered tensors: the first part's meta with ``src = dst = local_id``, ``seq = 0``,
        ``collective = ALL_TO_ALL``, ``length = num_nodes × part``; every beat whole.
    freeing : Out(n_slots)
        One-hot: the slot whose last beat is read this cycle (free for a new tag at once: the
        read port returns the old word on a same-cycle write). Depends combinationally on
        ``o.ready``.
    status : Out(StructLayout ``gathers_done`` of ``A2A_STATUS``)
        Gathers read out.

    Latency: a complete slot (lowest first) starts reading the cycle after ``done`` rises
    (when idle), its first beat is on ``o`` one cycle later; 1 beat/cycle, and the next
    complete gather starts in the cycle the previous one reads its last beat (no gap).
    """

    def __init__(self, *, data_width: int, max_nodes: int, part_beats: int, n_slots: int,
                 meta_layout: data.StructLayout):
        self._dw, self._max_nodes, self._pbeats = data_width, max_nodes, part_beats
        self._slots, self._meta_layout = n_slots, meta_layout
        node = meta_layout["src"].width
        pbits = max(1, (part_beats - 1).bit_length())
        nbits = max(1, (max_nodes - 1).bit_length())
        sbits = (n_slots - 1).bit_length()
        super().__init__({
            "slots": In(data.ArrayLayout(gather_slot_layout(meta_layout), n_slots)),
            "local_id": In(node), "num_nodes": In(node + 1),
            "rd_addr": Out(pbits + nbits + sbits), "rd_en": Out(1), "rd_data": In(data_width),
            "o": Out(stream.Signature(parsed_layout(data_width, meta_layout))),
            "freeing": Out(n_slots),
            "status": Out(data.StructLayout({"gathers_done": A2A_STATUS["gathers_done"].shape})),
        })

    def elaborate(self, platform):
        m = Module()
        st, o, freeing, slots = self.status, self.o, self.freeing, self.slots
        bpb, N, S = self._dw // 8, self._max_nodes, self._slots
        pbits = max(1, (self._pbeats - 1).bit_length())
        nbits = max(1, (N - 1).bit_length())
        sbits = max(1, (S - 1).bit_length())
        lw = self._meta_layout["length"].width
        log_bpb = (bpb - 1).bit_length()
        emitting = Signal()
        e_slot = Signal(range(S))
        e_src = Signal(range(N + 1))
        e_b = Signal(pbits + 1)
        e_pbeats = Signal(lw)
        e_n = Signal.like(self.num_nodes)
        o_valid = Signal()
        o_last = Signal()
        o_meta = Signal(self._meta_layout)
        e_meta = Signal(self._meta_layout)     # meta of the gather being read out
        adv = ~o_valid | o.ready
        m.d.comb += [self.rd_en.eq(adv), o.valid.eq(o_valid), o.payload.data.eq(self.rd_data),
                     o.payload.keep.eq((1 << bpb) - 1), o.payload.last.eq(o_last),
                     o.payload.meta.eq(o_meta)]
        # b_last == (e_b + 1 == e_pbeats) and s_last == (e_src + 1 == e_n) in every state:
        # registers updated with the counters, so no adder or compare precedes a slot release
        b_last = Signal()
        s_last = Signal()
        issue_last = s_last & b_last
        nb = (e_b + 1)[:len(e_b)]
        ns = (e_src + 1)[:len(e_src)]
        m.d.comb += self.rd_addr.eq(Cat(e_b[:pbits], e_src[:nbits],
                                        e_slot[:sbits] if S > 1 else []))
        with m.If(adv):
            m.d.sync += [o_valid.eq(emitting), o_last.eq(issue_last), o_meta.eq(e_meta)]
            with m.If(emitting):
                with m.If(b_last):
                    m.d.sync += [e_b.eq(0), e_src.eq(e_src + 1), b_last.eq(e_pbeats == 1),
                                 s_last.eq(ns + 1 == e_n)]
                with m.Else():
                    m.d.sync += [e_b.eq(e_b + 1), b_last.eq(nb + 1 == e_pbeats)]
                with m.If(issue_last):
                    m.d.sync += emitting.eq(0)
                    m.d.comb += freeing.eq(Const(1, S) << e_slot)
                    m.d.sync += st.gathers_done.eq(st.gathers_done + 1)
        # the next complete gather starts in the cycle the previous one issues its last read:
        # back-to-back gathers leave without a bubble
        with m.If(adv & (~emitting | issue_last)):
            for s in reversed(range(S)):
                g_len = slots[s].len
                with m.If(slots[s].done & ~(freeing >> s)[0]):
                    m.d.sync += [emitting.eq(1), e_slot.eq(s), e_src.eq(0), e_b.eq(0),
                                 e_pbeats.eq(g_len >> log_bpb), e_n.eq(self.num_nodes),
                                 b_last.eq((g_len >> log_bpb) == 1),
                                 s_last.eq(self.num_nodes == 1),
                                 e_meta.eq(slots[s].meta), e_meta.src.eq(self.local_id),
                                 e_meta.dst.eq(self.local_id), e_meta.seq.eq(0),
                                 e_meta.collective.eq(Collective.ALL_TO_ALL),
                                 e_meta.length.eq(g_len * self.num_nodes)]
        return m

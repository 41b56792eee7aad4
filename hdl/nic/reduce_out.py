"""Output side of the reduction engine (paper §5 compute-NIC, :mod:`.reduce`): the queue of
complete slots in completion order and the reader that sends each result out of its slot
(docs/node.md §6 rule 2: a result waits in its slot; the input never waits on the output).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import parsed_layout

__all__ = ["ReduceOutput"]


class ReduceOutput(wiring.Component):
    """Completion queue and result reader of the reduction engine.

    Members
    -------
    push, push_slot : In
        A slot became complete (its final contribution's last beat was written): queue it.
    lens : In(data.ArrayLayout(length, n_slots))
        Each slot's payload length in bytes.
    rmeta : In(data.ArrayLayout(meta_layout, n_slots))
        Each complete slot's result meta.
    local_id : In(node)
        ``src`` of every result.
    rd_addr, rd_en : Out; rd_data : In(data_width)
        The slot buffer's synchronous read port (address ``beat, slot``): its data register is
        the output stage.
    o : Out(stream.Signature(parsed_layout(data_width, meta_layout)))
        The results, one packet per complete slot, in completion order, ``keep`` on the last
        beat from the length.
    free, free_slot : Out
        The last beat of the result of ``free_slot`` is transferred on ``o`` (the slot is free
        from the next cycle).

    Observability (attributes, not ports, for the engine's ``probe``): the queue ``q`` /
    ``q_level``, the reader ``rd_busy`` / ``rd_slot`` / ``rd_beat`` and the output register
    ``o_valid`` / ``o_slot`` / ``o_last`` / ``o_meta``.

    Latency: a slot's first beat is on ``o`` 2 cycles after its ``push`` when the reader is
    idle; results leave at one beat per cycle, back to back.
    """

    def __init__(self, *, data_width: int, n_slots: int, beat_bits: int,
                 meta_layout: data.StructLayout):
        S = n_slots
        self._dw, self._slots, self._beat_bits = data_width, n_slots, beat_bits
        self._meta_layout = meta_layout
        len_shape = self._len_shape = meta_layout["length"].shape
        super().__init__({
            "push": In(1), "push_slot": In(range(S)),
            "lens": In(data.ArrayLayout(len_shape, S)),
            "rmeta": In(data.ArrayLayout(meta_layout, S)),
            "local_id": In(meta_layout["src"].width),
            "rd_addr": Out(beat_bits + (S - 1).bit_length()), "rd_en": Out(1),
            "rd_data": In(data_width),
            "o": Out(stream.Signature(parsed_layout(data_width, meta_layout))),
            "free": Out(1), "free_slot": Out(range(S)),
        })
        self.q = [Signal(range(S), name=f"q{j}") for j in range(S)]
        self.q_level = Signal(range(S + 1))
        self.rd_busy = Signal()                 # a result is being read out of rd_slot
        self.rd_slot = Signal(range(S))
        self.rd_beat = Signal(beat_bits)
        self.o_slot = Signal(range(S))          # slot of the beat on o
        self.o_valid = Signal()
        self.o_last = Signal()
        self.o_meta = Signal(meta_layout)

    def elaborate(self, platform):
        m = Module()
        S, q, q_level = self._slots, self.q, self.q_level
        rd_busy, rd_slot, rd_beat = self.rd_busy, self.rd_slot, self.rd_beat
        o_slot, o_valid, o_last, o_meta = self.o_slot, self.o_valid, self.o_last, self.o_meta
        o_s = self.o
        q_pop = Signal()
        lvl_after_pop = q_level - q_pop
        for j in range(S):
            nxt = q[j + 1] if j + 1 < S else q[j]
            with m.If(self.push & (lvl_after_pop == j)):
                m.d.sync += q[j].eq(self.push_slot)
            with m.Elif(q_pop):
                m.d.sync += q[j].eq(nxt)
        m.d.sync += q_level.eq(q_level + self.push - q_pop)
        o_keep = Signal(self._dw // 8)
        nxt_slot = Mux(rd_busy, rd_slot, q[0])
        have = rd_busy | (q_level != 0)
        nxt_len = Signal(self._len_shape)
        nxt_meta = Signal(self._meta_layout)
        with m.Switch(nxt_slot):
            for s in range(S):
                with m.Case(s):
                    m.d.comb += [nxt_len.eq(self.lens[s]), nxt_meta.eq(self.rmeta[s])]
        bpb = self._dw // 8
        byte_bits = (bpb - 1).bit_length()
        nxt_lastb = ((nxt_len - 1) >> byte_bits)[:self._beat_bits]   # index of the last beat
        beat_now = Mux(rd_busy, rd_beat, 0)
        issue_last = beat_now == nxt_lastb
        rem = nxt_len[:byte_bits]
        last_keep = Mux(rem == 0, (1 << bpb) - 1, (Const(1, bpb + 1) << rem) - 1)
        step = ~o_valid | o_s.ready
        m.d.comb += [self.rd_addr.eq(Cat(beat_now, nxt_slot)), self.rd_en.eq(step),
                     q_pop.eq(step & ~rd_busy & (q_level != 0))]
        with m.If(step):
            m.d.sync += [o_valid.eq(have), o_slot.eq(nxt_slot), o_last.eq(issue_last),
                         o_keep.eq(Mux(issue_last, last_keep, (1 << bpb) - 1)),
                         o_meta.eq(nxt_meta)]
            with m.If(have):
                m.d.sync += [rd_busy.eq(~issue_last), rd_slot.eq(nxt_slot),
                             rd_beat.eq(beat_now + 1)]
        m.d.comb += [
            self.free.eq(o_valid & o_s.ready & o_last),
            self.free_slot.eq(o_slot),
            o_s.valid.eq(o_valid),
            o_s.payload.meta.eq(o_meta),
            o_s.payload.meta.src.eq(self.local_id),
            o_s.payload.data.eq(self.rd_data),
            o_s.payload.keep.eq(o_keep),
            o_s.payload.last.eq(o_last),
        ]
        return m

"""All-to-all engine of the MCF compute-NIC (paper §5: "Collective packets are handled by the
all-to-all engine").

Scatter: a local tensor packet of ``num_nodes × part`` bytes becomes ``num_nodes`` part packets,
part ``j`` addressed to node ``j`` (``dst = j``, ``route_id = route_id + j`` — MARS reserves
``num_nodes`` consecutive route ids per all-to-all, and the entry of node j's own part says
"local", so every part, the local one included, travels through the router and the parser).
Gather: parts arriving from every node (``src`` = part index) are written into a slot buffer at
their source's place, whatever the arrival order; when all ``num_nodes`` parts of a tag
(``kv_id``) are in, the assembled tensor leaves as one packet, parts in source order.

Structure: :class:`.a2a_scatter.A2AScatter` (the scatter pipeline and part framing), the
gather intake, slot table, buffer and watchdog here, and :class:`.a2a_emit.A2AEmit` (reads
complete gathers out of the buffer).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import MAX_PAYLOAD, parsed_layout
from mcf.abi.meta import META
from mcf.abi.nic import A2A_STATUS, WATCHDOG_BITS, A2ADrop

from .a2a_emit import A2AEmit
from .a2a_scatter import SCATTER_COUNTERS, A2AScatter, scatter_div_steps

__all__ = ["AllToAll"]


class AllToAll(wiring.Component):
    """Scatter / gather engine.

    Parameters: ``data_width``; ``max_nodes`` (largest ``num_nodes``); ``part_max`` (bytes per
    part, a multiple of the beat; default ``MAX_PAYLOAD // max_nodes`` rounded down to a beat,
    so that a whole tensor — a scatter request or a gathered result — is at most
    :data:`mcf.abi.framing.MAX_PAYLOAD` bytes); ``n_slots`` (gathers open at once).

    Members
    -------
    ``scatter``: ``In(stream.Signature(parsed_layout))`` — local tensors to scatter.
    ``net``: ``Out(stream.Signature(parsed_layout))`` — the parts (to a router local input).
    ``i``: ``In(stream.Signature(parsed_layout))`` — parts arriving (parser ALL_TO_ALL port).
    ``o``: ``Out(stream.Signature(parsed_layout))`` — gathered tensors: the first part's meta
        with ``src = dst = local_id``, ``seq = 0``, ``length = num_nodes × part``.
    ``local_id``, ``num_nodes``, ``timeout`` (watchdog cycles, 0 = off): ``In``.
    ``status``: ``Out(A2A_STATUS)``.

    Rules: parts must be whole beats; a scatter whose length is not ``num_nodes`` whole-beat
    parts is dropped (``scatter_drops``); bad, duplicate, foreign (``src ≥ num_nodes``) or
    unplaceable parts (every slot holds an incomplete gather) are dropped and counted
    (:class:`mcf.abi.nic.A2ADrop`); a part needing a slot while one only waits to be emitted
    waits for it (``i.ready`` low, bounded); a gather missing a part is freed by the watchdog
    (its timer pauses while the engine holds an offered part off). Rates: scatter 1 beat/cycle
    through a pipeline of :attr:`scatter_latency` stages (6 cycles with the 14-bit ``length``;
    ``length // num_nodes`` is divided there, no divider between two registers;
    ``scatter.ready`` depends combinationally on ``net.ready``); gather writes 1 beat/cycle; a
    complete gather starts streaming out 2 cycles after its last beat was written, at 1
    beat/cycle, and the next complete gather follows its last beat without a gap. A slot being
    read out is free for a new tag in the cycle its last beat is read (the read port returns the
    old word on a same-cycle write), so with 2 slots a stream of gathers is taken in and emitted
    at line rate. ``i.ready`` may depend combinationally on ``o.ready`` (that slot release).
    """

    def __init__(self, *, data_width: int = 64, max_nodes: int = 8, part_max: int | None = None,
                 n_slots: int = 2, meta_layout: data.StructLayout = META):
        bpb = data_width // 8
        if part_max is None:
            part_max = MAX_PAYLOAD // max_nodes // bpb * bpb
        if part_max % bpb:
            raise ValueError("part_max must be a multiple of the beat")
        self._dw, self._bpb = data_width, bpb
        self._max_nodes, self._part_max, self._slots = max_nodes, part_max, n_slots
        self._pbeats = part_max // bpb
        self._meta_layout = meta_layout
        beat = parsed_layout(data_width, meta_layout)
        node = meta_layout["src"].width
        super().__init__({
            "scatter": In(stream.Signature(beat)), "net": Out(stream.Signature(beat)),
            "i": In(stream.Signature(beat)), "o": Out(stream.Signature(beat)),
            "local_id": In(node), "num_nodes": In(node + 1), "timeout": In(WATCHDOG_BITS),
            "status": Out(A2A_STATUS),
        })

    @property
    def part_max(self) -> int:
        return self._part_max

    @property
    def n_slots(self) -> int:
        return self._slots

    @property
    def scatter_latency(self) -> int:
        """Cycles from a scatter beat's acceptance to its part beat on ``net`` (``net``
        ready): the division's stages plus the drop decision's."""
        return len(scatter_div_steps(self._meta_layout["length"].width)) + 1

    def elaborate(self, platform):
        m = Module()
        st = self.status
        bpb, N, S = self._bpb, self._max_nodes, self._slots
        pbits = max(1, (self._pbeats - 1).bit_length())
        nbits = max(1, (N - 1).bit_length())
        sbits = max(1, (S - 1).bit_length())
        lw = self._meta_layout["length"].width
        log_bpb = (bpb - 1).bit_length()

        # ---- scatter: re-frame one tensor into num_nodes parts ----------------------------------
        m.submodules.scatter = sc = A2AScatter(data_width=self._dw, max_nodes=N,
                                               part_max=self._part_max,
                                               meta_layout=self._meta_layout)
        wiring.connect(m, wiring.flipped(self.scatter), sc.scatter)
        wiring.connect(m, sc.net, wiring.flipped(self.net))
        m.d.comb += [sc.local_id.eq(self.local_id), sc.num_nodes.eq(self.num_nodes)]
        m.d.comb += [st[n].eq(sc.status[n]) for n in SCATTER_COUNTERS]

        # ---- gather -----------------------------------------------------------------------------
        i = self.i
        meta = i.payload.meta
        g_valid = Signal(S)
        g_done = Signal(S)               # every part written: waiting to be emitted
        g_tag = [Signal.like(meta.kv_id, name=f"gtag{s}") for s in range(S)]
        g_len = [Signal(lw, name=f"glen{s}") for s in range(S)]
        g_have = [Signal(N, name=f"ghave{s}") for s in range(S)]
        g_meta = [Signal(self._meta_layout, name=f"gmeta{s}") for s in range(S)]
        g_timer = [Signal(WATCHDOG_BITS, name=f"gtimer{s}") for s in range(S)]

        m.submodules.buf = buf = Memory(shape=unsigned(self._dw), depth=S * N * self._pbeats,
                                        init=[])
        wp = buf.write_port()
        rp = buf.read_port()

        in_pkt = Signal()
        c_drop = Signal()
        c_slot = Signal(range(S))
        c_src = Signal(nbits)
        bidx = Signal(pbits)
        hits = Signal(S)
        m.d.comb += hits.eq(Cat(g_valid[s] & ~g_done[s] & (g_tag[s] == meta.kv_id)
                                for s in range(S)))
        hit = hits != 0
        hit_idx = Signal(range(S))
        free_idx = Signal(range(S))
        # a slot whose last beat is being read out this cycle (``freeing``) is free already:
        # a new part may take it at once (its beat-0 write cannot reach the address being read
        # before the read, and the read port returns the old word on a same-cycle write)
        freeing = Signal(S)
        g_free = Signal(S)
        m.d.comb += g_free.eq(~g_valid | freeing)
        for s in reversed(range(S)):
            with m.If(hits[s]):
                m.d.comb += hit_idx.eq(s)
            with m.If(g_free[s]):
                m.d.comb += free_idx.eq(s)
        plen_i = meta.length
        # per slot, in parallel with the match (no multiplexer addressed by hit_idx): the
        # lowest open slot of the tag (first_hit) and the lowest free one (first_free); the
        # length check and the duplicate test are the first hit's; Mux(hit, first_hit,
        # first_free) is slot_sel one-hot
        first_hit = Signal(S)
        first_free = Signal(S)
        m.d.comb += [first_hit.eq(hits & ~Cat(hits[:s].any() for s in range(S))),
                     first_free.eq(g_free & ~Cat(g_free[:s].any() for s in range(S)))]
        len_ne = Cat(g_len[s] != plen_i for s in range(S))
        have_src = Cat((g_have[s] >> meta.src)[0] for s in range(S))
        len_mm = (first_hit & len_ne).any()
        bad_len0 = (plen_i == 0) | (plen_i[:log_bpb] != 0) | (plen_i > self._part_max)
        bad_len = bad_len0 | len_mm
        bad_src = (meta.src >= self.num_nodes) | (meta.src >= N)
        dup = (first_hit & have_src).any()
        full_slots = ~hit & (g_free == 0)
        no_slot = full_slots & (g_done == 0)
        cause = Signal(len(A2ADrop))
        m.d.comb += cause.eq(Cat(bad_len, ~bad_len & dup, ~bad_len & ~dup & ~bad_src & no_slot,
                                 ~bad_len & ~dup & bad_src))
        head_drop = cause != 0
        slot_sel = Mux(hit, hit_idx, free_idx)
        # all slots taken but one is complete: wait for its emission to free it (bounded);
        # without a hit no first_hit bit is set, so len_mm and dup are 0 there (not on the path)
        wait = (~in_pkt & ~hit & (g_free == 0) & ((g_done & ~freeing) != 0) & ~bad_len0
                & ~bad_src)
        # take[s] == (slot_sel == s) & ~head_drop, per slot from its own terms: with a hit on
        # s, no_slot is 0 and len_mm / dup are s's; a free slot means no_slot is 0; either way
        # i.ready is high (wait needs no hit and no free slot)
        take = Cat(~bad_len0 & ~bad_src & ((first_hit[s] & ~len_ne[s] & ~have_src[s])
                                           | (~hit & first_free[s])) for s in range(S))
        m.d.comb += i.ready.eq(~wait)
        fire = i.valid & i.ready
        head = fire & ~in_pkt
        cur_drop_g = Mux(in_pkt, c_drop, head_drop)
        cur_slot = Mux(in_pkt, c_slot, slot_sel)
        cur_src = Mux(in_pkt, c_src, meta.src[:nbits])
        cur_b = Mux(in_pkt, bidx, 0)
        m.d.comb += [wp.addr.eq(Cat(cur_b, cur_src, cur_slot[:sbits] if S > 1 else [])),
                     wp.data.eq(i.payload.data), wp.en.eq(fire & ~cur_drop_g)]
        with m.If(fire):
            m.d.sync += [in_pkt.eq(~i.payload.last), bidx.eq(Mux(i.payload.last, 0, cur_b + 1))]
        with m.If(head):
            m.d.sync += [c_drop.eq(head_drop), c_slot.eq(slot_sel), c_src.eq(meta.src[:nbits]),
                         st.rx_parts.eq(st.rx_parts + 1)]
            for c in A2ADrop:
                with m.If(cause[c.value]):
                    name = f"drop_{c.name.lower()}"
                    m.d.sync += st[name].eq(st[name] + 1)

        # ---- emission of complete gathers -------------------------------------------------------
        m.submodules.emit = emit = A2AEmit(data_width=self._dw, max_nodes=N,
                                           part_beats=self._pbeats, n_slots=S,
                                           meta_layout=self._meta_layout)
        for s in range(S):
            m.d.comb += [emit.slots[s].done.eq(g_done[s]), emit.slots[s].len.eq(g_len[s]),
                         emit.slots[s].meta.eq(g_meta[s])]
        m.d.comb += [emit.local_id.eq(self.local_id), emit.num_nodes.eq(self.num_nodes),
                     rp.addr.eq(emit.rd_addr), rp.en.eq(emit.rd_en), emit.rd_data.eq(rp.data),
                     freeing.eq(emit.freeing), st.gathers_done.eq(emit.status.gathers_done)]
        wiring.connect(m, emit.o, wiring.flipped(self.o))

        # ---- slot table and watchdog ------------------------------------------------------------
        trips = Signal(S)
        # the watchdog counts cycles the engine could accept in: it pauses (and cannot trip)
        # while the engine itself holds an offered part off (waiting for a slot to drain)
        refusing = i.valid & ~i.ready
        for s in range(S):
            # a head accepted into slot s (slot_sel == s): take[s] is that decision per slot,
            # and ready is high whenever it is set (a new tag is accepted only while a slot is
            # free)
            take_s = i.valid & ~in_pkt & take[s]
            active = (in_pkt & (c_slot == s)) | take_s
            m.d.comb += trips[s].eq(g_valid[s] & ~g_done[s] & ~active & (self.timeout != 0)
                                    & ~refusing & (g_timer[s] >= self.timeout))
            # the part set after a taken head (accept is true wherever this is used)
            have_take = Mux(hit, g_have[s], 0) | (Const(1, N) << meta.src[:nbits])
            with m.If(freeing[s]):
                m.d.sync += [g_done[s].eq(0), g_valid[s].eq(0), g_have[s].eq(0)]
            with m.If(take_s):
                m.d.sync += [g_timer[s].eq(0), g_have[s].eq(have_take)]
                with m.If(~hit):
                    m.d.sync += [g_valid[s].eq(1), g_tag[s].eq(meta.kv_id), g_len[s].eq(plen_i),
                                 g_meta[s].eq(meta)]
            with m.Elif(active):
                m.d.sync += g_timer[s].eq(0)
            with m.Elif(trips[s]):
                m.d.sync += [g_valid[s].eq(0), g_have[s].eq(0), g_timer[s].eq(0)]
            with m.Elif(g_valid[s] & ~g_done[s] & ~refusing):
                m.d.sync += g_timer[s].eq(g_timer[s] + 1)
            # complete when the last beat of the part that fills the set is written: inside a
            # packet (ready is high there) the kept part's slot, on a head beat a take of s
            # (i.ready high, the set after it have_take)
            all_mask = ((Const(1, N + 1) << self.num_nodes) - 1)[:N]
            full_g = (g_have[s] & all_mask) == all_mask
            full_t = (have_take & all_mask) == all_mask
            with m.If(i.valid & i.payload.last
                      & Mux(in_pkt, ~c_drop & (c_slot == s) & full_g, take[s] & full_t)):
                m.d.sync += g_done[s].eq(1)
        m.d.sync += st.watchdog_trips.eq(st.watchdog_trips + sum(trips[s] for s in range(S)))
        return m

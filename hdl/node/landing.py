"""KV landing engine: ``Op.KV_REPLICA`` packets → their ``kv_id``'s slot in DDR, one land event
per packet to the directory after the write is acknowledged (docs/node.md §5 "Landing engine",
"Directory"; §6 rule 1: the landing engine is a sink that always drains; paper §5, KV blocks
landing in DDR).

The address rule, the ``LAND_OFF`` table, the configuration and the status counters are
:mod:`mcf.abi.landing`'s; :func:`mcf.abi.landing.land_decision` is the golden model.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.directory import LAND_EVENT
from mcf.abi.framing import MAX_PAYLOAD, parsed_layout
from mcf.abi.landing import (
    LAND_OFF_ENTRIES,
    LAND_OFF_ENTRY,
    LANDING_CONFIG,
    LANDING_STATUS,
)
from mcf.abi.meta import META, Op

from ..mem.axi import (
    ADDR_BITS,
    BOUNDARY_BYTES,
    MAX_BURST_BEATS,
    AXI4Signature,
    AxiResp,
    descriptor_layout,
)
from ..mem.dma import DmaWriter

__all__ = ["LandingEngine"]

PACKET_WIDTH = 64   # docs/node.md §1: every packet stream is 64 bits


class LandingEngine(wiring.Component):
    """Lands ``Op.KV_REPLICA`` fragments at ``KV_BASE + kv_id · KV_SLOT + LAND_OFF[seq]``.

    Parameters
    ----------
    kv_count : int
        Directory depth (``Directory(kv_count)``: ``sim`` 256, ``kr260`` 65,536). A ``kv_id`` at
        or above it, or at or above ``cfg.kv_count``, is unmapped.
    axi_width : int
        Data width of the AXI4 write master (128, the HP port); a multiple of 64.
    fifo_depth : int
        Payload FIFO entries (``axi_width``-bit beats) between the upsizer and the writer.
    event_depth : int
        Land events buffered for a directory that is not ready (its clear walk); when full, B
        responses wait, then the writer, then the input.

    Members
    -------
    i : In(stream.Signature(parsed_layout(64)))
        Parsed beats, ``Meta`` beside every beat, ``last`` on the final one; framing as the
        parser guarantees it (``ceil(length / 8)`` beats, a header-only packet one beat with
        ``keep == 0``). The writer is given ``length`` bytes per packet; ``keep`` is not used.
    cfg : In(:data:`mcf.abi.landing.LANDING_CONFIG`)
        ``kv_base``, ``kv_slot``, ``kv_count`` (CSRs later); sampled on each packet's first beat.
    land_off_we, land_off_seq, land_off_data : In
        ``LAND_OFF`` write port: one entry (:data:`mcf.abi.landing.LAND_OFF_ENTRY`) per cycle
        with ``land_off_we``. Write it while no packet is arriving.
    local_id : In(``Meta.src`` width)
        This node's id (``NODE.local_id``): a packet with ``meta.src == local_id`` is a local
        copy (an EMIT's tee); sampled on each packet's first beat.
    landed : Out(stream.Signature(:data:`mcf.abi.directory.LAND_EVENT`))
        One event per landed packet (``kv_id``, ``owner`` = it was a local copy), in input
        order, after the packet's last B response answered OKAY (a reader of the directory never
        sees a counted-but-unwritten packet); never for a dropped packet or a write error. To
        ``Directory.land``.
    m_axi : Out(AXI4Signature(data_width=axi_width))
        Write master (AW/W/B; AR/R tied off). Bursts INCR, never across 4 KiB.
    status : Out(:data:`mcf.abi.landing.LANDING_STATUS`)
        ``packets``/``bytes`` landed (= events emitted), ``drop_unmapped``, ``drop_bad_seq``,
        ``drop_op``,
        ``write_errors`` (a packet whose burst answered SLVERR/DECERR: not landed),
        ``framing_errors`` (a landing packet whose beats disagreed with ``length``: padded
        with zeros or cut to ``length``, so the writer never waits for missing data).

    Structure and latency: beat → register stage 1 (``LAND_OFF`` read, ``kv_id · KV_SLOT``
    multiply) → stage 2 (address, checks: the packet's fate is latched on its first beat) →
    64 → ``axi_width`` upsizer (packs a packet's beats from lane 0, flushes at its final beat) →
    payload FIFO → :class:`mcf.hdl.mem.dma.DmaWriter`, one descriptor per packet (the writer
    aligns with ``wstrb``). The upsizer sits between the decision stage and the payload FIFO,
    so the FIFO and the writer run at ``axi_width``. The first AW is valid ~7 cycles after the
    header beat is taken (AXI slave ready). A packet's ``status`` counts change, and its event
    enters the event FIFO, on its last B handshake (its bursts' responses are matched in order:
    one AXI ID, one or two bursts per packet); ``landed.valid`` rises one cycle later. At most
    one event per packet, so ≤ one per cycle, ≤ one per 2 cycles for ≥ 9-byte packets; the
    ``Directory`` takes one per cycle. Throughput:
    one input beat per cycle, no bubble between packets (measured: 0.995-0.999 payload beats
    per cycle for 120-2,040-B fragments, ``tests/test_node_landing.py::test_landing_rate``).

    Stream rules: ``i.ready`` depends only on the engine's registers and FIFO levels (never
    on ``i.valid``). Dropped packets are consumed at one beat per cycle and never wait for
    DDR themselves (only behind landing packets ahead of them). Every beat is taken: no input
    stalls forever while the AXI slave answers.
    """

    def __init__(self, kv_count: int = 256, axi_width: int = 128,
                 addr_width: int = ADDR_BITS, outstanding: int = 8, fifo_depth: int = 64,
                 event_depth: int = 8):
        kv_max = 1 << META["kv_id"].width
        if not 1 <= kv_count <= kv_max:
            raise ValueError(f"kv_count must lie in 1..{kv_max}")
        if axi_width % PACKET_WIDTH:
            raise ValueError(f"axi_width must be a multiple of {PACKET_WIDTH}")
        bb = axi_width // 8
        # a packet's row of at most MAX_PAYLOAD bytes needs at most two bursts
        if (MAX_PAYLOAD + 2 * bb - 2) // bb > min(MAX_BURST_BEATS, BOUNDARY_BYTES // bb) + 1:
            raise ValueError("a MAX_PAYLOAD packet would need more than two bursts")
        self.kv_count, self.axi_width, self.addr_width = kv_count, axi_width, addr_width
        self.outstanding, self.fifo_depth, self.event_depth = outstanding, fifo_depth, \
            event_depth
        self.writer = DmaWriter(axi_width, addr_width, outstanding)
        super().__init__({
            "i": In(stream.Signature(parsed_layout(PACKET_WIDTH))),
            "cfg": In(LANDING_CONFIG),
            "land_off_we": In(1),
            "land_off_seq": In(META["seq"].width),
            "land_off_data": In(LAND_OFF_ENTRY),
            "local_id": In(META["src"].width),
            "landed": Out(stream.Signature(LAND_EVENT)),
            "m_axi": Out(AXI4Signature(addr_width, axi_width)),
            "status": Out(LANDING_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self.addr_width
        bb = self.axi_width // 8
        lb = (bb - 1).bit_length()
        ratio = self.axi_width // PACKET_WIDTH
        st = self.status
        cfg = self.cfg
        len_bits = META["length"].width

        # --- LAND_OFF table --------------------------------------------------------------
        m.submodules.land_off = lo_mem = memory.Memory(shape=LAND_OFF_ENTRY,
                                                       depth=LAND_OFF_ENTRIES, init=[])
        lo_wr = lo_mem.write_port()
        m.d.comb += [lo_wr.en.eq(self.land_off_we), lo_wr.addr.eq(self.land_off_seq),
                     lo_wr.data.eq(self.land_off_data)]
        lo_rd = lo_mem.read_port()

        # --- stage 1: beat register, table read, slot multiply ---------------------------
        beat_l = data.StructLayout({
            "data": unsigned(PACKET_WIDTH), "last": unsigned(1), "first": unsigned(1),
            "op": Op, "kv_id": unsigned(META["kv_id"].width), "length": unsigned(len_bits),
            "src": unsigned(META["src"].width)})
        s1 = Signal(beat_l)
        s1_valid = Signal()
        s1_prod = Signal(META["kv_id"].width + LANDING_CONFIG["kv_slot"].shape.width)
        s1_move = Signal()
        in_first = Signal(init=1)
        take = Signal()
        m.d.comb += [self.i.ready.eq(~s1_valid | s1_move), take.eq(self.i.valid & self.i.ready),
                     lo_rd.en.eq(take), lo_rd.addr.eq(self.i.payload.meta.seq)]
        meta = self.i.payload.meta
        with m.If(take):
            m.d.sync += [s1.data.eq(self.i.payload.data), s1.last.eq(self.i.payload.last),
                         s1.first.eq(in_first), s1.op.eq(meta.op), s1.kv_id.eq(meta.kv_id),
                         s1.length.eq(meta.length), s1.src.eq(meta.src), s1_valid.eq(1),
                         in_first.eq(self.i.payload.last),
                         s1_prod.eq(meta.kv_id * cfg.kv_slot)]
        with m.Elif(s1_move):
            m.d.sync += s1_valid.eq(0)

        # --- stage 2: the packet's fate and address (latched on its first beat) ----------
        entry = lo_rd.data
        op_ok = Signal()
        mapped = Signal()
        seq_ok = Signal()
        m.d.comb += [
            op_ok.eq(s1.op == Op.KV_REPLICA),
            mapped.eq((s1.kv_id < cfg.kv_count) & (s1.kv_id < self.kv_count)),
            seq_ok.eq(entry.valid & (s1.length != 0) & (s1.length <= MAX_PAYLOAD) &
                      (entry.offset + s1.length <= cfg.kv_slot)),
        ]
        s2 = Signal(data.StructLayout({
            "data": unsigned(PACKET_WIDTH), "last": unsigned(1), "first": unsigned(1),
            "keep": unsigned(1), "kv_id": unsigned(META["kv_id"].width), "owner": unsigned(1),
            "length": unsigned(len_bits), "addr": unsigned(aw)}))
        s2_valid = Signal()
        s2_move = Signal()
        pkt_keep = Signal()
        m.d.comb += s1_move.eq(s1_valid & (~s2_valid | s2_move))
        with m.If(s1_move):
            m.d.sync += [s2.data.eq(s1.data), s2.last.eq(s1.last), s2.first.eq(s1.first),
                         s2.kv_id.eq(s1.kv_id), s2.length.eq(s1.length),
                         s2.owner.eq(s1.src == self.local_id),
                         s2.addr.eq(cfg.kv_base + s1_prod + entry.offset), s2_valid.eq(1)]
            with m.If(s1.first):
                keep = op_ok & mapped & seq_ok
                m.d.sync += [s2.keep.eq(keep), pkt_keep.eq(keep)]
                with m.If(~op_ok):
                    m.d.sync += st.drop_op.eq(st.drop_op + 1)
                with m.Elif(~mapped):
                    m.d.sync += st.drop_unmapped.eq(st.drop_unmapped + 1)
                with m.Elif(~seq_ok):
                    m.d.sync += st.drop_bad_seq.eq(st.drop_bad_seq + 1)
            with m.Else():
                m.d.sync += s2.keep.eq(pkt_keep)
        with m.Elif(s2_move):
            m.d.sync += s2_valid.eq(0)

        # --- descriptors, pending completions, upsizer, payload FIFO ---------------------
        desc_l = descriptor_layout(aw)
        m.submodules.desc_fifo = desc_fifo = fifo.SyncFIFOBuffered(width=desc_l.size, depth=4)
        pend_l = data.StructLayout({"kv_id": unsigned(META["kv_id"].width),
                                    "owner": unsigned(1), "length": unsigned(len_bits),
                                    "two": unsigned(1)})
        pend_depth = 4 + self.outstanding + 4
        m.submodules.pend_fifo = pend = fifo.SyncFIFOBuffered(width=pend_l.size,
                                                              depth=pend_depth)
        m.submodules.pay_fifo = pay = fifo.SyncFIFOBuffered(width=self.axi_width,
                                                            depth=self.fifo_depth)

        # bursts of the row as DmaWriter cuts it: one, or two when it crosses a 4 KiB page
        # (or exceeds a maximum burst, possible only for narrow writers)
        total = Signal(len_bits + 1)
        to_4k = Signal(range(BOUNDARY_BYTES // bb + 1))
        first_n = Signal.like(to_4k)
        m.d.comb += [total.eq((s2.addr[:lb] + s2.length + (bb - 1)) >> lb),
                     to_4k.eq((BOUNDARY_BYTES - Cat(Const(0, lb), s2.addr[lb:12])) >> lb),
                     first_n.eq(Mux(to_4k < MAX_BURST_BEATS, to_4k, MAX_BURST_BEATS))]

        up_acc = Signal(self.axi_width)
        up_cnt = Signal(range(ratio))
        up_ready = Signal()
        m.d.comb += up_ready.eq(pay.w_rdy)
        head_ok = Signal()
        m.d.comb += head_ok.eq(desc_fifo.w_rdy & pend.w_rdy)
        # framing guard: exactly ceil(length / 8) beats reach the writer whatever the input
        # does (a short packet is padded with zero beats, a long one cut), so the writer never
        # waits for data that will not come; cannot happen behind a parser (TRUNCATED and
        # BAD_LENGTH drops), counted in framing_errors
        n64 = Signal(len_bits - 2)
        j = Signal(len_bits - 2)
        j_cur = Signal(len_bits - 2)
        m.d.comb += [n64.eq((s2.length + 7) >> 3), j_cur.eq(Mux(s2.first, 0, j))]
        extra = Signal()
        short = Signal()
        final = Signal()
        m.d.comb += [extra.eq(j_cur >= n64), final.eq(j_cur == n64 - 1),
                     short.eq(s2.last & (j_cur < n64 - 1))]
        push = Signal()
        m.d.comb += push.eq(s2_valid & s2.keep & ~extra & up_ready & (~s2.first | head_ok))
        m.d.comb += s2_move.eq(s2_valid & (~s2.keep | extra | (push & ~short)))
        with m.If(push):
            m.d.sync += j.eq(j_cur + 1)
        with m.If(push & short):            # stay: pad with zero beats up to the length
            m.d.sync += [s2.data.eq(0), s2.first.eq(0)]
        frame_bad = Signal()
        bad_now = (push & short) | (s2_valid & s2.keep & extra)
        with m.If(s2_move & s2.keep & s2.last):
            m.d.sync += frame_bad.eq(0)
            with m.If(frame_bad | bad_now):
                m.d.sync += st.framing_errors.eq(st.framing_errors + 1)
        with m.Elif(bad_now):
            m.d.sync += frame_bad.eq(1)
        desc = Signal(desc_l)
        m.d.comb += [desc.addr.eq(s2.addr), desc.length.eq(s2.length), desc.stride.eq(0),
                     desc.count.eq(1)]
        with m.If(push & s2.first):
            m.d.comb += [
                desc_fifo.w_en.eq(1),
                desc_fifo.w_data.eq(desc),
                pend.w_en.eq(1),
                pend.w_data.eq(Cat(s2.kv_id, s2.owner, s2.length, total > first_n)),
            ]
        lanes = [Mux(up_cnt == k, s2.data, up_acc[k * PACKET_WIDTH:(k + 1) * PACKET_WIDTH])
                 for k in range(ratio)]
        with m.If(push):
            flush = final | (up_cnt == ratio - 1)
            with m.If(flush):
                m.d.comb += [pay.w_en.eq(1), pay.w_data.eq(Cat(*lanes))]
                m.d.sync += [up_acc.eq(0), up_cnt.eq(0)]
            with m.Else():
                m.d.sync += [up_acc.eq(Cat(*lanes)), up_cnt.eq(up_cnt + 1)]

        # --- the writer ------------------------------------------------------------------
        m.submodules.writer = wr = self.writer
        m.d.comb += [wr.desc.valid.eq(desc_fifo.r_rdy), desc_fifo.r_en.eq(wr.desc.ready),
                     wr.desc.payload.eq(desc_fifo.r_data)]
        wiring.connect(m, pay.r_stream, wr.i)
        m.submodules.event_fifo = ev = fifo.SyncFIFOBuffered(width=LAND_EVENT.size,
                                                             depth=self.event_depth)
        bus = self.m_axi
        for n in ("awaddr", "awlen", "awsize", "awburst", "awid", "awcache", "awprot",
                  "awvalid", "wdata", "wstrb", "wlast", "wvalid"):
            m.d.comb += getattr(bus, n).eq(getattr(wr.bus, n))
        for n in ("awready", "wready", "bresp", "bid"):
            m.d.comb += getattr(wr.bus, n).eq(getattr(bus, n))
        # B responses wait while the event FIFO is full (a directory still clearing)
        m.d.comb += [bus.bready.eq(wr.bus.bready & ev.w_rdy),
                     wr.bus.bvalid.eq(bus.bvalid & ev.w_rdy),
                     bus.arvalid.eq(0), bus.rready.eq(0)]

        # --- completions: B responses in order, two per packet crossing a page ----------
        head = data.View(pend_l, pend.r_data)
        b_seen = Signal()
        b_err = Signal()
        b_fire = Signal()
        m.d.comb += b_fire.eq(bus.bvalid & bus.bready)
        err_now = b_err | (bus.bresp != AxiResp.OKAY)
        done = Signal()
        m.d.comb += done.eq(b_fire & pend.r_rdy & (b_seen == head.two))
        with m.If(b_fire):
            m.d.sync += [b_seen.eq(~done), b_err.eq(Mux(done, 0, err_now))]
        m.d.comb += pend.r_en.eq(done)

        # --- land events: one per packet written without error ---------------------------
        ok = Signal()
        m.d.comb += [ok.eq(done & ~err_now), ev.w_en.eq(ok),
                     ev.w_data.eq(Cat(head.kv_id, head.owner))]
        wiring.connect(m, ev.r_stream, wiring.flipped(self.landed))
        with m.If(done & err_now):
            m.d.sync += st.write_errors.eq(st.write_errors + 1)
        with m.If(ok):
            m.d.sync += [st.packets.eq(st.packets + 1), st.bytes.eq(st.bytes + head.length)]
        return m

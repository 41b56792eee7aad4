"""KV landing engine: ``Op.KV_REPLICA`` packets → their ``kv_id``'s slot in DDR, one land event
per packet to the directory after the write is acknowledged (docs/node.md §5 "Landing engine",
"Directory"; §6 rule 1: the landing engine is a sink that always drains; paper §5, KV blocks
landing in DDR).

The address rule, the ``LAND_OFF`` table, the configuration and the status counters are
:mod:`mcf.abi.landing`'s; :func:`mcf.abi.landing.land_decision` is the golden model.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.directory import LAND_EVENT
from mcf.abi.framing import MAX_PAYLOAD, parsed_layout
from mcf.abi.landing import KV_ALIGN, LANDING_STATUS
from mcf.abi.meta import META, Op

from ..mem.axi import ADDR_BITS, AXI4Signature
from .kv_address import KvAddress, kv_table_members
from .packet_writer import PACKET_WIDTH, LandingStage, PacketUpsizer, PacketWriter

__all__ = ["LandingEngine"]


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
    multiply: :class:`~mcf.hdl.node.kv_address.KvAddress`) → stage 2 and framing guard
    (:class:`~mcf.hdl.node.packet_writer.LandingStage`: the packet's fate, address and tag
    latched on its first beat; exactly ``ceil(length / 8)`` beats go on) → 64 → ``axi_width``
    upsizer
    (:class:`~mcf.hdl.node.packet_writer.PacketUpsizer`: packs a packet's beats from lane 0,
    flushes at its final beat) → :class:`~mcf.hdl.node.packet_writer.PacketWriter` (payload
    FIFO, :class:`mcf.hdl.mem.dma.DmaWriter`, one descriptor per packet pushed with its first
    beat; the writer aligns by 32-bit words with ``wstrb``, every address a multiple of
    :data:`~mcf.abi.landing.KV_ALIGN`). A beat goes on only while the payload FIFO has
    room, so the FIFO and the writer run at ``axi_width``. The first AW is valid ~7 cycles after the
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

    PEND = data.StructLayout({"kv_id": unsigned(META["kv_id"].width), "owner": unsigned(1),
                              "length": unsigned(META["length"].width)})
    """What a packet's write carries to its completion (the :class:`PacketWriter` tag)."""

    def __init__(self, kv_count: int = 256, axi_width: int = 128,
                 addr_width: int = ADDR_BITS, outstanding: int = 8, fifo_depth: int = 64,
                 event_depth: int = 8):
        kv_max = 1 << META["kv_id"].width
        if not 1 <= kv_count <= kv_max:
            raise ValueError(f"kv_count must lie in 1..{kv_max}")
        self.kv_count, self.axi_width, self.addr_width = kv_count, axi_width, addr_width
        self.outstanding, self.fifo_depth, self.event_depth = outstanding, fifo_depth, \
            event_depth
        self.stage_info = data.StructLayout({"addr": unsigned(addr_width),
                                              "kv_id": unsigned(META["kv_id"].width),
                                              "owner": unsigned(1)})
        self.writer = PacketWriter(self.PEND, axi_width=axi_width, addr_width=addr_width,
                                   outstanding=outstanding, fifo_depth=fifo_depth,
                                   align=KV_ALIGN)
        super().__init__({
            "i": In(stream.Signature(parsed_layout(PACKET_WIDTH))),
            **kv_table_members(),
            "local_id": In(META["src"].width),
            "landed": Out(stream.Signature(LAND_EVENT)),
            "m_axi": Out(AXI4Signature(addr_width, axi_width)),
            "status": Out(LANDING_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self.addr_width
        st = self.status
        cfg = self.cfg

        # --- LAND_OFF table and the slot address -----------------------------------------
        m.submodules.kv_addr = kv = KvAddress(aw)
        kv.connect_table(m, self)

        # --- stage 1: beat register, table read, slot multiply ---------------------------
        beat_l = data.StructLayout({
            "data": unsigned(PACKET_WIDTH), "last": unsigned(1), "first": unsigned(1),
            "op": Op, "kv_id": unsigned(META["kv_id"].width),
            "length": unsigned(META["length"].width), "src": unsigned(META["src"].width)})
        s1 = Signal(beat_l)
        s1_valid = Signal()
        s1_move = Signal()
        in_first = Signal(init=1)
        take = Signal()
        meta = self.i.payload.meta
        m.d.comb += [self.i.ready.eq(~s1_valid | s1_move), take.eq(self.i.valid & self.i.ready),
                     kv.take.eq(take), kv.kv_id.eq(meta.kv_id), kv.seq.eq(meta.seq)]
        with m.If(take):
            m.d.sync += [s1.data.eq(self.i.payload.data), s1.last.eq(self.i.payload.last),
                         s1.first.eq(in_first), s1.op.eq(meta.op), s1.kv_id.eq(meta.kv_id),
                         s1.length.eq(meta.length), s1.src.eq(meta.src), s1_valid.eq(1),
                         in_first.eq(self.i.payload.last)]
        with m.Elif(s1_move):
            m.d.sync += s1_valid.eq(0)

        # --- stage 2: the packet's fate and address (latched on its first beat), the framing
        # guard (exactly ceil(length / 8) beats go on) → upsizer → writer -----------------
        op_ok = Signal()
        mapped = Signal()
        seq_ok = Signal()
        m.d.comb += [
            kv.length.eq(s1.length),
            op_ok.eq(s1.op == Op.KV_REPLICA),
            mapped.eq((s1.kv_id < cfg.kv_count) & (s1.kv_id < self.kv_count)),
            seq_ok.eq(kv.fits & (s1.length != 0) & (s1.length <= MAX_PAYLOAD)),
        ]
        m.submodules.stage = stage = LandingStage(self.stage_info)
        m.d.comb += [stage.i.valid.eq(s1_valid), s1_move.eq(s1_valid & stage.i.ready),
                     stage.i.payload.data.eq(s1.data), stage.i.payload.first.eq(s1.first),
                     stage.i.payload.last.eq(s1.last), stage.i.payload.length.eq(s1.length),
                     stage.i.payload.keep.eq(op_ok & mapped & seq_ok),
                     stage.i.payload.info.addr.eq(kv.addr),
                     stage.i.payload.info.kv_id.eq(s1.kv_id),
                     stage.i.payload.info.owner.eq(s1.src == self.local_id)]
        with m.If(s1_move & s1.first):
            with m.If(~op_ok):
                m.d.sync += st.drop_op.eq(st.drop_op + 1)
            with m.Elif(~mapped):
                m.d.sync += st.drop_unmapped.eq(st.drop_unmapped + 1)
            with m.Elif(~seq_ok):
                m.d.sync += st.drop_bad_seq.eq(st.drop_bad_seq + 1)
        with m.If(stage.framing_error):
            m.d.sync += st.framing_errors.eq(st.framing_errors + 1)

        m.submodules.writer = wr = self.writer
        m.submodules.upsizer = up = PacketUpsizer(self.axi_width)
        wiring.connect(m, up.o, wr.i)
        # a beat goes on while the payload FIFO has room (then the upsizer is ready), a first
        # beat only with its write head
        beat = stage.o.payload
        m.d.comb += [stage.o.ready.eq(wr.i.ready & (~beat.first | wr.head.ready)),
                     wr.head.valid.eq(stage.o.valid & wr.i.ready & beat.first),
                     wr.head.payload.addr.eq(beat.info.addr),
                     wr.head.payload.length.eq(beat.length),
                     wr.head.payload.tag.kv_id.eq(beat.info.kv_id),
                     wr.head.payload.tag.owner.eq(beat.info.owner),
                     wr.head.payload.tag.length.eq(beat.length),
                     up.i.valid.eq(stage.o.valid & stage.o.ready),
                     up.i.payload.data.eq(beat.data), up.i.payload.last.eq(beat.final)]
        wiring.connect(m, wr.bus, wiring.flipped(self.m_axi))

        # --- land events: one per packet written without error ---------------------------
        m.submodules.event_fifo = ev = fifo.SyncFIFOBuffered(width=LAND_EVENT.size,
                                                             depth=self.event_depth)
        done = wr.done
        head = done.payload.tag
        ok = Signal()
        m.d.comb += [done.ready.eq(ev.w_rdy),       # B responses wait while the FIFO is full
                     ok.eq(done.valid & done.ready & ~done.payload.err), ev.w_en.eq(ok),
                     ev.w_data.eq(Cat(head.kv_id, head.owner))]
        wiring.connect(m, ev.r_stream, wiring.flipped(self.landed))
        with m.If(done.valid & done.ready & done.payload.err):
            m.d.sync += st.write_errors.eq(st.write_errors + 1)
        with m.If(ok):
            m.d.sync += [st.packets.eq(st.packets + 1), st.bytes.eq(st.bytes + head.length)]
        return m

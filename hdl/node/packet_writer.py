"""Packet writer of the node's landing engines: one DDR write per packet — a write head (address,
byte length, a tag) and the packet's ``axi_width``-bit payload words → AXI4 write bursts, then
one completion per packet (its tag, whether a burst answered an error) once the packet's last B
response arrives (docs/node.md §5 "Landing engine"). Used by
:class:`mcf.hdl.node.landing.LandingEngine` and :class:`mcf.hdl.node.decode_land.DecodeLander`;
:class:`LandingStage` (their beat register, fate and :class:`FramingGuard`) feeds them and
:class:`PacketUpsizer` packs their 64-bit beats into the writer's words.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.meta import META

from ..mem import axi
from ..mem.dma import DmaWriter

__all__ = ["PacketWriter", "PacketUpsizer", "FramingGuard", "LandingStage", "packet_beat_layout",
           "write_head_layout", "write_done_layout", "stage_in_layout", "stage_out_layout"]

PACKET_WIDTH = 64   # docs/node.md §1: every packet stream is 64 bits


def packet_beat_layout(width: int = PACKET_WIDTH) -> data.StructLayout:
    """A packet's payload beat without its Meta: ``data`` and ``last``."""
    return data.StructLayout({"data": unsigned(width), "last": unsigned(1)})


def write_head_layout(addr_width: int, tag) -> data.StructLayout:
    """A packet's write: byte address, byte length (``Meta.length`` wide), and ``tag`` (any
    shape: what the owner needs back at the packet's completion)."""
    return data.StructLayout({"addr": unsigned(addr_width),
                              "length": unsigned(META["length"].width), "tag": tag})


def write_done_layout(tag) -> data.StructLayout:
    """A packet's completion: its ``tag`` and ``err`` (a burst answered SLVERR/DECERR)."""
    return data.StructLayout({"tag": tag, "err": unsigned(1)})


class PacketUpsizer(wiring.Component):
    """64-bit packet beats → ``width``-bit words: each packet's beats packed from lane 0, the
    word flushed when full or at the packet's ``last`` beat (so every packet starts a word).

    Members
    -------
    i : In(stream.Signature(packet_beat_layout(64)))
    o : Out(stream.Signature(unsigned(width)))

    Latency 0 (``o`` is combinational on the beat that completes a word); one beat per cycle.
    ``o.valid`` depends only on ``i.valid`` and the lane count; ``i.ready`` is high except
    while a completing beat waits for ``o.ready``.
    """

    def __init__(self, width: int = 128):
        if width % PACKET_WIDTH:
            raise ValueError(f"width must be a multiple of {PACKET_WIDTH}")
        self.width = width
        super().__init__({
            "i": In(stream.Signature(packet_beat_layout())),
            "o": Out(stream.Signature(unsigned(width))),
        })

    def elaborate(self, platform):
        m = Module()
        ratio = self.width // PACKET_WIDTH
        acc = Signal(self.width)
        cnt = Signal(range(ratio))
        lanes = Cat(*(Mux(cnt == k, self.i.payload.data,
                          acc[k * PACKET_WIDTH:(k + 1) * PACKET_WIDTH]) for k in range(ratio)))
        flush = Signal()
        m.d.comb += [flush.eq(self.i.payload.last | (cnt == ratio - 1)),
                     self.o.valid.eq(self.i.valid & flush), self.o.payload.eq(lanes),
                     self.i.ready.eq(~flush | self.o.ready)]
        with m.If(self.i.valid & self.i.ready):
            with m.If(flush):
                m.d.sync += [acc.eq(0), cnt.eq(0)]
            with m.Else():
                m.d.sync += [acc.eq(lanes), cnt.eq(cnt + 1)]
        return m


class FramingGuard(wiring.Component):
    """Makes a landing packet exactly ``ceil(length / 8)`` 64-bit beats, whatever its input
    framing: a short packet is padded with zero beats, a long one cut, so a writer given
    ``length`` bytes never waits for data that will not come (cannot happen behind a parser:
    its TRUNCATED and BAD_LENGTH drops). It watches the owner's beat register and tells it
    what to do with the beat there.

    Members
    -------
    valid : In(1)
        A beat of a landing packet is in the owner's register.
    first, last : In(1)
        The beat is its packet's first / last input beat.
    length : In(``Meta.length`` width)
        The packet's length in bytes.
    push : In(1)
        The owner sends the beat on this cycle (only while ``want``).
    want : Out(1)
        The beat is one of the packet's ``ceil(length / 8)``: it is to go on.
    final : Out(1)
        It is the last of them.
    pad : Out(1)
        The beat goes on but the input packet ended early: keep the register, its data
        zeroed and ``first`` cleared, for the next padding beat.
    done : Out(1)
        The register's beat is used up (sent, or cut: a beat past ``ceil(length / 8)``).
    error : Out(1)
        Strobe on the packet's last input beat leaving when its framing disagreed with
        ``length`` (the owner counts ``framing_errors``).

    Combinational on its inputs but for the beat count and the error flag it keeps (one
    register each): latency 0, one beat per cycle.
    """

    def __init__(self):
        super().__init__({
            "valid": In(1), "first": In(1), "last": In(1),
            "length": In(META["length"].width), "push": In(1),
            "want": Out(1), "final": Out(1), "pad": Out(1), "done": Out(1), "error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        len_bits = META["length"].width
        n64 = Signal(len_bits - 2)
        j = Signal(len_bits - 2)
        j_cur = Signal(len_bits - 2)
        extra, short = Signal(), Signal()
        m.d.comb += [n64.eq((self.length + 7) >> 3), j_cur.eq(Mux(self.first, 0, j)),
                     extra.eq(j_cur >= n64), self.final.eq(j_cur == n64 - 1),
                     short.eq(self.last & (j_cur < n64 - 1)),
                     self.want.eq(self.valid & ~extra),
                     self.pad.eq(self.push & short),
                     self.done.eq(extra | (self.push & ~short))]
        with m.If(self.push):
            m.d.sync += j.eq(j_cur + 1)
        frame_bad = Signal()
        bad_now = self.pad | (self.valid & extra)
        with m.If(self.valid & self.done & self.last):
            m.d.sync += frame_bad.eq(0)
            m.d.comb += self.error.eq(frame_bad | bad_now)
        with m.Elif(bad_now):
            m.d.sync += frame_bad.eq(1)
        return m


def stage_in_layout(info) -> data.StructLayout:
    """A beat offered to :class:`LandingStage`: ``data``, ``first``/``last`` (first / last input
    beat of its packet), ``length`` (``Meta.length``), ``keep`` (the packet lands; read on its
    first beat) and ``info`` (any shape: the owner's per-packet fields, read on the first
    beat)."""
    return data.StructLayout({"data": unsigned(PACKET_WIDTH), "first": unsigned(1),
                              "last": unsigned(1), "length": unsigned(META["length"].width),
                              "keep": unsigned(1), "info": info})


def stage_out_layout(info) -> data.StructLayout:
    """A beat :class:`LandingStage` sends on: ``data`` (zero for a padding beat), ``first``,
    ``final`` (the last of the packet's ``ceil(length / 8)``), ``length`` (as taken with the
    beat) and the packet's ``info``."""
    return data.StructLayout({"data": unsigned(PACKET_WIDTH), "first": unsigned(1),
                              "final": unsigned(1), "length": unsigned(META["length"].width),
                              "info": info})


class LandingStage(wiring.Component):
    """A lander's second pipeline stage: the beat register whose packet's fate is latched on
    its first beat, and the :class:`FramingGuard` behind it — a dropped packet's beats are
    consumed one per cycle, a landing packet's go on as exactly ``ceil(length / 8)`` beats
    (a short one padded with zero beats, a long one cut).

    Parameters
    ----------
    info : shape
        The owner's per-packet fields (write address, tag, ...), taken with a first beat.

    Members
    -------
    i : In(stream.Signature(stage_in_layout(info)))
        The owner's stage-1 beats. ``keep`` and ``info`` are taken from a packet's first beat
        and hold for its other beats; ``data``, ``last``, ``length`` are taken from every beat.
        ``i.ready``: the register is empty or its beat is used up in this cycle (it depends on
        the register, the guard and ``o.ready``, never on ``i.valid``).
    o : Out(stream.Signature(stage_out_layout(info)))
        The beats of the landing packets. ``o.valid`` depends only on the register;
        ``o.ready`` may depend on ``o.payload`` (an owner takes a first beat only together
        with its write head).
    framing_error : Out(1)
        Strobe on a landing packet's last input beat leaving when its framing disagreed
        with ``length`` (the owner counts ``framing_errors``).

    Latency 1: a beat taken on ``i`` is offered on ``o`` in the next cycle (a padding beat in
    the cycle after the one before it); one beat per cycle in and out, no bubble between
    packets.
    """

    def __init__(self, info):
        self.info = info
        super().__init__({
            "i": In(stream.Signature(stage_in_layout(info))),
            "o": Out(stream.Signature(stage_out_layout(info))),
            "framing_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        reg = Signal(data.StructLayout({
            "data": unsigned(PACKET_WIDTH), "last": unsigned(1), "first": unsigned(1),
            "keep": unsigned(1), "length": unsigned(META["length"].width), "info": self.info}))
        valid, move, pkt_keep = Signal(), Signal(), Signal()
        m.d.comb += i.ready.eq(~valid | move)
        with m.If(i.valid & i.ready):
            m.d.sync += [reg.data.eq(i.payload.data), reg.last.eq(i.payload.last),
                         reg.first.eq(i.payload.first), reg.length.eq(i.payload.length),
                         valid.eq(1)]
            with m.If(i.payload.first):
                m.d.sync += [reg.keep.eq(i.payload.keep), pkt_keep.eq(i.payload.keep),
                             reg.info.eq(i.payload.info)]
            with m.Else():
                m.d.sync += reg.keep.eq(pkt_keep)
        with m.Elif(move):
            m.d.sync += valid.eq(0)

        m.submodules.guard = guard = FramingGuard()
        m.d.comb += [guard.valid.eq(valid & reg.keep), guard.first.eq(reg.first),
                     guard.last.eq(reg.last), guard.length.eq(reg.length),
                     guard.push.eq(o.valid & o.ready),
                     move.eq(valid & (~reg.keep | guard.done)),
                     o.valid.eq(guard.want), o.payload.data.eq(reg.data),
                     o.payload.first.eq(reg.first), o.payload.final.eq(guard.final),
                     o.payload.length.eq(reg.length),
                     o.payload.info.eq(reg.info), self.framing_error.eq(guard.error)]
        with m.If(guard.pad):           # stay: pad with zero beats up to the length
            m.d.sync += [reg.data.eq(0), reg.first.eq(0)]
        return m


class PacketWriter(wiring.Component):
    """Writes packets to DDR, one write (one :class:`~mcf.hdl.mem.dma.DmaWriter` descriptor)
    per packet, and reports each packet's completion in order.

    Parameters
    ----------
    tag : shape
        What each packet carries from its head to its completion (e.g. ``kv_id``, owner).
    axi_width : int
        Data width of the AXI4 write master (128, the HP port); a multiple of 64.
    addr_width : int
        Byte-address width (40).
    outstanding : int
        Write bursts in flight (:class:`~mcf.hdl.mem.dma.DmaWriter`).
    fifo_depth : int
        Payload FIFO entries (``axi_width``-bit words) before the writer.

    Members
    -------
    head : In(stream.Signature(write_head_layout(addr_width, tag)))
        One per packet, in packet order: ``addr``, ``length`` (1..``MAX_PAYLOAD`` bytes),
        ``tag``. Ready while the descriptor FIFO (4 entries) and the completion FIFO
        (``outstanding + 8`` packets whose B responses are still due) both have room; ready
        depends only on their levels.
    i : In(stream.Signature(unsigned(axi_width)))
        The packets' payload words in packet order, each packet's from lane 0 as
        :class:`~mcf.hdl.mem.dma.DmaWriter` takes them (``ceil(length / (axi_width / 8))``
        words; :class:`PacketUpsizer` makes them). Into a ``fifo_depth``-word FIFO:
        ``i.ready`` is its ``w_rdy``.
    done : Out(stream.Signature(write_done_layout(tag)))
        One per packet in ``head`` order, valid on the packet's last B response (its ``tag``;
        ``err`` when any of its bursts answered other than OKAY). ``done.ready`` low holds
        every B response (``bus.bready`` low) — a full consumer stops the writer.
    bus : Out(axi.AXI4Signature(addr_width, axi_width))
        Write master (AW/W/B; AR/R tied off). INCR bursts, never across 4 KiB, one AXI ID; a
        packet of at most ``MAX_PAYLOAD`` bytes is one burst, or two when it crosses a 4 KiB
        page (or a maximum burst: narrow writers only).

    Latency (measured, AXI slave always ready, nothing queued ahead): a packet's first AW is
    valid 5 cycles after its ``head`` handshake and its first W beat 2 cycles after that (its
    words waiting in the FIFO); ``done.valid`` is combinational on the packet's last B
    response (``bus.bvalid``). Throughput: one payload word per cycle; the
    :class:`~mcf.hdl.mem.dma.DmaWriter` takes a descriptor every 3 cycles at best.
    """

    DESC_DEPTH = 4          # descriptors queued for the DmaWriter

    def __init__(self, tag, *, axi_width: int = 128, addr_width: int = axi.ADDR_BITS,
                 outstanding: int = 8, fifo_depth: int = 64, align: int = 1):
        if axi_width % PACKET_WIDTH:
            raise ValueError(f"axi_width must be a multiple of {PACKET_WIDTH}")
        bb = axi_width // 8
        # a packet of at most MAX_PAYLOAD bytes needs at most two bursts
        longest = min(axi.MAX_BURST_BEATS, axi.BOUNDARY_BYTES // bb)   # beats in one burst
        if (MAX_PAYLOAD + 2 * bb - 2) // bb > longest + 1:
            raise ValueError("a MAX_PAYLOAD packet would need more than two bursts")
        self.tag, self.axi_width, self.addr_width = tag, axi_width, addr_width
        self.outstanding, self.fifo_depth = outstanding, fifo_depth
        self.writer = DmaWriter(axi_width, addr_width, outstanding, align)
        super().__init__({
            "head": In(stream.Signature(write_head_layout(addr_width, tag))),
            "i": In(stream.Signature(unsigned(axi_width))),
            "done": Out(stream.Signature(write_done_layout(tag))),
            "bus": Out(axi.AXI4Signature(addr_width, axi_width)),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self.addr_width
        bb = self.axi_width // 8
        lb = (bb - 1).bit_length()
        len_bits = META["length"].width
        head = self.head.payload

        # --- descriptors, packets awaiting their B responses, payload FIFO ---------------
        desc_l = axi.descriptor_layout(aw)
        m.submodules.desc_fifo = desc_fifo = fifo.SyncFIFOBuffered(width=desc_l.size,
                                                                   depth=self.DESC_DEPTH)
        pend_l = data.StructLayout({"tag": self.tag, "two": unsigned(1)})
        m.submodules.pend_fifo = pend = fifo.SyncFIFOBuffered(
            width=pend_l.size, depth=self.DESC_DEPTH + self.outstanding + 4)
        m.submodules.pay_fifo = pay = fifo.SyncFIFOBuffered(width=self.axi_width,
                                                            depth=self.fifo_depth)

        # the packet's write in bursts as DmaWriter cuts it: one, or two across a 4 KiB page
        # (or beyond a maximum burst, possible only for narrow writers)
        total = Signal(len_bits + 1)
        page_bits = (axi.BOUNDARY_BYTES - 1).bit_length()
        to_4k = Signal(range(axi.BOUNDARY_BYTES // bb + 1))
        first_n = Signal.like(to_4k)
        m.d.comb += [total.eq((head.addr[:lb] + head.length + (bb - 1)) >> lb),
                     to_4k.eq((axi.BOUNDARY_BYTES - Cat(Const(0, lb), head.addr[lb:page_bits]))
                              >> lb),
                     first_n.eq(Mux(to_4k < axi.MAX_BURST_BEATS, to_4k, axi.MAX_BURST_BEATS))]
        desc = Signal(desc_l)
        m.d.comb += [desc.addr.eq(head.addr), desc.length.eq(head.length), desc.stride.eq(0),
                     desc.count.eq(1),
                     self.head.ready.eq(desc_fifo.w_rdy & pend.w_rdy)]
        with m.If(self.head.valid & self.head.ready):
            m.d.comb += [desc_fifo.w_en.eq(1), desc_fifo.w_data.eq(desc), pend.w_en.eq(1),
                         pend.w_data.eq(Cat(head.tag, total > first_n))]
        wiring.connect(m, wiring.flipped(self.i), pay.w_stream)

        # --- the writer ------------------------------------------------------------------
        m.submodules.writer = wr = self.writer
        m.d.comb += [wr.desc.valid.eq(desc_fifo.r_rdy), desc_fifo.r_en.eq(wr.desc.ready),
                     wr.desc.payload.eq(desc_fifo.r_data)]
        wiring.connect(m, pay.r_stream, wr.i)
        bus = self.bus
        for n in ("awaddr", "awlen", "awsize", "awburst", "awid", "awcache", "awprot",
                  "awvalid", "wdata", "wstrb", "wlast", "wvalid"):
            m.d.comb += getattr(bus, n).eq(getattr(wr.bus, n))
        for n in ("awready", "wready", "bresp", "bid"):
            m.d.comb += getattr(wr.bus, n).eq(getattr(bus, n))
        # B responses wait while the completion's consumer is not ready
        m.d.comb += [bus.bready.eq(wr.bus.bready & self.done.ready),
                     wr.bus.bvalid.eq(bus.bvalid & self.done.ready),
                     bus.arvalid.eq(0), bus.rready.eq(0)]

        # --- completions: B responses in order, two per packet crossing a page ----------
        pend_head = data.View(pend_l, pend.r_data)
        b_seen, b_err, b_fire, done = Signal(), Signal(), Signal(), Signal()
        m.d.comb += b_fire.eq(bus.bvalid & bus.bready)
        err_now = b_err | (bus.bresp != axi.AxiResp.OKAY)
        m.d.comb += done.eq(b_fire & pend.r_rdy & (b_seen == pend_head.two))
        with m.If(b_fire):
            m.d.sync += [b_seen.eq(~done), b_err.eq(Mux(done, 0, err_now))]
        m.d.comb += [pend.r_en.eq(done),
                     self.done.valid.eq(bus.bvalid & wr.bus.bready & pend.r_rdy &
                                        (b_seen == pend_head.two)),
                     self.done.payload.tag.eq(pend_head.tag),
                     self.done.payload.err.eq(err_now)]
        return m

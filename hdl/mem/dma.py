"""DMA loader: AXI4 read and write paths driven by 2-D descriptors (paper §5, Fig. 2: the memory
frontend streaming weights, activations and KV blocks from DDR; results and KV blocks back).

Bursts are INCR, full beat size, at most :data:`MAX_BURST_BEATS` beats and never cross a 4 KiB
boundary. Reads keep up to ``outstanding`` bursts in flight and only issue a burst when its beats
fit in the receive FIFO (so ``rready`` never drops and the bus is never blocked by a slow
consumer). Misaligned addresses and odd lengths are realigned on-chip: the read stream delivers
each row's bytes from lane 0, the write path shifts them into place with ``wstrb`` (an engine
built with ``align`` takes rows on ``align`` bytes only, and shifts by those units). Non-OKAY
responses are counted and the last one latched in status; data still flows, nothing hangs.
"""

from __future__ import annotations

from dataclasses import dataclass

from amaranth import Array, Cat, Const, Module, Mux, Signal, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import DMA_READ_STATUS, DMA_STATUS, DMA_WRITE_STATUS

from .axi import (
    ADDR_BITS,
    BOUNDARY_BYTES,
    LENGTH_BITS,
    MAX_BURST_BEATS,
    AXI4Signature,
    AxiBurst,
    AxiResp,
    descriptor_layout,
)

__all__ = ["DmaReader", "DmaWriter", "DmaLoader", "read_beat_layout", "LUTRAM_FIFO_DEPTH",
           "dma_client_members", "DmaViews", "dma_views", "off_align", "align_down"]

LUTRAM_FIFO_DEPTH = 64
"""A :class:`DmaReader` receive FIFO synthesis builds from LUT-RAM (a 129-bit FIFO takes two
BRAM36 at any depth up to 512, ~150 LUT-RAM at 64), for readers that need not run at the
port's full rate: bursts of up to 63 beats, 63 beats in flight."""

AXCACHE = 0b0011     # normal non-cacheable bufferable (what Xilinx HP ports expect)


def read_beat_layout(data_width: int) -> data.StructLayout:
    return data.StructLayout({
        "data": unsigned(data_width), "keep": unsigned(data_width // 8),
        "last": unsigned(1), "err": unsigned(1)})


def off_align(value, align: int):
    """``value`` (an address or a stride) is not a multiple of ``align`` bytes (a power of
    two): what an engine built with ``align`` rejects."""
    la = (align - 1).bit_length()
    return value[:la] != 0 if la else Const(0, 1)


def align_down(value, align: int):
    """``value`` with its low bits as 0 (a multiple of ``align``, a power of two): a register
    whose low bits an engine built with ``align`` ignores."""
    la = (align - 1).bit_length()
    return Cat(Const(0, la), value[la:]) if la else value


def dma_client_members(addr_width: int, data_width: int) -> dict:
    """The members of a unit whose :class:`DmaReader` and :class:`DmaWriter` are outside it
    (two units that never work at once sharing one pair by a select,
    :func:`mcf.hdl.node.attend_split.steer`): ``rd_desc`` → the reader's ``desc``, ``rd_data``
    ← its ``o``, ``wr_desc`` → the writer's ``desc``, ``wr_data`` → its ``i``, ``wr_done`` /
    ``wr_err`` ← its ``desc_done`` / ``desc_err``."""
    desc = stream.Signature(descriptor_layout(addr_width))
    return {"rd_desc": Out(desc), "rd_data": In(stream.Signature(read_beat_layout(data_width))),
            "wr_desc": Out(desc), "wr_data": Out(stream.Signature(unsigned(data_width))),
            "wr_done": In(1), "wr_err": In(1)}


@dataclass(frozen=True)
class DmaViews:
    """What a unit drives and reads of its DMA pair, whether built inside it or outside
    (:func:`dma_views`): ``rd_desc``, ``rd_data``, ``wr_desc``, ``wr_data``, ``wr_done``,
    ``wr_err`` as in :func:`dma_client_members`."""
    rd_desc: object
    rd_data: object
    wr_desc: object
    wr_data: object
    wr_done: object
    wr_err: object


def dma_views(m: Module, unit, own: bool, *, fifo_depth: int = 512, reader: bool = True,
              writer: bool = True, align: int = 1) -> DmaViews:
    """``unit``'s DMA pair: with ``own`` a :class:`DmaReader` (``fifo_depth``) as submodule
    ``rd`` on ``unit.rd_bus`` and a :class:`DmaWriter` as ``wr`` on ``unit.wr_bus`` (either
    left out by ``reader`` / ``writer``; both built with ``align``); else the
    :func:`dma_client_members` of ``unit``."""
    if not own:
        return DmaViews(*(getattr(unit, n, None) for n in (
            "rd_desc", "rd_data", "wr_desc", "wr_data", "wr_done", "wr_err")))
    rd = wr = None
    if reader:
        m.submodules.rd = rd = DmaReader(unit.data_width, unit.addr_width,
                                         fifo_depth=fifo_depth, align=align)
        wiring.connect(m, rd.bus, wiring.flipped(unit.rd_bus))
    if writer:
        m.submodules.wr = wr = DmaWriter(unit.data_width, unit.addr_width, align=align)
        wiring.connect(m, wr.bus, wiring.flipped(unit.wr_bus))
    return DmaViews(rd and rd.desc, rd and rd.o, wr and wr.desc, wr and wr.i,
                    wr and wr.desc_done, wr and wr.desc_err)


def _byte_shift(both, off, width: int, unit: int = 1):
    """``both[8·unit·off : 8·unit·off + width]`` as stages of 4:1 multiplexers on ``off``'s
    bit pairs (highest first): one LUT per output bit and stage, where one 16:1 multiplexer per
    bit takes four or more. ``off`` counts ``unit`` bytes (a DMA engine's ``align``: fewer
    stages); an ``off`` of no bits is no shift."""
    value = both
    bits = len(off)
    for lo in reversed(range(0, bits, 2)):
        step = (8 * unit) << lo
        sel = off[lo:lo + 2]
        n = min(4, 1 << (bits - lo))
        out = width + 8 * ((1 << lo) - 1)
        cand = [value[k * step:k * step + out] for k in range(n)]
        value = Array(cand)[sel] if n > 1 else cand[0]
    return value[:width]


class _Rows:
    """Shared descriptor walker: rows → (aligned beat address, beats) bursts + row info.

    The next burst is ``n = min(beats_left, lim)`` beats at ``baddr`` with ``lim =
    min(to_4k, max_beats)`` and ``to_4k`` the beats from ``baddr`` to its 4 KiB boundary;
    ``to_4k`` and ``lim`` are registers kept beside ``baddr`` (set with it in
    :meth:`start_row`, stepped with it in :meth:`issued`; ``lim`` is ``to_4k`` itself when
    ``max_beats`` covers a page), so ``n`` and ``last`` (this burst ends the row:
    ``beats_left == n``) are one compare of registers deep, and ``last_row`` (``left == 1``)
    is a register beside ``left`` (issue #35: the subtraction from ``baddr``, the compare
    with ``max_beats`` and the one of ``left`` were in series with every issue). The same
    values in every cycle as computing them from ``baddr`` and ``left``
    (``tests/test_dma_bursts.py``).
    """

    def __init__(self, m: Module, desc: stream.Interface, bb: int, addr_bits: int, rejects,
                 max_beats: int = MAX_BURST_BEATS, align: int = 1):
        lb = (bb - 1).bit_length()
        la = (align - 1).bit_length()
        self.lb, self.la = lb, la
        self.busy = Signal(name="rows_busy")
        self.addr = Signal(addr_bits, name="row_addr")
        self.length = Signal(LENGTH_BITS, name="row_len")
        self.stride = Signal.like(desc.payload.stride, name="row_stride")
        self.left = Signal.like(desc.payload.count, name="rows_left")
        self.last_row = Signal(name="last_row")  # left == 1, a register beside left
        self.in_row = Signal(name="in_row")      # bursts of the current row being issued
        self.baddr = Signal(addr_bits, name="burst_addr")
        self.beats_left = Signal(LENGTH_BITS + 1, name="row_beats_left")
        self.row_start = Signal(name="row_start")  # pulse-able: row info must be pushed
        off = self.addr[:lb]
        self.off = off
        self.off_units = self.addr[la:lb]      # off in ``align``-byte units (low bits 0)
        total = Signal(LENGTH_BITS + 1, name="row_beats")
        m.d.comb += total.eq((off + self.length + (bb - 1)) >> lb)
        self.total = total
        # beats in a 4 KiB page; baddr is always beat-aligned, so the beats from baddr to its
        # boundary are page − baddr[lb:12] (1 … page)
        self.page = page = BOUNDARY_BYTES >> lb
        self.max_beats = max_beats
        self.to_4k = Signal(range(page + 1), name="beats_to_4k", init=page)
        if max_beats >= page:
            self.lim = self.to_4k              # a page never holds more than a burst
        else:
            self.lim = Signal(range(max_beats + 1), name="burst_limit", init=max_beats)
        n = Signal(range(MAX_BURST_BEATS + 1), name="burst_beats")
        self.last = Signal(name="burst_ends_row")  # beats_left == n
        m.d.comb += [self.last.eq(self.beats_left <= self.lim),
                     n.eq(Mux(self.last, self.beats_left, self.lim))]
        self.n = n
        m.d.comb += desc.ready.eq(~self.busy)
        p = desc.payload
        # a descriptor that moves nothing, or whose rows do not start on ``align`` bytes
        self.bad = bad = Signal(name="desc_bad")
        m.d.comb += bad.eq((p.length == 0) | (p.count == 0) | off_align(p.addr | p.stride, align))
        with m.If(desc.valid & ~self.busy):
            with m.If(bad):
                m.d.sync += rejects.eq(rejects + 1)
            with m.Else():
                m.d.sync += [self.busy.eq(1), self.addr.eq(p.addr), self.length.eq(p.length),
                             self.stride.eq(p.stride), self.left.eq(p.count),
                             self.last_row.eq(p.count == 1), self.in_row.eq(0)]

    def _set_to_4k(self, m, value):
        m.d.sync += self.to_4k.eq(value)
        if self.lim is not self.to_4k:
            m.d.sync += self.lim.eq(Mux(value < self.max_beats, value, self.max_beats))

    def start_row(self, m):
        """Call under the condition that the row's info was accepted."""
        m.d.sync += [self.in_row.eq(1), self.baddr.eq(Cat(Const(0, (self.lb)),
                                                          self.addr[self.lb:])),
                     self.beats_left.eq(self.total)]
        to_4k = Signal.like(self.to_4k, name="row_to_4k")
        m.d.comb += to_4k.eq(self.page - self.addr[self.lb:12])
        self._set_to_4k(m, to_4k)

    def issued(self, m):
        """Call when a burst of ``n`` beats was issued."""
        bb_shift = self.lb
        m.d.sync += [self.baddr.eq(self.baddr + (self.n << bb_shift)),
                     self.beats_left.eq(self.beats_left - self.n)]
        # a burst ending on the boundary (n == to_4k) leaves baddr at a page's start
        to_4k = Signal.like(self.to_4k, name="next_to_4k")
        m.d.comb += to_4k.eq(Mux(self.n == self.to_4k, self.page, self.to_4k - self.n))
        self._set_to_4k(m, to_4k)
        with m.If(self.last):
            m.d.sync += [self.in_row.eq(0), self.left.eq(self.left - 1),
                         self.last_row.eq(self.left == 2),
                         self.addr.eq(self.addr + self.stride)]
            with m.If(self.last_row):
                m.d.sync += self.busy.eq(0)


def _check_align(data_width: int, align: int) -> None:
    if align < 1 or align & (align - 1) or align > data_width // 8:
        raise ValueError(f"align {align}: a power of two up to the beat ({data_width // 8} B)")


def _start(engine, m: Module, max_beats: int = MAX_BURST_BEATS) -> tuple[int, int, int, _Rows]:
    """What :class:`DmaReader` and :class:`DmaWriter` elaborate first: the data width, bytes
    per beat, their log2 and the descriptor rows of ``engine.desc`` (rejects counted in
    ``engine.status.rejects``; bursts of at most ``max_beats``; rows on ``engine.align``
    bytes)."""
    DW = engine.data_width
    bb = DW // 8
    rows = _Rows(m, engine.desc, bb, engine.addr_width, engine.status.rejects, max_beats,
                 engine.align)
    return DW, bb, (bb - 1).bit_length(), rows


class DmaReader(wiring.Component):
    """AXI4 read path.

    Parameters
    ----------
    data_width, addr_width, outstanding, fifo_depth : the beat, the address, bursts in flight,
        the receive FIFO's beats.
    align : bytes every row starts on (a power of two up to the beat; 1: any byte). A
        descriptor whose ``addr`` or ``stride`` is off ``align`` is rejected like an empty one;
        the realigner shifts by ``align``-byte units only (at the beat: no shifter).

    Members
    -------
    desc : In(stream.Signature(descriptor_layout))
        2-D read descriptors; one is taken at a time (the next is accepted once the last
        burst of the previous one has been issued).
    o : Out(stream.Signature(read_beat_layout))
        Row bytes from lane 0; a row's final beat has a partial ``keep`` when its length is
        not a multiple of the beat; ``last`` on the final beat of a descriptor; ``err`` when a
        contributing bus beat returned SLVERR/DECERR.
    bus : Out(AXI4Signature) — only the AR/R members are driven (AW/W/B tied off).
    status : Out(:data:`mcf.abi.compute.DMA_READ_STATUS`)
        Descriptors completed (final beat delivered), bus beats received, descriptors rejected
        (zero length/count), non-OKAY read beats, the last non-OKAY response code.

    Latency: first AR two cycles after the descriptor; data leave the realigner one beat
    after the second bus beat of a row (one bubble per row). Throughput one beat per cycle.

    Bursts: INCR, never across 4 KiB, at most ``min(256, fifo_depth − 1)`` beats — a burst is
    issued only when the receive FIFO has room for all of it beside the beats in flight and
    one more, so a burst the size of the FIFO would wait forever (with ``fifo_depth`` 256 a
    read covering a whole 4 KiB page of 16-byte beats hung: found by a JOB template of 447
    entries, ``tests/test_node_jobs.py``). The room is a register (``fifo_free`` =
    ``fifo_depth − 1`` − beats in flight − the FIFO's level) compared with the burst's
    registered bounds; it relies on the bus returning no more R beats than requested.
    """

    def __init__(self, data_width: int = 128, addr_width: int = ADDR_BITS,
                 outstanding: int = 8, fifo_depth: int = 512, align: int = 1):
        if fifo_depth < 2:
            raise ValueError("the receive FIFO must hold a beat beside the one in flight")
        _check_align(data_width, align)
        self.data_width, self.addr_width, self.align = data_width, addr_width, align
        self.outstanding, self.fifo_depth = outstanding, fifo_depth
        super().__init__({
            "desc": In(stream.Signature(descriptor_layout(addr_width))),
            "o": Out(stream.Signature(read_beat_layout(data_width))),
            "bus": Out(AXI4Signature(addr_width, data_width)),
            "status": Out(DMA_READ_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        DW, bb, lb, rows = _start(self, m, min(MAX_BURST_BEATS, self.fifo_depth - 1))
        bus, st = self.bus, self.status

        m.submodules.raw = raw = fifo.SyncFIFOBuffered(width=DW + 1, depth=self.fifo_depth)
        la = rows.la
        # the row's offset in ``align``-byte units
        info_l = data.StructLayout({"off": unsigned(lb - la), "length": unsigned(LENGTH_BITS),
                                    "last": unsigned(1)})
        m.submodules.info = info = fifo.SyncFIFOBuffered(width=info_l.size, depth=4)

        # FIFO entries neither reserved by a burst in flight nor holding a beat:
        # fifo_depth − 1 − (beats in flight + raw.level), a register (issue #35)
        free = Signal(range(self.fifo_depth), name="fifo_free", init=self.fifo_depth - 1)
        bursts = Signal(range(self.outstanding + 1))
        recv = Signal()
        recv_last = Signal()
        m.d.comb += [recv.eq(bus.rvalid & bus.rready), recv_last.eq(recv & bus.rlast)]

        # AR issue
        m.d.comb += [bus.arsize.eq(lb), bus.arburst.eq(AxiBurst.INCR), bus.arcache.eq(AXCACHE),
                     bus.arid.eq(0), bus.arprot.eq(0)]
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += bus.arvalid.eq(0)
        issue = Signal()
        room = Signal()
        # beats in flight + raw.level + n + 1 <= fifo_depth, i.e. min(beats_left, lim) <= free
        m.d.comb += room.eq((rows.beats_left <= free) | (rows.lim <= free))
        with m.If(rows.busy & ~rows.in_row):
            m.d.comb += [info.w_en.eq(1), info.w_data.eq(Cat(rows.off_units, rows.length,
                                                             rows.last_row))]
            with m.If(info.w_rdy):
                rows.start_row(m)
        with m.Elif(rows.busy & rows.in_row & (~bus.arvalid | bus.arready) & room &
                    (bursts + bus.arvalid < self.outstanding)):
            m.d.comb += issue.eq(1)
            m.d.sync += [bus.arvalid.eq(1), bus.araddr.eq(rows.baddr),
                         bus.arlen.eq(rows.n - 1)]
            rows.issued(m)
        ar_done = Signal()
        m.d.comb += ar_done.eq(bus.arvalid & bus.arready)
        m.d.sync += bursts.eq(bursts + ar_done - recv_last)
        # a received beat moves from in flight into the FIFO (its room was reserved at issue,
        # so the write is always taken); a beat read from the FIFO frees its entry
        # (the read comes last: the FIFO's reader — its consumer's ready chain — selects between
        # two sums formed from registers, so it adds one multiplexer, not an adder, to its path)
        taken = Signal()
        kept = Signal.like(free)
        m.d.comb += [taken.eq(raw.r_en & raw.r_rdy),
                     kept.eq(Mux(issue, free - rows.n, free))]
        m.d.sync += free.eq(Mux(taken, kept + 1, kept))

        # R channel into the FIFO (space was reserved at issue)
        m.d.comb += [bus.rready.eq(1), raw.w_en.eq(recv),
                     raw.w_data.eq(Cat(bus.rdata, bus.rresp != AxiResp.OKAY))]
        with m.If(recv):
            m.d.sync += st.beats.eq(st.beats + 1)
            with m.If(bus.rresp != AxiResp.OKAY):
                m.d.sync += [st.errors.eq(st.errors + 1), st.last_resp.eq(bus.rresp)]

        # realigner
        cur = data.View(info_l, Signal(info_l.size))
        active = Signal()
        prev = Signal(DW)
        prev_err = Signal()
        have_prev = Signal()
        raw_seen = Signal(LENGTH_BITS + 1)
        out_sent = Signal(LENGTH_BITS + 1)
        # the row's bus beats and output beats, registered with ``cur`` (issue #35: the adds
        # were in front of the FIFO read, the output and the FIFO room)
        raw_cnt = Signal(LENGTH_BITS + 1)
        out_cnt = Signal(LENGTH_BITS + 1)
        nxt_info = data.View(info_l, info.r_data)
        can_out = Signal()
        m.d.comb += can_out.eq(~self.o.valid | self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        m.d.comb += info.r_en.eq(~active)
        with m.If(~active & info.r_rdy):
            m.d.sync += [cur.eq(info.r_data), active.eq(1), have_prev.eq(0), raw_seen.eq(0),
                         out_sent.eq(0),
                         raw_cnt.eq(((nxt_info.off << la) + nxt_info.length + (bb - 1))
                                    >> lb),
                         out_cnt.eq((nxt_info.length + (bb - 1)) >> lb)]
        rem = cur.length[:lb]
        final_keep = Signal(bb)
        m.d.comb += final_keep.eq(Mux(rem == 0, (1 << bb) - 1,
                                      (Const(1, bb + 1) << rem) - 1))

        # row bytes from lane 0: the beat pair shifted down by ``off`` lanes (slices of it, two
        # stages of 4:1 choices: no operand wider than the beat pair)
        nxt_raw = Signal(DW)
        m.d.comb += nxt_raw.eq(Mux(raw_seen < raw_cnt, raw.r_data[:DW], 0))
        shifted = Signal(DW)
        m.d.comb += shifted.eq(_byte_shift(Cat(prev, nxt_raw), cur.off, DW, self.align))

        def emit(nxt_err):
            is_final = out_sent == out_cnt - 1
            m.d.sync += [self.o.valid.eq(1), self.o.payload.data.eq(shifted),
                         self.o.payload.keep.eq(Mux(is_final, final_keep, (1 << bb) - 1)),
                         self.o.payload.last.eq(is_final & cur.last),
                         self.o.payload.err.eq(prev_err | nxt_err),
                         out_sent.eq(out_sent + 1)]
            with m.If(is_final):
                m.d.sync += active.eq(0)
                with m.If(cur.last):
                    m.d.sync += st.descs.eq(st.descs + 1)

        with m.If(active & can_out):
            with m.If(raw_seen < raw_cnt):
                m.d.comb += raw.r_en.eq(1)
                with m.If(raw.r_rdy):
                    m.d.sync += [prev.eq(raw.r_data[:DW]), prev_err.eq(raw.r_data[DW]),
                                 have_prev.eq(1), raw_seen.eq(raw_seen + 1)]
                    with m.If(have_prev):
                        emit(raw.r_data[DW])
            with m.Elif(out_sent < out_cnt):
                emit(0)
        return m


class DmaWriter(wiring.Component):
    """AXI4 write path.

    Parameters
    ----------
    data_width, addr_width, outstanding : as :class:`DmaReader`'s.
    align : as :class:`DmaReader`'s (a descriptor off ``align`` is rejected: no ``desc_done``).

    Members
    -------
    desc : In(stream.Signature(descriptor_layout))
        2-D write descriptors.
    i : In(stream.Signature(unsigned(data_width)))
        Row bytes from lane 0, ``ceil(length / beat)`` beats per row (unused lanes of a
        row's final beat are ignored).
    bus : Out(AXI4Signature) — only AW/W/B are driven.
    status : Out(:data:`mcf.abi.compute.DMA_WRITE_STATUS`)
        Descriptors accepted, bursts acknowledged, descriptors rejected, non-OKAY write
        responses, the last non-OKAY response code.
    busy : Out(1)
        Anything accepted and not yet acknowledged.
    desc_done : Out(1)
        One-cycle pulse per accepted descriptor, the cycle after the B response of its final
        burst: every byte of the descriptor is then written (globally visible), in descriptor
        order. Rejected descriptors give none.
    desc_err : Out(1)
        With ``desc_done``: some burst of that descriptor answered SLVERR/DECERR.

    Latency: the first AW two cycles after the descriptor; W beats follow their AW;
    ``desc_done`` one cycle after the last B handshake.
    """

    def __init__(self, data_width: int = 128, addr_width: int = ADDR_BITS,
                 outstanding: int = 8, align: int = 1):
        _check_align(data_width, align)
        self.data_width, self.addr_width, self.outstanding = data_width, addr_width, outstanding
        self.align = align
        super().__init__({
            "desc": In(stream.Signature(descriptor_layout(addr_width))),
            "i": In(stream.Signature(unsigned(data_width))),
            "bus": Out(AXI4Signature(addr_width, data_width)),
            "status": Out(DMA_WRITE_STATUS), "busy": Out(1),
            "desc_done": Out(1), "desc_err": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        DW, bb, lb, rows = _start(self, m)
        bus, st = self.bus, self.status
        with m.If(self.desc.valid & self.desc.ready & ~rows.bad):
            m.d.sync += st.descs.eq(st.descs + 1)
        la = rows.la
        # the row's offset in ``align``-byte units
        info_l = data.StructLayout({"off": unsigned(lb - la), "length": unsigned(LENGTH_BITS)})
        m.submodules.info = info = fifo.SyncFIFOBuffered(width=info_l.size, depth=4)
        m.submodules.wlen = wlen = fifo.SyncFIFOBuffered(width=9, depth=self.outstanding)
        # one tag per burst in flight: 1 = the final burst of its descriptor
        m.submodules.tags = tags = fifo.SyncFIFO(width=1, depth=self.outstanding)
        acc_err = Signal()
        bursts = Signal(range(self.outstanding + 1))

        m.d.comb += [bus.awsize.eq(lb), bus.awburst.eq(AxiBurst.INCR),
                     bus.awcache.eq(AXCACHE), bus.awid.eq(0), bus.awprot.eq(0)]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += bus.awvalid.eq(0)
        with m.If(rows.busy & ~rows.in_row):
            m.d.comb += [info.w_en.eq(1), info.w_data.eq(Cat(rows.off_units, rows.length))]
            with m.If(info.w_rdy):
                rows.start_row(m)
        with m.Elif(rows.busy & rows.in_row & (~bus.awvalid | bus.awready) & wlen.w_rdy &
                    (bursts < self.outstanding)):
            m.d.sync += [bus.awvalid.eq(1), bus.awaddr.eq(rows.baddr),
                         bus.awlen.eq(rows.n - 1)]
            m.d.comb += [wlen.w_en.eq(1), wlen.w_data.eq(rows.n),
                         tags.w_en.eq(1),
                         tags.w_data.eq(rows.last & rows.last_row)]
            rows.issued(m)
        b_ok = Signal()
        m.d.comb += [bus.bready.eq(1), b_ok.eq(bus.bvalid)]
        m.d.sync += bursts.eq(bursts + wlen.w_en - b_ok)
        b_err = Signal()
        m.d.comb += b_err.eq(bus.bresp != AxiResp.OKAY)
        m.d.sync += [self.desc_done.eq(0), self.desc_err.eq(0)]
        with m.If(b_ok):
            m.d.sync += st.bursts.eq(st.bursts + 1)
            with m.If(b_err):
                m.d.sync += [st.errors.eq(st.errors + 1), st.last_resp.eq(bus.bresp)]
            # B responses of one ID come back in AW order: the head tag is this burst's
            m.d.comb += tags.r_en.eq(1)
            with m.If(tags.r_rdy & tags.r_data):
                m.d.sync += [self.desc_done.eq(1), self.desc_err.eq(acc_err | b_err),
                             acc_err.eq(0)]
            with m.Else():
                m.d.sync += acc_err.eq(acc_err | b_err)
        m.d.comb += self.busy.eq(rows.busy | (bursts != 0) | info.r_rdy)

        # realign input rows into place, with strobes
        cur = data.View(info_l, Signal(info_l.size))
        active = Signal()
        prev = Signal(DW)
        j = Signal(LENGTH_BITS + 1)
        in_cnt = Signal(LENGTH_BITS + 1)
        out_cnt = Signal(LENGTH_BITS + 1)
        off = Signal(lb)                                  # in bytes
        m.d.comb += [off.eq(cur.off << la), in_cnt.eq((cur.length + (bb - 1)) >> lb),
                     out_cnt.eq((off + cur.length + (bb - 1)) >> lb)]
        m.d.comb += info.r_en.eq(~active)
        with m.If(~active & info.r_rdy):
            m.d.sync += [cur.eq(info.r_data), active.eq(1), j.eq(0), prev.eq(0)]
        wbeat = Signal(range(MAX_BURST_BEATS + 1))
        can = Signal()
        m.d.comb += can.eq(~bus.wvalid | bus.wready)
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += bus.wvalid.eq(0)
        lanes = Signal(bb)
        start = Signal(LENGTH_BITS + lb + 2)
        end = Signal(LENGTH_BITS + lb + 2)
        m.d.comb += [start.eq(j << lb), end.eq(off + cur.length)]
        for b in range(bb):
            m.d.comb += lanes[b].eq((start + b >= off) & (start + b < end))

        # the row's bytes moved up by ``off`` lanes (byte b of a beat is row byte b - off,
        # lanes below ``off`` from ``prev``): slices of the beat pair, as the reader's
        nxt = Signal(DW)
        m.d.comb += nxt.eq(Mux(j < in_cnt, self.i.payload, 0))
        wdata = Signal(DW)
        # bytes (bb − off …) of the pair: in ``align``-byte units, ``bb/align − 1 − off`` is
        # ``off``'s complement
        u = self.align
        m.d.comb += wdata.eq(_byte_shift(Cat(prev, nxt)[8 * u:], (~cur.off)[:lb - la], DW, u))

        send = Signal()
        last_of_burst = Signal()
        m.d.comb += last_of_burst.eq(wbeat == wlen.r_data - 1)
        with m.If(send):
            m.d.sync += [bus.wvalid.eq(1), bus.wdata.eq(wdata), bus.wstrb.eq(lanes),
                         j.eq(j + 1), prev.eq(nxt), bus.wlast.eq(last_of_burst),
                         wbeat.eq(Mux(last_of_burst, 0, wbeat + 1))]
            m.d.comb += wlen.r_en.eq(last_of_burst)
            with m.If(j == out_cnt - 1):
                m.d.sync += active.eq(0)

        m.d.comb += self.i.ready.eq(0)
        with m.If(active & can & wlen.r_rdy):
            with m.If(j < in_cnt):
                m.d.comb += [self.i.ready.eq(1), send.eq(self.i.valid)]
            with m.Else():
                m.d.comb += send.eq(1)
        return m


class DmaLoader(wiring.Component):
    """Read and write paths sharing one AXI4 master port ``m_axi`` (a ZU+ S_AXI_HP port).

    Members: ``rd_desc``, ``rd`` (read beats), ``wr_desc``, ``wr`` (write data), ``m_axi``,
    ``status`` (:data:`mcf.abi.compute.DMA_STATUS`: the reader's fields prefixed ``rd_``, the
    writer's ``wr_``), ``wr_busy`` and ``wr_done``/``wr_err`` (the writer's
    ``desc_done``/``desc_err``). ``align`` is the reader's, ``wr_align`` the writer's (default:
    ``align``). Latencies as :class:`DmaReader` and :class:`DmaWriter`.
    """

    def __init__(self, data_width: int = 128, addr_width: int = ADDR_BITS,
                 outstanding: int = 8, fifo_depth: int = 512, align: int = 1,
                 wr_align: int | None = None):
        self.reader = DmaReader(data_width, addr_width, outstanding, fifo_depth, align)
        self.writer = DmaWriter(data_width, addr_width, outstanding,
                                align if wr_align is None else wr_align)
        r, w = self.reader.signature.members, self.writer.signature.members
        super().__init__({
            "rd_desc": r["desc"], "rd": r["o"], "wr_desc": w["desc"], "wr": w["i"],
            "m_axi": Out(AXI4Signature(addr_width, data_width)),
            "status": Out(DMA_STATUS), "wr_busy": w["busy"],
            "wr_done": w["desc_done"], "wr_err": w["desc_err"],
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.reader = rd = self.reader
        m.submodules.writer = wr = self.writer
        wiring.connect(m, wiring.flipped(self.rd_desc), rd.desc)
        wiring.connect(m, rd.o, wiring.flipped(self.rd))
        wiring.connect(m, wiring.flipped(self.wr_desc), wr.desc)
        wiring.connect(m, wiring.flipped(self.wr), wr.i)
        for name, _ in DMA_READ_STATUS:
            m.d.comb += self.status[f"rd_{name}"].eq(rd.status[name])
        for name, _ in DMA_WRITE_STATUS:
            m.d.comb += self.status[f"wr_{name}"].eq(wr.status[name])
        m.d.comb += [self.wr_busy.eq(wr.busy), self.wr_done.eq(wr.desc_done),
                     self.wr_err.eq(wr.desc_err)]
        ar = ("araddr", "arlen", "arsize", "arburst", "arid", "arcache", "arprot", "arvalid",
              "rready")
        aw = ("awaddr", "awlen", "awsize", "awburst", "awid", "awcache", "awprot", "awvalid",
              "wdata", "wstrb", "wlast", "wvalid", "bready")
        for n in ar:
            m.d.comb += getattr(self.m_axi, n).eq(getattr(rd.bus, n))
        for n in aw:
            m.d.comb += getattr(self.m_axi, n).eq(getattr(wr.bus, n))
        for n in ("arready", "rdata", "rresp", "rlast", "rid", "rvalid"):
            m.d.comb += getattr(rd.bus, n).eq(getattr(self.m_axi, n))
        for n in ("awready", "wready", "bresp", "bid", "bvalid"):
            m.d.comb += getattr(wr.bus, n).eq(getattr(self.m_axi, n))
        return m

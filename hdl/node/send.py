"""Send unit: SEND records of the two queues → ``Meta`` + payload streams for the packetizer
(docs/node.md §3 record classes, §5 ``kv_id`` → address, §6 rule 3 the injection rule; §1: DDR
payloads through a ``DmaReader`` and a 128 → 64 downsizer; paper §5).

The record rules, the status counters and the golden model are :mod:`mcf.abi.send`'s.
"""

from __future__ import annotations

from amaranth import Const, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, enum, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.decode_land import DEC_ALIGN
from mcf.abi.framing import MAX_PAYLOAD, beat_layout, payload_beats
from mcf.abi.landing import KV_ALIGN
from mcf.abi.meta import META, Op
from mcf.abi.node import CMD, N_QUEUES, PayloadSource, RecordClass
from mcf.abi.send import SEND_STATUS

from ..mem.axi import ADDR_BITS, AXI4Signature
from ..mem.dma import DmaReader, align_down, off_align, read_beat_layout
from .kv_address import KvAddress, kv_table_members

__all__ = ["SendUnit", "ReadDownsizer"]

PACKET_WIDTH = 64   # docs/node.md §1: every packet stream is 64 bits


class ReadDownsizer(wiring.Component):
    """``read_beat_layout(in_width)`` → ``read_beat_layout(out_width)``: each input beat leaves
    as its parts from lane 0 up, a part only when its first byte is kept (a row's final beat
    is partial from lane 0). ``keep``/``err`` per part, ``last`` on the final part of a ``last``
    beat. Combinational (no latency); one output beat per cycle; ``i.ready`` on the final part.
    """

    def __init__(self, in_width: int = 128, out_width: int = PACKET_WIDTH):
        if in_width % out_width or out_width % 8:
            raise ValueError("in_width must be a multiple of out_width (bytes)")
        self.in_width, self.out_width = in_width, out_width
        super().__init__({
            "i": In(stream.Signature(read_beat_layout(in_width))),
            "o": Out(stream.Signature(read_beat_layout(out_width))),
        })

    def elaborate(self, platform):
        m = Module()
        ratio = self.in_width // self.out_width
        ob = self.out_width // 8
        phase = Signal(range(ratio))
        final = Signal()
        keep = self.i.payload.keep
        with m.Switch(phase):
            for k in range(ratio):
                with m.Case(k):
                    more = keep[(k + 1) * ob] if k + 1 < ratio else Const(0)
                    m.d.comb += [
                        self.o.payload.data.eq(
                            self.i.payload.data[k * self.out_width:(k + 1) * self.out_width]),
                        self.o.payload.keep.eq(keep[k * ob:(k + 1) * ob]),
                        final.eq(~more),
                    ]
        m.d.comb += [self.o.payload.err.eq(self.i.payload.err),
                     self.o.payload.last.eq(self.i.payload.last & final),
                     self.o.valid.eq(self.i.valid),
                     self.i.ready.eq(self.o.ready & final)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += phase.eq(Mux(final, 0, phase + 1))
        return m


class _Job(enum.Enum, shape=2):
    DDR = 0
    ATTN = 1
    EMIT = 2


class SendUnit(wiring.Component):
    """Executes SEND records: one packet per record, or a counted drop.

    Parameters
    ----------
    addr_width, axi_width : int
        Of the read master (40, 128: an HP port); ``axi_width`` a multiple of 64.
    job_depth : int
        Packets whose payload is still to stream (issued ``Meta`` ahead of its payload).
    fifo_depth, outstanding : int
        Of the :class:`~mcf.hdl.mem.dma.DmaReader` (receive FIFO beats, bursts in flight).

    Members
    -------
    req0, req1 : In(stream.Signature(:data:`mcf.abi.node.CMD`))
        SEND records of the NET (0) and COMPUTE (1) queue, arbitrated record by record,
        round robin. A record is taken only when its payload can stream without waiting on
        anything but DDR or its staging FIFO (docs/node.md §6 rule 3): ``KV``/``QBUF``/``HDR``
        at once; ``ATTN``/``EMIT`` when that ``staged_*`` stream is valid and no earlier
        record of the same source is still streaming.
    cfg : In(:data:`mcf.abi.landing.LANDING_CONFIG`)
        ``kv_base``, ``kv_slot``, ``kv_count`` — the landing engine's (same CSRs).
    land_off_we, land_off_seq, land_off_data : In
        ``LAND_OFF`` write port, identical to ``LandingEngine``'s (its own copy of the table,
        a :class:`~mcf.hdl.node.kv_address.KvAddress` like the engine's, written by the same
        strobe). Write it while no KV record is being taken.
    qbuf_base : In(addr_width)
        ``QBUF`` base: a ``QBUF`` send reads ``meta.length`` bytes at ``qbuf_base + arg``
        (``qbuf_base``'s low 2 bits taken as 0; an ``arg`` off a word is a bad record:
        :data:`~mcf.abi.decode_land.DEC_ALIGN`).
    staged_attn, staged_emit : In(stream.Signature(beat_layout(64)))
        The attention engine's and the KV emitter's staging FIFOs: one complete packet
        (``last`` on its final beat) per ``ATTN``/``EMIT`` record, in record order. ``keep``
        is ignored: exactly ``meta.length`` bytes are sent (fewer beats: zero-padded; more:
        cut; counted in ``framing_errors``). A dropped record's staged packet is discarded.
    o_meta : Out(stream.Signature(META))
        One ``Meta`` per packet (``Packetizer.i_meta``), the record's ``meta`` unchanged.
    o_payload : Out(stream.Signature(beat_layout(64)))
        ``payload_beats(length, 64)`` beats per packet with ``length > 0``, in ``o_meta``
        order, final ``keep = keep_mask(length, 64)`` and ``last`` (``Packetizer.i_payload``).
        Bytes outside ``keep`` are unspecified.
    bus : Out(AXI4Signature(addr_width, axi_width)) — AR/R only (AW/W/B tied off).
    status : Out(:data:`mcf.abi.send.SEND_STATUS`)

    Timing: the front takes a record (``LAND_OFF[seq]`` read and ``kv_id · KV_SLOT`` in the
    same cycle), checks it in the next and offers its ``Meta``/descriptor/payload job from the
    cycle after, while it takes the next record: one record every 2 cycles (header-only
    packets: 2 cycles per packet) while the packetizer, the reader and the job FIFO take them.
    The ``Meta`` runs ahead of its payload by up
    to ``job_depth`` packets while payloads stream back to back: DDR packets are read ahead by
    the ``DmaReader`` (the next descriptor is accepted once the previous one's bursts are
    issued). Measured (``tests/test_node_send.py::test_send_rate``, cocotbext-axi ``AxiRam``,
    no pauses): 40 back-to-back 2,048-B KV sends through ``Packetizer(64)`` give 10,240 payload
    beats in 10,279 cycles — 0.996 payload beats per cycle, the packetizer's limit with one
    header beat per packet (256/257): the output never waits on the unit.
    """

    def __init__(self, *, addr_width: int = ADDR_BITS, axi_width: int = 128,
                 job_depth: int = 8, fifo_depth: int = 512, outstanding: int = 8):
        if axi_width % PACKET_WIDTH:
            raise ValueError(f"axi_width must be a multiple of {PACKET_WIDTH}")
        self.addr_width, self.axi_width, self.job_depth = addr_width, axi_width, job_depth
        # every address it reads is a QBUF one (DEC_ALIGN) or a KV one (KV_ALIGN): realign by
        # the smaller (both powers of two)
        self.reader = DmaReader(axi_width, addr_width, outstanding, fifo_depth,
                                align=min(DEC_ALIGN, KV_ALIGN))
        beat = beat_layout(PACKET_WIDTH)
        members = {f"req{q}": In(stream.Signature(CMD)) for q in range(N_QUEUES)}
        members |= {
            **kv_table_members(),
            "qbuf_base": In(addr_width),
            "staged_attn": In(stream.Signature(beat)),
            "staged_emit": In(stream.Signature(beat)),
            "o_meta": Out(stream.Signature(META)),
            "o_payload": Out(stream.Signature(beat)),
            "bus": Out(AXI4Signature(addr_width, axi_width)),
            "status": Out(SEND_STATUS),
        }
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        aw = self.addr_width
        st = self.status
        cfg = self.cfg
        len_bits = META["length"].width
        reqs = [getattr(self, f"req{q}") for q in range(N_QUEUES)]
        staged = {PayloadSource.ATTN: (self.staged_attn, _Job.ATTN),
                  PayloadSource.EMIT: (self.staged_emit, _Job.EMIT)}

        m.submodules.reader = rd = self.reader
        wiring.connect(m, rd.bus, wiring.flipped(self.bus))
        m.submodules.down = down = ReadDownsizer(self.axi_width, PACKET_WIDTH)
        wiring.connect(m, rd.o, down.i)

        # --- LAND_OFF table (a copy of the landing engine's) and the KV slot address -----
        m.submodules.kv_addr = kva = KvAddress(aw)
        kva.connect_table(m, self)

        # --- payload jobs: one per packet with a payload, or a staged packet to discard --
        job_l = data.StructLayout({"kind": _Job, "emit": unsigned(1),
                                   "length": unsigned(len_bits)})
        m.submodules.jobs = jobs = fifo.SyncFIFOBuffered(width=job_l.size,
                                                         depth=self.job_depth)
        pend = {s: Signal(range(self.job_depth + 2), name=f"pend_{s.name.lower()}")
                for s in staged}
        pend_inc = {s: Signal(name=f"pend_inc_{s.name.lower()}") for s in staged}
        pend_dec = {s: Signal(name=f"pend_dec_{s.name.lower()}") for s in staged}
        for s in staged:
            m.d.sync += pend[s].eq(pend[s] + pend_inc[s] - pend_dec[s])

        # --- front: take (round robin, table read, multiply) → checks → issue ----------
        cur = Signal(CMD)
        meta = data.View(META, cur.meta)
        rr = Signal(range(N_QUEUES))         # the queue served last
        elig = Signal(N_QUEUES)
        job_pend = Signal()
        job = Signal(job_l)
        for q, r in enumerate(reqs):
            ok = Const(1)
            for s, (port, kind) in staged.items():   # the source's previous packet is done
                idle = (pend[s] == 0) & ~(job_pend & (job.kind == kind))
                ok = ok & ((r.payload.src != s) | (port.valid & idle))
            m.d.comb += elig[q].eq(r.valid & ok)
        pick = Signal(range(N_QUEUES))
        # priority: the queue after the last served one (two queues: the other one)
        with m.Switch(rr):
            for last in range(N_QUEUES):
                with m.Case(last):
                    for k in reversed(range(N_QUEUES)):
                        q = (last + 1 + k) % N_QUEUES
                        with m.If(elig[q]):
                            m.d.comb += pick.eq(q)

        picked = Signal(CMD)                 # the request TAKE would take
        with m.Switch(pick):
            for q, r in enumerate(reqs):
                with m.Case(q):
                    m.d.comb += picked.eq(r.payload)
        picked_meta = data.View(META, picked.meta)
        # LAND_OFF[seq] is read and kv_id · KV_SLOT registered as TAKE takes the picked
        # record, so CHECK sees them
        in_take = Signal()
        free = Signal()         # the previous record's issue completes this cycle (or did)
        m.d.comb += [kva.take.eq(in_take & elig.any() & free), kva.kv_id.eq(picked_meta.kv_id),
                     kva.seq.eq(picked_meta.seq), kva.length.eq(meta.length)]

        # decision signals (valid in CHECK)
        src = cur.src
        is_staged = Signal()
        m.d.comb += is_staged.eq((src == PayloadSource.ATTN) | (src == PayloadSource.EMIT))
        is_ddr = Signal()
        m.d.comb += is_ddr.eq((src == PayloadSource.KV) | (src == PayloadSource.QBUF))
        bad_record = Signal()
        m.d.comb += bad_record.eq(
            (cur.cls != RecordClass.SEND) | (src.as_value() > max(s.value for s in PayloadSource))
            | (meta.op.as_value() > max(o.value for o in Op)) | (meta.length > MAX_PAYLOAD)
            | ((src == PayloadSource.HDR) != (meta.length == 0))
            | ((src == PayloadSource.QBUF) & off_align(cur.arg, DEC_ALIGN)))
        unmapped = Signal()
        bad_seq = Signal()
        m.d.comb += [
            unmapped.eq(meta.kv_id >= cfg.kv_count),
            bad_seq.eq(~kva.fits),
        ]
        addr = Signal(aw)
        m.d.comb += addr.eq(Mux(src == PayloadSource.KV, kva.addr,
                                align_down(self.qbuf_base, DEC_ALIGN) + cur.arg))

        # issue: registered valids, each cleared by its handshake
        meta_pend = Signal()
        desc_pend = Signal()
        desc = self.reader.desc
        m.d.comb += [self.o_meta.valid.eq(meta_pend), self.o_meta.payload.eq(meta),
                     desc.valid.eq(desc_pend), desc.payload.length.eq(meta.length),
                     desc.payload.stride.eq(0), desc.payload.count.eq(1)]
        desc_addr = Signal(aw)      # latched in CHECK (the table output may change later)
        m.d.comb += desc.payload.addr.eq(desc_addr)
        m.d.comb += [jobs.w_data.eq(job), jobs.w_en.eq(job_pend)]
        with m.If(self.o_meta.valid & self.o_meta.ready):
            m.d.sync += meta_pend.eq(0)
        with m.If(desc.valid & desc.ready):
            m.d.sync += desc_pend.eq(0)
        with m.If(jobs.w_en & jobs.w_rdy):
            m.d.sync += job_pend.eq(0)
            for s in staged:
                m.d.comb += pend_inc[s].eq(job.kind == staged[s][1])

        m.d.comb += free.eq((~meta_pend | self.o_meta.ready) & (~desc_pend | desc.ready) &
                            (~job_pend | jobs.w_rdy))
        with m.FSM():
            with m.State("TAKE"):
                m.d.comb += in_take.eq(1)
                with m.If(elig.any() & free):
                    m.d.comb += [r.ready.eq(pick == q) for q, r in enumerate(reqs)]
                    m.d.sync += [cur.eq(picked), rr.eq(pick)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                kv = src == PayloadSource.KV
                with m.If(bad_record):
                    m.d.sync += st.drop_bad_record.eq(st.drop_bad_record + 1)
                    with m.If(is_staged):       # keep the staging FIFO aligned
                        m.d.sync += [job_pend.eq(1), job.emit.eq(0), job.length.eq(0),
                                     job.kind.eq(Mux(src == PayloadSource.ATTN, _Job.ATTN,
                                                     _Job.EMIT))]
                with m.Elif(kv & unmapped):
                    m.d.sync += st.drop_unmapped.eq(st.drop_unmapped + 1)
                with m.Elif(kv & bad_seq):
                    m.d.sync += st.drop_bad_seq.eq(st.drop_bad_seq + 1)
                with m.Else():
                    m.d.sync += [meta_pend.eq(1), desc_pend.eq(is_ddr), desc_addr.eq(addr),
                                 job_pend.eq(is_ddr | is_staged), job.emit.eq(1),
                                 job.length.eq(meta.length),
                                 job.kind.eq(Mux(src == PayloadSource.ATTN, _Job.ATTN,
                                                 Mux(src == PayloadSource.EMIT, _Job.EMIT,
                                                     _Job.DDR))),
                                 st.packets.eq(st.packets + 1),
                                 st.bytes.eq(st.bytes + meta.length)]
                m.next = "TAKE"

        # --- payload streamer ----------------------------------------------------------
        cj = Signal(job_l)
        active = Signal()
        out_cnt = Signal(range(payload_beats(MAX_PAYLOAD, PACKET_WIDTH) + 2))
        in_cnt = Signal.like(out_cnt)
        ended = Signal()
        err = Signal()
        done = Signal()
        # the job's beat count n and n - 1, registered with it: the streamer's compares start
        # from flip-flops (no adder between the job register and the output handshake)
        n = Signal(len_bits)
        nm1 = Signal(signed(len_bits + 1), init=-1)
        rem = cj.length[:3]
        final_keep = Signal(8)
        m.d.comb += final_keep.eq(Mux(rem == 0, 0xFF, (Const(1, 9) << rem) - 1))
        o = self.o_payload
        o_go = Signal()
        m.d.comb += o_go.eq(o.valid & o.ready)
        with m.If(o_go):
            m.d.sync += out_cnt.eq(out_cnt + 1)

        with m.If(active & (cj.kind == _Job.DDR)):
            m.d.comb += [o.valid.eq(down.o.valid), o.payload.data.eq(down.o.payload.data),
                         o.payload.keep.eq(down.o.payload.keep),
                         o.payload.last.eq(down.o.payload.last),
                         down.o.ready.eq(o.ready)]
            with m.If(o_go):
                m.d.sync += err.eq(err | down.o.payload.err)
                with m.If(down.o.payload.last):
                    m.d.comb += done.eq(1)
                    with m.If(err | down.o.payload.err):
                        m.d.sync += st.read_errors.eq(st.read_errors + 1)
        for s, (port, kind) in staged.items():
            with m.If(active & (cj.kind == kind)):
                need = Signal(name=f"need_{kind.name.lower()}")
                m.d.comb += need.eq(cj.emit & (out_cnt < n))
                is_last_out = out_cnt == nm1
                m.d.comb += [o.payload.keep.eq(Mux(is_last_out, final_keep, 0xFF)),
                             o.payload.last.eq(is_last_out)]
                took = Signal(name=f"took_{kind.name.lower()}")
                with m.If(~ended):
                    m.d.comb += [o.valid.eq(need & port.valid),
                                 o.payload.data.eq(port.payload.data),
                                 port.ready.eq(~need | o.ready),
                                 took.eq(port.valid & port.ready)]
                with m.Else():
                    m.d.comb += o.valid.eq(need)        # pad with zeros
                ends_now = took & port.payload.last
                with m.If(took):
                    m.d.sync += in_cnt.eq(in_cnt + 1)
                with m.If(ends_now):
                    m.d.sync += ended.eq(1)
                    with m.If(cj.emit & (in_cnt != nm1)):
                        m.d.sync += st.framing_errors.eq(st.framing_errors + 1)
                out_done = ~cj.emit | Mux(o_go, out_cnt == nm1, out_cnt == n)
                with m.If((ended | ends_now) & out_done):
                    m.d.comb += [done.eq(1), pend_dec[s].eq(1)]

        m.d.comb += jobs.r_en.eq(~active | done)
        with m.If(done):
            m.d.sync += active.eq(0)
        with m.If(jobs.r_en & jobs.r_rdy):
            beats = (data.View(job_l, jobs.r_data).length + 7) >> 3
            m.d.sync += [cj.eq(jobs.r_data), active.eq(1), out_cnt.eq(0), in_cnt.eq(0),
                         ended.eq(0), err.eq(0), n.eq(beats), nm1.eq(beats - 1)]
        return m

"""Decode lander: ``Op.QUERY`` payloads → their QBUF slot, a root's final ``(m, l, o)`` state →
``o / l`` → its OBUF row, the two-phase decode's all-reduced maxima (``Op.REDUCTION``,
``reduce_op = NONE``) → their MBUF slot, a tensor-parallel row's SUM all-reduce lanes (the
same kind, tagged in the SUM window) → their SUM slot, each counted after the write is acknowledged
(docs/node.md §5 "Landing engine", §7; §6 rule 1: a local sink that always drains; paper §4
end).

The slot and row rules, the drop rules, the configuration and the status counters are
:mod:`mcf.abi.decode_land`'s; :class:`mcf.golden.decode_land.DecodeLandModel` is the golden model.
The normaliser is the attention engine's arithmetic (:class:`mcf.hdl.compute.recip.Recip`,
``round_shift_var``, ``sat``: :func:`mcf.abi.softmax.normalize` bit for bit), two words per
cycle with one reciprocal per packet in flight.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.decode_land import (
    DEC_ADDR_BITS,
    DEC_ALIGN,
    DECODE_LAND_CONFIG,
    DECODE_LAND_STATUS,
    M_SLOT_BYTES,
    SUM_LEN_ALIGN,
    SUM_SLOT_BYTES,
    obuf_row_bytes,
    state_bytes,
)
from mcf.abi.framing import MAX_PAYLOAD, parsed_layout
from mcf.abi.meta import META, Op, ReduceOp
from mcf.abi.query import QUERY_HEADER, QUERY_HEADER_BYTES, query_head_bytes
from mcf.abi.softmax import LANE_BITS, RECIP_IN_BITS

from ..compute.fixed_ops import round_shift_var, sat
from ..compute.recip import Recip
from ..mem.axi import AXI4Signature
from ..mem.dma import align_down
from .packet_writer import (
    PACKET_WIDTH,
    LandingStage,
    PacketUpsizer,
    PacketWriter,
    packet_beat_layout,
)

__all__ = ["DecodeLander", "PacketUpsizer", "packet_beat_layout"]

WORDS = PACKET_WIDTH // LANE_BITS

if QUERY_HEADER_BYTES * 8 != PACKET_WIDTH:  # pragma: no cover - the header is beat 0
    raise AssertionError("the query header must fill exactly the first 64-bit beat")
if M_SLOT_BYTES & (M_SLOT_BYTES - 1):  # pragma: no cover - the MBUF offset is a shift
    raise AssertionError("M_SLOT_BYTES must be a power of two")
if SUM_SLOT_BYTES & (SUM_SLOT_BYTES - 1) or SUM_LEN_ALIGN & (SUM_LEN_ALIGN - 1):
    raise AssertionError("SUM slots and lengths must be powers of two")  # pragma: no cover


class DecodeLander(wiring.Component):
    """Lands decode queries in QBUF, normalised final states in OBUF, the two-phase decode's
    all-reduced maxima in MBUF and a row-parallel step's SUM all-reduce lanes in SUM slots.

    Parameters
    ----------
    head_dim : int
        Query head dimension (the attention engine's; ``kr260`` 128, ``sim`` 16): a final
        state is ``4 · (2 + head_dim)`` bytes, an OBUF row ``4 · head_dim``.
    axi_width : int
        Data width of the AXI4 write master (128, the HP port); a multiple of 64.
    outstanding : int
        Write bursts in flight (:class:`mcf.hdl.mem.dma.DmaWriter`).
    fifo_depth : int
        Payload FIFO entries (``axi_width``-bit words) before the writer.

    Members
    -------
    i : In(stream.Signature(parsed_layout(64)))
        Local QUERY, PARTIAL_STATE and REDUCTION packets (``LocalSink``): Meta beside every
        beat, ``last`` on the final one, ``ceil(length / 8)`` beats (a header-only packet, or
        one of length 0: one beat); ``keep`` is not used. Any other packet is dropped and
        counted.
    cfg : In(:data:`mcf.abi.decode_land.DECODE_LAND_CONFIG`)
        ``qbuf_base``, ``obuf_base``, ``mbuf_base`` (40-bit byte addresses; these, ``sum_base``
        and ``q_slot`` taken with their low 2 bits as 0: :data:`~mcf.abi.decode_land.DEC_ALIGN`,
        the DMA writer shifts by words only), ``q_slot`` (QBUF
        slot stride), ``q_heads`` (H_q), ``tag_base`` (the token's
        :func:`~mcf.abi.decode_land.decode_tag` ``(k, 0)``), ``sum_base`` and ``sum_slots``
        (the SUM window; 0 slots closes it); sampled in the two cycles after a
        packet's first beat is taken: change it only between packets.
    bus : Out(AXI4Signature(data_width=axi_width))
        Write master (AW/W/B; AR/R tied off). INCR bursts, never across 4 KiB; one AXI ID.
    status : Out(:data:`mcf.abi.decode_land.DECODE_LAND_STATUS`)
        ``queries_landed``, ``results_landed``, ``maxes_landed``, ``sums_landed`` (one cycle
        after the last B response of the packet's write, OKAY), ``drop_op``,
        ``drop_reduce_op``, ``drop_length``, ``drop_slot``, ``write_errors`` (a write answered
        SLVERR/DECERR: not landed),
        ``framing_errors`` (a landing packet whose beats disagreed with ``length``: cut, or
        padded with zeros).

    Structure: beat → stage 1 (register; slot index · ``q_slot``, row · row bytes, the same
    row index · :data:`mcf.abi.decode_land.M_SLOT_BYTES` (a shift) for MBUF, the SUM window
    test and ``(head − q_heads) · SUM_SLOT_BYTES`` (a shift), the query length
    ``8 + heads · query_head_bytes``) → stage 2 and framing guard (:class:`LandingStage`: the
    packet's fate, address, write length and kind latched on its first beat; exactly
    ``ceil(length / 8)`` beats go on) → a
    state's first beat (``m``, ``l``) feeds the reciprocal pipeline (:class:`Recip`, 3 cycles)
    whose factors queue per packet, its ``o`` beats and a query's, maxima's or SUM lanes' beats
    queue in a 16-beat FIFO → normaliser (``o · r`` registered, then
    ``sat32(round_half_up(· >> e))``, two words per beat; queries, maxima and SUM lanes pass
    unchanged) → :class:`PacketUpsizer` →
    :class:`PacketWriter` (payload FIFO → :class:`~mcf.hdl.mem.dma.DmaWriter`, one descriptor
    per packet pushed at its first beat; the packet's kind and burst count queue until its B
    responses, whose completion picks the counter).

    Latency (measured, AXI slave always ready; ``test_latency``): the first AW is valid 7
    cycles after a packet's first beat is taken, its first W beat 9 cycles after (a query,
    maxima) or 12 (a state: the reciprocal); the last W beat leaves 8 (query, maxima; 9 for a
    one-beat packet) or 10 (state) cycles after the last input beat; a count changes one cycle
    after the packet's last B handshake. Throughput: one input beat per cycle, no bubble
    between packets (a state's ``m, l`` beat costs the writer nothing; the reciprocal's 3
    cycles are absorbed once by the FIFO) while packets average at least 3 beats: the writer
    takes a descriptor every 3 cycles at best, so back-to-back maxima of one or two beats (up
    to 4 heads) alone land one per 3 cycles (``test_short_maxima_rate``); a KV head's 6
    maxima (24 B, 3 beats) run at full rate. Measured
    (``tests/test_node_decode_land.py::test_decode_land_rate``, first input beat to last
    count): 0.995 / 0.997 / 0.998 input beats per cycle for 45 back-to-back 520-B states, 33
    800-B queries, 80 of both mixed at head_dim 128; 0.967 / 0.980 / 0.987 for 72-B states and
    128-B queries at head_dim 16 (the gap is the pipeline's tail); with a quarter of the
    packets 4..32-B maxima among them, 0.997 (head_dim 128) and 0.984 (16).

    Stream rules: ``i.ready`` depends only on registers and FIFO levels (never on
    ``i.valid``); it is low only while a landing packet waits for the writer (payload FIFO, at
    most 4 queued descriptors — short maxima meet this limit first — and ``outstanding + 8``
    unacknowledged packets), while :attr:`FACTORS` final states sit between the guard and the
    normaliser (which drains into the writer), or, after a packet shorter than its ``length``,
    for the zero beats that pad it. Dropped packets are consumed at one beat per cycle;
    nothing waits on anything but the lander's own writes.
    """

    PEND = data.StructLayout({"result": unsigned(1), "maxes": unsigned(1), "sums": unsigned(1)})
    """What a packet's write carries to its completion (the :class:`PacketWriter` tag): a
    final state's OBUF row, maxima, SUM lanes, or (none) a query."""
    FACTORS = 4      # final states between the guard and the normaliser (reciprocals queued)
    MID_DEPTH = 16   # beats between the guard and the normaliser

    def __init__(self, head_dim: int, axi_width: int = 128, addr_width: int = DEC_ADDR_BITS,
                 outstanding: int = 8, fifo_depth: int = 64):
        if head_dim < 1:
            raise ValueError("head_dim must be >= 1")
        if obuf_row_bytes(head_dim) > MAX_PAYLOAD:
            raise ValueError("an OBUF row must fit in MAX_PAYLOAD bytes")
        self.head_dim, self.axi_width, self.addr_width = head_dim, axi_width, addr_width
        self.outstanding, self.fifo_depth = outstanding, fifo_depth
        self.stage_info = data.StructLayout({
            "state": unsigned(1), "maxes": unsigned(1), "sums": unsigned(1),
            "wlen": unsigned(META["length"].width), "addr": unsigned(addr_width)})
        self.writer = PacketWriter(self.PEND, axi_width=axi_width, addr_width=addr_width,
                                   outstanding=outstanding, fifo_depth=fifo_depth,
                                   align=DEC_ALIGN)
        super().__init__({
            "i": In(stream.Signature(parsed_layout(PACKET_WIDTH))),
            "cfg": In(DECODE_LAND_CONFIG),
            "bus": Out(AXI4Signature(addr_width, axi_width)),
            "status": Out(DECODE_LAND_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        aw = self.addr_width
        st, cfg = self.status, self.cfg

        def on_words(x):
            """``x`` with its low bits as 0 (:data:`~mcf.abi.decode_land.DEC_ALIGN`)."""
            return align_down(x, DEC_ALIGN)
        len_bits = META["length"].width
        row_bytes = obuf_row_bytes(self.head_dim)
        s_bytes = state_bytes(self.head_dim)
        q_len_max = ((1 << QUERY_HEADER["heads"].shape.width) - 1) * \
            query_head_bytes(self.head_dim) + QUERY_HEADER_BYTES
        slot_bits = cfg.q_heads.shape().width + 1

        # --- stage 1: beat register, slot / row products, the query's expected length -----
        s1 = Signal(data.StructLayout({
            "data": unsigned(PACKET_WIDTH), "last": unsigned(1), "first": unsigned(1),
            "op": Op, "reduce_op": ReduceOp, "length": unsigned(len_bits),
            "head": unsigned(META["kv_id"].width), "q_off": unsigned(aw),
            "o_off": unsigned(aw), "m_off": unsigned(aw), "q_len": range(q_len_max + 1),
            "sum_hit": unsigned(1), "s_off": unsigned(aw)}))
        s1_valid = Signal()
        s1_move = Signal()
        in_first = Signal(init=1)
        take = Signal()
        meta = self.i.payload.meta
        hdr = data.View(QUERY_HEADER, self.i.payload.data[:QUERY_HEADER.size])
        head = Signal(META["kv_id"].width)   # kv_id − tag_base, wrapping: abi tag_head()
        q_idx = Signal(slot_bits)
        o_idx = Signal(META["kv_id"].width + 1)
        sum_idx = Signal(META["kv_id"].width + 1)   # head − q_heads: the SUM slot
        m.d.comb += [
            self.i.ready.eq(~s1_valid | s1_move), take.eq(self.i.valid & self.i.ready),
            head.eq(meta.kv_id - cfg.tag_base),
            q_idx.eq(Mux(hdr.layer[0], cfg.q_heads, 0) + hdr.head0),
            o_idx.eq(Mux(meta.seq[0], cfg.q_heads, 0) + head),
            sum_idx.eq(head - cfg.q_heads),
        ]
        with m.If(take):
            m.d.sync += [
                s1.data.eq(self.i.payload.data), s1.last.eq(self.i.payload.last),
                s1.first.eq(in_first), s1.op.eq(meta.op), s1.reduce_op.eq(meta.reduce_op),
                s1.length.eq(meta.length), s1.head.eq(head),
                s1.q_off.eq(q_idx * on_words(cfg.q_slot)), s1.o_off.eq(o_idx * row_bytes),
                s1.m_off.eq(o_idx * M_SLOT_BYTES),
                s1.sum_hit.eq((head >= cfg.q_heads) & (sum_idx[:-1] < cfg.sum_slots)),
                s1.s_off.eq(sum_idx[:-1] * SUM_SLOT_BYTES),
                s1.q_len.eq(hdr.heads * query_head_bytes(self.head_dim) + QUERY_HEADER_BYTES),
                s1_valid.eq(1), in_first.eq(self.i.payload.last),
            ]
        with m.Elif(s1_move):
            m.d.sync += s1_valid.eq(0)
        s1_hdr = data.View(QUERY_HEADER, s1.data[:QUERY_HEADER.size])

        # --- stage 2 (LandingStage): the packet's fate and address, latched on its first beat
        is_q, is_s, is_m = Signal(), Signal(), Signal()
        q_len_ok, q_slot_ok, red_ok, s_len_ok, m_len_ok, h_slot_ok, sum_len_ok, is_sum = \
            (Signal() for _ in range(8))
        m.d.comb += [
            is_q.eq(s1.op == Op.QUERY), is_s.eq(s1.op == Op.PARTIAL_STATE),
            is_m.eq(s1.op == Op.REDUCTION),
            q_len_ok.eq((s1_hdr.heads != 0) & (s1.length <= MAX_PAYLOAD) &
                        (s1.length == s1.q_len)),
            q_slot_ok.eq((s1_hdr.head0 + s1_hdr.heads <= cfg.q_heads) &
                         (s1.length <= cfg.q_slot)),
            red_ok.eq(s1.reduce_op == ReduceOp.NONE),
            s_len_ok.eq(s1.length == s_bytes),
            m_len_ok.eq((s1.length != 0) & (s1.length[:2] == 0) &
                        (s1.length <= M_SLOT_BYTES)),
            h_slot_ok.eq(s1.head < cfg.q_heads),
            is_sum.eq(is_m & s1.sum_hit),
            sum_len_ok.eq((s1.length != 0) &
                          (s1.length[:SUM_LEN_ALIGN.bit_length() - 1] == 0) &
                          (s1.length <= SUM_SLOT_BYTES)),
        ]
        keep_q = is_q & q_len_ok & q_slot_ok
        keep_s = is_s & red_ok & s_len_ok & h_slot_ok
        keep_m = is_m & red_ok & Mux(s1.sum_hit, sum_len_ok, m_len_ok & h_slot_ok)
        m.submodules.stage = stage = LandingStage(self.stage_info)
        info = stage.i.payload.info
        m.d.comb += [stage.i.valid.eq(s1_valid), s1_move.eq(s1_valid & stage.i.ready),
                     stage.i.payload.data.eq(s1.data), stage.i.payload.first.eq(s1.first),
                     stage.i.payload.last.eq(s1.last), stage.i.payload.length.eq(s1.length),
                     stage.i.payload.keep.eq(keep_q | keep_s | keep_m),
                     info.state.eq(is_s), info.maxes.eq(is_m & ~s1.sum_hit),
                     info.sums.eq(is_sum),
                     info.addr.eq(Mux(is_q, on_words(cfg.qbuf_base) + s1.q_off,
                                      Mux(is_s, on_words(cfg.obuf_base) + s1.o_off,
                                          Mux(s1.sum_hit, on_words(cfg.sum_base) + s1.s_off,
                                              on_words(cfg.mbuf_base) + s1.m_off)))),
                     info.wlen.eq(Mux(is_s, row_bytes, s1.length))]
        with m.If(s1_move & s1.first):
            with m.If(~is_q & ~is_s & ~is_m):
                m.d.sync += st.drop_op.eq(st.drop_op + 1)
            with m.Elif(~is_q & ~red_ok):
                m.d.sync += st.drop_reduce_op.eq(st.drop_reduce_op + 1)
            with m.Elif(Mux(is_q, ~q_len_ok,
                            Mux(is_s, ~s_len_ok, Mux(s1.sum_hit, ~sum_len_ok, ~m_len_ok)))):
                m.d.sync += st.drop_length.eq(st.drop_length + 1)
            with m.Elif(Mux(is_q, ~q_slot_ok, ~is_sum & ~h_slot_ok)):
                m.d.sync += st.drop_slot.eq(st.drop_slot + 1)
        with m.If(stage.framing_error):
            m.d.sync += st.framing_errors.eq(st.framing_errors + 1)

        m.submodules.writer = wr = self.writer
        # --- after the framing guard: a state's (m, l) beat goes to the reciprocal, the others
        # to the FIFO; a first beat only with its write head --------------------------------
        mid_l = data.StructLayout({"data": unsigned(PACKET_WIDTH), "state": unsigned(1),
                                   "last": unsigned(1)})
        m.submodules.mid = mid = fifo.SyncFIFOBuffered(width=mid_l.size, depth=self.MID_DEPTH)
        fac_out = Signal(range(self.FACTORS + 1))      # factors queued or being computed
        fac_take = Signal()
        fac_free = Signal()
        m.d.comb += fac_free.eq(fac_out < self.FACTORS)
        beat = stage.o.payload
        l_beat = Signal()
        room = Signal()
        push = Signal()
        m.d.comb += [l_beat.eq(beat.info.state & beat.first),
                     room.eq(Mux(l_beat, fac_free, mid.w_rdy)),
                     stage.o.ready.eq(room & (~beat.first | wr.head.ready)),
                     push.eq(stage.o.valid & stage.o.ready),
                     wr.head.valid.eq(stage.o.valid & room & beat.first),
                     wr.head.payload.addr.eq(beat.info.addr),
                     wr.head.payload.length.eq(beat.info.wlen),
                     wr.head.payload.tag.result.eq(beat.info.state),
                     wr.head.payload.tag.maxes.eq(beat.info.maxes),
                     wr.head.payload.tag.sums.eq(beat.info.sums)]
        with m.If(push & ~l_beat):
            m.d.comb += [mid.w_en.eq(1), mid.w_data.eq(Cat(beat.data, beat.info.state,
                                                           beat.final))]

        # --- reciprocal of a state's l: normalised by its leading one, 3-cycle pipeline ---
        m.submodules.recip = recip = Recip()
        l_in = beat.data[LANE_BITS:2 * LANE_BITS]
        lead = Signal(range(LANE_BITS))
        for n in range(LANE_BITS):
            with m.If(l_in[n]):
                m.d.comb += lead.eq(n)
        m.d.comb += recip.x.eq(((l_in << (RECIP_IN_BITS - 1)) >> lead)[:RECIP_IN_BITS])
        fac_l = data.StructLayout({"r": unsigned(RECIP_IN_BITS + 1),
                                   "e": range(LANE_BITS), "zero": unsigned(1)})
        pipe = [Signal(fac_l, name=f"fac_pipe{k}") for k in range(Recip.LATENCY)]
        pipe_v = Signal(Recip.LATENCY)
        m.d.comb += fac_take.eq(push & l_beat)
        m.d.sync += [pipe_v.eq(Cat(fac_take, pipe_v[:-1])),
                     pipe[0].e.eq(lead), pipe[0].zero.eq(l_in == 0)]
        for k in range(1, Recip.LATENCY):
            m.d.sync += pipe[k].eq(pipe[k - 1])
        m.submodules.factors = fac = fifo.SyncFIFOBuffered(width=fac_l.size, depth=self.FACTORS)
        done_fac = pipe[-1]
        m.d.comb += [fac.w_en.eq(pipe_v[-1]),
                     fac.w_data.eq(Cat(recip.r, done_fac.e, done_fac.zero))]

        # --- normaliser: o · r registered, then round, shift by e, saturate --------------
        mid_head = data.View(mid_l, mid.r_data)
        fac_head = data.View(fac_l, fac.r_data)
        m.submodules.upsizer = up = PacketUpsizer(self.axi_width)
        n_l = data.StructLayout({
            "data": unsigned(PACKET_WIDTH), "state": unsigned(1), "last": unsigned(1),
            "e": range(LANE_BITS), "zero": unsigned(1),
            **{f"p{k}": signed(LANE_BITS + RECIP_IN_BITS + 2) for k in range(WORDS)}})
        nr = Signal(n_l)
        n_valid = Signal()
        pop = Signal()
        m.d.comb += [
            pop.eq(mid.r_rdy & (~n_valid | up.i.ready) & (~mid_head.state | fac.r_rdy)),
            mid.r_en.eq(pop), fac.r_en.eq(pop & mid_head.state & mid_head.last),
        ]
        with m.If(pop):
            m.d.sync += [nr.data.eq(mid_head.data), nr.state.eq(mid_head.state),
                         nr.last.eq(mid_head.last), nr.e.eq(fac_head.e),
                         nr.zero.eq(fac_head.zero), n_valid.eq(1)]
            for k in range(WORDS):
                x = mid_head.data[k * LANE_BITS:(k + 1) * LANE_BITS].as_signed()
                m.d.sync += nr[f"p{k}"].eq(x * fac_head.r)
        with m.Elif(up.i.ready):
            m.d.sync += n_valid.eq(0)
        m.d.sync += fac_out.eq(fac_out + fac_take - fac.r_en)
        ys = [Mux(nr.zero, 0, sat(round_shift_var(nr[f"p{k}"], nr.e, 63), LANE_BITS, True))
              for k in range(WORDS)]
        m.d.comb += [up.i.valid.eq(n_valid), up.i.payload.last.eq(nr.last),
                     up.i.payload.data.eq(Mux(nr.state, Cat(*ys), nr.data))]

        # --- the packet writer and its completions ---------------------------------------
        wiring.connect(m, up.o, wr.i)
        wiring.connect(m, wr.bus, wiring.flipped(self.bus))
        done = wr.done
        m.d.comb += done.ready.eq(1)
        with m.If(done.valid & done.payload.err):
            m.d.sync += st.write_errors.eq(st.write_errors + 1)
        with m.Elif(done.valid & done.payload.tag.result):
            m.d.sync += st.results_landed.eq(st.results_landed + 1)
        with m.Elif(done.valid & done.payload.tag.maxes):
            m.d.sync += st.maxes_landed.eq(st.maxes_landed + 1)
        with m.Elif(done.valid & done.payload.tag.sums):
            m.d.sync += st.sums_landed.eq(st.sums_landed + 1)
        with m.Elif(done.valid):
            m.d.sync += st.queries_landed.eq(st.queries_landed + 1)
        return m

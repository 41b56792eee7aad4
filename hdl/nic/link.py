"""Inter-board link framing (paper §5: the NIC's link ports, 10G SFP+ / 1G RGMII on the KR260).

:class:`LinkTx` turns parsed packets into frames (link header with a sequence number, the Meta
beat, the payload, a CRC-32 trailer — :mod:`mcf.abi.nic`); :class:`LinkRx` checks CRC, header
and sequence, drops bad / stale frames whole, counts every loss, and delivers wire packets
(``mcf.abi.framing.beat_layout``: Meta beat, payload) to the node's parser. The MAC/PHY side of
both is an AXI-Stream-like ``beat_layout`` stream (``data``/``keep``/``last``), so a 10GBASE-R or
RGMII MAC (with its own Ethernet FCS) can be attached later.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import (
    MAX_PAYLOAD,
    beat_layout,
    max_frame_beats,
    parsed_layout,
)
from mcf.abi.meta import META
from mcf.abi.nic import (
    CRC32_INIT,
    CRC32_XOROUT,
    CRC_BYTES,
    LINK_HEADER,
    LINK_MAGIC,
    LINK_RX_STATUS,
    LINK_TX_STATUS,
)

from .crc import CrcOfBeat
from .rx_buffer import RxFrameBuffer

__all__ = ["LinkTx", "LinkRx"]


class LinkTx(wiring.Component):
    """Link transmitter: one frame per packet.

    Members: ``i`` — ``In(stream.Signature(parsed_layout))`` (a router output);
    ``o`` — ``Out(stream.Signature(beat_layout))`` towards the MAC; ``status`` —
    ``Out(LINK_TX_STATUS)``.

    Frame: LINK_HEADER beat (``magic``, ``seq``), the Meta beat, the payload beats (a
    zero-length packet sends none), a CRC-32 beat (``keep = 0xF``, ``last``). ``seq`` counts
    frames modulo 2^16. Rate: a packet of n payload beats takes n + 3 cycles; the header beat is
    offered the cycle after the previous CRC beat left (no idle cycles). ``o.valid`` does not
    depend on ``o.ready``.
    """

    def __init__(self, *, data_width: int = 64, meta_layout: data.StructLayout = META):
        self._dw = data_width
        self._meta_layout = meta_layout
        super().__init__({
            "i": In(stream.Signature(parsed_layout(data_width, meta_layout))),
            "o": Out(stream.Signature(beat_layout(data_width, meta_layout))),
            "status": Out(LINK_TX_STATUS),
        })

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        full = (1 << (self._dw // 8)) - 1
        seq = Signal(LINK_HEADER["seq"].width)
        crc = Signal(32, init=CRC32_INIT)
        m.submodules.crc = cu = CrcOfBeat(self._dw)
        m.d.comb += [cu.crc_in.eq(crc), cu.data.eq(o.payload.data), cu.keep.eq(o.payload.keep)]
        hdr = Signal(LINK_HEADER)
        m.d.comb += [hdr.magic.eq(LINK_MAGIC), hdr.seq.eq(seq)]
        fire = o.valid & o.ready
        with m.If(fire):
            m.d.sync += [crc.eq(cu.crc_out), self.status.beats.eq(self.status.beats + 1)]
        with m.FSM():
            with m.State("HEADER"):
                m.d.comb += [o.valid.eq(i.valid), o.payload.data.eq(hdr),
                             o.payload.keep.eq(full)]
                m.d.comb += cu.crc_in.eq(CRC32_INIT)
                with m.If(fire):
                    m.next = "META"
            with m.State("META"):
                empty = i.payload.keep == 0
                m.d.comb += [o.valid.eq(i.valid), o.payload.data.eq(i.payload.meta.as_value()),
                             o.payload.keep.eq(full), i.ready.eq(o.ready & empty)]
                with m.If(fire):
                    with m.If(empty):
                        m.next = "CRC"
                    with m.Else():
                        m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                m.d.comb += [o.valid.eq(i.valid), o.payload.data.eq(i.payload.data),
                             o.payload.keep.eq(i.payload.keep), i.ready.eq(o.ready)]
                with m.If(fire & i.payload.last):
                    m.next = "CRC"
            with m.State("CRC"):
                m.d.comb += [o.valid.eq(1), o.payload.data.eq(crc ^ CRC32_XOROUT),
                             o.payload.keep.eq((1 << CRC_BYTES) - 1), o.payload.last.eq(1)]
                with m.If(fire):
                    m.d.sync += [seq.eq(seq + 1), crc.eq(CRC32_INIT),
                                 self.status.frames.eq(self.status.frames + 1)]
                    m.next = "HEADER"
        return m


class LinkRx(wiring.Component):
    """Link receiver: checks frames, delivers good packets whole, never a partial one.

    Members: ``i`` — ``In(stream.Signature(beat_layout))`` from the MAC; ``o`` —
    ``Out(stream.Signature(beat_layout))``: wire packets (Meta beat then payload, ``last`` on
    the final beat) for the node's parser; ``status`` — ``Out(LINK_RX_STATUS)``.

    A frame is stored in a receive buffer
    (:class:`~mcf.hdl.nic.rx_buffer.RxFrameBuffer`) as it arrives and committed only after its CRC
    (IEEE 802.3, over header, Meta and payload bytes) matched, its header was valid and its
    sequence number was not behind the expected one; otherwise the buffer is rolled back and
    the cause counted. A sequence number ahead of the expected one is accepted and the gap is
    counted (``seq_gaps``, ``lost_frames``): loss is never silent. Frames longer than
    ``max_payload`` (default :data:`mcf.abi.framing.MAX_PAYLOAD`) allows are dropped
    (``drop_oversize``). ``i.ready`` falls only between
    frames, while the buffer lacks room for a maximum frame. Latency: the first beat of a
    packet leaves 2 cycles after the frame's CRC beat was accepted (store and forward).
    """

    def __init__(self, *, data_width: int = 64, max_payload: int = MAX_PAYLOAD,
                 meta_layout: data.StructLayout = META):
        self._dw = data_width
        self._max_payload = max_payload
        self._meta_layout = meta_layout
        self._max_frame = max_frame_beats(data_width, max_payload)
        self._depth = 1 << (2 * self._max_frame - 1).bit_length()
        super().__init__({
            "i": In(stream.Signature(beat_layout(data_width, meta_layout))),
            "o": Out(stream.Signature(beat_layout(data_width, meta_layout))),
            "status": Out(LINK_RX_STATUS),
        })

    @property
    def max_payload(self) -> int:
        return self._max_payload

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        st = self.status
        blay = beat_layout(self._dw, self._meta_layout)
        m.submodules.fb = fb = RxFrameBuffer(blay, self._depth)
        wiring.connect(m, wiring.flipped(o), fb.o)

        # ---- write side ------------------------------------------------------------------------
        in_frame = Signal()
        bidx = Signal(range(self._max_frame + 2))
        crc = Signal(32, init=CRC32_INIT)
        held = Signal(blay)
        held_valid = Signal()
        hdr = Signal(LINK_HEADER)
        too_long = Signal()
        expected = Signal(LINK_HEADER["seq"].width)

        room = (self._depth - fb.level) >= self._max_frame
        m.d.comb += i.ready.eq(in_frame | room)
        fire = i.valid & i.ready
        m.submodules.crc = cu = CrcOfBeat(self._dw)
        m.d.comb += [cu.crc_in.eq(Mux(in_frame, crc, CRC32_INIT)), cu.data.eq(i.payload.data),
                     cu.keep.eq(i.payload.keep)]
        cur_bidx = Mux(in_frame, bidx, 0)
        cur_hdr = Signal(LINK_HEADER)
        m.d.comb += cur_hdr.eq(Mux(in_frame, hdr, i.payload.data[:LINK_HEADER.size]))

        crc_ok = ((i.payload.data[:32] == (Mux(in_frame, crc, CRC32_INIT) ^ CRC32_XOROUT))
                  & (i.payload.keep == (1 << CRC_BYTES) - 1))
        hdr_ok = (cur_hdr.magic == LINK_MAGIC) & (cur_bidx >= 2)
        ahead = Signal(LINK_HEADER["seq"].width)
        m.d.comb += ahead.eq(cur_hdr.seq - expected)
        stale = ahead[-1]
        over = too_long | (cur_bidx >= self._max_frame - 1)

        with m.If(fire):
            with m.If(~i.payload.last):
                m.d.sync += [in_frame.eq(1), crc.eq(cu.crc_out),
                             bidx.eq(Mux(over, cur_bidx, cur_bidx + 1))]
                with m.If(cur_bidx == 0):
                    m.d.sync += [hdr.eq(i.payload.data[:LINK_HEADER.size]), too_long.eq(0),
                                 held_valid.eq(0)]
                with m.Elif(over):
                    m.d.sync += too_long.eq(1)
                with m.Else():
                    m.d.sync += [held.eq(i.payload), held_valid.eq(1)]
                    m.d.comb += [fb.w_data.eq(held), fb.w_en.eq(held_valid)]
            with m.Else():
                # CRC beat: decide the frame's fate
                m.d.sync += [in_frame.eq(0), bidx.eq(0), held_valid.eq(0), too_long.eq(0),
                             crc.eq(CRC32_INIT)]
                good = Signal()
                m.d.comb += fb.wr_to.eq(fb.commit)         # a dropped frame: roll back
                with m.If(too_long):
                    m.d.sync += st.drop_oversize.eq(st.drop_oversize + 1)
                with m.Elif(~crc_ok):
                    m.d.sync += st.crc_errors.eq(st.crc_errors + 1)
                with m.Elif(~hdr_ok | ~held_valid):
                    m.d.sync += st.drop_bad_header.eq(st.drop_bad_header + 1)
                with m.Elif(stale):
                    m.d.sync += st.drop_stale.eq(st.drop_stale + 1)
                with m.Else():
                    m.d.comb += good.eq(1)
                m.d.comb += fb.wr_load.eq(~good)
                with m.If(good):
                    last_beat = Signal(blay)
                    m.d.comb += [last_beat.eq(held), last_beat.last.eq(1),
                                 fb.w_data.eq(last_beat), fb.w_en.eq(1),
                                 fb.commit_load.eq(1), fb.commit_to.eq(fb.wr + 1)]
                    m.d.sync += [expected.eq(cur_hdr.seq + 1),
                                 st.frames_ok.eq(st.frames_ok + 1)]
                    with m.If(ahead != 0):
                        m.d.sync += [st.seq_gaps.eq(st.seq_gaps + 1),
                                     st.lost_frames.eq(st.lost_frames + ahead)]
        return m

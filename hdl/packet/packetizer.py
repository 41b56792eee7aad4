"""Packetization buffer (paper §5, "Compute engine → packetization buffer → NIC").

The compute side pushes metadata and payload on two independent streams; a metadata FIFO and a
payload FIFO decouple it from the NIC, and an output stage joins them into the wire format of
:mod:`mcf.abi.framing`: ``Packet = {Meta, Payload}``.
"""

from __future__ import annotations

from amaranth import Const, Module, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import PACKETIZER_STATUS
from mcf.abi.framing import beat_layout
from mcf.abi.meta import META

from .stage import PacketStage

__all__ = ["Packetizer"]


class Packetizer(PacketStage):
    """Metadata FIFO + payload FIFO → one packet stream.

    Parameters
    ----------
    data_width : int
        Bits per beat (a multiple of 8; the metadata must fit in one beat).
    meta_layout : StructLayout
        Metadata layout (default :data:`mcf.abi.meta.META`); ``length`` is read from it.
    meta_depth, payload_depth : int
        FIFO depths in entries (metadata words / payload beats). At least 4 each.

    Members
    -------
    i_meta : In(stream.Signature(meta_layout))
        One word per packet, in packet order.
    i_payload : In(stream.Signature(beat_layout(data_width)))
        Payload beats, bytes packed from byte 0. A packet with ``meta.length > 0`` takes the beats
        up to and including the next one with ``last`` set; a packet with ``meta.length == 0``
        takes none. ``data``/``keep``/``last`` are forwarded unchanged, so the producer must
        send ``payload_beats(length)`` beats and the final ``keep`` of ``keep_mask(length)``;
        a producer that does not makes a malformed packet that the parser drops and counts.
    o_packet : Out(stream.Signature(beat_layout(data_width)))
        Header beat (metadata in the low bits, zero above, ``keep`` all ones, ``last`` iff
        ``length == 0``), then the payload beats.
    status : Out(PACKETIZER_STATUS)
        ``packets``: packets sent (``last`` beats transferred); ``beats``: all beats sent,
        headers included. 32-bit, wrapping.

    Stream rules and timing
    -----------------------
    Both inputs are accepted whenever their FIFO has room, independent of the output, so the
    compute side keeps producing while the NIC is congested until a FIFO fills; nothing is ever
    dropped or reordered. Latency from a word entering an empty FIFO to its beat on
    ``o_packet`` is 2 cycles (FIFO write + buffered read register). With both FIFOs non-empty
    and ``o_packet.ready`` high, one beat leaves every cycle, header included: a packet of
    ``n`` payload beats takes exactly ``n + 1`` cycles (header overhead 1 beat).
    """

    def __init__(self, data_width: int = 128, meta_layout: data.StructLayout = META, *,
                 meta_depth: int = 16, payload_depth: int = 512):
        if meta_depth < 4 or payload_depth < 4:
            raise ValueError("FIFO depths must be at least 4")
        self._meta_depth = meta_depth
        self._payload_depth = payload_depth
        beat = beat_layout(data_width, meta_layout)
        super().__init__(data_width, meta_layout, {
            "i_meta": In(stream.Signature(meta_layout)),
            "i_payload": In(stream.Signature(beat)),
            "o_packet": Out(stream.Signature(beat)),
            "status": Out(PACKETIZER_STATUS),
        })

    @property
    def meta_depth(self) -> int:
        return self._meta_depth

    @property
    def payload_depth(self) -> int:
        return self._payload_depth

    def elaborate(self, platform):
        m = Module()
        beat = beat_layout(self._data_width, self._meta_layout)

        m.submodules.meta_fifo = meta_fifo = fifo.SyncFIFOBuffered(
            width=self._meta_layout.size, depth=self._meta_depth)
        m.submodules.payload_fifo = payload_fifo = fifo.SyncFIFOBuffered(
            width=beat.size, depth=self._payload_depth)
        wiring.connect(m, wiring.flipped(self.i_meta), meta_fifo.w_stream)
        wiring.connect(m, wiring.flipped(self.i_payload), payload_fifo.w_stream)

        head = data.View(self._meta_layout, meta_fifo.r_stream.payload)
        body = data.View(beat, payload_fifo.r_stream.payload)
        in_payload = Signal()   # header of the current packet sent, payload beats follow
        out = self.o_packet
        keep_bits = len(out.payload.keep)

        with m.If(~in_payload):
            zero_length = head.length == 0
            m.d.comb += [
                out.valid.eq(meta_fifo.r_stream.valid),
                out.payload.data.eq(head.as_value()),
                out.payload.keep.eq(Const((1 << keep_bits) - 1, keep_bits)),
                out.payload.last.eq(zero_length),
                meta_fifo.r_stream.ready.eq(out.ready),
            ]
            with m.If(out.valid & out.ready & ~zero_length):
                m.d.sync += in_payload.eq(1)
        with m.Else():
            m.d.comb += [
                out.valid.eq(payload_fifo.r_stream.valid),
                out.payload.eq(body),
                payload_fifo.r_stream.ready.eq(out.ready),
            ]
            with m.If(out.valid & out.ready & body.last):
                m.d.sync += in_payload.eq(0)

        with m.If(out.valid & out.ready):
            m.d.sync += self.status.beats.eq(self.status.beats + 1)
            with m.If(out.payload.last):
                m.d.sync += self.status.packets.eq(self.status.packets + 1)
        return m

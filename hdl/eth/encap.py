"""Ethernet encapsulation of link frames on 8-bit streams (issue #13 item 1, ``mcf.abi.eth``).

8 bits, not 64: the 1G MAC moves one byte per 125 MHz cycle (GMII), so header insertion,
padding, the byte-serial FCS and the receive checks are a byte counter and a CRC-32 over one
byte each cycle — no lane shifting of a 14-byte header across 64-bit beats. The 64 ↔ 8
conversion happens once, beside the clock-crossing FIFOs (:class:`Unpack64to8`,
:class:`Pack8to64`). The 10G MAC will need a 64-bit variant (later step).

Byte streams: :data:`BYTE` (``data``, ``last``); the MAC's receive side :data:`RX_BYTE` adds
``err`` (``rx_er`` seen on that byte); the decapsulator's output :data:`LINK_BYTE` adds
``flush`` (this byte ends a 64-bit beat of ``mcf.abi.framing.beat_layout(64)``).
"""

from __future__ import annotations

from amaranth import Array, Const, Module, Mux, Signal
from amaranth.hdl import unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import (
    ETH_EVENT,
    ETH_STATUS,
    ETH_TYPE,
    FCS_BYTES,
    HEADER_BYTES,
    LENGTH_BYTES,
    LENGTH_OFFSET,
    LENGTH_SHIFT,
    LINK_OVERHEAD,
    MAC_OUI,
    MAC_RX_BUFFER_BYTES,
    MAX_LINK_FRAME,
    MIN_PAYLOAD,
    NODE_BITS,
    RX_COUNTER,
    EthDrop,
)
from mcf.abi.framing import beat_layout
from mcf.abi.meta import META
from mcf.abi.nic import CRC32_INIT, CRC32_XOROUT
from mcf.hdl.nic.crc import crc32_update
from mcf.hdl.nic.rx_buffer import RxFrameBuffer

from .rx_verdict import RxVerdict

__all__ = ["BYTE", "RX_BYTE", "LINK_BYTE", "EthEncap", "FrameDecap", "EthDecap", "Pack8to64",
           "Unpack64to8", "EthCounters"]

BYTE = data.StructLayout({"data": unsigned(8), "last": unsigned(1)})
RX_BYTE = data.StructLayout({"data": unsigned(8), "last": unsigned(1), "err": unsigned(1)})
LINK_BYTE = data.StructLayout({"data": unsigned(8), "last": unsigned(1), "flush": unsigned(1)})


def _mac_bytes(node) -> list:
    """The 6 bytes (wire order) of ``mac_of(node)`` for a node-id signal."""
    oui = [Const(MAC_OUI >> (8 * k) & 0xFF, 8) for k in (3, 2, 1, 0)]
    n16 = node.as_unsigned() if hasattr(node, "as_unsigned") else node
    return [*oui, n16.shift_right(8)[:8] if len(n16) > 8 else Const(0, 8), n16[:8]]


class EthEncap(wiring.Component):
    """Link frame bytes → Ethernet frame bytes (dst, src, EtherType, link frame, zero padding to
    46 payload bytes, FCS).

    Members: ``i`` — ``In(stream.Signature(BYTE))`` the kept bytes of one link frame, ``last``
    on its final byte; ``o`` — ``Out(stream.Signature(BYTE))`` the frame dst..FCS, ``last`` on
    the final FCS byte; ``local_id``/``peer_id`` — ``In(NODE_BITS)``: src is ``mac_of(local)``,
    dst ``mac_of(peer)``; ``event`` — ``Out(stream.Signature(ETH_EVENT))``: one ``cause = 0``
    record (frame bytes) per frame sent, ``valid`` for one cycle, ``ready`` ignored.

    Throughput: one byte per cycle while ``i`` has bytes (a frame of n ≥ 64 bytes takes n
    cycles). ``o.valid`` in the header waits for the link frame's first byte, so a frame leaves
    without holes when its bytes arrive without holes. Frames of any length pass (no limit).
    """

    def __init__(self):
        super().__init__({"i": In(stream.Signature(BYTE)), "o": Out(stream.Signature(BYTE)),
                          "local_id": In(NODE_BITS), "peer_id": In(NODE_BITS),
                          "event": Out(stream.Signature(ETH_EVENT))})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        cnt = Signal(16)               # bytes sent of this frame
        crc = Signal(32, init=CRC32_INIT)
        fcs_idx = Signal(2)
        hdr = Array([*_mac_bytes(self.peer_id), *_mac_bytes(self.local_id),
                     Const(ETH_TYPE >> 8, 8), Const(ETH_TYPE & 0xFF, 8)])
        fire = o.valid & o.ready
        fcs = crc ^ CRC32_XOROUT
        end_pad = HEADER_BYTES + MIN_PAYLOAD - 1     # index of the last byte before the FCS
        with m.FSM() as fsm:
            with m.State("HDR"):
                m.d.comb += [o.valid.eq(i.valid), o.payload.data.eq(hdr[cnt[:4]])]
                with m.If(fire & (cnt == HEADER_BYTES - 1)):
                    m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += [o.valid.eq(i.valid), o.payload.data.eq(i.payload.data),
                             i.ready.eq(o.ready)]
                with m.If(fire & i.payload.last):
                    with m.If(cnt < end_pad):
                        m.next = "PAD"
                    with m.Else():
                        m.next = "FCS"
            with m.State("PAD"):
                m.d.comb += [o.valid.eq(1), o.payload.data.eq(0)]
                with m.If(fire & (cnt >= end_pad)):
                    m.next = "FCS"
            with m.State("FCS"):
                m.d.comb += [o.valid.eq(1), o.payload.data.eq(fcs.word_select(fcs_idx, 8)),
                             o.payload.last.eq(fcs_idx == FCS_BYTES - 1)]
                with m.If(fire):
                    m.d.sync += fcs_idx.eq(fcs_idx + 1)
                    with m.If(fcs_idx == FCS_BYTES - 1):
                        m.d.sync += [crc.eq(CRC32_INIT), cnt.eq(0)]
                        m.d.comb += [self.event.valid.eq(1),     # cause 0: a sent frame
                                     self.event.payload.cause.eq(0),  # (assigned beside the
                                     self.event.payload.bytes.eq(cnt + 1)]  # count: ALWNEVER)
                        m.next = "HDR"
                    with m.Else():
                        m.d.sync += cnt.eq(Mux(cnt.all(), cnt, cnt + 1))
        with m.If(fire & ~fsm.ongoing("FCS")):
            m.d.sync += [cnt.eq(Mux(cnt.all(), cnt, cnt + 1)),
                         crc.eq(crc32_update(crc, o.payload.data, 1))]
        return m


class FrameDecap(wiring.Component):
    """The members and buffer size both decapsulators (:class:`EthDecap`,
    :class:`~mcf.hdl.eth.xgmii.XgmiiDecap`) share: ``i`` — ``In(stream.Signature(i_shape))``,
    ``o`` — ``Out(stream.Signature(o_shape))``, ``local_id`` — ``In(NODE_BITS)``, ``event`` —
    ``Out(stream.Signature(ETH_EVENT))``; a frame buffer of ``depth`` words of ``word_bytes``
    bytes, a power of 2 holding a largest link frame (``ValueError`` otherwise). No logic."""

    def __init__(self, depth: int, word_bytes: int, i_shape, o_shape):
        if depth & (depth - 1) or word_bytes * depth < MAX_LINK_FRAME:
            raise ValueError("depth must be a power of 2 holding a largest link frame")
        self._depth = depth
        super().__init__({"i": In(stream.Signature(i_shape)),
                          "o": Out(stream.Signature(o_shape)),
                          "local_id": In(NODE_BITS),
                          "event": Out(stream.Signature(ETH_EVENT))})


class EthDecap(FrameDecap):
    """Ethernet frame bytes → link frame bytes, store and forward: checks every frame and
    delivers the good ones whole, never a partial one.

    Members: ``i`` — ``In(stream.Signature(RX_BYTE))`` the frame dst..FCS from the MAC,
    ``last`` on its final byte, ``err`` on any byte received with ``rx_er``; ``i.ready`` is
    always 1 (a MAC cannot wait). ``o`` — ``Out(stream.Signature(LINK_BYTE))``: the link frame
    (padding and FCS stripped), ``flush`` on the last byte of each 64-bit beat of
    ``beat_layout(64)`` (header, Meta, the payload's beats — the last one partial — and the CRC
    beat), ``last`` on its final byte. ``local_id`` — ``In(NODE_BITS)``: frames for
    ``mac_of(local_id)`` only. ``event`` — ``Out(stream.Signature(ETH_EVENT))``: one record
    per frame (``cause`` :class:`mcf.abi.eth.EthDrop`, frame bytes), ``valid`` for one cycle,
    ``ready`` ignored.

    The bytes of a frame are written into a ``depth``-byte buffer
    (:class:`~mcf.hdl.nic.rx_buffer.RxFrameBuffer`) as they arrive; at the FCS
    the checks of :func:`mcf.abi.eth.decap` decide (same order:
    :class:`~mcf.hdl.eth.rx_verdict.RxVerdict`), and the link frame's bytes
    are committed or the write pointer rolled back. A frame with a byte that found the buffer
    full (the output stalled) is dropped as ``OVERFLOW``; the reader drains while a frame
    arrives, so at line rate with ``o.ready`` high a 4,096-byte buffer never overflows.
    Latency: the first byte is offered 2 cycles after the frame's last byte; throughput one
    byte per cycle.
    """

    def __init__(self, *, depth: int = MAC_RX_BUFFER_BYTES):
        super().__init__(depth, 1, RX_BYTE, LINK_BYTE)

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        m.submodules.fb = fb = RxFrameBuffer(LINK_BYTE, self._depth)
        wiring.connect(m, wiring.flipped(o), fb.o)
        commit = fb.commit

        # ---- write side ------------------------------------------------------------------------
        m.d.comb += i.ready.eq(1)
        fire = i.valid
        byte = i.payload.data
        k = Signal(16)                  # bytes of this frame before the current one
        crc = Signal(32, init=CRC32_INIT)
        err = Signal()
        room = Signal()
        dst_ok = Signal()
        etype = Signal(16)
        lraw = Signal(8 * LENGTH_BYTES)
        ll = Signal(16)                 # link frame length from its Meta
        m.d.comb += ll.eq(LINK_OVERHEAD + (lraw >> LENGTH_SHIFT)[:META["length"].width])
        first = k == 0
        full = fb.level == self._depth
        p = k - HEADER_BYTES            # link byte index (when k >= 14)
        mac = Array(_mac_bytes(self.local_id))
        crc_from = Signal(32)         # a signal: crc32_update takes its bits one by one
        m.d.comb += crc_from.eq(Mux(first, CRC32_INIT, crc))
        crc_next = crc32_update(crc_from, byte, 1)
        dst_now = Mux(first, 1, dst_ok) & ((k >= 6) | (byte == mac[k[:3]]))

        in_link = (k >= HEADER_BYTES) & (p < MAX_LINK_FRAME)
        room_now = Mux(first, 1, room) & ~(in_link & full)
        w = fb.w_data
        m.d.comb += [w.data.eq(byte), w.last.eq(p == ll - 1),
                     w.flush.eq(((p[:3] == 7) & (p < ll - 4)) | (p == ll - 1) | (p == ll - 5)),
                     fb.w_en.eq(fire & in_link & room_now)]
        with m.If(fire):
            m.d.sync += [k.eq(Mux(k.all(), k, k + 1)), crc.eq(crc_next),
                         err.eq(Mux(first, 0, err) | i.payload.err), room.eq(room_now),
                         dst_ok.eq(dst_now)]
            with m.If(k == 12):
                m.d.sync += etype[8:].eq(byte)
            with m.If(k == 13):
                m.d.sync += etype[:8].eq(byte)
            for b in range(LENGTH_BYTES):
                with m.If(p == LENGTH_OFFSET + b):
                    m.d.sync += lraw[8 * b:8 * b + 8].eq(byte)

        # ---- the decision at the frame's last byte -------------------------------------------
        n = Signal(16)
        m.d.comb += n.eq(Mux(k.all(), k, k + 1))
        m.submodules.verdict = verdict = RxVerdict()
        m.d.comb += [verdict.phy_err.eq(err | i.payload.err), verdict.room.eq(room_now),
                     verdict.frame_bytes.eq(n), verdict.crc.eq(crc_next),
                     verdict.ethertype.eq(etype), verdict.dst_ok.eq(dst_ok),
                     verdict.link_bytes.eq(ll)]
        cause = verdict.cause
        with m.If(fire & i.payload.last):
            m.d.comb += [self.event.valid.eq(1), self.event.payload.cause.eq(cause),
                         self.event.payload.bytes.eq(n)]
            m.d.sync += k.eq(0)
            m.d.comb += [fb.wr_load.eq(1), fb.wr_to.eq(commit)]
            with m.If(cause == EthDrop.OK):
                m.d.comb += [fb.commit_load.eq(1), fb.commit_to.eq(commit + ll),
                             fb.wr_to.eq(commit + ll)]
        return m


class Pack8to64(wiring.Component):
    """Link frame bytes (:data:`LINK_BYTE`) → ``beat_layout(64)`` beats: bytes fill a beat from
    byte 0; ``flush`` (or ``last``) closes it, ``keep`` marks the bytes filled.

    Members: ``i`` — ``In(stream.Signature(LINK_BYTE))``, ``o`` —
    ``Out(stream.Signature(beat_layout(64)))``. Throughput one byte per cycle; a beat leaves
    one cycle after its closing byte (``o`` is registered)."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(LINK_BYTE)),
                          "o": Out(stream.Signature(beat_layout(64)))})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        acc = Signal(56)
        idx = Signal(3)
        m.d.comb += i.ready.eq(~o.valid | o.ready)
        with m.If(o.valid & o.ready):
            m.d.sync += o.valid.eq(0)
        with m.If(i.valid & i.ready):
            word = Signal(64)
            m.d.comb += word.eq(acc | (i.payload.data << (idx * 8)))
            with m.If(i.payload.flush | i.payload.last | (idx == 7)):
                m.d.sync += [o.valid.eq(1), o.payload.data.eq(word),
                             o.payload.keep.eq((Const(2, 9) << idx) - 1),
                             o.payload.last.eq(i.payload.last), acc.eq(0), idx.eq(0)]
            with m.Else():
                m.d.sync += [acc.eq(word[:56]), idx.eq(idx + 1)]
        return m


class Unpack64to8(wiring.Component):
    """``beat_layout(64)`` beats → bytes (:data:`BYTE`): the kept bytes of each beat (``keep``
    contiguous from byte 0), ``last`` on the final kept byte of a ``last`` beat. A beat with
    ``keep == 0`` is dropped (its ``last`` with it).

    Members: ``i`` — ``In(stream.Signature(beat_layout(64)))``, ``o`` —
    ``Out(stream.Signature(BYTE))``. Throughput one byte per cycle, no bubble between beats
    when the next beat is waiting."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(beat_layout(64))),
                          "o": Out(stream.Signature(BYTE))})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        beat = Signal(beat_layout(64))
        have = Signal()
        idx = Signal(3)
        top = Signal(3)
        for b in range(8):
            with m.If(beat.keep[b]):
                m.d.comb += top.eq(b)
        end = idx == top
        m.d.comb += [o.valid.eq(have), o.payload.data.eq(beat.data.word_select(idx, 8)),
                     o.payload.last.eq(end & beat.last),
                     i.ready.eq(~have | (o.ready & end))]
        with m.If(o.valid & o.ready):
            m.d.sync += idx.eq(idx + 1)
            with m.If(end):
                m.d.sync += have.eq(0)
        with m.If(i.valid & i.ready):
            m.d.sync += [beat.eq(i.payload), idx.eq(0), have.eq(i.payload.keep != 0)]
        return m


class EthCounters(wiring.Component):
    """:data:`mcf.abi.eth.ETH_STATUS` from the event records of one link's encapsulator
    (``tx_event``: sent frames, ``cause`` ``PHY_ERROR`` for an underrun) and decapsulator
    (``rx_event``). Both inputs are always ready; one record of each per cycle."""

    def __init__(self):
        super().__init__({"tx_event": In(stream.Signature(ETH_EVENT)),
                          "rx_event": In(stream.Signature(ETH_EVENT)),
                          "status": Out(ETH_STATUS)})

    def elaborate(self, platform):
        m = Module()
        st, tx, rx = self.status, self.tx_event, self.rx_event
        m.d.comb += [tx.ready.eq(1), rx.ready.eq(1)]
        with m.If(tx.valid):
            m.d.sync += [st.tx_frames.eq(st.tx_frames + 1),
                         st.tx_bytes.eq(st.tx_bytes + tx.payload.bytes)]
            with m.If(tx.payload.cause != EthDrop.OK):
                m.d.sync += st.tx_underruns.eq(st.tx_underruns + 1)
        with m.If(rx.valid):
            with m.If(rx.payload.cause == EthDrop.OK):
                m.d.sync += [st.rx_frames.eq(st.rx_frames + 1),
                             st.rx_bytes.eq(st.rx_bytes + rx.payload.bytes)]
            for cause, name in RX_COUNTER.items():
                with m.If(rx.payload.cause == cause):
                    m.d.sync += st[name].eq(st[name] + 1)
        return m

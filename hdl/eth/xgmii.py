"""64-bit XGMII MAC for the 10G SFP+ link (IEEE 802.3 clause 46; issue #13 item 3;
``docs/eth.md`` §5). One 64-bit word (8 lanes, ``data`` + ``ctrl``) per cycle at 156.25 MHz.

* :class:`EthEncap64` — link frame beats → Ethernet frame beats dst..link frame (the 14-byte
  header inserted, the link frame's partial payload beat closed up), any clock.
* :class:`XgmiiTx` — frame beats → XGMII: /S/ + preamble + SFD, the frame zero-padded to 60
  bytes, FCS, /T/, then the inter-frame gap with the deficit idle count; starts on lane 0 or 4.
* :class:`XgmiiRx` — XGMII → frame beats (start on lane 0 or 4), errors marked.
* :class:`XgmiiDecap` — store-and-forward receive checks (same order as
  :func:`mcf.abi.eth.decap`) and the link frame rebuilt as ``beat_layout(64)`` beats.

The golden model of the XGMII side is :func:`mcf.golden.eth10g.xgmii_tx` / ``xgmii_rx``; of the
frames :func:`mcf.abi.eth.encap` / ``decap``.
"""

from amaranth import Array, Cat, Const, Module, Mux, Signal
from amaranth.hdl import Value, signed, unsigned
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import (
    DIC_MAX,
    ETH_EVENT,
    ETH_TYPE,
    FCS_BYTES,
    HEADER_BYTES,
    LENGTH_OFFSET,
    LENGTH_SHIFT,
    LINK_OVERHEAD,
    MAX_FRAME,
    MAX_LINK_FRAME,
    MIN_FRAME,
    NODE_BITS,
    PREAMBLE,
    SFD,
    XGMII_ERROR,
    XGMII_IDLE,
    XGMII_MIN_IFG,
    XGMII_START,
    XGMII_TERM,
    EthDrop,
)
from mcf.abi.framing import beat_layout
from mcf.abi.meta import META
from mcf.abi.nic import CRC32_INIT, CRC32_XOROUT
from mcf.hdl.nic.crc import crc32_update

from .encap import FrameDecap, _mac_bytes
from .rx_verdict import RxVerdict

__all__ = ["RX64", "EthEncap64", "XgmiiTx", "XgmiiRx", "XgmiiDecap"]

RX64 = data.StructLayout({"data": unsigned(64), "n": unsigned(4), "last": unsigned(1),
                          "err": unsigned(1)})
"""Received frame beat: ``n`` bytes (0..8) of ``data`` from byte 0, ``last`` on the frame's
final beat (possibly ``n = 0``), ``err`` (on the last beat) for a frame aborted by an XGMII
error or a broken preamble."""

_BODY = MIN_FRAME - FCS_BYTES           # 60: frame bytes before the FCS, padding included
_IDLE_WORD = int.from_bytes(bytes([XGMII_IDLE] * 8), "little")
_ERROR_WORD = int.from_bytes(bytes([XGMII_ERROR] * 8), "little")
_START_WORD = int.from_bytes(bytes([XGMII_START]) + PREAMBLE[1:] + bytes([SFD]), "little")
assert LENGTH_OFFSET >= 8 and LENGTH_OFFSET * 8 + LENGTH_SHIFT + META["length"].width <= 128


def _keep_count(m, keep, name):
    """Bytes kept by a contiguous-from-0 ``keep`` (0..8)."""
    n = Signal(4, name=name)
    for b in range(8):
        with m.If(keep[b]):
            m.d.comb += n.eq(b + 1)
    return n


def _crc_n(m, crc, word, n, name):
    """CRC-32 register after the first ``n`` (0..8) bytes of ``word``."""
    out = Signal(32, name=name)
    c = Signal(32, name=f"{name}_in")           # one net, not an expression per XOR term
    w = Signal(64, name=f"{name}_data")
    m.d.comb += [c.eq(crc), w.eq(word), out.eq(c)]
    crc, word = c, w
    with m.Switch(n):
        for k in range(1, 9):
            with m.Case(k):
                m.d.comb += out.eq(crc32_update(crc, word, k))
    return out


def _mask(n):
    """Byte mask (8 bits) of the first ``n`` bytes."""
    return (Const(1, 9) << n) - 1


class EthEncap64(wiring.Component):
    """Link frame beats → Ethernet frame beats: dst ``mac_of(peer_id)``, src
    ``mac_of(local_id)``, EtherType, then the link frame's kept bytes closed up (no padding,
    no FCS: :class:`XgmiiTx` adds them).

    Members: ``i`` — ``In(stream.Signature(beat_layout(64)))`` (``keep`` contiguous from byte
    0, any beat partial); ``o`` — ``Out(stream.Signature(beat_layout(64)))`` full beats but
    the last; ``local_id``/``peer_id`` — ``In(NODE_BITS)``. Throughput: one beat per cycle
    each way, plus one header cycle per frame and one when the last beat overflows.
    Combinational (no latency)."""

    def __init__(self):
        super().__init__({"i": In(stream.Signature(beat_layout(64))),
                          "o": Out(stream.Signature(beat_layout(64))),
                          "local_id": In(NODE_BITS), "peer_id": In(NODE_BITS)})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        hdr = []
        for k, v in enumerate([*_mac_bytes(self.peer_id), *_mac_bytes(self.local_id),
                               Const(ETH_TYPE >> 8, 8), Const(ETH_TYPE & 0xFF, 8)]):
            hdr.append(Signal(8, name=f"hdr{k}"))
            m.d.comb += hdr[-1].eq(v)            # (a node id narrower than 8 bits: widen)
        acc = Signal(56)
        cnt = Signal(4)                      # bytes held in acc (0..7)
        kb = _keep_count(m, i.payload.keep, "kb")
        merged = Signal(120)
        total = Signal(5)
        kept = i.payload.data & Cat(*[Mux(i.payload.keep[b], Const(0xFF, 8), Const(0, 8))
                                      for b in range(8)])
        m.d.comb += [merged.eq(acc | (kept << (cnt * 8))), total.eq(cnt + kb)]
        with m.FSM():
            with m.State("HDR"):
                m.d.comb += [o.valid.eq(i.valid), o.payload.data.eq(Cat(*hdr[:8])),
                             o.payload.keep.eq(0xFF)]
                with m.If(o.valid & o.ready):
                    m.d.sync += [acc.eq(Cat(*hdr[8:])), cnt.eq(HEADER_BYTES - 8)]
                    m.next = "BODY"
            with m.State("BODY"):
                emit = (total >= 8) | i.payload.last
                m.d.comb += [o.valid.eq(i.valid & emit), o.payload.data.eq(merged[:64]),
                             o.payload.keep.eq(Mux(total >= 8, 0xFF, _mask(total))),
                             o.payload.last.eq(i.payload.last & (total <= 8)),
                             i.ready.eq(Mux(emit, o.ready, 1))]
                with m.If(i.valid & i.ready):
                    with m.If(emit):
                        m.d.sync += [acc.eq(merged[64:]), cnt.eq(total - 8)]
                        with m.If(i.payload.last):
                            with m.If(total > 8):
                                m.next = "FLUSH"
                            with m.Else():
                                m.d.sync += cnt.eq(0)
                                m.next = "HDR"
                    with m.Else():
                        m.d.sync += [acc.eq(merged[:56]), cnt.eq(total)]
            with m.State("FLUSH"):
                m.d.comb += [o.valid.eq(1), o.payload.data.eq(acc),
                             o.payload.keep.eq(_mask(cnt)), o.payload.last.eq(1)]
                with m.If(o.ready):
                    m.d.sync += cnt.eq(0)
                    m.next = "HDR"
        return m


class XgmiiTx(wiring.Component):
    """XGMII transmitter (64 bits, clause 46).

    Members: ``i`` — ``In(stream.Signature(beat_layout(64)))`` frames dst..payload, full
    beats but the last (from :class:`EthEncap64`); ``txd``/``txc`` — ``Out(64)``/``Out(8)``
    the XGMII word (registered); ``event`` — ``Out(stream.Signature(ETH_EVENT))`` one record
    per frame sent (bytes dst..FCS; ``cause`` ``PHY_ERROR`` when ``i`` ran dry inside it: that
    word went out as /E/), ``valid`` for one cycle, ``ready`` ignored.

    Each frame: /S/ + 6 × 0x55 + SFD on lane 0 or 4, the bytes, zero padding to 60, the FCS,
    /T/; the next /S/ at least 12 bytes after /T/ (counted from it) less the idles the deficit
    idle count (0..``DIC_MAX``) lets it delete to reach lane 0 or 4 — on average exactly 12
    (:func:`mcf.golden.eth10g.xgmii_tx`). Throughput: line rate while ``i`` keeps up.
    Latency: the /S/ word leaves 2 cycles after the first beat is offered (1 more on lane 4).
    Under an ``EnableInserter`` (the PCS's gearbox) the owner ANDs ``i.ready`` and
    ``event.valid`` with the enable.
    """

    def __init__(self):
        super().__init__({"i": In(stream.Signature(beat_layout(64))),
                          "txd": Out(64), "txc": Out(8),
                          "event": Out(stream.Signature(ETH_EVENT))})

    def elaborate(self, platform):
        m = Module()
        i = self.i
        aw = Signal(64)                      # the aligned word (frame start on lane 0)
        ac = Signal(8)
        prev_w = Signal(64, init=_IDLE_WORD)
        prev_c = Signal(8, init=0xFF)
        off = Signal()                       # this frame started on lane 4
        cnt = Signal(16)                     # frame bytes sent (before the FCS)
        crc = Signal(32, init=CRC32_INIT)
        gap = Signal(range(32))              # bytes still to pass from this cycle's word
        dic = Signal(range(DIC_MAX + 1))
        err = Signal()
        tail_w = Signal(64)
        tail_c = Signal(8)

        padding = Signal()                   # PAD state: the word is zero, not from i
        kb = Signal(4)
        m.d.comb += kb.eq(Mux(padding, 0, _keep_count(m, i.payload.keep, "kb_in")))
        # pad_to: bytes this word must carry (padding included); more: padding continues after
        # this word. Both are functions of cnt, held in registers updated with cnt (from the
        # value cnt takes), so no subtract or compare of cnt precedes the word's lanes
        pad_to = Signal(4, init=8)
        more = Signal(init=1)

        def set_cnt(value):
            value = value[:len(cnt)] if isinstance(value, Value) else Const(value, len(cnt))
            room = Signal(signed(18))
            m.d.comb += room.eq(_BODY - value)
            return [cnt.eq(value), pad_to.eq(Mux(room >= 8, 8, Mux(room > 0, room[:4], 0))),
                    more.eq(room > 8)]
        assert _BODY > 8                     # the inits: cnt = 0
        nb = Signal(4)
        m.d.comb += nb.eq(Mux(kb > pad_to, kb, pad_to))
        byte_mask = Cat(*[Mux(k < nb, Const(0xFF, 8), Const(0, 8)) for k in range(8)])
        keep_mask = Cat(*[Mux(i.payload.keep[k], Const(0xFF, 8), Const(0, 8))
                          for k in range(8)])
        dword = Signal(64)
        m.d.comb += dword.eq(Mux(padding, 0, i.payload.data & keep_mask & byte_mask))
        # the CRC step and the end lanes read only bytes 0..nb-1 of the word, where byte_mask
        # is all ones: they take the word without it (byte_mask, after nb, is not on the path)
        cword = Signal(64)
        m.d.comb += cword.eq(Mux(padding, 0, i.payload.data & keep_mask))
        crc_next = _crc_n(m, crc, cword, nb, "crc_next")
        fcs = crc_next ^ CRC32_XOROUT
        # the frame's end: nb data bytes, 4 FCS bytes, /T/, idles — 16 lanes over 2 words
        end_d = Signal(128)
        end_c = Signal(16)
        t_pos = nb + FCS_BYTES               # lane of /T/ in end_d (4..12)
        lanes_d, lanes_c = [], []
        for k in range(16):
            lane = Signal(8, name=f"end{k}")
            fcs_byte = fcs.word_select((k - nb)[:2], 8)
            data_byte = cword.word_select(k, 8) if k < 8 else Const(0, 8)
            m.d.comb += lane.eq(Mux(nb > k, data_byte,
                                    Mux(t_pos > k, fcs_byte,
                                        Mux(t_pos == k, XGMII_TERM, XGMII_IDLE))))
            lanes_d.append(lane)
            lanes_c.append(k >= t_pos)
        m.d.comb += [end_d.eq(Cat(*lanes_d)), end_c.eq(Cat(*lanes_c))]

        # inter-frame gap: /T/ at byte e of this cycle's output word (0..15), the next /S/
        # at least XGMII_MIN_IFG bytes later, rounded to lane 0/4 with the deficit idle count
        e = t_pos + Mux(off, 4, 0)
        need = Signal(6)
        m.d.comb += need.eq(e + XGMII_MIN_IFG - 8)        # from the next word's start
        r = need[:2]
        down = Cat(Const(0, 2), need[2:])
        gap_end = Signal(range(32))
        dic_end = Signal(range(DIC_MAX + 1))
        m.d.comb += [gap_end.eq(need), dic_end.eq(dic)]
        with m.If(r != 0):
            with m.If(dic + r <= DIC_MAX):
                m.d.comb += [gap_end.eq(down), dic_end.eq(dic + r)]
            with m.Else():
                m.d.comb += [gap_end.eq(down + 4),
                             dic_end.eq(Mux(dic > 4 - r, dic - (4 - r), 0))]

        off_now = Signal()                   # the offset of this cycle's output word
        m.d.comb += [aw.eq(_IDLE_WORD), ac.eq(0xFF), off_now.eq(off)]
        m.d.sync += gap.eq(Mux(gap > 8, gap - 8, 0))
        with m.FSM():
            with m.State("IDLE"), m.If(i.valid & (gap <= 4)):
                m.d.comb += [aw.eq(_START_WORD), ac.eq(0x01)]
                m.d.comb += off_now.eq(gap == 4)
                m.d.sync += [off.eq(gap == 4), *set_cnt(0), crc.eq(CRC32_INIT),
                             err.eq(0)]
                m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += i.ready.eq(1)
                with m.If(~i.valid):
                    m.d.comb += [aw.eq(_ERROR_WORD), ac.eq(0xFF)]
                    m.d.sync += err.eq(1)
                with m.Elif(~i.payload.last | more):
                    # a full word: data, or the last beat followed by more padding
                    m.d.comb += [aw.eq(dword), ac.eq(0)]
                    m.d.sync += [*set_cnt(cnt + 8), crc.eq(crc_next)]
                    with m.If(i.payload.last):
                        m.next = "PAD"
                with m.Else():
                    self._finish(m, aw, ac, end_d, end_c, tail_w, tail_c, gap, gap_end, dic,
                                 dic_end, cnt, nb, err, t_pos)
            with m.State("PAD"):
                m.d.comb += padding.eq(1)
                with m.If(more):
                    m.d.comb += [aw.eq(0), ac.eq(0)]
                    m.d.sync += [*set_cnt(cnt + 8), crc.eq(crc_next)]
                with m.Else():
                    self._finish(m, aw, ac, end_d, end_c, tail_w, tail_c, gap, gap_end, dic,
                                 dic_end, cnt, nb, err, t_pos)
            with m.State("TAIL"):
                m.d.comb += [aw.eq(tail_w), ac.eq(tail_c)]
                m.next = "IDLE"
        # lane-4 frames: the output is the aligned stream delayed by half a word
        m.d.sync += [prev_w.eq(aw), prev_c.eq(ac),
                     self.txd.eq(Mux(off_now, Cat(prev_w[32:], aw[:32]), aw)),
                     self.txc.eq(Mux(off_now, Cat(prev_c[4:], ac[:4]), ac))]
        return m

    def _finish(self, m, aw, ac, end_d, end_c, tail_w, tail_c, gap, gap_end, dic, dic_end,
                cnt, nb, err, t_pos):
        m.d.comb += [aw.eq(end_d[:64]), ac.eq(end_c[:8]), self.event.valid.eq(1),
                     self.event.payload.bytes.eq(cnt + nb + FCS_BYTES),
                     self.event.payload.cause.eq(Mux(err, EthDrop.PHY_ERROR, EthDrop.OK))]
        m.d.sync += [gap.eq(gap_end), dic.eq(dic_end), tail_w.eq(end_d[64:]),
                     tail_c.eq(end_c[8:])]
        with m.If(t_pos >= 8):
            m.next = "TAIL"
        with m.Else():
            m.next = "IDLE"


class XgmiiRx(wiring.Component):
    """XGMII receiver (64 bits): finds /S/ on lane 0 or 4, checks the preamble and SFD, and
    delivers the frame's bytes up to /T/.

    Members: ``rxd``/``rxc``/``valid`` — ``In`` the XGMII word (``valid`` low in the PCS's
    gearbox gap cycles: the word is ignored); ``o`` — ``Out(stream.Signature(RX64))``
    (registered, ``ready`` ignored). A frame ends at /T/ (``last``, ``n`` the bytes before
    it); any other control character inside it ends it with ``err``; a broken preamble gives
    one ``n = 0`` beat with ``last`` and ``err``, the rest of that frame skipped. Latency 1
    cycle (2 for a lane-4 start)."""

    def __init__(self):
        super().__init__({"rxd": In(64), "rxc": In(8), "valid": In(1),
                          "o": Out(stream.Signature(RX64))})

    def elaborate(self, platform):
        m = Module()
        o = self.o
        prev_d = Signal(64)
        prev_c = Signal(8)
        off = Signal()
        a4_d = Cat(prev_d[32:], self.rxd[:32])
        a4_c = Cat(prev_c[4:], self.rxc[:4])
        wd = Mux(off, a4_d, self.rxd)
        wc = Mux(off, a4_c, self.rxc)

        def is_start(d, c):
            return c[0] & (d[:8] == XGMII_START)

        def pre_ok(d, c):
            return (c == 0x01) & (d[8:] == _START_WORD >> 8)

        first = Signal(4)
        m.d.comb += first.eq(8)
        for k in reversed(range(8)):
            with m.If(wc[k]):
                m.d.comb += first.eq(k)
        first_byte = Array(wd.word_select(k, 8) for k in range(8))[first[:3]]
        m.d.sync += o.valid.eq(0)
        with m.If(self.valid):
            m.d.sync += [prev_d.eq(self.rxd), prev_c.eq(self.rxc)]
            with m.FSM():
                with m.State("IDLE"):
                    for lane4, (d, c) in ((0, (self.rxd, self.rxc)), (1, (a4_d, a4_c))):
                        cond = is_start(d, c) if lane4 == 0 else (
                            is_start(d, c) & ~is_start(self.rxd, self.rxc))
                        with m.If(cond):
                            m.d.sync += off.eq(lane4)
                            with m.If(pre_ok(d, c)):
                                m.next = "FRAME"
                            with m.Else():
                                m.d.sync += [o.valid.eq(1), o.payload.n.eq(0),
                                             o.payload.last.eq(1), o.payload.err.eq(1)]
                with m.State("FRAME"):
                    m.d.sync += [o.valid.eq(1), o.payload.data.eq(wd),
                                 o.payload.n.eq(first), o.payload.last.eq(first != 8),
                                 o.payload.err.eq((first != 8) & (first_byte != XGMII_TERM))]
                    with m.If(first != 8):
                        m.next = "IDLE"
        return m


class XgmiiDecap(FrameDecap):
    """Receive checks and link frame rebuild, store and forward, 64 bits wide.

    Members: ``i`` — ``In(stream.Signature(RX64))`` frames dst..FCS from :class:`XgmiiRx`
    (``ready`` is always 1); ``o`` — ``Out(stream.Signature(beat_layout(64)))`` each good
    frame's link frame as :func:`mcf.abi.eth.link_beats` gives it (header, Meta, payload
    beats with a partial last one, CRC beat); ``local_id`` — ``In(NODE_BITS)``; ``event`` —
    ``Out(stream.Signature(ETH_EVENT))`` one record per frame (``cause``
    :class:`~mcf.abi.eth.EthDrop`, the first check that applies in :func:`mcf.abi.eth.decap`'s
    order), ``valid`` one cycle.

    The link frame's 8-byte words (frame bytes 14.. realigned) are written into a
    ``depth``-word buffer as they arrive; at the last beat the frame is committed or the write
    pointer rolled back (the verdict: :class:`~mcf.hdl.eth.rx_verdict.RxVerdict`, as in
    :class:`~mcf.hdl.eth.encap.EthDecap`). A frame meeting a full buffer is dropped as
    ``OVERFLOW``. The reader
    emits one beat per cycle (two read ports: the CRC beat may straddle two words). Latency:
    the first beat is offered 2 cycles after the frame's last beat."""

    def __init__(self, *, depth: int = 512):
        super().__init__(depth, 8, RX64, beat_layout(64))

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        D = self._depth
        abits = (D - 1).bit_length()
        m.submodules.buf = buf = Memory(shape=64, depth=D, init=[])
        wp = buf.write_port()
        rpa = buf.read_port(transparent_for=(wp,))
        rpb = buf.read_port(transparent_for=(wp,))
        wr = Signal(abits + 1)
        commit = Signal(abits + 1)
        fb = Signal(abits + 1)                # reader: base of the frame being read
        lw = META["length"].width

        # ---- write side ------------------------------------------------------------------------
        m.d.comb += i.ready.eq(1)
        beat = Signal(range(MAX_FRAME // 8 + 3))      # beats of this frame before this one
        k = Signal(16)                                # bytes before this beat
        crc = Signal(32, init=CRC32_INIT)
        prev = Signal(64)
        err = Signal()
        room = Signal()
        dst_ok = Signal()
        etype = Signal(16)
        ll = Signal(16)
        first = beat == 0
        n = i.payload.n
        dword = i.payload.data
        crc_next = _crc_n(m, Mux(first, CRC32_INIT, crc), dword, n, "crc_next")
        lword = Cat(prev[48:], dword[:48])            # link word beat - 2
        w = beat - 2
        meta_len = (lword >> (8 * (LENGTH_OFFSET - 8) + LENGTH_SHIFT))[:lw]
        ll_now = Mux(beat == 3, LINK_OVERHEAD + meta_len, ll)
        nwords = (ll_now + 7) >> 3
        full = (wr - fb)[:abits + 1] == D
        want = (beat >= 2) & ((beat < 4) | ((w < nwords) & (ll_now <= MAX_LINK_FRAME)))
        room_now = Mux(first, 1, room) & ~(want & full)
        mac = _mac_bytes(self.local_id)
        dst_now = Cat(*[dword.word_select(j, 8) == mac[j] for j in range(6)]).all()
        m.d.comb += [wp.addr.eq(wr[:abits]), wp.data.eq(lword),
                     wp.en.eq(i.valid & want & room_now)]
        with m.If(i.valid):
            m.d.sync += [beat.eq(Mux(beat == MAX_FRAME // 8 + 2, beat, beat + 1)),
                         k.eq(Mux(k > MAX_FRAME + 8, k, k + n)), crc.eq(crc_next),
                         prev.eq(dword), room.eq(room_now),
                         err.eq(Mux(first, 0, err) | i.payload.err)]
            with m.If(wp.en):
                m.d.sync += wr.eq(wr + 1)
            with m.If(first):
                m.d.sync += dst_ok.eq(dst_now)
            with m.If(beat == 1):
                m.d.sync += etype.eq(Cat(dword[40:48], dword[32:40]))
            with m.If(beat == 3):
                m.d.sync += ll.eq(ll_now)

        total = Signal(16)
        m.d.comb += total.eq(k + n)
        m.submodules.verdict = verdict = RxVerdict()
        m.d.comb += [verdict.phy_err.eq(Mux(first, 0, err) | i.payload.err),
                     verdict.room.eq(room_now), verdict.frame_bytes.eq(total),
                     verdict.crc.eq(crc_next), verdict.ethertype.eq(etype),
                     verdict.dst_ok.eq(dst_ok), verdict.link_bytes.eq(ll)]
        cause = verdict.cause
        with m.If(i.valid & i.payload.last):
            m.d.comb += [self.event.valid.eq(1), self.event.payload.cause.eq(cause),
                         self.event.payload.bytes.eq(total)]
            m.d.sync += [beat.eq(0), k.eq(0)]
            with m.If(cause == EthDrop.OK):
                m.d.sync += [commit.eq(commit + ((ll + 7) >> 3)),
                             wr.eq(commit + ((ll + 7) >> 3))]
            with m.Else():
                m.d.sync += wr.eq(commit)

        # ---- read side: header, Meta, payload beats, CRC beat ----------------------------------
        j = Signal(range(MAX_LINK_FRAME // 8 + 2))   # word of the current beat in the frame
        plen = Signal(lw)                             # Meta.length of the frame being read
        rem = Signal(lw)                              # payload bytes not yet sent
        n_j = Signal.like(j)
        n_plen = Signal.like(plen)
        n_rem = Signal.like(rem)
        n_fb = Signal.like(fb)
        m.d.comb += [n_j.eq(j), n_plen.eq(plen), n_rem.eq(rem), n_fb.eq(fb)]
        fire = o.valid & o.ready
        wa = rpa.data
        meta_read = (wa >> (8 * (LENGTH_OFFSET - 8) + LENGTH_SHIFT))[:lw]
        crc_word = (plen + 16) >> 3
        p = plen[:3]
        with m.FSM() as fsm:
            with m.State("HDR"):
                m.d.comb += [o.valid.eq(fb != commit), o.payload.data.eq(wa),
                             o.payload.keep.eq(0xFF)]
                with m.If(fire):
                    m.d.comb += n_j.eq(1)
                    m.next = "META"
            with m.State("META"):
                m.d.comb += [o.valid.eq(1), o.payload.data.eq(wa), o.payload.keep.eq(0xFF)]
                with m.If(fire):
                    m.d.comb += [n_plen.eq(meta_read), n_rem.eq(meta_read)]
                    with m.If(meta_read == 0):
                        m.d.comb += n_j.eq(2)
                        m.next = "CRC"
                    with m.Else():
                        m.d.comb += n_j.eq(2)
                        m.next = "PAY"
            with m.State("PAY"):
                last_pay = rem <= 8
                pkeep = Signal(8)
                m.d.comb += pkeep.eq(Mux(last_pay, _mask(rem[:4]), 0xFF))
                m.d.comb += [o.valid.eq(1), o.payload.keep.eq(pkeep),
                             o.payload.data.eq(wa & Cat(*[Mux(pkeep[b], Const(0xFF, 8),
                                                              Const(0, 8))
                                                          for b in range(8)]))]
                with m.If(fire):
                    m.d.comb += n_rem.eq(Mux(last_pay, 0, rem - 8))
                    with m.If(last_pay):
                        m.d.comb += n_j.eq(crc_word)
                        m.next = "CRC"
                    with m.Else():
                        m.d.comb += n_j.eq(j + 1)
            with m.State("CRC"):
                both = Cat(wa, rpb.data)
                m.d.comb += [o.valid.eq(1), o.payload.data.eq((both >> (p * 8))[:32]),
                             o.payload.keep.eq(0xF), o.payload.last.eq(1)]
                with m.If(fire):
                    m.d.comb += [n_j.eq(0), n_fb.eq(fb + ((plen + LINK_OVERHEAD + 7) >> 3))]
                    m.next = "HDR"
        # the word the next state's beat reads, presented one cycle ahead (FWFT)
        nxt_is_crc = Signal()
        m.d.comb += nxt_is_crc.eq(fsm.ongoing("CRC") & ~fire
                                  | fire & (fsm.ongoing("PAY") & (rem <= 8)
                                            | fsm.ongoing("META") & (meta_read == 0)))
        m.d.comb += [rpa.addr.eq((n_fb + Mux(nxt_is_crc, (n_plen + 16) >> 3, n_j))[:abits]),
                     rpb.addr.eq(rpa.addr + 1)]
        m.d.sync += [j.eq(n_j), plen.eq(n_plen), rem.eq(n_rem), fb.eq(n_fb)]
        return m

"""64-bit XGMII MAC for the 10G SFP+ link (IEEE 802.3 clause 46; issue #13 item 3;
``docs/eth.md`` §5). One XGMII word per cycle at 156.25 MHz: ``XGMII_DATA_BITS`` (64) of
``data`` in ``XGMII_LANES`` (8) byte lanes, one ``ctrl`` bit per lane (:mod:`mcf.abi.eth`).

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
    XGMII_DATA_BITS,
    XGMII_ERROR,
    XGMII_IDLE,
    XGMII_LANES,
    XGMII_MIN_IFG,
    XGMII_START,
    XGMII_TERM,
    EthDrop,
)
from mcf.abi.framing import beat_layout
from mcf.abi.meta import META
from mcf.abi.nic import CRC32_INIT, CRC32_XOROUT, CRC_BYTES
from mcf.hdl.nic.crc import crc32_update

from .encap import FrameDecap, _mac_bytes
from .rx_verdict import RxVerdict

__all__ = ["RX64", "EthEncap64", "XgmiiTx", "XgmiiRx", "XgmiiDecap"]

LANE_BITS = XGMII_DATA_BITS // XGMII_LANES      # one byte lane
_LANE_LOG2 = (XGMII_LANES - 1).bit_length()      # bits of a lane index; bytes → words shift
_NB_BITS = XGMII_LANES.bit_length()              # a byte count 0..XGMII_LANES
_ALL_LANES = (1 << XGMII_LANES) - 1              # keep / ctrl: every lane
_BYTE_ONES = (1 << LANE_BITS) - 1
_HALF = XGMII_LANES // 2                         # frames start on lane 0 or _HALF
_HALF_BITS = _HALF * LANE_BITS
_CRC_BITS = CRC_BYTES * LANE_BITS
_BEAT = beat_layout(XGMII_DATA_BITS)             # link frame and frame beats: one XGMII word
assert XGMII_LANES == 1 << _LANE_LOG2

RX64 = data.StructLayout({"data": unsigned(XGMII_DATA_BITS), "n": unsigned(_NB_BITS),
                          "last": unsigned(1), "err": unsigned(1)})
"""Received frame beat: ``n`` bytes (0..8) of ``data`` from byte 0, ``last`` on the frame's
final beat (possibly ``n = 0``), ``err`` (on the last beat) for a frame aborted by an XGMII
error or a broken preamble."""

_BODY = MIN_FRAME - FCS_BYTES           # 60: frame bytes before the FCS, padding included
_IDLE_WORD = int.from_bytes(bytes([XGMII_IDLE] * XGMII_LANES), "little")
_ERROR_WORD = int.from_bytes(bytes([XGMII_ERROR] * XGMII_LANES), "little")
_START_BYTES = bytes([XGMII_START]) + PREAMBLE[1:] + bytes([SFD])
_START_WORD = int.from_bytes(_START_BYTES, "little")
_START_CTRL = 1                          # the /S/ word: lane 0 control, preamble + SFD data
assert len(_START_BYTES) == XGMII_LANES
# Meta.length lies in link word 1 (the Meta beat), at bit _LEN_BIT of it
_LEN_BIT = LANE_BITS * (LENGTH_OFFSET - XGMII_LANES) + LENGTH_SHIFT
assert LENGTH_OFFSET >= XGMII_LANES
assert LENGTH_OFFSET * LANE_BITS + LENGTH_SHIFT + META["length"].width <= 2 * XGMII_DATA_BITS


def _keep_count(m, keep, name):
    """Bytes kept by a contiguous-from-0 ``keep`` (0..8)."""
    n = Signal(_NB_BITS, name=name)
    for b in range(XGMII_LANES):
        with m.If(keep[b]):
            m.d.comb += n.eq(b + 1)
    return n


def _crc_n(m, crc, word, n, name):
    """CRC-32 register after the first ``n`` (0..8) bytes of ``word``."""
    out = Signal(_CRC_BITS, name=name)
    c = Signal(_CRC_BITS, name=f"{name}_in")    # one net, not an expression per XOR term
    w = Signal(XGMII_DATA_BITS, name=f"{name}_data")
    m.d.comb += [c.eq(crc), w.eq(word), out.eq(c)]
    crc, word = c, w
    with m.Switch(n):
        for k in range(1, XGMII_LANES + 1):
            with m.Case(k):
                m.d.comb += out.eq(crc32_update(crc, word, k))
    return out


def _mask(n):
    """Byte mask (8 bits) of the first ``n`` bytes."""
    return (Const(1, XGMII_LANES + 1) << n) - 1


def _byte_mask(lanes):
    """Data mask of a word: lane k's byte all ones where ``lanes[k]``, else zero."""
    return Cat(*[Mux(b, Const(_BYTE_ONES, LANE_BITS), Const(0, LANE_BITS)) for b in lanes])


def _words(nbytes):
    """Words (of ``XGMII_LANES`` bytes) holding ``nbytes`` bytes."""
    return (nbytes + (XGMII_LANES - 1)) >> _LANE_LOG2


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
        super().__init__({"i": In(stream.Signature(_BEAT)), "o": Out(stream.Signature(_BEAT)),
                          "local_id": In(NODE_BITS), "peer_id": In(NODE_BITS)})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        hdr = []
        for k, v in enumerate([*_mac_bytes(self.peer_id), *_mac_bytes(self.local_id),
                               Const(ETH_TYPE >> LANE_BITS, LANE_BITS),
                               Const(ETH_TYPE & _BYTE_ONES, LANE_BITS)]):
            hdr.append(Signal(LANE_BITS, name=f"hdr{k}"))
            m.d.comb += hdr[-1].eq(v)            # (a node id narrower than 8 bits: widen)
        acc = Signal(XGMII_DATA_BITS - LANE_BITS)    # up to one byte short of a word
        cnt = Signal(_NB_BITS)               # bytes held in acc (0..7)
        kb = _keep_count(m, i.payload.keep, "kb")
        merged = Signal(len(acc) + XGMII_DATA_BITS)
        total = Signal(_NB_BITS + 1)
        kept = i.payload.data & _byte_mask(i.payload.keep)
        m.d.comb += [merged.eq(acc | (kept << (cnt * LANE_BITS))), total.eq(cnt + kb)]
        with m.FSM():
            with m.State("HDR"):
                m.d.comb += [o.valid.eq(i.valid), o.payload.data.eq(Cat(*hdr[:XGMII_LANES])),
                             o.payload.keep.eq(_ALL_LANES)]
                with m.If(o.valid & o.ready):
                    m.d.sync += [acc.eq(Cat(*hdr[XGMII_LANES:])),
                                 cnt.eq(HEADER_BYTES - XGMII_LANES)]
                    m.next = "BODY"
            with m.State("BODY"):
                emit = (total >= XGMII_LANES) | i.payload.last
                m.d.comb += [o.valid.eq(i.valid & emit),
                             o.payload.data.eq(merged[:XGMII_DATA_BITS]),
                             o.payload.keep.eq(Mux(total >= XGMII_LANES, _ALL_LANES,
                                                   _mask(total))),
                             o.payload.last.eq(i.payload.last & (total <= XGMII_LANES)),
                             i.ready.eq(Mux(emit, o.ready, 1))]
                with m.If(i.valid & i.ready):
                    with m.If(emit):
                        m.d.sync += [acc.eq(merged[XGMII_DATA_BITS:]),
                                     cnt.eq(total - XGMII_LANES)]
                        with m.If(i.payload.last):
                            with m.If(total > XGMII_LANES):
                                m.next = "FLUSH"
                            with m.Else():
                                m.d.sync += cnt.eq(0)
                                m.next = "HDR"
                    with m.Else():
                        m.d.sync += [acc.eq(merged[:len(acc)]), cnt.eq(total)]
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
    beats but the last (from :class:`EthEncap64`); ``txd``/``txc`` —
    ``Out(XGMII_DATA_BITS)``/``Out(XGMII_LANES)`` the XGMII word (registered); ``event`` —
    ``Out(stream.Signature(ETH_EVENT))`` one record per frame sent (bytes dst..FCS;
    ``cause`` ``PHY_ERROR`` when ``i`` ran dry inside it: that word went out as /E/),
    ``valid`` for one cycle, ``ready`` ignored.

    Each frame: /S/ + 6 × 0x55 + SFD on lane 0 or 4, the bytes, zero padding to 60, the FCS,
    /T/; the next /S/ at least 12 bytes after /T/ (counted from it) less the idles the deficit
    idle count (0..``DIC_MAX``) lets it delete to reach lane 0 or 4 — on average exactly 12
    (:func:`mcf.golden.eth10g.xgmii_tx`). Throughput: line rate while ``i`` keeps up.
    Latency: the /S/ word leaves 2 cycles after the first beat is offered (1 more on lane 4).
    Under an ``EnableInserter`` (the PCS's gearbox) the owner ANDs ``i.ready`` and
    ``event.valid`` with the enable.
    """

    def __init__(self):
        super().__init__({"i": In(stream.Signature(_BEAT)),
                          "txd": Out(XGMII_DATA_BITS), "txc": Out(XGMII_LANES),
                          "event": Out(stream.Signature(ETH_EVENT))})

    def elaborate(self, platform):
        m = Module()
        i = self.i
        aw = Signal(XGMII_DATA_BITS)         # the aligned word (frame start on lane 0)
        ac = Signal(XGMII_LANES)
        prev_w = Signal(XGMII_DATA_BITS, init=_IDLE_WORD)
        prev_c = Signal(XGMII_LANES, init=_ALL_LANES)
        off = Signal()                       # this frame started on lane 4
        cnt = Signal(16)                     # frame bytes sent (before the FCS)
        crc = Signal(_CRC_BITS, init=CRC32_INIT)
        gap = Signal(range(32))              # bytes still to pass from this cycle's word
        dic = Signal(range(DIC_MAX + 1))
        err = Signal()
        tail_w = Signal(XGMII_DATA_BITS)
        tail_c = Signal(XGMII_LANES)

        padding = Signal()                   # PAD state: the word is zero, not from i
        kb = Signal(_NB_BITS)
        m.d.comb += kb.eq(Mux(padding, 0, _keep_count(m, i.payload.keep, "kb_in")))
        # pad_to: bytes this word must carry (padding included); more: padding continues after
        # this word. Both are functions of cnt, held in registers updated with cnt (from the
        # value cnt takes), so no subtract or compare of cnt precedes the word's lanes
        pad_to = Signal(_NB_BITS, init=XGMII_LANES)
        more = Signal(init=1)

        def set_cnt(value):
            value = value[:len(cnt)] if isinstance(value, Value) else Const(value, len(cnt))
            room = Signal(signed(18))
            m.d.comb += room.eq(_BODY - value)
            return [cnt.eq(value),
                    pad_to.eq(Mux(room >= XGMII_LANES, XGMII_LANES,
                                  Mux(room > 0, room[:_NB_BITS], 0))),
                    more.eq(room > XGMII_LANES)]
        assert _BODY > XGMII_LANES           # the inits: cnt = 0
        nb = Signal(_NB_BITS)
        m.d.comb += nb.eq(Mux(kb > pad_to, kb, pad_to))
        byte_mask = _byte_mask([k < nb for k in range(XGMII_LANES)])
        keep_mask = _byte_mask(i.payload.keep)
        dword = Signal(XGMII_DATA_BITS)
        m.d.comb += dword.eq(Mux(padding, 0, i.payload.data & keep_mask & byte_mask))
        # the CRC step and the end lanes read only bytes 0..nb-1 of the word, where byte_mask
        # is all ones: they take the word without it (byte_mask, after nb, is not on the path)
        cword = Signal(XGMII_DATA_BITS)
        m.d.comb += cword.eq(Mux(padding, 0, i.payload.data & keep_mask))
        crc_next = _crc_n(m, crc, cword, nb, "crc_next")
        fcs = crc_next ^ CRC32_XOROUT
        # the frame's end: nb data bytes, 4 FCS bytes, /T/, idles — 16 lanes over 2 words
        end_d = Signal(2 * XGMII_DATA_BITS)
        end_c = Signal(2 * XGMII_LANES)
        t_pos = nb + FCS_BYTES               # lane of /T/ in end_d (4..12)
        lanes_d, lanes_c = [], []
        for k in range(2 * XGMII_LANES):
            lane = Signal(LANE_BITS, name=f"end{k}")
            fcs_byte = fcs.word_select((k - nb)[:(FCS_BYTES - 1).bit_length()], LANE_BITS)
            data_byte = (cword.word_select(k, LANE_BITS) if k < XGMII_LANES
                         else Const(0, LANE_BITS))
            m.d.comb += lane.eq(Mux(nb > k, data_byte,
                                    Mux(t_pos > k, fcs_byte,
                                        Mux(t_pos == k, XGMII_TERM, XGMII_IDLE))))
            lanes_d.append(lane)
            lanes_c.append(k >= t_pos)
        m.d.comb += [end_d.eq(Cat(*lanes_d)), end_c.eq(Cat(*lanes_c))]

        # inter-frame gap: /T/ at byte e of this cycle's output word (0..15), the next /S/
        # at least XGMII_MIN_IFG bytes later, rounded to lane 0/4 with the deficit idle count
        e = t_pos + Mux(off, _HALF, 0)
        need = Signal(6)
        m.d.comb += need.eq(e + XGMII_MIN_IFG - XGMII_LANES)    # from the next word's start
        align = (_HALF - 1).bit_length()
        r = need[:align]
        down = Cat(Const(0, align), need[align:])
        gap_end = Signal(range(32))
        dic_end = Signal(range(DIC_MAX + 1))
        m.d.comb += [gap_end.eq(need), dic_end.eq(dic)]
        with m.If(r != 0):
            with m.If(dic + r <= DIC_MAX):
                m.d.comb += [gap_end.eq(down), dic_end.eq(dic + r)]
            with m.Else():
                m.d.comb += [gap_end.eq(down + _HALF),
                             dic_end.eq(Mux(dic > _HALF - r, dic - (_HALF - r), 0))]

        off_now = Signal()                   # the offset of this cycle's output word
        m.d.comb += [aw.eq(_IDLE_WORD), ac.eq(_ALL_LANES), off_now.eq(off)]
        m.d.sync += gap.eq(Mux(gap > XGMII_LANES, gap - XGMII_LANES, 0))
        with m.FSM():
            with m.State("IDLE"), m.If(i.valid & (gap <= _HALF)):
                m.d.comb += [aw.eq(_START_WORD), ac.eq(_START_CTRL)]
                m.d.comb += off_now.eq(gap == _HALF)
                m.d.sync += [off.eq(gap == _HALF), *set_cnt(0), crc.eq(CRC32_INIT),
                             err.eq(0)]
                m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += i.ready.eq(1)
                with m.If(~i.valid):
                    m.d.comb += [aw.eq(_ERROR_WORD), ac.eq(_ALL_LANES)]
                    m.d.sync += err.eq(1)
                with m.Elif(~i.payload.last | more):
                    # a full word: data, or the last beat followed by more padding
                    m.d.comb += [aw.eq(dword), ac.eq(0)]
                    m.d.sync += [*set_cnt(cnt + XGMII_LANES), crc.eq(crc_next)]
                    with m.If(i.payload.last):
                        m.next = "PAD"
                with m.Else():
                    self._finish(m, aw, ac, end_d, end_c, tail_w, tail_c, gap, gap_end, dic,
                                 dic_end, cnt, nb, err, t_pos)
            with m.State("PAD"):
                m.d.comb += padding.eq(1)
                with m.If(more):
                    m.d.comb += [aw.eq(0), ac.eq(0)]
                    m.d.sync += [*set_cnt(cnt + XGMII_LANES), crc.eq(crc_next)]
                with m.Else():
                    self._finish(m, aw, ac, end_d, end_c, tail_w, tail_c, gap, gap_end, dic,
                                 dic_end, cnt, nb, err, t_pos)
            with m.State("TAIL"):
                m.d.comb += [aw.eq(tail_w), ac.eq(tail_c)]
                m.next = "IDLE"
        # lane-4 frames: the output is the aligned stream delayed by half a word
        m.d.sync += [prev_w.eq(aw), prev_c.eq(ac),
                     self.txd.eq(Mux(off_now, Cat(prev_w[_HALF_BITS:], aw[:_HALF_BITS]), aw)),
                     self.txc.eq(Mux(off_now, Cat(prev_c[_HALF:], ac[:_HALF]), ac))]
        return m

    def _finish(self, m, aw, ac, end_d, end_c, tail_w, tail_c, gap, gap_end, dic, dic_end,
                cnt, nb, err, t_pos):
        m.d.comb += [aw.eq(end_d[:XGMII_DATA_BITS]), ac.eq(end_c[:XGMII_LANES]),
                     self.event.valid.eq(1),
                     self.event.payload.bytes.eq(cnt + nb + FCS_BYTES),
                     self.event.payload.cause.eq(Mux(err, EthDrop.PHY_ERROR, EthDrop.OK))]
        m.d.sync += [gap.eq(gap_end), dic.eq(dic_end), tail_w.eq(end_d[XGMII_DATA_BITS:]),
                     tail_c.eq(end_c[XGMII_LANES:])]
        with m.If(t_pos >= XGMII_LANES):
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
        super().__init__({"rxd": In(XGMII_DATA_BITS), "rxc": In(XGMII_LANES), "valid": In(1),
                          "o": Out(stream.Signature(RX64))})

    def elaborate(self, platform):
        m = Module()
        o = self.o
        prev_d = Signal(XGMII_DATA_BITS)
        prev_c = Signal(XGMII_LANES)
        off = Signal()
        a4_d = Cat(prev_d[_HALF_BITS:], self.rxd[:_HALF_BITS])
        a4_c = Cat(prev_c[_HALF:], self.rxc[:_HALF])
        wd = Mux(off, a4_d, self.rxd)
        wc = Mux(off, a4_c, self.rxc)

        def is_start(d, c):
            return c[0] & (d[:LANE_BITS] == XGMII_START)

        def pre_ok(d, c):
            return (c == _START_CTRL) & (d[LANE_BITS:] == _START_WORD >> LANE_BITS)

        first = Signal(_NB_BITS)
        m.d.comb += first.eq(XGMII_LANES)
        for k in reversed(range(XGMII_LANES)):
            with m.If(wc[k]):
                m.d.comb += first.eq(k)
        first_byte = Array(wd.word_select(k, LANE_BITS)
                           for k in range(XGMII_LANES))[first[:_LANE_LOG2]]
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
                                 o.payload.n.eq(first),
                                 o.payload.last.eq(first != XGMII_LANES),
                                 o.payload.err.eq((first != XGMII_LANES)
                                                  & (first_byte != XGMII_TERM))]
                    with m.If(first != XGMII_LANES):
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
        super().__init__(depth, XGMII_LANES, RX64, _BEAT)

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        D = self._depth
        abits = (D - 1).bit_length()
        m.submodules.buf = buf = Memory(shape=XGMII_DATA_BITS, depth=D, init=[])
        wp = buf.write_port()
        rpa = buf.read_port(transparent_for=(wp,))
        rpb = buf.read_port(transparent_for=(wp,))
        wr = Signal(abits + 1)
        commit = Signal(abits + 1)
        fb = Signal(abits + 1)                # reader: base of the frame being read
        lw = META["length"].width

        # ---- write side ------------------------------------------------------------------------
        m.d.comb += i.ready.eq(1)
        beat = Signal(range(MAX_FRAME // XGMII_LANES + 3))  # beats of the frame before this
        k = Signal(16)                                # bytes before this beat
        crc = Signal(_CRC_BITS, init=CRC32_INIT)
        prev = Signal(XGMII_DATA_BITS)
        err = Signal()
        room = Signal()
        dst_ok = Signal()
        etype = Signal(16)
        ll = Signal(16)
        first = beat == 0
        n = i.payload.n
        dword = i.payload.data
        crc_next = _crc_n(m, Mux(first, CRC32_INIT, crc), dword, n, "crc_next")
        split = (HEADER_BYTES % XGMII_LANES) * LANE_BITS
        lword = Cat(prev[split:], dword[:split])      # link word beat - 2
        w = beat - 2
        meta_len = (lword >> _LEN_BIT)[:lw]
        ll_now = Mux(beat == 3, LINK_OVERHEAD + meta_len, ll)
        nwords = _words(ll_now)
        full = (wr - fb)[:abits + 1] == D
        want = (beat >= 2) & ((beat < 4) | ((w < nwords) & (ll_now <= MAX_LINK_FRAME)))
        room_now = Mux(first, 1, room) & ~(want & full)
        mac = _mac_bytes(self.local_id)
        dst_now = Cat(*[dword.word_select(j, LANE_BITS) == mac[j]
                        for j in range(len(mac))]).all()
        m.d.comb += [wp.addr.eq(wr[:abits]), wp.data.eq(lword),
                     wp.en.eq(i.valid & want & room_now)]
        with m.If(i.valid):
            m.d.sync += [beat.eq(Mux(beat == MAX_FRAME // XGMII_LANES + 2, beat, beat + 1)),
                         k.eq(Mux(k > MAX_FRAME + XGMII_LANES, k, k + n)), crc.eq(crc_next),
                         prev.eq(dword), room.eq(room_now),
                         err.eq(Mux(first, 0, err) | i.payload.err)]
            with m.If(wp.en):
                m.d.sync += wr.eq(wr + 1)
            with m.If(first):
                m.d.sync += dst_ok.eq(dst_now)
            with m.If(beat == 1):
                et = (HEADER_BYTES - 2) % XGMII_LANES      # lane of the EtherType's high byte
                m.d.sync += etype.eq(Cat(dword.word_select(et + 1, LANE_BITS),
                                         dword.word_select(et, LANE_BITS)))
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
                m.d.sync += [commit.eq(commit + _words(ll)), wr.eq(commit + _words(ll))]
            with m.Else():
                m.d.sync += wr.eq(commit)

        # ---- read side: header, Meta, payload beats, CRC beat ----------------------------------
        j = Signal(range(MAX_LINK_FRAME // XGMII_LANES + 2))  # word of this beat in the frame
        plen = Signal(lw)                             # Meta.length of the frame being read
        rem = Signal(lw)                              # payload bytes not yet sent
        n_j = Signal.like(j)
        n_plen = Signal.like(plen)
        n_rem = Signal.like(rem)
        n_fb = Signal.like(fb)
        m.d.comb += [n_j.eq(j), n_plen.eq(plen), n_rem.eq(rem), n_fb.eq(fb)]
        fire = o.valid & o.ready
        wa = rpa.data
        meta_read = (wa >> _LEN_BIT)[:lw]
        pre = LINK_OVERHEAD - CRC_BYTES               # link header + Meta bytes
        crc_word = (plen + pre) >> _LANE_LOG2
        p = plen[:_LANE_LOG2]
        with m.FSM() as fsm:
            with m.State("HDR"):
                m.d.comb += [o.valid.eq(fb != commit), o.payload.data.eq(wa),
                             o.payload.keep.eq(_ALL_LANES)]
                with m.If(fire):
                    m.d.comb += n_j.eq(1)
                    m.next = "META"
            with m.State("META"):
                m.d.comb += [o.valid.eq(1), o.payload.data.eq(wa),
                             o.payload.keep.eq(_ALL_LANES)]
                with m.If(fire):
                    m.d.comb += [n_plen.eq(meta_read), n_rem.eq(meta_read)]
                    with m.If(meta_read == 0):
                        m.d.comb += n_j.eq(2)
                        m.next = "CRC"
                    with m.Else():
                        m.d.comb += n_j.eq(2)
                        m.next = "PAY"
            with m.State("PAY"):
                last_pay = rem <= XGMII_LANES
                pkeep = Signal(XGMII_LANES)
                m.d.comb += pkeep.eq(Mux(last_pay, _mask(rem[:_NB_BITS]), _ALL_LANES))
                m.d.comb += [o.valid.eq(1), o.payload.keep.eq(pkeep),
                             o.payload.data.eq(wa & _byte_mask(pkeep))]
                with m.If(fire):
                    m.d.comb += n_rem.eq(Mux(last_pay, 0, rem - XGMII_LANES))
                    with m.If(last_pay):
                        m.d.comb += n_j.eq(crc_word)
                        m.next = "CRC"
                    with m.Else():
                        m.d.comb += n_j.eq(j + 1)
            with m.State("CRC"):
                both = Cat(wa, rpb.data)
                m.d.comb += [o.valid.eq(1),
                             o.payload.data.eq((both >> (p * LANE_BITS))[:_CRC_BITS]),
                             o.payload.keep.eq((1 << CRC_BYTES) - 1), o.payload.last.eq(1)]
                with m.If(fire):
                    m.d.comb += [n_j.eq(0), n_fb.eq(fb + _words(plen + LINK_OVERHEAD))]
                    m.next = "HDR"
        # the word the next state's beat reads, presented one cycle ahead (FWFT)
        nxt_is_crc = Signal()
        m.d.comb += nxt_is_crc.eq(fsm.ongoing("CRC") & ~fire
                                  | fire & (fsm.ongoing("PAY") & (rem <= XGMII_LANES)
                                            | fsm.ongoing("META") & (meta_read == 0)))
        m.d.comb += [rpa.addr.eq((n_fb + Mux(nxt_is_crc, (n_plen + pre) >> _LANE_LOG2,
                                             n_j))[:abits]),
                     rpb.addr.eq(rpa.addr + 1)]
        m.d.sync += [j.eq(n_j), plen.eq(n_plen), rem.eq(n_rem), fb.eq(n_fb)]
        return m

"""10GBASE-R PCS (IEEE 802.3 clause 49; issue #13 item 3; ``docs/eth.md`` §5).

Transmit: XGMII word → :class:`Encoder` (64b/66b) → :class:`Scrambler` → :class:`GearboxTx`
(66-bit blocks → the GTH's ``width``-bit TXDATA). Receive: RXDATA → :class:`GearboxRx`
(``slip`` from :class:`BlockLock`) → :class:`Descrambler` → :class:`Decoder` → XGMII word;
:class:`BerMonitor` watches the sync headers. Formats (block types, control codes, sync
headers, lock and BER constants) come from :mod:`mcf.abi.eth`; the bit-exact reference is
:mod:`mcf.golden.eth10g`.

Clocking: the GT runs without its internal PCS or gearbox at 10.3125 Gb/s; with a ``width``-bit
user interface its user clock is 10.3125 GHz / ``width`` (161.13 MHz at 64 bits). A block is
66 bits, so the transmit chain before :class:`GearboxTx` advances only in cycles where
``GearboxTx.ready`` is high (32 of 33 at 64 bits; the wrapper gates it with an
``EnableInserter``), and the receive chain carries a ``valid`` beside every block.

Ports: the components pass blocks and XGMII words as the interfaces of :data:`BLOCK66` /
:data:`BLOCK66_V` and :data:`XGMII_WORD` / :data:`XGMII_WORD_V` (``i`` in, ``o`` out), so the
stages join with ``wiring.connect``.
"""


from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import (
    BER_WINDOW,
    BLOCK_BITS,
    BLOCK_FIELDS,
    BLOCK_FORMATS,
    BLOCK_PAYLOAD_BITS,
    CONTROL_CODES,
    HI_BER_COUNT,
    LOCK_BAD_HEADERS,
    LOCK_GOOD_HEADERS,
    O_CODES,
    SCRAMBLER_TAPS,
    SLIP_HOLDOFF,
    SYNC_CTRL,
    SYNC_DATA,
    SYNC_HEADER_BITS,
    XGMII_DATA_BITS,
    XGMII_ERROR,
    XGMII_LANES,
    XGMII_START,
    XGMII_TERM,
)

_XGMII = {"data": Out(XGMII_DATA_BITS), "ctrl": Out(XGMII_LANES)}
_BLOCK = {"header": Out(SYNC_HEADER_BITS), "payload": Out(BLOCK_PAYLOAD_BITS)}
_VALID = {"valid": Out(1)}
XGMII_WORD = wiring.Signature(_XGMII)
"""An XGMII word from the source's side: ``data`` (lane k in bits 8k..8k+7) and ``ctrl``
(bit k: lane k is a control character)."""
XGMII_WORD_V = wiring.Signature(_XGMII | _VALID)
""":data:`XGMII_WORD` with ``valid`` (the word is meaningful this cycle)."""
BLOCK66 = wiring.Signature(_BLOCK)
"""A 66-bit block from the source's side: ``header`` (the sync header; a valid one is
:data:`~mcf.abi.eth.SYNC_DATA` or :data:`~mcf.abi.eth.SYNC_CTRL`) and ``payload`` (64 bits,
bit 0 first, sent after the header)."""
BLOCK66_V = wiring.Signature(_BLOCK | _VALID)
""":data:`BLOCK66` with ``valid`` (a block arrives this cycle)."""

__all__ = ["Encoder", "Decoder", "Scrambler", "Descrambler", "GearboxTx", "GearboxRx",
           "BlockLock", "BerMonitor", "ERROR_DATA", "XGMII_WORD", "XGMII_WORD_V", "BLOCK66",
           "BLOCK66_V"]

ERROR_DATA = int.from_bytes(bytes([XGMII_ERROR] * XGMII_LANES), "little")
_ALL_CTRL = (1 << XGMII_LANES) - 1
_A, _B = SCRAMBLER_TAPS


def _gt_width(width: int) -> int:
    """``width`` if the GTH user width is one the gearboxes support (32 or 64 bits)."""
    if width not in (32, 64):
        raise ValueError("the GTH user width is 32 or 64")
    return width


def _sync_ok(header):
    """A valid sync header (data or control; 00 and 11 are invalid)."""
    return (header == SYNC_DATA) | (header == SYNC_CTRL)


def _lookup(m, value, table: dict, width: int, name: str):
    """(mapped value, hit) of ``value`` through ``table`` as a comb case."""
    out = Signal(width, name=f"{name}_v")
    hit = Signal(name=f"{name}_ok")
    with m.Switch(value):
        for k, v in table.items():
            with m.Case(k):
                m.d.comb += [out.eq(v), hit.eq(1)]
    return out, hit


class Encoder(wiring.Component):
    """64b/66b encoder (clause 49.2.4.4): one XGMII word per cycle → one block.

    Members: ``i`` — ``In(XGMII_WORD)`` the XGMII word; ``o`` — ``Out(BLOCK66)`` the block
    (registered, latency 1). A data word gives a data block; a word whose lanes match a control
    block format (``BLOCK_FORMATS``) that block; anything else an error block (type 0x1E, all
    /E/)."""

    i: In(XGMII_WORD)
    o: Out(BLOCK66)

    def elaborate(self, platform):
        m = Module()
        lanes = [self.i.data.word_select(k, 8) for k in range(XGMII_LANES)]
        kind = {"D": [], "C": [], "O": [], "S": [], "T": []}
        code7, ocode = [], []
        for k, b in enumerate(lanes):
            c = self.i.ctrl[k]
            v7, ok7 = _lookup(m, b, CONTROL_CODES, 7, f"c{k}")
            v4, ok4 = _lookup(m, b, O_CODES, 4, f"o{k}")
            code7.append(v7)
            ocode.append(v4)
            kind["D"].append(~c)
            kind["C"].append(c & ok7)
            kind["O"].append(c & ok4)
            kind["S"].append(c & (b == XGMII_START))
            kind["T"].append(c & (b == XGMII_TERM))
        hdr = Signal(SYNC_HEADER_BITS)
        pay = Signal(BLOCK_PAYLOAD_BITS)
        err_type = next(t for t, f in BLOCK_FORMATS.items() if f == "C" * XGMII_LANES)
        err_code = CONTROL_CODES[XGMII_ERROR]
        m.d.comb += [hdr.eq(SYNC_CTRL),
                     pay.eq(Cat(Const(err_type, 8), *[Const(err_code, 7)] * XGMII_LANES))]
        with m.If(self.i.ctrl == 0):
            m.d.comb += [hdr.eq(SYNC_DATA), pay.eq(self.i.data)]
        for btype, fmt in BLOCK_FORMATS.items():
            match = Cat(*[kind[f][k] for k, f in enumerate(fmt)]).all()
            fields = [Const(btype, 8)]
            for f, lane, width in BLOCK_FIELDS[btype]:
                fields.append({"D": lanes[lane], "C": code7[lane], "O": ocode[lane],
                               "Z": Const(0, width)}[f])
            with m.Elif(match):
                m.d.comb += pay.eq(Cat(*fields))
        m.d.sync += [self.o.header.eq(hdr), self.o.payload.eq(pay)]
        return m


class Decoder(wiring.Component):
    """64b/66b decoder (clause 49.2.11): one block → one XGMII word.

    Members: ``i`` — ``In(BLOCK66_V)`` the descrambled block; ``o`` — ``Out(XGMII_WORD_V)``
    the XGMII word (registered, latency 1; ``o.data``/``o.ctrl`` hold their value while
    ``i.valid`` is low); ``error`` — ``Out(1)`` this word replaced an invalid block (bad sync
    header, unknown type, invalid control or O code) by all-/E/; ``force_error`` — ``In(1)``:
    send all-/E/ (no block lock).
    """

    i: In(BLOCK66_V)
    o: Out(XGMII_WORD_V)
    force_error: In(1)
    error: Out(1)

    def elaborate(self, platform):
        m = Module()
        code_of = {v: k for k, v in CONTROL_CODES.items()}
        oset_of = {v: k for k, v in O_CODES.items()}
        p = self.i.payload
        data = Signal(XGMII_DATA_BITS)
        ctrl = Signal(XGMII_LANES)
        bad = Signal()
        m.d.comb += [data.eq(ERROR_DATA), ctrl.eq(_ALL_CTRL), bad.eq(1)]
        with m.If(self.i.header == SYNC_DATA):
            m.d.comb += [data.eq(p), ctrl.eq(0), bad.eq(0)]
        with m.Elif(self.i.header == SYNC_CTRL), m.Switch(p[:8]):
            for btype, fmt in BLOCK_FORMATS.items():
                with m.Case(btype):
                    lanes = [Signal(8, name=f"t{btype:02x}_l{k}") for k in range(XGMII_LANES)]
                    oks = []
                    pos = 8
                    ctl = 0
                    for lane, f in enumerate(fmt):
                        if f == "S":
                            m.d.comb += lanes[lane].eq(XGMII_START)
                        elif f == "T":
                            m.d.comb += lanes[lane].eq(XGMII_TERM)
                        ctl |= (f != "D") << lane
                    for f, lane, width in BLOCK_FIELDS[btype]:
                        v = p[pos:pos + width]
                        pos += width
                        if f == "D":
                            m.d.comb += lanes[lane].eq(v)
                        elif f in "CO":
                            table = code_of if f == "C" else oset_of
                            b, ok = _lookup(m, v, table, 8, f"t{btype:02x}_{f}{lane}")
                            m.d.comb += lanes[lane].eq(b)
                            oks.append(ok)
                    valid = Cat(*oks).all() if oks else Const(1)
                    with m.If(valid):
                        m.d.comb += [data.eq(Cat(*lanes)), ctrl.eq(ctl), bad.eq(0)]
        with m.If(self.force_error):
            m.d.comb += [data.eq(ERROR_DATA), ctrl.eq(_ALL_CTRL)]
        m.d.sync += [self.o.valid.eq(self.i.valid),
                     self.error.eq(self.i.valid & bad & ~self.force_error)]
        with m.If(self.i.valid):
            m.d.sync += [self.o.data.eq(data), self.o.ctrl.eq(ctrl)]
        return m


class Scrambler(wiring.Component):
    """Self-synchronising scrambler G(x) = 1 + x^39 + x^58 over the 64-bit payload, bit 0
    first (clause 49.2.6); the sync header passes unscrambled.

    Members: ``i`` — ``In(BLOCK66)``; ``o`` — ``Out(BLOCK66)`` (registered, latency 1). The
    58-bit state resets to all ones (any value works)."""

    i: In(BLOCK66)
    o: Out(BLOCK66)

    def elaborate(self, platform):
        m = Module()
        n = BLOCK_PAYLOAD_BITS
        hist = Signal(_B, init=(1 << _B) - 1)       # bit j: output bit j - 58 (57 newest)
        full = [hist[j] for j in range(_B)]
        for i in range(n):
            full.append(self.i.payload[i] ^ full[i + _B - _A] ^ full[i])
        out = Cat(*full[_B:])
        m.d.sync += [hist.eq(out[n - _B:]), self.o.payload.eq(out),
                     self.o.header.eq(self.i.header)]
        return m


class Descrambler(wiring.Component):
    """Inverse of :class:`Scrambler`; self-synchronising (right after 58 bits).

    Members: ``i`` — ``In(BLOCK66_V)``; ``o`` — ``Out(BLOCK66_V)`` (registered, latency 1;
    ``o.header``/``o.payload`` hold their value while ``i.valid`` is low); state advances on
    valid blocks only."""

    i: In(BLOCK66_V)
    o: Out(BLOCK66_V)

    def elaborate(self, platform):
        m = Module()
        n = BLOCK_PAYLOAD_BITS
        p = self.i.payload
        hist = Signal(_B)
        full = [hist[j] for j in range(_B)] + [p[i] for i in range(n)]
        out = Cat(*[p[i] ^ full[i + _B - _A] ^ full[i] for i in range(n)])
        m.d.sync += self.o.valid.eq(self.i.valid)
        with m.If(self.i.valid):
            m.d.sync += [hist.eq(p[n - _B:]), self.o.payload.eq(out),
                         self.o.header.eq(self.i.header)]
        return m


class GearboxTx(wiring.Component):
    """66-bit blocks → ``width``-bit GT words (``width`` 32 or 64), bit 0 sent first.

    Members: ``i`` — ``In(BLOCK66)`` the block offered; ``ready`` — ``Out(1)`` the block is
    taken this cycle (comb of a register: the upstream chain advances on it); ``data`` —
    ``Out(width)`` TXDATA (registered). A block is taken in 32 of 33 cycles at 64
    bits, 16 of 33 at 32. Latency: a block's first bit leaves in the cycle after it is taken.
    """

    def __init__(self, width: int = 64):
        self._width = _gt_width(width)
        super().__init__({"i": In(BLOCK66), "ready": Out(1), "data": Out(width)})

    def elaborate(self, platform):
        m = Module()
        w = self._width
        buf = Signal(w + BLOCK_BITS)
        cnt = Signal(range(w + BLOCK_BITS + 1))          # bits held in buf
        m.d.comb += self.ready.eq(cnt < w)
        merged = Signal(w + BLOCK_BITS)
        total = Signal(range(w + BLOCK_BITS + 1))
        with m.If(self.ready):
            m.d.comb += [merged.eq(buf | (Cat(self.i.header, self.i.payload) << cnt)),
                         total.eq(cnt + BLOCK_BITS)]
        with m.Else():
            m.d.comb += [merged.eq(buf), total.eq(cnt)]
        m.d.sync += [self.data.eq(merged[:w]), buf.eq(merged[w:]), cnt.eq(total - w)]
        return m


class GearboxRx(wiring.Component):
    """``width``-bit GT words → 66-bit blocks, bit 0 first.

    Members: ``data`` — ``In(width)`` RXDATA, one word per cycle; ``slip`` — ``In(1)``:
    drop one bit (block alignment moves by one); ``o`` — ``Out(BLOCK66_V)`` the blocks
    (registered), ``o.valid`` in 32 of 33 cycles at 64 bits (16 of 33 at 32); ``o.header``/
    ``o.payload`` hold their value while ``o.valid`` is low."""

    def __init__(self, width: int = 64):
        self._width = _gt_width(width)
        super().__init__({"data": In(width), "slip": In(1), "o": Out(BLOCK66_V)})

    def elaborate(self, platform):
        m = Module()
        w, n, h = self._width, BLOCK_BITS, SYNC_HEADER_BITS
        buf = Signal(n + w)
        cnt = Signal(range(n + w + 1))      # bits held (< 66 between cycles)
        merged = Signal(n + w)
        total = Signal(range(n + w + 1))
        m.d.comb += [merged.eq((buf | (self.data << cnt)) >> self.slip),
                     total.eq(cnt + w - self.slip)]
        with m.If(total >= n):
            m.d.sync += [self.o.valid.eq(1), self.o.header.eq(merged[:h]),
                         self.o.payload.eq(merged[h:n]), buf.eq(merged >> n),
                         cnt.eq(total - n)]
        with m.Else():
            m.d.sync += [self.o.valid.eq(0), buf.eq(merged), cnt.eq(total)]
        return m


class BlockLock(wiring.Component):
    """Block lock (clause 49.2.13, Figure 49-14) on the sync headers of valid blocks.

    Members: ``i`` — ``In(BLOCK66_V)`` the received blocks (``i.payload`` is not used);
    ``block_lock`` — ``Out(1)`` (registered); ``slip`` — ``Out(1)`` one-cycle pulse to
    :class:`GearboxRx` (registered: the cycle after the block that caused it); ``lost`` —
    ``Out(1)`` pulse with that ``slip`` when lock is lost. Unlocked: any invalid header
    (00/11) slips; ``LOCK_GOOD_HEADERS`` valid headers in a row lock. Locked:
    ``LOCK_BAD_HEADERS`` invalid ones within a window of 64 unlock and slip. ``SLIP_HOLDOFF``
    blocks after a slip are not tested."""

    i: In(BLOCK66_V)
    block_lock: Out(1)
    slip: Out(1)
    lost: Out(1)

    def elaborate(self, platform):
        m = Module()
        sh_cnt = Signal(range(LOCK_GOOD_HEADERS + 1))
        bad_cnt = Signal(range(LOCK_BAD_HEADERS + 1))
        holdoff = Signal(range(SLIP_HOLDOFF + 1))
        good = _sync_ok(self.i.header)
        m.d.sync += [self.slip.eq(0), self.lost.eq(0)]
        with m.If(self.i.valid):
            with m.If(holdoff != 0):
                m.d.sync += holdoff.eq(holdoff - 1)
            with m.Elif(~good & ((bad_cnt == LOCK_BAD_HEADERS - 1) | ~self.block_lock)):
                m.d.sync += [self.slip.eq(1), self.lost.eq(self.block_lock),
                             self.block_lock.eq(0), sh_cnt.eq(0), bad_cnt.eq(0),
                             holdoff.eq(SLIP_HOLDOFF)]
            with m.Elif(sh_cnt == LOCK_GOOD_HEADERS - 1):
                m.d.sync += [sh_cnt.eq(0), bad_cnt.eq(0)]
                with m.If((bad_cnt == 0) & good):
                    m.d.sync += self.block_lock.eq(1)
            with m.Else():
                m.d.sync += [sh_cnt.eq(sh_cnt + 1), bad_cnt.eq(bad_cnt + ~good)]
        return m


class BerMonitor(wiring.Component):
    """BER monitor (clause 49.2.14, Figure 49-15) over valid blocks while locked.

    Members: ``i`` — ``In(BLOCK66_V)`` the received blocks (``i.payload`` is not used);
    ``block_lock`` — ``In(1)``; ``hi_ber`` — ``Out(1)`` (registered): set when
    ``HI_BER_COUNT`` invalid sync headers fall in one window of ``window`` blocks (default
    :data:`mcf.abi.eth.BER_WINDOW`, 125 µs at 156.25 MHz), cleared at the end of a window
    with fewer and while not locked (BER_MT_INIT); ``ber_count`` — ``Out(32)`` invalid
    headers seen while locked (saturates)."""

    def __init__(self, window: int = BER_WINDOW):
        self._window = window
        super().__init__({"i": In(BLOCK66_V), "block_lock": In(1),
                          "hi_ber": Out(1), "ber_count": Out(32)})

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self._window))
        cnt = Signal(range(HI_BER_COUNT + 1))
        bad = ~_sync_ok(self.i.header)
        cnt_next = Mux(bad & (cnt != HI_BER_COUNT), cnt + 1, cnt)
        with m.If(~self.block_lock):
            m.d.sync += [timer.eq(0), cnt.eq(0), self.hi_ber.eq(0)]
        with m.Elif(self.i.valid):
            with m.If(bad & ~self.ber_count.all()):
                m.d.sync += self.ber_count.eq(self.ber_count + 1)
            with m.If(cnt_next == HI_BER_COUNT):
                m.d.sync += self.hi_ber.eq(1)
            with m.If(timer == self._window - 1):
                m.d.sync += [timer.eq(0), cnt.eq(0)]
                with m.If(cnt_next != HI_BER_COUNT):
                    m.d.sync += self.hi_ber.eq(0)
            with m.Else():
                m.d.sync += [timer.eq(timer + 1), cnt.eq(cnt_next)]
        return m

"""Golden models of the 10GBASE-R path (IEEE 802.3 clauses 46 and 49; ``docs/eth.md`` §5):
the XGMII transmitter's framing and deficit idle count, 64b/66b block encoding and decoding,
the self-synchronising scrambler, the 66 ↔ W-bit gearboxes, block lock and the BER monitor.

Bit-exact references for ``mcf.hdl.eth.xgmii`` / ``mcf.hdl.eth.pcs10g``. XGMII words are
``(data, ctrl)`` integers: 8 lanes, lane ``k`` in ``data[8k:8k+8]`` and ``ctrl[k]``. A 66-bit
block is ``(header, payload)`` with the header's bit 0 sent first, then payload bit 0.
All formats come from :mod:`mcf.abi.eth`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mcf.abi.eth import (
    BER_WINDOW,
    BLOCK_FIELDS,
    BLOCK_FORMATS,
    CONTROL_CODES,
    DIC_MAX,
    HI_BER_COUNT,
    LOCK_BAD_HEADERS,
    LOCK_GOOD_HEADERS,
    MIN_FRAME,
    O_CODES,
    PREAMBLE,
    SCRAMBLER_TAPS,
    SFD,
    SLIP_HOLDOFF,
    SYNC_CTRL,
    SYNC_DATA,
    XGMII_ERROR,
    XGMII_IDLE,
    XGMII_MIN_IFG,
    XGMII_START,
    XGMII_TERM,
)
from mcf.abi.nic import crc32

__all__ = ["lanes", "word", "encode_block", "decode_block", "ERROR_WORD", "IDLE_WORD",
           "scramble", "descramble", "Scrambler", "Descrambler", "gearbox_tx", "gearbox_rx",
           "BlockLock", "BerMonitor", "xgmii_tx", "xgmii_rx", "pad_fcs"]

_CODE_OF = {v: k for k, v in CONTROL_CODES.items()}
_OSET_OF = {v: k for k, v in O_CODES.items()}
IDLE_WORD = (int.from_bytes(bytes([XGMII_IDLE] * 8), "little"), 0xFF)
ERROR_WORD = (int.from_bytes(bytes([XGMII_ERROR] * 8), "little"), 0xFF)
_MASK64 = (1 << 64) - 1


def lanes(data: int, ctrl: int) -> list[tuple[int, int]]:
    """The 8 lanes ``(byte, is_control)`` of an XGMII word."""
    return [(data >> 8 * k & 0xFF, ctrl >> k & 1) for k in range(8)]


def word(ls: list[tuple[int, int]]) -> tuple[int, int]:
    return (sum(b << 8 * k for k, (b, _) in enumerate(ls)),
            sum(c << k for k, (_, c) in enumerate(ls)))


def _kind(byte: int, c: int) -> str:
    if not c:
        return "D"
    if byte in CONTROL_CODES:
        return "C"
    return {XGMII_START: "S", XGMII_TERM: "T"}.get(byte, "O" if byte in O_CODES else "?")


def encode_block(data: int, ctrl: int) -> tuple[int, int]:
    """64b/66b encoding of one XGMII word (clause 49.2.4): a data block, the control block
    whose lane pattern matches, or an error block (all /E/) when none does."""
    if ctrl == 0:
        return SYNC_DATA, data
    ls = lanes(data, ctrl)
    kinds = "".join(_kind(b, c) for b, c in ls)
    btype = next((t for t, fmt in BLOCK_FORMATS.items() if fmt == kinds), None)
    if btype is None:
        return encode_block(*ERROR_WORD)
    payload, pos = btype, 8
    for kind, lane, width in BLOCK_FIELDS[btype]:
        b = ls[lane][0]
        v = {"D": b, "C": CONTROL_CODES.get(b, 0), "O": O_CODES.get(b, 0), "Z": 0}[kind]
        payload |= v << pos
        pos += width
    return SYNC_CTRL, payload


def decode_block(header: int, payload: int) -> tuple[int, int]:
    """64b/66b decoding (clause 49.2.11): the XGMII word, or :data:`ERROR_WORD` for an invalid
    sync header, an unknown block type or an invalid control/ordered-set code."""
    if header == SYNC_DATA:
        return payload, 0
    btype = payload & 0xFF
    if header != SYNC_CTRL or btype not in BLOCK_FORMATS:
        return ERROR_WORD
    fmt = BLOCK_FORMATS[btype]
    ls = [(0, 0)] * 8
    for lane, k in enumerate(fmt):
        if k == "S":
            ls[lane] = (XGMII_START, 1)
        elif k == "T":
            ls[lane] = (XGMII_TERM, 1)
    pos = 8
    for kind, lane, width in BLOCK_FIELDS[btype]:
        v = payload >> pos & ((1 << width) - 1)
        pos += width
        if kind == "D":
            ls[lane] = (v, 0)
        elif kind == "C":
            if v not in _CODE_OF:
                return ERROR_WORD
            ls[lane] = (_CODE_OF[v], 1)
        elif kind == "O":
            if v not in _OSET_OF:
                return ERROR_WORD
            ls[lane] = (_OSET_OF[v], 1)
    return word(ls)


# ---- scrambler: G(x) = 1 + x^39 + x^58 over the payload bits, LSB first --------------------

_A, _B = SCRAMBLER_TAPS


def _bits(x: int, n: int) -> np.ndarray:
    return np.array([x >> i & 1 for i in range(n)], dtype=np.uint8)


def _int(bits: np.ndarray) -> int:
    return int(sum(int(b) << i for i, b in enumerate(bits)))


def scramble(payloads: list[int], state: int = (1 << _B) - 1) -> tuple[list[int], int]:
    """Scramble 64-bit payloads in order. ``state``: the last 58 scrambled bits (bit 57 the
    most recent). Returns the scrambled payloads and the final state."""
    return _self_sync(payloads, state, scrambling=True)


def descramble(payloads: list[int], state: int = 0) -> tuple[list[int], int]:
    """Inverse of :func:`scramble` (self-synchronising: any ``state`` is right after 58 bits)."""
    return _self_sync(payloads, state, scrambling=False)


def _self_sync(payloads: list[int], state: int, scrambling: bool) -> tuple[list[int], int]:
    """The self-synchronising scrambler polynomial over 64-bit words, LSB first: each output
    bit is the input bit XOR the scrambled bits ``SCRAMBLER_TAPS`` back; the history takes the
    scrambled bit (the output when ``scrambling``, else the input)."""
    hist = list(_bits(state, _B))                      # hist[-1] most recent
    out = []
    for p in payloads:
        x = _bits(p, 64)
        y = np.zeros(64, dtype=np.uint8)
        for i in range(64):
            y[i] = x[i] ^ hist[-_A] ^ hist[-_B]
            hist.append(int(y[i] if scrambling else x[i]))
        hist = hist[-_B:]
        out.append(_int(y))
    return out, _int(np.array(hist, dtype=np.uint8))


@dataclass
class Scrambler:
    state: int = (1 << _B) - 1

    def __call__(self, payload: int) -> int:
        (o,), self.state = scramble([payload], self.state)
        return o


@dataclass
class Descrambler:
    state: int = 0

    def __call__(self, payload: int) -> int:
        (o,), self.state = descramble([payload], self.state)
        return o


# ---- gearboxes ---------------------------------------------------------------------------------

def gearbox_tx(blocks: list[tuple[int, int]], width: int) -> list[int]:
    """66-bit blocks ``(header, payload)`` → ``width``-bit words, bit 0 first: the bit stream
    ``header | payload << 2`` of each block in order, cut into words (a trailing partial word
    is dropped)."""
    stream = 0
    n = 0
    for h, p in blocks:
        stream |= (h | p << 2) << n
        n += 66
    return [stream >> (width * k) & ((1 << width) - 1) for k in range(n // width)]


def gearbox_rx(words: list[int], width: int, offset: int = 0) -> list[tuple[int, int]]:
    """``width``-bit words → 66-bit blocks, the first ``offset`` bits skipped."""
    stream = sum(w << (width * k) for k, w in enumerate(words)) >> offset
    n = len(words) * width - offset
    return [(stream >> (66 * k) & 3, stream >> (66 * k + 2) & _MASK64) for k in range(n // 66)]


# ---- block lock and BER monitor ----------------------------------------------------------------

@dataclass
class BlockLock:
    """Clause 49 lock state machine (Figure 49-14) over sync headers: unlocked, any invalid
    header slips one bit; ``LOCK_GOOD_HEADERS`` valid ones in a row lock; locked, a window of
    64 headers with ``LOCK_BAD_HEADERS`` invalid ones unlocks and slips. After a slip the next
    ``SLIP_HOLDOFF`` headers are not tested. ``step`` returns 1 for a slip."""
    locked: bool = False
    sh_cnt: int = 0
    bad_cnt: int = 0
    holdoff: int = 0
    losses: int = 0

    def step(self, header: int) -> int:
        if self.holdoff:
            self.holdoff -= 1
            return 0
        valid = header in (SYNC_DATA, SYNC_CTRL)
        self.sh_cnt += 1
        if not valid:
            self.bad_cnt += 1
            if self.bad_cnt == LOCK_BAD_HEADERS or not self.locked:
                self.losses += self.locked
                self.locked = False
                self.sh_cnt = self.bad_cnt = 0
                self.holdoff = SLIP_HOLDOFF
                return 1
        if self.sh_cnt == LOCK_GOOD_HEADERS:
            if self.bad_cnt == 0:
                self.locked = True
            self.sh_cnt = self.bad_cnt = 0
        return 0


@dataclass
class BerMonitor:
    """Clause 49 BER monitor (Figure 49-15): counts invalid sync headers while locked; 16 in a
    window of ``BER_WINDOW`` blocks set ``hi_ber``, a window with fewer or the loss of block
    lock clears it. ``total``
    is the saturating count of invalid headers (the status counter)."""
    window: int = BER_WINDOW
    hi_ber: bool = False
    cnt: int = 0
    timer: int = 0
    total: int = 0
    history: list = field(default_factory=list)

    def step(self, header: int, locked: bool) -> None:
        if not locked:                   # BER_MT_INIT
            self.cnt = self.timer = 0
            self.hi_ber = False
            return
        if header not in (SYNC_DATA, SYNC_CTRL):
            self.total = min(self.total + 1, (1 << 32) - 1)
            self.cnt = min(self.cnt + 1, HI_BER_COUNT)
            if self.cnt == HI_BER_COUNT:
                self.hi_ber = True
        self.timer += 1
        if self.timer == self.window:
            if self.cnt < HI_BER_COUNT:
                self.hi_ber = False
            self.cnt = self.timer = 0


# ---- XGMII MAC ---------------------------------------------------------------------------------

def pad_fcs(frame: bytes) -> bytes:
    """``frame`` (dst..payload, no FCS) zero-padded to 60 bytes with its FCS appended."""
    body = frame + bytes(max(0, MIN_FRAME - 4 - len(frame)))
    return body + crc32(body).to_bytes(4, "little")


def xgmii_tx(frames: list[bytes], idle_words: int = 1) -> tuple[list[tuple[int, int]],
                                                               list[int]]:
    """The XGMII words a transmitter sends for ``frames`` (dst..payload, no FCS) offered back
    to back, after ``idle_words`` idle words: each is padded, gets its FCS, /S/ + 6 × 0x55 +
    SFD before it and /T/ after; the next /S/ is on lane 0 or 4 at least ``XGMII_MIN_IFG``
    bytes after /T/ (counted from /T/) less the deletions the deficit idle count allows
    (clause 46.3.1.4: idles deleted to reach a 4-byte boundary while the count stays ≤ 3,
    otherwise inserted, reducing it). Returns the words and the start byte positions."""
    stream: list[tuple[int, int]] = [(XGMII_IDLE, 1)] * (8 * idle_words)
    starts = []
    dic = 0
    for f in frames:
        starts.append(len(stream))
        stream.append((XGMII_START, 1))
        stream += [(b, 0) for b in PREAMBLE[1:] + bytes([SFD]) + pad_fcs(f)]
        t = len(stream)
        stream.append((XGMII_TERM, 1))
        need = t + XGMII_MIN_IFG
        down, r = need - need % 4, need % 4
        if r and dic + r <= DIC_MAX:
            nxt, dic = down, dic + r
        elif r:
            nxt, dic = down + 4, max(0, dic - (4 - r))
        else:
            nxt = need
        stream += [(XGMII_IDLE, 1)] * (nxt - len(stream))
    stream += [(XGMII_IDLE, 1)] * (-len(stream) % 8)
    words = [word(stream[k:k + 8]) for k in range(0, len(stream), 8)]
    return words, starts


def xgmii_rx(words: list[tuple[int, int]]) -> list[tuple[bytes, bool]]:
    """Frames received from XGMII words: ``(bytes after the SFD up to /T/, error)``, a start on
    lane 0 or 4; ``error`` for a broken preamble or a control character other than /T/ ending
    the frame (the bytes up to it are returned)."""
    stream = [x for d, c in words for x in lanes(d, c)]
    out = []
    k = 0
    while k < len(stream):
        b, c = stream[k]
        if not (c and b == XGMII_START and k % 4 == 0):
            k += 1
            continue
        pre = stream[k + 1:k + 8]
        err = pre != [(x, 0) for x in PREAMBLE[1:] + bytes([SFD])]
        k += 8
        body = bytearray()
        while k < len(stream) and not stream[k][1]:
            body.append(stream[k][0])
            k += 1
        if k >= len(stream) or stream[k][0] != XGMII_TERM:
            err = True
        out.append((bytes(body), err))
    return out

"""Formal checks (yowasp-sby, smtbmc + yices) of the Ethernet MACs' clock crossing and FCS
(issue #13 "Formal"; ``docs/eth.md`` §8).

**Clock-domain crossing** (:class:`FifoFormal`). Both MACs cross between aclk and their line
clocks through :class:`amaranth.lib.fifo.AsyncFIFO` (depth 16 for frame beats, 4 for counter
events). The proof runs SymbiYosys with ``multiclock on``: the write and the read clock are free
inputs the solver toggles at will — any frequency ratio, any phase, simultaneous edges — and
the writer's ``w_en`` and the reader's ``r_en`` are arbitrary. The writer writes a sequence
number (the count of beats it got accepted), the reader counts the beats it took. Proved
(``prove``, k-induction: every reachable state, unbounded time), from the FIFO's initial
state with neither reset asserted afterwards:

* order — whenever ``r_rdy``, ``r_data`` is the next sequence number: no beat lost, duplicated
  or reordered;
* bounds — the reader never takes a beat not yet written and never more than ``depth`` are
  pending (no overwrite);
* visibility — once the writer has paused for two read-clock edges, ``r_rdy`` is high exactly
  while beats are pending (a written beat is never stuck); once the reader has paused for two
  write-clock edges, ``w_rdy`` is high exactly while there is room.

Induction closes because the harness also asserts invariants over the FIFO's internal state
(found with :func:`mcf.sim.formal.probe`), which are proved with it: the Gray counters encode
the binary ones; the synchronised copies of each pointer lag it in order (consume ≤ synchronised
produce ≤ produce, and the mirror image) within ``depth``; every pending slot of the memory
holds its sequence number; the read register holds the head whenever the FIFO shows one; the
reset synchroniser's first edges see the pointers equal. A cover run shows the interesting
cases reachable (full, pointer wrap-around, reads after wrap-around).

**FCS** (:class:`GmiiFcsFormal`): an independent bit-serial CRC-32
in the harness (IEEE 802.3 polynomial, written out here, checked against ``zlib``) accumulates
every byte a transmit path puts on the line after the SFD; at the end of every frame that is
not marked bad (``tx_er``, an /E/), the register must equal the CRC residue 0xDEBB20E3, i.e. the
frame's last four bytes are the FCS of the bytes before them. The transmit path is the 1G
MAC's own: :class:`mcf.hdl.eth.encap.EthEncap` → :class:`mcf.hdl.eth.rgmii.GmiiTx` (GMII byte
stream), with arbitrary link-frame input (any bytes, lengths, holes; ``local_id``/``peer_id``
may change on any cycle).

**FCS, 10G** (:class:`XgmiiFcsFormal`): :class:`mcf.hdl.eth.xgmii.EthEncap64` →
:class:`mcf.hdl.eth.xgmii.XgmiiTx` with arbitrary link beats; at every frame end at /T/ (lane 0
or 4 starts, lane-4 frames realigned as a receiver does) the four bytes before /T/ are the FCS of
the frame's bytes. Compositional: the harness follows the transmitter's CRC step (register in,
word, byte count, register out) and proves that the steps chain from 0xFFFFFFFF over exactly the
frame's bytes on the line and that the FCS is the last step's complement;
:func:`test_xgmii_crc_step_is_the_serial_crc` proves that step is the bit-serial CRC-32 for every
input. A harness with its own CRC-32 of the line (bit-serial, or ``crc32_update`` over the same
words) does not close in yices: it has to prove two 64-bit-wide XOR networks equal.
"""

from __future__ import annotations

import zlib

import pytest
from amaranth import Cat, ClockDomain, ClockSignal, Const, Module, Mux, ResetSignal, Signal
from amaranth.hdl import Assert, Assume, Cover, signed
from amaranth.lib import stream, wiring
from amaranth.lib.fifo import AsyncFIFO
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from mcf.abi.eth import (
    IFG_BYTES,
    NODE_BITS,
    PREAMBLE,
    SFD,
    XGMII_ERROR,
    XGMII_START,
    XGMII_TERM,
)
from mcf.abi.framing import beat_layout
from mcf.hdl.eth import xgmii
from mcf.hdl.eth.encap import BYTE, EthEncap
from mcf.hdl.eth.rgmii import GmiiTx
from mcf.hdl.eth.xgmii import EthEncap64, XgmiiTx, _crc_n
from mcf.hdl.nic.crc import crc32_update
from mcf.sim.formal import check, probe

CRC_POLY = 0xEDB88320          # IEEE 802.3 CRC-32, reflected
CRC_RESIDUE = 0xDEBB20E3       # register after a frame followed by its FCS
CRC_INIT = 0xFFFFFFFF


def crc_byte(m, c, b, name: str = "crc"):
    """CRC-32 register ``c`` (32 bits) after byte ``b`` (8 bits), one bit at a time, LSB
    first: the textbook shift register, independent of :func:`mcf.hdl.nic.crc.crc32_update`.
    Every step is a net of ``m`` (an expression tree would double with every bit)."""
    byte = Signal(8, name=f"{name}_byte")
    m.d.comb += byte.eq(b)
    for k in range(8):
        step = Signal(32, name=f"{name}_bit{k}")
        m.d.comb += step.eq(Cat(c[1:], Const(0, 1)) ^ Mux(c[0] ^ byte[k], CRC_POLY, 0))
        c = step
    return c


def _gray(x):
    return x ^ (x >> 1)


def _ungray(g, bits):
    out = [g[bits - 1]]
    for k in reversed(range(bits - 1)):
        out.insert(0, out[0] ^ g[k])
    return Cat(*out)


def _dist(a, b, bits):
    """(b - a) mod 2**bits."""
    return (b - a)[:bits]


def _implies(a, b):
    return ~a | b


# ---- the clock-domain crossing ----------------------------------------------------------------

class FifoFormal(wiring.Component):
    """:class:`AsyncFIFO` (``depth``) between free-running clocks ``w_clk``/``r_clk`` with a
    sequence-number writer and a counting reader (see the module docstring). ``covers``:
    ``Cover`` statements instead of the proof's assertions; ``invariants=False`` leaves the
    properties alone (for BMC); ``misuse``: the writer counts a beat as sent whenever it
    raises ``w_en``, ready or not (a negative check: beats offered to a full FIFO are lost, and
    the order property, the only one then asserted, must say so)."""

    SEQ = 8

    def __init__(self, depth: int, *, covers: bool = False, invariants: bool = True,
                 misuse: bool = False):
        self._depth = depth
        self._covers = covers
        self._invariants = invariants
        self._misuse = misuse
        super().__init__({"w_clk": In(1), "r_clk": In(1), "w_en": In(1), "r_en": In(1)})

    def elaborate(self, platform):
        m = Module()
        D = self._depth
        c = D.bit_length()                      # pointer bits (AsyncFIFO: log2(depth) + 1)
        m.domains.w = ClockDomain("w")
        m.domains.r = ClockDomain("r")
        m.d.comb += [ClockSignal("w").eq(self.w_clk), ClockSignal("r").eq(self.r_clk),
                     ResetSignal("w").eq(0), ResetSignal("r").eq(0)]
        fifo = AsyncFIFO(width=self.SEQ, depth=D, w_domain="w", r_domain="r")
        m.submodules.fifo, s = probe(fifo)
        mem = [s["storage"].read_port(domain="comb") for _ in range(D)]
        for a, port in enumerate(mem):
            m.d.comb += port.addr.eq(a)

        wr = Signal(self.SEQ)                   # beats accepted (w domain)
        rd = Signal(self.SEQ)                   # beats taken (r domain)
        m.d.comb += [fifo.w_en.eq(self.w_en), fifo.w_data.eq(wr), fifo.r_en.eq(self.r_en)]
        with m.If(fifo.w_en & (fifo.w_rdy | self._misuse)):
            m.d.w += wr.eq(wr + 1)
        with m.If(fifo.r_en & fifo.r_rdy):
            m.d.r += rd.eq(rd + 1)
        # the other side's counter as seen at this side's last edge, and for how many edges
        # it has not moved (saturating at 3)
        seen_w, seen_r = Signal(self.SEQ), Signal(self.SEQ)
        quiet_w, quiet_r = Signal(2), Signal(2)
        m.d.r += [seen_w.eq(wr), quiet_r.eq(Mux(wr == seen_w, Mux(quiet_r == 3, 3, quiet_r + 1),
                                                0))]
        m.d.w += [seen_r.eq(rd), quiet_w.eq(Mux(rd == seen_r, Mux(quiet_w == 3, 3, quiet_w + 1),
                                                0))]
        pending = _dist(rd, wr, self.SEQ)

        if self._covers:
            m.d.comb += [Cover(pending == D), Cover(fifo.r_rdy & (rd == 2 ** c + 1)),
                         Cover((pending == D) & (wr == 2 ** c + D))]
            return m

        P, C = s["produce_w_bin"], s["consume_r_bin"]
        p0 = _ungray(s["produce_cdc.stage0"], c)
        p1 = _ungray(s["produce_cdc.stage1"], c)
        q0 = _ungray(s["consume_cdc.stage0"], c)
        q1 = _ungray(s["consume_cdc.stage1"], c)
        rst0, rst1 = s["rst_cdc.stage0"], s["rst_cdc.stage1"]
        r_rst = s["rst_cdc.r_rst"]

        # the properties
        m.d.comb += Assert(_implies(fifo.r_rdy, fifo.r_data == rd), "beat out of sequence")
        if self._misuse:
            return m
        m.d.comb += [
            Assert(pending <= D, "more beats pending than the FIFO holds"),
            Assert(_implies((quiet_r >= 2) & (wr == seen_w), fifo.r_rdy == (pending != 0)),
                   "a written beat is not offered after the writer paused"),
            Assert(_implies((quiet_w >= 1) & (rd == seen_r), fifo.w_rdy == (pending != D)),
                   "free room is not offered after the reader paused"),
        ]
        if not self._invariants:
            return m
        m.d.comb += [
            Assert(s["produce_w_gry"] == _gray(P)),
            Assert(s["consume_r_gry"] == _gray(C)),
            Assert(wr[:c] == P),
            Assert(rd[:c] == C),
            # produce: C <= p1 <= p0 <= P ; consume: q1 <= q0 <= C ; all within depth
            Assert(_dist(C, p1, c) <= _dist(C, p0, c)),
            Assert(_dist(C, p0, c) <= _dist(C, P, c)),
            Assert(_dist(q1, q0, c) <= _dist(q1, C, c)),
            Assert(_dist(q1, C, c) <= _dist(q1, P, c)),
            Assert(_dist(q1, P, c) <= D),
            # the synchronised copies as the other side's last edge saw them
            Assert(p0 == seen_w[:c]),
            Assert(q0 == seen_r[:c]),
            Assert(_implies(quiet_r >= 1, p1 == p0)),
            Assert(_implies(quiet_w >= 1, q1 == q0)),
            # the read-side reset synchroniser (set at power-on, released by read edges)
            Assert(_implies(rst0, rst1)),
            Assert(_implies(rst0, (p0 == C) & (quiet_r == 0))),
            Assert(_implies(rst1, (p1 == C) & (quiet_r <= 1))),
            Assert(r_rst == rst1),
            # the memory holds every pending beat's sequence number; the read register the head
            Assert(_implies(~r_rst & (p1 != C), fifo.r_data == rd)),
        ]
        for j in range(D):
            slot = (C + j)[:c - 1]
            word = Signal(self.SEQ, name=f"slot{j}")
            m.d.comb += word.eq(Mux(slot == 0, mem[0].data, 0))
            for a in range(1, D):
                with m.If(slot == a):
                    m.d.comb += word.eq(mem[a].data)
            m.d.comb += Assert(_implies(j < _dist(C, P, c), word == (rd + j)[:self.SEQ]))
        return m


@pytest.mark.parametrize("depth", [4, 16])
def test_async_fifo_crossing_formal(depth):
    """No beat lost, duplicated or reordered across AsyncFIFO for any two clocks (k-induction,
    depth 4 and the MACs' 16)."""
    check(FifoFormal(depth), f"eth_cdc_fifo{depth}", mode="prove", depth=4, multiclock=True,
          timeout=900)


def test_async_fifo_crossing_covers():
    """The proof is not vacuous: full, wrap-around and reads after wrap-around are reachable
    with both clocks free."""
    check(FifoFormal(4, covers=True), "eth_cdc_fifo_cover", mode="cover", depth=60,
          multiclock=True, timeout=900)


def test_async_fifo_crossing_catches_lost_beats():
    """A writer that ignores ``w_rdy`` loses beats at a full FIFO: the order property fails."""
    with pytest.raises(AssertionError, match="FAIL"):
        check(FifoFormal(4, invariants=False, misuse=True), "eth_cdc_fifo_misuse", mode="bmc",
              depth=24, multiclock=True, timeout=900)


def test_harness_crc_is_ieee_crc32():
    """The harness's bit-serial CRC, simulated, agrees with zlib's CRC-32 (and its residue)."""
    data = bytes(range(7, 7 + 50))
    fcs = (zlib.crc32(data) & 0xFFFFFFFF).to_bytes(4, "little")
    m = Module()
    b = Signal(8)
    reg = Signal(32, init=CRC_INIT)
    m.d.sync += reg.eq(crc_byte(m, reg, b))
    sim = Simulator(m)
    sim.add_clock(1e-6)
    seen = []

    async def bench(ctx):
        for k, byte in enumerate(data + fcs):
            ctx.set(b, byte)
            await ctx.tick()
            if k == len(data) - 1:
                seen.append(ctx.get(reg) ^ CRC_INIT)
        seen.append(ctx.get(reg))

    sim.add_testbench(bench)
    sim.run()
    assert seen == [zlib.crc32(data) & 0xFFFFFFFF, CRC_RESIDUE]


# ---- the FCS on the line ----------------------------------------------------------------------

def _in(fsm, *names):
    """The FSM (``probe``'s ``(state, encoding)``) is in one of ``names``."""
    state, enc = fsm
    return Cat(*[state == enc[n] for n in names]).any()


class FcsTracker:
    """The harness's view of the line: a CRC-32 accumulated over the bytes of the current frame
    (:func:`crc_byte`, one byte per :meth:`take`), and the last four bytes taken with the
    register as it was before each. At the end of a frame its last four bytes, least
    significant first, must equal the complement of the register before them — the FCS of the
    bytes before them."""

    def __init__(self, m, name):
        self.acc = Signal(32, init=CRC_INIT, name=f"{name}_acc")
        self.hb = [Signal(8, name=f"{name}_b{k}") for k in range(4)]       # 0: the newest
        self.ha = [Signal(32, name=f"{name}_a{k}") for k in range(4)]
        self._m = m

    def fcs_ok(self):
        """The last four bytes are the FCS of the bytes before them."""
        return Cat(*reversed(self.hb)) == self.ha[3] ^ CRC_INIT

    def after(self, byte, name):
        """The register after ``byte`` (comb nets: build it outside any ``If``)."""
        return crc_byte(self._m, self.acc, byte, name)

    def take(self, byte, nxt):
        """Sync statements taking ``byte`` (``nxt``: :meth:`after` of it)."""
        self._m.d.sync += [self.acc.eq(nxt), self.hb[0].eq(byte), self.ha[0].eq(self.acc),
                           *[self.hb[k].eq(self.hb[k - 1]) for k in range(1, 4)],
                           *[self.ha[k].eq(self.ha[k - 1]) for k in range(1, 4)]]
        return nxt

    def restart(self):
        self._m.d.sync += self.acc.eq(CRC_INIT)


class GmiiFcsFormal(wiring.Component):
    """The 1G transmit path as in :class:`mcf.hdl.eth.rgmii.RgmiiMac` — ``EthEncap`` →
    ``GmiiTx`` — fed arbitrary link bytes (``i``: any data, ``last`` and ``valid`` on any
    cycle) with arbitrary, changing ``local_id``/``peer_id``. The harness follows the GMII
    output (``txd``/``tx_en``/``tx_er``): 7 × 0x55 and the SFD open a frame (asserted), the
    bytes after the SFD go through a :class:`FcsTracker`, and when ``tx_en`` falls the frame's
    last four bytes must be the FCS of the bytes before them unless a byte of the frame carried
    ``tx_er``. With ``invariants`` (for k-induction) the relations between the tracker and the
    encapsulator's CRC register in every state of both FSMs are asserted too. ``covers``: the
    end of a good and of a ``tx_er`` frame instead (reachable: the proof is not vacuous);
    ``corrupt``: the tracker sees each byte XORed with the free input ``flip`` (a line that
    changes bytes after the FCS was computed: the property must fail)."""

    def __init__(self, *, invariants: bool = True, covers: bool = False,
                 corrupt: bool = False):
        self._invariants = invariants
        self._covers = covers
        self._corrupt = corrupt
        super().__init__({"i": In(stream.Signature(BYTE)), "local_id": In(NODE_BITS),
                          "peer_id": In(NODE_BITS), "flip": In(8)})

    def elaborate(self, platform):
        m = Module()
        enc, gtx = EthEncap(), GmiiTx()
        m.submodules.encap, se = probe(enc)
        m.submodules.gmii, sg = probe(gtx)
        wiring.connect(m, wiring.flipped(self.i), enc.i)
        wiring.connect(m, enc.o, gtx.i)
        m.d.comb += [enc.local_id.eq(self.local_id), enc.peer_id.eq(self.peer_id),
                     Assume(~ResetSignal())]
        txd, tx_en, tx_er = gtx.txd, gtx.tx_en, gtx.tx_er

        in_frame = Signal()                  # tx_en in the previous cycle
        idx = Signal(range(9))               # bytes of this carrier before txd, up to 8
        err = Signal()                       # a byte of this carrier had tx_er
        t = FcsTracker(m, "line")
        seen = txd ^ self.flip if self._corrupt else txd
        nxt = t.after(seen, "nxt")
        m.d.sync += in_frame.eq(tx_en)
        with m.If(tx_en):
            m.d.sync += err.eq(err | tx_er)
            with m.If(idx < 8):
                m.d.sync += idx.eq(idx + 1)
            with m.Else():
                t.take(seen, nxt)
        with m.Else():
            m.d.sync += [idx.eq(0), err.eq(0)]
            t.restart()
        if self._covers:
            m.d.comb += [Cover(in_frame & ~tx_en & ~err), Cover(in_frame & ~tx_en & err)]
            return m
        m.d.comb += [
            Assert(_implies(in_frame & ~tx_en & ~err, t.fcs_ok()),
                   "a frame left without tx_er and with a bad FCS"),
            Assert(_implies(tx_en & (idx < len(PREAMBLE)), txd == PREAMBLE[0])),
            Assert(_implies(tx_en & (idx == len(PREAMBLE)), txd == SFD)),
        ]
        if not self._invariants:
            return m

        g, e = sg["fsm"], se["fsm"]
        gcnt, crc, k = sg["cnt"], se["crc"], se["fcs_idx"]
        fcs = [(crc ^ CRC_INIT)[8 * j:8 * j + 8] for j in range(4)]
        enc_idle = _in(e, "HDR") & (se["cnt"] == 0) & (crc == CRC_INIT) & (k == 0)
        clean = ~tx_en & ~tx_er & ~in_frame & (idx == 0) & (t.acc == CRC_INIT) & ~err
        body = _in(g, "DATA") & (idx == 8) & ~err & ~tx_er
        fcs_at = _in(e, "FCS")
        m.d.comb += [
            Assert(_implies(~_in(e, "FCS"), k == 0)),
            Assert(_implies(_in(g, "IDLE"), clean & enc_idle)),
            Assert(_implies(_in(g, "PRE"), tx_en & ~tx_er & ~err & (idx == gcnt - 1)
                            & (gcnt >= 1) & (gcnt <= len(PREAMBLE)) & enc_idle
                            & (t.acc == CRC_INIT))),
            Assert(_implies(_in(g, "DATA"), tx_en & ((idx == 7) | (idx == 8)))),
            Assert(_implies(_in(g, "DATA") & (idx == 7),
                            ~tx_er & ~err & (t.acc == CRC_INIT) & enc_idle)),
            # the encapsulator's register is the CRC of the bytes it passed: those on the line
            # and the one in txd; in its FCS state, the FCS bytes already out are its own
            Assert(_implies(body & (~fcs_at | (k == 0)), nxt == crc)),
            Assert(_implies(body & fcs_at & (k == 1), (t.acc == crc) & (txd == fcs[0]))),
            Assert(_implies(body & fcs_at & (k == 2), (t.ha[0] == crc) & (t.hb[0] == fcs[0])
                            & (txd == fcs[1]))),
            Assert(_implies(body & fcs_at & (k == 3), (t.ha[1] == crc) & (t.hb[1] == fcs[0])
                            & (t.hb[0] == fcs[1]) & (txd == fcs[2]))),
            Assert(_implies(_in(g, "IFG"), enc_idle & (gcnt < IFG_BYTES))),
            Assert(_implies(_in(g, "IFG") & (gcnt == 0), tx_en & (idx == 8)
                            & (err | tx_er | (Cat(t.hb[2], t.hb[1], t.hb[0], txd)
                                              == t.ha[2] ^ CRC_INIT)))),
            Assert(_implies(_in(g, "IFG") & (gcnt == 1),
                            ~tx_en & ~tx_er & in_frame & (err | t.fcs_ok()))),
            Assert(_implies(_in(g, "IFG") & (gcnt >= 2), clean)),
        ]
        return m


def test_gmii_fcs_formal():
    """1G: every frame on GMII without tx_er ends with its correct FCS (k-induction)."""
    check(GmiiFcsFormal(), "eth_gmii_fcs", mode="prove", depth=3, timeout=900)


@pytest.mark.slow
def test_gmii_fcs_formal_covers():
    """The end of a good frame and of a tx_er frame are reachable (cover, ~75 cycles: slow)."""
    check(GmiiFcsFormal(covers=True), "eth_gmii_fcs_cover", mode="cover", depth=80,
          timeout=1800)


@pytest.mark.slow
def test_gmii_fcs_formal_catches_a_changed_byte():
    """A byte changed on the line after the FCS was computed fails the property (BMC to the
    end of a minimum frame: slow)."""
    with pytest.raises(AssertionError, match="FAIL"):
        check(GmiiFcsFormal(invariants=False, corrupt=True), "eth_gmii_fcs_corrupt",
              mode="bmc", depth=80, timeout=1800)


def test_crc32_update_is_the_serial_crc():
    """:func:`mcf.hdl.nic.crc.crc32_update` over k = 1..8 bytes equals k steps of the
    harness's bit-serial :func:`crc_byte`, for every register and data value: both are linear
    over GF(2) (XORs, and ANDs with constants only), so agreeing on the zero vector and on every
    unit vector of the 32 + 8k input bits proves them equal (a solver cannot: XOR-heavy
    equivalences defeat CDCL beyond one byte)."""
    m = Module()
    c, w = Signal(32), Signal(64)
    serial, wide = [], []
    x = c
    for k in range(1, 9):
        x = crc_byte(m, x, w[8 * (k - 1):8 * k], f"s{k}")
        serial.append(x)
        out = Signal(32, name=f"wide{k}")
        m.d.comb += out.eq(crc32_update(c, w, k))
        wide.append(out)
    sim = Simulator(m)
    bad = []

    async def bench(ctx):
        vectors = [(0, 0)] + [(1 << j, 0) for j in range(32)] + [(0, 1 << j) for j in range(64)]
        for cv, wv in vectors:
            ctx.set(c, cv)
            ctx.set(w, wv)
            for k in range(8):
                if wv >> (8 * (k + 1)):
                    continue                    # a data bit beyond the k + 1 bytes used
                if ctx.get(serial[k]) != ctx.get(wide[k]):
                    bad.append((k + 1, cv, wv))

    sim.add_testbench(bench)
    sim.run()
    assert not bad


# ---- the FCS on the 10G line ------------------------------------------------------------------

XGMII_START_WORD = int.from_bytes(bytes([XGMII_START]) + PREAMBLE[1:] + bytes([SFD]), "little")


class XgmiiFcsFormal(wiring.Component):
    """The 10G transmit path of :class:`mcf.hdl.eth.tengig.TenGigMac` — ``EthEncap64`` →
    ``XgmiiTx``, without the clock-crossing FIFO between them (proved on its own) and the PCS's
    clock enable (which stalls every register alike) — fed arbitrary link beats (any data,
    ``keep``, ``last`` and ``valid`` on any cycle) with arbitrary, changing
    ``local_id``/``peer_id``, checked on the XGMII output the way a receiver reads it
    (:class:`mcf.hdl.eth.xgmii.XgmiiRx`'s rules): a frame opens at /S/ on lane 0 or 4 (lane-4
    frames are realigned from two line words), and ends at the first control character after
    it.

    Asserted: the /S/ word is /S/, 6 × 0x55, SFD; a frame ends only at /T/ or /E/; and a frame
    ending at /T/ is its bytes followed by their FCS. The CRC side is compositional (``docs/eth.md``
    §8): the harness follows the transmitter's one CRC step per word — its ``_crc_n`` instance,
    register in, word, byte count ``nb``, register out (:func:`mcf.sim.formal.probe`) — and
    asserts that, frame by frame, the steps start at 0xFFFFFFFF, chain (each step's register in
    is the last one's out), take exactly the frame's bytes on the line in order (every word but
    the last whole, the last up to the FCS), and that the four bytes before /T/ are the
    complement of the last register out. :func:`test_xgmii_crc_step_is_the_serial_crc` proves
    that step equals the bit-serial CRC-32 over its ``nb`` bytes for every input, so the two
    together say the FCS is the CRC-32 of the frame's bytes. (A harness computing its own
    CRC-32 of the line, even with :func:`mcf.hdl.nic.crc.crc32_update` over the same words,
    does not close: yices must then prove two 64-bit-wide XOR networks equal on equal inputs
    and stalls.)

    With ``invariants`` (for k-induction) relations between the harness, the transmitter's
    registers and copies of them one and two cycles old are asserted too. ``covers``: a /T/
    frame end on each lane and an /E/ frame end instead; ``corrupt="data"``: the harness sees
    the line's data bytes XORed with the free input ``flip``, ``corrupt="fcs"`` only the four
    bytes it reads as a frame's FCS (either way the property must fail)."""

    def __init__(self, *, invariants: bool = True, covers: bool = False,
                 corrupt: str | None = None):
        self._invariants = invariants
        self._covers = covers
        self._corrupt = corrupt
        super().__init__({"i": In(stream.Signature(beat_layout(64))),
                          "local_id": In(NODE_BITS), "peer_id": In(NODE_BITS), "flip": In(64)})

    def elaborate(self, platform):
        m = Module()
        enc, xtx = EthEncap64(), XgmiiTx()
        m.submodules.encap, _ = probe(enc)
        m.submodules.xgmii, sx = probe(xtx)
        wiring.connect(m, wiring.flipped(self.i), enc.i)
        wiring.connect(m, enc.o, xtx.i)
        m.d.comb += [enc.local_id.eq(self.local_id), enc.peer_id.eq(self.peer_id),
                     Assume(~ResetSignal())]
        ld, lc = Signal(64), Signal(8)          # the line word (data, control)
        flip = Cat(*[Mux(xtx.txc[k], 0, self.flip[8 * k:8 * k + 8]) for k in range(8)])
        m.d.comb += [ld.eq(xtx.txd ^ flip if self._corrupt == "data" else xtx.txd),
                     lc.eq(xtx.txc)]

        # the receiver's view: the line word, or for a lane-4 frame the last line word's upper
        # half and this one's lower half
        hd, hc = Signal(64), Signal(8)          # the line word of the previous cycle
        m.d.sync += [hd.eq(ld), hc.eq(lc)]
        a4d, a4c = Cat(hd[32:], ld[:32]), Cat(hc[4:], lc[:4])
        in_frame = Signal()
        hoff = Signal()                         # this frame started on lane 4
        wd, wc = Signal(64), Signal(8)          # the frame's word (its byte 0 on lane 0)
        m.d.comb += [wd.eq(Mux(hoff, a4d, ld)), wc.eq(Mux(hoff, a4c, lc))]
        f = Signal(4)                           # first control lane of wd (8: none)
        m.d.comb += f.eq(8)
        for k in reversed(range(8)):
            with m.If(wc[k]):
                m.d.comb += f.eq(k)
        fbyte = Signal(8)
        m.d.comb += fbyte.eq(wd.word_select(f[:3], 8))

        # the transmitter's CRC step, 1 and 2 cycles ago: a lane-0 word reaches the line one
        # cycle after its step, a lane-4 word is whole one cycle later
        stp = [sx["crc_next_in"], sx["crc_next_data"], sx["nb"], sx["crc_next"]]
        sh1 = [Signal.like(x, name=f"step1_{x.name}") for x in stp]
        sh2 = [Signal.like(x, name=f"step2_{x.name}") for x in stp]
        m.d.sync += [*[d.eq(x) for d, x in zip(sh1, stp)], *[d.eq(x) for d, x in zip(sh2, sh1)]]
        cin, cd, cn, co = [Mux(hoff, b, a) for a, b in zip(sh1, sh2)]
        acc = Signal(32, init=CRC_INIT)         # register out of the last step taken
        last_n = Signal(4, init=8)              # its byte count (8 at a frame's start)
        wp = Signal(64)                         # the frame's previous word
        nw = Signal()                           # a word came before wd in this frame

        def bytes_eq(x, y, n):
            return Cat(*[(j >= n) | (x.word_select(j, 8) == y.word_select(j, 8))
                         for j in range(8)]).all()

        # a word without control characters: its step continues the chain and took its bytes
        # (all of them unless it is the frame's last: then the next word holds /T/)
        word_ok = (cin == acc) & bytes_eq(cd, wd, cn) & (last_n == 8)
        # /T/ on lane f: the FCS starts kk bytes into the last stepped word — the previous one
        # (f < 4) or this one
        lo = f < 4
        kk = Signal(4)
        m.d.comb += kk.eq(Mux(lo, f + 4, f - 4))
        fcs_seen = Signal(32)
        m.d.comb += fcs_seen.eq((Cat(Mux(lo, wp, wd), wd) >> (kk[:3] * 8))[:32]
                                ^ (self.flip[:32] if self._corrupt == "fcs" else 0))
        fcs_ok = Mux(lo,
                     nw & (last_n == kk) & (fcs_seen == acc ^ CRC_INIT),
                     (last_n == 8) & Mux(kk == 0, fcs_seen == acc ^ CRC_INIT,
                                         (cin == acc) & (cn == kk) & bytes_eq(cd, wd, kk)
                                         & (fcs_seen == co ^ CRC_INIT)))

        start0 = lc[0] & (ld[:8] == XGMII_START)
        start4 = a4c[0] & (a4d[:8] == XGMII_START) & ~start0
        start = start0 | start4
        data = in_frame & (f == 8)
        ends = in_frame & (f != 8)
        with m.If(~in_frame & start):
            m.d.sync += [in_frame.eq(1), hoff.eq(start4), acc.eq(CRC_INIT), last_n.eq(8),
                         nw.eq(0)]
        with m.Elif(data):
            m.d.sync += [acc.eq(co), last_n.eq(cn), wp.eq(wd), nw.eq(1)]
        with m.Elif(ends):
            m.d.sync += in_frame.eq(0)

        if self._covers:
            term = ends & (fbyte == XGMII_TERM)
            m.d.comb += [Cover(term & ~hoff), Cover(term & hoff),
                         Cover(ends & (fbyte == XGMII_ERROR))]
            return m
        m.d.comb += [
            Assert(_implies(ends & (fbyte == XGMII_TERM), fcs_ok),
                   "a frame ended with /T/ and a bad FCS"),
            Assert(_implies(data, word_ok), "the CRC did not take the frame's bytes"),
        ]
        if self._corrupt:
            return m
        m.d.comb += [
            Assert(_implies(~in_frame & start,
                            (Mux(start0, ld, a4d) == XGMII_START_WORD)
                            & (Mux(start0, lc, a4c) == 0x01)), "a bad preamble or SFD"),
            Assert(_implies(ends, (fbyte == XGMII_TERM) | (fbyte == XGMII_ERROR)),
                   "a frame ended by a control character other than /T/ or /E/"),
        ]
        if not self._invariants:
            return m

        st, enc_st = sx["fsm"]
        crc, off, err = sx["crc"], sx["off"], sx["err"]
        prev_w, prev_c = sx["prev_w"], sx["prev_c"]
        up = Signal()                           # past the first cycle
        pw, pc = Signal(64), Signal(8)          # prev_w, prev_c one cycle ago
        sc, sc2 = Signal(32), Signal(32)        # crc one and two cycles ago
        serr, soff = Signal(), Signal()
        sst = Signal.like(st)
        m.d.sync += [up.eq(1), pw.eq(prev_w), pc.eq(prev_c), sc.eq(crc), sc2.eq(sc),
                     serr.eq(err), soff.eq(off), sst.eq(st)]

        def state(s, *names):
            return Cat(*[s == enc_st[n] for n in names]).any()

        room = Signal(signed(18))               # frame bytes before the FCS still to send
        m.d.comb += room.eq(xgmii._BODY - sx["cnt"])

        m.d.comb += [
            # the line is the transmitter's aligned word of one cycle ago (lane 0), or the upper
            # half of that word's predecessor and its lower half (lane 4)
            Assert(_implies(up, Mux(off, (ld[32:] == prev_w[:32]) & (lc[4:] == prev_c[:4]),
                                    (ld == prev_w) & (lc == prev_c)))),
            Assert(_implies(in_frame, (off == hoff) & _implies(hoff, soff))),
            Assert(_implies(in_frame, Mux(hoff, (wd == pw) & (wc == pc),
                                          (wd == prev_w) & (wc == prev_c)))),
            # inside a frame the transmitter has not yet left it, without an /E/
            Assert(_implies(data, state(Mux(hoff, sst, st), "DATA", "PAD", "TAIL")
                            & ~Mux(hoff, serr, err))),
            Assert(_implies(data, acc == Mux(hoff, sc2, sc))),
            Assert(_implies(~in_frame & start,
                            state(Mux(start4, sst, st), "DATA") & (off == start4)
                            & (Mux(start4, sc, crc) == CRC_INIT) & ~Mux(start4, serr, err))),
            # the padding registers are the functions of the byte count they stand for
            Assert((sx["pad_to"] == Mux(room >= 8, 8, Mux(room > 0, room[:4], 0)))
                   & (sx["more"] == (room > 8))),
            # outside one it is idle, past an /E/, or has just sent a lane-4 /S/
            Assert(_implies(~in_frame & ~start,
                            state(st, "IDLE") | err
                            | (state(st, "DATA") & off & (prev_w == XGMII_START_WORD)
                               & (prev_c == 1) & (crc == CRC_INIT)))),
        ]
        return m


def test_xgmii_fcs_formal():
    """10G: every frame on XGMII ending at /T/ ends with its correct FCS, on lane 0 and lane 4
    (k-induction, with :func:`test_xgmii_crc_step_is_the_serial_crc`)."""
    check(XgmiiFcsFormal(), "eth_xgmii_fcs", mode="prove", depth=3, timeout=900)


@pytest.mark.slow
def test_xgmii_fcs_formal_covers():
    """A /T/ frame end on lane 0 and on lane 4 and an /E/ frame end are reachable (slow)."""
    check(XgmiiFcsFormal(covers=True), "eth_xgmii_fcs_cover", mode="cover", depth=30,
          timeout=1800)


@pytest.mark.slow
@pytest.mark.parametrize("corrupt,depth", [("data", 4), ("fcs", 14), ("xorout", 14)])
def test_xgmii_fcs_formal_catches_a_changed_byte(corrupt, depth, monkeypatch):
    """A data byte changed on the line after the CRC took it, an FCS byte changed on the line,
    or a transmitter that complements its CRC wrongly (``CRC32_XOROUT`` off by one bit) fails
    the property (BMC: to the first data word, to the end of a minimum frame; ~25 s)."""
    if corrupt == "xorout":
        monkeypatch.setattr(xgmii, "CRC32_XOROUT", CRC_INIT ^ 1)
    with pytest.raises(AssertionError, match="FAIL"):
        check(XgmiiFcsFormal(invariants=False,
                             corrupt=None if corrupt == "xorout" else corrupt),
              f"eth_xgmii_fcs_corrupt_{corrupt}", mode="bmc", depth=depth, timeout=1800)


def test_xgmii_crc_step_is_the_serial_crc():
    """The 10G transmitter's CRC step (:func:`mcf.hdl.eth.xgmii._crc_n`, the instance
    :class:`XgmiiFcsFormal` follows) over n = 0..8 bytes equals n steps of the bit-serial
    :func:`crc_byte`, whatever the word's bytes beyond n: linear over GF(2), so the zero vector
    and the 32 + 64 unit vectors of register and word, for every n, prove it."""
    m = Module()
    c, w, n = Signal(32), Signal(64), Signal(4)
    step = _crc_n(m, c, w, n, "step")
    serial = [c]
    for k in range(8):
        serial.append(crc_byte(m, serial[-1], w[8 * k:8 * k + 8], f"s{k}"))
    sim = Simulator(m)
    bad = []

    async def bench(ctx):
        vectors = [(0, 0)] + [(1 << j, 0) for j in range(32)] + [(0, 1 << j) for j in range(64)]
        for cv, wv in vectors:
            for nv in range(9):
                ctx.set(c, cv)
                ctx.set(w, wv)
                ctx.set(n, nv)
                if ctx.get(step) != ctx.get(serial[nv]):
                    bad.append((nv, cv, wv))

    sim.add_testbench(bench)
    sim.run()
    assert not bad

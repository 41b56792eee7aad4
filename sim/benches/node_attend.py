"""cocotb bench of the ATTEND executor (docs/node.md §3, §7; the flat top ``node_attend`` built by
``tests/test_node_attend.py``: ``AttendUnit`` + ``KvReader`` + ``AttentionEngine`` behind one
``AxiPortMux`` to an ``AxiRam``), bit-exact against :func:`mcf.golden.attend_unit.attend_model`.

The RAM holds landed KV (random INT4 token records written with :func:`mcf.abi.kv.pack_kv_block`
at :func:`mcf.abi.kv_reader.block_address`), the block lists (at ``ATT_LIST_BASE + list·16``),
queries (:func:`mcf.abi.query.pack_query`, in QBUF slots for decode, at
:func:`mcf.abi.attend.prefill_query_address` for prefill). Records go in on ``s_axis_rec``;
decode states come out on ``m_axis_staged`` (checked payload by payload), prefill ``o/l`` rows
are read back from the RAM. Pauses (``pause``) on the RAM's AR, R, AW, W, B channels and the
staged sink.

Tests: ``decode`` (records of 1–2 heads over 1–5 blocks, partial blocks), ``prefill`` (causal
over the chunks so far), ``bad`` (bad records counted and retired, then good ones), ``two_phase``
(DECODE MAX, DECODE FIXED against maxima in an MBUF-like slot — of a larger key set, or below
the keys' own maximum —, PREFILL EXACT, SINGLE records between them), ``split`` (two DECODE FIXED
records of a split key set merged equal one over the whole set; PREFILL EXACT gives the same
``o/l`` for two block partitions), ``bad_softmax`` (softmax settings a mode does not run, a read
error on FIXED's maxima), ``rate`` (one decode ATTEND over 8 whole blocks: the engine's busy
fraction from the record's accept to its ``done``; JSON to ``out``). Params: ``seed``,
``pause``, ``tests``, ``out``, geometry.
"""

from __future__ import annotations

import json
import logging
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, SimTimeoutError, with_timeout
from cocotbext.axi import (
    AxiBus,
    AxiRam,
    AxiStreamBus,
    AxiStreamFrame,
    AxiStreamSink,
    AxiStreamSource,
)

from mcf.abi.attend import (
    ATTEND_STATUS,
    AttendArg,
    AttendBlock,
    AttendHeader,
    AttendMode,
    AttendSoftmax,
    attend_list_bytes,
    max_payload_bytes,
    prefill_query_address,
)
from mcf.abi.decode_land import query_slot_bytes
from mcf.abi.kv import attn_status_layout, pack_kv_block
from mcf.abi.kv_reader import block_address
from mcf.abi.landing import KvLayout, LandingConfig
from mcf.abi.node import Cmd, Queue, RecordClass
from mcf.abi.query import pack_query
from mcf.abi.softmax import merge_state, pack_state, sum_states, unpack_state
from mcf.golden.attend_unit import AttendResult, attend_model
from mcf.golden.attention import random_blocks, random_query
from mcf.sim.tb import pattern
from mcf.sim.toolchain import bench_params, skip_unless_selected

P = bench_params()
D, L, G, T, NL = P["head_dim"], P["lanes"], P["max_heads"], P["max_block"], P["max_list"]
MEM = 1 << 20
KV_BASE = 0x1_0000
SLICE = 32
KV_IDS = 4
LIST_BASE = 0x8_0000
QBUF = 0x9_0000
QACT = 0xA_0000
OUT = 0xC_0000
MBUF = 0xB_0000          # maxima for DECODE FIXED (32-byte slots, like the decode lander's)
M_SLOT = 32
POISON = 0xF_0000        # reads here answer SLVERR (a maxima read error)
POISON_BYTES = 0x100


class ReadError(Exception):
    """The RAM answers this read with SLVERR."""


def _poisoned(addr: int, n: int) -> bool:
    return addr < POISON + POISON_BYTES and addr + n > POISON


def _cmd(arg: AttendArg) -> int:
    raw = Cmd(cls=RecordClass.ATTEND, queue=Queue.COMPUTE, arg=arg.pack()).pack()
    return int.from_bytes(raw, "little")


class TB:
    def __init__(self, dut, seed: int, pause: float = 0.0):
        self.dut = dut
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        self.rng = np.random.default_rng(seed)
        prng = random.Random(seed)
        self.ram = AxiRam(AxiBus.from_prefix(dut, "m_axi"), dut.clk, dut.rst, size=MEM)
        self.ram.write(0, bytes([0x5A]) * MEM)
        ram = self.ram

        async def _read(address, length):
            if _poisoned(address, length):
                raise ReadError(hex(address))
            return ram.read(address % MEM, length)
        self.ram.read_if._read = _read
        for side in (self.ram.read_if, self.ram.write_if):
            side.log.setLevel(logging.DEBUG if P.get("debug") else logging.WARNING)
        if pause:
            for ch in (self.ram.read_if.ar_channel, self.ram.read_if.r_channel,
                       self.ram.write_if.aw_channel, self.ram.write_if.w_channel,
                       self.ram.write_if.b_channel):
                ch.set_pause_generator(pattern(pause, prng))
        self.src = AxiStreamSource(AxiStreamBus.from_prefix(dut, "s_axis_rec"), dut.clk,
                                   dut.rst, byte_lanes=1)
        self.sink = AxiStreamSink(AxiStreamBus.from_prefix(dut, "m_axis_staged"), dut.clk,
                                  dut.rst)
        for x in (self.src, self.sink):
            x.log.setLevel(logging.WARNING)
        if pause:
            self.sink.set_pause_generator(pattern(pause / 2, prng))
        dut.list_base.value = LIST_BASE
        self.dones = 0
        self.ars, self.rbeats = [], 0
        self.busy = 0
        self.cycles = 0
        self.n_lists = 0
        self.got: list[list[bytes]] = []
        self.layout = KvLayout(head_stride=SLICE * (4 + D), kv_slot=2 * SLICE * (4 + D),
                               land_off=(0,))
        self.cfg = LandingConfig(KV_BASE, self.layout.kv_slot, KV_IDS)

    async def reset(self):
        self.dut.rst.value = 1
        await ClockCycles(self.dut.clk, 4)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)
        cocotb.start_soon(self._monitor())

    async def _monitor(self):
        busy_bit = attn_status_layout()["busy"].offset
        while True:
            await RisingEdge(self.dut.clk)
            self.dones += int(self.dut.done.value)
            self.cycles += 1
            if int(self.dut.m_axi_arvalid.value) and int(self.dut.m_axi_arready.value):
                self.ars.append((int(self.dut.m_axi_araddr.value),
                                 int(self.dut.m_axi_arlen.value)))
            if int(self.dut.m_axi_rvalid.value) and int(self.dut.m_axi_rready.value):
                self.rbeats += 1
            self.busy += int(self.dut.engine_status.value.to_unsigned() >> busy_bit & 1)

    def status(self) -> dict:
        raw = self.dut.status.value.to_unsigned()
        return {n: (raw >> f.offset) & ((1 << f.width) - 1) for n, f in ATTEND_STATUS}

    def land(self):
        """Random KV for every (kv_id, KV head): kv_id k holds positions k·SLICE.."""
        self.kv = {}
        for kv_id in range(KV_IDS):
            for h in range(2):
                (blk,) = random_blocks(self.rng, [SLICE], D, pos0=kv_id * SLICE)
                self.kv[(kv_id, h)] = blk
                self.ram.write(block_address(self.cfg, kv_id, h, self.layout),
                               pack_kv_block(blk.k, blk.sk, blk.v, blk.sv))

    def block(self, kv_id, h, t0, n) -> AttendBlock:
        return AttendBlock(block_address(self.cfg, kv_id, h, self.layout, t0, D), n,
                           kv_id * SLICE + t0)

    def record(self, mode, heads, blocks, q_addr, q_pos, out_addr=0, q_heads=None,
               softmax=AttendSoftmax.SINGLE, qv=None) -> AttendArg:
        """Write a query (``q_heads`` heads in its header; ``qv`` = ``(codes, scales)``, random
        if None, kept in ``self.qv``) and a list; the record's arg."""
        q, sq = qv if qv is not None else random_query(self.rng, q_heads or heads, D, sigma=1.5)
        self.qv = (q, sq)
        self.ram.write(q_addr, pack_query(q, sq, q_pos, layer=0))
        lst = attend_list_bytes(AttendHeader(q_addr, out_addr), blocks)
        idx = self.n_lists
        self.ram.write(LIST_BASE + idx * 16, lst)
        self.n_lists += len(lst) // 16
        return AttendArg(idx, len(blocks), mode, heads, softmax)

    def model(self, arg: AttendArg) -> AttendResult:
        """:func:`attend_model` on the RAM; a read of a poisoned address (only FIXED's maxima
        are placed there) is a read error: ``bad_list``."""
        def read(addr: int, n: int) -> bytes:
            if _poisoned(addr, n):
                raise ReadError(hex(addr))
            return self.ram.read(addr, n)
        try:
            return attend_model(arg.pack(), LIST_BASE, read, D, G, T, NL)
        except ReadError:
            return AttendResult([], bad="bad_list")

    async def run(self, args: list[AttendArg], limit: int = 200_000):
        """Submit all records; check staged payloads in order and prefill rows at the end
        (a hang fails after ``limit`` cycles with the counters)."""
        try:
            return await with_timeout(self._run(args), 4 * limit, "ns")
        except SimTimeoutError:
            eng = self.dut.engine_status.value.to_unsigned()
            raise AssertionError(f"hang: dones {self.dones}, status {self.status()}, engine "
                                 f"status {eng:#x}, unit busy {self.dut.busy.value}, ARs "
                                 f"{[(hex(a), n) for a, n in self.ars]}, R beats {self.rbeats}"
                                 ) from None

    async def _run(self, args: list[AttendArg]):
        want = [self.model(a) for a in args]
        start = self.dones
        for a in args:
            self.src.send_nowait(AxiStreamFrame([_cmd(a)]))
        self.got = []
        for n, res in enumerate(want):
            self.got.append([])
            for h, exp in enumerate(res.payloads):
                frame = await self.sink.recv()
                self.got[-1].append(bytes(frame.tdata))
                assert bytes(frame.tdata) == exp, f"record {n} payload {h} differs"
        while self.dones - start < len(args):
            await RisingEdge(self.dut.clk)
        for n, res in enumerate(want):
            if res.write:
                addr, exp = res.write
                assert self.ram.read(addr, len(exp)) == exp, f"record {n}: o/l row differs"
        assert self.sink.empty()
        return want


def decode_records(tb: TB, count: int) -> list[AttendArg]:
    args = []
    for i in range(count):
        heads = int(tb.rng.integers(1, G + 1))
        blocks = []
        for _ in range(int(tb.rng.integers(1, 6))):
            kv_id, h = int(tb.rng.integers(KV_IDS)), int(tb.rng.integers(2))
            t0 = int(tb.rng.integers(SLICE)) if tb.rng.random() < 0.4 else 0
            n = int(tb.rng.integers(1, SLICE - t0 + 1)) if t0 else SLICE
            blocks.append(tb.block(kv_id, h, t0, n))
        q_addr = QBUF + (i % 8) * query_slot_bytes(G, D)
        args.append(tb.record(AttendMode.DECODE.value, heads, blocks, q_addr, q_pos=0))
    return args


def prefill_records(tb: TB, chunks: int) -> list[AttendArg]:
    args, row = [], 0
    for c in range(chunks):
        g = c % 2
        blocks = [tb.block(k, g, 0, SLICE) for k in range(c + 1)]
        for tok in sorted({0, SLICE - 1, int(tb.rng.integers(SLICE))}):
            q_addr = prefill_query_address(QACT, row, G, D)
            out = OUT + row * G * D * 4
            args.append(tb.record(AttendMode.PREFILL.value, G, blocks, q_addr,
                                  q_pos=c * SLICE + tok, out_addr=out))
            row += 1
    return args


DECODE, PREFILL = AttendMode.DECODE.value, AttendMode.PREFILL.value
SM = AttendSoftmax


def maxima_bytes(m) -> bytes:
    """``heads`` signed maxima as the MAX payload / an MBUF slot holds them."""
    return (np.asarray(m, dtype=np.int64) & 0xFFFF_FFFF).astype("<u4").tobytes()


def maxima(raw: bytes) -> np.ndarray:
    """The signed maxima of a MAX payload."""
    return np.frombuffer(raw, dtype="<i4").astype(np.int64)


def random_list(tb: TB, h: int, count: int) -> list[AttendBlock]:
    """``count`` blocks of KV head ``h`` (random ``kv_id``, some partial)."""
    blocks = []
    for _ in range(count):
        kv_id = int(tb.rng.integers(KV_IDS))
        t0 = int(tb.rng.integers(SLICE)) if tb.rng.random() < 0.4 else 0
        n = int(tb.rng.integers(1, SLICE - t0 + 1)) if t0 else SLICE
        blocks.append(tb.block(kv_id, h, t0, n))
    return blocks


def two_phase_records(tb: TB, count: int) -> list[AttendArg]:
    """Per round (``1 + round mod G`` heads): DECODE MAX of a list and of a larger key set
    holding it, DECODE FIXED of the list against the larger set's maxima (in round 2 against
    maxima 3.0 below its own: keys above the maximum, clamped), DECODE SINGLE of the list,
    PREFILL EXACT and SINGLE of one token (the same query). The last round's token precedes
    every key of its list (maxima ``M_EMPTY``)."""
    args, slot = [], query_slot_bytes(G, D)
    for i in range(count):
        heads, h = 1 + i % G, i // 2 % 2
        blocks = random_list(tb, h, int(tb.rng.integers(1, 5)))
        q_addr = QBUF + 0x4000 + i * slot
        args.append(tb.record(DECODE, heads, blocks, q_addr, 0, softmax=SM.MAX))
        qv = tb.qv
        sup = tb.record(DECODE, heads, blocks + random_list(tb, h, 2), q_addr, 0,
                        softmax=SM.MAX, qv=qv)
        args.append(sup)
        m = maxima(tb.model(sup).payloads[0])
        if i == 2:
            m = maxima(tb.model(args[-2]).payloads[0]) - 3 * 256
        tb.ram.write(MBUF + i * M_SLOT, maxima_bytes(m))
        args.append(tb.record(DECODE, heads, blocks, q_addr, 0, out_addr=MBUF + i * M_SLOT,
                              softmax=SM.FIXED, qv=qv))
        args.append(tb.record(DECODE, heads, blocks, q_addr, 0, qv=qv))
        c = i % KV_IDS
        pblocks = [tb.block(k, h, 0, SLICE) for k in range(c + 1)]
        q_pos = c * SLICE + int(tb.rng.integers(SLICE))
        if i == count - 1:
            pblocks, q_pos = [tb.block(1, h, 3, 20), tb.block(2, h, 0, SLICE)], SLICE - 1
        for j, sm in enumerate((SM.EXACT, SM.SINGLE)):
            row = 16 + 2 * i + j
            args.append(tb.record(PREFILL, heads, pblocks, prefill_query_address(QACT, row, G, D),
                                  q_pos, out_addr=OUT + row * G * D * 4, softmax=sm,
                                  qv=tb.qv if j else None))
    return args


async def _setup(dut, seed_off: int):
    tb = TB(dut, P.get("seed", 1) + seed_off, P.get("pause", 0.0))
    await tb.reset()
    tb.land()
    return tb


def _all_good(tb, args, want) -> None:
    """Every record of ``args`` counted with its blocks (``want``: the model's results), none
    bad, no write error."""
    st = tb.status()
    assert st["records"] == len(args) and st["blocks"] == sum(r.blocks for r in want)
    assert st["bad_record"] == st["bad_list"] == st["write_errors"] == 0


@cocotb.test()
async def decode(dut):
    """Decode states over random block lists, bit-exact per head."""
    skip_unless_selected("decode", P)
    tb = await _setup(dut, 0)
    args = decode_records(tb, 8)
    want = await tb.run(args)
    _all_good(tb, args, want)


@cocotb.test()
async def prefill(dut):
    """Causal prefill over chunks 0..c: o/l rows bit-exact in DDR."""
    skip_unless_selected("prefill", P)
    tb = await _setup(dut, 1)
    args = prefill_records(tb, 3)
    await tb.run(args)
    st = tb.status()
    assert st["records"] == len(args) and st["write_errors"] == 0


@cocotb.test()
async def bad(dut):
    """Bad records (undefined mode, heads 0 / above max, no blocks, too many blocks, a block of
    0 tokens or above max_block, a query of the wrong head count, a block, query or used
    output address off ATT_ALIGN) are counted and retire with ``done``; good records around
    them still run bit-exact."""
    skip_unless_selected("bad", P)
    tb = await _setup(dut, 2)
    good = tb.block(0, 0, 0, SLICE)
    q = QBUF
    args = decode_records(tb, 1)
    base = tb.record(AttendMode.DECODE.value, 1, [good], q + 0x400, 0)
    args += [
        AttendArg(base.list, 1, 2, 1), AttendArg(base.list, 1, 3, 1),
        AttendArg(base.list, 1, 0, 0), AttendArg(base.list, 1, 0, G + 1),
        AttendArg(base.list, 0, 0, 1), AttendArg(base.list, NL + 1, 0, 1),
    ]
    n_bad_rec = len(args) - 1
    args.append(tb.record(AttendMode.DECODE.value, 1, [good, tb.block(1, 0, 0, 0)], q + 0x800, 0))
    args.append(tb.record(AttendMode.DECODE.value, 1, [AttendBlock(good.addr, T + 1)],
                          q + 0xC00, 0))
    args.append(tb.record(AttendMode.DECODE.value, 2, [good], q + 0x1000, 0, q_heads=1))
    args += decode_records(tb, 2)
    # addresses off ATT_ALIGN: a block's, the query's, a PREFILL's out_addr (bad lists); an
    # out_addr DECODE SINGLE does not use (a good record)
    args.append(tb.record(AttendMode.DECODE.value, 1, [AttendBlock(good.addr + 2, SLICE)],
                          q + 0x1400, 0))
    args.append(tb.record(AttendMode.DECODE.value, 1, [good], q + 0x1802, 0))
    args.append(tb.record(AttendMode.PREFILL.value, 1, [good], q + 0x1C00, SLICE,
                          out_addr=OUT + 0x9001))
    args.append(tb.record(AttendMode.DECODE.value, 1, [good], q + 0x2000, 0, out_addr=0x3))
    want = await tb.run(args)
    assert [w.bad for w in want].count("bad_record") == n_bad_rec
    assert [w.bad for w in want].count("bad_list") == 6
    st = tb.status()
    assert st["bad_record"] == n_bad_rec and st["bad_list"] == 6 and st["records"] == 4


@cocotb.test()
async def two_phase(dut):
    """DECODE MAX / FIXED and PREFILL EXACT records between SINGLE ones, bit-exact."""
    skip_unless_selected("two_phase", P)
    tb = await _setup(dut, 4)
    args = two_phase_records(tb, 4)
    want = await tb.run(args)
    assert all(w.bad is None for w in want)
    _all_good(tb, args, want)
    eng = tb.dut.engine_status.value.to_unsigned()
    err_max = attn_status_layout()["err_max"]
    assert eng >> err_max.offset & ((1 << err_max.width) - 1) > 0   # round 2's low maxima


@cocotb.test()
async def split(dut):
    """The two-phase softmax does not depend on the key split: DECODE MAX of two parts of a
    key set, their maxima MAX-reduced (= the whole set's), DECODE FIXED of each part against
    them — the two states merged (``merge_state``, equal ``m``: a sum) are the bits of one FIXED
    record over the whole set; PREFILL EXACT over two block partitions of the same keys (one
    finer and in reverse order) writes the same ``o/l``."""
    skip_unless_selected("split", P)
    tb = await _setup(dut, 5)
    h = 1
    whole = [tb.block(k, h, 0, SLICE) for k in range(3)] + [tb.block(3, h, 0, 9)]
    part_a = [tb.block(0, h, 0, SLICE), tb.block(1, h, 0, 20)]
    part_b = [tb.block(1, h, 20, SLICE - 20), tb.block(2, h, 0, SLICE), tb.block(3, h, 0, 9)]
    q_addr = QBUF + 0x6000
    args = [tb.record(DECODE, G, part_a, q_addr, 0, softmax=SM.MAX)]
    qv = tb.qv
    args += [tb.record(DECODE, G, p, q_addr, 0, softmax=SM.MAX, qv=qv) for p in (part_b, whole)]
    await tb.run(args)
    ma, mb, mw = (maxima(g[0]) for g in tb.got)
    m = np.maximum(ma, mb)                              # ReduceOp.MAX of the two parts
    assert np.array_equal(m, mw) and not np.array_equal(ma, mb)
    tb.ram.write(MBUF, maxima_bytes(m))
    args = [tb.record(DECODE, G, p, q_addr, 0, out_addr=MBUF, softmax=SM.FIXED, qv=qv)
            for p in (part_a, part_b, whole)]
    await tb.run(args)
    for hd in range(G):
        sa, sb = (unpack_state(tb.got[r][hd], D) for r in range(2))
        assert pack_state(*merge_state(sa, sb)) == tb.got[2][hd], f"head {hd}: merge differs"
        assert pack_state(*sum_states(sa, sb)) == tb.got[2][hd], f"head {hd}: sum differs"

    q_pos = 3 * SLICE + 5                               # keys of kv_id 3 after 5 are masked
    coarse = [tb.block(k, h, 0, SLICE) for k in range(KV_IDS)]
    fine = [tb.block(3, h, 6, SLICE - 6), tb.block(3, h, 0, 6), tb.block(2, h, 0, SLICE),
            tb.block(1, h, 16, 16), tb.block(1, h, 0, 16), tb.block(0, h, 7, SLICE - 7),
            tb.block(0, h, 0, 7)]
    qa = prefill_query_address(QACT, 40, G, D)
    outs = [OUT + 0x8000, OUT + 0x8400]
    args = [tb.record(PREFILL, G, coarse, qa, q_pos, out_addr=outs[0], softmax=SM.EXACT)]
    qv = tb.qv
    args.append(tb.record(PREFILL, G, fine, qa, q_pos, out_addr=outs[1], softmax=SM.EXACT,
                          qv=qv))
    want = await tb.run(args)
    rows = [tb.ram.read(a, G * D * 4) for a in outs]
    assert rows[0] == rows[1] == want[0].write[1], "EXACT o/l depends on the partition"
    st = tb.status()
    assert st["records"] == 8 and st["bad_record"] == st["bad_list"] == 0


@cocotb.test()
async def bad_softmax(dut):
    """PREFILL MAX / FIXED and DECODE EXACT are bad records, a read error on DECODE FIXED's
    maxima a bad list; the records around them still run bit-exact."""
    skip_unless_selected("bad_softmax", P)
    tb = await _setup(dut, 6)
    good = tb.block(0, 0, 0, SLICE)
    q = QBUF + 0x7000
    base = tb.record(DECODE, 1, [good], q, 0)
    args = [AttendArg(base.list, 1, PREFILL, 1, SM.MAX),
            AttendArg(base.list, 1, PREFILL, 1, SM.FIXED),
            AttendArg(base.list, 1, DECODE, 1, SM.EXACT)]
    two = [good, tb.block(1, 0, 0, SLICE)]
    args.append(tb.record(DECODE, 2, two, q + 0x100, 0, softmax=SM.MAX))
    (m,) = tb.model(args[-1]).payloads
    assert len(m) == max_payload_bytes(2)
    tb.ram.write(MBUF, m)
    args.append(tb.record(DECODE, 2, two, q + 0x200, 0, out_addr=POISON, softmax=SM.FIXED))
    args.append(tb.record(DECODE, 2, two, q + 0x300, 0, out_addr=MBUF, softmax=SM.FIXED))
    args.append(AttendArg(base.list, 1, DECODE, 1, SM.EXACT))
    args.append(tb.record(PREFILL, 2, two, prefill_query_address(QACT, 48, G, D), SLICE + 3,
                          out_addr=OUT + 0xA000, softmax=SM.EXACT))
    args += decode_records(tb, 1)
    want = await tb.run(args)
    bads = [w.bad for w in want]
    assert bads.count("bad_record") == 4 and bads.count("bad_list") == 1
    st = tb.status()
    assert st["bad_record"] == 4 and st["bad_list"] == 1 and st["records"] == 4
    assert st["blocks"] == sum(w.blocks for w in want)


@cocotb.test()
async def rate(dut):
    """One decode ATTEND over 8 whole blocks (G heads): engine busy fraction."""
    skip_unless_selected("rate", P)
    tb = await _setup(dut, 3)
    results = []
    for heads in (G, 1):
        blocks = [tb.block(int(tb.rng.integers(KV_IDS)), 0, 0, SLICE) for _ in range(8)]
        arg = tb.record(AttendMode.DECODE.value, heads, blocks, QBUF, 0)
        while int(tb.dut.busy.value):
            await RisingEdge(dut.clk)
        c0, b0 = tb.cycles, tb.busy
        await tb.run([arg])
        cycles, busy = tb.cycles - c0, tb.busy - b0
        results.append({"heads": heads, "blocks": 8, "keys": 8 * SLICE, "cycles": cycles,
                        "engine_busy": busy, "busy_fraction": round(busy / cycles, 4)})
        dut._log.info("attend rate: %s", results[-1])
    if P.get("out"):
        with open(P["out"], "w") as fh:
            json.dump(results, fh)

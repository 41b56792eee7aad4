"""cocotb bench of the CSR bank (``mcf_csr``-style top: ``FlatTop(CsrBank(map))``).

A passive monitor samples every bus and hardware-side signal once per cycle (at the falling
edge, i.e. the values the next rising edge sees) and replays the cycle's events into the host
model :class:`mcf.golden.csr.CsrModel` in the bank's documented order: a write takes effect at
the edge that raises ``bvalid`` (then hardware RW1C sets of that edge, so a set wins), reads
sample at their AR handshake edge. It checks ``rdata``/``rresp`` and ``bresp`` at their
handshakes, every RW / W / RW1C output and every W strobe in every cycle, and the AXI rule
that ``bvalid``/``rvalid`` stay high with a stable payload until accepted.

Tests:

* ``random_master`` — cocotbext-axi ``AxiLiteMaster`` with several concurrent workers issuing
  random reads/writes (mapped and unmapped addresses, partial contiguous strobes), random
  R inputs and RW1C set pulses, parametrized over AW/W skew (independent pause generators on
  the AW and W channels) and B/R backpressure (pause generators on the B and R sinks).
* ``raw_random`` — the bus driven directly: random ``valid`` timing per channel (AW and W fully
  independent, W often before AW), arbitrary (also non-contiguous) ``wstrb``, random
  ``bready``/``rready``.

Parameters (``mcf.sim.bench_params()``): ``map`` (a key of :data:`mcf.sim.tb.MAPS`), ``n``
(transactions per test), ``seed``.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, RisingEdge, with_timeout
from cocotbext.axi import AxiLiteBus, AxiLiteMaster

from mcf.abi.regs import WORD_BYTES, Access
from mcf.golden.csr import CsrModel
from mcf.sim import bench_params
from mcf.sim.tb import MAPS

PARAMS = bench_params()
REGMAP = MAPS[PARAMS.get("map", "kinds")]()
N = int(PARAMS.get("n", 300))
SEED = int(PARAMS.get("seed", 1))


def flat(reg: str, field: str, member: str | None = None) -> str:
    """The FlatTop name of a field port (``regs`` interface path joined by ``_``)."""
    return "_".join(["regs", reg, field] + ([member] if member else []))


class Monitor:
    """Cycle-level replay of the bus into the host model; counts what it checked."""

    def __init__(self, dut, model: CsrModel):
        self.dut, self.model = dut, model
        self.bus = {name: getattr(dut, f"s_axi_ctrl_{name}") for name in (
            "awaddr", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready", "bresp",
            "bvalid", "bready", "araddr", "arvalid", "arready", "rdata", "rresp", "rvalid",
            "rready")}
        self.inputs, self.sets, self.outputs, self.strobes = {}, {}, {}, {}
        for key, slot in model.slots.items():
            if slot.reg in (model.id_reg, model.errors_reg):
                continue
            access = slot.field.access
            if access is Access.R:
                self.inputs[key] = getattr(dut, flat(*key))
            elif access is Access.RW:
                self.outputs[key] = getattr(dut, flat(*key))
            else:
                self.outputs[key] = getattr(dut, flat(*key, "value"))
                if access is Access.W:
                    self.strobes[key] = getattr(dut, flat(*key, "stb"))
                else:
                    self.sets[key] = getattr(dut, flat(*key, "set"))
        self.stats = dict.fromkeys(("reads", "writes", "read_errors", "write_errors", "sets",
                                    "races", "strobes", "r_stalls", "b_stalls",
                                    "w_before_aw"), 0)
        self.errors: list[str] = []

    def fail(self, msg: str) -> None:
        """Record and raise: an exception in this task fails the running test at once."""
        self.errors.append(msg)
        raise AssertionError(f"cycle check failed: {msg}")

    async def run(self):
        model, bus = self.model, self.bus
        aw_q, w_q, r_exp, b_exp = deque(), deque(), deque(), deque()
        prev = None
        prev_sets: dict = {}
        while True:
            await FallingEdge(self.dut.clk)
            s = {k: int(v.value) for k, v in bus.items()}
            if int(self.dut.rst.value):
                model.reset()
                aw_q.clear(), w_q.clear(), r_exp.clear(), b_exp.clear()
                prev, prev_sets = None, {}
                continue
            # 1. the previous edge: a write committed there iff a new response rose
            fired = set()
            if prev is not None and s["bvalid"] and (not prev["bvalid"] or prev["bready"]):
                if not aw_q or not w_q:
                    self.fail("bvalid without a complete AW+W")
                else:
                    addr = aw_q.popleft()
                    data, strb = w_q.popleft()
                    clears = model.rw1c_clears(addr, data, strb)
                    self.stats["races"] += sum(bool(clears.get(k, 0) & bits)
                                               for k, bits in prev_sets.items())
                    bresp = model.write(addr, data, strb)
                    fired = set(model.strobes)
                    b_exp.append(bresp)
                    self.stats["writes"] += 1
                    self.stats["write_errors"] += bresp != 0
            for k, bits in prev_sets.items():
                model.hw_set(*k, bits)
            # 2. outputs now reflect every edge up to the previous one
            for k, sig in self.outputs.items():
                if int(sig.value) != model.storage[k]:
                    self.fail(f"output {k}: {int(sig.value):#x} != model {model.storage[k]:#x}")
            for k, sig in self.strobes.items():
                if int(sig.value) != (k in fired):
                    self.fail(f"strobe {k}: {int(sig.value)} expected {int(k in fired)}")
                self.stats["strobes"] += k in fired
            # 3. response channel rules: held high with a stable payload until accepted
            if prev is not None:
                if prev["bvalid"] and not prev["bready"]:
                    self.stats["b_stalls"] += 1
                    if not s["bvalid"] or s["bresp"] != prev["bresp"]:
                        self.fail("B dropped or changed while stalled")
                if prev["rvalid"] and not prev["rready"]:
                    self.stats["r_stalls"] += 1
                    if not s["rvalid"] or (s["rdata"], s["rresp"]) != (prev["rdata"],
                                                                       prev["rresp"]):
                        self.fail("R dropped or changed while stalled")
            # 4. handshakes at the coming edge
            if s["arvalid"] and s["arready"]:
                for k, sig in self.inputs.items():
                    model.inputs[k] = int(sig.value)
                r_exp.append(model.read(s["araddr"]))
                self.stats["reads"] += 1
                self.stats["read_errors"] += r_exp[-1][0] != 0
            if s["awvalid"] and s["awready"]:
                aw_q.append(s["awaddr"])
            if s["wvalid"] and s["wready"]:
                if len(w_q) >= len(aw_q):
                    self.stats["w_before_aw"] += 1
                w_q.append((s["wdata"], s["wstrb"]))
            if s["rvalid"] and s["rready"]:
                if not r_exp:
                    self.fail("R response without a read")
                else:
                    resp, data = r_exp.popleft()
                    if (s["rresp"], s["rdata"]) != (resp, data):
                        self.fail(f"read: got resp {s['rresp']} data {s['rdata']:#x}, "
                                  f"model resp {resp} data {data:#x}")
            if s["bvalid"] and s["bready"]:
                if not b_exp:
                    self.fail("B handshake before the write was seen committing")
                elif b_exp.popleft() != s["bresp"]:
                    self.fail(f"bresp {s['bresp']} differs from the model")
            prev_sets = {k: int(sig.value) for k, sig in self.sets.items() if int(sig.value)}
            self.stats["sets"] += len(prev_sets)
            prev = s


class TB:
    def __init__(self, dut, seed: int):
        self.dut = dut
        self.rng = random.Random(seed)
        self.model = CsrModel(REGMAP)
        self.addr_width = len(dut.s_axi_ctrl_awaddr)
        cocotb.start_soon(Clock(dut.clk, 4, unit="ns").start())
        self.monitor = Monitor(dut, self.model)
        cocotb.start_soon(self.monitor.run())

    async def reset(self):
        self.dut.rst.value = 1
        for sig in [*self.monitor.inputs.values(), *self.monitor.sets.values()]:
            sig.value = 0
        for _ in range(3):
            await RisingEdge(self.dut.clk)
        self.dut.rst.value = 0
        await RisingEdge(self.dut.clk)

    async def hardware(self, p_change=0.2, p_set=0.15):
        """Random R inputs and RW1C set pulses, changed right after rising edges."""
        rng, mon, model = self.rng, self.monitor, self.model
        while True:
            await RisingEdge(self.dut.clk)
            for k, sig in mon.inputs.items():
                if rng.random() < p_change:
                    sig.value = rng.getrandbits(model.slots[k].field.width)
            for k, sig in mon.sets.items():
                width = model.slots[k].field.width
                sig.value = (rng.getrandbits(width) & rng.getrandbits(width)) \
                    if rng.random() < p_set else 0

    def random_addr(self) -> int:
        """80 % mapped (half of those on registers software can write, and 60 % of those
        on RW1C registers, so W strobes and set/clear races are covered however large the map),
        20 % unmapped."""
        rng = self.rng
        if rng.random() < 0.8:
            writable = [addr for addr, reg in REGMAP
                        if any(f.access is not Access.R for f in reg.fields)]
            sticky = [addr for addr, reg in REGMAP
                      if any(f.access is Access.RW1C for f in reg.fields)]
            if writable and rng.random() < 0.5:
                if sticky and rng.random() < 0.6:
                    return rng.choice(sticky)
                return rng.choice(writable)
            return rng.randrange(len(REGMAP)) * WORD_BYTES
        return rng.randrange(len(REGMAP) * WORD_BYTES, 1 << self.addr_width) & ~(WORD_BYTES - 1)

    def finish(self):
        stats = self.monitor.stats
        self.dut._log.info("checked: %s", stats)
        assert not self.monitor.errors, "\n".join(self.monitor.errors)
        assert stats["reads"] > 0 and stats["writes"] > 0
        assert stats["read_errors"] > 0 and stats["write_errors"] > 0
        if self.monitor.sets:
            assert stats["sets"] > 0 and stats["races"] > 0
        if self.monitor.strobes:
            assert stats["strobes"] > 0


def pauses(rng: random.Random, duty: float):
    """An endless pause pattern (True = stall) with bursts, from a seeded generator."""
    pattern = []
    while len(pattern) < 997:
        pattern += [rng.random() < duty] * rng.choice([1, 1, 2, 5])
    return itertools.cycle(pattern)


@cocotb.test()
@cocotb.parametrize(skew=[False, True], backpressure=[False, True])
async def random_master(dut, skew, backpressure):
    tb = TB(dut, SEED * 4 + 2 * skew + backpressure)
    axil = AxiLiteMaster(AxiLiteBus.from_prefix(dut, "s_axi_ctrl"), dut.clk, dut.rst)
    for log in (axil.write_if.log, axil.read_if.log):
        log.setLevel(logging.WARNING)
    rng = tb.rng
    if skew:
        axil.write_if.aw_channel.set_pause_generator(pauses(rng, 0.5))
        axil.write_if.w_channel.set_pause_generator(pauses(rng, 0.5))
        axil.read_if.ar_channel.set_pause_generator(pauses(rng, 0.3))
    if backpressure:
        axil.write_if.b_channel.set_pause_generator(pauses(rng, 0.6))
        axil.read_if.r_channel.set_pause_generator(pauses(rng, 0.6))
    await tb.reset()
    cocotb.start_soon(tb.hardware())

    async def worker(count):
        for _ in range(count):
            addr = tb.random_addr()
            offset = rng.randrange(WORD_BYTES)
            if rng.random() < 0.5:
                length = rng.randrange(1, WORD_BYTES - offset + 1)
                data = bytes(rng.getrandbits(8) for _ in range(length))
                await axil.write(addr + offset, data)
            else:
                await axil.read(addr + offset, rng.randrange(1, WORD_BYTES - offset + 1))

    workers = [cocotb.start_soon(worker(N // 4)) for _ in range(4)]
    for w in workers:  # a bank that loses a response fails here instead of hanging
        await with_timeout(w, 100 * N, "ns")
    # a set/clear race is a same-cycle coincidence: with some seeds N transfers meet none, so
    # up to 4 rounds more are issued until one is seen (finish() still requires it)
    for _ in range(4):
        if not tb.monitor.sets or tb.monitor.stats["races"]:
            break
        await with_timeout(cocotb.start_soon(worker(N // 4)), 100 * N, "ns")
    for _ in range(10):
        await RisingEdge(dut.clk)
    tb.finish()


@cocotb.test()
async def raw_random(dut):
    """Drive the five channels directly: independent random valid timing on AW and W, any
    wstrb, random bready/rready; the monitor checks everything."""
    tb = TB(dut, SEED * 4 + 7)
    rng = tb.rng
    sig = {name: getattr(dut, f"s_axi_ctrl_{name}") for name in (
        "awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready",
        "bready", "bvalid", "araddr", "arprot", "arvalid", "arready", "rready", "rvalid")}
    for name in ("awvalid", "wvalid", "arvalid", "bready", "rready", "awprot", "arprot"):
        sig[name].value = 0
    await tb.reset()
    cocotb.start_soon(tb.hardware())
    aws = deque(tb.random_addr() + rng.randrange(WORD_BYTES) for _ in range(N // 2))
    ws = deque((rng.getrandbits(32), rng.getrandbits(WORD_BYTES)) for _ in range(N // 2))
    ars = deque(tb.random_addr() + rng.randrange(WORD_BYTES) for _ in range(N // 2))
    writes = reads = 0
    for _ in range(20 * N):
        await FallingEdge(dut.clk)
        # sample handshakes of the coming edge, then drive the next cycle after it
        aw_hs = int(sig["awvalid"].value) and int(sig["awready"].value)
        w_hs = int(sig["wvalid"].value) and int(sig["wready"].value)
        ar_hs = int(sig["arvalid"].value) and int(sig["arready"].value)
        writes += int(sig["bvalid"].value) and int(sig["bready"].value)
        reads += int(sig["rvalid"].value) and int(sig["rready"].value)
        await RisingEdge(dut.clk)
        if aw_hs:
            aws.popleft()
        if w_hs:
            ws.popleft()
        if ar_hs:
            ars.popleft()
        # a valid, once raised, stays until its handshake (AXI); otherwise raise at random
        if not int(sig["awvalid"].value) or aw_hs:
            sig["awvalid"].value = int(bool(aws) and rng.random() < 0.3)
            if aws:
                sig["awaddr"].value = aws[0]
                sig["awprot"].value = rng.getrandbits(3)
        if not int(sig["wvalid"].value) or w_hs:
            sig["wvalid"].value = int(bool(ws) and rng.random() < 0.3)
            if ws:
                sig["wdata"].value, sig["wstrb"].value = ws[0]
        if not int(sig["arvalid"].value) or ar_hs:
            sig["arvalid"].value = int(bool(ars) and rng.random() < 0.4)
            if ars:
                sig["araddr"].value = ars[0]
                sig["arprot"].value = rng.getrandbits(3)
        sig["bready"].value = int(rng.random() < 0.4)
        sig["rready"].value = int(rng.random() < 0.4)
        if writes == N // 2 and reads == N // 2:
            break
    assert (writes, reads) == (N // 2, N // 2), f"stalled: {writes} writes, {reads} reads"
    for _ in range(5):
        await RisingEdge(dut.clk)
    assert tb.monitor.stats["w_before_aw"] > 0
    tb.finish()

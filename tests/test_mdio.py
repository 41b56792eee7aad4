# amaranth: UnusedElaboratable=no
"""The MDIO station (:class:`mcf.hdl.eth.mdio.MdioMaster`) under amaranth.sim against a
behavioural DP83867 written here from the IEEE 802.3 clause 22 frame and the data sheet's
extended-register window (REGCR/ADDAR): bit-exact reads and writes, MDC period and the MDIO
set-up/hold about its rising edge, back-to-back frames, a command while busy, an address nobody
answers (MDIO pulled high). Then the driver's PHY set-up (:func:`mcf.driver.eth.phy_setup_ops`)
through ``mcf_eth``'s register bank (:class:`mcf.hdl.eth.links.EthLinks`) on both RGMII links."""

import random

import pytest
from amaranth.sim import Simulator
from test_csr_bank import Axil

from mcf.abi import mdio as md
from mcf.abi.eth import ETH_LINK_RGMII, eth_regmap
from mcf.driver.eth import PhySetup, PhySetupError, phy_setup_ops
from mcf.golden.csr import OKAY
from mcf.hdl.eth.links import EthLinks
from mcf.hdl.eth.mdio import MdioMaster

CLK = 10e-9


class Dp83867:
    """A clause 22 target at MDIO address ``addr``, sampling MDIO on MDC's rising edges
    (:meth:`clock` returns what it drives after that edge: ``None`` released, or a bit).
    Registers: a few clause 22 ones, and the extended ones behind ``REGCR`` (bits 15:14
    function: 0 address, 1 data, 2 data with post-increment, 3 post-increment on writes;
    bits 4:0 DEVAD, 0x1F) and ``ADDAR``. ``frames``: every frame it decoded, any address."""

    def __init__(self, addr, ident=(0x2000, 0xA231)):
        self.addr = addr
        self.regs = {0x00: 0x1140, 0x01: 0x7949, 0x02: ident[0], 0x03: ident[1], 0x0D: 0,
                     0x0E: 0, 0x10: 0x9048}
        self.ext = {0x0031: 0x10B1, 0x0032: 0x00D0, 0x0086: 0x0000}  # delays strapped off
        self.ext_addr = 0
        self.frames = []
        self.ta_line = []           # the line in the first TA bit of each read (released: 1)
        self.ones, self.state, self.bits, self.out = 0, "idle", [], []

    def _read(self, reg):
        if reg == 0x0E:
            func = self.regs[0x0D] >> 14
            if func == 0:
                return self.ext_addr
            value = self.ext.get(self.ext_addr, 0)
            self.ext_addr += func == 2
            return value
        return self.regs.get(reg, 0)

    def _write(self, reg, value):
        if reg == 0x0E:
            func = self.regs[0x0D] >> 14
            if self.regs[0x0D] & 0x1F != 0x1F:
                return
            if func == 0:
                self.ext_addr = value
            else:
                self.ext[self.ext_addr] = value
                self.ext_addr += func in (2, 3)
        elif reg not in (0x02, 0x03):
            self.regs[reg] = value

    def clock(self, bit):
        if self.state == "idle":
            if bit:
                self.ones += 1
            elif self.ones >= 32:          # the 0 of ST after a preamble
                self.state, self.bits = "head", [0]
            if not bit:
                self.ones = 0
            return None
        if self.state == "head":
            self.bits.append(bit)
            if len(self.bits) < 14:
                return None
            word = int("".join(map(str, self.bits)), 2)
            st, op, phy, reg = word >> 12, word >> 10 & 3, word >> 5 & 31, word & 31
            assert st == 0b01 and op in (0b01, 0b10), f"bad frame header {word:014b}"
            self.head, self.bits, self.mine = (op, phy, reg), [], phy == self.addr
            self.state = "tail"
            if op == 0b10:
                data = self._read(reg) if self.mine else None
                self.frames.append(("read", phy, reg, data))
                self.out = ([0, *(data >> (15 - k) & 1 for k in range(16)), None]
                            if self.mine else [None] * 18)
            return None
        # tail: TA and 16 data bits
        self.bits.append(bit)
        op, phy, reg = self.head
        k = len(self.bits)
        if op == 0b10:
            if k == 1:
                self.ta_line.append(bit)
            drive = self.out[k - 1]
        else:
            drive = None
        if k == 18:
            self.state = "idle"
            if op == 0b01:
                assert self.bits[:2] == [1, 0], "write TA is not 10"
                data = int("".join(map(str, self.bits[2:])), 2)
                self.frames.append(("write", phy, reg, data))
                if self.mine:
                    self._write(reg, data)
        return drive


def mdio_wire(mdc, mdio_o, mdio_oe, mdio_i, targets, log):
    """A testbench joining the station's pins and ``targets`` on one pulled-up MDIO line,
    clocking the targets on MDC's rising edges; ``log`` gets ``("rise"|"fall"|"change",
    cycle)`` and any bus contention. ``mdio_oe`` is a function of ``ctx``."""
    async def wire(ctx):
        prev_mdc, prev_drv, drives, cycle = 0, None, [None] * len(targets), 0
        while True:
            await ctx.tick()
            cycle += 1
            clk, oe = ctx.get(mdc), mdio_oe(ctx)
            mine = ctx.get(mdio_o) if oe else None
            driven = [d for d in drives if d is not None]
            if oe and driven or len(driven) > 1:
                log.append(("contention", cycle))
            line = mine if oe else min(driven, default=1)
            if clk and not prev_mdc:
                log.append(("rise", cycle))
                drives = [t.clock(line) for t in targets]
            elif prev_mdc and not clk:
                log.append(("fall", cycle))
            if (oe, mine) != prev_drv:
                log.append(("change", cycle))
                prev_drv = (oe, mine)
            prev_mdc = clk
            driven = [d for d in drives if d is not None]
            ctx.set(mdio_i, mine if oe else min(driven, default=1))
    return wire


def sim_master(dut, targets, bench, log):
    sim = Simulator(dut)
    sim.add_clock(CLK)
    sim.add_testbench(bench)
    sim.add_testbench(mdio_wire(dut.mdc, dut.mdio_o, lambda ctx: ctx.get(dut.mdio_oe),
                                dut.mdio_i, targets, log), background=True)
    sim.run()


async def transact(ctx, dut, read, phy, reg, data=0):
    """One command; returns (rdata, no_answer, cycles from start to busy low)."""
    ctx.set(dut.read, read)
    ctx.set(dut.phy, phy)
    ctx.set(dut.reg, reg)
    ctx.set(dut.wdata, data)
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    assert ctx.get(dut.busy) and not ctx.get(dut.done)
    cycles = 1
    while ctx.get(dut.busy):
        await ctx.tick()
        cycles += 1
        assert cycles <= 64 * 2 * dut.half_period + 1, "frame longer than 64 MDC periods"
    assert ctx.get(dut.done)
    return ctx.get(dut.rdata), ctx.get(dut.no_answer), cycles


def test_frame_word():
    # write 0x1234 to register 0x0D of PHY 2 / read register 3 of PHY 3, spelled out bit by bit
    w = "1" * 32 + "01" + "01" + "00010" + "01101" + "10" + f"{0x1234:016b}"
    r = "1" * 32 + "01" + "10" + "00011" + "00011" + "00" + "0" * 16
    assert md.frame_word(False, 2, 0x0D, 0x1234) == int(w, 2)
    assert md.frame_word(True, 3, 3) == int(r, 2)
    assert md.MDC_HALF_PERIOD == 60 and md.mdc_half_period(100e6) == 20
    assert md.rgmiidctl(2.0, 2.0) == 0x77 and md.rgmiidctl(2.75, 2.25) == 0xA8
    with pytest.raises(ValueError):
        md.delay_code(2.1)


def test_read_write_bit_exact_and_mdc_timing():
    """At the design's divider (60: MDC 2.5 MHz at 300 MHz): a write lands bit-exact, a read
    returns the register, MDC's period is 120 aclk cycles with 60 high, MDIO changes only
    with MDC's falling edge (or as a frame starts), a frame lasts 64 MDC periods."""
    dut = MdioMaster()
    h = dut.half_period
    phy = Dp83867(2)
    log = []
    got = {}

    async def bench(ctx):
        await ctx.tick().repeat(3)
        got["w"] = await transact(ctx, dut, 0, 2, 0x10, 0xBEEF)
        got["r"] = await transact(ctx, dut, 1, 2, 0x10)
        got["id"] = await transact(ctx, dut, 1, 2, 0x03)
        got["count"] = [ctx.get(s) for s in (dut.reads, dut.writes, dut.no_answers,
                                             dut.cmd_busy)]

    sim_master(dut, [phy], bench, log)
    assert got["w"][2] == got["r"][2] == 64 * 2 * h + 1
    assert got["r"][:2] == (0xBEEF, 0) and got["id"][:2] == (0xA231, 0)
    assert phy.regs[0x10] == 0xBEEF
    assert phy.frames == [("write", 2, 0x10, 0xBEEF), ("read", 2, 0x10, 0xBEEF),
                          ("read", 2, 0x03, 0xA231)]
    assert phy.ta_line == [1, 1]
    assert got["count"] == [2, 1, 0, 0]
    assert not [e for e in log if e[0] == "contention"]
    rises = [c for k, c in log if k == "rise"]
    falls = [c for k, c in log if k == "fall"]
    assert len(rises) == 3 * 64
    for frame in range(3):
        r = rises[64 * frame:64 * frame + 64]
        assert {b - a for a, b in zip(r, r[1:])} == {2 * h}
    assert {f - r for r, f in zip(rises, falls)} == {h}
    # every change of the station's driver lies at least h cycles from the nearest rising edge
    for _, c in (e for e in log if e[0] == "change"):
        assert min(abs(c - r) for r in rises) >= h


def test_back_to_back_random_and_busy_commands():
    """40 frames (fixed seed) each started the cycle the previous one ended, two PHYs on the
    bus; commands during a frame are ignored and counted."""
    dut = MdioMaster(half_period=4)
    phys = [Dp83867(2), Dp83867(3, ident=(0x0141, 0x0DD1))]
    rng = random.Random(36)
    plan = [(rng.random() < 0.5, rng.choice((2, 3)), rng.choice((0x00, 0x10, 0x04, 0x09)),
             rng.randrange(1 << 16)) for _ in range(40)]
    log, results = [], []

    async def bench(ctx):
        ignored = 0
        for i, (read, phy, reg, data) in enumerate(plan):
            results.append(await transact(ctx, dut, read, phy, reg, data))
            if i == 5:                     # a command while busy: ignored, counted
                ctx.set(dut.start, 1)
                ctx.set(dut.read, 1)
                await ctx.tick()
                await ctx.tick()
                ctx.set(dut.start, 0)
                ignored += 1
                while ctx.get(dut.busy):
                    await ctx.tick()
                results.append("extra")
        results.append([ctx.get(s) for s in (dut.reads, dut.writes, dut.cmd_busy)])

    sim_master(dut, phys, bench, log)
    # a model of the same register files decides every read
    regs = {2: dict(Dp83867(2).regs), 3: dict(Dp83867(3, ident=(0x0141, 0x0DD1)).regs)}
    reads = writes = 0
    k = 0
    for read, phy, reg, data in plan:
        rdata, no_answer, cycles = results[k]
        k += 1
        assert cycles == 64 * 8 + 1 and no_answer == 0
        if read:
            reads += 1
            assert rdata == regs[phy].get(reg, 0)
        else:
            writes += 1
            regs[phy][reg] = data
        if results[k] == "extra":
            k += 1
            reads += 1                     # the frame the extra command started (a read)
    assert results[k] == [reads, writes, 1]
    for p in phys:
        assert {r: p.regs[r] for r in regs[p.addr]} == regs[p.addr]
    assert not [e for e in log if e[0] == "contention"]


def test_address_nobody_answers():
    """A read from an absent PHY ends on time with 0xFFFF and ``no_answer`` (counted); a write
    to it ends too; the next read from the present PHY is clean again."""
    dut = MdioMaster(half_period=4)
    phy = Dp83867(2)
    log, got = [], {}

    async def bench(ctx):
        got["absent"] = await transact(ctx, dut, 1, 7, 0x02)
        got["write"] = await transact(ctx, dut, 0, 7, 0x00, 0x8000)
        got["present"] = await transact(ctx, dut, 1, 2, 0x02)
        got["count"] = ctx.get(dut.no_answers)

    sim_master(dut, [phy], bench, log)
    assert got["absent"] == (md.NO_PHY, 1, 64 * 8 + 1)
    assert got["write"][1:] == (0, 64 * 8 + 1)
    assert got["present"] == (0x2000, 0, 64 * 8 + 1)
    assert got["count"] == 1
    assert phy.regs[0x00] == 0x1140            # the write to address 7 did not land at 2


# ---- the driver's PHY set-up through mcf_eth's registers --------------------------------------

async def run_async(gens, axil, rm, counts):
    """Run generators of :func:`phy_setup_ops`'s kind over AXI-Lite (the bank of ``EthLinks``),
    interleaved one operation each in turn (so both stations run at once); their results in
    order. An exception a generator raises propagates."""
    ops = [next(g) for g in gens]
    results = [None] * len(gens)
    live = set(range(len(gens)))
    while live:
        for i in sorted(live):
            op = ops[i]
            counts[op[0]] = counts.get(op[0], 0) + 1
            if op[0] == "read":
                resp, word = await axil.read(rm.addr(op[1]))
                assert resp == OKAY
            else:
                word = None
                assert await axil.write(rm.addr(op[1]), rm.register(op[1]).pack(**op[2])) == OKAY
            try:
                ops[i] = gens[i].send(word)
            except StopIteration as stop:
                results[i] = stop.value
                live.discard(i)
    return results


def run_links(targets, bench):
    """``EthLinks`` (MDC every 4 aclk cycles, for speed) with ``targets[l]`` on link l's
    MDIO."""
    dut = EthLinks(mdc_half_period=2)
    log = []
    sim = Simulator(dut)
    sim.add_clock(CLK)
    sim.add_testbench(bench(dut))
    for lk in ETH_LINK_RGMII:
        sim.add_testbench(mdio_wire(
            getattr(dut, f"rgmii{lk}_mdc"), getattr(dut, f"rgmii{lk}_mdio_o"),
            lambda ctx, lk=lk: 1 - ctx.get(getattr(dut, f"rgmii{lk}_mdio_t")),
            getattr(dut, f"rgmii{lk}_mdio_i"), targets.get(lk, []), log), background=True)
    sim.run()
    assert not [e for e in log if e[0] == "contention"]


def test_phy_setup_both_links():
    phys = {lk: [Dp83867(addr)] for lk, addr in zip(ETH_LINK_RGMII, md.PHY_ADDRS)}
    rm = eth_regmap()
    out, counts = {}, {}

    def bench(dut):
        async def b(ctx):
            axil = Axil(ctx, dut.s_axi_eth)
            gens = [phy_setup_ops(lk, addr, regmap=rm)
                    for lk, addr in zip(ETH_LINK_RGMII, md.PHY_ADDRS)]
            for lk, res in zip(ETH_LINK_RGMII, await run_async(gens, axil, rm, counts)):
                out[lk] = res
            out["words"] = {n: (await axil.read(rm.addr(n)))[1] for n in (
                "eth1_mdio_reads", "eth1_mdio_writes", "eth1_mdio_no_answer",
                "eth2_mdio_cmd_busy", "ETH1_MDIO")}
        return b

    run_links(phys, bench)
    for lk, addr in zip(ETH_LINK_RGMII, md.PHY_ADDRS):
        p = phys[lk][0]
        assert out[lk] == PhySetup(link=lk, phy=addr, phy_id=0x2000A231, cfg4=0x1031,
                                   rgmiictl=0x00D3, rgmiidctl=0x0077, phycr=0x5048,
                                   tx_delay_ns=2.0, rx_delay_ns=2.0)
        assert p.ext == {0x0031: 0x1031, 0x0032: 0x00D3, 0x0086: 0x0077}
        assert {f[1] for f in p.frames} == {addr}          # each PHY on its own pins
    # reads: 2 (ID) + 2 (CFG4, RGMIICTL) + 1 (PHYCR) + 4 (read-backs); writes: 3 per extended
    # read (2 + 3 read-backs), 4 per extended write (3), 1 (PHYCR)
    n_reads, n_writes = 2 + 2 + 1 + 4, 3 * (2 + 3) + 4 * 3 + 1
    w = out["words"]
    assert (w["eth1_mdio_reads"], w["eth1_mdio_writes"]) == (n_reads, n_writes)
    assert w["eth1_mdio_no_answer"] == 0 and w["eth2_mdio_cmd_busy"] == 0
    st = rm.register("ETH1_MDIO").unpack(w["ETH1_MDIO"])
    assert st == {"rdata": 0x5048, "busy": 0, "done": 1, "no_answer": 0}
    assert counts["write"] == 2 * (n_reads + n_writes)


@pytest.mark.parametrize("case", ["foreign", "absent"])
def test_phy_setup_refuses(case):
    phys = {1: [Dp83867(2, ident=(0x0141, 0x0DD1))] if case == "foreign" else []}
    rm = eth_regmap()
    err = {}

    def bench(dut):
        async def b(ctx):
            axil = Axil(ctx, dut.s_axi_eth)
            with pytest.raises(PhySetupError) as e:
                await run_async([phy_setup_ops(1, 2, regmap=rm)], axil, rm, {})
            err["msg"] = str(e.value)
            err["no_answer"] = (await axil.read(rm.addr("eth1_mdio_no_answer")))[1]
        return b

    run_links(phys, bench)
    if case == "foreign":
        assert err["msg"] == ("link 1: the PHY at MDIO address 2 has ID 0x0141:0x0dd1, not a "
                              "DP83867 (0x2000:0xa231)")
        assert err["no_answer"] == 0
    else:
        assert err["msg"] == ("link 1: no PHY answers at MDIO address 2 (read 0x02 gave "
                              "0xffff)")
        assert err["no_answer"] == 1

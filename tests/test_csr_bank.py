# amaranth: UnusedElaboratable=no
"""mcf.hdl.csr.CsrBank under amaranth.sim: every access kind, wstrb, RW1C races, reset values,
bad addresses, AW/W ordering, B/R backpressure, latency — checked against mcf.golden.csr."""

import random

import pytest
from amaranth.lib import wiring
from amaranth.sim import Simulator

from mcf.abi.csrmap import node_regmap
from mcf.abi.regs import WORD_BYTES, Access
from mcf.golden.csr import OKAY, SLVERR, CsrModel, byte_mask
from mcf.hdl.csr import AxiLiteSignature, AxiResp, CsrBank
from mcf.hdl.csr.bank import DEFAULT_ADDR_WIDTH
from mcf.sim.tb import kinds_regmap

READ_LATENCY = 1   # rvalid high in the cycle after the AR handshake
WRITE_LATENCY = 2  # bvalid high 2 cycles after the later of the AW/W handshakes


class Axil:
    """A blocking AXI-Lite manager for amaranth.sim testbenches, with AW/W skew and B/R
    backpressure; it checks that bvalid/rvalid and their payloads hold while not ready."""

    def __init__(self, ctx, bus):
        self.ctx, self.bus = ctx, bus
        self.latency = None

    async def write(self, addr, data, strb=0xF, aw_delay=0, w_delay=0, b_delay=0):
        ctx, bus = self.ctx, self.bus
        cycle, aw_done, w_done = 0, False, False
        ctx.set(bus.awaddr, addr)
        ctx.set(bus.wdata, data)
        ctx.set(bus.wstrb, strb)
        ctx.set(bus.bready, 0)
        while not (aw_done and w_done):
            ctx.set(bus.awvalid, not aw_done and cycle >= aw_delay)
            ctx.set(bus.wvalid, not w_done and cycle >= w_delay)
            aw_hs = ctx.get(bus.awvalid) and ctx.get(bus.awready)
            w_hs = ctx.get(bus.wvalid) and ctx.get(bus.wready)
            await ctx.tick()
            cycle += 1
            aw_done |= bool(aw_hs)
            w_done |= bool(w_hs)
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        await self._response(bus.bvalid, "write")
        resp = ctx.get(bus.bresp)
        for _ in range(b_delay):
            await ctx.tick()
            assert ctx.get(bus.bvalid) and ctx.get(bus.bresp) == resp
        ctx.set(bus.bready, 1)
        await ctx.tick()
        ctx.set(bus.bready, 0)
        assert not ctx.get(bus.bvalid)
        return AxiResp(resp).value

    async def _response(self, valid, what: str) -> None:
        """Wait for ``valid`` (at most 20 cycles); ``latency``: the cycles it took."""
        waited = 1
        while not self.ctx.get(valid):
            await self.ctx.tick()
            waited += 1
            assert waited < 20, f"no {what} response"
        self.latency = waited

    async def read(self, addr, r_delay=0):
        ctx, bus = self.ctx, self.bus
        ctx.set(bus.araddr, addr)
        ctx.set(bus.rready, 0)
        ctx.set(bus.arvalid, 1)
        while not ctx.get(bus.arready):
            await ctx.tick()
        await ctx.tick()
        ctx.set(bus.arvalid, 0)
        await self._response(bus.rvalid, "read")
        resp, data = ctx.get(bus.rresp), ctx.get(bus.rdata)
        for _ in range(r_delay):
            await ctx.tick()
            assert ctx.get(bus.rvalid)
            assert (ctx.get(bus.rresp), ctx.get(bus.rdata)) == (resp, data)
        ctx.set(bus.rready, 1)
        await ctx.tick()
        ctx.set(bus.rready, 0)
        assert not ctx.get(bus.rvalid)
        return AxiResp(resp).value, data


def run(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def _write_then_read(ctx, bus, addr, wdata=None):
    """AW and W at ``addr`` (all byte strobes; ``wdata`` if given) for one cycle, then AR at
    ``addr`` on the write's commit edge (responses not taken)."""
    ctx.set(bus.awaddr, addr)
    if wdata is not None:
        ctx.set(bus.wdata, wdata)
    ctx.set(bus.wstrb, 0xF)
    ctx.set(bus.awvalid, 1)
    ctx.set(bus.wvalid, 1)
    await ctx.tick()
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    ctx.set(bus.araddr, addr)
    ctx.set(bus.arvalid, 1)
    await ctx.tick()


def addr_of(regmap, name):
    return regmap.addr(name)


def check_outputs(ctx, dut, model):
    """Every RW/W/RW1C output equals the model's storage."""
    for (reg, fld), value in model.storage.items():
        slot = model.slots[(reg, fld)]
        port = dut.port(reg, fld)
        got = ctx.get(port if slot.field.access is Access.RW else port.value)
        assert got == value, f"{reg}.{fld}: {got:#x} != {value:#x}"


def drive_inputs(ctx, dut, model):
    for (reg, fld), value in model.inputs.items():
        ctx.set(dut.port(reg, fld), value)


# --- signature and ports ------------------------------------------------------------------

def test_axil_signature_names_and_flows():
    sig = AxiLiteSignature(12)
    out = {"awaddr", "awprot", "awvalid", "wdata", "wstrb", "wvalid", "bready", "araddr",
           "arprot", "arvalid", "rready"}
    assert list(sig.members) == [
        "awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready", "bresp",
        "bvalid", "bready", "araddr", "arprot", "arvalid", "arready", "rdata", "rresp", "rvalid",
        "rready"]
    for name, member in sig.members.items():
        assert member.flow == (wiring.Out if name in out else wiring.In), name
    assert sig.members["awaddr"].shape == 12
    assert sig.members["wstrb"].shape == 4
    assert AxiLiteSignature(12, 64).members["wstrb"].shape == 8
    assert sig == AxiLiteSignature(12) and sig != AxiLiteSignature(13)
    with pytest.raises(ValueError):
        AxiLiteSignature(12, 16)
    assert (AxiResp.OKAY.value, AxiResp.SLVERR.value) == (OKAY, SLVERR) == (0, 2)


def test_bank_ports_follow_the_map():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    assert dut.addr_width == DEFAULT_ADDR_WIDTH
    assert dut.signature.members["s_axi_ctrl"] == In_axil(DEFAULT_ADDR_WIDTH)
    regs = dut.signature.members["regs"].signature.members
    assert "ID" not in regs and "BUS_ERRORS" not in regs
    assert list(regs) == [r.name for _, r in regmap][2:]
    status = regs["STATUS"].signature.members
    assert status["busy"].flow == wiring.In and status["busy"].shape == 1
    assert status["err"].signature.members["set"].flow == wiring.In
    assert status["err"].signature.members["value"].flow == wiring.Out
    cmd = regs["CMD"].signature.members
    assert list(cmd["arg"].signature.members) == ["value", "stb"]
    assert regs["CTRL"].signature.members["limit"].flow == wiring.Out
    assert dut.port("SCRATCH") is dut.regs.SCRATCH.SCRATCH
    with pytest.raises(ValueError, match="cannot reach"):
        CsrBank(regmap, addr_width=5)
    small = CsrBank(regmap, addr_width=6)
    assert small.addr_width == 6
    small._MustUse__silence = dut._MustUse__silence = True  # built only to inspect ports


def In_axil(width):  # noqa: N802 - mirrors wiring.In
    return wiring.In(AxiLiteSignature(width))


# --- access kinds -------------------------------------------------------------------------

def test_reset_values_and_id():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    model = CsrModel(regmap)

    async def bench(ctx):
        check_outputs(ctx, dut, model)
        axil = Axil(ctx, dut.s_axi_ctrl)
        for addr, reg in regmap:
            assert await axil.read(addr) == (OKAY, model.word(reg)), reg.name
        assert (await axil.read(0))[1] == regmap.id_word
        for name in ("CTRL", "SCRATCH", "STATUS", "IRQ", "MIX"):  # R inputs are 0
            assert (await axil.read(regmap.addr(name)))[1] == regmap.register(name).reset
        assert ctx.get(dut.port("CMD", "arg").value) == 0x11
        assert ctx.get(dut.port("CMD", "arg").stb) == 0

    run(dut, bench)


def test_rw_and_partial_strobes():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    model = CsrModel(regmap)
    rng = random.Random(7)

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        for name in ("SCRATCH", "CTRL", "MIX"):
            addr = regmap.addr(name)
            for strb in range(16):
                data = rng.getrandbits(32)
                assert await axil.write(addr, data, strb) == model.write(addr, data, strb)
                check_outputs(ctx, dut, model)
                assert await axil.read(addr) == model.read(addr)
        # a strobe of 0 changes nothing; byte-lane address bits are ignored
        before = model.word(regmap.register("SCRATCH"))
        await axil.write(regmap.addr("SCRATCH") + 3, 0, 0)
        assert (await axil.read(regmap.addr("SCRATCH") + 2))[1] == before
        await axil.write(regmap.addr("SCRATCH") + 1, 0xA5A5_0000, 0b1100)
        assert (await axil.read(regmap.addr("SCRATCH")))[1] == (before & 0xFFFF) | 0xA5A5_0000

    run(dut, bench)


def test_write_only_fields_strobe_once():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    addr = regmap.addr("CMD")
    go, arg, tag = (dut.port("CMD", f) for f in ("go", "arg", "tag"))

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        strobes = []

        async def write_and_watch(data, strb):
            ctx.set(dut.s_axi_ctrl.awaddr, addr)
            ctx.set(dut.s_axi_ctrl.wdata, data)
            ctx.set(dut.s_axi_ctrl.wstrb, strb)
            ctx.set(dut.s_axi_ctrl.awvalid, 1)
            ctx.set(dut.s_axi_ctrl.wvalid, 1)
            await ctx.tick()
            ctx.set(dut.s_axi_ctrl.awvalid, 0)
            ctx.set(dut.s_axi_ctrl.wvalid, 0)
            seen = []
            for _ in range(4):
                seen.append((ctx.get(go.stb), ctx.get(arg.stb), ctx.get(tag.stb),
                             ctx.get(dut.s_axi_ctrl.bvalid)))
                if ctx.get(dut.s_axi_ctrl.bvalid):
                    ctx.set(dut.s_axi_ctrl.bready, 1)
                await ctx.tick()
                ctx.set(dut.s_axi_ctrl.bready, 0)
            strobes.append(seen)

        await write_and_watch(0x00AB_0003, 0b0111)  # go=1, arg=1, tag=0xAB
        # the strobes rise with bvalid, for exactly one cycle
        assert strobes[-1] == [(0, 0, 0, 0), (1, 1, 1, 1), (0, 0, 0, 0), (0, 0, 0, 0)]
        assert (ctx.get(go.value), ctx.get(arg.value), ctx.get(tag.value)) == (1, 1, 0xAB)
        await write_and_watch(0x0077_FFFF, 0b0100)  # only lane 2: tag
        assert strobes[-1][1] == (0, 0, 1, 1)
        assert (ctx.get(go.value), ctx.get(arg.value), ctx.get(tag.value)) == (1, 1, 0x77)
        await write_and_watch(0xFFFF_FF00, 0b0010)  # lane 1 only: arg bits 14:7
        assert strobes[-1][1] == (0, 1, 0, 1)
        assert ctx.get(arg.value) == (0xFF00 >> 1) | 1
        assert await axil.read(addr) == (OKAY, 0)  # write-only fields read 0

    run(dut, bench)


def test_read_only_fields_follow_hardware_and_ignore_writes():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        for value in (0, 0xFFFF_FFFF, 0x1357_9BDF):
            ctx.set(dut.port("COUNT"), value)
            assert await axil.read(regmap.addr("COUNT")) == (OKAY, value)
        assert await axil.write(regmap.addr("COUNT"), 0, 0xF) == OKAY
        assert (await axil.read(regmap.addr("COUNT")))[1] == 0x1357_9BDF
        assert await axil.write(0, 0, 0xF) == OKAY  # ID is constant
        assert await axil.read(0) == (OKAY, regmap.id_word)
        ctx.set(dut.port("STATUS", "busy"), 1)
        ctx.set(dut.port("STATUS", "level"), 0x3FF)
        word = (await axil.read(regmap.addr("STATUS")))[1]
        assert word & 0x7FF == 0x7FF and word >> 16 == 0x8001

    run(dut, bench)


def test_rw1c_sticky_set_and_clear():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    addr = regmap.addr("IRQ")
    irq = dut.port("IRQ")

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        ctx.set(irq.set, 0x8000_0011)
        await ctx.tick()
        ctx.set(irq.set, 0)
        await ctx.tick()
        assert ctx.get(irq.value) == 0x8000_0011  # sticky after the pulse
        ctx.set(irq.set, 0x100)
        await ctx.tick()
        ctx.set(irq.set, 0)
        assert await axil.read(addr) == (OKAY, 0x8000_0111)
        await axil.write(addr, 0x0, 0xF)                 # writing 0 clears nothing
        assert ctx.get(irq.value) == 0x8000_0111
        await axil.write(addr, 0xFFFF_FFFF, 0b0001)      # only lane 0: clears bits 0 and 4
        assert ctx.get(irq.value) == 0x8000_0100
        await axil.write(addr, 0x8000_0100, 0xF)
        assert await axil.read(addr) == (OKAY, 0)
        # reset value of a RW1C field is honoured and clearable
        st = regmap.addr("STATUS")
        assert ctx.get(dut.port("STATUS", "flags").value) == 0x8001
        await axil.write(st, 0x0001_0000, 0xF)
        assert ctx.get(dut.port("STATUS", "flags").value) == 0x8000

    run(dut, bench)


@pytest.mark.parametrize("aw_first", [True, False])
def test_rw1c_set_wins_over_clear_at_the_same_edge(aw_first):
    """Hardware sets bit 3 at the very edge a write of 1 clears bits 3 and 5: bit 3 stays
    set (no event is lost), bit 5 clears."""
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    irq, bus = dut.port("IRQ"), dut.s_axi_ctrl

    async def bench(ctx):
        ctx.set(irq.set, 0b10_1000)
        await ctx.tick()
        ctx.set(irq.set, 0)
        assert ctx.get(irq.value) == 0b10_1000
        ctx.set(bus.awaddr, regmap.addr("IRQ"))
        ctx.set(bus.wdata, 0b10_1000)
        ctx.set(bus.wstrb, 0xF)
        first, second = (bus.awvalid, bus.wvalid) if aw_first else (bus.wvalid, bus.awvalid)
        ctx.set(first, 1)
        await ctx.tick()
        ctx.set(first, 0)
        ctx.set(second, 1)
        await ctx.tick()                     # both slots full after this edge
        ctx.set(second, 0)
        assert not ctx.get(bus.bvalid)
        ctx.set(irq.set, 0b00_1000)          # set during the commit cycle
        await ctx.tick()                     # the commit edge: clear and set together
        ctx.set(irq.set, 0)
        assert ctx.get(bus.bvalid)           # proves this was the commit edge
        assert ctx.get(irq.value) == 0b00_1000
        model = CsrModel(regmap)
        model.hw_set("IRQ", "IRQ", 0b10_1000)
        model.edge(write=(regmap.addr("IRQ"), 0b10_1000, 0xF), sets={("IRQ", "IRQ"): 0b1000})
        assert model.storage[("IRQ", "IRQ")] == 0b00_1000

    run(dut, bench)


# --- errors, ordering, backpressure, latency ----------------------------------------------

def test_unmapped_addresses_answer_slverr_and_count():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    model = CsrModel(regmap)
    errors = regmap.addr("BUS_ERRORS")
    past = len(regmap) * WORD_BYTES
    last = (1 << dut.addr_width) - 1

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        for addr in (past, past + 1, regmap.size, last & ~3, last):
            assert await axil.read(addr) == model.read(addr) == (SLVERR, 0)
            assert await axil.write(addr, 0xFFFF_FFFF, 0xF) == model.write(addr, 0, 0xF) \
                == SLVERR
        assert await axil.read(errors) == (OKAY, 10) == model.read(errors)
        assert await axil.write(errors, 0, 0xF) == OKAY  # read-only: not clearable
        assert (await axil.read(errors))[1] == 10
        check_outputs(ctx, dut, model)  # unmapped writes touched nothing

    run(dut, bench)


def test_bus_errors_wraps_and_counts_concurrent_errors():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    bus = dut.s_axi_ctrl
    bad = len(regmap) * WORD_BYTES

    async def bench(ctx):
        # a read and a write failing at the same edge count 2
        await _write_then_read(ctx, bus, bad)   # AR handshake at the write's commit edge
        ctx.set(bus.arvalid, 0)
        assert ctx.get(bus.bvalid) and ctx.get(bus.rvalid)
        assert ctx.get(bus.bresp) == ctx.get(bus.rresp) == AxiResp.SLVERR.value
        ctx.set(bus.bready, 1)
        ctx.set(bus.rready, 1)
        await ctx.tick()
        ctx.set(bus.bready, 0)
        ctx.set(bus.rready, 0)
        axil = Axil(ctx, bus)
        assert await axil.read(regmap.addr("BUS_ERRORS")) == (OKAY, 2)

    run(dut, bench)


@pytest.mark.parametrize("aw_delay,w_delay", [(0, 0), (0, 5), (5, 0), (1, 9), (9, 1)])
def test_aw_w_any_order_and_latency(aw_delay, w_delay):
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    addr = regmap.addr("SCRATCH")

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        assert await axil.write(addr, 0xCAFE_F00D, 0xF, aw_delay, w_delay) == OKAY
        assert axil.latency == WRITE_LATENCY
        assert await axil.read(addr) == (OKAY, 0xCAFE_F00D)
        assert axil.latency == READ_LATENCY

    run(dut, bench)


async def present(ctx, bus, aws, ws, max_cycles=30, aw_start=0, w_start=0):
    """Offer queued AW addresses and W (data, strb) beats, each until accepted, AW from cycle
    ``aw_start`` and W from ``w_start``, with bready high; return when all were accepted."""
    aws, ws = list(aws), list(ws)
    ctx.set(bus.bready, 1)
    for cycle in range(max_cycles):
        if not aws and not ws:
            break
        ctx.set(bus.awvalid, bool(aws) and cycle >= aw_start)
        if aws:
            ctx.set(bus.awaddr, aws[0])
        ctx.set(bus.wvalid, bool(ws) and cycle >= w_start)
        if ws:
            ctx.set(bus.wdata, ws[0][0])
            ctx.set(bus.wstrb, ws[0][1])
        aw_hs = ctx.get(bus.awvalid) and ctx.get(bus.awready)
        w_hs = ctx.get(bus.wvalid) and ctx.get(bus.wready)
        await ctx.tick()
        if aw_hs:
            aws.pop(0)
        if w_hs:
            ws.pop(0)
    ctx.set(bus.awvalid, 0)
    ctx.set(bus.wvalid, 0)
    assert not aws and not ws, "beats not accepted"
    return cycle


def test_w_before_aw_keeps_data_and_blocks_second_w():
    """W arrives long before AW: it is held, the next W waits (wready low) and both writes
    land in order with their own data."""
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    bus = dut.s_axi_ctrl
    scratch, ctrl = regmap.addr("SCRATCH"), regmap.addr("CTRL")

    async def bench(ctx):
        await present(ctx, bus, [], [(0x1111_1111, 0xF)])
        ctx.set(bus.wdata, 0x0000_0022)
        ctx.set(bus.wvalid, 1)
        for _ in range(6):
            assert not ctx.get(bus.wready)   # the second W waits for the first's AW
            await ctx.tick()
        assert not ctx.get(bus.bvalid)
        await present(ctx, bus, [scratch, ctrl], [(0x0000_0022, 0xF)])
        for _ in range(4):
            await ctx.tick()
        assert ctx.get(dut.port("SCRATCH")) == 0x1111_1111
        assert ctx.get(dut.port("CTRL", "enable")) == 0
        assert ctx.get(dut.port("CTRL", "mode")) == 1
        assert ctx.get(dut.port("CTRL", "limit")) == 2

    run(dut, bench)


def test_many_writes_back_to_back_no_deadlock():
    """AW and W streams offered continuously with different skews all complete in order."""
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    addr = regmap.addr("SCRATCH")

    async def bench(ctx):
        for aw_start, w_start in ((0, 0), (0, 3), (3, 0), (1, 0), (0, 1)):
            for i in range(8):
                ctx.set(dut.port("IRQ").set, 1 << i)  # one event per cycle, none lost
                await ctx.tick()
            ctx.set(dut.port("IRQ").set, 0)
            cycles = await present(ctx, dut.s_axi_ctrl, [addr] * 8,
                                   [(0x100 + i, 0xF) for i in range(8)],
                                   max_cycles=40, aw_start=aw_start, w_start=w_start)
            if aw_start == w_start == 0:
                assert cycles == 2 * 8 - 1  # one write every 2 cycles with bready high
            for _ in range(3):
                await ctx.tick()
            assert ctx.get(dut.port("SCRATCH")) == 0x107
            assert ctx.get(dut.port("IRQ").value) == 0xFF

    run(dut, bench)


@pytest.mark.parametrize("delay", [1, 7])
def test_responses_hold_under_backpressure(delay):
    regmap = kinds_regmap()
    dut = CsrBank(regmap)

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        # Axil asserts bvalid/bresp and rvalid/rdata/rresp stay stable for `delay` cycles
        assert await axil.write(regmap.addr("SCRATCH"), 0x600D_F00D, 0xF, b_delay=delay) == OKAY
        assert await axil.write(4096 - 4, 0, 0xF, b_delay=delay) == SLVERR
        assert await axil.read(regmap.addr("SCRATCH"), r_delay=delay) == (OKAY, 0x600D_F00D)
        ctx.set(dut.port("COUNT"), 5)
        # the read sampled COUNT at its AR edge; changing it while R is stalled changes nothing
        ctx.set(dut.s_axi_ctrl.araddr, regmap.addr("COUNT"))
        ctx.set(dut.s_axi_ctrl.arvalid, 1)
        await ctx.tick()
        ctx.set(dut.s_axi_ctrl.arvalid, 0)
        ctx.set(dut.port("COUNT"), 6)
        for _ in range(delay):
            assert not ctx.get(dut.s_axi_ctrl.arready)
            await ctx.tick()
            assert ctx.get(dut.s_axi_ctrl.rdata) == 5
        ctx.set(dut.s_axi_ctrl.rready, 1)
        await ctx.tick()
        ctx.set(dut.s_axi_ctrl.rready, 0)
        assert await axil.read(4096 - 4, r_delay=delay) == (SLVERR, 0)
        # the next AR offered while R is stalled waits; the stalled response does not change
        bus = dut.s_axi_ctrl
        ctx.set(bus.araddr, regmap.addr("SCRATCH"))
        ctx.set(bus.arvalid, 1)
        await ctx.tick()
        ctx.set(bus.araddr, regmap.addr("COUNT"))
        for _ in range(delay):
            assert not ctx.get(bus.arready)
            await ctx.tick()
            assert ctx.get(bus.rvalid) and ctx.get(bus.rdata) == 0x600D_F00D
        ctx.set(bus.rready, 1)
        await ctx.tick()                     # R accepted; the COUNT read is not yet taken
        assert not ctx.get(bus.rvalid) and ctx.get(bus.arready)
        await ctx.tick()                     # AR of COUNT accepted
        ctx.set(bus.arvalid, 0)
        assert ctx.get(bus.rvalid) and ctx.get(bus.rdata) == 6
        await ctx.tick()
        ctx.set(bus.rready, 0)

    run(dut, bench)


def test_read_at_commit_edge_sees_old_value():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    bus = dut.s_axi_ctrl
    addr = regmap.addr("SCRATCH")
    reset = regmap.register("SCRATCH").reset

    async def bench(ctx):
        await _write_then_read(ctx, bus, addr, 0xAAAA_5555)  # commit edge and AR handshake edge
        ctx.set(bus.arvalid, 0)
        assert ctx.get(bus.bvalid) and ctx.get(bus.rvalid)
        assert ctx.get(bus.rdata) == reset
        ctx.set(bus.rready, 1)
        ctx.set(bus.bready, 1)
        await ctx.tick()
        ctx.set(bus.rready, 0)
        ctx.set(bus.bready, 0)
        assert await Axil(ctx, bus).read(addr) == (OKAY, 0xAAAA_5555)

    run(dut, bench)


@pytest.mark.parametrize("mapname", ["kinds", "node"])
def test_random_sequence_against_model(mapname):
    regmap = kinds_regmap() if mapname == "kinds" else node_regmap()
    dut = CsrBank(regmap)
    model = CsrModel(regmap)
    rng = random.Random(2024)
    addrs = [a for a, _ in regmap]
    rw1c = [k for k, s in model.slots.items() if s.field.access is Access.RW1C]

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_ctrl)
        for _ in range(120):
            for key in model.inputs:
                model.inputs[key] = rng.getrandbits(model.slots[key].field.width)
            drive_inputs(ctx, dut, model)
            if rw1c and rng.random() < 0.5:
                key = rng.choice(rw1c)
                bits = rng.getrandbits(model.slots[key].field.width)
                ctx.set(dut.port(*key).set, bits)
                await ctx.tick()
                ctx.set(dut.port(*key).set, 0)
                model.hw_set(*key, bits)
            addr = rng.choice(addrs) + rng.randrange(WORD_BYTES) if rng.random() < 0.85 \
                else rng.randrange(len(regmap) * WORD_BYTES, 1 << dut.addr_width)
            delays = {k: rng.choice([0, 0, 1, 3]) for k in ("aw_delay", "w_delay", "b_delay")}
            if rng.random() < 0.5:
                data, strb = rng.getrandbits(32), rng.getrandbits(4)
                assert await axil.write(addr, data, strb, **delays) == model.write(
                    addr, data, strb)
                check_outputs(ctx, dut, model)
            else:
                assert await axil.read(addr, rng.choice([0, 2])) == model.read(addr)
        assert await axil.read(regmap.addr("BUS_ERRORS")) == model.read(
            regmap.addr("BUS_ERRORS"))
        assert model.bus_errors > 0

    run(dut, bench)


def test_model_byte_mask_and_pack():
    assert byte_mask(0b0101) == 0x00FF_00FF
    model = CsrModel(kinds_regmap())
    word = model.pack("STATUS", busy=1, err=3, flags=0xFFFF)
    assert word == 1 | (3 << 11) | (0xFFFF << 16)
    assert model.unpack("STATUS", word) == {"busy": 1, "level": 0, "err": 3, "flags": 0xFFFF}
    with pytest.raises(ValueError):
        model.pack("STATUS", err=32)
    with pytest.raises(ValueError):
        model.hw_set("CTRL", "mode", 1)


def test_flat_top_names():
    from mcf.hdl.csr.top import csr_flat_top

    regmap = kinds_regmap()
    top = csr_flat_top(regmap)
    names = [s.name for s in top.ports]
    assert names[:19] == [f"s_axi_ctrl_{n}" for n in AxiLiteSignature(12).members]
    assert {"regs_CTRL_limit", "regs_CMD_go_value", "regs_CMD_go_stb", "regs_STATUS_busy",
            "regs_STATUS_err_value", "regs_STATUS_err_set", "regs_IRQ_IRQ_set",
            "regs_COUNT_COUNT"} <= set(names)
    assert not any("ID" in n.split("_") or "BUS_ERRORS" in n for n in names)
    for obj in (top, top.inner):
        obj._MustUse__silence = True  # built only to inspect names


def test_back_to_back_reads_one_per_two_cycles():
    regmap = kinds_regmap()
    dut = CsrBank(regmap)
    bus = dut.s_axi_ctrl
    model = CsrModel(regmap)

    async def bench(ctx):
        addrs = [a for a, _ in regmap] * 2
        got, cycle, pending = [], 0, list(addrs)
        ctx.set(bus.rready, 1)
        while len(got) < len(addrs):
            ctx.set(bus.arvalid, bool(pending))
            if pending:
                ctx.set(bus.araddr, pending[0])
            ar_hs = pending and ctx.get(bus.arready)
            if ctx.get(bus.rvalid):
                got.append((AxiResp(ctx.get(bus.rresp)).value, ctx.get(bus.rdata)))
            await ctx.tick()
            cycle += 1
            if ar_hs:
                pending.pop(0)
        assert got == [model.read(a) for a in addrs]
        assert cycle == 2 * len(addrs)

    run(dut, bench)

# amaranth: UnusedElaboratable=no
"""``mcf_eth`` (:class:`mcf.hdl.eth.links.EthLinks`) under amaranth.sim: every register of
:func:`mcf.abi.eth.eth_regmap` over AXI-Lite; frames looped on RGMII link 1 and on the SFP+
link's GT user data, counted in ``eth{l}_*``; ``ETH_LINK`` following block lock and the RGMII
receive clock; the driver's pure parts on the values read back (``mcf.driver.eth``)."""

import pytest
from amaranth import Elaboratable, Module
from amaranth.sim import Simulator
from test_csr_bank import Axil

from mcf.abi.eth import (
    ETH_LINK_RGMII,
    ETH_LINK_SFP,
    ETH_LINKS,
    ETH_MAP_IDENT,
    ETH_MAP_VERSION,
    RXCLK_MIN_RESET,
    RXCLK_WINDOW,
    eth_regmap,
    link_beats,
)
from mcf.abi.meta import META
from mcf.abi.regs import Access
from mcf.driver.eth import eth_writes, link_status_from
from mcf.driver.node_map import status_registers
from mcf.golden.csr import OKAY, SLVERR
from mcf.golden.eth import EthModel
from mcf.hdl.eth.links import EthLinks

ACLK = 10e-9          # 100 MHz
ETH_HALF = 4e-9       # 125 MHz
GT = 6.2e-9           # 161.3 MHz, the GT's 64-bit user clock


def link_frame(payload: bytes, tag: int) -> bytes:
    meta = META.const({"length": len(payload)}).as_bits().to_bytes(8, "little")
    return bytes([tag] * 8) + meta + payload + bytes([0xC0, 0xFF, 0xEE, tag])


def run(dut, *benches, rgmii_clock=True, gt_clock=False):
    sim = Simulator(dut)
    sim.add_clock(ACLK)
    links = getattr(dut, "links", dut)

    if rgmii_clock:
        async def eth_clocks(ctx):           # eth_clk and its 2 ns (quarter period) copy
            while True:
                ctx.set(links.eth_clk, 1)
                await ctx.delay(ETH_HALF / 2)
                ctx.set(links.eth_clk90, 1)
                await ctx.delay(ETH_HALF / 2)
                ctx.set(links.eth_clk, 0)
                await ctx.delay(ETH_HALF / 2)
                ctx.set(links.eth_clk90, 0)
                await ctx.delay(ETH_HALF / 2)
        sim.add_process(eth_clocks)
    if gt_clock:
        async def gt_clock_proc(ctx):
            while True:
                ctx.set(links.gt_tx_clk, 1)
                ctx.set(links.gt_rx_clk, 1)
                await ctx.delay(GT / 2)
                ctx.set(links.gt_tx_clk, 0)
                ctx.set(links.gt_rx_clk, 0)
                await ctx.delay(GT / 2)
        sim.add_process(gt_clock_proc)
    for i, b in enumerate(benches):
        sim.add_testbench(b, background=i > 0)
    sim.run()


class Loop(Elaboratable):
    """EthLinks with RGMII link 1's pins looped (tx → rx, its forwarded clock as rx_clk) and
    the GT's TX user data into its RX."""

    def __init__(self):
        self.links = EthLinks()

    def elaborate(self, platform):
        m = Module()
        m.submodules.links = d = self.links
        m.d.comb += [d.rgmii1_rxd.eq(d.rgmii1_txd), d.rgmii1_rx_ctl.eq(d.rgmii1_tx_ctl),
                     d.rgmii1_rx_clk.eq(d.rgmii1_tx_clk), d.gt_rxdata.eq(d.gt_txdata)]
        return m


async def read_all(axil, rm):
    return {reg.name: (await axil.read(rm.addr(reg.name)))[1]
            for _, reg in rm}


def test_every_register_reads_and_writes_over_axi_lite():
    dut = EthLinks()
    rm = eth_regmap()

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_eth)
        ctx.set(dut.sfp_mod_abs, 1)
        ctx.set(dut.gt_rx_done, 1)
        ctx.set(dut.gt_tx_pma_done, 1)
        await ctx.tick().repeat(4)
        words = await read_all(axil, rm)
        idr = rm.register("ID").unpack(words["ID"])
        assert idr == {"version": ETH_MAP_VERSION, "ident": ETH_MAP_IDENT}
        assert words["ETH_RXCLK_MIN"] == RXCLK_MIN_RESET
        assert words["eth0_sfp_mod_abs"] == 1 and words["eth0_gt_rx_done"] == 1
        assert words["eth0_sfp_rx_los"] == 0 and words["eth0_gt_tx_done"] == 0
        zero = {n for n in words if n not in ("ID", "ETH_RXCLK_MIN", "eth0_sfp_mod_abs",
                                                "eth0_gt_rx_done")}
        assert {n: words[n] for n in zero} == dict.fromkeys(zero, 0)
        assert ctx.get(dut.gt_userclk_tx_reset) == 0 and ctx.get(dut.gt_userclk_rx_reset) == 1
        assert ctx.get(dut.gt_reset) == 0 and ctx.get(dut.sfp_tx_disable) == 0
        assert ctx.get(dut.rgmii1_rst_b) == 1 and ctx.get(dut.rgmii2_rst_b) == 1
        for i, (addr, reg) in enumerate(rm):
            writable = [f for f in reg.fields if f.access is Access.RW]
            pattern = 0x5A5A5A5A ^ (i * 0x01010101)
            assert await axil.write(addr, pattern) == OKAY
            want = 0
            for fld, off in reg.offsets():
                if fld.access is Access.RW:
                    want |= pattern & (((1 << fld.width) - 1) << off)
            got = (await axil.read(addr))[1]
            if writable:
                assert got == want, reg.name
            else:                                # read-only: the write is ignored
                assert got == words[reg.name], reg.name
        # the MACs see the written ids
        assert ctx.get(dut.macs[1].local_id) == rm.register("ETH_LOCAL").unpack(
            (await axil.read(rm.addr("ETH_LOCAL")))[1])["local_id"]
        for lk in range(ETH_LINKS):
            cfg = rm.register(f"ETH{lk}_CFG").unpack(
                (await axil.read(rm.addr(f"ETH{lk}_CFG")))[1])
            assert ctx.get(dut.macs[lk].peer_id) == cfg["peer_id"]
        assert (await axil.read(rm.size)) == (SLVERR, 0)
        assert (await axil.read(rm.addr("BUS_ERRORS")))[1] == 1

    run(dut, bench, rgmii_clock=False)


def test_frames_counters_and_link_up():
    top = Loop()
    dut = top.links
    rm = eth_regmap()
    frames = {1: link_frame(bytes(range(8)), 0x11), 0: link_frame(bytes(range(40)), 0x22)}
    got: dict[int, list] = {0: [], 1: []}
    seen: dict = {}

    def collector(lk):
        async def collect(ctx):
            port = getattr(dut, f"m_axis_link{lk}")
            ctx.set(port.ready, 1)
            async for _, _, valid, payload in ctx.tick().sample(port.valid, port.payload):
                if valid:
                    got[lk].append((payload.data, payload.keep, payload.last))
        return collect

    async def send(ctx, lk, frame):
        port = getattr(dut, f"s_axis_link{lk}")
        for data, keep, last in link_beats(frame):
            ctx.set(port.valid, 1)
            ctx.set(port.payload, {"data": data, "keep": keep, "last": last})
            await ctx.tick().until(port.ready)
        ctx.set(port.valid, 0)

    async def bench(ctx):
        axil = Axil(ctx, dut.s_axi_eth)
        # a one-node ring: every link's peer is the node itself, so looped frames are its own
        for name, fields in eth_writes(0, 1, "ring"):
            assert await axil.write(rm.addr(name), rm.register(name).pack(**fields)) == OKAY
        up0 = rm.register("ETH_LINK").unpack((await axil.read(rm.addr("ETH_LINK")))[1])
        assert up0 == {"link0_up": 0, "link1_up": 0, "link2_up": 0}
        # the SFP+ PCS locks on its own idles, then a frame crosses the loop
        for _ in range(200):
            await ctx.tick().repeat(20)
            if (await axil.read(rm.addr("eth0_block_lock")))[1]:
                break
        else:
            pytest.fail("no block lock on the looped GT data")
        await send(ctx, 0, frames[0])
        await send(ctx, 1, frames[1])
        await ctx.tick().repeat(RXCLK_WINDOW + 400)
        words = await read_all(axil, rm)
        seen["words"] = words
        up = rm.register("ETH_LINK").unpack(words["ETH_LINK"])
        assert up == {"link0_up": 1, "link1_up": 1, "link2_up": 0}
        # link 1's receive clock: 125 MHz counted against the 100 MHz aclk (1,280 edges per
        # window; the synchroniser defers a few edges across a window's edge: within 1 %)
        count = words["eth1_rx_clk_count"]
        assert abs(count - RXCLK_WINDOW * 1.25) <= 13 and words["eth2_rx_clk_count"] == 0
        # the threshold decides: above the measured count the link is down
        await axil.write(rm.addr("ETH_RXCLK_MIN"), count + 10)
        await ctx.tick().repeat(RXCLK_WINDOW + 20)
        up = rm.register("ETH_LINK").unpack((await axil.read(rm.addr("ETH_LINK")))[1])
        assert up["link1_up"] == 0 and up["link0_up"] == 1
        # a foreign destination: link 1 sends to node 3, its receiver (node 0) drops it
        await axil.write(rm.addr("ETH1_CFG"), 3)
        await ctx.tick().repeat(4)
        await send(ctx, 1, frames[1])
        await ctx.tick().repeat(400)
        seen["foreign"] = (await axil.read(rm.addr("eth1_rx_foreign_dst")))[1]
        seen["rx1"] = (await axil.read(rm.addr("eth1_rx_frames")))[1]

    run(top, bench, collector(0), collector(1), gt_clock=True)

    words = seen["words"]
    for lk in (0, 1):
        model = EthModel(local=0, peer=0)
        wire = model.send(frames[lk])
        assert model.receive(wire) == frames[lk]
        for name, value in model.status.items():
            assert words[f"eth{lk}_{name}"] == value, (lk, name)
        assert got[lk] == link_beats(frames[lk])
    for name, value in EthModel(local=0, peer=0).status.items():
        assert words[f"eth2_{name}"] == value == 0
    assert seen["foreign"] == 1 and seen["rx1"] == 1
    assert words["eth0_hi_ber"] == 0 and words["eth0_lock_losses"] == 0
    assert words["eth0_errored_blocks"] == 0

    # the driver's view of the same registers
    status = link_status_from({r.name: words[r.name] for r in status_registers(rm)}
                              | {f"ETH{lk}_CFG": words[f"ETH{lk}_CFG"] for lk in range(3)},
                              aclk_hz=1 / ACLK)
    assert [s.kind for s in status] == ["sfp+", "rgmii", "rgmii"]
    assert [s.link_up for s in status] == [True, True, False]
    assert status[1].tx_frames == 1 and status[1].rx_frames == 1
    assert status[1].tx_bytes == status[1].rx_bytes == 64
    assert status[0].rx_bytes == words["eth0_rx_bytes"] == len(frames[0]) + 18
    assert status[0].block_lock == 1 and status[0].ber_count == words["eth0_ber_count"]
    assert status[0].sfp == {"sfp_mod_abs": 0, "sfp_rx_los": 0, "sfp_tx_fault": 0,
                             "gt_tx_done": 0, "gt_rx_done": 0}
    assert status[1].rx_clk_hz == pytest.approx(125e6, rel=0.01)
    assert status[2].rx_clk_count == 0 and status[2].block_lock is None
    assert all(s.peer_id == 0 for s in status)
    assert ETH_LINK_SFP == 0 and ETH_LINK_RGMII == (1, 2)

"""The MAC wrapper of the node's three physical links (issue #13 item 5; ``docs/eth.md``
"Link status registers (``mcf_eth``)"): :class:`EthLinks` — link 0 the SFP+ (:class:`TenGigLink`
on a GTH's 64-bit user data), links 1 and 2 the PL RJ45 jacks (:class:`RgmiiMac`) — behind its
own AXI4-Lite register bank (:func:`mcf.abi.eth.eth_regmap`), and :class:`RxClockMonitor`, the
RGMII link-up rule. The Verilog top is ``mcf_eth`` (:mod:`mcf.hdl.tops`); the node top stays
as it is and the block design joins ``node/m_axis_link{l}`` ↔ ``eth/s_axis_link{l}``.
"""

from __future__ import annotations

from amaranth import (
    Cat,
    ClockDomain,
    ClockSignal,
    Elaboratable,
    Fragment,
    Module,
    ResetSignal,
    Signal,
)
from amaranth.hdl import DomainRenamer
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import (
    ETH_LINK_RGMII,
    ETH_LINK_SFP,
    ETH_LINKS,
    PCS_STATUS,
    RGMII_STATUS,
    RXCLK_GRAY_BITS,
    RXCLK_WINDOW,
    SFP_STATUS,
    eth_regmap,
)
from mcf.abi.framing import beat_layout
from mcf.abi.mdio import MDC_HALF_PERIOD, MDIO_COUNTERS

from ..csr.axil import AxiLiteSignature
from ..csr.bank import CsrBank
from .mdio import MdioMaster
from .rgmii import RGMII_PINS, RgmiiMac
from .tengig import TenGigLink

__all__ = ["EthLinks", "RxClockMonitor", "GT_WIDTH"]

GT_WIDTH = 64
"""The GTH user data width of link 0 (``gt_txdata``/``gt_rxdata``; the GT wizard's
``TX_USER_DATA_WIDTH``/``RX_USER_DATA_WIDTH``)."""


class RxClockMonitor(wiring.Component):
    """Counts the edges of a foreign clock ``clk`` in windows of :data:`RXCLK_WINDOW` aclk
    cycles: a :data:`RXCLK_GRAY_BITS`-bit Gray counter in ``clk``'s domain crosses through an
    ``FFSynchronizer``; aclk adds the per-cycle difference (< 2**(bits-1) edges per aclk
    cycle, i.e. aclk > 15.6 MHz for 125 MHz).

    Members: ``clk`` — ``In(1)`` the monitored clock; ``min`` — ``In(16)`` the threshold;
    ``count`` — ``Out(16)`` edges in the last whole window (0 until one has passed);
    ``up`` — ``Out(1)`` ``count >= min``.
    Latency: ``count`` updates once per window, the synchroniser adds 2 aclk cycles.
    """

    def __init__(self):
        super().__init__({"clk": In(1), "min": In(16), "count": Out(16), "up": Out(1)})

    def elaborate(self, platform):
        m = Module()
        n = RXCLK_GRAY_BITS
        m.domains.mon = ClockDomain("mon", local=True, reset_less=True)
        m.d.comb += ClockSignal("mon").eq(self.clk)
        edges = Signal(n)
        gray = Signal(n)
        nxt = (edges + 1)[:n]
        m.d.mon += [edges.eq(nxt), gray.eq(nxt ^ (nxt >> 1))]
        g_sync = Signal(n)
        m.submodules.sync_gray = FFSynchronizer(gray, g_sync, reset_less=True)
        binary = [Signal(name=f"bin{i}") for i in range(n)]
        m.d.comb += binary[n - 1].eq(g_sync[n - 1])
        for i in reversed(range(n - 1)):
            m.d.comb += binary[i].eq(binary[i + 1] ^ g_sync[i])
        now = Cat(*binary)
        prev = Signal(n)
        delta = Signal(n)
        m.d.comb += delta.eq(now - prev)
        acc = Signal(16)
        tick = Signal(range(RXCLK_WINDOW))
        m.d.sync += [prev.eq(now), tick.eq(tick + 1), acc.eq(acc + delta)]
        with m.If(tick == RXCLK_WINDOW - 1):
            m.d.sync += [self.count.eq(acc + delta), acc.eq(0)]
        m.d.comb += self.up.eq(self.count >= self.min)
        return m


class _OnPlatform(Elaboratable):
    """Elaborates ``inner`` with ``platform`` whatever its parent was given (the Verilog for
    Vivado is written without a platform, but the RGMII MACs need theirs for ODDRE1/IDDRE1 and
    the synchronisers take Vivado's ASYNC_REG from it)."""

    def __init__(self, inner, platform):
        self.inner, self.platform = inner, platform

    def elaborate(self, platform):
        return Fragment.get(self.inner, self.platform)


_MAC_DOMAINS = {TenGigLink: ("xg_tx", "xg_rx"), RgmiiMac: ("eth_tx", "eth_rx")}


def _stream():
    return stream.Signature(beat_layout(64))


class EthLinks(wiring.Component):
    """The three MACs of one node and their register bank ``s_axi_eth``.

    Members (aclk = ``sync`` unless named; flat names under :class:`mcf.hdl.flat.FlatTop`)
    ------------------------------------------------------------------------------------
    s_axi_eth : ``In(AxiLiteSignature(12, 32))`` — :func:`mcf.abi.eth.eth_regmap`.
    s_axis_link{l} / m_axis_link{l} : link frames (``beat_layout(64)``) from / to the node's
        ``m_axis_link{l}`` / ``s_axis_link{l}``; l = 0 SFP+, 1 and 2 RGMII.
    rgmii{l}_<pin> : the members of ``RGMII_PINS`` as plain ports, l = 1, 2 — the PHY's RGMII
        pins (board ports ``eth_rgmii{l-1}_*``); ``rgmii{l}_rst_b`` — ``Out(1)`` the PHY's
        reset, low while aclk is in reset, released (high) after it.
    rgmii{l}_mdc / rgmii{l}_mdio_o / rgmii{l}_mdio_t : ``Out(1)``; rgmii{l}_mdio_i : ``In(1)`` —
        the PHY's management pins from link l's :class:`~mcf.hdl.eth.mdio.MdioMaster`
        (``_t``: the Xilinx IOBUF's tristate control, 1 = MDIO released), behind
        ``ETH{l}_MDIO_CMD`` / ``ETH{l}_MDIO`` / ``eth{l}_mdio_*`` (:mod:`mcf.abi.mdio`).
    eth_clk : ``In(1)`` — 125 MHz, the RGMII transmitters' clock (``eth_tx``).
    eth_clk90 : ``In(1)`` — simulation only (``primitives=False``): the same delayed by 2 ns.
    gt_tx_clk / gt_rx_clk : ``In(1)`` — the GT's TXUSRCLK2 / RXUSRCLK2 (10.3125 GHz / 64).
    gt_txdata : ``Out(64)`` (``gt_tx_clk``); gt_rxdata : ``In(64)`` (``gt_rx_clk``).
    gt_tx_done / gt_rx_done : ``In(1)`` — the GT wizard's reset-done outputs (any domain).
    gt_reset : ``Out(1)`` — the GT wizard's ``reset_all``: high while aclk is in reset.
    gt_tx_pma_done / gt_rx_pma_done : ``In(1)``; gt_userclk_tx_reset / gt_userclk_rx_reset :
        ``Out(1)`` — their inverses, the wizard's user-clock helper resets (PG182).
    sfp_tx_disable : ``Out(1)`` — high while aclk is in reset; sfp_tx_fault / sfp_rx_los /
        sfp_mod_abs : ``In(1)`` — the cage's sideband pins (read as ``eth0_sfp_*``).

    ``ETH_LOCAL.local_id`` and ``ETH{l}_CFG.peer_id`` drive the MACs' ``local_id``/``peer_id``;
    every MAC's ``status`` (and link 0's ``pcs_status``) drives ``eth{l}_*``; ``ETH_LINK`` is
    link 0's ``block_lock & ~hi_ber`` and links 1/2's :class:`RxClockMonitor` ``up``.
    ``primitives``: elaborate the MACs with :class:`~mcf.hdl.platform.kr260.KR260Platform`
    (ODDRE1/IDDRE1 on the RGMII pins, ASYNC_REG synchronisers) — the Verilog for Vivado.
    ``mdc_half_period``: aclk cycles per MDC half period (default
    :data:`mcf.abi.mdio.MDC_HALF_PERIOD`, 2.5 MHz at 300 MHz; tests use fewer).
    Latency: register reads/writes as :class:`CsrBank`; status a few aclk cycles behind the MAC
    domains (their event FIFOs); MDIO as :class:`~mcf.hdl.eth.mdio.MdioMaster` (a command
    starts its frame the cycle after the write's strobe).
    """

    def __init__(self, *, primitives: bool = False, mdc_half_period: int = MDC_HALF_PERIOD):
        self._primitives = primitives
        self.regmap = eth_regmap()
        self.bank = CsrBank(self.regmap)
        members = {"s_axi_eth": In(AxiLiteSignature(self.bank.addr_width, 32))}
        for lk in range(ETH_LINKS):
            members[f"s_axis_link{lk}"] = In(_stream())
            members[f"m_axis_link{lk}"] = Out(_stream())
        for lk in ETH_LINK_RGMII:      # plain ports, not an interface: no bus for Vivado
            members.update({f"rgmii{lk}_{name}": pin for name, pin in RGMII_PINS.members.items()})
            members[f"rgmii{lk}_rst_b"] = Out(1)
            members.update({f"rgmii{lk}_mdc": Out(1), f"rgmii{lk}_mdio_o": Out(1),
                            f"rgmii{lk}_mdio_t": Out(1), f"rgmii{lk}_mdio_i": In(1)})
        members["eth_clk"] = In(1)
        if not primitives:
            members["eth_clk90"] = In(1)
        members.update({
            "gt_tx_clk": In(1), "gt_rx_clk": In(1),
            "gt_txdata": Out(64), "gt_rxdata": In(64),
            "gt_tx_done": In(1), "gt_rx_done": In(1), "gt_reset": Out(1),
            "gt_tx_pma_done": In(1), "gt_rx_pma_done": In(1),
            "gt_userclk_tx_reset": Out(1), "gt_userclk_rx_reset": Out(1),
            "sfp_tx_disable": Out(1), "sfp_tx_fault": In(1), "sfp_rx_los": In(1),
            "sfp_mod_abs": In(1),
        })
        super().__init__(members)
        self.macs = {ETH_LINK_SFP: TenGigLink(GT_WIDTH)}
        self.macs.update({lk: RgmiiMac() for lk in ETH_LINK_RGMII})
        self.mdio = {lk: MdioMaster(mdc_half_period) for lk in ETH_LINK_RGMII}

    def elaborate(self, platform):
        m = Module()
        m.submodules.bank = bank = self.bank
        wiring.connect(m, wiring.flipped(self.s_axi_eth), bank.s_axi_ctrl)
        regs = bank.regs
        plat = None
        if self._primitives:
            from ..platform.kr260 import KR260Platform
            plat = KR260Platform()

        def status(prefix: str, value) -> None:
            for name, _ in value.shape():
                m.d.comb += bank.port(f"{prefix}_{name}").eq(value[name])

        rst = ResetSignal("sync")
        for lk, mac in self.macs.items():
            # each MAC defines its clock domains under one name (eth_tx/eth_rx, xg_tx/xg_rx):
            # renamed per link so that the two RGMII MACs' domains stay apart
            own = {d: f"{d}{lk}" for d in _MAC_DOMAINS[type(mac)]}
            body = mac if plat is None else _OnPlatform(mac, plat)
            m.submodules[f"mac{lk}"] = DomainRenamer(own)(body)
            wiring.connect(m, wiring.flipped(getattr(self, f"s_axis_link{lk}")), mac.s_axis)
            wiring.connect(m, mac.m_axis, wiring.flipped(getattr(self, f"m_axis_link{lk}")))
            m.d.comb += [mac.local_id.eq(regs.ETH_LOCAL.local_id),
                         mac.peer_id.eq(bank.port(f"ETH{lk}_CFG", "peer_id"))]
            status(f"eth{lk}", mac.status)

        # ---- link 0: the SFP+ on the GT ------------------------------------------------------
        sfp = self.macs[ETH_LINK_SFP]
        status(f"eth{ETH_LINK_SFP}", sfp.pcs_status)
        m.d.comb += [sfp.tx_clk.eq(self.gt_tx_clk), sfp.rx_clk.eq(self.gt_rx_clk),
                     self.gt_txdata.eq(sfp.gt_txdata), sfp.gt_rxdata.eq(self.gt_rxdata),
                     self.gt_reset.eq(rst), self.sfp_tx_disable.eq(rst),
                     self.gt_userclk_tx_reset.eq(~self.gt_tx_pma_done),
                     self.gt_userclk_rx_reset.eq(~self.gt_rx_pma_done)]
        side = Signal(SFP_STATUS)
        m.submodules.sfp_sync = FFSynchronizer(
            Cat(self.sfp_mod_abs, self.sfp_rx_los, self.sfp_tx_fault, self.gt_tx_done,
                self.gt_rx_done), side.as_value())
        status(f"eth{ETH_LINK_SFP}", side)
        up = {ETH_LINK_SFP: sfp.pcs_status.block_lock & ~sfp.pcs_status.hi_ber}
        assert [n for n, _ in PCS_STATUS][:2] == ["block_lock", "hi_ber"]

        # ---- links 1, 2: RGMII ---------------------------------------------------------------
        for lk in ETH_LINK_RGMII:
            mac = self.macs[lk]
            for name, pin in RGMII_PINS.members.items():
                port = getattr(self, f"rgmii{lk}_{name}")
                m.d.comb += (port.eq(getattr(mac.pins, name)) if pin.flow == Out
                             else getattr(mac.pins, name).eq(port))
            m.d.comb += [mac.tx_clk_in.eq(self.eth_clk),
                         getattr(self, f"rgmii{lk}_rst_b").eq(~rst)]
            if not self._primitives:
                m.d.comb += mac.tx_clk90.eq(self.eth_clk90)
            m.submodules[f"rx_clk_mon{lk}"] = mon = RxClockMonitor()
            m.d.comb += [mon.clk.eq(getattr(self, f"rgmii{lk}_rx_clk")),
                         mon.min.eq(regs.ETH_RXCLK_MIN.edges)]
            rg = Signal(RGMII_STATUS, name=f"rgmii{lk}_status")
            m.d.comb += rg.rx_clk_count.eq(mon.count)
            status(f"eth{lk}", rg)
            up[lk] = mon.up
            # the PHY's MDIO station
            m.submodules[f"mdio{lk}"] = md = self.mdio[lk]
            cmd = getattr(regs, f"ETH{lk}_MDIO_CMD")
            m.d.comb += [
                md.start.eq(cmd.data.stb | cmd.reg.stb | cmd.phy.stb | cmd.read.stb),
                md.read.eq(cmd.read.value), md.phy.eq(cmd.phy.value),
                md.reg.eq(cmd.reg.value), md.wdata.eq(cmd.data.value),
                getattr(self, f"rgmii{lk}_mdc").eq(md.mdc),
                getattr(self, f"rgmii{lk}_mdio_o").eq(md.mdio_o),
                getattr(self, f"rgmii{lk}_mdio_t").eq(~md.mdio_oe),
                md.mdio_i.eq(getattr(self, f"rgmii{lk}_mdio_i")),
            ]
            st = getattr(regs, f"ETH{lk}_MDIO")
            m.d.comb += [st.rdata.eq(md.rdata), st.busy.eq(md.busy), st.done.eq(md.done),
                         st.no_answer.eq(md.no_answer)]
            count = {"mdio_reads": md.reads, "mdio_writes": md.writes,
                     "mdio_no_answer": md.no_answers, "mdio_cmd_busy": md.cmd_busy}
            assert set(count) == {n for n, _ in MDIO_COUNTERS}
            for name, value in count.items():
                m.d.comb += bank.port(f"eth{lk}_{name}").eq(value)
        for lk in range(ETH_LINKS):
            m.d.comb += getattr(regs.ETH_LINK, f"link{lk}_up").eq(up[lk])
        return m

"""Node tops cabled MAC to MAC (issue #13 test item; ``docs/eth.md`` §9 "Two node tops over the
MACs"): :class:`ClusterEthTop` is :class:`mcf.sim.cluster.ClusterTop`'s ring with every cable
made of two real MACs and a wire model per direction instead of two link models.

A cable joining link 0 to link 0 (SFP+) is two :class:`mcf.hdl.eth.tengig.TenGigLink` (MAC +
10GBASE-R PCS) whose 64-bit GT user data cross through :class:`mcf.hdl.eth.wire.GtWire`; any
other cable is two :class:`mcf.hdl.eth.rgmii.RgmiiMac` whose TX pins drive the other end's RX
pins through :class:`mcf.hdl.eth.wire.RgmiiWire`. For two nodes the ring's two cables between
node 0 and node 1 are one of each, so one build carries a MARS step over both kinds.
"""

from __future__ import annotations

import functools

from amaranth import Module
from amaranth.hdl import DomainRenamer
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import ETH_STATUS, PCS_STATUS
from mcf.abi.link_map import LINK_SFP
from mcf.abi.node_config import SIM, NodeConfig
from mcf.hdl.eth.rgmii import RgmiiMac
from mcf.hdl.eth.tengig import TenGigLink
from mcf.hdl.eth.wire import GtWire, RgmiiWire
from mcf.hdl.flat import FlatTop
from mcf.hdl.node.top import NodeTop
from mcf.sim.cluster import NODE_PORTS, directed_links, expose_node_ports, ring_cables

__all__ = ["ClusterEthTop", "build_cluster_eth", "ETH_CLOCKS_PS", "mac_kind"]

ETH_CLOCKS_PS = {"eth_clk": 8000, "gt_clk": 6206}
"""The MAC clocks the bench drives, periods in ps: RGMII's 125 MHz (``eth_clk90`` is the same
clock 2 ns later) and the 64-bit GTH user clock of 10GBASE-R, 10.3125 GHz / 64 ≈ 161.13 MHz."""


def mac_kind(link: int) -> str:
    """``"10g"`` for the SFP+ link, ``"rgmii"`` for the others."""
    return "10g" if link == LINK_SFP else "rgmii"


class ClusterEthTop(wiring.Component):
    """``n`` :class:`NodeTop` (configuration ``config``) in the KR260 ring, every cable end a
    MAC.

    Members: per node ``i`` its ``s_axi_ctrl``, ``m_axi_hp{p}`` and ``irq`` as ``n{i}_<name>``
    (as :class:`~mcf.sim.cluster.ClusterTop`); per cabled link ``l`` of node ``i``
    ``n{i}_eth{l}_status`` — ``Out(ETH_STATUS)`` (aclk) its MAC's counters, and for an SFP+ link
    ``n{i}_eth{l}_pcs_status`` — ``Out(PCS_STATUS)``; per cable direction ``k``
    (:func:`~mcf.sim.cluster.directed_links` order) ``link{k}_inject`` — ``In(1)`` (aclk): a
    one-cycle pulse flips one bit of the next frame on that link, on the wire (the receiving
    MAC drops it as a bad FCS, the node sees the sequence gap); the clocks ``eth_clk`` (125 MHz,
    every RGMII MAC's ``tx_clk_in``), ``eth_clk90`` (the same delayed by 2 ns) and ``gt_clk``
    (every 10G end's TX user clock; a receiver's recovered clock is its sender's, the same).

    ``local_id``/``peer_id`` of each MAC are constants of the cabling: the node's index and the
    node at the other end. A physical link no cable uses is left unplugged (TX taken and lost,
    RX idle). A cable must join two SFP+ links or two RGMII links. Each MAC's clock domains are
    renamed ``n{i}_l{l}_<domain>`` (Amaranth's automatic renaming of domains two subfragments
    define leaves their clock drivers in conflict).
    """

    def __init__(self, n: int, config: NodeConfig = SIM):
        self.n, self.config = n, config
        self.nodes = [NodeTop(config) for _ in range(n)]
        self.cables = ring_cables(n)
        self.ends = {}                                  # (node, link) → MAC
        for c in self.cables:
            kinds = {mac_kind(c.a[1]), mac_kind(c.b[1])}
            if len(kinds) != 1:
                raise ValueError(f"cable {c.a}–{c.b} joins an SFP+ link to an RGMII link")
            for end in (c.a, c.b):
                self.ends[end] = TenGigLink() if kinds == {"10g"} else RgmiiMac()
        self.wires = [GtWire() if mac_kind(s[1]) == "10g" else RgmiiWire()
                      for s, _ in directed_links(n)]
        members = {}
        for i, node in enumerate(self.nodes):
            for name, member in node.signature.members.items():
                if name.startswith(NODE_PORTS):
                    members[f"n{i}_{name}"] = member
        for (i, ln), mac in sorted(self.ends.items()):
            members[f"n{i}_eth{ln}_status"] = Out(ETH_STATUS)
            if isinstance(mac, TenGigLink):
                members[f"n{i}_eth{ln}_pcs_status"] = Out(PCS_STATUS)
        for k in range(len(self.wires)):
            members[f"link{k}_inject"] = In(1)
        members.update({"eth_clk": In(1), "eth_clk90": In(1), "gt_clk": In(1)})
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        expose_node_ports(m, self, self.nodes)
        for (i, ln), mac in sorted(self.ends.items()):
            doms = ("xg_tx", "xg_rx") if isinstance(mac, TenGigLink) else ("eth_tx", "eth_rx")
            m.submodules[f"n{i}_eth{ln}"] = DomainRenamer({d: f"n{i}_l{ln}_{d}" for d in doms})(mac)
            node = self.nodes[i]
            wiring.connect(m, getattr(node, f"m_axis_link{ln}"), mac.s_axis)
            wiring.connect(m, mac.m_axis, getattr(node, f"s_axis_link{ln}"))
            m.d.comb += [mac.local_id.eq(i), getattr(self, f"n{i}_eth{ln}_status").eq(mac.status)]
            if isinstance(mac, TenGigLink):
                m.d.comb += [mac.tx_clk.eq(self.gt_clk), mac.rx_clk.eq(self.gt_clk),
                             getattr(self, f"n{i}_eth{ln}_pcs_status").eq(mac.pcs_status)]
            else:
                m.d.comb += [mac.tx_clk_in.eq(self.eth_clk), mac.tx_clk90.eq(self.eth_clk90)]
        for k, ((sn, sl), (dn, dl)) in enumerate(directed_links(self.n)):
            wire, src, dst = self.wires[k], self.ends[(sn, sl)], self.ends[(dn, dl)]
            m.submodules[f"wire{k}_{sn}_{sl}_to_{dn}_{dl}"] = wire
            m.d.comb += [src.peer_id.eq(dn), wire.inject.eq(getattr(self, f"link{k}_inject"))]
            if isinstance(wire, GtWire):
                m.d.comb += [wire.clk.eq(self.gt_clk), wire.i.eq(src.gt_txdata),
                             dst.gt_rxdata.eq(wire.o)]
            else:
                m.d.comb += [wire.txd.eq(src.pins.txd), wire.tx_ctl.eq(src.pins.tx_ctl),
                             wire.tx_clk.eq(src.pins.tx_clk), dst.pins.rxd.eq(wire.rxd),
                             dst.pins.rx_ctl.eq(wire.rx_ctl), dst.pins.rx_clk.eq(wire.rx_clk)]
        for i, node in enumerate(self.nodes):
            for ln in range(self.config.links):
                if (i, ln) not in self.ends:
                    m.d.comb += [getattr(node, f"m_axis_link{ln}").ready.eq(1),
                                 getattr(node, f"s_axis_link{ln}").valid.eq(0)]
        return m


@functools.cache
def build_cluster_eth(n: int = 2, config: NodeConfig = SIM):
    """The Verilator build of :class:`ClusterEthTop` (cached in ``build/sim`` as
    ``node_cluster_eth{n}``, and per process)."""
    from mcf.sim.toolchain import build

    suffix = "" if config == SIM else f"_{config.name}"
    top = FlatTop(ClusterEthTop(n, config), clock="aclk", resetn="aresetn")
    return build(top, f"node_cluster_eth{n}{suffix}")

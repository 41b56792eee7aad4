"""The network as the system model sees it: the stated link assumptions, and what one packet
costs on a directed link and in the NIC.

Link assumptions (:data:`LINKS`; rates and the cable latency are :mod:`mcf.abi.platform`'s):

* ``kr260-ring`` — the KR260 ring as cabled: SFP+ to SFP+ (10G) on every other cable, 1G RGMII
  on the rest and on the wrap (MARS's ``kr260-ring``), ``LINK_LATENCY_S`` per cable;
* ``switch10g`` — every board's SFP+ to a 10G switch (MARS's ``kr260-switch``): a transfer
  crosses the sender's uplink and the switch's downlink, each a 10G link;
* ``ideal`` — every node one hop from every other over links of unbounded rate and no latency:
  only the NIC (router, framer, packet path, record ingress) limits a transfer.

Per packet of ``p`` payload bytes on a link leaving a node: the Ethernet frame on the wire
(:func:`mcf.abi.eth.wire_bytes` of header + max(46, link frame) + FCS; the link frame is
``LINK_OVERHEAD + p``) at the line rate, the framer's beats (``LINK_OVERHEAD + p`` in 8-byte
beats, ``nic.json`` ``link.wire_beats_per_cycle``), the router's and packet path's beats
(payload beats + ``packet.json``'s header cycles, at ``nic.json`` ``multicast.beats_per_cycle``)
and, on the first hop, one command-ring record (``node.json`` ``meta_records_per_cycle``): the
slowest of these sets the hop's time. A link leaving the switch costs the line rate alone.
Latency per hop: the cable's, plus, at a receiving node, the router hop (``nic.json``) and the
packet path (``packet.json``, header-only packet). The cluster simulation's ``LinkModel``
carries link frames without Ethernet framing: ``ethernet=False``.

The clock: the links are physical — a line rate in bit/s and a cable latency in seconds — and
their per-cycle costs are derived at ``fig.clock_hz`` (:func:`.calibration.at_clock`): bytes
per cycle = ``rate_bps / 8 / clock_hz``, latency = ``latency_s x clock_hz`` cycles. The NIC's
figures (framer, router, packet path, ring ingress) are cycles measured in RTL and do not
change with the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..abi.eth import FCS_BYTES, HEADER_BYTES, LINK_OVERHEAD, MIN_PAYLOAD, wire_bytes
from ..abi.framing import payload_beats
from ..abi.node_config import PACKET_WIDTH
from ..mars.cluster import SWITCH, Topology
from .calibration import BenchFigures

__all__ = ["LINKS", "LinkAssumption", "Network", "cluster_for"]


@dataclass(frozen=True)
class LinkAssumption:
    name: str
    topology: str          # MARS topology it plans on
    ideal: bool
    text: str


LINKS: dict[str, LinkAssumption] = {a.name: a for a in (
    LinkAssumption("kr260-ring", "kr260-ring", False,
                   "the KR260 ring as cabled: 10G SFP+ on every other cable, 1G RGMII on the "
                   "others and the wrap"),
    LinkAssumption("switch10g", "kr260-switch", False,
                   "every board's SFP+ to a 10G switch (uplink + downlink per transfer)"),
    LinkAssumption("ideal", "switch", True,
                   "ideal links: one hop between any two nodes, unbounded rate, no latency "
                   "(the NIC alone limits a transfer)"),
)}


def cluster_for(link: str, nodes: int, kv_budget_mib: float, *, node_config: str,
                buffer_mib: float = 8.0, **kw):
    """The MARS cluster of ``nodes`` nodes on link assumption ``link``."""
    from ..mars import make_cluster
    a = LINKS[link]
    if a.ideal:
        kw |= {"link_gbps": math.inf, "link_latency_us": 0.0}
    return make_cluster(nodes, kv_budget_mib, node_config=node_config, buffer_mib=buffer_mib,
                        topology=a.topology, **kw)


@dataclass(frozen=True)
class Network:
    """Per-link packet costs on ``topology`` in ``aclk`` cycles."""
    topology: Topology
    fig: BenchFigures
    ethernet: bool = True
    latency_cycles: float | None = None     # every cable's latency (the bench's), else its own

    @property
    def beat_bytes(self) -> int:
        return PACKET_WIDTH // 8

    @property
    def nic_latency_cycles(self) -> float:
        """A receiving node's router hop and packet path."""
        return self.fig.router_hop_cycles + self.fig.packet_latency_cycles

    def frame_wire_bytes(self, payload: int) -> int:
        frame = LINK_OVERHEAD + payload
        if not self.ethernet:
            return frame
        return wire_bytes(HEADER_BYTES + max(MIN_PAYLOAD, frame) + FCS_BYTES)

    def line_bytes_per_cycle(self, link) -> float:
        return self.topology.link_params[link].rate_bps / 8 / self.fig.clock_hz

    def link_latency(self, link) -> float:
        """Cable latency of ``link``, plus the NIC's when it ends at a node."""
        cable = self.latency_cycles if self.latency_cycles is not None else \
            self.topology.link_params[link].latency_s * self.fig.clock_hz
        a, b = link
        ends_at_node = a == SWITCH or self.topology.base_kind != "switch"
        return cable + (self.nic_latency_cycles if ends_at_node else 0.0)

    def packet_cycles(self, link, payload: int, first_hop: bool) -> float:
        """Cycles one packet of ``payload`` bytes holds ``link``."""
        rate = self.line_bytes_per_cycle(link)
        t = self.frame_wire_bytes(payload) / rate if rate != math.inf else 0.0
        if link[0] == SWITCH:
            return t
        f = self.fig
        frame_beats = -(-(LINK_OVERHEAD + payload) // self.beat_bytes)
        t = max(t, frame_beats / f.framer_beats_per_cycle,
                (payload_beats(payload, PACKET_WIDTH) + f.packet_header_cycles)
                / f.router_beats_per_cycle)
        if first_hop:
            t = max(t, 1 / f.meta_records_per_cycle)
        return t

    def hop(self, link, payloads: tuple[int, ...], first_hop: bool) -> tuple[float, float, float]:
        """``(all packets, first packet, last packet)`` cycles of a message on ``link``."""
        per = [self.packet_cycles(link, p, first_hop) for p in payloads]
        return sum(per), per[0], per[-1]

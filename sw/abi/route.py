"""Route tables and network-port numbering shared by MARS (which fills the tables) and the NIC
router (which looks them up by ``Meta.route_id``).

A route-table entry says, for one node and one ``route_id``, on which of the node's network
ports a packet leaves (a bit mask: several bits = multicast fan-out at this hop) and whether the
packet is also delivered to the local sink. Point-to-point packets and every hop of a multicast
tree use the same mechanism; MARS computes one entry per (node, route_id).

Port numbering per topology (the cluster wiring and MARS both follow it):

* ring:          0 = next node (id + 1 mod N), 1 = previous node (id − 1 mod N)
* 2-D mesh/torus (node id = y·X + x): 0 = +x, 1 = −x, 2 = +y, 3 = −y
* switch:        0 = the switch uplink (every other node is one hop away)
"""

from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data, enum

from .meta import META

__all__ = ["NET_PORTS", "RingPort", "MeshPort", "SwitchPort", "ROUTE_ENTRY", "route_entry",
           "ROUTE_TABLE_DEPTH", "route_table_depth"]

NET_PORTS = 4                                   # widest router: a 2-D mesh/torus node


def route_table_depth(meta_layout: data.StructLayout = META) -> int:
    """Entries of a route table indexed by ``meta_layout``'s ``route_id`` (every value)."""
    return 1 << meta_layout["route_id"].width


ROUTE_TABLE_DEPTH = route_table_depth()


class RingPort(enum.IntEnum):
    NEXT = 0
    PREV = 1


class MeshPort(enum.IntEnum):
    X_PLUS = 0
    X_MINUS = 1
    Y_PLUS = 2
    Y_MINUS = 3


class SwitchPort(enum.IntEnum):
    UPLINK = 0


ROUTE_ENTRY = data.StructLayout({
    "ports": unsigned(NET_PORTS),   # bit p set: send a copy on network port p
    "local": unsigned(1),           # also deliver to this node's local sink
})


def route_entry(ports: set[int] | frozenset[int] = frozenset(), local: bool = False) -> int:
    """Pack one route-table entry."""
    if any(not 0 <= p < NET_PORTS for p in ports):
        raise ValueError(f"network ports must lie in 0..{NET_PORTS - 1}: {sorted(ports)}")
    return ROUTE_ENTRY.const({"ports": sum(1 << p for p in ports), "local": int(local)}).as_bits()

"""Link ↔ router port permutation (docs/node.md §9): the ``LINK_MAP`` register, its layout, the
status counters of the crossbar (:class:`mcf.hdl.node.link_map.LinkMap`), the crossbar's
resolution rule and the driver rule that computes the map of a board.

Physical links: ℓ = 0 SFP+ (10G), ℓ = 1, 2 the two PL RGMII jacks (1G). Router ports follow
:mod:`mcf.abi.route` (ring: 0 = next, 1 = prev; switch: 0 = uplink). ``LINK_MAP.port{p}_link``
names the link that carries router port ``p``; reset = identity. All boards share one
bitstream: the driver writes :func:`link_map_for`'s map at bind time, while the links are idle.

Resolution (:func:`link_map_routes`, what the crossbar does): port ``p`` owns link
``port{p}_link`` unless that value is not a link (≥ ``n_links``) or a lower port names the same
link (lowest port wins). An owning port's TX frames go to its link and the link's RX frames come
back on the port. A port that owns no link has its TX frames drained and counted
(``tx_unmapped``) and receives nothing; a link that no port owns has its RX frames drained and
counted (``rx_unmapped``).
"""

from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data

from .nic import Topology
from .platform import NODE_LINKS
from .regs import Access, Field, Register, counters, status_registers

__all__ = ["LINK_BITS", "link_map_layout", "LINK_MAP", "LINK_MAP_STATUS", "LINK_SFP",
           "link_map_register", "link_map_registers", "link_map_value", "link_map_unpack",
           "link_map_routes", "link_map_for", "IDENTITY"]

LINK_BITS = max(1, (NODE_LINKS - 1).bit_length())   # a link number: 2 bits for 3 links
LINK_SFP = 0                                         # ℓ = 0: the SFP+ cage (10G)
IDENTITY = tuple(range(NODE_LINKS))                  # the reset map: port p on link p


def link_map_layout(n_ports: int = NODE_LINKS) -> data.StructLayout:
    """The map as the crossbar takes it: ``port{p}_link`` per router port, LSB first — the
    same bits as the ``LINK_MAP`` register."""
    return data.StructLayout({f"port{p}_link": unsigned(LINK_BITS) for p in range(n_ports)})


LINK_MAP = link_map_layout()

LINK_MAP_STATUS = counters(
    "rx_unmapped",      # frames that arrived on a link no router port owns: drained
    "tx_unmapped",      # frames a router port sent while owning no link: drained
)


def link_map_register(n_ports: int = NODE_LINKS) -> Register:
    """``LINK_MAP``: which physical link carries each router port (reset identity)."""
    return Register("LINK_MAP", tuple(
        Field(f"port{p}_link", LINK_BITS, Access.RW, p,
              f"physical link of router port {p} (0 SFP+, 1/2 RGMII)")
        for p in range(n_ports)), "link <-> router port permutation; write only while idle")


def link_map_registers(n_ports: int = NODE_LINKS) -> list[Register]:
    """``LINK_MAP`` and the crossbar's counters ``link_map_*`` (:data:`LINK_MAP_STATUS`). Not
    yet part of :func:`mcf.abi.csrmap.node_regmap`."""
    return [link_map_register(n_ports),
            *status_registers("link_map", LINK_MAP_STATUS, "link map")]


def link_map_value(links: tuple[int, ...]) -> int:
    """The ``LINK_MAP`` word (and the crossbar's ``map`` bits) for ``links[p]`` = link of
    port ``p``."""
    return link_map_layout(len(links)).const(
        {f"port{p}_link": ln for p, ln in enumerate(links)}).as_bits()


def link_map_unpack(word: int, n_ports: int = NODE_LINKS) -> tuple[int, ...]:
    view = link_map_layout(n_ports).from_bits(word)
    return tuple(int(getattr(view, f"port{p}_link")) for p in range(n_ports))


def link_map_routes(links: tuple[int, ...], n_links: int = NODE_LINKS
                    ) -> tuple[tuple[int | None, ...], tuple[int | None, ...]]:
    """The crossbar's resolution of a map (golden model): ``(link_of_port, port_of_link)``
    — the link each port owns (``None``: its TX is drained, it receives nothing) and the port
    each link is owned by (``None``: its RX is drained). Lowest port wins a shared link."""
    port_of_link: list[int | None] = [None] * n_links
    link_of_port: list[int | None] = [None] * len(links)
    for p, ln in enumerate(links):
        if ln < n_links and port_of_link[ln] is None:
            port_of_link[ln] = p
            link_of_port[p] = ln
    return tuple(link_of_port), tuple(port_of_link)


def _topology(topology: Topology | str) -> Topology:
    if isinstance(topology, Topology):
        return topology
    names = {"ring": Topology.RING, "kr260-ring": Topology.RING,
             "switch": Topology.SWITCH, "kr260-switch": Topology.SWITCH}
    if topology not in names:
        raise ValueError(f"no link map for topology {topology!r} (KR260: ring or switch)")
    return names[topology]


def link_map_for(node: int, n_nodes: int, topology: Topology | str) -> tuple[int, ...]:
    """The driver rule of docs/node.md §9: ``LINK_MAP`` for board ``node`` of ``n_nodes``.

    Ring (MARS ``kr260-ring``): cable ``a ↔ a+1`` is SFP+ when ``a`` is even and ``a+1 < N``,
    RGMII otherwise. Even board with an SFP+ partner: next = link 0, prev = link 1; odd board:
    next = link 1, prev = link 0 (its SFP+ partner is ``node − 1``); the last board of an odd
    N (even, no SFP+ partner): next = link 2, prev = link 1. Switch (``kr260-switch``): port 0
    (uplink) = link 0. Ports a topology does not use take the remaining links in order, so the
    map is always a permutation (no drained port)."""
    if not 0 <= node < n_nodes:
        raise ValueError(f"node {node} not in a cluster of {n_nodes}")
    topo = _topology(topology)
    if topo == Topology.SWITCH:
        used = (LINK_SFP,)
    elif topo == Topology.RING:
        if node % 2:
            used = (1, LINK_SFP)
        elif node + 1 < n_nodes:
            used = (LINK_SFP, 1)
        else:
            used = (2, 1)
    else:
        raise ValueError(f"no link map for topology {topo.name} (KR260: ring or switch)")
    rest = [ln for ln in range(NODE_LINKS) if ln not in used]
    return (*used, *rest)

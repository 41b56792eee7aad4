"""Cluster description: nodes, KV budget, buffer, compute rate and the network (paper §4, §6.1).

Topologies follow the port numbering of :mod:`mcf.abi.route` (ring 0 = next / 1 = prev; 2-D
mesh/torus ``id = y·X + x`` with 0 = +x, 1 = −x, 2 = +y, 3 = −y; switch 0 = uplink). Routing is
deterministic and depends only on the current node and the destination (dimension order on a
mesh/torus with ties going +; the shorter way round a ring, ties taking the faster first link,
else next), so one route-table entry per
(node, destination) serves every source, and the union of the paths from one source to a set of
destinations is a tree (the multicast tree of that source).

Links are directed and identified by ``(node, port)`` for a node's egress; a switch is the vertex
:data:`SWITCH` and its egress link towards node ``n`` is ``(SWITCH, n)``. A node→switch→node
transfer counts as one hop (the paper's distance ``h``) but loads two links.

KR260 facts (platform.md): each board has three PL-side links — one 10G SFP+ and two 1G RGMII —
so a physical ring of boards pairs SFP+ to SFP+ on every other cable and uses 1G RGMII on the
rest (``kr260-ring``); a 10G switch on the SFP+ ports gives ``kr260-switch``. A 2-D mesh needs
four ports per board and is modelled for generality (uniform links).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from ..abi.framing import MAX_PAYLOAD
from ..abi.meta import META
from ..abi.node_config import NODE_CONFIGS, SIM
from ..abi.platform import ACLK_HZ, K26, LINK_LATENCY_S, RGMII_RATE_BPS, SFP_RATE_BPS
from ..abi.route import NET_PORTS, MeshPort, RingPort, SwitchPort
from .metadata import MAX_REDUCE_SLOTS

__all__ = ["SWITCH", "LinkParams", "Tree", "Topology", "ClusterSpec", "TOPOLOGIES",
           "make_topology", "SFP_10G", "RGMII_1G"]

SWITCH = -1


@dataclass(frozen=True)
class LinkParams:
    """One directed link: line rate in bit/s and one-hop latency in seconds."""
    rate_bps: float
    latency_s: float
    name: str = "link"


SFP_10G = LinkParams(SFP_RATE_BPS, LINK_LATENCY_S, "10G SFP+")
RGMII_1G = LinkParams(RGMII_RATE_BPS, LINK_LATENCY_S, "1G RGMII")


@dataclass(frozen=True)
class Tree:
    """A routed transfer from ``src`` to ``dests``: the directed links it loads, the ports each
    node sends on (route-table ``ports``), its depth in hops and latency along the slowest path."""
    src: int
    dests: tuple[int, ...]
    links: frozenset
    out_ports: dict = field(hash=False, compare=False)   # node -> frozenset of ports
    depth: int = 0
    latency_s: float = 0.0

    @property
    def edges(self) -> int:
        """Copies made on the network, counting a node→switch→node hop once (the paper's h)."""
        down = sum(1 for a, _ in self.links if a == SWITCH)
        return down if down else len(self.links)


class Topology:
    """Graph, ports, deterministic routes and per-link parameters of a cluster network."""

    def __init__(self, kind: str, n: int, links: dict, dims: tuple[int, int] | None = None):
        self.kind = kind
        self.n = n
        self.dims = dims
        self.link_params: dict = links     # (vertex, port-or-node) -> LinkParams
        self._neigh: dict[int, dict[int, int]] = {}
        self._trees: dict = {}
        for (a, b) in links:
            if a != SWITCH and self.base_kind != "switch":
                self._neigh.setdefault(a, {})[b] = self._neighbour(a, b)

    @property
    def base_kind(self) -> str:
        return self.kind.split("-")[-1]

    # --- adjacency ---------------------------------------------------------------------------
    def _neighbour(self, node: int, port: int) -> int:
        k = self.base_kind
        if k == "ring":
            return (node + 1) % self.n if port == RingPort.NEXT else (node - 1) % self.n
        x_dim, y_dim = self.dims
        x, y = node % x_dim, node // x_dim
        dx, dy = {MeshPort.X_PLUS: (1, 0), MeshPort.X_MINUS: (-1, 0),
                  MeshPort.Y_PLUS: (0, 1), MeshPort.Y_MINUS: (0, -1)}[port]
        x, y = (x + dx) % x_dim, (y + dy) % y_dim
        return y * x_dim + x

    def neighbour(self, node: int, port: int) -> int:
        return self._neigh[node][port]

    def ports(self, node: int) -> dict[int, int]:
        """Network ports of ``node`` and the vertex each leads to."""
        if self.base_kind == "switch":
            return {SwitchPort.UPLINK: SWITCH} if self.n > 1 else {}
        return dict(self._neigh.get(node, {}))

    # --- routing -----------------------------------------------------------------------------
    def next_port(self, cur: int, dst: int) -> int:
        """The port a packet for ``dst`` leaves ``cur`` on (``cur != dst``)."""
        k = self.base_kind
        if k == "switch":
            return SwitchPort.UPLINK
        if k == "ring":
            fwd = (dst - cur) % self.n
            if fwd == self.n - fwd:     # both ways equally short: take the faster first link
                nxt, prv = (self.link_params[(cur, p)].rate_bps
                            for p in (RingPort.NEXT, RingPort.PREV))
                return RingPort.PREV if prv > nxt else RingPort.NEXT
            return RingPort.NEXT if fwd < self.n - fwd else RingPort.PREV
        x_dim, y_dim = self.dims
        cx, cy, tx, ty = cur % x_dim, cur // x_dim, dst % x_dim, dst // x_dim
        if cx != tx:
            return self._dim_port(cx, tx, x_dim, MeshPort.X_PLUS, MeshPort.X_MINUS)
        return self._dim_port(cy, ty, y_dim, MeshPort.Y_PLUS, MeshPort.Y_MINUS)

    def _dim_port(self, c: int, t: int, size: int, plus: int, minus: int) -> int:
        if self.base_kind == "torus":
            fwd = (t - c) % size
            return plus if fwd <= size - fwd else minus
        return plus if t > c else minus

    def path(self, src: int, dst: int) -> list:
        """Directed links from ``src`` to ``dst``."""
        if src == dst:
            return []
        if self.base_kind == "switch":
            return [(src, SwitchPort.UPLINK), (SWITCH, dst)]
        out, cur = [], src
        for _ in range(self.n * 4):
            port = self.next_port(cur, dst)
            out.append((cur, port))
            cur = self.neighbour(cur, port)
            if cur == dst:
                return out
        raise AssertionError("routing loop")  # pragma: no cover

    @cached_property
    def _hops(self) -> list[list[int]]:
        hop = [[0] * self.n for _ in range(self.n)]
        for a in range(self.n):
            for b in range(self.n):
                if a != b:
                    hop[a][b] = 1 if self.base_kind == "switch" else len(self.path(a, b))
        return hop

    def hops(self, a: int, b: int) -> int:
        """Distance ``h`` in hops (a switch traversal is one hop)."""
        return self._hops[a][b]

    @cached_property
    def diameter(self) -> int:
        return max((max(r) for r in self._hops), default=0)

    @cached_property
    def mean_hops(self) -> float:
        """Average distance between two distinct nodes."""
        if self.n < 2:
            return 0.0
        return sum(map(sum, self._hops)) / (self.n * (self.n - 1))

    def path_latency(self, src: int, dst: int) -> float:
        return sum(self.link_params[lk].latency_s for lk in self.path(src, dst))

    def tree(self, src: int, dests) -> Tree:
        """Union of the routes from ``src`` to every node of ``dests`` (a tree, see module doc)."""
        dests = tuple(sorted(set(dests) - {src}))
        key = (src, dests)
        if key in self._trees:
            return self._trees[key]
        links: set = set()
        out_ports: dict[int, set] = {}
        depth, lat = 0, 0.0
        for d in dests:
            p = self.path(src, d)
            links.update(p)
            for a, port in p:
                if a != SWITCH:
                    out_ports.setdefault(a, set()).add(port)
            depth = max(depth, self.hops(src, d))
            lat = max(lat, sum(self.link_params[lk].latency_s for lk in p))
        tree = Tree(src, dests, frozenset(links),
                    {k: frozenset(v) for k, v in out_ports.items()}, depth, lat)
        self._trees[key] = tree
        return tree

    def describe(self) -> str:
        kinds = sorted({(p.name, p.rate_bps, p.latency_s) for p in self.link_params.values()})
        ls = ", ".join(f"{nm} {r / 1e9:g} Gb/s {lat * 1e6:g} us" for nm, r, lat in kinds)
        shape = f" {self.dims[0]}x{self.dims[1]}" if self.dims else ""
        return f"{self.kind}{shape}, {self.n} nodes; links: {ls or 'none'}"


TOPOLOGIES = ("ring", "mesh", "torus", "switch", "kr260-ring", "kr260-switch")


def _grid(n: int, dims: tuple[int, int] | None) -> tuple[int, int]:
    if dims is None:
        y = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
        return n // y, y
    if dims[0] * dims[1] != n:
        raise ValueError(f"mesh dims {dims[0]}x{dims[1]} do not match {n} nodes")
    return dims


def make_topology(kind: str, n: int, link: LinkParams = SFP_10G,
                  dims: tuple[int, int] | None = None) -> Topology:
    """Build a topology; ``link`` applies to every link except for the ``kr260-*`` kinds."""
    if kind not in TOPOLOGIES:
        raise ValueError(f"unknown topology {kind!r} (one of {', '.join(TOPOLOGIES)})")
    if n < 1:
        raise ValueError("the cluster needs at least one node")
    links: dict = {}
    base = kind.split("-")[-1]
    if base == "switch":
        lp = SFP_10G if kind == "kr260-switch" else link
        if n > 1:
            for a in range(n):
                links[(a, SwitchPort.UPLINK)] = lp
                links[(SWITCH, a)] = lp
        return Topology(kind, n, links)
    if base == "ring":
        if n > 1:
            for a in range(n):
                # Cable a <-> a+1: on a KR260 ring the SFP+ cage pairs boards (0,1), (2,3), ...
                # and every other cable (including the wrap) is 1G RGMII.
                lp = link
                if kind == "kr260-ring":
                    lp = SFP_10G if a % 2 == 0 and a + 1 < n else RGMII_1G
                links[(a, RingPort.NEXT)] = lp
                links[((a + 1) % n, RingPort.PREV)] = lp
        return Topology(kind, n, links)
    x_dim, y_dim = _grid(n, dims)
    for a in range(n):
        x, y = a % x_dim, a // x_dim
        for port, ok in ((MeshPort.X_PLUS, x + 1 < x_dim), (MeshPort.X_MINUS, x > 0),
                         (MeshPort.Y_PLUS, y + 1 < y_dim), (MeshPort.Y_MINUS, y > 0)):
            size = x_dim if port in (MeshPort.X_PLUS, MeshPort.X_MINUS) else y_dim
            if ok or (base == "torus" and size > 1):
                links[(a, port)] = link
    assert max((p for _, p in links), default=0) < NET_PORTS
    return Topology(kind, n, links, (x_dim, y_dim))


@dataclass(frozen=True)
class ClusterSpec:
    """N nodes, per-node KV budget ``S_node``, KV propagation buffer ``M_buf``, compute rate and
    the network. Compute: ``P_node = ops_per_dsp_cycle · dsps · clock_hz · compute_eff`` (2 INT4
    MACs per DSP48E2 per cycle = 4 operations)."""
    nodes: int
    kv_budget: int                 # S_node, bytes
    buffer: int                    # M_buf, bytes
    topology: Topology
    dsps: int = K26["DSP"]         # the whole K26 (mcf.abi.platform)
    clock_hz: float = ACLK_HZ      # the assumed aclk (mcf.abi.platform)
    ops_per_dsp_cycle: int = 4
    compute_eff: float = 1.0
    link_eff: float = 0.9          # payload share of the line rate (framing, CRC, gaps)
    gamma: float = 1.0             # eq 8 overlap safety factor
    t_meta_s: float = 0.5e-6       # host cost per metadata record (ring entry; one doorbell/batch)
    scope: str = "model"           # "model": linear + attention of all layers; "attention"
    max_payload: int = MAX_PAYLOAD  # largest packet payload (B), at most the ABI's MAX_PAYLOAD
    # open reductions per reduction engine: the node configuration's (``make_cluster`` takes it
    # from the configuration it is given; a bare ClusterSpec describes sim nodes)
    reduce_slots: int = SIM.reduce_slots
    node_config: str = SIM.name
    # shape of decode's state-reduction trees (mcf.mars.routes.REDUCE_SHAPES): "tree" (the
    # query broadcast tree reversed, fewest hops) or "chain" (rings: every engine merges at most
    # two states, so the merged bits do not depend on arrival order)
    decode_reduce: str = "tree"

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ValueError("N must be >= 1")
        if self.nodes > 1 << META["src"].width:
            raise ValueError(f"{self.nodes} nodes do not fit Meta.src/dst "
                             f"({META['src'].width} bits: at most {1 << META['src'].width})")
        if self.topology.n != self.nodes:
            raise ValueError("topology node count differs from N")
        if self.scope not in ("model", "attention"):
            raise ValueError("scope must be 'model' or 'attention'")
        if not 1 <= self.max_payload <= MAX_PAYLOAD:
            raise ValueError(f"the largest payload must lie in 1..{MAX_PAYLOAD} B "
                             f"(mcf.abi.framing.MAX_PAYLOAD), got {self.max_payload}")
        if self.decode_reduce not in ("tree", "chain"):
            raise ValueError(f"decode reduction {self.decode_reduce!r}: 'tree' or 'chain'")
        if self.decode_reduce == "chain" and self.topology.base_kind != "ring" \
                and self.nodes > 2:
            raise ValueError("a chain decode reduction needs a ring (neighbours in id order)")
        cfg = NODE_CONFIGS.get(self.node_config)
        if cfg is None:
            raise ValueError(f"unknown node configuration {self.node_config!r} "
                             f"(one of {', '.join(NODE_CONFIGS)})")
        cap = min(cfg.reduce_slots, MAX_REDUCE_SLOTS)
        if not 1 <= self.reduce_slots <= cap:
            raise ValueError(f"reduction slots must lie in 1..{cap} (the {cfg.name} node's "
                             f"reduction engine), got {self.reduce_slots}")
        if not self.p_node > 0:
            raise ValueError("the compute rate must be positive (DSPs, clock, efficiency)")
        if not 0 < self.link_eff <= 1 or not self.gamma > 0 or self.t_meta_s < 0:
            raise ValueError("link efficiency must lie in (0, 1], gamma must be positive")
        for lp in self.topology.link_params.values():
            if not lp.rate_bps > 0 or lp.latency_s < 0:
                raise ValueError("link rates must be positive and latencies non-negative")

    @property
    def p_node(self) -> float:
        """Effective compute throughput of one node, operations per second."""
        return self.ops_per_dsp_cycle * self.dsps * self.clock_hz * self.compute_eff

    def link_bytes_per_s(self, link) -> float:
        return self.topology.link_params[link].rate_bps / 8 * self.link_eff

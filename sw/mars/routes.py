"""Route-id allocation and route-table programming for the NIC router (paper §5).

Route ids are ``Meta.route_id`` values (``META['route_id']`` bits, :data:`ROUTE_TABLE_DEPTH`
entries per node); every node's table maps a route id to a :func:`mcf.abi.route.route_entry`
(ports to send on, deliver locally or not).

* ``0 .. N−1`` — **static unicast** routes: route ``d`` leads to node ``d`` from anywhere (the
  routing of :mod:`mcf.mars.cluster` depends only on the current node and ``d``). Programmed once.
* two **banks** of multicast-tree ids after them, used by alternate chunk steps: the trees of
  step ``c`` live in bank ``c mod 2`` and are written while step ``c − 1`` (which uses the other
  bank) is still running, so no in-flight packet ever sees its entry change. Within a step, one
  id per distinct ``(source, destination set)``. If a step needs more trees than a bank holds,
  the overflowing transfers fall back to one unicast per destination (counted, never silent).
* switch topology: a tree's source sends once on the uplink and the switch copies the packet to
  the members of the multicast group named by the route id (``switch_groups``).
* decode's **state-reduction trees** (:data:`REDUCE_SHAPES`): ``tree`` is the query broadcast
  tree reversed (fewest hops; on a ring the root merges its own state and two children's);
  ``chain`` walks a ring from the root's far side, ``root+N−1 → … → root+1 → root``, one hop
  each, so every reduction engine merges at most two states. ``merge_state`` of two states is
  commutative bit for bit but not associative, and an engine merges in arrival order, so only
  the chain gives the same bits whatever the arrival order (the RTL cluster runs use it; it costs
  ``N−1`` hops instead of ``⌈(N−1)/2⌉``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..abi.route import ROUTE_TABLE_DEPTH, route_entry
from .cluster import SWITCH, Topology

__all__ = ["RouteAllocator", "RouteError", "StepRoutes", "REDUCE_SHAPES"]

REDUCE_SHAPES = ("tree", "chain")


class RouteError(ValueError):
    """The plan needs more route ids than ``Meta.route_id`` can name."""


@dataclass
class StepRoutes:
    entries: list           # (node, route_id, packed route_entry)
    switch_groups: list     # (route_id, (member nodes, ...))
    trees: int
    fallbacks: int          # multicast transfers split into unicasts (bank full)


class RouteAllocator:
    def __init__(self, topo: Topology, depth: int = ROUTE_TABLE_DEPTH, reduce_shape: str = "tree"):
        if reduce_shape not in REDUCE_SHAPES:
            raise ValueError(f"reduction shape {reduce_shape!r}: one of {REDUCE_SHAPES}")
        if reduce_shape == "chain" and topo.base_kind != "ring" and topo.n > 2:
            raise ValueError("a chain reduction needs a ring (neighbours in id order)")
        self.topo = topo
        self.reduce_shape = reduce_shape
        n = topo.n
        if n > depth:
            raise RouteError(f"{n} nodes need {n} unicast route ids; Meta.route_id names only "
                             f"{depth}")
        self.bank_size = (depth - n) // 2
        if self.bank_size < 1:
            raise RouteError(f"no route ids left for multicast trees with {n} nodes")

    def unicast(self, dst: int) -> int:
        return dst

    def bank_base(self, step: int) -> int:
        return self.topo.n + (step % 2) * self.bank_size

    def static_entries(self) -> list[tuple[int, int, int]]:
        topo, out = self.topo, []
        for node in range(topo.n):
            for dst in range(topo.n):
                if node == dst:
                    out.append((node, self.unicast(dst), route_entry(local=True)))
                else:
                    out.append((node, self.unicast(dst),
                                route_entry({int(topo.next_port(node, dst))})))
        return out

    def tree_entries(self, route_id: int, tree) -> list[tuple[int, int, int]]:
        nodes = sorted(set(tree.out_ports) | set(tree.dests))
        return [(v, route_id, route_entry({int(p) for p in tree.out_ports.get(v, ())},
                                          local=v in tree.dests)) for v in nodes]

    def assign(self, step: int, transfers: list) -> tuple[list, StepRoutes]:
        """Give every transfer a route id; returns the (possibly split) transfers and the
        table entries to program for this step's bank."""
        topo = self.topo
        base = self.bank_base(step)
        ids: dict = {}
        out, fallbacks = [], 0
        for t in transfers:
            if len(t.dests) == 1:
                out.append(replace(t, route_id=self.unicast(t.dests[0])))
                continue
            key = (t.src, t.dests)
            if key not in ids and len(ids) < self.bank_size:
                ids[key] = base + len(ids)
            if key in ids:
                out.append(replace(t, route_id=ids[key]))
                continue
            fallbacks += 1
            for d in t.dests:
                tree = topo.tree(t.src, [d])
                out.append(replace(t, dests=(d,), tree=tree, route_id=self.unicast(d),
                                   latency_s=t.latency_s - t.tree.latency_s + tree.latency_s))
        entries, groups = [], []
        for (src, dests), rid in ids.items():
            tree = topo.tree(src, dests)
            entries += self.tree_entries(rid, tree)
            if any(a == SWITCH for a, _ in tree.links):
                groups.append((rid, dests))
        return out, StepRoutes(entries, groups, len(ids), fallbacks)

    def decode_trees(self, step: int) -> tuple[dict, dict, StepRoutes]:
        """Route ids of the decode query broadcast tree and the state-reduction tree of every
        root, in the bank of ``step``. The reduction tree is the broadcast tree reversed: each
        node sends towards its parent; the root delivers locally."""
        topo, n = self.topo, self.topo.n
        if 2 * n > self.bank_size:
            raise RouteError(f"decode needs {2 * n} tree ids; a bank holds {self.bank_size}")
        base = self.bank_base(step)
        bcast, reduce_ = {}, {}
        entries, groups = [], []
        for root in range(n):
            bcast[root] = base + root
            reduce_[root] = base + n + root
            if n > 1:
                tree = topo.tree(root, [d for d in range(n) if d != root])
                entries += self.tree_entries(bcast[root], tree)
                if any(a == SWITCH for a, _ in tree.links):
                    groups.append((bcast[root], tree.dests))
            for node in range(n):
                if node == root:
                    entries.append((node, reduce_[root], route_entry(local=True)))
                else:
                    parent = self.parent(root, node)
                    entries.append((node, reduce_[root],
                                    route_entry({int(topo.next_port(node, parent))})))
        return bcast, reduce_, StepRoutes(entries, groups, 2 * n, 0)

    def parent(self, root: int, node: int) -> int:
        """Where ``node`` sends its decode state for ``root``: the node before it on the route
        from ``root`` (the root itself on a switch) — or, for the ``chain`` shape, its ring
        neighbour ``node − 1`` (the root for ``root + 1``)."""
        if self.reduce_shape == "chain" and self.topo.n > 2:
            return (node - 1) % self.topo.n
        if self.topo.base_kind == "switch":
            return root
        prev = root
        for a, port in self.topo.path(root, node):
            nxt = self.topo.neighbour(a, port)
            if nxt == node:
                return a
            prev = nxt
        return prev

    def children(self, root: int) -> dict[int, int]:
        """Number of reduction children of every node in the tree of ``root``."""
        count = dict.fromkeys(range(self.topo.n), 0)
        for node in range(self.topo.n):
            if node != root:
                count[self.parent(root, node)] += 1
        return count

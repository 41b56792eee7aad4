"""Mesh-aware replica placement and nearest-replica sources (paper §4 eq 14, 17–19, 25).

Every node consumes every historical KV slice in every later chunk, so the replica set of a slice
should minimise the distance from all nodes to their nearest copy (a k-median): the holders are
chosen greedily, one at a time, minimising first the total distance ``Σ_n h_near(n)`` (remote
access, eq 19), then the edges of the multicast tree from the owner (replication, eq 17), then
its depth (critical path, eq 25). Greedy sets are nested (the set for ``r`` extends the set for
``r − 1``), so shrinking a replica factor drains the last-added holders first and the remaining
copies stay well spread. Ties break on ``(node − owner) mod N`` so placements on a ring or torus
are rotations of each other and every node receives the same number of replicas.
"""

from __future__ import annotations

from functools import lru_cache

from .cluster import Topology

__all__ = ["holder_set", "assign_sources", "access_cost"]


def access_cost(topo: Topology, holders) -> int:
    """``Σ_n min_{h∈holders} hops(n, h)`` over all nodes."""
    return sum(min(topo.hops(n, h) for h in holders) for n in range(topo.n))


def holder_set(topo: Topology, owner: int, k: int, allowed: frozenset | None = None,
               keep: tuple[int, ...] = ()) -> tuple[int, ...]:
    """Up to ``k`` holders (owner first) chosen greedily among ``allowed`` (default: all).
    ``keep`` lists holders already chosen (after the owner) that stay first in the order."""
    return _holder_set(topo, owner, k, allowed, tuple(keep))


@lru_cache(maxsize=65536)
def _holder_set(topo, owner, k, allowed, keep):
    n = topo.n
    chosen = [owner] + [h for h in keep if h != owner]
    pool = set(range(n) if allowed is None else allowed) - set(chosen)
    while len(chosen) < k and pool:
        def score(x, chosen=chosen):
            cand = chosen + [x]
            tree = topo.tree(owner, cand)
            return (access_cost(topo, cand), tree.edges, tree.depth, (x - owner) % n)
        best = min(pool, key=score)
        chosen.append(best)
        pool.remove(best)
    return tuple(chosen[:max(k, 1)])


def assign_sources(topo: Topology, sources, requesters) -> dict[int, list[int]]:
    """Nearest source for every requester (ties: the first source after the requester, cyclic
    — spreads load over equidistant copies). Returns ``{source: [requesters]}``."""
    return {s: list(rs) for s, rs in _assign(topo, tuple(sources), tuple(requesters))}


@lru_cache(maxsize=65536)
def _assign(topo, sources, requesters):
    n = topo.n
    out: dict[int, list[int]] = {}
    for r in requesters:
        s = min(sources, key=lambda s: (topo.hops(r, s), (s - r) % n))
        out.setdefault(s, []).append(r)
    return tuple((s, tuple(rs)) for s, rs in sorted(out.items()))

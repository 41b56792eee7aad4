"""Cost model (paper §4 eq 6, 7, 17–25) evaluated on a scheduled plan, plus the closed forms.

Per chunk step ``c``:

* ``T_comp(c)`` — the busiest node's operations over ``P_node``: attention ``4·L·H_q·d`` per
  (query, key) pair under the causal mask (eq 6 counts the full ``B × cB`` rectangle; we count
  the causal keys of each node's own tokens), plus, with ``scope="model"``, the linear layers
  (2 operations per weight per token).
* ``T_comm(c)`` — eq 25 realised on the network: every transfer loads each directed link of its
  route tree with its bytes; the busiest link over its effective rate (``rate · link_eff``)
  replaces ``(C_rep + C_access)/BW_eff``, and the slowest route's accumulated link latency
  replaces ``D_crit·h`` (for ring streaming, the whole hop chain).
* ``T_sync(c)`` — a barrier across the network diameter plus pushing the step's metadata
  records to the PL (``t_meta_s`` each, the busiest node).
* ``T_chunk(c) = max(T_comp, T_comm) + T_sync`` (eq 24); ``TTFT = Σ_c T_chunk`` (eq 23).
* ``C_rep(c)`` / ``C_access(c)`` — bytes × hops (eq 17, 19): every tree edge is one copy on a
  link; a node→switch→node hop counts once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from .cluster import ClusterSpec
from .layout import causal_keys
from .model import ModelSpec

__all__ = ["StepCost", "step_cost", "t_attn_eq6", "c_rep", "c_access", "c_ring", "c_full",
           "c_mars", "link_loads"]


@dataclass(frozen=True)
class StepCost:
    t_comp: float
    t_comm: float
    t_sync: float
    t_chunk: float
    rep_bytes: int          # C_rep(c): bytes × hops
    access_bytes: int       # C_access(c): bytes × hops
    handoff_bytes: int
    rep_payload: int        # bytes delivered into replica memory
    access_payload: int     # bytes delivered into communication buffers
    bottleneck: str         # busiest link
    records: int            # metadata records on the busiest node


def link_loads(transfers) -> dict:
    loads: dict = defaultdict(int)
    for t in transfers:
        for link in t.tree.links:
            loads[link] += t.nbytes
    return loads


def _link_name(link) -> str:
    a, b = link
    return f"switch->{b}" if a == -1 else f"{a}:port{b}"


def step_cost(model: ModelSpec, cluster: ClusterSpec, ranges, transfers, records: int) -> StepCost:
    p = cluster.p_node
    comp = 0.0
    for rg in ranges:
        tokens = sum(b - a for a, b in rg)
        ops = model.attn_ops_per_pair * causal_keys(rg)
        if cluster.scope == "model":
            ops += model.linear_ops_per_token * tokens
        comp = max(comp, ops / p)
    loads = link_loads(transfers)
    t_bw, worst = 0.0, ""
    for link, nbytes in loads.items():
        t = nbytes / cluster.link_bytes_per_s(link)
        if t > t_bw:
            t_bw, worst = t, _link_name(link)
    t_lat = max((t.latency_s for t in transfers), default=0.0)
    comm = t_bw + t_lat
    topo = cluster.topology
    barrier = max((topo.path_latency(a, b) for a in range(topo.n) for b in range(topo.n)),
                  default=0.0)
    sync = barrier + cluster.t_meta_s * records
    kinds = defaultdict(int)
    payload = defaultdict(int)
    for t in transfers:
        kinds[t.kind] += t.nbytes * t.tree.edges
        payload[t.kind] += t.nbytes * len(t.dests)
    return StepCost(comp, comm, sync, max(comp, comm) + sync, kinds["replica"], kinds["access"],
                    kinds["handoff"], payload["replica"], payload["access"], worst, records)


def t_attn_eq6(model: ModelSpec, cluster: ClusterSpec, chunk: int, c: int) -> float:
    """Eq 6: ``T_attn(B, c) = 4·L·H_q·d·B·cB / (N·P_node)``."""
    return model.attn_ops_per_pair * chunk * c * chunk / (cluster.nodes * cluster.p_node)


# --- closed forms (uniform hop costs) --------------------------------------------------------

def c_rep(m_chunk: int, r: int, h_dis: float) -> float:
    """Eq 17: ``C_rep(c) = M_chunk·(r(c) − 1)·h_dis``."""
    return m_chunk * (r - 1) * h_dis


def c_access(m_chunk: int, nodes: int, factors, h_near) -> float:
    """Eq 19: ``C_access(c) = Σ_{i≤c} M_chunk·(N − r(i))·h_near(i)`` for the blocks ``i ≤ c``
    with replica factors ``factors`` and distances ``h_near`` (a number or one per block)."""
    hs = h_near if isinstance(h_near, (list, tuple)) else [h_near] * len(factors)
    return sum(m_chunk * (nodes - r) * h for r, h in zip(factors, hs))


def c_mars(m_chunk: int, nodes: int, factors, h_dis: float, h_near: float) -> float:
    """Eq 18 + eq 20: ``Σ_c C_rep(c) + Σ_c C_access(c)`` with every block keeping ``r(i)``."""
    rep = sum(c_rep(m_chunk, r, h_dis) for r in factors)
    acc = sum(c_access(m_chunk, nodes, factors[:c], h_near) for c in range(1, len(factors) + 1))
    return rep + acc


def c_ring(m_chunk: int, nodes: int, num_chunks: int, h_ring: float) -> float:
    """Eq 21: ``C_ring = M_chunk·(N − 1)·h_ring·C(C + 1)/2``."""
    return m_chunk * (nodes - 1) * h_ring * num_chunks * (num_chunks + 1) / 2


def c_full(m_chunk: int, nodes: int, num_chunks: int, h_dis: float) -> float:
    """Eq 22: ``C_full = M_chunk·(N − 1)·h_dis·C``."""
    return m_chunk * (nodes - 1) * h_dis * num_chunks

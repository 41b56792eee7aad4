"""MARS — memory-aware replication and scheduling (paper §4) as a host-side planner.

Pure Python (numpy-free core), Python 3.10. The planner turns a model shape and a cluster
description into a chunk-by-chunk schedule: replica factors (eq 11–16, 29), replica placement and
multicast routes on the network, the replica directory's valid → draining → invalid lifecycle,
the per-node ABI metadata streams and route-table programming, and the cost model (eq 17–25)
with the ring / zigzag / full-replication / PD-disaggregation baselines.

    from mcf.mars import plan, get_model, make_cluster
    p = plan(get_model("qwen2.5-1.5b"), make_cluster(8, 64, node_config="kr260"), 16384,
             chunk=1024, policy="mars", alpha=0.5)
"""

from __future__ import annotations

from ..abi.node_config import NODE_CONFIGS, NodeConfig
from .chunking import ChunkChoice, choose_chunk, t_prop
from .cluster import (
    RGMII_1G,
    SFP_10G,
    SWITCH,
    TOPOLOGIES,
    ClusterSpec,
    LinkParams,
    Topology,
    make_topology,
)
from .cost import StepCost, c_access, c_full, c_mars, c_rep, c_ring, t_attn_eq6
from .directory import CopyState, Directory, InvariantError
from .metadata import (
    InvalidateKind,
    MetaEncoder,
    Payloads,
    Record,
    ReduceEntry,
    pack_fast,
    payloads,
)
from .model import KV_ELEMENT_BYTES, MODELS, ModelSpec, get_model
from .plan import Plan, Totals, plan
from .replicas import m_node_avg, r_feasible, r_mem, r_reuse, replica_factor
from .routes import RouteAllocator, RouteError
from .schedule import POLICIES, PlanError, Step, Transfer
from .setting import Setting, board_setting, get_setting, paper_setting

__all__ = [
    "plan", "Plan", "Totals", "Step", "Transfer", "PlanError", "POLICIES",
    "ModelSpec", "MODELS", "KV_ELEMENT_BYTES", "get_model",
    "ClusterSpec", "Topology", "LinkParams", "make_topology", "make_cluster", "TOPOLOGIES",
    "SWITCH", "SFP_10G", "RGMII_1G",
    "ChunkChoice", "choose_chunk", "t_prop", "t_attn_eq6",
    "r_mem", "r_feasible", "r_reuse", "replica_factor", "m_node_avg",
    "c_rep", "c_access", "c_mars", "c_ring", "c_full", "StepCost",
    "Directory", "CopyState", "InvariantError",
    "MetaEncoder", "Record", "InvalidateKind", "pack_fast", "Payloads", "payloads",
    "ReduceEntry",
    "RouteAllocator", "RouteError",
    "Setting", "paper_setting", "board_setting", "get_setting",
]

MIB = 2 ** 20


def make_cluster(nodes: int, kv_budget_mib: float, *, node_config: str | NodeConfig,
                 buffer_mib: float = 8, topology: str = "kr260-ring", link_gbps: float = 10.0,
                 link_latency_us: float = 2.0, mesh_dims: tuple[int, int] | None = None,
                 **kw) -> ClusterSpec:
    """A :class:`ClusterSpec` from everyday units (MiB, Gb/s, µs). ``kv_budget_mib`` is
    ``S_node`` (eq 10; :mod:`mcf.mars.setting` has the paper's and the board's);
    ``node_config`` (a :class:`mcf.abi.node_config.NodeConfig` or its name) gives the
    reduction engine's slots and the largest payload (``reduce_slots`` / ``max_payload`` may
    lower them). ``link_*`` apply to the uniform topologies (``ring``, ``mesh``, ``torus``,
    ``switch``); ``kr260-*`` use the board's own links. Extra keywords go to
    :class:`ClusterSpec` (``dsps``, ``clock_hz``, ``scope``, …)."""
    if nodes < 1:
        raise PlanError(f"N must be >= 1 (got {nodes})")
    if not (0 < kv_budget_mib < float("inf") and 0 < buffer_mib < float("inf")):
        raise PlanError("the KV budget and the buffer must be positive and finite")
    if isinstance(node_config, str):
        if node_config not in NODE_CONFIGS:
            raise PlanError(f"unknown node configuration {node_config!r} "
                            f"(one of {', '.join(NODE_CONFIGS)})")
        node_config = NODE_CONFIGS[node_config]
    kw.setdefault("reduce_slots", node_config.reduce_slots)
    kw.setdefault("max_payload", node_config.max_payload)
    try:
        topo = make_topology(topology, nodes, LinkParams(link_gbps * 1e9, link_latency_us * 1e-6,
                                                         f"{link_gbps:g}G"), mesh_dims)
        return ClusterSpec(nodes, int(kv_budget_mib * MIB), int(buffer_mib * MIB), topo,
                           node_config=node_config.name, **kw)
    except ValueError as exc:
        raise PlanError(str(exc)) from None

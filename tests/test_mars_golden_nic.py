"""MARS route tables and decode reduction configs run through the NIC's golden models
(``mcf.golden.nic``: RouterModel, ReduceModel): every prefill packet reaches exactly the nodes
MARS planned, and the decode partial states of all nodes merge at the token's owner."""

import random
from collections import deque

import numpy as np
import pytest

from mcf.abi import Op
from mcf.abi.route import NET_PORTS
from mcf.abi.softmax import SCORE_FRAC, pack_state, unpack_state
from mcf.mars import ClusterSpec, get_model, make_topology, plan

nic = pytest.importorskip("mcf.golden.nic")
from mcf.abi.nic import reduce_config  # noqa: E402

TINY = get_model("tiny")


def router_ports(topo) -> int:
    return {"switch": 1, "ring": 2}.get(topo.base_kind, NET_PORTS)


def routers(p, entries):
    topo = p.cluster.topology
    out = [nic.RouterModel(router_ports(topo), p.encoder.max_payload)
           for _ in range(p.cluster.nodes)]
    for node, rid, entry in p.static_routes() + list(entries):
        out[node].write_route(rid, entry)
    return out


def hop(topo, groups, node, port, meta):
    if topo.base_kind == "switch":
        return list(groups.get(meta.route_id, (meta.dst,)))
    return [topo.neighbour(node, port)]


def deliver(p, rts, groups, src, meta):
    topo = p.cluster.topology
    got, todo, seen = set(), [src], set()
    while todo:
        v = todo.pop()
        assert v not in seen
        seen.add(v)
        dest = rts[v].route(meta)
        assert not isinstance(dest, str), f"router of node {v} dropped: {dest}"
        for d in dest:
            if d == "local":
                if v != src:
                    got.add(v)
            else:
                todo += hop(topo, groups, v, d, meta)
    return got


@pytest.mark.parametrize("topo", ["kr260-ring", "torus", "mesh", "switch"])
@pytest.mark.parametrize("policy", ["mars", "zigzag", "pd"])
def test_prefill_packets_reach_the_planned_nodes(topo, policy):
    n = 6
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology(topo, n))
    p = plan(TINY, cl, 24 * 6, 24, policy, alpha=1)
    enc = p.encoder
    for step in p.steps:
        rts = routers(p, step.routes.entries)
        groups = dict(step.routes.switch_groups)
        planned = {}
        for t in step.transfers:
            planned.setdefault((t.src, t.block, t.slice, t.route_id), set()).update(t.dests)
        checked = 0
        for rec in p.step_records(step.index):
            m = rec.meta
            if m.op != Op.KV_REPLICA or m.seq:
                continue
            _, block, slice_ = enc.kv_key(m.kv_id)
            want = planned[(m.src, block, slice_, m.route_id)]
            assert deliver(p, rts, groups, m.src, m) == want
            checked += 1
        assert checked or n == 1


@pytest.mark.parametrize("topo", ["kr260-ring", "torus", "switch"])
def test_decode_states_merge_at_the_owner(topo):
    n = 5
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology(topo, n))
    p = plan(TINY, cl, 20 * 4, 20, "mars", alpha=1)
    k = 3
    streams, configs = p.decode_metadata(k)
    bcast, reduce_, routes = p.decode_routes()
    rts = routers(p, routes.entries)
    groups = dict(routes.switch_groups)
    engines = [nic.ReduceModel(64, 4096, local_id=v) for v in range(n)]
    for node, rid, contributors in configs:
        engines[node].write_config(rid, reduce_config(contributors))
    root = p.decode_owner(k)
    rng = random.Random(7)
    d = TINY.head_dim
    own, events = {}, deque()
    for node, metas in streams.items():
        for m in metas:
            if m.op == Op.QUERY:
                assert deliver(p, rts, groups, node, m) == set(range(n)) - {root}
                continue
            state = (rng.randrange(-2000, 2000), rng.randrange(1 << 16, 1 << 20),
                     np.array([rng.randrange(-(1 << 20), 1 << 20) for _ in range(d)]))
            own[(node, m.kv_id, m.seq)] = state
            events.append((node, m, pack_state(*state)))
    results = {}
    while events:
        node, meta, payload = events.popleft()
        out = engines[node].contribute(meta, payload)
        assert not isinstance(out, str), f"reduction engine of node {node} dropped: {out}"
        if out is None:
            continue
        dest = rts[node].route(out.meta)
        for dd in dest:
            if dd == "local":
                assert node == root
                results[(out.meta.kv_id, out.meta.seq)] = out.payload
            else:
                (nxt,) = [v for v in hop(p.cluster.topology, groups, node, dd, out.meta)
                          if v != node] or [node]
                events.append((nxt, out.meta, out.payload))
    assert len(results) == TINY.layers * TINY.q_heads
    for (tag, layer), payload in results.items():
        m, l_sum, _ = unpack_state(payload, d)
        parts = [own[(v, tag, layer)] for v in range(n)]
        assert m == max(s[0] for s in parts)
        ref = sum(s[1] * 2.0 ** ((s[0] - m) / (1 << SCORE_FRAC)) for s in parts)
        assert l_sum == pytest.approx(ref, rel=1e-3, abs=n)

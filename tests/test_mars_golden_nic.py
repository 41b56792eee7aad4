"""MARS route tables and decode reduction configs run through the NIC's golden models
(``mcf.golden.nic``: RouterModel, ReduceModel, built with the ABI's MAX_PAYLOAD and
REDUCE_SLOTS): every prefill packet reaches exactly the nodes MARS planned, and the decode partial
states of all nodes merge at the token's owner — m, l and o checked — in any arrival order that
respects the plan's waits, without a reduction engine ever running out of slots."""

import random

import numpy as np
import pytest

from mcf.abi import Collective, Op, Port, ReduceOp, dispatch_port
from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.limits import REDUCE_SLOTS
from mcf.abi.query import QUERY_HEADER_BYTES, query_head_bytes
from mcf.abi.route import NET_PORTS
from mcf.abi.softmax import SCORE_FRAC, STATE_O, pack_state, unpack_state
from mcf.golden import nic
from mcf.mars import ClusterSpec, ModelSpec, get_model, make_topology, plan

TINY = get_model("tiny")
H12 = ModelSpec("h12", layers=2, q_heads=12, kv_heads=2, head_dim=128)   # Qwen2.5 heads, 2 layers


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


def run_decode(p, k, seed, states, honour_waits=True):
    """Play decode token ``k``'s records through routers and reduction engines in a random
    order that respects the data dependencies (a node sends a head's state only once it has that
    head's query; the root pushes a query only after ``Record.wait`` results, unless
    ``honour_waits`` is False). ``states[(node, head, layer)]`` is each contribution.
    Returns (results {(kv_id, layer): payload} at the root, the most slots ever open in one
    engine, drop causes)."""
    n, model = p.cluster.nodes, p.model
    _, _, routes = p.decode_routes()
    rts = routers(p, routes.entries)
    groups = dict(routes.switch_groups)
    engines = [nic.ReduceModel(REDUCE_SLOTS, MAX_PAYLOAD, local_id=v) for v in range(n)]
    for cfg in p.decode_reduce_configs(k):
        engines[cfg.node].write_config(cfg.route_id, cfg.entry())
    root = p.decode_owner(k)
    streams = {v: [r for r in p.decode_records(k) if r.node == v] for v in range(n)}
    ptr = dict.fromkeys(range(n), 0)
    has_query = {v: set() for v in range(n)}
    if n == 1:
        has_query[root] = {(layer, h) for layer in range(model.layers)
                           for h in range(model.q_heads)}
    rng = random.Random(seed)
    results, drops, network, peak = {}, [], [], 0

    def head_of(meta):
        return (meta.kv_id - k * model.q_heads) % (1 << 16)

    def can_push(v):
        if ptr[v] >= len(streams[v]):
            return False
        r = streams[v][ptr[v]]
        if r.meta.op == Op.QUERY:
            return not honour_waits or len(results) >= r.wait
        return (r.meta.seq, head_of(r.meta)) in has_query[v]

    while True:
        choices = [("push", v) for v in range(n) if can_push(v)]
        choices += [("net", i) for i in range(len(network))]
        if not choices:
            break
        kind, x = rng.choice(choices)
        if kind == "push":
            r = streams[x][ptr[x]]
            ptr[x] += 1
            m = r.meta
            assert m.length <= MAX_PAYLOAD
            if m.op == Op.QUERY:
                count = (m.length - QUERY_HEADER_BYTES) // query_head_bytes(model.head_dim)
                heads = {(m.seq, head_of(m) + i) for i in range(count)}
                assert deliver(p, rts, groups, x, m) == set(range(n)) - {root}
                has_query[x] |= heads
                network += [("query", v, heads) for v in range(n) if v != root]
            else:
                network.append(("contrib", x, m, pack_state(*states[(x, head_of(m), m.seq)])))
            continue
        event = network.pop(x)
        if event[0] == "query":
            has_query[event[1]] |= event[2]
            continue
        _, node, meta, payload = event
        out = engines[node].contribute(meta, payload)
        peak = max(peak, sum(s is not None for s in engines[node].slots))
        if isinstance(out, str):
            drops.append(out)
            continue
        if out is None:
            continue
        final = out.meta.reduce_op == ReduceOp.NONE
        # only the root's engine marks its result final (mcf.abi.nic: never reduced again)
        assert final == (node == root)
        if final:
            assert out.meta.collective == Collective.MULTICAST
            assert dispatch_port(out.meta, node) == Port.FORWARD
            assert engines[node].contribute(out.meta, out.payload) == "drop_bad_op"
        else:
            assert out.meta.reduce_op == ReduceOp.SOFTMAX_MERGE
            assert dispatch_port(out.meta, node) == Port.REDUCTION
        for d in rts[node].route(out.meta):
            if d == "local":
                assert node == root and final
                results[(out.meta.kv_id, out.meta.seq)] = out.payload
            else:
                (nxt,) = [v for v in hop(p.cluster.topology, groups, node, d, out.meta)
                          if v != node] or [node]
                network.append(("contrib", nxt, out.meta, out.payload))
    assert all(e.slots == [None] * REDUCE_SLOTS for e in engines) or drops
    return results, peak, drops


def random_states(model, n, seed, same_m=False):
    rng = np.random.default_rng(seed)
    d = model.head_dim
    table = {}
    for v in range(n):
        for layer in range(model.layers):
            for h in range(model.q_heads):
                m = 100 * h - 300 if same_m else int(rng.integers(-600, 600))
                table[(v, h, layer)] = (m, int(rng.integers(1 << 16, 1 << 19)),
                                        rng.integers(-(1 << 20), 1 << 20, size=d))
    return table


def check_results(model, n, k, results, table, exact=False):
    """m exact; l and o against the float merge (``exact``: equal m, so exact integer sums)."""
    assert len(results) == model.layers * model.q_heads
    for (tag, layer), payload in results.items():
        head = (tag - k * model.q_heads) % (1 << 16)
        m, l_sum, o = unpack_state(payload, model.head_dim)
        parts = [table[(v, head, layer)] for v in range(n)]
        assert m == max(s[0] for s in parts)
        w = [2.0 ** ((s[0] - m) / (1 << SCORE_FRAC)) for s in parts]
        ref_l = sum(wi * s[1] for wi, s in zip(w, parts))
        ref_o = sum(wi * s[2].astype(np.float64) for wi, s in zip(w, parts))
        if exact:
            assert l_sum == ref_l and np.array_equal(o, ref_o.astype(np.int64))
            continue
        # each merge rounds a scaled term to 1 LSB and the exp LUT is within 2^-16 relative
        depth = n
        assert abs(l_sum - ref_l) <= depth * (ref_l * 2.0 ** -15 + 1)
        bound = depth * (np.abs(np.stack([s[2] for s in parts])).max() * 2.0 ** -15 + 1)
        assert np.abs(o - ref_o).max() <= bound


@pytest.mark.parametrize("model", [TINY, H12], ids=["tiny", "qwen-heads"])
@pytest.mark.parametrize("topo", ["kr260-ring", "torus", "switch"])
def test_decode_states_merge_at_the_owner(topo, model):
    n = 5
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology(topo, n))
    p = plan(model, cl, 20 * 4, 20, "mars", alpha=1)
    k = 3
    peaks = []
    for seed in range(3):
        table = random_states(model, n, seed)
        results, peak, drops = run_decode(p, k, seed, table)
        assert drops == []
        peaks.append(peak)
        check_results(model, n, k, results, table)
    assert max(peaks) == min(REDUCE_SLOTS, model.q_heads)   # the waves fill the slots
    # equal m per head: the merge is an exact integer sum of l and of every o lane
    table = random_states(model, n, 9, same_m=True)
    results, _, drops = run_decode(p, k, 9, table)
    assert drops == []
    check_results(model, n, k, results, table, exact=True)


def test_without_the_waves_the_slots_overflow():
    """The same traffic with the root ignoring its waits overflows REDUCE_SLOTS: the waves are
    what keeps the 12 heads of a layer within the reduction engines."""
    n = 5
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology("kr260-ring", n))
    p = plan(H12, cl, 20 * 4, 20, "mars", alpha=1)
    table = random_states(H12, n, 0)
    _, _, drops = run_decode(p, 3, 0, table, honour_waits=False)
    assert "drop_no_slot" in drops


def test_the_check_catches_a_corrupted_o():
    """check_results rejects a merge whose o is off (here: one contributor's o dropped)."""
    n, k = 3, 0
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology("ring", n))
    p = plan(TINY, cl, 12 * 2, 12, "mars", alpha=1)
    table = random_states(TINY, n, 4)
    results, _, _ = run_decode(p, k, 4, table)
    check_results(TINY, n, k, results, table)
    (tag, layer), payload = next(iter(results.items()))
    m, l_sum, o = unpack_state(payload, TINY.head_dim)
    head = (tag - k * TINY.q_heads) % (1 << 16)
    part = table[(0, head, layer)]
    bad = o - np.round(part[2] * 2.0 ** ((part[0] - m) / (1 << SCORE_FRAC))).astype(np.int64)
    bad = np.clip(bad, STATE_O.min_int, STATE_O.max_int)
    with pytest.raises(AssertionError):
        check_results(TINY, n, k, results | {(tag, layer): pack_state(m, l_sum, bad)}, table)

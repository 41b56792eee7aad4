"""MARS metadata streams and route tables: ABI round trip, record counts, and route tables that
deliver every transfer to exactly its destinations."""

import re

import pytest

from mcf.abi import META, Collective, Meta, Op, ReduceOp, Stage
from mcf.abi.framing import MAX_PAYLOAD
from mcf.abi.limits import REDUCE_SLOTS
from mcf.abi.node_config import KR260
from mcf.abi.query import query_bytes
from mcf.abi.route import ROUTE_ENTRY, ROUTE_TABLE_DEPTH
from mcf.mars import SWITCH, ClusterSpec, InvalidateKind, get_model, make_topology, pack_fast, plan
from mcf.mars.metadata import MAX_REDUCE_SLOTS, payloads

TINY = get_model("tiny")


def tiny_plan(n=4, topo="ring", policy="mars", budget=1 << 20, seq_len=None, chunk=None):
    chunk = chunk or 4 * n
    seq_len = seq_len or chunk * 6
    cl = ClusterSpec(n, budget, 1 << 20, make_topology(topo, n))
    return plan(TINY, cl, seq_len, chunk, policy, alpha=1)


def walk(topo, table, groups, src, route_id, dst):
    """Follow route-table entries from ``src``; returns the nodes that deliver locally."""
    delivered, frontier, seen = set(), [src], set()
    while frontier:
        v = frontier.pop()
        if v in seen:
            raise AssertionError(f"route {route_id} revisits node {v}")
        seen.add(v)
        entry = ROUTE_ENTRY.from_bits(table[(v, route_id)])
        if entry.local and v != src:
            delivered.add(v)
        for port in range(ROUTE_ENTRY["ports"].width):
            if not (int(entry.ports) >> port) & 1:
                continue
            if topo.base_kind == "switch":
                frontier += list(groups.get(route_id, (dst,)))
            else:
                frontier.append(topo.neighbour(v, port))
    return delivered


@pytest.mark.parametrize("topo", ["ring", "mesh", "torus", "switch", "kr260-ring"])
@pytest.mark.parametrize("policy", ["mars", "ring", "full", "pd"])
def test_route_tables_deliver_exactly(topo, policy):
    p = tiny_plan(n=6, topo=topo, policy=policy)
    topology = p.cluster.topology
    static = {(v, r): e for v, r, e in p.static_routes()}
    for step in p.steps + ([p.handoff] if p.handoff else []):
        table = dict(static)
        table.update({(v, r): e for v, r, e in step.routes.entries})
        groups = dict(step.routes.switch_groups)
        for t in step.transfers:
            assert 0 <= t.route_id < ROUTE_TABLE_DEPTH
            assert walk(topology, table, groups, t.src, t.route_id, t.dests[0]) == set(t.dests)


def test_banks_alternate_and_do_not_overlap_unicast():
    p = tiny_plan(n=4)
    n = p.cluster.nodes
    for step in p.steps:
        ids = {r for _, r, _ in step.routes.entries}
        base = p.scheduler.routes.bank_base(step.index)
        assert all(base <= r < base + p.scheduler.routes.bank_size for r in ids)
        assert all(r >= n for r in ids)
    assert p.scheduler.routes.bank_base(1) != p.scheduler.routes.bank_base(2)


@pytest.mark.parametrize("policy", ["mars", "ring", "pd"])
def test_stream_round_trips_through_the_abi(policy):
    p = tiny_plan(n=3, policy=policy)
    total = 0
    for step in p.steps:
        streams = p.step_metadata(step.index)
        counts = p.encoder.count_step_records(step)
        assert [len(streams[n]) for n in range(3)] == counts
        for metas in streams.values():
            for m in metas:
                raw = pack_fast(m)
                assert raw < 1 << META.size
                assert Meta.unpack(raw) == m
                total += 1
    if p.handoff is not None:
        for metas in p.handoff_metadata().values():
            for m in metas:
                assert Meta.unpack(pack_fast(m)) == m
                total += 1
    assert total > 0


def test_pack_fast_equals_abi_pack():
    samples = [Meta(), Meta(stage=Stage.DECODE, op=Op.PARTIAL_STATE,
                            collective=Collective.ALL_REDUCE, reduce_op=ReduceOp.SOFTMAX_MERGE,
                            src=31, dst=17, route_id=255, kv_id=65535, length=16383, seq=255)]
    p = tiny_plan(n=2)
    samples += [m for ms in p.step_metadata(2).values() for m in ms][:200]
    for m in samples:
        assert pack_fast(m) == m.pack()
    with pytest.raises(ValueError):
        pack_fast(Meta(kv_id=1 << 16))


def test_stream_content_and_order():
    p = tiny_plan(n=4, budget=1 << 20)
    enc = p.encoder
    seen_ids = set()
    drained_any = False
    for step in p.steps:
        recs = p.step_records(step.index)
        # the last step ends with the convergence FREEs (eq 29), one per layer and replica
        tail = TINY.layers * len(step.converge)
        assert bool(tail) == (step.index == p.num_chunks)
        assert all(r.phase == "free" and r.meta.seq == InvalidateKind.FREE
                   for r in recs[len(recs) - tail:])
        phases = [r.phase for r in recs[:len(recs) - tail]]
        order = {"plan": 0, "free": 1, "store": 2}
        assert phases == sorted(phases, key=order.__getitem__)
        for node in range(p.cluster.nodes):   # every phase of every node is layer-major
            for ph in ("plan", "free", "store"):
                layers = [enc.kv_key(r.meta.kv_id)[0] for r in recs[:len(recs) - tail]
                          if r.phase == ph and r.node == node]
                assert layers == sorted(layers)
        for r in recs:
            m = r.meta
            assert m.src == r.node
            layer, block, slice_ = enc.kv_key(m.kv_id)
            assert 0 <= layer < TINY.layers and 1 <= block <= p.num_chunks
            if m.op == Op.KV_REPLICA:
                seen_ids.add(m.kv_id)
                assert 0 < m.length <= enc.max_payload
                assert m.length % enc.token_record_bytes == 0
                assert (m.collective == Collective.MULTICAST) == (m.route_id >= 4)
            elif m.op == Op.INVALIDATE:
                drained_any = True
                if m.seq == InvalidateKind.FREE:
                    assert m.dst == m.src          # local release
                else:
                    assert m.seq == InvalidateKind.DRAIN and m.src == slice_ != m.dst
            elif m.op == Op.FETCH_REQUEST:
                assert m.length == 0 and m.dst != m.src
    assert drained_any
    # every KV id of every block and layer was sent at least once (N > 1)
    assert len(seen_ids) == TINY.layers * p.num_chunks * 4


@pytest.mark.parametrize("topo", ["ring", "mesh", "switch"])
def test_decode_query_multicast_and_reduction(topo):
    p = tiny_plan(n=5, topo=topo)
    bcast, reduce_, routes = p.decode_routes()
    table = {(v, r): e for v, r, e in p.static_routes()}
    table.update({(v, r): e for v, r, e in routes.entries})
    groups = dict(routes.switch_groups)
    roots = [p.decode_owner(k) for k in range(5)]
    assert sorted(roots) == sorted(set(roots))      # balanced appends: a new owner each time
    streams, configs = p.decode_metadata(0)
    root = roots[0]
    assert sum(c.k for c in configs) == 2 * 5 - 1   # every node once + N-1 child links
    # the root's entry marks its result final, delivered by the root's static unicast route
    assert [(c.node, c.route_id) for c in configs] == [(v, reduce_[root]) for v in range(5)]
    assert [c.final for c in configs] == [v == root for v in range(5)]
    home = next(c for c in configs if c.final).result_route
    assert home == p.scheduler.routes.unicast(root) and ROUTE_ENTRY.from_bits(
        table[(root, home)]).local
    for node, metas in streams.items():
        states = [m for m in metas if m.op == Op.PARTIAL_STATE]
        assert len(states) == TINY.layers * TINY.q_heads
        assert all(m.dst == root and m.reduce_op == ReduceOp.SOFTMAX_MERGE and
                   m.collective == Collective.ALL_REDUCE for m in states)
        for m in metas:
            assert Meta.unpack(pack_fast(m)) == m
        queries = [m for m in metas if m.op == Op.QUERY]
        assert len(queries) == (TINY.layers if node == root else 0)    # 4 heads: one wave
        assert all(m.length == query_bytes(TINY.q_heads, TINY.head_dim) for m in queries)
    q = next(m for m in streams[root] if m.op == Op.QUERY)
    assert walk(p.cluster.topology, table, groups, root, q.route_id, q.dst) == \
        set(range(5)) - {root}
    # the reduction tree: from any node, following the entries reaches the root
    for node in range(5):
        v, hops = node, 0
        while v != root:
            e = ROUTE_ENTRY.from_bits(table[(v, reduce_[root])])
            port = int(e.ports).bit_length() - 1
            v = root if topo == "switch" else p.cluster.topology.neighbour(v, port)
            hops += 1
            assert hops <= 5
        assert ROUTE_ENTRY.from_bits(table[(root, reduce_[root])]).local


def test_id_space_limits_are_clear_errors():
    from mcf.mars import PlanError
    q = get_model("qwen2.5-1.5b")
    cl = ClusterSpec(16, 64 << 20, 8 << 20, make_topology("switch", 16))
    # L·C·N = 28 · 256 · 16 = 114,688 KV ids > 2^16
    with pytest.raises(PlanError, match="kv_id"):
        plan(q, cl, 16384, 64, "mars", 0.5)
    assert SWITCH == -1


def test_emitted_files_match_the_streams(tmp_path):
    import json
    p = tiny_plan(n=3, budget=1 << 20)
    p.write_metadata(tmp_path)
    for step in p.steps:
        for node, metas in p.step_metadata(step.index).items():
            raw = (tmp_path / f"step_{step.index:04d}.node_{node:02d}.bin").read_bytes()
            words = [int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8)]
            assert [Meta.unpack(w) for w in words] == metas
    routes = json.loads((tmp_path / "routes.json").read_text())
    assert routes["programming"][0]["kind"] == "static"
    assert routes["payloads"]["max_payload_bytes"] == MAX_PAYLOAD
    assert routes["decode_waits"] == [[list(w) for w in p.decode_waits(0)]]
    assert routes["decode_reduce_configs"] == [[c.to_dict() for c in p.decode_reduce_configs(0)]]
    assert len(routes["programming"][0]["entries"]) == 3 * 3


def test_route_bank_overflow_falls_back_to_unicast():
    from mcf.mars import RouteAllocator
    p = tiny_plan(n=6, topo="torus")
    small = RouteAllocator(p.cluster.topology, depth=8)     # 6 unicast ids, banks of one tree
    assert small.bank_size == 1
    step = max(p.steps, key=lambda s: s.routes.trees)
    assert step.routes.trees > 1
    before = {}
    for t in step.transfers:
        before.setdefault((t.kind, t.block, t.slice, t.src), set()).update(t.dests)
    moved, routes = small.assign(step.index, step.transfers)
    assert routes.trees == 1 and routes.fallbacks >= step.routes.trees - 1
    after = {}
    for t in moved:
        assert t.route_id < 8
        assert len(t.dests) == 1 or t.route_id == small.bank_base(step.index)
        after.setdefault((t.kind, t.block, t.slice, t.src), set()).update(t.dests)
    assert after == before


def test_fragments_respect_the_nic_max_payload():
    # tiny INT4 token record: sk, sv (4 B) + K/V rows of 32 INT4 (32 B) = 36 B per KV head;
    # 400 B packets hold 11 token records (396 B)
    cl = ClusterSpec(3, 1 << 20, 1 << 20, make_topology("ring", 3), max_payload=400)
    p = plan(TINY, cl, 48 * 4, 48, "mars", alpha=1)
    enc = p.encoder
    assert enc.token_record_bytes == 36 and enc.tokens_per_fragment == 11
    lengths = [m.length for s in p.steps for ms in p.step_metadata(s.index).values()
               for m in ms if m.op == Op.KV_REPLICA]
    assert max(lengths) == 396 and all(x % 36 == 0 and 0 < x <= 400 for x in lengths)
    # 16 tokens per slice -> per KV head fragments of 11 and 5 tokens; seq = group * H_kv + head
    assert enc.fragments(16) == [396, 396, 180, 180]
    assert [enc.fragment_tokens(s) for s in range(4)] == [(0, 0), (1, 0), (0, 11), (1, 11)]


@pytest.mark.parametrize("n, chunk, max_payload", [(3, 48, 300), (4, 64, 2048), (2, 40, 140)])
def test_kv_packets_tile_every_head_of_every_slice(n, chunk, max_payload):
    """Every (layer, block, slice) is sent as packets that cover each KV head's tokens exactly
    once, at token-record boundaries, each within the payload limit."""
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology("ring", n), max_payload=max_payload)
    p = plan(TINY, cl, chunk * 3, chunk, "ring", alpha=1)
    enc, rec = p.encoder, p.encoder.token_record_bytes
    for step in p.steps:
        tokens = {(t.block, t.slice): t.tokens for t in step.transfers}
        sends: dict = {}
        for r in p.step_records(step.index):
            m = r.meta
            if m.op != Op.KV_REPLICA:
                continue
            assert 0 < m.length <= max_payload and m.length % rec == 0
            head, first = enc.fragment_tokens(m.seq)
            sends.setdefault((r.node, m.kv_id, m.dst), []).append(
                (head, first, m.length // rec))
        assert sends
        for (_, kv_id, _), frags in sends.items():
            _, block, slice_ = enc.kv_key(kv_id)
            want = tokens[(block, slice_)]
            for h in range(TINY.kv_heads):
                spans = sorted((f, f + c) for hh, f, c in frags if hh == h)
                assert spans[0][0] == 0 and spans[-1][1] == want
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_qwen_payload_cuts():
    pl = payloads(get_model("qwen2.5-1.5b"))
    assert pl.max_payload == MAX_PAYLOAD == 2048 and pl.reduce_slots == REDUCE_SLOTS == 4
    assert pl.token_record_bytes == 132 and pl.tokens_per_fragment == 15    # 1980 B packets
    assert pl.state_bytes == 520                                            # (2 + 128) x 4 B
    assert pl.query_record_bytes == 1592 == query_bytes(12, 128)
    assert pl.waves == (((0, 4),), ((4, 4),), ((8, 4),))                     # 536 B each
    assert payloads(get_model("qwen2.5-1.5b"), 1000, 4).waves == pl.waves
    assert payloads(get_model("qwen2.5-1.5b"), 520, 4).waves == \
        (((0, 2), (2, 2)), ((4, 2), (6, 2)), ((8, 2), (10, 2)))
    assert payloads(get_model("qwen2.5-1.5b"), 2048, 3).waves == tuple(
        ((h, 3),) for h in (0, 3, 6, 9))


@pytest.mark.parametrize("kw, message", [
    (dict(max_payload=MAX_PAYLOAD + 1), "must lie in 1..2048"),
    (dict(max_payload=0), "must lie in 1..2048"),
    (dict(max_payload=131), "one KV token record (132 B"),
    (dict(max_payload=519), "one head's softmax state (520 B"),
    (dict(reduce_slots=KR260.reduce_slots + 1), "reduction slots must lie in 1..12 (the kr260"),
    (dict(reduce_slots=0), "reduction slots must lie in 1..12 (the kr260"),
])
def test_records_that_cannot_fit_are_rejected(kw, message):
    from mcf.mars import PlanError, make_cluster
    with pytest.raises(PlanError, match=re.escape(message)):
        cl = make_cluster(4, 64, node_config=KR260, **kw)
        plan(get_model("qwen2.5-1.5b"), cl, 4096, 1024, "mars", 0.5)
    if "reduce_slots" in kw:        # the engine's own bound: the CAPS field
        kw = {"reduce_slots": MAX_REDUCE_SLOTS + 1 if kw["reduce_slots"] else 0}
        message = f"reduction slots must lie in 1..{MAX_REDUCE_SLOTS}"
    with pytest.raises(ValueError, match=re.escape(message)):
        payloads(get_model("qwen2.5-1.5b"), **kw)


def test_query_head_that_cannot_fit_is_rejected():
    from mcf.mars import ModelSpec
    wide = ModelSpec("wide", layers=2, q_heads=4, kv_heads=2, head_dim=500)
    # state (2 + 500) x 4 = 2008 B, query head 4 + 500 B (+ 8 B header): 4 heads in 2024 B
    assert payloads(wide).waves == (((0, 4),),)
    with pytest.raises(ValueError, match="softmax state"):
        payloads(wide, 2007)
    narrow = ModelSpec("narrow", layers=2, q_heads=4, kv_heads=2, head_dim=16)
    # state (2 + 16) x 4 = 72 B, query head 8 + 4 + 16 = 28 B, token record 20 B
    assert payloads(narrow, 72).waves == (((0, 2), (2, 2)),)
    # head_dim 1 (INT8 KV: 2 B per token record): the 12 B state fits 12 B, a 16 B query not
    tiny_head = ModelSpec("t", layers=1, q_heads=2, kv_heads=1, head_dim=1, kv_dtype="int8")
    with pytest.raises(ValueError, match=re.escape("decode query: one query head (16 B")):
        payloads(tiny_head, 12)


def test_decode_waves_respect_the_reduction_slots():
    from mcf.mars import ModelSpec
    model = ModelSpec("h12", layers=3, q_heads=12, kv_heads=2, head_dim=16)
    n = 4
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology("ring", n))
    p = plan(model, cl, 16 * 4, 16, "mars", alpha=1)
    recs = p.decode_records(0)
    root = p.decode_owner(0)
    waves = p.encoder.payloads.waves
    assert len(waves) == 3
    # per layer and wave: the root's query (waiting for every earlier result), then 4 heads
    # from every node; never more than REDUCE_SLOTS distinct tags between two queries
    queries = [r for r in recs if r.meta.op == Op.QUERY]
    assert [r.wait for r in queries] == [4 * i for i in range(model.layers * 3)]
    assert all(r.node == root and r.meta.length == query_bytes(4, 16) for r in queries)
    cuts = [i for i, r in enumerate(recs) if r.meta.op == Op.QUERY] + [len(recs)]
    for a, b in zip(cuts, cuts[1:]):
        tags = {(r.meta.kv_id, r.meta.seq) for r in recs[a + 1:b]}
        assert len(tags) == REDUCE_SLOTS
        assert len(recs[a + 1:b]) == REDUCE_SLOTS * n
        assert all(r.wait == 0 for r in recs[a + 1:b])
    assert p.decode_waits(0) == [(root, i * (1 + 4), 4 * i) for i in range(1, model.layers * 3)]

"""Property tests of the MARS scheduler: memory bound, owner copies, lifecycle, convergence,
balance, monotone replica factors, and traffic between full replication and ring."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcf.mars import (
    ClusterSpec,
    CopyState,
    Directory,
    InvariantError,
    get_model,
    make_topology,
    plan,
)

TINY = get_model("tiny")
TOPOS = ("ring", "mesh", "torus", "switch", "kr260-ring")


def cluster(n, budget, topo="ring", buffer=1 << 20):
    return ClusterSpec(n, budget, buffer, make_topology(topo, n))


def owner_only_need(n, seq_len, chunk):
    from mcf.mars.layout import node_token_counts
    per = [0] * n
    for c in range(1, seq_len // chunk + 1):
        for i, t in enumerate(node_token_counts(c, chunk, n)):
            per[i] += t * TINY.m_token
    return max(per)


@st.composite
def configs(draw):
    n = draw(st.integers(1, 8))
    chunk = draw(st.integers(n, 3 * n + 5))
    num_chunks = draw(st.integers(1, 10))
    seq_len = chunk * num_chunks
    need = owner_only_need(n, seq_len, chunk)
    full = seq_len * TINY.m_token
    budget = draw(st.integers(need, max(need, full + full // 4)))
    alpha = draw(st.sampled_from([0, 0.1, 0.25, 0.5, 1, 3]))
    topo = draw(st.sampled_from(TOPOS))
    return n, chunk, seq_len, budget, alpha, topo


def check_plan_invariants(p, budget):
    n = p.cluster.nodes
    steps = p.steps
    for s in steps:
        # memory bound (eq 10, per node and at every step)
        assert max(s.node_kv_bytes) <= budget
        # replica sets never exceed r(c) and never include the owner
        for owner, holders in s.replicas.items():
            assert len(holders) <= s.replica_factor - 1
            assert owner not in holders
    # r(c) non-increasing under uniform pressure, r(C) = 1
    rs = [s.replica_factor for s in steps]
    assert all(a >= b for a, b in zip(rs, rs[1:]))
    assert rs[-1] == 1
    # owners never dropped: every slice still has its owner, and only it
    d = p.scheduler.dir
    for s in steps:
        for node, rg in enumerate(s.ranges):
            if rg and sum(b - a for a, b in rg):
                assert d.state((s.index, node), node) is CopyState.OWNER
    t = p.totals
    assert t.final_owner_only
    assert d.replica_count() == 0
    # balanced: owned bytes differ by at most one slice
    assert t.owned_gap_bytes <= t.max_slice_bytes
    assert sum(t.final_node_kv_bytes) == p.seq_len * p.model.m_token
    assert t.memory_ok
    assert len(t.final_node_kv_bytes) == n


@settings(max_examples=60, deadline=None)
@given(configs())
def test_mars_invariants(cfg):
    n, chunk, seq_len, budget, alpha, topo = cfg
    p = plan(TINY, cluster(n, budget, topo), seq_len, chunk, "mars", alpha)
    check_plan_invariants(p, budget)


@settings(max_examples=30, deadline=None)
@given(configs())
def test_traffic_between_full_and_ring_on_a_switch(cfg):
    """On a switch every hop costs the same (h = 1): eq 20 lies between eq 22 and eq 21, and the
    scheduled traffic does too."""
    n, chunk, seq_len, budget, alpha, _ = cfg
    cl = cluster(n, budget, "switch")
    mars = plan(TINY, cl, seq_len, chunk, "mars", alpha).totals
    ring = plan(TINY, cl, seq_len, chunk, "ring", alpha).totals
    full = plan(TINY, cl, seq_len, chunk, "full", alpha).totals
    assert full.comm_bytes <= mars.comm_bytes <= ring.comm_bytes
    cf = mars.closed_form
    assert cf["c_full_bytes"] <= cf["c_mars_bytes"] + 1e-6 <= cf["c_ring_bytes"] + 2e-6
    # ring streaming moves exactly eq 21 with h_ring = 1
    assert ring.comm_bytes == pytest.approx(cf["c_ring_bytes"])
    assert full.comm_bytes == pytest.approx(cf["c_full_bytes"])


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 8), st.sampled_from(TOPOS), st.sampled_from(["ring", "zigzag", "pd"]))
def test_baselines_converge_owner_only(n, topo, policy):
    seq_len, chunk = 8 * n * 4, 8 * n
    p = plan(TINY, cluster(n, seq_len * TINY.m_token, topo), seq_len, chunk, policy)
    t = p.totals
    assert t.final_owner_only and t.owned_gap_bytes <= t.max_slice_bytes
    assert t.rep_bytes == 0
    if policy == "pd":
        pool = set(p.scheduler.decode_pool)
        assert {p.scheduler.dir.owner(k) for k in p.scheduler.dir.slices()} <= pool
        assert t.handoff_bytes > 0


def test_paper_setting_drains_serve_in_flight_reads():
    q = get_model("qwen2.5-1.5b")
    p = plan(q, ClusterSpec(8, 64 << 20, 8 << 20, make_topology("kr260-ring", 8)), 16384, 1024)
    check_plan_invariants(p, 64 << 20)
    assert p.totals.draining_reads > 0          # in-flight chunks read draining copies
    assert sum(len(s.drains) for s in p.steps) == sum(len(s.frees) for s in p.steps)


def test_memory_pressure_limits_replicas():
    # budget just above owner-only: replication must stay within it, never beyond
    n, chunk, seq_len = 4, 16, 16 * 8
    need = owner_only_need(n, seq_len, chunk)
    p = plan(TINY, cluster(n, need + 2 * 4 * TINY.m_token), seq_len, chunk, "mars", 3)
    check_plan_invariants(p, need + 2 * 4 * TINY.m_token)
    assert any(s.drains for s in p.steps)


def test_directory_lifecycle_rules():
    d = Directory(3, budget=240)
    d.add_owner((1, 0), 0, 100)
    d.add_replica((1, 0), 1)
    d.register_read((1, 0), 1, chunk=1)
    with pytest.raises(InvariantError):
        d.mark_draining((1, 0), 0)                  # the owner copy never drains
    d.mark_draining((1, 0), 1)
    with pytest.raises(InvariantError):
        d.register_read((1, 0), 1, chunk=2)         # draining: excluded from new scheduling
    assert d.free_drained() == []                   # chunk 1 still depends on it
    assert d.serve_reads(1) == 1                    # served by the draining copy
    assert d.free_drained() == [((1, 0), 1)]
    assert d.used == [100, 0, 0]
    d.add_replica((1, 0), 2)
    d.add_owner((2, 1), 1, 150)
    with pytest.raises(InvariantError):
        d.add_replica((2, 1), 2)                    # 100 + 150 > 240 on node 2
    d.check()


def replay_lifecycle(p):
    """Independent replay of the emitted schedule: every access is sourced from a copy that is
    the owner or a replica placed earlier and not drained before the read was scheduled; every
    drained copy is freed exactly once, after the step that drained it."""
    valid, draining = set(), set()            # (block, slice, node)
    for s in p.steps:
        for (b, sl), node in s.drains:
            assert (b, sl, node) in valid, "only a valid replica drains"
            valid.discard((b, sl, node))
            draining.add((b, sl, node))
        for t in s.transfers:
            if t.phase == "plan" and t.kind == "access" and not t.chain:
                assert t.src == t.slice or (t.block, t.slice, t.src) in valid
                for d in t.dests:
                    assert (t.block, t.slice, d) not in valid and d != t.slice
        for (b, sl), node in s.frees:
            assert (b, sl, node) in draining, "freed copies were draining"
            draining.discard((b, sl, node))
        for owner, holders in s.replicas.items():
            valid.update((s.index, owner, h) for h in holders)
        for t in s.transfers:
            if t.phase == "store" and t.kind == "access" and not t.chain:
                assert t.src == t.slice or (t.block, t.slice, t.src) in valid
    for (b, sl), node in p.scheduler.final_frees:
        draining.discard((b, sl, node))
    assert not valid and not draining


@settings(max_examples=30, deadline=None)
@given(configs())
def test_replayed_lifecycle(cfg):
    n, chunk, seq_len, budget, alpha, topo = cfg
    replay_lifecycle(plan(TINY, cluster(n, budget, topo), seq_len, chunk, "mars", alpha))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(72, 2048), st.integers(1, 4),
       st.sampled_from(["mars", "ring", "pd"]))
def test_every_planned_payload_fits_and_waves_fit_the_slots(n, per_node, max_payload, slots,
                                                            policy):
    """Any payload limit from one softmax state (72 B for tiny) to MAX_PAYLOAD and any slot
    count: every record's length is within the limit, KV packets are whole token records, and
    no decode wave opens more than ``slots`` reductions."""
    from mcf.abi import Op
    from mcf.abi.framing import MAX_PAYLOAD
    from mcf.abi.query import query_bytes
    if policy == "pd" and n < 2:
        policy = "mars"
    chunk = n * per_node * 5
    cl = ClusterSpec(n, 1 << 20, 1 << 20, make_topology("ring", n), max_payload=max_payload,
                     reduce_slots=slots)
    p = plan(TINY, cl, chunk * 3, chunk, policy, alpha=1)
    enc = p.encoder
    assert max_payload <= MAX_PAYLOAD
    metas = [m for s in p.steps for ms in p.step_metadata(s.index).values() for m in ms]
    metas += [m for ms in p.handoff_metadata().values() for m in ms]
    for m in metas:
        assert m.length <= max_payload
        if m.op == Op.KV_REPLICA:
            assert m.length > 0 and m.length % enc.token_record_bytes == 0
    recs = p.decode_records(0)
    if n == 1:      # one contributor per tag: every reduction completes on arrival
        assert [c.k for c in p.decode_reduce_configs(0)] == [1]
        recs = []
    open_tags: set = set()
    for r in recs:
        assert r.meta.length <= max_payload
        if r.meta.op == Op.QUERY and r.wait:
            open_tags = set()        # the previous wave's results are all in
        elif r.meta.op == Op.PARTIAL_STATE:
            open_tags.add((r.meta.kv_id, r.meta.seq))
            assert len(open_tags) <= slots
    queried = [r.meta for r in recs if r.meta.op == Op.QUERY]
    assert sum(m.length for m in queried) >= (n > 1) * TINY.layers * query_bytes(
        TINY.q_heads, TINY.head_dim)

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
    # eq 19/20 exactly: with room for every replica, each block keeps r(i) and chunk c fetches
    # block i ≤ c for the N − r(i) nodes without a copy (on a switch h_near = h_dis = 1)
    if topo == "switch" and not any(s.drains for s in p.steps) and all(
            len(h) == s.replica_factor - 1 for s in p.steps for h in s.replicas.values()):
        assert p.totals.comm_bytes == pytest.approx(p.totals.closed_form["c_mars_bytes"])


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
    p = plan(TINY, cluster(n, seq_len * TINY.m_token, topo), seq_len, chunk, policy, 0.5)
    t = p.totals
    assert t.final_owner_only and t.owned_gap_bytes <= t.max_slice_bytes
    assert t.rep_bytes == 0
    if policy == "pd":
        pool = set(p.scheduler.decode_pool)
        assert {p.scheduler.dir.owner(k) for k in p.scheduler.dir.slices()} <= pool
        assert t.handoff_bytes > 0


def test_paper_setting_keeps_each_block_at_its_own_factor():
    """At the paper's setting on 8 nodes the budget never forces a drain: every block keeps
    r(i) to the deadline, chunk C still reads its replicas, and the convergence after it drains
    them all (eq 29)."""
    q = get_model("qwen2.5-1.5b")
    p = plan(q, ClusterSpec(8, 64 << 20, 8 << 20, make_topology("kr260-ring", 8)), 16384, 1024,
             "mars", 0.5)
    check_plan_invariants(p, 64 << 20)
    assert p.totals.pressure_drains == 0
    last = p.steps[-1]
    want = sum(s.replica_factor - 1 for s in p.steps) * 8      # every slice kept r(i) − 1
    assert len(last.converge) == want == p.totals.converged == 7 * 8 + 7 * 8 + 6 * 8 + 6 * 8 \
        + 5 * 8 + 5 * 8 + 4 * 8 + 4 * 8 + 3 * 8 + 3 * 8 + 2 * 8 + 2 * 8 + 1 * 8 + 1 * 8
    assert p.totals.draining_reads > 0        # chunk C read copies drained at the deadline


def test_memory_pressure_limits_replicas():
    # budget just above owner-only: replication must stay within it, never beyond
    n, chunk, seq_len = 4, 16, 16 * 8
    need = owner_only_need(n, seq_len, chunk)
    budget = need + 2 * 4 * TINY.m_token
    p = plan(TINY, cluster(n, budget), seq_len, chunk, "mars", 3)
    check_plan_invariants(p, budget)
    replay_lifecycle(p)
    assert p.totals.pressure_drains > 0
    assert sum(len(s.drains) for s in p.steps) == sum(len(s.frees) for s in p.steps)


def test_drains_pick_the_least_remaining_access_cost():
    """Node 2 of a 4-node ring holds replicas of slices (1, 0) (copies {0, 2}) and (1, 1)
    (copies {1, 2, 3}) and needs room for one more slice. Eq 19 over the 3 remaining chunks:
    without node 2, (1, 0) leaves nodes at 0 + 1 + 2 + 1 = 4 hops from a copy instead of 2 (+2
    per read), (1, 1) leaves node 2 one hop away (+1): (1, 1) drains."""
    from mcf.mars.schedule import Scheduler, Step
    s = Scheduler(TINY, cluster(4, 1 << 20), 32, 8, "mars", 0.5)
    size = 2 * TINY.m_token
    d = s.dir
    d.add_owner((1, 0), 0, size)
    d.add_owner((1, 1), 1, size)
    d.add_replica((1, 0), 2)
    d.add_replica((1, 1), 2)
    d.add_replica((1, 1), 3)
    assert s.drain_cost((1, 0), 2, 2) == 3 * size * 2
    assert s.drain_cost((1, 1), 2, 2) == 3 * size * 1
    over = TINY.m_token                       # one slice too many by one token's bytes
    tokens = ((1 << 20) - 2 * size + over) // TINY.m_token
    step = Step(2, 99, 4, 4, [[], [], [(0, tokens)], []])
    s._relieve_pressure(step, d.slices())
    assert step.drains == [((1, 1), 2)] and step.pressure == {2: over}
    assert d.state((1, 0), 2) is CopyState.VALID


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
    """Independent replay of the emitted schedule (MARS): every access is sourced from a copy
    that is the owner or a replica placed earlier and not drained before the read was
    scheduled; a block gets r(i) − 1 replicas unless every other node lacked room; a replica
    drains before the deadline only on a node whose own next slice would not fit otherwise,
    and no more than needed; the budget holds after every step; at the deadline every replica
    left drains; every drained copy is freed exactly once."""
    budget, n = p.cluster.kv_budget, p.cluster.nodes
    size = p.scheduler.dir.size
    valid, draining = set(), set()            # (block, slice, node)
    used = [0] * n
    for s in p.steps:
        c = s.index
        own = [sum(b - a for a, b in rg) * p.model.m_token for rg in s.ranges]
        projected = [used[x] - sum(size[(b, sl)] for b, sl, y in draining if y == x) + own[x]
                     for x in range(n)]
        freed = [0] * n
        last = {}
        for (b, sl), node in s.drains:
            assert (b, sl, node) in valid, "only a valid replica drains"
            assert b < c
            valid.discard((b, sl, node))
            draining.add((b, sl, node))
            freed[node] += size[(b, sl)]
            last[node] = size[(b, sl)]
        for x in range(n):
            if freed[x]:      # the budget forced it, and no more was drained than needed
                assert projected[x] > budget and freed[x] - last[x] < projected[x] - budget
                assert s.pressure[x] == projected[x] - budget
            else:
                assert projected[x] <= budget and x not in s.pressure
        for t in s.transfers:
            if t.phase == "plan" and t.kind == "access" and not t.chain:
                assert t.src == t.slice or (t.block, t.slice, t.src) in valid
                for d in t.dests:
                    assert (t.block, t.slice, d) not in valid and d != t.slice
        for (b, sl), node in s.kept:
            if b < c:
                valid.add((b, sl, node))
                used[node] += size[(b, sl)]
        for (b, sl), node in s.frees:
            assert (b, sl, node) in draining, "freed copies were draining"
            draining.discard((b, sl, node))
            used[node] -= size[(b, sl)]
        for x in range(n):
            used[x] += own[x]
        for owner, holders in s.replicas.items():
            key = (c, owner)
            if len(holders) < s.replica_factor - 1:       # short only where nobody had room
                assert all(used[x] + size[key] > budget for x in range(n)
                           if x != owner and x not in holders)
            assert len(holders) <= s.replica_factor - 1
            for h in holders:
                valid.add((c, owner, h))
                used[h] += size[key]
        for t in s.transfers:
            if t.phase == "store" and t.kind == "access" and not t.chain:
                assert t.src == t.slice or (t.block, t.slice, t.src) in valid
        for (b, sl), node in s.kept:
            if b == c:
                valid.add((b, sl, node))
                used[node] += size[(b, sl)]
        assert used == s.node_kv_bytes and max(used) <= budget
        if c < p.num_chunks:
            assert not s.converge
    last = p.steps[-1]
    assert {(b, sl, node) for (b, sl), node in last.converge} == valid
    draining |= valid
    for (b, sl), node in p.scheduler.final_frees:
        draining.discard((b, sl, node))
    assert not draining


@settings(max_examples=30, deadline=None)
@given(configs())
def test_replayed_lifecycle(cfg):
    n, chunk, seq_len, budget, alpha, topo = cfg
    replay_lifecycle(plan(TINY, cluster(n, budget, topo), seq_len, chunk, "mars", alpha))


@settings(max_examples=20, deadline=None)
@given(configs())
def test_kept_fetched_copies_stay_within_the_budget(cfg):
    """``keep_fetched`` (an option; the paper replicates only on propagation): fetched copies
    are kept only where the budget has room, and everything still converges."""
    n, chunk, seq_len, budget, alpha, topo = cfg
    p = plan(TINY, cluster(n, budget, topo), seq_len, chunk, "mars", alpha, keep_fetched=True)
    check_plan_invariants(p, budget)
    replay_lifecycle(p)
    plain = plan(TINY, cluster(n, budget, topo), seq_len, chunk, "mars", alpha)
    assert not any(s.kept for s in plain.steps)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(136, 2048), st.integers(1, 4),
       st.sampled_from(["mars", "ring", "pd"]))
def test_every_planned_payload_fits_and_waves_fit_the_slots(n, per_node, max_payload, slots,
                                                            policy):
    """Any payload limit from one softmax state (136 B for tiny) to MAX_PAYLOAD and any slot
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

"""MARS's fair baselines (issue #15 §2), its inputs (α, S_node, the node configuration's
reduction slots, the tiny model shared with the golden models) and the paper's headline trend."""

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcf.abi import Op
from mcf.abi.node_config import KR260, SIM
from mcf.mars import (
    ClusterSpec,
    PlanError,
    board_setting,
    get_model,
    make_cluster,
    make_topology,
    paper_setting,
    plan,
)
from mcf.mars.metadata import max_open_reductions
from mcf.mars.setting import weight_bytes
from mcf.mars.sweep import FAIR, SCHEMES, SweepSpec, speedups, sweep

TINY = get_model("tiny")
QWEN = get_model("qwen2.5-1.5b")
MIB = 2 ** 20


def cluster(n, topo="ring", budget=1 << 20):
    return ClusterSpec(n, budget, 1 << 20, make_topology(topo, n))


def test_tiny_is_the_golden_tiny_layer():
    from mcf.golden.qwen_layer import TINY as GOLDEN
    assert (TINY.hidden, TINY.q_heads, TINY.kv_heads, TINY.head_dim, TINY.intermediate) == (
        GOLDEN.hidden, GOLDEN.heads, GOLDEN.kv_heads, GOLDEN.head_dim, GOLDEN.intermediate)
    assert (TINY.hidden, TINY.q_heads, TINY.kv_heads, TINY.head_dim, TINY.intermediate,
            TINY.layers) == (128, 4, 2, 32, 256, 2)
    assert SIM.attn_head_dim == TINY.head_dim          # the sim node runs the same heads


def _streams(p, step):
    """Ring hops of each slice read in ``step``: {key: [(src, dst), ...]} in chain order."""
    out: dict = {}
    for t in step.transfers:
        if t.chain:
            out.setdefault((t.block, t.slice), []).append((t.src, t.dests[0]))
    return out


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 9), st.sampled_from(["ring", "kr260-ring", "switch"]),
       st.sampled_from(["ring", "zigzag", "pd"]), st.booleans())
def test_ring_streams_every_slice_once_to_every_node(n, topo, policy, bidir):
    """Every chunk, each history slice reaches every other node of the pool exactly once, by
    hop-by-hop forwarding from the owner; bidirectional: at most two chains leave the owner,
    one each way, each at most ⌈(P−1)/2⌉ hops, and no directed link carries the slice twice;
    one way: a single chain of P − 1 hops."""
    if policy == "pd" and n < 4:
        n = 4
    chunk = 3 * n
    p = plan(TINY, cluster(n, topo), chunk * 3, chunk, policy, 0.5, bidirectional=bidir)
    pool = p.scheduler.pool
    k = len(pool)
    for step in p.steps:
        for key, hops in _streams(p, step).items():
            owner = key[1]
            got = Counter(dst for _, dst in hops)
            assert set(got) == set(pool) - {owner} and set(got.values()) == {1}
            # chains: each hop leaves the owner or a node that received the slice before
            held = {owner}
            for a, b in hops:
                assert a in held
                held.add(b)
            firsts = [b for a, b in hops if a == owner]
            links = Counter(lk for t in step.transfers if t.chain and (t.block, t.slice) == key
                            for lk in t.tree.links)
            if policy != "pd" and topo != "switch":     # the pool is the physical ring
                assert max(links.values()) == 1
            depth = {owner: 0}
            for a, b in hops:
                depth[b] = depth[a] + 1
            if bidir and topo != "switch":
                assert len(firsts) <= 2 and max(depth.values()) == -(-(k - 1) // 2)
                if len(firsts) == 2:          # one neighbour each way round the pool's ring
                    i = pool.index(owner)
                    assert set(firsts) == {pool[(i + 1) % k], pool[(i - 1) % k]}
            else:
                assert len(firsts) == 1 and max(depth.values()) == k - 1


def test_bidirectional_ring_halves_the_busiest_link():
    """Same bytes × hops, both directions loaded: the busiest directed link of a chunk carries
    about half of what one-way streaming puts on it (8 nodes, uniform ring)."""
    from mcf.mars.cost import link_loads
    one = plan(TINY, cluster(8), 8 * 4 * 4, 8 * 4, "ring", 0.5, bidirectional=False)
    two = plan(TINY, cluster(8), 8 * 4 * 4, 8 * 4, "ring", 0.5)
    assert one.totals.comm_bytes == two.totals.comm_bytes
    biggest = max(two.scheduler.dir.size.values())
    for a, b in zip(one.steps, two.steps, strict=True):
        la, lb = max(link_loads(a.transfers).values()), max(link_loads(b.transfers).values())
        # one way puts every slice on 7 of the 8 NEXT links; both ways, a slice goes 4 hops
        # one way and 3 the other (owners alternate), so a link carries 4 of every 7 at most
        assert lb <= la * 4 / 7 + biggest and lb < la
    assert two.totals.ttft_s <= one.totals.ttft_s


def test_unchunked_baseline_is_one_chunk_and_cost_only():
    p = plan(QWEN, make_cluster(4, 64, node_config=KR260, topology="switch"), 16384, 16384,
             "zigzag", 0.5, streams=False)
    assert p.num_chunks == 1 and p.chunk == 16384
    # every slice goes to the 3 other nodes once: bytes x hops = 3 x the whole KV
    assert p.totals.comm_bytes == 3 * 16384 * QWEN.m_token
    with pytest.raises(PlanError, match="cost-only"):
        p.step_records(1)
    with pytest.raises(PlanError, match="Meta.seq"):      # as an emitted plan it cannot exist
        plan(QWEN, make_cluster(4, 64, node_config=KR260), 16384, 16384, "zigzag", 0.5)


def test_full_replication_replicates_once_and_never_fetches():
    n, chunk = 4, 16
    p = plan(TINY, cluster(n, "switch"), chunk * 5, chunk, "full", 0.5)
    t = p.totals
    assert t.access_bytes == 0 and t.rep_bytes == (n - 1) * 5 * chunk * TINY.m_token
    assert t.rep_bytes == pytest.approx(t.closed_form["c_full_bytes"])
    assert t.converged == (n - 1) * n * 5 and t.final_owner_only


def test_make_cluster_takes_the_slots_from_the_node_configuration():
    assert make_cluster(4, 64, node_config=KR260).reduce_slots == KR260.reduce_slots == 12
    assert make_cluster(4, 64, node_config="sim").reduce_slots == SIM.reduce_slots == 4
    assert make_cluster(4, 64, node_config="kr260", reduce_slots=3).reduce_slots == 3
    with pytest.raises(PlanError, match=r"1\.\.4 \(the sim node's"):
        make_cluster(4, 64, node_config=SIM, reduce_slots=5)


@pytest.mark.parametrize("cfg, waves", [(KR260, 1), (SIM, 3)])
def test_decode_reductions_open_at_a_root_fit_the_engine(cfg, waves):
    """Qwen2.5's 12 query heads: one wave on a kr260 node's 12 slots, three on a sim node's 4;
    replayed with its waits, no engine ever holds more tags than its slots, and without the
    waits the same records would open all 12 at once."""
    p = plan(QWEN, make_cluster(4, 64, node_config=cfg), 4096, 1024, "mars", 0.5)
    assert len(p.encoder.payloads.waves) == waves
    for k in range(3):
        recs = p.decode_records(k)
        assert max_open_reductions(recs, 4) == cfg.reduce_slots
    from dataclasses import replace
    no_waits = [replace(r, wait=0) for r in p.decode_records(0)]
    assert max_open_reductions(no_waits, 4) == QWEN.q_heads * QWEN.layers


def test_paper_and_board_settings():
    st = paper_setting()
    assert (st.alpha, st.kv_budget_mib) == (0.5, 64.0)
    # Qwen2.5-1.5B: 28 x 46.79 M linear + 151,936 x 1536 embedding = 1,543,569,408 weights;
    # INT4: 771,784,704 B + one 3-B scale (16 + 8 bits) per 128 weights: 36,177,408 B
    assert QWEN.weight_params == 1_543_569_408
    assert weight_bytes(QWEN) == 771_784_704 + 12_059_136 * 3 == 807_962_112
    board = board_setting(QWEN)
    assert board.kv_budget_mib == pytest.approx(4096 - 1024 - 807_962_112 / MIB)
    assert board.alpha == 0.5 and "reserve 1024 MiB" in board.source
    with pytest.raises(ValueError, match="no KV budget"):
        board_setting(QWEN, ddr_bytes=1 << 30)


def test_alpha_is_an_explicit_input():
    with pytest.raises(TypeError):
        plan(TINY, cluster(2), 16, 8, "mars")              # noqa - alpha is required
    with pytest.raises(TypeError):
        make_cluster(2, node_config="sim")                 # noqa - S_node is required


def test_headline_trend_at_the_paper_setting():
    """Paper setting, 16K, B = 1024, KR260 ring, whole model: MARS is never slower than the
    best fair chunked baseline by more than 2 %, and its gain grows with N."""
    st = paper_setting()
    spec = SweepSpec(alpha=st.alpha, kv_budget_mib=st.kv_budget_mib, schemes=("mars", *FAIR))
    rows = sweep(spec)
    sp = {s["nodes"]: s["speedup_vs_best_fair"] for s in speedups(rows)}
    assert sorted(sp) == [2, 4, 8, 16]
    assert all(v >= 1 / 1.02 for v in sp.values())
    assert sp[2] <= sp[4] <= sp[8] <= sp[16] and sp[16] > 1.1
    assert all(r["memory_ok"] and r["final_owner_only"] for r in rows)
    assert set(SCHEMES) >= set(FAIR)
    assert all(r["scheme"] == "mars" or "bidirectional" in r["baseline"] for r in rows)


def test_mars_emits_only_abi_records():
    p = plan(TINY, cluster(4, "kr260-ring"), 16 * 4, 16, "mars", 0.5)
    ops = {r.meta.op for s in p.steps for r in p.step_records(s.index)}
    assert ops <= {Op.KV_REPLICA, Op.FETCH_REQUEST, Op.INVALIDATE}

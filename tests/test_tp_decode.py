"""Tensor-parallel decode's golden model (issue #34 items 3–4; docs/cluster.md
"Tensor-parallel decode: the golden model"): the TP decode equals the replicated-root decode bit
for bit, the numerics it rests on (mcf.abi.tp) and which of their conditions matter, the
per-node weight bytes, and the refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mcf.abi.fixed import wrap
from mcf.abi.meta import ReduceOp
from mcf.abi.node_config import KR260, SIM
from mcf.abi.quant import ACC_BITS, ACT, requantize
from mcf.abi.softmax import LANE_BITS
from mcf.abi.tp import (
    ACC_LO_BITS,
    TP_MAX_NODES,
    absmax_lanes,
    acc_lanes,
    lanes_absmax,
    lanes_acc,
    requantize_with_absmax,
)
from mcf.cluster import RunSpec, make_plan, prompt_tokens
from mcf.cluster.tp import check_tp, tp_node_bytes
from mcf.golden import gemm as G
from mcf.golden import vector as V
from mcf.golden.cluster import TPClusterGolden, golden_run, tp_golden_run
from mcf.golden.model import IntModel, quantize_model
from mcf.golden.qwen_layer import LayerConfig, layer_fixed, quantize_layer, random_layer
from mcf.golden.tp_decode import (
    TPError,
    column_ffn,
    gemm_blob_bytes,
    merge_argmax,
    nic_all_reduce,
    node_weight_bytes,
    partial_acc,
    row_parallel,
    slice_argmax,
    tp_ffn,
    tp_head,
    tp_layer,
    tp_pre_attention,
    tp_split,
    vocab_split,
)
from mcf.model import model_from_spec
from mcf.model.config import QWEN25_1P5B_MODEL, Qwen2Config
from mcf.quant import gemm_tile_blob, quantize_weight, to_act


@pytest.fixture(scope="module")
def tiny():
    cfg, tensors = model_from_spec("tiny", seed=0)
    return cfg, quantize_model(cfg, tensors)


# ---- TP decode = replicated-root decode ---------------------------------------------------------


@pytest.mark.parametrize("softmax", ["single", "two_phase"])
@pytest.mark.parametrize("nodes", [2, 4])
def test_tp_decode_is_root_decode_bit_for_bit(tiny, nodes, softmax):
    """Four decode tokens (roots rotating): every layer's output row, attention rows, new KV
    records, merged states and the logits of TP decode equal the replicated root's."""
    cfg, qm = tiny
    spec = RunSpec(nodes=nodes, prompt_tokens=32, chunk=16, decode_tokens=4, softmax=softmax)
    prompt = prompt_tokens(cfg, 32, 7)
    root = golden_run(qm, make_plan(spec, cfg), prompt, 4, softmax)
    tp = tp_golden_run(qm, make_plan(spec, cfg), prompt, 4, softmax)
    assert tp.tokens == root.tokens and tp.roots == root.roots
    assert len(set(root.roots)) > 1
    for a, b in zip(root.logits, tp.logits):
        assert np.array_equal(a, b)
    for da, db in zip(root.decode, tp.decode):
        for la, lb in zip(da, db):
            assert np.array_equal(la.y, lb.y)
            assert np.array_equal(la.att, lb.att)
            assert la.kv == lb.kv and la.merged == lb.merged and la.queries == lb.queries
            # the row-parallel GEMMs really summed N partials (none of them the whole)
            assert len(lb.o.acc) == len(lb.down.acc) == nodes
            assert all(np.any(a != sum(lb.down.acc)) for a in lb.down.acc)


def test_tp_layer_is_the_layer_with_qwen_mlp_groups():
    """A layer with Qwen2.5-1.5B's MLP (8,960 = 70 groups: 35/35 at N = 2, 18/18/17/17 at
    N = 4) and O shards that cut a group at N = 4: tp_layer equals layer_fixed's bits."""
    cfg = LayerConfig(hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=8960)
    ql = quantize_layer(random_layer(cfg, seed=3), cfg)
    x = to_act(np.random.default_rng(5).standard_normal((1, cfg.hidden)))

    def attn(q, k, v, pos):                  # any function of q, k, v: here a mix of them
        return q + np.tile(k, 2) - np.tile(v, 2)

    want = layer_fixed(x, ql, cfg, np.array([9]), attn=attn, act_in=True)
    for n, groups in ((2, [35, 35]), (4, [18, 18, 17, 17])):
        split = tp_split(cfg, n)
        assert [(b - a) // 128 for a, b in split.inter] == groups
        y, att, o, down = tp_layer(x, ql, cfg, 9, split, attn)
        assert np.array_equal(y, want)
    assert not split.aligned(split.q_rows(1))


def test_tp_decode_does_not_depend_on_arrival_order(tiny):
    cfg, qm = tiny
    spec = RunSpec(nodes=4, prompt_tokens=32, chunk=16, decode_tokens=2)
    prompt = prompt_tokens(cfg, 32, 2)
    a = tp_golden_run(qm, make_plan(spec, cfg), prompt, 2)
    b = tp_golden_run(qm, make_plan(spec, cfg), prompt, 2, order=[3, 1, 0, 2])
    for x, y in zip(a.logits, b.logits):
        assert np.array_equal(x, y)


def test_tp_golden_refuses_a_split_for_other_nodes(tiny):
    cfg, qm = tiny
    spec = RunSpec(nodes=2, prompt_tokens=32, chunk=16, decode_tokens=1)
    g = TPClusterGolden(qm, make_plan(spec, cfg))
    g.prefill(prompt_tokens(cfg, 32, 1))
    g.split = tp_split(cfg.layer, 4)
    with pytest.raises(TPError, match="split is for 4 nodes"):
        g.decode_token(0)


@pytest.mark.parametrize("inter,nodes", [(256, 2), (256, 4), (8960, 2), (8960, 4)])
def test_tp_ffn_is_the_replicated_ffn_bit_for_bit(inter, nodes):
    """The TP FFN (column-parallel gate/up + SiLU·mul per node, row-parallel down) equals the
    replicated ``down(requantize(silu(gate)·up))`` bit for bit — tiny's intermediate 256 (in
    groups at N = 2, inside a group at N = 4) and Qwen2.5-1.5B's 8,960 (35/35 and 18/18/17/17
    groups) — and each node's shard is exactly its rows of the replicated SiLU row."""
    cfg = LayerConfig(hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=inter)
    ql = quantize_layer(random_layer(cfg, seed=11), cfg)
    x = to_act(np.random.default_rng(inter + nodes).standard_normal((1, cfg.hidden)) * 3)
    xq, xm, xe = requantize(x)
    w = {n: ql.qw[n] for n in ("gate", "up", "down")}

    def gemm(q, m, e, qw):
        return G.gemm(q, m, e, qw.q, qw.m, qw.e, None, qw.group)

    s = V.silu_mul(gemm(xq, xm, xe, w["gate"]), gemm(xq, xm, xe, w["up"]))
    want = gemm(*requantize(s), w["down"])
    split = tp_split(cfg, nodes)
    ffn = tp_ffn(xq, xm, xe, w["gate"], w["up"], w["down"], split.inter)
    assert np.array_equal(ffn.y, want)
    for (r0, r1), shard in zip(split.inter, ffn.shards, strict=True):
        assert np.array_equal(shard, s[:, r0:r1])
        assert np.array_equal(shard, column_ffn(xq, xm, xe, w["gate"], w["up"], (r0, r1)))
    assert len(ffn.down.acc) == nodes and all(np.any(a != sum(ffn.down.acc))
                                              for a in ffn.down.acc)


@pytest.mark.parametrize("heads,kv_heads,head_dim,nodes", [(4, 2, 32, 2), (4, 2, 32, 4),
                                                            (12, 2, 128, 2), (12, 2, 128, 4)])
def test_tp_pre_attention_is_the_replicated_qkv_bit_for_bit(heads, kv_heads, head_dim, nodes):
    """The pre-attention half (replicated RMSNorm + requantisation, column-parallel Q/K/V, RoPE
    of Q per node and of the gathered K) gives the replicated layer's Q, K and V bit for bit —
    tiny's heads and Qwen2.5-1.5B's (12 query heads, 2 KV heads of 128; at N = 4 half a KV
    head per node) — and each node's shards are its rows of them."""
    cfg = LayerConfig(hidden=256, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                      intermediate=256)
    ql = quantize_layer(random_layer(cfg, seed=13), cfg)
    x = to_act(np.random.default_rng(heads + nodes).standard_normal((1, cfg.hidden)) * 3)
    seen = {}

    def attn(q, k, v, pos):
        seen.update(q=q, k=k, v=v)
        return np.zeros((1, heads * head_dim), dtype=np.int64)

    layer_fixed(x, ql, cfg, np.array([21]), attn=attn, act_in=True)
    split = tp_split(cfg, nodes)
    pre = tp_pre_attention(x, ql, cfg, 21, split)
    for name in "qkv":
        assert np.array_equal(getattr(pre, name), seen[name]), name
    for i in range(nodes):
        q0, q1 = split.q_rows(i)
        k0, k1 = split.kv_rows[i]
        assert np.array_equal(pre.q_shards[i], pre.q[:, q0:q1])
        assert np.array_equal(pre.v_shards[i], pre.v[:, k0:k1])
        assert pre.k_shards[i].shape == (1, k1 - k0)
    assert np.array_equal(pre.xq, requantize(V.rmsnorm(x, ql.gamma["g1"], cfg.eps))[0])


# ---- the numerics (mcf.abi.tp) ------------------------------------------------------------------


def test_acc_lanes_sum_exactly_up_to_tp_max_nodes():
    """Worst-case accumulators: the wrapping 32-bit SUM of TP_MAX_NODES contributions' lanes
    decodes to the exact sum; one contribution more wraps the low lanes."""
    top, bottom = (1 << (ACC_BITS - 1)) - 1, -(1 << (ACC_BITS - 1))
    for acc in (np.full(3, top), np.full(3, bottom), np.array([top, bottom, (1 << 24) - 1])):
        lanes = acc_lanes(acc)
        assert np.array_equal(lanes_acc(lanes), acc)
        total = np.zeros_like(lanes)
        for _ in range(TP_MAX_NODES):
            total = wrap(total + lanes, LANE_BITS)
        assert np.array_equal(lanes_acc(total), acc * TP_MAX_NODES)
    worst = acc_lanes(np.array([(1 << ACC_LO_BITS) - 1 + (1 << 40)]))
    tot = np.zeros(2, dtype=np.int64)
    for n in range(1, TP_MAX_NODES + 2):
        tot = wrap(tot + worst, LANE_BITS)
        exact = lanes_acc(tot)[0] == n * ((1 << ACC_LO_BITS) - 1 + (1 << 40))
        assert exact == (n <= TP_MAX_NODES), n
    with pytest.raises(OverflowError):
        acc_lanes(np.array([1 << (ACC_BITS - 1)]))


def test_acc_lanes_sum_random_partials_exactly():
    rng = np.random.default_rng(4)
    parts = rng.integers(-(1 << 46), 1 << 46, size=(8, 64))
    total = np.zeros(128, dtype=np.int64)
    for p in parts:
        total = wrap(total + acc_lanes(p), LANE_BITS)
    assert np.array_equal(lanes_acc(total), parts.sum(axis=0))
    assert np.array_equal(lanes_acc(nic_all_reduce(ReduceOp.SUM, [acc_lanes(p) for p in parts])),
                          parts.sum(axis=0))


def test_absmax_lanes_cover_the_most_negative_code():
    rng = np.random.default_rng(1)
    x = rng.integers(ACT.min_int, ACT.max_int, size=(4, 40))
    x[2, 5] = ACT.min_int
    shards = [x[:, :13], x[:, 13:30], x[:, 30:]]
    red = nic_all_reduce(ReduceOp.MAX, [absmax_lanes(s) for s in shards]).reshape(4, 2)
    assert np.array_equal(lanes_absmax(red), np.max(np.abs(x), axis=1))
    assert np.all(np.abs(np.stack([absmax_lanes(s) for s in shards])) < 1 << 31)


def test_requantize_with_absmax_is_the_whole_rows_requantisation():
    rng = np.random.default_rng(2)
    x = to_act(rng.standard_normal((3, 96)) * 4)
    q, m, e = requantize(x)
    a = np.max(np.abs(x), axis=1)
    for lo, hi in ((0, 32), (32, 50), (50, 96)):
        qs, ms, es = requantize_with_absmax(x[:, lo:hi], a)
        assert np.array_equal(qs, q[:, lo:hi]) and np.array_equal(ms, m) and np.array_equal(es, e)
    own = requantize(x[:, :32])[0]
    assert not np.array_equal(own, q[:, :32])     # the shard's own scale is another one
    with pytest.raises(ValueError, match="absmax"):
        requantize_with_absmax(x, a - 1)


def _gemm_case(seed, k=512, n=48, group=128, big=False):
    """Random weights and a token; ``big``: the first 8 rows all ones against a positive
    token, so their accumulators pass 2^31."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)) / np.sqrt(k)
    x = rng.standard_normal((1, k)) * 3
    if big:
        w[:8] = 1.0
        x = np.abs(x) + 1
    qw = quantize_weight(w, group)
    x = to_act(x)
    xq, xm, xe = requantize(x)
    return qw, x, G.gemm(xq, xm, xe, qw.q, qw.m, qw.e, None, group)


@pytest.mark.parametrize("ranges", [
    [(0, 256), (256, 512)],                          # whole groups
    [(0, 128), (128, 256), (256, 384), (384, 512)],
    [(0, 384), (384, 512)],                          # uneven, whole groups
    [(0, 64), (64, 200), (200, 448), (448, 512)],    # inside groups (zero-padded shards)
])
def test_row_parallel_is_the_gemm_for_any_k_split(ranges):
    """The group sums times mantissas are exact integers: the split need not follow groups —
    group alignment is the engine's job format, not a numerical condition."""
    for seed in range(3):
        qw, x, want = _gemm_case(seed)
        got = row_parallel([x[:, a:b] for a, b in ranges], qw, ranges)
        assert np.array_equal(got.y, want)
        assert np.array_equal(sum(got.acc), partial_acc(requantize(x)[0], qw, (0, 512))[0])


def test_breaking_a_condition_breaks_the_bits():
    """Each condition of mcf.abi.tp matters: a node's own scale, rounding before the sum and a
    single 32-bit lane per accumulator each change the output; the ACT-partial variant stays
    within ⌊(N + 1)/2⌋ codes."""
    ranges = [(0, 128), (128, 256), (256, 384), (384, 512)]
    n = len(ranges)
    own_scale = act_partials = one_lane = 0
    for seed in range(6):
        qw, x, want = _gemm_case(seed, n=64, big=seed % 2 == 1)
        xq, xm, xe = requantize(x)
        # 1. every node requantises with its own shard's scale
        y = np.zeros_like(want)
        accs = []
        for a, b in ranges:
            q_i, m_i, e_i = requantize(x[:, a:b])
            acc = partial_acc(q_i, qw, (a, b))
            y = y + G.epilogue(acc, m_i, e_i, qw.e)
            accs.append(partial_acc(xq[:, a:b], qw, (a, b)))
        own_scale += int(np.sum(y != want))
        # 2. the shared scale, but each node's epilogue (ACT codes summed in one lane)
        parts = [G.epilogue(acc, xm, xe, qw.e) for acc in accs]
        y2 = nic_all_reduce(ReduceOp.SUM, [p.ravel() for p in parts]).reshape(want.shape)
        act_partials += int(np.sum(y2 != want))
        assert np.max(np.abs(y2 - want)) <= (n + 1) // 2
        # 3. the exact partials, but one wrapping 32-bit lane each
        summed = nic_all_reduce(ReduceOp.SUM, [wrap(acc.ravel(), LANE_BITS) for acc in accs])
        y3 = G.epilogue(summed.reshape(want.shape), xm, xe, qw.e)
        one_lane += int(np.sum(y3 != want))
        assert np.any(np.abs(sum(accs)) >= 1 << (LANE_BITS - 1)) == (seed % 2 == 1)
        assert np.array_equal(y3, want) == (seed % 2 == 0)
    assert own_scale > 0 and act_partials > 0 and one_lane > 0


def test_all_reduce_cuts_long_vectors_into_payloads():
    """Qwen2.5-1.5B's hidden 1,536 in two lanes is 12 KiB: six MAX_PAYLOAD packets, one tag each."""
    rng = np.random.default_rng(3)
    parts = rng.integers(-(1 << 40), 1 << 40, size=(4, 1536))
    got = nic_all_reduce(ReduceOp.SUM, [acc_lanes(p) for p in parts])
    assert got.size == 3072 and np.array_equal(lanes_acc(got), parts.sum(axis=0))


# ---- bytes --------------------------------------------------------------------------------------


def test_weight_bytes_are_the_node_blobs(tiny):
    cfg, qm = tiny
    lay, ql = cfg.layer, qm.layers[0]
    one = tp_split(lay, 1)
    blobs = sum(len(gemm_tile_blob(ql.qw[n], 16, 16, ql.bias.get(n)))
                for n in ("q", "k", "v", "o", "gate", "up", "down"))
    assert node_weight_bytes(lay, one, 0) == blobs + 2 * lay.hidden * 4
    sub = ql.qw["down"]
    assert gemm_blob_bytes(sub.q.shape[0], sub.q.shape[1], sub.group) == \
        len(gemm_tile_blob(sub, 16, 16))
    # tiny at N = 4: O and down shards straddle groups; each node stores its touched groups
    four = tp_split(lay, 4)
    assert not four.aligned(four.q_rows(0)) and not four.aligned(four.inter[0])
    assert sum(node_weight_bytes(lay, four, i) for i in range(4)) > node_weight_bytes(lay, one, 0)


def test_qwen_shards_are_group_aligned_and_quartered():
    """Qwen2.5-1.5B at N = 4: 3 query heads and 64 K/V rows per node, the MLP's 70 groups split
    18/18/17/17 (whole groups), each node under a third of the replicated weights."""
    lay = QWEN25_1P5B_MODEL.layer
    s = check_tp(QWEN25_1P5B_MODEL, 4, KR260)
    assert s.heads == ((0, 3), (3, 6), (6, 9), (9, 12))
    assert [b - a for a, b in s.kv_rows] == [64] * 4
    assert [(b - a) // 128 for a, b in s.inter] == [18, 18, 17, 17]
    assert all(s.aligned(s.q_rows(i)) and s.aligned(s.inter[i]) for i in range(4))
    full = node_weight_bytes(lay, tp_split(lay, 1), 0, 28)
    assert all(node_weight_bytes(lay, s, i, 28) < full / 3 for i in range(4))
    assert tp_node_bytes(QWEN25_1P5B_MODEL, s, 0) > node_weight_bytes(lay, s, 0, 28)


# ---- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg, nodes, msg", [
    (QWEN25_1P5B_MODEL.layer, 8, "12 query heads do not split into whole heads per node"),
    (QWEN25_1P5B_MODEL.layer, 3, "256 K/V rows do not split evenly over 3 nodes"),
    (LayerConfig(hidden=96, heads=6, kv_heads=3, head_dim=16, intermediate=256), 3,
     "intermediate size 256 \\(2 groups of 128\\) does not split over 3 nodes"),
    (LayerConfig(hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=200), 2,
     "intermediate size 200 is not a multiple of the weight group 128"),
    (QWEN25_1P5B_MODEL.layer, TP_MAX_NODES * 2, "1..128 nodes"),
    (QWEN25_1P5B_MODEL.layer, 0, "1..128 nodes"),
])
def test_split_refuses_shapes_that_do_not_divide(cfg, nodes, msg):
    with pytest.raises(TPError, match=msg) as e:
        tp_split(cfg, nodes)
    assert "\n" not in str(e.value) and isinstance(e.value, ValueError)


def test_check_refuses_what_the_node_cannot_run(tiny):
    cfg, _ = tiny
    assert check_tp(cfg, 4, SIM).nodes == 4
    with pytest.raises(TPError, match="4 query heads do not split"):
        check_tp(cfg, 3, SIM)
    with pytest.raises(TPError, match="node 0's k/v shard has 16 rows, not a multiple of the "
                                      "sim GEMM's 32"):
        check_tp(cfg, 4, dataclasses.replace(SIM, gemm_rows=32))
    with pytest.raises(TPError, match="node 0's q GEMM has K = 1536, beyond the sim GEMM's 256"):
        check_tp(QWEN25_1P5B_MODEL, 4, SIM)
    with pytest.raises(TPError, match="GEMM groups 64 weights, the model 128"):
        check_tp(cfg, 2, dataclasses.replace(SIM, group=64))


def test_check_refuses_a_shard_beyond_the_ddr():
    """A Qwen2.5-7B-shaped model (28 layers, hidden 3,584, MLP 18,944): its INT4 weights do not
    fit one KR260 with the 1 GiB reserve, its quarter does; a big buffer region tips N = 4 over."""
    big = Qwen2Config(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                      num_key_value_heads=4, head_dim=128, intermediate_size=18944,
                      vocab_size=152064, tie_word_embeddings=False)
    kr = dataclasses.replace(KR260, gemm_k_max=18944)
    with pytest.raises(TPError, match=r"TP over 1 nodes: node 0 needs \d+\.\d MiB of weights "
                                      r"\+ 0\.0 MiB of buffers \+ 1024 MiB reserved, more than "
                                      r"its 4096 MiB of DDR"):
        check_tp(big, 1, kr)
    s = check_tp(big, 4, kr)
    w = tp_node_bytes(big, s, 0)
    with pytest.raises(TPError, match="node 0 needs"):
        check_tp(big, 4, kr, layout_bytes=(4 << 30) - (1 << 30) - w + 1)
    check_tp(big, 4, kr, layout_bytes=(4 << 30) - (1 << 30) - w)


def test_check_tp_run_refuses_partial_kv_heads(tiny):
    """The node program takes whole KV-head groups of query heads per node (so whole KV heads;
    ``mcf run --decode tp`` refuses the rest before any build, in one line)."""
    from mcf.cluster.tp import check_tp_run

    cfg, _ = tiny
    assert check_tp_run(cfg, 2, SIM).heads == ((0, 2), (2, 4))
    with pytest.raises(TPError, match="query heads 0..1 are not whole groups of 4") as e:
        check_tp_run(dataclasses.replace(cfg, num_key_value_heads=1), 2, SIM)
    assert "\n" not in str(e.value)


# ---- the LM head split over the nodes -----------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
def test_head_slices_are_the_golden_head_bit_for_bit(tiny, nodes):
    """Every node's slice of the logits (whole 16-row tiles, as even as possible) concatenated
    is IntModel.head's logits bit for bit, and the largest of the slices' (max, index) pairs is
    the argmax of the whole row — also with ties across slices (the first index wins)."""
    cfg, qm = tiny
    rng = np.random.default_rng(nodes)
    ranges = vocab_split(cfg.vocab_size, nodes, SIM.gemm_rows)
    assert ranges[0][0] == 0 and ranges[-1][1] == cfg.vocab_size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert all(n % SIM.gemm_rows == 0 for n in sizes) and max(sizes) - min(sizes) <= SIM.gemm_rows
    for _ in range(3):
        row = to_act(rng.standard_normal((1, cfg.hidden_size)) * 4)
        whole = IntModel(qm).head(row)[0]
        parts = tp_head(row, qm.norm, qm.lm_head, cfg.rms_norm_eps, ranges)
        assert np.array_equal(np.concatenate(parts), whole)
        pairs = [slice_argmax(p, r[0]) for p, r in zip(parts, ranges)]
        assert merge_argmax(pairs) == int(np.argmax(whole))
    tied = np.array([3, 9, 1, 9, 9, 0, 2, 9])
    halves = [(0, 4), (4, 8)]
    pairs = [slice_argmax(tied[a:b], a) for a, b in halves]
    assert pairs == [(9, 1), (9, 4)] and merge_argmax(pairs[::-1]) == 1 == int(np.argmax(tied))
    assert merge_argmax([(2, 0), (5, 7)]) == 7


def test_head_split_refusals():
    """A vocabulary not in whole GEMM tiles, or with fewer tiles than nodes, is refused; the
    Qwen2.5 vocabulary splits into quarters of ⌈vocab / 4⌉ rows (the system model's head
    bytes per node)."""
    with pytest.raises(TPError, match="multiple of 16"):
        vocab_split(100, 2, 16)
    with pytest.raises(TPError, match="over 4 nodes"):
        vocab_split(48, 4, 16)
    q = vocab_split(QWEN25_1P5B_MODEL.vocab_size, 4, KR260.gemm_rows)
    assert {b - a for a, b in q} == {-(-QWEN25_1P5B_MODEL.vocab_size // 4)}

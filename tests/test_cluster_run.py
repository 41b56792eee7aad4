"""The cluster run (issue #14; docs/cluster.md): the run's integer golden model against the
model's own (:class:`mcf.golden.model.IntModel`), what a run accepts, and ``mcf run`` end to end on
simulated node tops (the ``sim`` configuration under Verilator)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mcf.cli import main
from mcf.cluster import RunError, RunSpec, make_plan, prompt_tokens, run_prompt
from mcf.golden.cluster import ClusterGolden, float_agreement, golden_run
from mcf.golden.model import IntModel, quantize_model
from mcf.mars.routes import RouteAllocator
from mcf.model import model_from_spec
from mcf.node.layer import row_ranges


@pytest.fixture(scope="module")
def tiny():
    cfg, tensors = model_from_spec("tiny", seed=0)
    return cfg, tensors, quantize_model(cfg, tensors)


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_prefill_golden_is_the_model_golden(tiny, nodes):
    """MARS's slices are position-aligned blocks: the node program's prefill gives the integer
    model's bits (block length = the slice)."""
    cfg, _, qm = tiny
    spec = RunSpec(nodes=nodes, prompt_tokens=64, chunk=16, decode_tokens=0)
    run = golden_run(qm, make_plan(spec, cfg), prompt_tokens(cfg, 64, 3), 0)
    ref = IntModel(qm, block_tokens=16 // nodes).prefill(run.prompt)
    assert np.array_equal(run.logits[0], ref[-1])
    assert run.tokens == [int(np.argmax(ref[-1]))]


def test_one_node_decode_is_the_single_pass_model(tiny):
    """On one node nothing is merged: every decode token equals IntModel's single-pass decode."""
    cfg, _, qm = tiny
    spec = RunSpec(nodes=1, prompt_tokens=32, chunk=16, decode_tokens=4)
    prompt = prompt_tokens(cfg, 32, 5)
    run = golden_run(qm, make_plan(spec, cfg), prompt, 4)
    ref = IntModel(qm, block_tokens=16, decode_mode="single").generate(prompt, 5)
    assert run.tokens == ref.tokens.tolist()
    for got, want in zip(run.logits, ref.step_logits):
        assert np.array_equal(got, want)


def test_two_phase_run_is_the_same_for_every_n(tiny):
    """With the two-phase softmax every bit of the run — prompt logits, tokens, every decode
    step's logits — is the same for N = 1, 2, 4 and equals IntModel's exact prefill and
    two-phase decode; the single pass differs between N."""
    cfg, _, qm = tiny
    prompt = prompt_tokens(cfg, 64, 3)

    def runs(softmax):
        return {n: golden_run(qm, make_plan(RunSpec(nodes=n, prompt_tokens=64, chunk=16,
                                                    decode_tokens=3, softmax=softmax), cfg),
                              prompt, 3, softmax) for n in (1, 2, 4)}

    two = runs("two_phase")
    ref = IntModel(qm, block_tokens=8, prefill_mode="exact",
                   decode_mode="two_phase").generate(prompt, 4, chunk=32)   # other blocks, chunks
    for n, run in two.items():
        assert run.tokens == ref.tokens.tolist(), n
        assert np.array_equal(run.logits[0], ref.prompt_logits[-1])
        for got, want in zip(run.logits[1:], ref.step_logits[1:]):
            assert np.array_equal(got, want)
    assert two[2].roots == [0, 1, 0] and two[4].roots == [0, 1, 2]
    one = runs("single")
    assert any(not np.array_equal(a, b) for n in (2, 4)
               for a, b in zip(one[n].logits, one[1].logits))


def test_decode_roots_follow_mars_and_kv_stays_there(tiny):
    cfg, _, qm = tiny
    spec = RunSpec(nodes=2, prompt_tokens=64, chunk=32, decode_tokens=3)
    p = make_plan(spec, cfg)
    g = ClusterGolden(qm, p)
    g.prefill(prompt_tokens(cfg, 64, 1))
    with pytest.raises(ValueError, match="out of order"):
        g.decode_token(1)
    for k in range(3):
        g.decode_token(k)
    assert g.run.roots == [p.decode_owner(k) for k in range(3)] == [0, 1, 0]
    assert len(g.run.tokens) == 4 and len(g.run.logits) == 4
    fa = float_agreement(cfg, model_from_spec("tiny", seed=0)[1], g.run.prompt, g.run.tokens,
                         g.run.logits)
    assert fa.positions == 4 and 0.0 <= fa.top1 <= 1.0 and fa.cosine > 0.5


@pytest.mark.parametrize("kw, msg", [
    ({"nodes": 0}, "--nodes"), ({"policy": "pd"}, "--policy"),
    ({"prompt_tokens": 60}, "multiple of the chunk"), ({"chunk": 30, "prompt_tokens": 60,
                                                         "nodes": 4}, "split evenly"),
    ({"decode_tokens": -1}, "--decode-tokens"), ({"config": "nope"}, "--config"),
    ({"softmax": "double"}, "--softmax"),
    ({"nodes": 1, "chunk": 64}, "KV blocks hold at most 32")])
def test_run_spec_rejects_bad_input(kw, msg):
    with pytest.raises(RunError, match=msg):
        RunSpec(**kw)


def test_row_ranges():
    assert row_ranges(16, 16) == [(0, 16)]
    assert row_ranges(40, 16) == [(0, 16), (16, 16), (32, 8)]
    assert row_ranges(1, 64) == [(0, 1)]


def test_a_slice_over_the_gemm_rows_runs_as_several_jobs():
    """Slices of 32 tokens on the ``sim`` node, whose GEMM takes 16 rows a job: each prefill
    projection is two GEMM jobs of 16 rows, each reading its own requantised rows and writing
    its rows of the output; every template walks without a bad entry. (``RunSpec`` still
    refuses such a run: its RTL run stalled, docs/model.md.)"""
    from mcf.abi.compute import DMA_DESC
    from mcf.abi.jobs import GEMM_JOB, JOB_ARG, walk
    from mcf.cluster.setup import RunSetup

    s = RunSetup.prepare(RunSpec(nodes=2, prompt_tokens=128, chunk=64, decode_tokens=0))
    img = s.image(0x1000)
    m, rows = img.tokens, img.config.gemm_m_max
    assert m == 32 and rows == 16 and img.ranges == [(0, 16), (16, 16)]
    mem = bytearray(img.alloc.at)
    for a, raw in img.image.items():
        mem[a:a + len(raw)] = raw
    cfg = s.model.layer
    for layer, lb in enumerate(img.bufs):
        for t in (2 * layer, 2 * layer + 1):
            acts, counts = walk(lambda a, n: bytes(mem[a:a + n]), img.table, img.table_len,
                                JOB_ARG.const({"template": t}).as_bits(),
                                img.config.gemm_limits)
            assert counts["bad_gemm"] == counts["bad_entries"] == 0
            jobs = [GEMM_JOB.from_bits(v) for _, k, v in acts if k == "gemm_job"]
            assert [int(j.m_count) for j in jobs] == [rows] * len(jobs)
            assert len(jobs) == 2 * (3 if t % 2 == 0 else 4)
        acts, _ = walk(lambda a, n: bytes(mem[a:a + n]), img.table, img.table_len,
                       JOB_ARG.const({"template": 2 * layer}).as_bits(), img.config.gemm_limits)
        wr = {(int(d.addr), int(d.count)) for d in (DMA_DESC.from_bits(v) for _, k, v in acts
                                                    if k == "wr_desc")}
        nq = cfg.heads * cfg.head_dim
        for r0, _ in img.ranges:               # the Q projection's rows of each job
            assert (lb.buf["q"] + r0 * nq * 4, rows) in wr
        assert len(set(lb.xq[cfg.hidden])) == 2


def test_attend_lists_are_sized_from_the_plan():
    """Blocks of 4 tokens (chunk 8 over 2 nodes, 64 tokens): ATTEND lists of up to 16 blocks,
    twice the model image's default; the run's image holds them and every step's program
    names them."""
    from mcf.abi.attend import ATTEND_ARG
    from mcf.abi.node import RecordClass
    from mcf.cluster.setup import RunSetup, StepPrograms
    from mcf.node.layer import ModelImage, max_read_set

    s = RunSetup.prepare(RunSpec(nodes=2, prompt_tokens=64, chunk=8, decode_tokens=1))
    img = s.image(0x1000)
    assert max_read_set(s.plan) == img.max_blocks == 16 > ModelImage.max_blocks
    progs = StepPrograms(s, img)
    longest = max(int(ATTEND_ARG.from_bits(c.arg).blocks)
                  for i in range(1, len(s.plan.steps) + 1) for prog in progs(i)
                  for c in prog.compute if c.cls is RecordClass.ATTEND)
    assert longest == 16


@pytest.mark.parametrize("kw, max_list, msg", [
    ({"prompt_tokens": 1040, "chunk": 16, "nodes": 1}, None, "ATTEND executor takes at most 64"),
    ({"prompt_tokens": 2048, "chunk": 8, "nodes": 1}, 255, "ATTEND executor takes at most 255"),
    ({"prompt_tokens": 1024, "chunk": 16, "nodes": 2}, 255, "directory holds 256"),
])
def test_physical_limits_are_refused_in_one_line(tiny, monkeypatch, kw, max_list, msg):
    """What stays a refusal: the ATTEND executor's list length (``attn_max_list``, at most the
    record's 8-bit ``blocks`` field) and the node's directory depth (``kv_count``), both
    generate-time sizes of the node (a node built with longer lists reaches the directory's)."""
    from dataclasses import replace

    from mcf.abi.node_config import NODE_CONFIGS, SIM

    if max_list is not None:
        monkeypatch.setitem(NODE_CONFIGS, "sim", replace(SIM, attn_max_list=max_list))
    cfg, _, _ = tiny
    with pytest.raises(RunError, match=msg) as exc:
        make_plan(RunSpec(decode_tokens=1, kv_budget=1 << 30, **kw), cfg)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_run_plans_merge_at_most_two_decode_states_per_engine(tiny, nodes):
    """A run's decode reduces along a chain: for every root each reduction engine merges its own
    state and at most one child's, so the merged bits do not depend on arrival order (the
    golden's order is the hardware's); the reversed broadcast tree would make the root merge
    three states at N ≥ 4."""
    from mcf.node.decode import reduction_parents

    cfg, _, _ = tiny
    p = make_plan(RunSpec(nodes=nodes, prompt_tokens=64, chunk=32, decode_tokens=0), cfg)
    for root in range(nodes):
        parents = reduction_parents(p, root)
        assert sorted(parents) == [v for v in range(nodes) if v != root]
        kids = [list(parents.values()).count(v) for v in range(nodes)]
        assert max(kids) == 1 and kids.count(0) == (1 if nodes > 1 else 0)
        v, hops = (root - 1) % nodes, 1             # the leaf is the root's other neighbour
        while v != root:
            v, hops = parents[v], hops + 1
        assert hops == nodes
    for k in range(2 * nodes):                      # what the engines are configured with
        assert max(e.k for e in p.decode_reduce_configs(k)) == 2
    tree = RouteAllocator(p.cluster.topology)
    assert max(tree.children(0).values()) == (2 if nodes > 2 else 1)


@pytest.mark.parametrize("nodes", [2, 4])
def test_the_retrieval_model_answers_passkey_prompts_in_the_run_golden(nodes):
    """The trained checkpoint on the cluster run's integer golden (MARS prefill over ``nodes``,
    decode along the chain): 64-token passkey prompts of seeds 0-3 answered right, which is
    what ``mcf run --model retrieval --task passkey`` checks the RTL against."""
    cfg, tensors = model_from_spec("retrieval")
    qm = quantize_model(cfg, tensors)
    for seed in range(4):
        spec = RunSpec(model="retrieval", nodes=nodes, prompt_tokens=64, decode_tokens=1,
                       seed=seed, task="passkey")
        prompt, answer = run_prompt(spec, cfg)
        assert len(prompt) == 64 and len(answer) == 2
        run = golden_run(qm, make_plan(spec, cfg), prompt, 1)
        assert run.tokens == answer.tolist(), (seed, run.tokens, answer)


@pytest.mark.parametrize("argv, msg", [
    (["--nodes", "3"], "split evenly"),
    (["--prompt-tokens", "48"], "multiple of the chunk"),
    (["--kv-budget-kib", "1"], "too small"),
    (["--model", "/nonexistent"], "not a directory"),
    (["--prompt-tokens", "4096", "--decode-tokens", "1"], "positions"),
    (["--link-fault", "3"], "prefill steps 1..2"),
    (["--task", "passkey", "--decode-tokens", "0"], "at least 1"),
    (["--task", "passkey", "--chunk", "8", "--prompt-tokens", "16"], "at least 19"),
    (["--link-fault", "1", "--link-fault-node", "2"], "--link-fault-node 2"),
    (["--node-config", "kr260"], "does not fit the kr260 node"),
])
def test_mcf_run_bad_arguments_exit_2(argv, msg, capsys):
    assert main(["run", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_mcf_run_rejects_a_checkpoint_that_is_not_qwen2(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["run", "--quiet", "--model", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


# ---- RTL: the simulated cluster ----------------------------------------------------------------


def test_two_nodes_run_the_tiny_model_end_to_end(tmp_path, capsys):
    """``mcf run`` on two node tops: MARS prefill (64 tokens, 2 chunk steps), then 2 decode
    tokens on alternating roots; every step bit-exact (checked in the bench), the LM head on the
    nodes (the first token's head phase, then inside each decode token) writing the golden
    head's logits bit for bit, the tokens the golden model's, the KV owner-only in the nodes'
    directories."""
    out = tmp_path / "run.json"
    assert main(["run", "--quiet", "--nodes", "2", "--prompt-tokens", "64",
                 "--decode-tokens", "2", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["tokens"] == got["golden_tokens"] and len(got["tokens"]) == 3
    assert got["checks"] == {"bit_exact": True, "logits_bit_exact": True, "tokens_match": True,
                             "owner_only": True, "memory_within_budget": True}
    assert got["head_cycles"] > 0 and len(got["logits"]) == 3
    assert got["tokens"] == [int(np.argmax(row)) for row in got["logits"]]
    assert got["roots"] == [0, 1]
    assert got["owned_tokens"] == {"0": 32, "1": 32}
    assert len(got["prefill_step_cycles"]) == 2 and got["ttft_cycles"] == \
        sum(got["prefill_step_cycles"])
    assert len(got["decode_cycles"]) == 2 and min(got["decode_cycles"]) > 0
    assert 0 < got["peak_kv_bytes"] <= got["kv_budget"]
    assert "generated tokens" in capsys.readouterr().out


@pytest.mark.slow
def test_split_slices_run_end_to_end(tmp_path):
    """Chunk 64 over 2 sim nodes: slices of 32 tokens, each GEMM as two 16-row jobs (a template
    of the second layer spans a whole 4 KiB page of the table: the walker's reader once hung
    there) — prefill and 2 decode tokens bit-exact."""
    out = tmp_path / "run.json"
    assert main(["run", "--quiet", "--nodes", "2", "--prompt-tokens", "64", "--chunk", "64",
                 "--decode-tokens", "2", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["tokens"] == got["golden_tokens"] and all(got["checks"].values())


@pytest.mark.slow
def test_four_nodes_run_the_tiny_model_end_to_end(tmp_path, request):
    """Four node tops (chunk 32 in slices of 8 tokens; its own Verilator build): the prefill,
    then 3 decode tokens on roots 0, 1, 2, each reduced along a chain of four nodes."""
    markexpr = request.config.getoption("markexpr") or ""
    if "slow" not in markexpr or "not slow" in markexpr:
        pytest.skip("four node tops: pytest -m slow tests/test_cluster_run.py")
    out = tmp_path / "run.json"
    assert main(["run", "--quiet", "--nodes", "4", "--prompt-tokens", "64",
                 "--decode-tokens", "3", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["tokens"] == got["golden_tokens"] and len(got["tokens"]) == 4
    assert all(got["checks"].values()) and got["roots"] == [0, 1, 2]
    assert got["owned_tokens"] == {str(v): 16 for v in range(4)}


# ---- --decode tp (issue #34) ---------------------------------------------------------------------


@pytest.mark.parametrize("kw, msg", [
    ({"decode": "both"}, "--decode 'both'"),
    ({"decode": "tp", "nodes": 4}, "--decode tp runs on 2 nodes, not 4"),
    ({"decode": "tp", "softmax": "two_phase"}, "single-pass softmax")])
def test_run_spec_refuses_what_tp_decode_does_not_build(kw, msg):
    with pytest.raises(RunError, match=msg):
        RunSpec(**kw)
    assert RunSpec(decode="tp").decode == "tp" and RunSpec().decode == "root"


@pytest.mark.parametrize("argv, msg", [
    (["--decode", "tp", "--nodes", "4"], "runs on 2 nodes"),
    (["--decode", "tp", "--softmax", "two_phase"], "single-pass softmax"),
])
def test_mcf_run_decode_tp_bad_arguments_exit_2(argv, msg, capsys):
    assert main(["run", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


@pytest.mark.slow
def test_two_nodes_run_tp_decode_end_to_end(tmp_path):
    """``mcf run --decode tp`` on two node tops: the same MARS prefill, then 2 decode tokens
    tensor-parallel (every layer: pre half, KV-parallel attention with each head normalised
    at its owner, post half; the LM head at the root): every node's own heads' OBUF rows and
    every layer's output row bit-exact against the TP golden (itself checked equal to the
    replicated root's), the logits and tokens the golden's."""
    out = tmp_path / "run.json"
    assert main(["run", "--quiet", "--nodes", "2", "--prompt-tokens", "64",
                 "--decode-tokens", "2", "--decode", "tp", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["tokens"] == got["golden_tokens"] and len(got["tokens"]) == 3
    assert all(got["checks"].values()) and got["spec"]["decode"] == "tp"
    assert got["roots"] == [0, 1]
    assert len(got["decode_cycles"]) == 2 and min(got["decode_cycles"]) > 0

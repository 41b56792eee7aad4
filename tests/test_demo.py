"""``mcf demo`` (issue #15 §5, issue #17 §5): bad arguments, and the demo end to end, one node
per MPI rank (the ``node_rank`` build the MPI test shares): a 64-token passkey prompt under
MARS on two simulated node tops, the two-phase runs on N = 1 and 4 (``n_invariant``: the
extremes of the demo's default 1, 2, 4; the four-rank run is the default suite's only RTL
ring of four), every check, and the system model's small grid."""

import json

import pytest

from mcf.cli import main
from mcf.commands.demo import CHECKS, n_invariant


@pytest.mark.parametrize("argv, words", [
    (["--policies", "mars,pd"], "--policies"),
    (["--policies", "mars,mars"], "--policies"),
    (["--nodes", "3"], "split evenly"),
    (["--prompt-tokens", "40"], "multiple of the chunk"),
    (["--prompt-tokens", "8", "--chunk", "8"], "at least"),
    (["--decode-tokens", "0"], "--decode-tokens"),
    (["--parallel", "0"], "--parallel"),
    (["--invariance-nodes", "2"], "--invariance-nodes"),
    (["--invariance-nodes", "1,x"], "--invariance-nodes"),
    (["--invariance-nodes", "2,2"], "--invariance-nodes"),
    (["--invariance-nodes", "1,3"], "split evenly"),
])
def test_bad_arguments_get_one_line_and_exit_2(argv, words, capsys, tmp_path):
    assert main(["demo", "--quiet", "--out", str(tmp_path / "r"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err
    assert not (tmp_path / "r").exists()


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["demo", "--quiet", "--out", str(f)]) == 2
    assert "--out" in capsys.readouterr().err


def test_n_invariant_needs_equal_bits_and_passing_runs():
    ok = {"checks": {"bit_exact": True}, "tokens": [1, 2], "logits": [[3, 4], [5, 6]]}
    assert n_invariant({1: ok, 2: dict(ok), 4: dict(ok)})[0]
    assert not n_invariant({1: ok, 2: dict(ok, logits=[[3, 4], [5, 7]])})[0]
    assert not n_invariant({1: ok, 2: dict(ok, tokens=[1, 3])})[0]
    assert not n_invariant({1: ok, 2: dict(ok, checks={"bit_exact": False})})[0]
    why = n_invariant({1: ok, 2: {"failed": "link fault at node 1"}})
    assert why == (False, "N = 2: link fault at node 1")


def test_a_small_demo_answers_and_writes_its_report(tmp_path, capsys):
    out = tmp_path / "report"
    status = main(["demo", "--quiet", "--policies", "mars", "--quick", "--nodes", "2",
                   "--invariance-nodes", "1,4", "--out", str(out)])
    s = json.loads((out / "summary.json").read_text())
    assert status == 0, s
    assert set(CHECKS) <= set(s["checks"])
    for name in CHECKS:
        assert s["checks"][name] is True
    assert s["failed_runs"] == {}
    inv = s["n_invariant"]
    assert inv["passed"] and [int(n) for n in inv["runs"]] == [1, 4]
    assert len({str(r["tokens"]) for r in inv["runs"].values()}) == 1
    run = s["rtl"]["runs"]["mars"]
    assert inv["runs"]["4"]["tokens"][:len(run["expected"])] == run["expected"]
    assert s["rtl"]["nodes"] == 2 and s["rtl"]["prompt_tokens"] == 64
    assert run["answer"] == run["expected"] and run["correct"] is True
    assert run["checks"] == {"bit_exact": True, "logits_bit_exact": True, "tokens_match": True,
                             "owner_only": True, "memory_within_budget": True}
    assert run["ttft_cycles"] > 0 and len(run["decode_cycles"]) == 1
    m = s["model"]
    n = m["nodes"]                       # the small grid's largest N
    for key in ("speedup_vs_best_fair", "speedup_vs_ring", "speedup_vs_zigzag",
                "traffic_ratio_vs_ring"):
        assert m[f"{key}_n{n}"] > 0
    assert m[f"speedup_vs_best_fair_n{n}"] <= m[f"speedup_vs_ring_n{n}"]
    assert m["decode_tok_s_4_nodes"] > 0 and m["decode_tok_s_4_nodes_tp"] > 0
    predicted = s["rtl"]["model_predicted_ttft_cycles"]["mars"]
    assert m["model_vs_rtl_cycle_error"] == pytest.approx(
        abs(predicted - run["ttft_cycles"]) / run["ttft_cycles"], abs=1e-3)
    assert m["model_vs_rtl_cycle_error"] < 0.15
    for name in ("summary.md", "evaluation.json", "table1_ttft_vs_nodes.png", "crossover.png"):
        assert (out / name).stat().st_size > 0
    assert "| mars |" in (out / "summary.md").read_text()
    printed = capsys.readouterr().out
    assert "mars    answer" in printed and "right" in printed

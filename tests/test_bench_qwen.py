"""`mcf bench qwen` (issue #35 items 2-3, mcf.sim.perf.qwen): the model's prediction of the
Qwen2.5-1.5B run at full dimension, the comparison arithmetic, `all` leaving the hours-long bench
out, and (slow) the reduced path end to end on two sim node tops."""

from __future__ import annotations

import pytest

from mcf.abi.node_config import KR260
from mcf.sim.perf.qwen import QWEN, SMALL, compare, model_config, predict


def test_qwen_prediction_at_full_dimension():
    cfg = model_config(QWEN)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size) == \
        (1536, 1, 8960, 151936)
    for nodes in (2, 4):
        pred = predict(QWEN.spec(nodes, resolve=False), cfg=cfg)
        steps = pred["prefill_step_cycles"]
        assert len(steps) == QWEN.prompt_tokens // QWEN.chunk
        assert pred["ttft_cycles"] == pytest.approx(sum(steps))
        # a node's prefill GEMMs alone: its share of one layer's MACs at the array's peak
        layer_macs = QWEN.prompt_tokens * cfg.hidden_size * (
            2 * cfg.hidden_size + 2 * cfg.num_key_value_heads * cfg.head_dim
            + 3 * cfg.intermediate_size)
        assert pred["ttft_cycles"] > layer_macs / nodes / KR260.macs_per_cycle
        # a decode token streams at least the tied LM head's INT4 codes (four 16-byte ports)
        head_bytes = cfg.vocab_size * cfg.hidden_size // 2
        assert len(pred["decode_cycles_per_token"]) == QWEN.decode_tokens
        assert all(c > head_bytes / 64 for c in pred["decode_cycles_per_token"])
    assert predict(QWEN.spec(4, resolve=False), cfg=cfg)["ttft_cycles"] < \
        predict(QWEN.spec(2, resolve=False), cfg=cfg)["ttft_cycles"]


def test_compare_arithmetic():
    got = {"checks": {"a": True}, "tokens": [1, 2], "ttft_cycles": 1000,
           "prefill_step_cycles": [400, 600], "head_cycles": 50, "decode_cycles": [200],
           "sim_cycles": 1500, "wall_seconds": 2.0, "node_cycles_per_second": 1500.0}
    pred = {"prefill_step_cycles": [450.0, 650.0], "ttft_cycles": 1100.0,
            "decode_cycles_per_token": [180.0, 190.0], "layers": 2}
    e = compare(None, got, pred)
    assert e["bit_exact"] and e["ttft_error"] == pytest.approx(0.1)
    assert e["decode_errors"] == [pytest.approx(-0.1)]
    assert e["predicted_decode_cycles"] == [180.0]
    assert e["prefill_cycles_per_layer"] == 500 and e["decode_cycles_per_token"] == 200


def test_all_leaves_qwen_out(monkeypatch, tmp_path):
    import mcf.commands.bench as bench

    ran = []
    monkeypatch.setattr(bench, "run_benches",
                        lambda names, **kw: (ran.extend(names), ({}, []))[1])
    from mcf.cli import main
    assert main(["bench", "--out", str(tmp_path)]) == 0
    assert "qwen" not in ran and "depth" in ran
    ran.clear()
    assert main(["bench", "qwen", "--out", str(tmp_path)]) == 0
    assert ran == ["qwen"]


@pytest.mark.slow
def test_small_run_end_to_end():
    """The reduced path (tiny model, sim node tops, N = 2): bit-exact, and the model's error
    is a number the bench reports (not asserted: a figure)."""
    from mcf.sim.perf.qwen import collect, render

    r = collect(small=True)
    assert r["n2.bit_exact"] is True
    assert r["runs"]["n2"]["ttft_cycles"] == sum(r["runs"]["n2"]["prefill_step_cycles"])
    assert len(r["runs"]["n2"]["decode_cycles"]) == SMALL.decode_tokens
    assert r["model_vs_rtl_cycle_error"] >= 0
    assert "n2" in render(r)

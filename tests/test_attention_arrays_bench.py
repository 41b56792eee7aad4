"""The bench of the attention engine on the GEMM's arrays (:mod:`mcf.sim.perf.attention_arrays`,
issue #33) and the system model's use of it (:mod:`mcf.sysmodel.rates`,
``attention_arrays.json``): the small path bit-exact at a small configuration with
``attn_on_arrays`` and at the kr260 shape (slow), a word off the golden model refused; a node with
``attn_on_arrays`` priced at the arrays' measured pair cycles, one without it at the vector
engine's as before, and a missing or mismatched measurement refused."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import numpy as np
import pytest

from mcf.abi.node_config import KR260, SIM
from mcf.mars import get_model
from mcf.sim.perf import BenchRefused
from mcf.sim.perf import attention_arrays as bench
from mcf.sysmodel.calibration import CalibrationError, load_figures, results_dirs
from mcf.sysmodel.rates import ARRAY_SHAPE, NodeRates, ProgramOverheads, attend_pair_rate

DOCS = results_dirs()[1]

SMALL = replace(SIM, name="arrays_small", attn_head_dim=128, attn_lanes=8, attn_block=128,
                tile_keys=4, tile_lanes=16, tile_on_gemm=True, attn_on_arrays=True)
"""The sim node at head_dim 128 (the GEMM's group) with every ATTEND on its one 16 × 16 GEMM
array (tests/test_node_compute_tile.py's ``ARRAYS``): ArrayEngine small enough for the default
suite."""

def _check_result(r: dict, cfg) -> None:
    assert r["shape"] == bench.shape(cfg)
    assert {k: r["shape"][k] for k in ARRAY_SHAPE} == {k: getattr(cfg, f)
                                                        for k, f in ARRAY_SHAPE.items()}
    assert r["decode_cycles_per_qk"] > 0 and r["prefill_cycles_per_qk"] > 0
    for name, row in r["cases"].items():
        assert row["steady_cycles"] > 0 and row["cycles_per_qk"] > 0, name
        assert row["whole_cycles"] > row["steady_cycles"], name
        assert 0 < row["array_utilization"] <= 1, name


def test_small_path_bit_exact_on_a_small_node():
    """The small path at SMALL's shape (GQA 2:1, the largest it has): every word the golden
    model's (else it refuses), figures > 0, the shape the configuration's."""
    r = bench.collect(SMALL, small=True)
    assert sorted(r["cases"]) == ["decode_g2", "prefill_g2"]
    assert r["small"] and r["decode_cycles_per_qk"] == r["cases"]["decode_g2"]["cycles_per_qk"]
    _check_result(r, SMALL)


def test_a_word_off_the_golden_model_refuses():
    """One job whose expected first word is flipped: no figure, a BenchRefused."""
    case = bench.cases(True, SMALL.attn_block, SMALL.attn_heads)[0]
    jobs, _ = bench.case_jobs(case, SMALL.attn_head_dim, SMALL.attn_block,
                              np.random.default_rng(1))
    with pytest.raises(BenchRefused, match="1 word.* differ from the golden model"):
        bench.run_case(SMALL, case, jobs[1:2], fault="expected")


def test_only_a_node_with_the_engine_on_the_arrays_is_measured():
    with pytest.raises(ValueError, match="attn_on_arrays"):
        bench.shape(replace(KR260, attn_on_arrays=False))
    assert KR260.attn_on_arrays and KR260.attn_lanes == 16
    assert bench.shape(KR260)["dsp"] == "model"       # the DSP48E2s as their model


@pytest.mark.slow
def test_small_path_bit_exact_at_the_kr260_shape():
    """The small path at the kr260 shape with the engine on the arrays (GQA 6:1, one 256-key
    block per job; a few minutes in amaranth.sim).

        pytest -m slow tests/test_attention_arrays_bench.py -k kr260
    """
    r = bench.collect(KR260, small=True)
    assert sorted(r["cases"]) == ["decode_g6", "prefill_g6"]
    _check_result(r, KR260)


# --- the system model -------------------------------------------------------------------------

def _arrays_doc(cfg, cycles: dict[int, float], decode: float = 1.0) -> dict:
    """An attention_arrays.json of ``cfg``'s shape with the given prefill cycles per pair."""
    cases = {}
    for g, c in cycles.items():
        cases[f"decode_g{g}"] = {"kind": "decode", "heads": g, "cycles_per_qk": decode}
        cases[f"prefill_g{g}"] = {"kind": "prefill", "heads": g, "cycles_per_qk": c}
    return {"decode_cycles_per_qk": decode, "prefill_cycles_per_qk": cycles[max(cycles)],
            "cases": cases, "shape": bench.shape(cfg), "small": False}


def _results(tmp_path, doc: dict | None):
    d = tmp_path / "results"
    shutil.copytree(DOCS, d)
    (d / "attention_arrays.json").unlink(missing_ok=True)
    if doc is not None:
        (d / "attention_arrays.json").write_text(json.dumps(doc))
    return d


@pytest.fixture(scope="module")
def qwen():
    return get_model("qwen2.5-1.5b")


def test_a_node_on_the_arrays_takes_the_arrays_pair_cycles(tmp_path, qwen):
    """attn_on_arrays: the prefill case of the model's GQA group (6:1), as measured (no lane
    scaling); the source names the file and the case. A node without it keeps the vector
    engine's figure carried to its lanes. (``tile_chunk=0``: per-token PREFILL records, so the
    pair rate prices every ATTEND; the copied results hold no tiled rate to need.)"""
    d = _results(tmp_path, _arrays_doc(KR260, {6: 1.25, 2: 2.5}))
    fig = load_figures([d])
    assert fig.attention_arrays is not None
    assert fig.attention_arrays.pair_cycles(6) == (1.25, "prefill_g6")
    ov = ProgramOverheads.measure(fig)
    r = NodeRates.calibrated(fig, KR260, qwen, measured=ov, tile_chunk=0)
    assert r.attend_pair_cycles == 1.25
    src = r.sources["attend_pair_cycles"]
    assert "attention_arrays.json" in src and "prefill_g6" in src
    assert attend_pair_rate(fig, KR260, get_model("tiny"))[0] == 2.5    # GQA 2:1
    vec = replace(KR260, name="vector", attn_on_arrays=False)
    cpq, case = fig.attention_pair_cycles(6)
    want = cpq * (qwen.head_dim / vec.attn_lanes) / (fig.attention_head_dim
                                                      / fig.attention_lanes)
    assert NodeRates.calibrated(fig, vec, qwen, measured=ov,
                                tile_chunk=0).attend_pair_cycles == pytest.approx(want)
    # the per-token ATTEND work is priced with it: pairs x the arrays' cycles
    assert r.attend_pair_cycles < NodeRates.calibrated(fig, vec, qwen, measured=ov,
                                                       tile_chunk=0).attend_pair_cycles


def test_a_missing_or_mismatched_arrays_rate_is_refused(tmp_path, qwen):
    fig = load_figures([_results(tmp_path / "none", None)])
    assert fig.attention_arrays is None
    assert "no attention_arrays.json" in fig.sources["attention_arrays"]
    with pytest.raises(CalibrationError, match="attn_on_arrays"):
        NodeRates.calibrated(fig, KR260, qwen, tile_chunk=0)
    NodeRates.calibrated(fig, SIM, get_model("tiny"))          # a node without needs none
    for key, value in (("lanes", 32), ("keys", 8), ("arrays", 1), ("chain", 1)):
        doc = _arrays_doc(KR260, {6: 1.25})
        doc["shape"][key] = value
        fig = load_figures([_results(tmp_path / key, doc)])
        with pytest.raises(CalibrationError, match="measured at"):
            NodeRates.calibrated(fig, KR260, qwen, tile_chunk=0)
    doc = _arrays_doc(KR260, {6: 1.25})
    del doc["cases"]["prefill_g6"]
    with pytest.raises(CalibrationError, match="no prefill case"):
        load_figures([_results(tmp_path / "nocase", doc)])


def test_the_committed_measurement_is_the_kr260_shape():
    """docs/results/attention_arrays.json: the full run (not the small path) at the kr260
    node's shape, every case's figure > 0."""
    doc = json.loads((DOCS / "attention_arrays.json").read_text())
    assert not doc["small"]
    assert {k: doc["shape"][k] for k in ARRAY_SHAPE} == {
        k: getattr(KR260, f) for k, f in ARRAY_SHAPE.items()}
    assert sorted(doc["cases"]) == ["decode_g2", "decode_g6", "prefill_g2", "prefill_g6"]
    assert all(row["cycles_per_qk"] > 0 for row in doc["cases"].values())

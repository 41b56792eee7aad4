"""The paper's evaluation on the system model (``mcf.sysmodel.evaluation``, ``mcf model
--evaluate``; docs/evaluation.md): the small grid's values against the issue's targets (MARS
never more than 2 % slower than the best fair baseline, within 5 % of full replication where
it fits, a speedup in the communication-bound corner), the memory trace, the decode row against
its roofline, the paper's arithmetic, the report files and the command's errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcf.cli import main
from mcf.mars import get_model
from mcf.mars.setting import paper_setting
from mcf.sysmodel.calibration import load_figures
from mcf.sysmodel.evaluation import (
    AS_BUILT,
    SCOPES,
    EvalSpec,
    count_runs,
    decode,
    decode_bytes,
    decode_targets,
    evaluate,
    paper_checks,
    scaled_rates,
    scope_ops,
    speedups,
    table2_decode,
    write_report,
)
from mcf.sysmodel.rates import NodeRates

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fig():
    return load_figures()


@pytest.fixture(scope="module")
def spec():
    st = paper_setting()
    return EvalSpec(st.alpha, st.kv_budget_mib).quick()


@pytest.fixture(scope="module")
def ev(fig, spec):
    labels = []
    out = evaluate(spec, fig, labels.append)
    assert len(labels) == count_runs(spec)
    return out


def test_mars_never_slower_than_the_best_fair_baseline(ev, spec):
    sp = ev.speedups()
    assert {(s["scope"], s["nodes"]) for s in sp} == {(c, n) for c in SCOPES for n in spec.nodes}
    for s in sp:
        assert s["speedup_vs_best_fair"] >= 1 / 1.02
        assert s["speedup_vs_ring"] >= s["speedup_vs_best_fair"] - 1e-12
    assert len(ev.crossover) == len(SCOPES) * len(spec.compute_scales) * len(spec.link_gbps)
    for p in ev.crossover:
        assert p.speedup >= 1 / 1.02
        assert p.ttft_s[p.best_fair] == min(p.ttft_s["ring"], p.ttft_s["zigzag"])
    t = ev.targets()
    assert t["mars_within_1_02_of_best_fair"]
    assert t["worst_mars_over_best_fair"]["ratio"] <= 1.02


def test_within_five_percent_of_full_replication_where_it_fits(ev, spec):
    fits = ev.targets()["full_replication_fits"]
    # the 4K prompt's 28 MiB of KV fits S_node = 64 MiB on every node: full replication holds
    assert {(f["scope"], f["nodes"], f["seq_len"]) for f in fits} >= {
        ("model", n, spec.seq_len) for n in spec.nodes}
    assert all(f["mars_over_full"] <= 1.05 for f in fits)
    assert ev.targets()["mars_within_5pc_of_full"]


def test_the_communication_bound_corner(ev, spec):
    for scope in SCOPES:
        pts = {(p.link_gbps, p.compute_scale): p for p in ev.crossover if p.scope == scope}
        corner = pts[min(spec.link_gbps), max(spec.compute_scales)]
        compute_bound = pts[max(spec.link_gbps), min(spec.compute_scales)]
        assert corner.speedup == max(p.speedup for p in pts.values())
        assert corner.speedup > 1.1
        assert compute_bound.speedup == pytest.approx(1.0, abs=0.01)
        assert corner.exposed_s["zigzag"] > corner.exposed_s["mars"]
    best = ev.targets()["largest_map_speedup"]
    assert best["link_gbps"] == min(spec.link_gbps)
    assert best["compute_scale"] == max(spec.compute_scales)


def test_scaled_rates(fig):
    rates = NodeRates.calibrated(fig, "kr260", get_model("qwen2.5-1.5b"))
    assert scaled_rates(rates, 1) is rates
    fast = scaled_rates(rates, 4)
    assert fast.attend_pair_cycles == pytest.approx(rates.attend_pair_cycles / 4)
    assert fast.gemm_macs_per_cycle == pytest.approx(rates.gemm_macs_per_cycle * 4)
    assert fast.kv_read_bytes_per_cycle == pytest.approx(rates.kv_read_bytes_per_cycle * 4)
    assert rates.tile_chunk == fast.tile_chunk > 0                  # kr260's tiled prefill
    for f in ("record", "row", "row_block", "key", "row_key"):
        assert getattr(fast, f"tile_{f}_cycles") == pytest.approx(
            getattr(rates, f"tile_{f}_cycles") / 4)


def test_operating_point_follows_the_paper_and_our_rate(ev):
    qwen = get_model("qwen2.5-1.5b")
    for o in ev.operating_points:
        assert o.ops == scope_ops(qwen, 16384, o.scope)
        assert o.paper_rate_ops_s == pytest.approx(o.ops / (2 * 1.68))
        assert o.compute_scale == pytest.approx(o.paper_rate_ops_s / o.our_rate_ops_s)
        assert o.compute_scale > 10         # the paper's node is far faster than ours


def test_memory_converges_to_owner_only(ev, spec):
    assert [m.nodes for m in ev.memory] == list(spec.memory_nodes)
    for m in ev.memory:
        assert len(m.steps) == spec.seq_len // spec.chunk + 1
        assert max(m.max_kv_mib) <= m.budget_mib
        assert max(m.max_kv_mib) > m.owner_only_mib[-1]       # replicas were made
        assert m.replica_factor[0] > 1 and m.replica_factor[-1] == 1
        assert m.mean_kv_mib[-1] == pytest.approx(m.owner_only_mib[-1])
        assert m.final_owner_only


def test_decode_row(fig):
    qwen = get_model("qwen2.5-1.5b")
    rates = NodeRates.calibrated(fig, "kr260", qwen)
    rows = {r.mode: r for r in decode(fig, rates, qwen, 4, 16384)}
    assert len(rows) == 2                                   # one weight path: the node as built
    rep, tp = rows["replicated"], rows["tensor-parallel"]
    assert rep.weight_path == tp.weight_path == AS_BUILT
    assert rep.weight_bytes_per_cycle == fig.stripe_weight_bytes_per_cycle
    assert rep.weight_bytes_per_node == decode_bytes(qwen, 1)[0]
    assert rep.weight_bytes_per_node == rep.layer_bytes + rep.lm_head_bytes
    assert rep.roofline_tok_s * rep.weight_bytes_per_node == pytest.approx(
        tp.roofline_tok_s * tp.weight_bytes_per_node)       # the same DDR peak
    assert 3.8 < tp.roofline_tok_s / rep.roofline_tok_s < 4   # the busiest node's shards
    for r in rows.values():
        assert r.tok_s < r.roofline_tok_s
        assert r.tok_s == pytest.approx(1 / (max(r.weights_s, r.gemm_s) + r.vector_s
                                             + r.attention_s + r.network_s))
        assert r.network_s == pytest.approx(sum(r.network.values()))
    assert rep.tok_s < tp.tok_s
    assert tp.network_s > rep.network_s                     # the all-reduces
    assert tp.vector_s < rep.vector_s                       # the shards' passes split
    short = {(r.mode, r.weight_path): r for r in decode(fig, rates, qwen, 4, 1024)}
    assert short[rep.mode, rep.weight_path].attention_s < rep.attention_s


# Qwen2.5-1.5B's bytes per token as the node stores its GEMM blobs (INT4 codes, a 16-bit scale
# per row and group of 128, a 32-bit bias per row) — by hand:
LAYER = 24_219_648 + 2 * 1536 * 4          # mcf bench decode's one-layer stream + 2 RMSNorms
HEAD = 151_936 * (1536 // 2 + 12 * 2 + 4) + 1536 * 4     # tied LM head + final RMSNorm
# tensor-parallel, N = 4, the busiest node: 3 query heads (384 rows), 64 K and 64 V rows,
# O with K = 384, 18 of the MLP's 70 groups (2,304 rows), down with K = 2,304
TP4_LAYER = (384 * (768 + 24 + 4) + 2 * 64 * (768 + 24 + 4) + 1536 * (192 + 3 * 2 + 4)
             + 2 * 2304 * (768 + 24 + 4) + 1536 * (1152 + 18 * 2 + 4) + 2 * 1536 * 4)
TP4_HEAD = 37_984 * (768 + 24 + 4) + 1536 * 4


def test_decode_bytes_by_hand():
    qwen = get_model("qwen2.5-1.5b")
    assert decode_bytes(qwen, 1)[:3] == (28 * LAYER + HEAD, 28 * LAYER, HEAD)
    assert decode_bytes(qwen, 4)[:3] == (28 * TP4_LAYER + TP4_HEAD, 28 * TP4_LAYER, TP4_HEAD)


def test_decode_row_from_the_measured_stripe_rate(tmp_path):
    """Table 2's decode row (the node as built: weights through the stripe readers) reads its
    weight rate from decode.json's ``weights_ddr90.weight_bytes_per_cycle`` and nothing else:
    with 40 B/cycle written into a copy of the results, a one-board token streams its 799 MB in
    bytes / (40 x clock); no decode.json, no decode row."""
    import shutil

    from mcf.abi.platform import ACLK_HZ
    from mcf.sysmodel.calibration import CalibrationError
    d = tmp_path / "results"
    shutil.copytree(ROOT / "docs" / "results", d)
    dec = json.loads((d / "decode.json").read_text())
    dec["weights_ddr90"]["weight_bytes_per_cycle"] = 40.0
    dec["weights"]["weight_bytes_per_cycle"] = 60.0
    (d / "decode.json").write_text(json.dumps(dec))
    f = load_figures([d])
    assert f.stripe_weight_bytes_per_cycle == 40.0
    assert f.sources["stripe_weight_bytes_per_cycle"].endswith(
        "decode.json: weights_ddr90.weight_bytes_per_cycle")
    qwen = get_model("qwen2.5-1.5b")
    rates = NodeRates.calibrated(f, "kr260", qwen)
    rows = table2_decode(f, rates, qwen, 4, 1024)
    by = {(r.key, r.weight_path): r for r in rows}
    assert [r.key for r in rows] == ["replicated_1", "tp_4_switch10g", "replicated_4",
                                     "tp_4_kr260_ring"]
    assert {r.weight_path for r in rows} == {AS_BUILT}
    one = by["replicated_1", AS_BUILT]
    assert one.nodes == 1 and one.network_s == 0 and one.link == "-"
    assert one.weight_bytes_per_node == 28 * LAYER + HEAD == 799_441_408
    assert one.weights_s == pytest.approx(799_441_408 / (40 * ACLK_HZ), rel=1e-12)
    tp = by["tp_4_switch10g", AS_BUILT]
    assert tp.weights_s == pytest.approx((28 * TP4_LAYER + TP4_HEAD) / (40 * ACLK_HZ),
                                         rel=1e-12)
    assert tp.roofline_tok_s == pytest.approx(64 * ACLK_HZ / (28 * TP4_LAYER + TP4_HEAD))
    for r in rows:
        assert r.tok_s == pytest.approx(1 / (max(r.weights_s, r.gemm_s) + r.vector_s
                                             + r.attention_s + r.network_s))
    assert set(by["tp_4_kr260_ring", AS_BUILT].network) == {
        "attention", "kv_gather", "allreduce_max", "allreduce_sum", "head_gather"}
    # the 10G switch carries the SUM all-reduces faster than the ring's 1G cables
    assert by["tp_4_switch10g", AS_BUILT].network["allreduce_sum"] < \
        by["tp_4_kr260_ring", AS_BUILT].network["allreduce_sum"]
    tg = decode_targets(rows, 1024)
    assert tg["as_built"]["replicated_1"] == one.tok_s
    assert set(tg) == {"context", "as_built"}
    assert set(tg["as_built"]) == {
        "replicated_1", "replicated_4", "tp_4_kr260_ring", "tp_4_switch10g"}
    (d / "decode.json").unlink()
    f = load_figures([d])
    assert f.stripe_weight_bytes_per_cycle is None
    with pytest.raises(CalibrationError, match="mcf bench decode"):
        decode(f, rates, qwen, 4, 1024)


def test_paper_arithmetic():
    checks = paper_checks(get_model("qwen2.5-1.5b"))
    text = " ".join(c.arithmetic for c in checks)
    assert "19.6 Tops/s" in text             # 6.6e13 ops / (2 x 1.68 s)
    assert "13.95 GiB" in text               # eq 21 at N = 16
    assert "12.8 GB/s" in text               # four HP ports at 200 MHz
    assert len(checks) == 8


def test_report_files(ev, tmp_path):
    written = write_report(ev, tmp_path / "r")
    names = {p.name for p in written}
    assert names == {"fig3_ttft_vs_seq.png", "fig4_memory.png", "fig5_chunk.png",
                     "table1_ttft_vs_nodes.png", "crossover.png", "summary.md",
                     "evaluation.json"}
    for p in written:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            assert p.stat().st_size < 200_000
    doc = json.loads((tmp_path / "r" / "evaluation.json").read_text())
    assert set(doc) == {"spec", "clock_hz", "calibration", "covers", "fig3", "fig4", "fig5",
                        "table1", "table2_decode", "crossover", "paper_checks", "targets",
                        "clocks", "notes"}
    assert [c["clock_mhz"] for c in doc["clocks"]] == [300.0, 250.0]
    assert set(doc["covers"]) == set(SCOPES)
    assert doc["table1"]["paper"]["mars"]["2"]["ttft_s"] == 1.68
    assert set(doc["table2_decode"]["tok_s"]["as_built"]) == {
        "replicated_1", "replicated_4", "tp_4_kr260_ring", "tp_4_switch10g"}
    md = (tmp_path / "r" / "summary.md").read_text()
    assert "## Crossover map" in md and "whole model" in md
    assert "## Table 1 and Table 2 at 300 and 250 MHz" in md


def test_mcf_model_evaluate(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["model", "--evaluate", "--quick", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "wrote 7 files" in text and "largest map speedup" in text
    assert (out / "crossover.png").is_file()
    assert main(["model", "--evaluate", "--quick", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["spec"]["seq_len"] == 4096 and doc["targets"]["mars_within_1_02_of_best_fair"]


@pytest.mark.parametrize("argv, msg", [
    (["--quick"], "--quick needs --evaluate"),
    (["--out", "x"], "--out needs --evaluate"),
    (["--evaluate", "--scope", "attention"], "--scope does not apply with --evaluate"),
    (["--evaluate", "--layout", "plan"], "--layout does not apply"),
    (["--evaluate", "--schemes", "mars"], "--schemes does not apply"),
    (["--evaluate", "--no-overheads"], "--no-overheads does not apply"),
    (["--evaluate", "--validate"], "--validate does not apply"),
    (["--evaluate", "--validate-only"], "--validate-only does not apply"),
    (["--evaluate", "--quick", "--nodes", "2,4"], "--nodes does not apply with --quick"),
    (["--evaluate", "--quick", "--seq", "4096"], "--seq does not apply with --quick"),
    (["--evaluate", "--quick", "--chunk", "512"], "--chunk does not apply with --quick"),
    (["--evaluate", "--nodes", "1,2"], "must all be >= 2"),
    (["--evaluate", "--nodes", "2,x"], "--nodes must be"),
    (["--evaluate", "--seq", "1000"], "must be a positive multiple"),
    (["--evaluate", "--link", "fibre"], "unknown --link"),
    (["--evaluate", "--model", "gpt"], "unknown --model"),
    (["--evaluate", "--setting", "lab"], "unknown --setting"),
    (["--evaluate", "--node-config", "big"], "unknown --node-config"),
    (["--evaluate", "--alpha", "nan"], "--alpha must be"),
    (["--evaluate", "--kv-budget-mib", "inf"], "--kv-budget-mib must be"),
    (["--evaluate", "--model", "tiny"], "does not fit"),
])
def test_mcf_model_evaluate_bad_arguments(capsys, argv, msg):
    assert main(["model", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and err.startswith("mcf model: error:")


def test_mcf_model_evaluate_bad_out_and_results(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("")
    assert main(["model", "--evaluate", "--quick", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert "is not a directory" in err and err.count("\n") == 1
    assert main(["model", "--evaluate", "--quick", "--results-dir", str(tmp_path),
                 "--out", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.count("\n") == 1


# --- the clock (issue #35 §5) -----------------------------------------------------------------

def test_table1_and_table2_at_300_and_250_mhz(ev, spec, fig):
    """Table 1 and Table 2 at the ABI's clock and at 250 MHz: the same plans and cycles, so every
    node's compute seconds are 300/250 x; the links keep their seconds, so a TTFT lies between
    the 300 MHz one and 300/250 x it; decode: the weight stream and the GEMM are node cycles
    (x 300/250), the DDR roofline is the PL's ports per cycle (x 250/300)."""
    from mcf.abi.platform import ACLK_HZ
    assert spec.clocks_mhz == (ACLK_HZ / 1e6, 250.0)
    assert [c.clock_hz for c in ev.clocks] == [ACLK_HZ, 250e6]
    fast, slow = ev.clocks
    assert list(fast.table_runs) == ev.table_runs and list(fast.decode) == ev.decode
    k = ACLK_HZ / 250e6
    assert len(fast.table_runs) == len(slow.table_runs) > 0
    for f, s in zip(fast.table_runs, slow.table_runs):
        assert (s.scheme, s.nodes, s.scope, s.comm_gib) == (f.scheme, f.nodes, f.scope, f.comm_gib)
        assert s.compute_s == pytest.approx(k * f.compute_s, rel=1e-12)
        assert f.ttft_s < s.ttft_s <= k * f.ttft_s * (1 + 1e-12)
    for f, s in zip(fast.decode, slow.decode):
        assert (s.mode, s.weight_path, s.context) == (f.mode, f.weight_path, f.context)
        for name in ("weights_s", "gemm_s", "vector_s", "attention_s"):
            assert getattr(s, name) == pytest.approx(k * getattr(f, name), rel=1e-12)
        assert s.roofline_tok_s == pytest.approx(f.roofline_tok_s / k, rel=1e-12)
        assert s.tok_s < f.tok_s
    d = ev.to_dict()["clocks"]
    assert [c["clock_hz"] for c in d] == [ACLK_HZ, 250e6]
    assert d[1]["table1"]["speedups"] == speedups(slow.table_runs, spec.nodes)
    assert count_runs(spec) == count_runs(spec, 250e6) == count_runs(spec, 200e6) - len(
        spec.nodes) * 7


def test_evaluate_at_another_clock(fig, spec):
    """``--clock-mhz 250``: every figure at 250 MHz, and Table 1 / 2 also at 300 MHz."""
    from dataclasses import replace

    from mcf.abi.platform import ACLK_HZ
    from mcf.sysmodel.calibration import at_clock
    small = replace(spec, seq_lens=(1024,), chunks=(1024,), compute_scales=(1,), link_gbps=(10,),
                    nodes=(2,), memory_nodes=(2,))
    ev = evaluate(small, at_clock(fig, 250e6))
    assert ev.clock_hz == 250e6 and "250 MHz" in ev.notes["clock"]
    assert [c.clock_hz for c in ev.clocks] == [250e6, ACLK_HZ]
    assert "K26's DSP peak (4 x 1248 DSPs x 250 MHz" in ev.checks[0].finding


def test_mcf_model_evaluate_clock(tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["model", "--evaluate", "--quick", "--quiet", "--clock-mhz", "250", "--out",
                 str(out)]) == 0
    text = capsys.readouterr().out
    assert "at 250 MHz: MARS TTFT" in text and "at 300 MHz: MARS TTFT" in text
    doc = json.loads((out / "evaluation.json").read_text())
    assert doc["clock_hz"] == 250e6 and [c["clock_mhz"] for c in doc["clocks"]] == [250, 300]
    assert "## Table 1 and Table 2 at 250 and 300 MHz" in (out / "summary.md").read_text()


def test_readme_sentence_says_where_mars_is_slower():
    """The README's evaluation sentence (``mcf.sysmodel.report.render_evaluation``) claims
    "never slower" only when the worst MARS / best fair ratio is at most 1; otherwise it says
    where MARS is slower."""
    from mcf.sysmodel.report import render_evaluation

    doc = json.loads((ROOT / "docs" / "figures" / "evaluation.json").read_text())
    worst = doc["targets"]["worst_mars_over_best_fair"]
    for ratio, says in ((1.0, "never slower"), (1.25, "slower than the best fair")):
        doc["targets"]["worst_mars_over_best_fair"] = worst | {"ratio": ratio}
        text = render_evaluation([doc])
        assert says in text and f"{ratio:.3f}" in text
        assert ("never slower" in text) == (ratio <= 1.0)

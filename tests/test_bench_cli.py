"""``mcf bench`` and ``mcf tables``: every bench runs at CI size and reports the figures the
README and the issue tracker name; a refusal writes nothing; the README's tables are exactly
what ``mcf tables`` makes of the committed JSON."""

import json
from pathlib import Path

import pytest

import mcf.sim.perf.csr as csr_bench
from mcf.cli import main
from mcf.commands.tables import RESULTS, render_readme
from mcf.sim.perf import BENCHES, BenchRefused

ROOT = Path(__file__).resolve().parents[1]

# figures each bench must report (dotted paths into its JSON object)
FIGURES = {
    "packet": ["widths.64.beats_per_cycle", "widths.128.beats_per_cycle"],
    "nic": ["multicast.beats_per_cycle", "multicast.beats_per_cycle_1beat",
            "all_to_all.scatter_beats_per_cycle", "all_to_all.gather_beats_per_cycle",
            "reduction.elements_per_cycle_per_lane", "link.payload_beats_per_cycle"],
    "compute": ["gemm_sequence_mac_utilization", "gemm_steady_mac_utilization",
                "decode_port_efficiency"],
    "attention": ["qk_bank_utilization", "pv_bank_utilization", "decode_cycles_per_qk",
                  "prefill_cycles_per_qk", "kv_rel_error_outliers"],
    "csr": ["maps.mcf_node.registers"],
    "plan": ["rows"],
    "node": ["meta_records_per_cycle", "prefill_comm_step_cycles"],
    "cluster": ["tiny.n2.mars_ttft_cycles", "tiny.n2.ring_ttft_cycles",
                "tiny.n2.zigzag_ttft_cycles", "tiny.n2.exposed_comm_cycles",
                "decode_cycles_per_token.n2", "sim_cycles_per_second.single_process_n2"],
    "eth": ["rgmii.payload_gbps_at_1500B", "rgmii.payload_gbps_at_64B",
            "rgmii.line_rate_fraction_1500B", "xgmii.payload_gbps_at_1500B",
            "xgmii.payload_gbps_at_64B", "xgmii.line_rate_fraction_1500B"],
    "task": ["float.acc_256", "int4_per_token.acc_256", "int4_per_channel.acc_256",
             "rtl.n2_acc_32", "rtl.bit_exact_vs_golden", "model_bytes"],
    "decode": ["weights.weight_port_efficiency", "weights_ddr90.weight_port_efficiency",
               "weights.weight_bytes", "weights_ddr90.ddr_efficiency", "tp.n2.bit_exact",
               "tp.n2.tp_decode_cycles_per_token", "tp.n4.run"],
}


def _get(obj, dotted):
    for key in dotted.split("."):
        obj = obj[key]
    return obj


@pytest.mark.parametrize("name", BENCHES)
def test_bench_runs_small(name, tmp_path, capsys):
    assert main(["bench", name, "--small", "--no-synth", "--json", "--out", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((tmp_path / f"{name}.json").read_text())
    assert written == printed and written["small"] is True
    for dotted in FIGURES[name]:
        value = _get(written, dotted)
        if dotted.endswith(("utilization", "efficiency", "per_cycle", "per_cycle_1beat",
                            "per_lane")):
            for v in value.values() if isinstance(value, dict) else [value]:
                assert 0 < v <= 1, (dotted, value)
        if ".acc_" in dotted:
            assert 0 <= value <= 1, (dotted, value)
    if name == "decode":    # issue #34: the stripe readers' weight stream, both DDR models
        for key, eff in (("weights", 1.0), ("weights_ddr90", 0.9)):
            r = written[key]
            assert r["ddr_efficiency"] == eff and r["ports"] == 4 and r["jobs"] == 7
            assert r["weight_bytes_per_cycle"] == round(r["weight_bytes"] / r["cycles"], 3)
            assert r["weight_port_efficiency"] == round(
                r["weight_bytes"] / r["cycles"] / (r["ports"] * r["port_bytes_per_cycle"]), 4)
        assert written["weights_ddr90"]["cycles"] > written["weights"]["cycles"]
        tp = written["tp"]      # TP decode in RTL on 2 tiny node tops; N = 4 refused, said why
        assert tp["n2"]["run"] is True and tp["n2"]["bit_exact"] is True
        assert len(tp["n2"]["tp_decode_cycles_per_token"]) == 1
        assert tp["n2"]["tp_decode_cycles_per_token"][0] > 0
        assert tp["n4"] == {"run": False, "reason": tp["n4"]["reason"]}
        assert "partial KV heads" in tp["n4"]["reason"]
    if name == "task":      # seeds 0-3 at 256 tokens are answered right by all three models
        assert [written[m]["acc_256"] for m in ("float", "int4_per_token",
                                                "int4_per_channel")] == [1.0, 1.0, 1.0]
        assert written["rtl"]["bit_exact_vs_golden"] is True


def test_refusal_writes_nothing(tmp_path, capsys, monkeypatch):
    def refuse(small=False, synth=True):
        raise BenchRefused("reduction: unplanned counter values {'drop_bad_k': 3}")

    monkeypatch.setattr(csr_bench, "collect", refuse)
    assert main(["bench", "csr", "--json", "--out", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "csr refused: reduction: unplanned counter values" in captured.err
    assert not (tmp_path / "csr.json").exists()


def test_decode_bench_refuses_a_wrong_stream(tmp_path, capsys, monkeypatch):
    """``mcf bench decode``: a corrupted DDR byte (a word of the stream differs from the GEMM's
    weight stream) refuses the figure: exit 1, one line, no JSON."""
    import mcf.sim.perf.decode as decode_bench
    from mcf.sim.perf.decode import small_shapes, weight_stream

    tiny = tuple((n, 16, k) for n, _, k in small_shapes())[:2]
    monkeypatch.setattr(decode_bench, "weight_stream",
                        lambda small=False, **kw: weight_stream(shapes=tiny,
                                                                sabotage="corrupt", **kw))
    assert main(["bench", "decode", "--small", "--no-synth", "--json", "--out",
                 str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "decode refused: decode weight stream:" in captured.err
    assert "words differ" in captured.err
    assert not (tmp_path / "decode.json").exists()


def test_unknown_bench_is_a_usage_error(capsys):
    assert main(["bench", "nope"]) == 2
    assert "unknown bench(es) nope" in capsys.readouterr().err


def test_readme_tables_equal_committed_results(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(["tables", "--check"]) == 0


def test_tables_follow_the_json(tmp_path):
    text = (ROOT / "README.md").read_text()
    assert "<!-- bench:csr -->" in text
    results = tmp_path / "results"
    results.mkdir()
    for f in (ROOT / RESULTS).glob("*.json"):
        (results / f.name).write_text(f.read_text())
    same, missing = render_readme(text, results)
    assert same == text and not missing
    data = json.loads((results / "csr.json").read_text())
    data["maps"]["mcf_node"]["registers"] += 1
    (results / "csr.json").write_text(json.dumps(data))
    changed, _ = render_readme(text, results)
    assert changed != text


def test_tables_refuse_small_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    (tmp_path / "csr.json").write_text(json.dumps({"maps": {}, "small": True}))
    assert main(["tables", "--from", str(tmp_path), "--check"]) == 2
    assert "ran with --small" in capsys.readouterr().err


def test_json_path_and_json_before_a_name(tmp_path, capsys, monkeypatch):
    """``--json PATH`` writes the object there and prints nothing; ``--json NAME`` (a bench's
    name right after the flag) is that bench, printed."""
    monkeypatch.setattr(csr_bench, "collect", lambda small=False, synth=True: {"cycles": 7})
    path = tmp_path / "csr_figures.json"
    assert main(["bench", "csr", "--json", str(path), "--out", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads(path.read_text()) == {"cycles": 7, "small": False}
    assert main(["bench", "--json", "csr", "--out", str(tmp_path / "b")]) == 0
    assert json.loads(capsys.readouterr().out) == {"cycles": 7, "small": False}


def test_checked_run_refuses_a_failed_check(monkeypatch):
    """The benches' RTL runs (decode, task, qwen): a raised check or a failed reported check
    refuses the figure in one line, prefixed with what ran; a clean run is returned as is."""
    import mcf.commands.run as run_cmd
    from mcf.sim.perf import checked_run

    def raising(spec, **kw):
        raise AssertionError("logits differ at token 3\nmore detail")

    monkeypatch.setattr(run_cmd, "simulate", raising)
    with pytest.raises(BenchRefused, match=r"^decode tp N=2: logits differ at token 3$"):
        checked_run(None, "decode tp N=2")
    got = {"checks": {"bit_exact": True, "owner_only": False}}
    monkeypatch.setattr(run_cmd, "simulate", lambda spec, **kw: got)
    with pytest.raises(BenchRefused, match=r"^N=2: checks failed: owner_only$"):
        checked_run(None, "N=2")
    seen = {}
    ok = {"checks": {"bit_exact": True}}
    monkeypatch.setattr(run_cmd, "simulate", lambda spec, **kw: seen.update(kw) or ok)
    assert checked_run("spec", "x", mpi=True, mem=1 << 20) is ok
    assert seen == {"progress": False, "mpi": True, "mem": 1 << 20}

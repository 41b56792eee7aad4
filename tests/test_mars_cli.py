"""``mcf plan``: JSON invariants at the paper's settings, human table, bad input."""

import json

import pytest

from mcf.cli import main

PAPER = ["plan", "--model", "qwen2.5-1.5b", "--seq-len", "16384", "--chunk", "1024",
         "--setting", "paper"]


def run_json(capsys, *args):
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("nodes", [2, 4, 8, 16])
def test_paper_settings_json_invariants(capsys, nodes):
    out = run_json(capsys, *PAPER, "--nodes", str(nodes))
    budget = 64 * 2 ** 20
    assert out["m_token_bytes"] == 7168
    assert out["setting"] == {"name": "paper", "alpha": 0.5, "kv_budget_mib": 64.0,
                              "source": "the paper's evaluation"}
    assert out["alpha"] == 0.5 and out["kv_budget_bytes"] == budget
    assert out["node_config"] == "kr260" and out["reduce_slots"] == 12 and out["bidirectional"]
    assert out["chunk_size"] == 1024 and out["num_chunks"] == 16
    chunks = out["chunks"]
    assert [c["index"] for c in chunks] == list(range(1, 17))
    factors = [c["replica_factor"] for c in chunks]
    assert all(a >= b for a, b in zip(factors, factors[1:])) and factors[-1] == 1
    for c in chunks:
        assert max(c["per_node_kv_bytes"]) <= budget
        assert c["replica_factor"] == max(1, min(nodes, c["r_mem"], c["r_reuse"])) or \
            c["index"] == 16
        assert len(c["owners"]) == nodes == len(c["replicas"])
        for owner, reps in zip(c["owners"], c["replicas"]):
            assert owner not in reps and len(reps) <= c["replica_factor"] - 1
        for key in ("rep_bytes", "access_bytes", "t_chunk_s"):
            assert c[key] >= 0
    pl = out["payloads"]
    assert out["max_payload_bytes"] == pl["max_payload_bytes"] == 2048
    assert (pl["kv_tokens_per_fragment"], pl["kv_fragment_bytes"]) == (15, 1980)
    assert (pl["query_record_bytes"], pl["state_bytes"]) == (1592, 520)
    assert pl["query_waves"] == [[[0, 12]]]       # kr260: 12 reduction slots, one wave
    t = out["totals"]
    assert t["final_owner_only"] is True
    assert t["converged"] == sum(c["converged"] for c in chunks) > 0
    assert t["pressure_drains"] == sum(c["drained"] for c in chunks)
    assert t["peak_node_kv_bytes"] <= budget
    assert t["comm_bytes"] == t["rep_bytes"] + t["access_bytes"] + t["handoff_bytes"]
    assert t["ttft_s"] == pytest.approx(sum(c["t_chunk_s"] for c in chunks))
    final = t["final_node_kv_bytes"]
    assert sum(final) == 16384 * 7168
    assert max(final) - min(final) <= 1024 // nodes * 7168
    assert "TTFT covers" in out["ttft_scope"]


def test_baseline_policies_json(capsys):
    got = {}
    for policy in ("mars", "ring", "zigzag", "full", "pd"):
        out = run_json(capsys, *PAPER, "--nodes", "4", "--policy", policy)
        assert out["policy"] == policy and out["totals"]["final_owner_only"]
        got[policy] = out["totals"]
    assert got["ring"]["rep_bytes"] == got["zigzag"]["rep_bytes"] == 0
    assert got["ring"]["comm_bytes"] == got["zigzag"]["comm_bytes"]
    assert got["zigzag"]["ttft_s"] <= got["ring"]["ttft_s"]     # causal load balance
    assert got["mars"]["ttft_s"] <= got["zigzag"]["ttft_s"]
    assert got["full"]["memory_ok"] is False                     # 112 MiB per node > 64 MiB
    assert got["full"]["access_bytes"] == 0
    assert got["pd"]["handoff_bytes"] > 0
    one_way = run_json(capsys, *PAPER, "--nodes", "4", "--policy", "ring", "--one-way")
    assert not one_way["bidirectional"]
    assert one_way["totals"]["comm_bytes"] == got["ring"]["comm_bytes"]   # same bytes x hops


def test_board_setting_and_sim_node(capsys):
    out = run_json(capsys, *PAPER, "--nodes", "4", "--setting", "board", "--node-config", "sim")
    st = out["setting"]
    assert st["name"] == "board" and st["alpha"] == 0.5
    assert st["kv_budget_mib"] == pytest.approx(4096 - 1024 - 807_962_112 / 2 ** 20)
    assert out["kv_budget_bytes"] == int(st["kv_budget_mib"] * 2 ** 20)
    assert out["reduce_slots"] == 4 and out["payloads"]["query_waves"] == [[[0, 4]], [[4, 4]],
                                                                            [[8, 4]]]
    assert out["totals"]["pressure_drains"] == 0           # 112 MiB of KV fit every node
    flags = run_json(capsys, *PAPER, "--nodes", "4", "--alpha", "1", "--kv-budget-mib", "40")
    assert flags["setting"]["name"] == "given" and flags["alpha"] == 1.0
    assert flags["kv_budget_bytes"] == 40 * 2 ** 20


def test_auto_chunk_explains_its_bound(capsys):
    out = run_json(capsys, "plan", "--seq-len", "16384", "--nodes", "8")
    ch = out["chunk_choice"]
    assert ch["auto"] and ch["bound"] in ("overlap", "buffer")
    assert out["chunk_size"] * 7168 <= out["buffer_bytes"]
    assert f"B* = {out['chunk_size']}" in ch["explanation"]
    # a huge buffer and slow compute: the overlap constraint binds
    out = run_json(capsys, "plan", "--seq-len", "16384", "--nodes", "4", "--buffer-mib", "512",
                   "--topology", "switch")
    assert out["chunk_choice"]["bound"] == "overlap"


def test_human_table(capsys):
    assert main(["plan", "--model", "tiny", "--seq-len", "256", "--nodes", "4",
                 "--chunk", "32", "--kv-budget-mib", "1"]) == 0
    text = capsys.readouterr().out
    assert "TTFT" in text and "owner-only" in text and "assumptions:" in text
    assert len([ln for ln in text.splitlines() if ln[:4].strip().isdigit()]) == 8


@pytest.mark.parametrize("args, message", [
    (["--kv-budget-mib", "1", "--nodes", "8", "--seq-len", "16384"], "too small even for the"),
    (["--nodes", "0", "--seq-len", "16384"], "--nodes must be >= 1"),
    (["--nodes", "33", "--seq-len", "33792", "--chunk", "1056"], "do not fit Meta.src"),
    (["--nodes", "8", "--seq-len", "16000", "--chunk", "1024"], "not a multiple of --chunk"),
    (["--model", "llama-70b", "--nodes", "8", "--seq-len", "16384"], "unknown model"),
    (["--policy", "best", "--nodes", "8", "--seq-len", "16384"], "unknown policy"),
    (["--policy", "pd", "--nodes", "1", "--seq-len", "1024", "--chunk", "1024"], "pd needs"),
    (["--topology", "mesh", "--mesh-dims", "3x3", "--nodes", "8", "--seq-len", "1024"],
     "do not match"),
    (["--alpha", "inf", "--nodes", "8", "--seq-len", "1024"], "must be a finite number"),
    (["--kv-budget-mib", "nan", "--nodes", "8", "--seq-len", "1024"], "must be a finite"),
    (["--max-payload", "4096", "--nodes", "8", "--seq-len", "1024"], "must lie in 1..2048 B"),
    (["--max-payload", "100", "--nodes", "8", "--seq-len", "1024"],
     "one KV token record (132 B per token and KV head) exceeds the largest payload (100 B)"),
    (["--max-payload", "400", "--nodes", "8", "--seq-len", "1024"],
     "one head's softmax state (520 B"),
    (["--reduce-slots", "13", "--nodes", "8", "--seq-len", "1024"],
     "reduction slots must lie in 1..12 (the kr260 node's reduction engine)"),
    (["--reduce-slots", "5", "--node-config", "sim", "--nodes", "8", "--seq-len", "1024"],
     "reduction slots must lie in 1..4 (the sim node's reduction engine)"),
    (["--node-config", "u280", "--nodes", "8", "--seq-len", "1024"],
     "unknown node configuration 'u280'"),
    (["--setting", "cloud", "--nodes", "8", "--seq-len", "1024"], "unknown setting 'cloud'"),
])
def test_bad_input_one_line_exit_2(capsys, args, message):
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_plan_sweep_prints_assumptions_and_rows(capsys, tmp_path):
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).parents[1] / "scripts" / "plan_sweep.py"
    spec = importlib.util.spec_from_file_location("plan_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    png = tmp_path / "fig4.png"
    assert mod.main(["--seq-len", "4096", "--chunk", "512", "--nodes", "2", "4",
                     "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    assert "assumptions" in text and "Tops/s" in text and "TTFT covers" in text
    assert "ring = Ring Attention, double-buffered, bidirectional, same B" in text
    rows = [ln.split() for ln in text.splitlines() if ln.split()[:1] in (["mars"], ["ring"],
                                                                          ["zigzag"])]
    assert [(r[0], int(r[1])) for r in rows] == [(p, n) for n in (2, 4)
                                                  for p in ("mars", "ring", "zigzag")]
    assert "MARS speedup" in text and "vs the best fair baseline" in text
    assert png.stat().st_size > 1000
    assert mod.main(["--seq-len", "4096", "--chunk", "512", "--nodes", "4", "--json",
                     "--schemes", "mars", "ring-unchunked", "full", "--setting", "board"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["scheme"] for r in data["rows"]] == ["mars", "ring-unchunked", "full"]
    assert data["rows"][1]["chunk"] == 4096 and data["spec"]["setting"] == "board"
    assert mod.main(["--schemes", "ring2", "--nodes", "2", "--seq-len", "1024"]) == 2
    assert "unknown scheme 'ring2'" in capsys.readouterr().err

"""Node tops cabled as a KR260 ring, under Verilator (sim/benches/node_cluster.py; docs/node.md
§13, issue #11): MARS's own prefill steps of the tiny model through two node tops (four in the
slow run), bad input at node level (a JOB of a refused GEMM job among it), and every register
of the node map over AXI-Lite.

One Verilator build per ring size, shared by the tests of this file."""

from __future__ import annotations

import json

import pytest

from mcf.sim import run
from mcf.sim.cluster import build_cluster

BENCH = "mcf.sim.benches.node_cluster"


def _built(n: int):
    return build_cluster(n)


@pytest.fixture(scope="module")
def pair():
    return _built(2)


def test_two_nodes_run_mars_prefill_steps(pair, tmp_path):
    out = tmp_path / "prefill.json"
    run(pair, BENCH, testcase="prefill", params={
        "nodes": 2, "seq_len": 96, "chunk": 32, "seed": 3, "pause": 0.2, "out": str(out)})
    got = json.loads(out.read_text())
    assert len(got["step_cycles"]) == 3 and all(c > 0 for c in got["step_cycles"])
    assert all(p > 0 for p in got["kv_packets_landed"])


def test_two_nodes_run_the_layer_program(pair, tmp_path):
    out = tmp_path / "layer.json"
    layers = 1          # one layer of the tiny model (CI's time); the layer program's steps
    run(pair, BENCH, testcase="layer", params={    # are the same for every layer
        "nodes": 2, "seq_len": 64, "chunk": 32, "seed": 2, "pause": 0.1, "layers": layers,
        "out": str(out)})
    got = json.loads(out.read_text())
    assert len(got["step_cycles"]) == 2
    # per node: layers × 2 steps × 16 tokens of its slice × 2 KV heads (one record each)
    assert all(e["att_records"] == layers * 2 * 16 * 2 for e in got["engines"].values())


def test_bad_input_is_counted_and_good_traffic_lands(pair):
    run(pair, BENCH, testcase="bad_input", params={"nodes": 2, "seed": 5})


def test_every_register_over_axi_lite(pair):
    run(pair, BENCH, testcase="registers", params={"nodes": 2, "seed": 7})


@pytest.mark.slow
def test_four_nodes_run_mars_prefill_steps(tmp_path, request):
    markexpr = request.config.getoption("markexpr") or ""
    if "slow" not in markexpr or "not slow" in markexpr:
        pytest.skip("four node tops: pytest -m slow tests/test_node_cluster.py")
    out = tmp_path / "prefill.json"
    run(_built(4), BENCH, testcase="prefill", params={
        "nodes": 4, "seq_len": 128, "chunk": 32, "seed": 11, "pause": 0.2, "out": str(out)})
    assert len(json.loads(out.read_text())["step_cycles"]) == 4


def test_metadata_ingress_rate(pair, tmp_path):
    out = tmp_path / "rate.json"
    run(pair, BENCH, testcase="ingress_rate", params={"nodes": 2, "records": 256,
                                                      "out": str(out)})
    got = json.loads(out.read_text())
    assert got["records"] == 257 and got["cycles"] > 257

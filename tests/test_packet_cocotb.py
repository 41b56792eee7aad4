"""cocotb + Verilator benches of the packet path: one combined bench top per data width
(packetizer and parser side by side, with a loopback), so two Verilator builds in all.

Default run: the idle × backpressure matrix for both blocks, congestion, a fuzz mix of
malformed packets and the 10,000-packet random stress test, at 64 and 128 bits.
"""

import os

import pytest

from mcf.hdl.packet.top import packet_bench_top
from mcf.sim import build, run

MAX_PAYLOAD = 256
BENCH = {"max_payload": MAX_PAYLOAD, "local_id": 2, "num_nodes": 5}


@pytest.fixture(scope="module", params=[64, 128], ids=["w64", "w128"])
def bench(request):
    width = request.param
    built = build(packet_bench_top(width, max_payload=MAX_PAYLOAD),
                  f"mcf_packet_bench_{width}", width_warnings=True)
    return built, {"width": width, **BENCH}


def _run(built, module, **kwargs):
    """One run folder per bench module, so each sim.log / results.xml is kept."""
    name = module.rsplit(".", 1)[-1]
    return run(built, module, test_dir=built.build_dir / f"run-{name}-{os.getpid()}", **kwargs)


def test_packetizer(bench):
    built, params = bench
    _run(built, "mcf.sim.benches.packet_packetizer", params=params)


def test_parser(bench):
    built, params = bench
    _run(built, "mcf.sim.benches.packet_parser", params={**params, "fuzz_packets": 600})


def test_path_stress(bench):
    built, params = bench
    _run(built, "mcf.sim.benches.packet_path", params={**params, "stress_packets": 10_000})


@pytest.fixture
def slow_requested(request):
    """The suite's default command does not deselect ``slow``; skip unless asked for."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("long run: pytest -m slow tests/test_packet_cocotb.py")


@pytest.mark.slow
def test_fuzz_long(slow_requested, bench):
    """20,000-packet fuzz mix per width (not in CI): ``pytest -m slow
    tests/test_packet_cocotb.py``."""
    built, params = bench
    _run(built, "mcf.sim.benches.packet_parser", testcase="parser_fuzz",
         params={**params, "fuzz_packets": 20_000}, seed=2)

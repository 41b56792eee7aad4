"""The PYNQ driver on the simulated KR260 (issue #12 items 1–2; bench
``sim/benches/board_node.py``): ``pynq.Overlay`` binds :class:`mcf.driver.NodeDriver` from a
``.hwh`` on a ``SimBoard`` that is ``mcf_node_sim`` under Verilator; registers round-trip through
``register_map``, a bad address is PYNQ's error and the node keeps answering; one MARS prefill
step on a loopback link, bit-exact, and a stalled step raising the documented timeout.

One Verilator build of ``mcf_node_sim`` (the toolchain's cache), one simulator run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcf.sim import build, run
from mcf.sim.board.hwh import verilog_ports, write_hwh

BENCH = "mcf.sim.benches.board_node"


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    from mcf.commands.verilog import top_description
    from mcf.hdl.tops import TOPS
    built = build(TOPS["mcf_node_sim"](), "mcf_node_sim",
                  describe=top_description("mcf_node_sim"))     # mcf verilog's conversion
    ports = verilog_ports((built.build_dir / "mcf_node_sim.v").read_text(), "mcf_node_sim")
    tmp = tmp_path_factory.mktemp("overlay")
    hwh = write_hwh(tmp / "mcf_node_sim.hwh", "mcf_node_sim", ports)
    wrong = write_hwh(tmp / "kr260" / "mcf_node.hwh", "mcf_node", ports)
    return built, hwh, wrong


def test_driver_on_the_simulated_board(board, tmp_path):
    built, hwh, wrong = board
    outs = {name: tmp_path / f"{name}.json" for name in ("registers", "step")}
    run(built, BENCH, testcase=["bind_and_registers", "loopback_step"],
        params={"hwh": str(hwh), "wrong_hwh": str(wrong), "seed": 3,
                "out_registers": str(outs["registers"]), "out": str(outs["step"])})
    regs = json.loads(Path(outs["registers"]).read_text())
    step = json.loads(Path(outs["step"]).read_text())
    print(json.dumps({"registers": regs, "step": step}, indent=1))
    assert regs["written"] > 10 and "CAPS" in regs["wrong_hwh"]
    assert step["node0_frames"] > 0 and step["node1_frames"] > 0
    assert step["node1_step_cycles"] > 0
    assert "COMPUTE" in step["stall"]

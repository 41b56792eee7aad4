"""``mcf bench attention``'s tiled entry (mcf.sim.perf.attention.tiled): the sim node's
PREFILL_TILE executor in amaranth.sim. Slow (about a minute each here): the small measurement
reproduces the committed records' cycles and parameters (the run is deterministic), and a row
that differs from the golden model refuses the figure (there and on the kr260 NodeCompute
in Verilator)."""

from __future__ import annotations

import json

import pytest

from mcf.abi.node_config import KR260
from mcf.sim.perf import BenchRefused
from mcf.sim.perf import attention as bench
from mcf.sysmodel.calibration import results_dirs


@pytest.mark.slow
def test_small_run_reproduces_the_committed_figures():
    committed = json.loads((results_dirs()[1] / "attention.json").read_text())["tiled"]
    got = bench.tiled(small=True)
    assert len(got["records"]) == len(bench.TILED_FIT) + 2
    for name, rec in got["records"].items():
        assert rec["cycles"] == committed["records"][name]["cycles"], name
    for key in ("record_cycles", "row_cycles", "row_block_cycles", "key_cycles",
                "row_key_cycles", "shape"):
        assert got[key] == committed[key]
    assert all(rec["error"] == 0 for rec in got["records"].values() if rec["role"] == "fit")


@pytest.mark.slow
@pytest.mark.parametrize("run", ["amaranth.sim", "verilator"])
def test_a_row_off_the_golden_model_refuses(monkeypatch, run):
    """One golden byte flipped: the rows written (the sim node's executor in amaranth.sim, or
    the kr260 NodeCompute in Verilator) no longer match and the figure is refused."""
    import mcf.golden.attend_unit as golden
    real = golden.attend_model

    def off_by_one(*args, **kwargs):
        res = real(*args, **kwargs)
        addr, raw = res.writes[0]
        res.writes[0] = (addr, bytes([raw[0] ^ 1]) + raw[1:])
        return res

    monkeypatch.setattr(golden, "attend_model", off_by_one)
    with pytest.raises(BenchRefused, match="differ from the golden model"):
        if run == "verilator":
            bench.tiled_records_rtl(KR260, [([64], 2)])
        else:
            bench.tiled_records([([8], 8)])

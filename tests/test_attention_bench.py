"""The attention bench refuses to report figures from a run whose output differs from the golden
model or whose error counters show an unplanned reject (cocotb + Verilator, small cases)."""

from __future__ import annotations

import pytest

from mcf.sim.perf import BenchRefused
from mcf.sim.perf import attention as bench


def _tiny(fault: str) -> list[dict]:
    return [{"name": "decode_g6", "kind": "decode", "heads": 6, "blocks": 1, "jobs": 1,
             "fault": fault}]


@pytest.mark.parametrize("fault,message", [
    ("expected", "differ from the golden model"),
    ("bad_job", "unplanned counter values {'err_job': 1}"),
])
def test_bench_refuses_corrupted_case(monkeypatch, fault, message):
    monkeypatch.setattr(bench, "cases", lambda small: _tiny(fault))
    with pytest.raises(BenchRefused, match=message.replace("{", r"\{").replace("}", r"\}")):
        bench.collect(small=True, synth=False)

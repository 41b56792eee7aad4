"""Runners of the CSR bank's cocotb + Verilator bench (sim/benches/csr_bank.py): the map with
every access kind and the real node map, cocotbext-axi master and a raw random driver.

The slow variant (``-m slow``) runs the same benches with 10x the transactions and other seeds.
"""

import pytest

from mcf.hdl.csr.top import csr_flat_top
from mcf.sim import build, run
from mcf.sim.tb import MAPS

BENCH = "mcf.sim.benches.csr_bank"


def _built(mapname):
    return build(csr_flat_top(MAPS[mapname]()), f"csr_{mapname}")


@pytest.mark.parametrize("mapname,n", [("kinds", 1200), ("node", 600)])
def test_csr_bank_bench(mapname, n):
    run(_built(mapname), BENCH, params={"map": mapname, "n": n, "seed": 1})


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 3])
@pytest.mark.parametrize("mapname", ["kinds", "node"])
def test_csr_bank_bench_long(mapname, seed, request):
    markexpr = request.config.getoption("markexpr") or ""
    if "slow" not in markexpr or "not slow" in markexpr:
        pytest.skip("long run: pytest -m slow tests/test_csr_cocotb.py")
    run(_built(mapname), BENCH, params={"map": mapname, "n": 4000, "seed": seed}, seed=seed)

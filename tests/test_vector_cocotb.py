"""Runner of the vector unit's cocotb + Verilator bench (sim/benches/vector_unit.py):
bit-exact on Qwen2.5-1.5B token shapes (hidden 1536, intermediate 8960) and the tiny model,
with source idle and sink backpressure."""

from mcf.hdl.compute.vector import VectorUnit
from mcf.hdl.flat import FlatTop
from mcf.sim import build, run

BENCH = "mcf.sim.benches.vector_unit"
LANES = 4


def vector_built():
    top = FlatTop(VectorUnit(lanes=LANES, n_max=8960),
                  {"a": "s_axis_a", "b": "s_axis_b", "o": "m_axis_o"})
    return build(top, "vector_unit_8960")


def test_vector_bench():
    jobs = [
        {"op": "RMSNORM", "n": 1536, "seed": 1}, {"op": "RMSNORM", "n": 128, "seed": 2},
        {"op": "REQUANT", "n": 1536, "seed": 3}, {"op": "REQUANT", "n": 8960, "seed": 4},
        {"op": "SILU_MUL", "n": 8960, "seed": 5}, {"op": "ROPE", "n": 1536, "seed": 6},
        {"op": "ADD", "n": 1536, "seed": 7}, {"op": "RMSNORM", "n": 1536, "seed": 8},
    ]
    run(vector_built(), BENCH, params={"lanes": LANES, "jobs": jobs, "idle": 0.2,
                                       "backpressure": 0.3, "seed": 2})

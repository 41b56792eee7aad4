"""Runner of the GEMM engine's cocotb + Verilator bench (sim/benches/gemm_engine.py): the
16 × 16 array, and the kr260 node's four token-parallel arrays with a 512-bit weight stream
(docs/node.md §11), sequences of jobs back to back — tiny-model shapes and Qwen2.5-1.5B shapes
(K = 1536 and K = 8960, small M and N; M = 1, 3, 5: not multiples of the four arrays) —
bit-exact for every job, with and without random source idle and sink backpressure."""

import pytest

from mcf.abi.quant import GROUP_SIZE
from mcf.sim import run
from mcf.sim.perf.compute import (
    KR260_ARRAYS,
    KR260_CHAIN,
    KR260_SIM_DSP,
    KR260_W_BYTES,
    gemm_build,
)

BENCH = "mcf.sim.benches.gemm_engine"
CFG = {"rows": 16, "lanes": 16, "group": GROUP_SIZE}


def gemm_built(kr260: bool = False):
    """``mcf bench compute``'s builds (one Verilator build each for the suite): the 16 × 16
    array, or the kr260 node's arrays with its DSP cascades (slice model)."""
    if kr260:
        return gemm_build(KR260_ARRAYS, KR260_W_BYTES, KR260_CHAIN, KR260_SIM_DSP)
    return gemm_build()


TINY = {"name": "tiny", "jobs": [
    {"m": 4, "n": 32, "k": 128, "seed": 1},     # tiny model: hidden 128
    {"m": 3, "n": 64, "k": 256, "seed": 2},     # tiny model: MLP down (intermediate 256)
    {"m": 8, "n": 16, "k": 128, "seed": 5},
]}
QWEN = {"name": "qwen", "jobs": [
    {"m": 2, "n": 32, "k": 1536, "seed": 3},    # Qwen2.5-1.5B: QKV / gate / up (K = hidden)
    {"m": 1, "n": 16, "k": 8960, "seed": 4},    # Qwen2.5-1.5B: down projection (decode)
    {"m": 5, "n": 16, "k": 1536, "seed": 6},
]}


@pytest.mark.parametrize("idle,bp", [(0.0, 0.0), (0.3, 0.5)])
def test_gemm_bench(idle, bp):
    seqs = [TINY, QWEN] if idle == 0 else [TINY, {**QWEN, "jobs": QWEN["jobs"][::2]}]
    run(gemm_built(), BENCH, params={**CFG, "sequences": seqs, "idle": idle,
                                     "backpressure": bp, "seed": 3})


@pytest.mark.parametrize("idle,bp", [(0.0, 0.0), (0.3, 0.5)])
def test_gemm_bench_kr260(idle, bp):
    """The kr260 node's GEMM: four arrays, 512-bit ``w_in`` (tiles of K = 128 end mid-word:
    padded), DSP48E2 cascades of the lane sums (the slice model)."""
    seqs = [TINY, QWEN] if idle == 0 else [TINY, {**QWEN, "jobs": QWEN["jobs"][::2]}]
    run(gemm_built(kr260=True), BENCH,
        params={**CFG, "w_bytes": KR260_W_BYTES, "sequences": seqs, "idle": idle,
                "backpressure": bp, "seed": 4})


@pytest.mark.slow
def test_gemm_bench_long():
    seq = {"name": "long", "jobs": [{"m": 8, "n": 48, "k": 8960, "seed": 7},
                                    {"m": 8, "n": 96, "k": 1536, "seed": 8}]}
    run(gemm_built(), BENCH, params={**CFG, "sequences": [seq], "idle": 0.1,
                                     "backpressure": 0.2, "seed": 9})

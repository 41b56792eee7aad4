"""cocotb + Verilator benches of the attention engine (one build, Qwen2.5-1.5B head geometry:
head_dim 128, 16 lanes, up to 6 query heads per KV head, blocks up to 256 rows): decode, causal
prefill, two-phase invariance and malformed input, at full rate and with idle sources and
backpressure."""

from __future__ import annotations

import pytest

from mcf.hdl.compute.attention_top import AXIS_NAMES, AttentionTop
from mcf.hdl.flat import FlatTop

PARAMS = {"head_dim": 128, "lanes": 16, "max_heads": 6, "max_block": 256, "data_width": 64}


@pytest.fixture(scope="module")
def built():
    from mcf.sim import build
    return build(FlatTop(AttentionTop(**PARAMS), AXIS_NAMES), "attention_top", params=PARAMS)


@pytest.mark.parametrize("idle,backpressure", [(0.0, 0.0), (0.3, 0.5)],
                         ids=["full-rate", "idle-backpressure"])
def test_attention_bench(built, idle, backpressure):
    from mcf.sim import run
    testcase = None if idle == 0 else ["decode_states", "prefill_causal", "malformed_input"]
    params = {**PARAMS, "idle": idle, "backpressure": backpressure, "seed": 3 if idle else 1}
    if idle:   # the slow path keeps the short chunks; full rate covers 256
        params["prefill_chunks"] = [(16, 6, 2), (32, 2, 2)]
    run(built, "mcf.sim.benches.attention_engine", testcase=testcase, params=params)

"""The node's two configurations (docs/node.md §12) and the CAPS word the driver checks."""

import pytest

from mcf.abi.meta import META
from mcf.abi.node import CMD_RING_MAX_LOG2
from mcf.abi.node_config import KR260, NODE_CONFIGS, SIM, NodeConfig, caps_register


def _caps_fields(word: int) -> dict[str, int]:
    return {f.name: (word >> off) & ((1 << f.width) - 1) for f, off in caps_register().offsets()}


@pytest.mark.parametrize("cfg", [KR260, SIM], ids=lambda c: c.name)
def test_caps_word_names_the_configuration(cfg):
    caps = _caps_fields(cfg.caps())
    assert 1 << caps["kv_count_log2"] == cfg.kv_count
    assert caps["reduce_slots"] == cfg.reduce_slots
    assert caps["gemm_arrays"] == cfg.gemm_arrays
    assert 1 << caps["attn_lanes_log2"] == cfg.attn_lanes
    assert caps["ring_max_log2"] == CMD_RING_MAX_LOG2
    assert caps["links"] == cfg.links


def test_the_two_configurations():
    assert NODE_CONFIGS == {"kr260": KR260, "sim": SIM}
    assert KR260.top == "mcf_node" and SIM.top == "mcf_node_sim"
    assert KR260.macs_per_cycle >= 1024            # issue #11 §1.7
    assert KR260.kv_count == 1 << META["kv_id"].width
    assert KR260.reduce_slots == 12                 # H_q of Qwen2.5-1.5B (docs/node.md §7)
    assert SIM.caps() != KR260.caps()


@pytest.mark.parametrize("bad", [dict(links=0), dict(links=4), dict(kv_count=300),
                                 dict(kv_count=1 << 17)])
def test_bad_configurations_are_rejected(bad):
    with pytest.raises(ValueError):
        NodeConfig(name="x", top="x", **bad)

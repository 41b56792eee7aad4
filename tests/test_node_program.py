"""The host side of a node (mcf.node): DDR layout and MARS records → configuration writes and
command rings (docs/node.md §2–§6). The RTL runs these programs in tests/test_node_cluster.py;
here their structure is checked on MARS's own plans."""

from __future__ import annotations

import pytest

from mcf.abi.csrmap import node_regmap
from mcf.abi.directory import DirOp
from mcf.abi.meta import Meta, Op
from mcf.abi.node import CMD_BYTES, Queue, RecordClass, cmd_malformed
from mcf.abi.node_config import KR260, SIM
from mcf.abi.sequencer import SeqCounter
from mcf.mars import ClusterSpec, get_model, make_topology, plan
from mcf.node.layout import REGION_ALIGN, NodeLayout
from mcf.node.program import (
    configure,
    owner_declarations,
    packets_per_kv,
    route_writes,
    step_program,
)


def tiny(nodes: int, seq_len: int = 64, chunk: int = 32):
    cl = ClusterSpec(nodes, 1 << 20, 1 << 20, make_topology("kr260-ring", nodes))
    return plan(get_model("tiny"), cl, seq_len, chunk, "mars", alpha=0.5)


PLANS = {"n2": lambda: tiny(2), "n4": lambda: tiny(4, 128, 32)}


@pytest.mark.parametrize("name", PLANS)
def test_layout_regions_are_disjoint_and_aligned(name):
    p = PLANS[name]()
    lay = NodeLayout.for_plan(p, SIM, base=0x2000)
    kv = lay.kv
    regions = [(lay.cmd_base[0], CMD_BYTES << lay.cmd_log2),
               (lay.cmd_base[1], CMD_BYTES << lay.cmd_log2),
               (kv.kv_base, kv.kv_count * kv.kv_slot),
               (lay.qbuf_base, 2 * lay.q_heads * lay.qbuf_slot),
               (lay.obuf_base, 1)]
    for (a, la), (b, _) in zip(regions, regions[1:], strict=False):
        assert a % REGION_ALIGN == 0 and a + la <= b
    assert kv.kv_count == p.model.layers * p.num_chunks * p.cluster.nodes
    assert lay.size >= lay.obuf_base - lay.base


def test_layout_rejects_a_plan_larger_than_the_directory():
    p = tiny(4, 4096, 32)                    # L·C·N = 2·128·4 = 1024 kv_ids > 256
    with pytest.raises(ValueError, match="directory"):
        NodeLayout.for_plan(p, SIM)
    NodeLayout.for_plan(p, KR260)


@pytest.mark.parametrize("name", PLANS)
def test_step_programs_follow_the_driver_rule(name):
    p = PLANS[name]()
    enc = p.encoder
    for step in p.steps:
        for node in range(p.cluster.nodes):
            prog = step_program(p, step.index, node)
            mine = [r for r in p.step_records(step.index) if r.node == node]
            for q, cmds in ((Queue.NET, prog.net), (Queue.COMPUTE, prog.compute)):
                assert cmds[-1].cls is RecordClass.MARK and cmds[-1].irq
                for c in cmds:
                    assert not cmd_malformed(int.from_bytes(c.pack(), "little"), q)
            # NET: MARS's plan phase, in MARS's order
            plan_metas = [r.meta for r in mine if r.phase == "plan"]
            assert [Meta.unpack(c.meta) for c in prog.net[:-1]] == plan_metas
            # COMPUTE: the store phase in MARS's (layer-major) order, then FREEs
            store = [r.meta for r in mine if r.phase == "store"]
            sends = [c for c in prog.compute if c.cls is RecordClass.SEND]
            assert [Meta.unpack(c.meta) for c in sends] == store
            layers = [enc.kv_key(m.kv_id)[0] for m in store]
            assert layers == sorted(layers)
            for c in prog.net[:-1] + sends:
                meta = Meta.unpack(c.meta)
                if meta.op == Op.KV_REPLICA:   # the relay rule: the whole block is held
                    _, block, slice_ = enc.kv_key(meta.kv_id)
                    assert c.wait == packets_per_kv(p, block, slice_) > 0
                else:
                    assert c.wait == 0 and meta.length == 0
            frees = [c for c in prog.compute if c.cls is RecordClass.DIR]
            fetched = sum(p.model.layers for t in step.transfers
                          if t.kind == "access" and node in t.dests)
            assert len(frees) >= fetched
            assert all(c.arg == DirOp.FREE.value and c.wait > 0 for c in frees)
            first = next((i for i, c in enumerate(prog.compute) if c.cls is RecordClass.DIR),
                         None)
            assert first is None or all(c.cls is not RecordClass.SEND
                                        for c in prog.compute[first:])


def test_mars_frees_wait_for_the_net_records_before_them():
    p = tiny(2, 256, 32)
    waits = [(s.index, n, c) for s in p.steps for n in range(2)
             for c in step_program(p, s.index, n, net_retired_before=100).compute
             if c.cls is RecordClass.WAIT]
    assert waits                              # MARS frees replicas in this plan
    for index, node, c in waits:
        assert c.arg == SeqCounter.OTHER_RETIRED.value
        assert c.wait == 100 + len(step_program(p, index, node).net) - 1   # not the MARK


def test_configuration_writes_name_real_registers():
    p = tiny(2)
    lay = NodeLayout.for_plan(p, SIM)
    rm = node_regmap()
    writes = configure(p, lay, 1)
    names = [w.reg for w in writes]
    for w in writes:
        rm.register(w.reg)                   # raises if absent
    assert names.count("LAND_OFF_WR") == sum(o is not None for o in lay.kv_layout.land_off)
    assert rm.register("NODE").unpack(writes[0].value) == {"local_id": 1, "num_nodes": 2}
    assert names[-2:] == ["SEQ0_CTRL", "SEQ1_CTRL"]
    assert all(w.reg == "ROUTE_WR" for w in route_writes(p.steps[0].routes.entries, 0))
    decl = owner_declarations(p, 1, 0)
    assert len(decl) == p.model.layers * packets_per_kv(p, 1, 0)
    assert {rm.register("DIR_LAND").unpack(w.value)["owner"] for w in decl} == {1}


def test_node_top_declares_its_clock_and_reset_for_vivado():
    """``aclk`` is associated with every bus interface of the top and ``aresetn`` is its
    active-low reset (module-reference attributes), so the block design needs no manual step."""
    from mcf.commands.verilog import top_description
    from mcf.hdl.convert import verilog_text
    from mcf.hdl.tops import TOPS

    text = verilog_text("mcf_node_sim", TOPS["mcf_node_sim"], top_description("mcf_node_sim"))
    line = next(x for x in text.splitlines() if "ASSOCIATED_BUSIF" in x)
    busif = line.split("ASSOCIATED_BUSIF ")[1].split(",")[0].split(":")
    want = {"s_axi_ctrl", *(f"m_axi_hp{p}" for p in range(4)),
            *(f"{d}_axis_link{ln}" for d in "ms" for ln in range(3))}
    assert set(busif) == want
    assert "ASSOCIATED_RESET aresetn" in line
    assert 'X_INTERFACE_PARAMETER = "POLARITY ACTIVE_LOW"' in text

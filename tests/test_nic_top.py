# amaranth: UnusedElaboratable=no
"""The NIC block behind its AXI-Lite registers (``mcf_nic``, mcf.hdl.nic.top): configuration
and every engine counter through the CSR bank (cocotb + Verilator, sim/benches/nic_top.py), and
the register wiring against the ABI map (amaranth elaboration)."""

from __future__ import annotations

import pytest
from amaranth.hdl import Fragment

from mcf import sim
from mcf.abi.csrmap import nic_registers, nic_regmap, node_regmap
from mcf.abi.node_config import KR260, SIM
from mcf.hdl.flat import FlatTop
from mcf.hdl.nic.top import NicCsrTop, NicTop, nic_axis_names


def test_nic_registers_are_a_part_of_the_node_map():
    node = [reg for _, reg in node_regmap()]
    for reg in nic_registers():
        assert reg in node
    names = [reg.name for _, reg in nic_regmap()]
    assert names[:3] == ["ID", "BUS_ERRORS", "NODE"]


def test_every_nic_register_reaches_the_nic():
    top = NicCsrTop(NicTop(n_links=2, reduce_slots=SIM.reduce_slots))
    bank_regs = set(top.bank.signature.members["regs"].signature.members)
    nic_regs = set(top.nic.signature.members["regs"].signature.members)
    assert bank_regs == nic_regs
    assert {f"link{p}_rx_crc_errors" for p in range(2)} <= nic_regs
    Fragment.get(top, None)         # a 2-link block elaborates (every register is driven)


def test_nic_rejects_more_links_than_the_board_has():
    with pytest.raises(ValueError, match="n_links"):
        NicTop(n_links=4, reduce_slots=SIM.reduce_slots)


def test_nic_takes_the_configurations_reduction_slots():
    """The slot count comes from the caller (docs/node.md §7): kr260 12, sim 4."""
    for cfg in (KR260, SIM):
        nic = NicTop(reduce_slots=cfg.reduce_slots)
        assert nic.reduce.n_slots == cfg.reduce_slots
        Fragment.get(nic, None)
    assert KR260.reduce_slots == 12
    with pytest.raises(TypeError):
        NicTop()                        # no default: the configuration decides


def run_nic_block(**traffic):
    # the block as registered for `mcf verilog`, with smaller buffers (the Verilator build of
    # the 1 KiB-payload instance takes minutes): max payload 256 B, 64-byte parts
    nic = NicTop(max_payload=256, a2a_part_max=64, reduce_slots=SIM.reduce_slots)
    top = FlatTop(NicCsrTop(nic), nic_axis_names(nic.n_links, nic.n_inject))
    sim.run(sim.build(top, "mcf_nic", width_warnings=True), "mcf.sim.benches.nic_top", params={
        "data_width": 64, "n_links": nic.n_links, "n_inject": nic.n_inject,
        "max_payload": nic.router.max_payload, "reduce_slots": nic.reduce.n_slots,
        "a2a_max_nodes": 8, "a2a_part_max": nic.a2a.part_max, "a2a_slots": nic.a2a.n_slots,
        **traffic})


def test_nic_block_cocotb():
    """About 300 router packets (~510 copies, ~390 frames looped back), 60 reductions (~250
    contributions), 20 scatters and 20 gathers (~100 parts)."""
    run_nic_block(seed=7, n_router=300, n_tags=60, n_gathers=20)


@pytest.mark.slow
def test_nic_block_fuzz_100k():
    """The NIC fuzz across all engines at once, in one simulation: 60,000 router packets
    (~100,000 copies, ~78,000 frames checked, looped back with faults and deframed), 6,000
    reductions (~24,000 contributions), 2,500 scatters and 2,500 gathers (~12,000 parts) —
    over 100,000 packets in, malformed ones of every kind mixed in, every output and every
    counter (read over AXI-Lite) exact.  ``pytest -m slow tests/test_nic_top.py``"""
    run_nic_block(seed=11, n_router=60_000, n_tags=6_000, n_gathers=2_500)

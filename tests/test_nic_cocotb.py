"""Runners of the NIC cocotb + Verilator benches (one Verilator build per design)."""

from __future__ import annotations

import pytest

from mcf.hdl.tops import TOPS

sim = pytest.importorskip("mcf.sim.toolchain")


def test_router_cocotb():
    top = TOPS["nic_router"]()
    router = top.inner
    built = sim.build(top, "nic_router")
    sim.run(built, "mcf.sim.benches.nic_router", params={
        "n_ports": router.n_ports, "n_inputs": router.n_inputs, "data_width": 64,
        "max_payload": router.max_payload, "n_packets": 1500})


def test_reduce_cocotb():
    top = TOPS["nic_reduce"]()
    eng = top.inner
    built = sim.build(top, "nic_reduce")
    sim.run(built, "mcf.sim.benches.nic_reduce", params={
        "n_slots": eng.n_slots, "max_payload": eng.max_payload, "n_tags": 300})


def test_link_cocotb():
    top = TOPS["nic_link_loop"]()
    loop = top.inner
    sim.run(sim.build(top, "nic_link_loop"), "mcf.sim.benches.nic_link", params={
        "data_width": loop.data_width, "max_payload": loop.max_payload, "n_packets": 200,
        "n_inject": 60})


def test_all_to_all_cocotb():
    top = TOPS["nic_all_to_all"]()
    eng = top.inner
    sim.run(sim.build(top, "nic_all_to_all"), "mcf.sim.benches.nic_a2a", params={
        "data_width": 64, "max_nodes": 8, "part_max": eng.part_max, "n_slots": eng.n_slots,
        "n_tags": 8, "n_scatter": 10})

"""The KR260 platform (hdl/platform/kr260.py): it elaborates under Amaranth's own Xilinx
platform, and the generated XDC declares every pin of the table once, with its I/O standard,
agreeing with the constraints Amaranth itself writes for the same table."""

from __future__ import annotations

import re

import pytest
from amaranth import Elaboratable, Module
from amaranth.build import Attrs, Pins, Resource
from amaranth.build.res import PortGroup
from amaranth.lib import io

from mcf.hdl.platform.kr260 import GT_RESOURCES, KR260Platform, board_pins, kr260_xdc


def _buffers(m: Module, port) -> None:
    if isinstance(port, PortGroup):
        for key, sub in vars(port).items():
            if not key.startswith("_"):
                _buffers(m, sub)
    else:
        m.submodules += io.Buffer(port.direction, port)


class _RequestAll(Elaboratable):
    """Every resource of the table, each pin behind a stdlib I/O buffer."""

    def elaborate(self, platform):
        m = Module()
        for name, number in platform.resources:
            _buffers(m, platform.request(name, number, dir="-"))
        return m


def _amaranth_constraints():
    """Pin → IOSTANDARD (or None) and clocks, from Amaranth's own XDC of the table."""
    plan = KR260Platform().prepare(_RequestAll(), name="kr260_all")
    xdc = plan.files["kr260_all.xdc"]
    loc = dict(re.findall(r'set_property LOC (\w+) \[get_ports "([^"]+)"\]', xdc))
    std = dict((p, s) for s, p in re.findall(
        r'set_property IOSTANDARD "(\w+)" \[get_ports "([^"]+)"\]', xdc))
    clocks = [float(x) for x in re.findall(r"create_clock .*-period ([\d.]+)", xdc)]
    return {pin: std.get(port) for pin, port in loc.items()}, clocks, plan


def _xdc_lines():
    xdc = kr260_xdc()
    locs = re.findall(r"set_property PACKAGE_PIN (\w+) \[get_ports \{([^}]+)\}\]", xdc)
    stds = re.findall(r"set_property IOSTANDARD (\w+) \[get_ports \{([^}]+)\}\]", xdc)
    return xdc, locs, stds


def test_platform_elaborates():
    ref, clocks, plan = _amaranth_constraints()
    assert {"kr260_all.v", "kr260_all.xdc", "kr260_all.tcl"} <= set(plan.files)
    assert "xck26-sfvc784-2LV-c" in plan.files["kr260_all.tcl"]
    assert len(ref) == len(board_pins()) == 17 + 2 * 15      # + two RGMII PHYs
    assert clocks == [pytest.approx(6.4), pytest.approx(8.0), pytest.approx(8.0)]


def test_xdc_every_pin_once_with_iostandard():
    xdc, locs, stds = _xdc_lines()
    pins = [pin for pin, _ in locs]
    ports = [port for _, port in locs]
    assert len(pins) == len(set(pins)) and len(ports) == len(set(ports))
    declared = board_pins()
    assert sorted(pins) == sorted(p.pin for p in declared)
    std_of = dict((port, s) for s, port in stds)
    assert len(std_of) == len(stds)                         # one IOSTANDARD line per port
    gt_ports = {p.port for p in declared if p.resource in GT_RESOURCES}
    assert gt_ports == {"sfp0_tx_p", "sfp0_tx_n", "sfp0_rx_p", "sfp0_rx_n",
                        "sfp_refclk0_p", "sfp_refclk0_n"}
    for port in ports:
        assert (port in std_of) == (port not in gt_ports), port


def test_xdc_agrees_with_amaranth():
    ref, _, _ = _amaranth_constraints()
    _, locs, stds = _xdc_lines()
    std_of = dict((port, s) for s, port in stds)
    mine = {pin: std_of.get(port) for pin, port in locs}
    assert mine == ref


def test_xdc_values():
    xdc = kr260_xdc()
    assert "set_property PACKAGE_PIN Y10 [get_ports {sfp_ctl0_tx_disable}]" in xdc
    assert "set_property IOSTANDARD LVCMOS18 [get_ports {led1}]" in xdc
    assert "set_property PACKAGE_PIN A12 [get_ports {fan0_b}]" in xdc
    clocks = re.findall(r"create_clock -name (\w+) -period ([\d.]+) \[get_ports \{(\w+)\}\]", xdc)
    freq = KR260Platform().resources[("sfp_refclk", 0)].clock.frequency
    assert clocks == [("sfp_refclk0", f"{1e9 / freq:.3f}", "sfp_refclk0_p"),
                      ("eth_rgmii0_rx_clk", "8.000", "eth_rgmii0_rx_clk"),
                      ("eth_rgmii1_rx_clk", "8.000", "eth_rgmii1_rx_clk")]
    assert clocks[0][1] == "6.400"


def test_rgmii_phys():
    """Both PL RGMII PHYs: 4-bit DDR data each way, control, clocks, reset, MDIO, at 1.8 V."""
    pins = {p.port: p for p in board_pins() if p.resource == "eth_rgmii"}
    assert len(pins) == 30
    for i in range(2):
        for sub in ("tx_clk", "tx_ctl", "rx_clk", "rx_ctl", "rst_b", "mdc", "mdio",
                    *(f"{d}_data[{b}]" for d in ("tx", "rx") for b in range(4))):
            p = pins[f"eth_rgmii{i}_{sub}"]
            assert dict(p.attrs)["IOSTANDARD"] == "LVCMOS18", p
            assert (dict(p.attrs).get("SLEW") == "FAST") == sub.startswith("tx_"), p
            assert (dict(p.attrs).get("SLEW") == "SLOW") == sub.startswith("md"), p
    assert pins["eth_rgmii0_rx_clk"].pin == "D4" and pins["eth_rgmii1_tx_clk"].pin == "J1"
    assert pins["eth_rgmii0_rx_clk"].clock_hz == 125e6


def test_duplicate_pin_and_missing_iostandard_rejected():
    class Dup(KR260Platform):
        resources = KR260Platform.resources + [
            Resource("extra", 0, Pins("F8", dir="o"), Attrs(IOSTANDARD="LVCMOS18"))]

    class NoStd(KR260Platform):
        resources = KR260Platform.resources + [Resource("extra", 0, Pins("H12", dir="o"))]

    with pytest.raises(ValueError, match="pin F8 used by led0 and extra0"):
        kr260_xdc(Dup())
    with pytest.raises(ValueError, match=r"extra0 \(H12\) has no IOSTANDARD"):
        kr260_xdc(NoStd())

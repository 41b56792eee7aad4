"""``mcf build --board kr260`` without Vivado: the three files, the printed command, the Tcl
against the generated Verilog's ports, the Tcl run under a Tcl interpreter, bad arguments.

The Tcl is *executed* by ``tclsh`` with the Vivado commands defined as recorders (they log
their arguments; getters return the object name they were given; ``get_property`` reports the
run finished). That checks the script is valid Tcl that runs to the end, which ports and pins
it names, what it connects to what, and that it copies ``<name>.bit``/``<name>.hwh`` from the
paths Vivado writes — not Vivado's own semantics (no Vivado here).
"""

from __future__ import annotations

import json
import re
import shutil
import stat
import subprocess

import pytest

from mcf.abi.node_config import AXI_WIDTH, TOP_ADDR_BITS, TOP_ID_BITS
from mcf.abi.platform import (
    ACLK_HZ,
    CTRL_BASE,
    CTRL_RANGE,
    ETH_CTRL_BASE,
    ETH_CTRL_RANGE,
    HP_PORTS,
)
from mcf.cli import main
from mcf.hdl.platform.kr260 import (
    BOARD_PART,
    ETH_BOARD_PORTS,
    GT_WIZARD,
    PL_CLK0_CLOCK,
    RGMII_DELAY_MODE,
    RGMII_TIMING,
    board_pins,
)

NAME = "mcf_node"
ETH = "mcf_eth"
FILES = ["kr260.xdc", f"{ETH}.v", f"{ETH}_timing.xdc", f"{NAME}.tcl", f"{NAME}.v"]
TCLSH = shutil.which("tclsh")
_DECL = re.compile(r"^\s*(input|output)\s*(?:\[(\d+):0\])?\s*(\w+)\s*;", re.M)


def _ports(verilog: str) -> dict[str, tuple[str, int]]:
    """name → (direction, width), parsed from the module's declarations."""
    return {n: (d, int(w) + 1 if w else 1) for d, w, n in _DECL.findall(verilog)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("kr260")
    empty = tmp_path_factory.mktemp("nobin")
    mp = pytest.MonkeyPatch()
    mp.setenv("PATH", str(empty))                   # no vivado to find
    try:
        import io
        from contextlib import redirect_stdout
        buf = io.StringIO()
        with redirect_stdout(buf):
            rc = main(["build", "--board", "kr260", "--out", str(out), "--jobs", "3"])
    finally:
        mp.undo()
    return out, rc, buf.getvalue()


def test_writes_the_files_and_prints_command(built):
    out, rc, stdout = built
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == FILES
    assert f"cd {out} && vivado -mode batch -nojournal -log vivado.log -source {NAME}.tcl" \
        in stdout
    # ports of the top counted, not every submodule's (it once said 5340 for 184)
    from mcf.hdl.tops import TOPS
    top_ports = len(list(TOPS[NAME]().ports))
    assert f"{out / NAME}.v  ({top_ports} ports)" in stdout
    assert len(_DECL.findall((out / f"{NAME}.v").read_text())) > 10 * top_ports
    # the XDC constrains exactly the board pins the block design makes external
    xdc = (out / "kr260.xdc").read_text()
    used = [p for p in board_pins() if p.port.split("[")[0] in ETH_BOARD_PORTS]
    assert xdc.count("PACKAGE_PIN") == len(used) == 40 and len(board_pins()) == 47
    for p in used:
        assert f"set_property PACKAGE_PIN {p.pin} [get_ports {{{p.port}}}]" in xdc
    assert "led0" not in xdc and "sfp_i2c0" not in xdc and "fan0_b" not in xdc
    # both PHYs' management pins (docs/board.md's pin table), 1.8 V, slow slew
    for port, pin in (("eth_rgmii0_mdc", "G3"), ("eth_rgmii0_mdio", "F3"),
                      ("eth_rgmii1_mdc", "R8"), ("eth_rgmii1_mdio", "T8")):
        for prop in (f"PACKAGE_PIN {pin}", "IOSTANDARD LVCMOS18", "SLEW SLOW"):
            assert f"set_property {prop} [get_ports {{{port}}}]" in xdc, (port, prop)
    assert "create_clock -name eth_rgmii1_rx_clk -period 8.000" in xdc
    assert "create_clock -name sfp_refclk0 -period 6.400" in xdc
    timing = (out / f"{ETH}_timing.xdc").read_text()
    assert timing.count("-group") == 6 and "*/eth/gt_rx_clk" in timing
    assert "set jobs 3\n" in (out / f"{NAME}.tcl").read_text()


def test_tcl_names_every_interface_of_the_top(built):
    out, _, _ = built
    ports = _ports((out / f"{NAME}.v").read_text())
    tcl = (out / f"{NAME}.tcl").read_text()
    # the top has the ports the block design connects, with the HP and control widths
    for i in range(HP_PORTS):
        p = f"m_axi_hp{i}"
        assert ports[f"{p}_wdata"] == ("output", AXI_WIDTH)
        assert ports[f"{p}_araddr"] == ("output", TOP_ADDR_BITS)
        assert ports[f"{p}_awid"] == ("output", TOP_ID_BITS)
        assert ports[f"{p}_rdata"] == ("input", AXI_WIDTH)
        assert f"[get_bd_intf_pins node/{p}] [get_bd_intf_pins ps/S_AXI_HP{i}_FPD]" in tcl
    assert ports["s_axi_ctrl_wdata"] == ("input", 32)
    assert ports["s_axi_ctrl_awaddr"][0] == "input"
    assert "[get_bd_intf_pins node/s_axi_ctrl]" in tcl
    for pin in ("aclk", "aresetn", "irq"):
        assert ports[pin][1] == 1
        assert f"[get_bd_pins node/{pin}]" in tcl
    # everything the Tcl names on the node is a port or an interface prefix of the top
    for kind, ref in re.findall(r"get_bd_(pins|intf_pins) node/(\w+)", tcl):
        if kind == "pins":
            assert ref in ports, ref
        else:
            assert any(p.startswith(ref + "_") for p in ports), ref
    # and on the MAC wrapper: every pin the Tcl names is a port of mcf_eth.v, with its width
    eth = _ports((out / f"{ETH}.v").read_text())
    named = re.findall(r"get_bd_(pins|intf_pins) eth/(\w+)", tcl)
    assert len(named) > 30
    for kind, ref in named:
        if kind == "pins":
            assert ref in eth, ref
        else:
            assert any(p.startswith(ref + "_") for p in eth), ref
    assert eth["gt_txdata"] == ("output", 64) and eth["gt_rxdata"] == ("input", 64)
    assert eth["rgmii1_txd"] == ("output", 4) and eth["rgmii2_rxd"] == ("input", 4)
    for lk in (1, 2):
        assert [eth[f"rgmii{lk}_{p}"] for p in ("mdc", "mdio_o", "mdio_t", "mdio_i")] == \
            [("output", 1)] * 3 + [("input", 1)]
    assert eth["s_axi_eth_awaddr"] == ("input", 12)
    for lk in range(3):
        assert eth[f"s_axis_link{lk}_tdata"] == ("input", 64)
        assert eth[f"m_axis_link{lk}_tdata"] == ports[f"m_axis_link{lk}_tdata"] \
            == ("output", 64)


_RECORDER = r"""
set ::calls {}
foreach cmd {create_project set_property add_files update_compile_order create_bd_design
             create_bd_cell apply_bd_automation connect_bd_net connect_bd_intf_net
             assign_bd_address validate_bd_design save_bd_design launch_runs wait_on_run
             create_bd_port} {
    proc $cmd args [format {lappend ::calls [list %s {*}$args]; return ""} $cmd]
}
foreach cmd {get_bd_cells get_bd_pins get_bd_intf_pins get_files get_runs get_bd_ports
             get_bd_addr_spaces get_bd_addr_segs get_clocks} {
    proc $cmd args [format {lappend ::calls [list %s {*}$args]; return [lindex $args end]} $cmd]
}
foreach cmd {open_run report_timing_summary} {
    proc $cmd args [format {lappend ::calls [list %s {*}$args]; return ""} $cmd]
}
proc current_project {} { return project }
proc current_fileset {} { return sources_1 }
# What the stubbed Vivado reports: its version, the installed board parts, the PS's pl_clk0,
# the routed design's worst setup/hold slack, aclk's period and intra-clock setup slack
# (argv: VERSION BOARDS PL_HZ WNS WHS PERIOD ACLK_WNS).
lassign [lrange $argv 1 end] ::version ::boards ::pl_hz ::wns ::whs ::period ::aclk_wns
proc version {flag} { return $::version }
proc get_board_parts {-quiet pattern} {
    return [lsearch -all -inline -glob [split $::boards ,] $pattern]
}
proc get_timing_paths args {
    lappend ::calls [list get_timing_paths {*}$args]
    if {"-from" in $args} { return aclk_path }
    return [expr {"-hold" in $args ? "hold_path" : "setup_path"}]
}
proc get_property {prop obj} {
    switch -- $prop {
        PROGRESS { return "100%" }
        CONFIG.FREQ_HZ { return $::pl_hz }
        SLACK { return [dict get [list hold_path $::whs setup_path $::wns aclk_path \
                                       $::aclk_wns] $obj] }
        PERIOD { return $::period }
        default { return "" }
    }
}
proc make_wrapper args { lappend ::calls [list make_wrapper {*}$args]; return wrapper.v }
source [lindex $argv 0]
foreach c $::calls { puts "CALL $c" }
"""

GOOD_VIVADO = ["2023.2", f"xilinx.com:kv260_som:part0:1.4,{BOARD_PART}", f"{ACLK_HZ:.0f}",
               "0.114", "0.021", f"{1e9 / ACLK_HZ:.3f}", "0.233"]
"""The stubbed Vivado's answers when everything is right: version, installed board parts,
pl_clk0 in Hz, WNS and WHS in ns, aclk's period and its own WNS in ns."""


def _run_tcl(built, tmp_path, vivado=GOOD_VIVADO):
    """Run the generated script under tclsh with the stubbed Vivado in a copy of the output
    folder, with the files impl_1 would leave; returns the process."""
    out, _, _ = built
    for f in out.iterdir():
        shutil.copy(f, tmp_path / f.name)
    bd = f"{NAME}_bd"
    proj = tmp_path / "project"
    bit = proj / f"{NAME}.runs" / "impl_1" / f"{bd}_wrapper.bit"
    hwh = proj / f"{NAME}.gen" / "sources_1" / "bd" / bd / "hw_handoff" / f"{bd}.hwh"
    for f, body in ((bit, "BIT"), (hwh, "<HWH/>")):
        f.parent.mkdir(parents=True)
        f.write_text(body)
    (tmp_path / "rec.tcl").write_text(_RECORDER)
    return subprocess.run([TCLSH, str(tmp_path / "rec.tcl"), str(tmp_path / f"{NAME}.tcl"),
                           *vivado], capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.mark.skipif(TCLSH is None, reason="tclsh (Debian tcl) not installed")
def test_tcl_runs_to_the_end_and_connects(built, tmp_path):
    res = _run_tcl(built, tmp_path)
    proj = tmp_path / "project"
    assert res.returncode == 0, res.stderr
    assert (tmp_path / f"{NAME}.bit").read_text() == "BIT"
    assert (tmp_path / f"{NAME}.hwh").read_text() == "<HWH/>"
    lines = res.stdout.splitlines()
    assert f"wrote {tmp_path / NAME}.bit and {tmp_path / NAME}.hwh" in lines
    calls = [c.removeprefix("CALL ") for c in lines if c.startswith("CALL ")]
    assert calls[0].startswith(f"create_project {NAME} {proj} -part xck26-sfvc784-2LV-c")
    assert any(c.startswith("set_property board_part xilinx.com:kr260_som:part0:1.1")
               for c in calls)
    assert f"create_bd_cell -type module -reference {NAME} node" in calls
    assert "launch_runs impl_1 -to_step write_bitstream -jobs 3" in calls
    nets = [c.split()[1:] for c in calls if c.startswith("connect_bd_net ")]
    intf = [c.split()[1:] for c in calls if c.startswith("connect_bd_intf_net ")]

    def net_of(pin):
        return next(set(n) for n in nets if pin in n)

    assert {"node/aclk", "ctrl_smc/aclk", "rst/slowest_sync_clk", "ps/maxihpm0_fpd_aclk",
            *(f"ps/saxihp{i}_fpd_aclk" for i in range(HP_PORTS))} <= net_of("ps/pl_clk0")
    assert net_of("node/aresetn") == {"rst/peripheral_aresetn", "node/aresetn",
                                      "ctrl_smc/aresetn"}
    assert net_of("node/irq") == {"node/irq", "ps/pl_ps_irq0"}
    assert ["ctrl_smc/M00_AXI", "node/s_axi_ctrl"] in intf
    assert ["ps/M_AXI_HPM0_FPD", "ctrl_smc/S00_AXI"] in intf
    for i in range(HP_PORTS):
        assert [f"node/m_axi_hp{i}", f"ps/S_AXI_HP{i}_FPD"] in intf
    # the MAC wrapper: its cell, clock/reset, control port, the links both ways
    assert f"create_bd_cell -type module -reference {ETH} eth" in calls
    assert ["ps/pl_clk0", "eth/aclk"] in nets
    assert ["rst/peripheral_aresetn", "eth/aresetn"] in nets
    assert "set_property CONFIG.NUM_MI 2 ctrl_smc" in calls
    assert ["ctrl_smc/M01_AXI", "eth/s_axi_eth"] in intf
    for lk in range(3):
        assert [f"node/m_axis_link{lk}", f"eth/s_axis_link{lk}"] in intf
        assert [f"eth/m_axis_link{lk}", f"node/s_axis_link{lk}"] in intf
    # 125 MHz: the clocking wizard on pl_clk0, to the RGMII MACs and the GT's free-run clock
    assert "create_bd_cell -type ip -vlnv xilinx.com:ip:clk_wiz eth_clk" in calls
    assert ["ps/pl_clk0", "eth_clk/clk_in1"] in nets
    assert net_of("eth_clk/clk_out1") == {"eth_clk/clk_out1", "eth/eth_clk",
                                          "gt/gtwiz_reset_clk_freerun_in"}
    assert net_of("eth_clk/locked") == {"eth_clk/locked", "rst/dcm_locked"}
    wiz = next(c for c in calls if "CLKOUT1_REQUESTED_OUT_FREQ" in c)
    assert "CONFIG.CLKOUT1_REQUESTED_OUT_FREQ 125.000" in wiz
    # the GT wizard with every parameter of GT_WIZARD, its user data and clocks to eth/gt_*
    assert "create_bd_cell -type ip -vlnv xilinx.com:ip:gtwizard_ultrascale gt" in calls
    gt = next(c for c in calls if "CONFIG.TX_LINE_RATE" in c)
    for k, v in GT_WIZARD.items():
        assert f"CONFIG.{k} {{{v}}}" in gt or f"CONFIG.{k} {v}" in gt, k
    for a, b in (("gt/gtwiz_userclk_tx_usrclk2_out", "eth/gt_tx_clk"),
                 ("gt/gtwiz_userclk_rx_usrclk2_out", "eth/gt_rx_clk"),
                 ("eth/gt_txdata", "gt/gtwiz_userdata_tx_in"),
                 ("gt/gtwiz_userdata_rx_out", "eth/gt_rxdata"),
                 ("gt/gtwiz_reset_rx_done_out", "eth/gt_rx_done"),
                 ("eth/gt_reset", "gt/gtwiz_reset_all_in"),
                 ("refclk_buf/IBUF_OUT", "gt/gtrefclk00_in")):
        assert net_of(a) == {a, b}
    # board pins: a block-design port per XDC port, connected to its pin
    made = {c.split()[-1]: c for c in calls if c.startswith("create_bd_port")}
    assert sorted(made) == sorted(ETH_BOARD_PORTS)
    assert "-from 3 -to 0" in made["eth_rgmii0_tx_data"] and "-dir O" in made["eth_rgmii0_tx_data"]
    assert "-type clk -freq_hz 125000000" in made["eth_rgmii1_rx_clk"]
    assert net_of("eth_rgmii0_tx_data") == {"eth_rgmii0_tx_data", "eth/rgmii1_txd"}
    assert net_of("eth_rgmii1_rx_clk") == {"eth_rgmii1_rx_clk", "eth/rgmii2_rx_clk"}
    assert net_of("sfp0_tx_p") == {"sfp0_tx_p", "gt/gthtxp_out"}
    assert net_of("sfp_ctl0_tx_disable") == {"sfp_ctl0_tx_disable", "eth/sfp_tx_disable"}
    assert net_of("sfp_refclk0_p") == {"sfp_refclk0_p", "refclk_buf/IBUF_DS_P"}
    # each PHY's MDC straight out; its MDIO through an IOBUF whose I/T/O are the wrapper's
    # mdio_o / mdio_t (1 = released) / mdio_i and whose IO is the board port
    for r, lk in ((0, 1), (1, 2)):
        buf = f"mdio{lk}_buf"
        assert f"create_bd_cell -type ip -vlnv xilinx.com:ip:util_ds_buf {buf}" in calls
        assert f"set_property CONFIG.C_BUF_TYPE IOBUF {buf}" in calls
        assert "-dir O" in made[f"eth_rgmii{r}_mdc"] and "-dir IO" in made[f"eth_rgmii{r}_mdio"]
        assert net_of(f"eth_rgmii{r}_mdc") == {f"eth_rgmii{r}_mdc", f"eth/rgmii{lk}_mdc"}
        assert net_of(f"eth_rgmii{r}_mdio") == {f"eth_rgmii{r}_mdio", f"{buf}/IOBUF_IO_IO"}
        assert net_of(f"{buf}/IOBUF_IO_I") == {f"eth/rgmii{lk}_mdio_o", f"{buf}/IOBUF_IO_I"}
        assert net_of(f"{buf}/IOBUF_IO_T") == {f"eth/rgmii{lk}_mdio_t", f"{buf}/IOBUF_IO_T"}
        assert net_of(f"{buf}/IOBUF_IO_O") == {f"{buf}/IOBUF_IO_O", f"eth/rgmii{lk}_mdio_i"}
    # the XDC enabled, the timing constraints late; the two control windows side by side
    assert "set_property is_enabled true kr260.xdc" in calls
    assert f"set_property PROCESSING_ORDER LATE {ETH}_timing.xdc" in calls
    seg = [c for c in calls if c.startswith("assign_bd_address -target_address_space")]
    assert seg == [
        f"assign_bd_address -target_address_space ps/Data -offset {CTRL_BASE:#x} -range "
        f"{CTRL_RANGE:#x} node/s_axi_ctrl",
        f"assign_bd_address -target_address_space ps/Data -offset {ETH_CTRL_BASE:#x} -range "
        f"{ETH_CTRL_RANGE:#x} eth/s_axi_eth"]
    assert ETH_CTRL_BASE == CTRL_BASE + 0x1000
    ps_cfg = next(c for c in calls if c.startswith("set_property -dict") and "PSU__" in c)
    for i in range(HP_PORTS):
        assert f"CONFIG.PSU__USE__S_AXI_GP{2 + i} 1" in ps_cfg
        assert f"CONFIG.PSU__SAXIGP{2 + i}__DATA_WIDTH {AXI_WIDTH}" in ps_cfg
    assert "CONFIG.PSU__USE__IRQ0 1" in ps_cfg and "CONFIG.PSU__USE__M_AXI_GP0 1" in ps_cfg
    for off in ("M_AXI_GP1", "M_AXI_GP2", "S_AXI_GP0", "S_AXI_GP1", "S_AXI_GP6"):
        assert f"CONFIG.PSU__USE__{off} 0" in ps_cfg
    assert calls.index("assign_bd_address") < calls.index(
        "launch_runs impl_1 -to_step write_bitstream -jobs 3")
    # pl_clk0 set to ACLK_HZ; timing read on the routed design before the copy
    assert f"set_property CONFIG.PSU__CRL_APB__PL0_REF_CTRL__FREQMHZ {ACLK_HZ / 1e6:g} ps" \
        in calls
    assert calls.index("open_run impl_1") > calls.index("wait_on_run impl_1")
    assert any(c.startswith("get_timing_paths") and "-setup" in c for c in calls)
    assert "timing met: WNS 0.114 ns, WHS 0.021 ns" in lines
    assert f"get_timing_paths -max_paths 1 -nworst 1 -setup -from {PL_CLK0_CLOCK} -to " \
        f"{PL_CLK0_CLOCK}" in calls
    assert json.loads((tmp_path / f"{NAME}.timing.json").read_text()) == {
        "wns_ns": 0.114, "whs_ns": 0.021, "aclk_period_ns": round(1e9 / ACLK_HZ, 3),
        "aclk_wns_ns": 0.233}


@pytest.mark.skipif(TCLSH is None, reason="tclsh (Debian tcl) not installed")
@pytest.mark.parametrize("answers, message", [
    ({3: "-0.052"}, "timing failed, WNS -0.052 ns < 0"),
    ({4: "-0.003"}, "timing failed, WHS -0.003 ns < 0"),
    ({3: ""}, "no timed path (WNS ''"),
    ({0: "2024.1"}, "written for Vivado 2023.2, this is Vivado 2024.1"),
    ({1: "xilinx.com:kv260_som:part0:1.4"}, f"board part {BOARD_PART} is not installed"),
    ({2: "99999001"}, "ps/pl_clk0 is '99999001' Hz"),
])
def test_tcl_stops_without_copying(built, tmp_path, answers, message):
    """A failed check stops the script (non-zero exit, the message) before any .bit or .hwh
    is copied: timing not met, another Vivado, no KR260 board files, pl_clk0 not ACLK_HZ."""
    vivado = [answers.get(i, v) for i, v in enumerate(GOOD_VIVADO)]
    res = _run_tcl(built, tmp_path, vivado)
    assert res.returncode != 0
    assert message in res.stderr, res.stderr
    assert not (tmp_path / f"{NAME}.bit").exists() and not (tmp_path / f"{NAME}.hwh").exists()


def test_rgmii_io_constraints(built):
    """The timing XDC constrains every RGMII data pin against its PHY's clock, on both edges,
    with the RGMII v2.0 figures of RGMII_TIMING for the delay mode settled (rgmii-id)."""
    out, _, _ = built
    timing = (out / f"{ETH}_timing.xdc").read_text()
    assert RGMII_DELAY_MODE == "rgmii-id"
    half = RGMII_TIMING["period_ns"] / 2
    for r in (0, 1):
        ins = f"{{eth_rgmii{r}_rx_data* eth_rgmii{r}_rx_ctl*}}"
        outs = f"{{eth_rgmii{r}_tx_data* eth_rgmii{r}_tx_ctl*}}"
        for edge in ("", " -clock_fall -add_delay"):
            assert (f"set_input_delay -clock [get_clocks eth_rgmii{r}_rx_clk] -max "
                    f"{half - RGMII_TIMING['rx_setup_ns']:.3f} [get_ports {ins}]{edge}") in timing
            assert (f"set_input_delay -clock [get_clocks eth_rgmii{r}_rx_clk] -min "
                    f"{RGMII_TIMING['rx_hold_ns']:.3f} [get_ports {ins}]{edge}") in timing
            assert (f"set_output_delay -clock [get_clocks eth_rgmii{r}_tx_clk] -max "
                    f"{half - RGMII_TIMING['tx_skew_ns']:.3f} [get_ports {outs}]{edge}") in timing
        assert f"create_generated_clock -name eth_rgmii{r}_tx_clk " in timing
        assert timing.count(f"_to [get_clocks eth_rgmii{r}_tx_clk]") == 4
    # every port the constraints name is a board port of the XDC
    xdc = (out / "kr260.xdc").read_text()
    for name in set(re.findall(r"(eth_rgmii\d_\w+?)\*", timing)):
        assert f"{{{name}[0]}}" in xdc or f"{{{name}}}" in xdc, name


def test_runs_vivado_when_given(tmp_path, capsys):
    """``--vivado PATH``: the batch command runs in the output folder (a stand-in executable
    records its arguments and working directory, leaves the timing file the script writes for
    a routed design that misses aclk by 0.5 ns, then fails: exit 1); ``--json PATH`` holds
    Vivado's status and the timing read back, with the clock the routed design meets."""
    fake = tmp_path / "vivado"
    timing = '{"wns_ns": -0.5, "whs_ns": 0.02, "aclk_period_ns": 3.333, "aclk_wns_ns": -0.5}'
    fake.write_text(f'#!/bin/sh\necho "$PWD $*" > "$PWD/ran.txt"\n'
                    f"echo '{timing}' > \"$PWD/{NAME}.timing.json\"\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    rc = main(["build", "--board", "kr260", "--out", str(out), "--vivado", str(fake),
               "--json", str(tmp_path / "build.json")])
    assert (out / "ran.txt").read_text().split() == [
        str(out.resolve()), "-mode", "batch", "-nojournal", "-log", "vivado.log",
        "-source", f"{NAME}.tcl"]
    assert rc == 1                                      # Vivado's failure is the build's
    printed = capsys.readouterr().out
    assert "vivado exited 3" in printed
    assert "aclk 300.03 MHz wanted, 260.892 MHz met (aclk WNS -0.5 ns)" in printed
    result = json.loads((tmp_path / "build.json").read_text())
    assert result["rc"] == 1 and result["vivado_rc"] == 3 and result["bit"] is None
    assert result["files"][-1] == str(out / f"{NAME}.tcl")
    t = result["timing"]
    assert t["met"] is False and t["wns_ns"] == -0.5
    assert t["aclk_target_mhz"] == round(1000 / 3.333, 3)
    assert t["aclk_achieved_mhz"] == round(1000 / 3.833, 3)


@pytest.mark.parametrize("text", ["", "[1]", '{"wns_ns": 0.1}', "not json"])
def test_read_timing_refuses_what_the_script_did_not_write(tmp_path, text):
    from mcf.commands.build import read_timing

    (tmp_path / "t.json").write_text(text)
    assert read_timing(tmp_path / "t.json") is None
    assert read_timing(tmp_path / "missing.json") is None
    (tmp_path / "t.json").write_text('{"wns_ns": null, "whs_ns": null, "aclk_period_ns": null, '
                                     '"aclk_wns_ns": null}')          # no timed path
    t = read_timing(tmp_path / "t.json")
    assert t["met"] is False and t["aclk_achieved_mhz"] is None


@pytest.mark.parametrize("argv, message", [
    (["--board", "kr261"], "unknown board 'kr261'; known: kr260"),
    (["--board", "kr260", "--jobs", "0"], "--jobs must be at least 1, not 0"),
    (["--board", "kr260", "--vivado", "/nonexistent/vivado"], "not an executable file"),
    (["--board", "kr260", "--name", "no_such_top"], "unknown top 'no_such_top'"),
])
def test_bad_arguments_exit_2(argv, message, capsys, tmp_path):
    assert main(["build", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "o").exists()


def test_non_node_top_exit_2(capsys, tmp_path):
    assert main(["build", "--board", "kr260", "--out", str(tmp_path), "--name",
                 "mcf_kv_quantizer"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a node top: the top has no port aclk" in err[0]


def test_help_lists_build(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["build", "--help"])
    assert exc.value.code == 0 and "--board" in capsys.readouterr().out

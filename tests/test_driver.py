"""The node driver's pure parts (issue #12 item 1; ``sw/driver``): the binding VLNVs, the
generated snapshot type, the bind-time identity check, the command-ring producer, the halt word,
the register description PYNQ's ``RegisterMap`` consumes, and importing without PYNQ.
The driver against RTL: ``tests/test_sim_board.py``."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from mcf.abi.csrmap import node_regmap
from mcf.abi.node import CMD_BYTES, Cmd, Queue, RecordClass
from mcf.abi.node_config import KR260, NODE_CONFIGS, SIM
from mcf.abi.regs import Access
from mcf.abi.sequencer import SEQ_HALT, HaltCause
from mcf.driver import (
    BindError,
    CommandRing,
    RingFull,
    check_identity,
    config_for_top,
    snapshot_type,
    status_registers,
    unpack_halt,
)


def test_bindto_is_the_vivado_module_reference_of_every_top():
    from mcf.abi.platform import MODULE_REF_VLNV
    from mcf.driver import NodeDriver
    assert NodeDriver.bindto == [MODULE_REF_VLNV.format(name=c.top)
                                 for c in NODE_CONFIGS.values()]
    assert NodeDriver.bindto[0] == "xilinx.com:module_ref:mcf_node:1.0"
    assert config_for_top("mcf_node") is KR260 and config_for_top("mcf_node_sim") is SIM
    with pytest.raises(BindError, match="no node configuration"):
        config_for_top("mcf_nic")


def test_snapshot_type_has_every_read_only_register_in_map_order():
    rm = node_regmap()
    want = [r.name for _, r in rm if all(f.access is Access.R for f in r.fields)]
    cls = snapshot_type(rm)
    assert [f.name for f in dataclasses.fields(cls)] == want
    assert [r.name for r in status_registers(rm)] == want
    assert {"ID", "CAPS", "BUS_ERRORS", "land_packets", "seq1_marks", "CMD0_CONS"} <= set(want)
    assert not {"NODE", "ROUTE_WR", "IRQ_STATUS", "SEQ0_CTRL"} & set(want)
    snap = cls(**{n: i for i, n in enumerate(want)})
    assert snap.as_dict()["CAPS"] == want.index("CAPS")
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.ID = 1
    assert snapshot_type(rm) is cls            # one type per map


def test_identity_check():
    rm = node_regmap()
    check_identity(rm.id_word, SIM.caps(), SIM, rm)
    check_identity(rm.id_word, KR260.caps(), KR260, rm)
    idr = rm.register("ID")
    old = idr.pack(version=0x0100, ident=idr.unpack(rm.id_word)["ident"])
    with pytest.raises(BindError, match="version 0x0100"):
        check_identity(old, SIM.caps(), SIM, rm)
    with pytest.raises(BindError, match="ident 0x0000"):
        check_identity(0, SIM.caps(), SIM, rm)
    with pytest.raises(BindError, match=r"'kr260'.*reduce_slots=4 \(want 12\)"):
        check_identity(rm.id_word, SIM.caps(), KR260, rm)


def _cmds(n: int, start: int = 0) -> list[Cmd]:
    return [Cmd(RecordClass.NOP, Queue.NET, arg=start + i) for i in range(n)]


def test_command_ring_writes_entries_wraps_and_refuses_overrun():
    mem = bytearray(4096)
    ring = CommandRing(Queue.NET, offset=256, log2=2)
    assert ring.put(mem, _cmds(3), cons=0) == 3
    for i, c in enumerate(_cmds(3)):
        assert mem[256 + i * CMD_BYTES: 256 + (i + 1) * CMD_BYTES] == c.pack()
    assert ring.free(cons=0) == 1
    before = bytes(mem)
    with pytest.raises(RingFull, match="CMD0 \\(NET\\): 2 records, 1 of 4"):
        ring.put(mem, _cmds(2, 10), cons=0)
    assert bytes(mem) == before and ring.prod == 3           # nothing written
    assert ring.put(mem, _cmds(3, 20), cons=2) == 6          # entries 3, 0, 1
    assert mem[256 + 3 * CMD_BYTES: 256 + 4 * CMD_BYTES] == _cmds(1, 20)[0].pack()
    assert mem[256: 256 + CMD_BYTES] == _cmds(1, 21)[0].pack()
    assert mem[:256] == bytes(256) and mem[256 + 4 * CMD_BYTES:] == bytes(4096 - 320)
    wrap = CommandRing(Queue.COMPUTE, offset=0, log2=1, prod=0xFFFF)
    assert wrap.put(mem, _cmds(2), cons=0xFFFF) == 1          # 16-bit free-running index
    with pytest.raises(ValueError):
        CommandRing(Queue.NET, offset=0, log2=17)


def test_halt_word_unpacks_with_the_abi_layout():
    word = SEQ_HALT.const({"halted": 1, "queue": Queue.COMPUTE, "cause": HaltCause.LANDED,
                           "kv_id": 0x1234}).as_bits()
    assert unpack_halt(word) == {"halted": 1, "queue": 1, "cause": HaltCause.LANDED.value,
                                 "kv_id": 0x1234}


def test_injected_description_drives_pynqs_register_map():
    from pynq.registers import RegisterMap
    rm = node_regmap()
    words = np.zeros(rm.size // 4, dtype=np.uint32)
    cls = RegisterMap.create_subclass("node", rm.pynq_registers())
    regs = cls(words)
    words[rm.addr("CAPS") // 4] = SIM.caps()
    assert int(regs.CAPS.reduce_slots) == SIM.reduce_slots
    assert int(regs.CAPS.links) == SIM.links
    regs.NODE.num_nodes = 5
    assert rm.register("NODE").unpack(int(words[rm.addr("NODE") // 4]))["num_nodes"] == 5


def test_driver_imports_without_pynq():
    code = ("import sys; sys.modules['pynq'] = None\n"
            "import mcf.driver as d\n"
            "assert not d.HAVE_PYNQ and d.NodeDriver.bindto == []\n"
            "try:\n    d.NodeDriver({})\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "needs PYNQ" in out.stdout


def test_eth_driver_binds_to_the_mac_wrapper_and_writes_the_ring_peers():
    from mcf.abi.eth import RXCLK_WINDOW, eth_regmap, rxclk_min
    from mcf.abi.link_map import link_map_for
    from mcf.driver import EthDriver, check_eth_identity, eth_writes
    assert EthDriver.bindto == ["xilinx.com:module_ref:mcf_eth:1.0"]
    rm = eth_regmap()
    check_eth_identity(rm.id_word, rm)
    with pytest.raises(BindError, match="mcf_eth ID register"):
        check_eth_identity(node_regmap().id_word, rm)        # the node's window is not it
    # four boards in a ring: each link's peer is the node at the other end of that cable
    for node in range(4):
        writes = dict(eth_writes(node, 4, "ring", aclk_hz=250e6))
        links = link_map_for(node, 4, "ring")
        assert writes["ETH_LOCAL"] == {"local_id": node}
        assert writes[f"ETH{links[0]}_CFG"] == {"peer_id": (node + 1) % 4}
        assert writes[f"ETH{links[1]}_CFG"] == {"peer_id": (node - 1) % 4}
        assert writes["ETH_RXCLK_MIN"] == {"edges": rxclk_min(250e6)} == {"edges": 256}
        assert len(writes) == 4                               # link 2 unused at N = 4
    assert dict(eth_writes(0, 2, "ring")) == {"ETH_LOCAL": {"local_id": 0},
                                               "ETH0_CFG": {"peer_id": 1},
                                               "ETH1_CFG": {"peer_id": 1}}
    assert dict(eth_writes(2, 3, "ring"))["ETH2_CFG"] == {"peer_id": 0}   # last of odd N
    with pytest.raises(ValueError, match="switch cluster of 4"):
        eth_writes(0, 4, "switch")
    assert rxclk_min(100e6) == RXCLK_WINDOW * 125 // 100 // 2


def test_eth_register_description_drives_pynqs_register_map():
    from pynq.registers import RegisterMap

    from mcf.abi.eth import eth_regmap
    rm = eth_regmap()
    words = np.zeros(rm.size // 4, dtype=np.uint32)
    regs = RegisterMap.create_subclass("eth", rm.pynq_registers())(words)
    words[rm.addr("ETH_LINK") // 4] = 0b101
    assert (int(regs.ETH_LINK.link0_up), int(regs.ETH_LINK.link1_up),
            int(regs.ETH_LINK.link2_up)) == (1, 0, 1)
    regs.ETH1_CFG.peer_id = 3
    assert rm.register("ETH1_CFG").unpack(int(words[rm.addr("ETH1_CFG") // 4])) == {
        "peer_id": 3}

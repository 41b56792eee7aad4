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


# --- NodeDriver on a fake device: refusals before any write, rings without a plan -------------

class FakeNode:
    """A PYNQ device (``REGISTER_RW``) that is a register file of the node map: reads answer
    from it (``ID``, ``CAPS`` of ``config``, ``DIR_READY`` = 1; ``CMDq_HEAD``/``CONS`` follow
    ``CMDq_PROD``: every published record is consumed at once), writes are logged by register
    name. A real node answers through the same calls (``mcf.sim.board.SimBoard``)."""

    def __init__(self, config=SIM, base: int = 0xA000_0000):
        self.rm = node_regmap()
        self.base, self.config = base, config
        self.words = {self.rm.addr("ID"): self.rm.id_word, self.rm.addr("CAPS"): config.caps(),
                      self.rm.addr("DIR_READY"): 1}
        self.writes: list[tuple[str, int]] = []
        self._names = {addr: reg.name for addr, reg in self.rm}

    def has_capability(self, cap: str) -> bool:
        return cap == "REGISTER_RW"

    def read_registers(self, address: int, length: int) -> bytes:
        off = address - self.base
        return b"".join(self.words.get(off + 4 * i, 0).to_bytes(4, "little")
                        for i in range(length // 4))

    def write_registers(self, address: int, data) -> None:
        off = address - self.base
        value = int.from_bytes(bytes(data)[:4], "little")
        name = self._names[off]
        self.writes.append((name, value))
        if name.endswith("_PROD"):          # the doorbell: accepted and consumed at once
            q = name[3]
            for reg in (f"CMD{q}_HEAD", f"CMD{q}_CONS"):
                self.words[self.rm.addr(reg)] = value
        else:
            self.words[off] = value

    def set(self, name: str, value: int) -> None:
        self.words[self.rm.addr(name)] = value

    def written(self) -> list[str]:
        return [n for n, _ in self.writes]


def _driver(config=SIM):
    from mcf.driver import NodeDriver
    dev = FakeNode(config)
    desc = {"phys_addr": dev.base, "addr_range": node_regmap().size, "device": dev,
            "type": f"xilinx.com:module_ref:{config.top}:1.0", "fullpath": "node"}
    return NodeDriver(desc), dev


def _buffer(nbytes: int, address: int = 0x1000_0000):
    from pynq.buffer import PynqBuffer
    return PynqBuffer((nbytes,), "u1", buffer=bytearray(nbytes), offset=0, device=None,
                      device_address=address, bo=0, coherent=True)


def _tiny_plan():
    from mcf.mars import ClusterSpec, get_model, make_topology, plan
    cl = ClusterSpec(2, 1 << 20, 1 << 20, make_topology("kr260-ring", 2))
    return plan(get_model("tiny"), cl, 64, 32, "mars", alpha=0.5)


def test_fake_device_binds_and_configures_a_plan():
    """The fake answers as the node does: bind, attach, configure writes the plan's registers
    (the good path, so the refusals below are refusals and not a broken fake)."""
    from mcf.node.layout import NodeLayout
    from mcf.node.program import configure
    ip, dev = _driver()
    p = _tiny_plan()
    lay = NodeLayout.for_plan(p, SIM, base=0x1000_0000)
    ip.attach(_buffer(lay.size), lay)
    assert dev.writes == []
    ip.configure(p, 0)
    assert dev.writes == [(w.reg, w.value) for w in configure(p, lay, 0, regmap=ip.regmap)]
    assert ip.limits.kv_count == 256 and ip.limits.ring_max_log2 == 16


@pytest.mark.parametrize("config", [SIM, KR260])
def test_driver_refuses_kv_count_beyond_the_directory_before_any_write(config):
    import dataclasses as dc

    from mcf.driver import LayoutError
    from mcf.node.layout import NodeLayout
    ip, dev = _driver(config)
    p = _tiny_plan()
    lay = NodeLayout.for_plan(p, config, base=0x1000_0000)
    buf = _buffer(lay.size + (1 << 20))
    ok = dc.replace(lay, kv=dc.replace(lay.kv, kv_count=config.kv_count))
    ip.attach(buf, ok)                                   # exactly the directory: held
    bad = dc.replace(lay, kv=dc.replace(lay.kv, kv_count=config.kv_count + 44))
    with pytest.raises(LayoutError) as e:
        ip.attach(buf, bad)
    msg = str(e.value)
    assert "\n" not in msg and f"KV_COUNT {config.kv_count + 44}" in msg
    assert f"directory of {config.kv_count} entries" in msg
    assert ip.layout is ok                               # the bad layout was not taken
    ip.layout = bad                                      # a layout swapped in behind its back
    with pytest.raises(LayoutError, match=f"KV_COUNT {config.kv_count + 44}"):
        ip.configure(p, 0)
    with pytest.raises(LayoutError, match="KV_COUNT"):
        ip.configure_rings()
    assert dev.writes == []


def test_driver_reads_the_ring_limit_from_caps_before_any_write():
    from mcf.abi.node_config import caps_register
    from mcf.driver import LayoutError, RingLayout
    from mcf.node.layout import NodeLayout
    ip, dev = _driver()
    p = _tiny_plan()
    with pytest.raises(LayoutError, match=r"ring size 2\^17 \(cmd_log2 17\).*2\^1\.\.2\^16 "
                                          r"\(CAPS.ring_max_log2 16\)"):
        ip.attach(_buffer(RingLayout.nbytes(17)), RingLayout.at(0x1000_0000, 17))
    with pytest.raises(LayoutError, match="cmd_log2 0"):
        ip.attach(_buffer(RingLayout.nbytes(0)), RingLayout.at(0x1000_0000, 0))
    # the limit is the device's CAPS word, read at the check, not the ABI constant
    caps = caps_register()
    dev.set("CAPS", caps.pack(**{**caps.unpack(SIM.caps()), "ring_max_log2": 9}))
    lay = NodeLayout.for_plan(p, SIM, base=0x1000_0000, cmd_log2=10)
    with pytest.raises(LayoutError, match=r"2\^1\.\.2\^9 \(CAPS.ring_max_log2 9\)"):
        ip.attach(_buffer(lay.size), lay)
    ip.attach(_buffer(RingLayout.nbytes(9)), RingLayout.at(0x1000_0000, 9))
    dev.set("CAPS", caps.pack(**{**caps.unpack(SIM.caps()), "kv_count_log2": 2}))
    lay8 = NodeLayout.for_plan(p, SIM, base=0x1000_0000, cmd_log2=8)
    assert lay8.kv.kv_count == 8
    with pytest.raises(LayoutError, match=r"KV_COUNT 8 .* directory of 4 entries "
                                          r"\(CAPS.kv_count_log2 2\)"):
        ip.attach(_buffer(lay8.size), lay8)
    assert dev.writes == []


def test_driver_refuses_misplaced_rings_and_busy_rings_before_any_write():
    import dataclasses as dc

    from mcf.driver import DriverError, LayoutError, RingLayout
    ip, dev = _driver()
    lay = RingLayout.at(0x1000_0000, 4)
    buf = _buffer(lay.size)
    with pytest.raises(LayoutError, match="not 16-byte aligned"):
        ip.attach(buf, dc.replace(lay, cmd_base=(lay.cmd_base[0], lay.cmd_base[1] + 8)))
    with pytest.raises(LayoutError, match="CMD1 .* lies outside the layout"):
        ip.attach(buf, dc.replace(lay, size=lay.size - CMD_BYTES))
    ip.attach(buf, lay)
    dev.set("CMD1_HEAD", 5)
    dev.set("CMD1_CONS", 3)
    with pytest.raises(DriverError, match="CMD1 \\(COMPUTE\\) still has records in flight"):
        ip.configure_rings()
    with pytest.raises(DriverError, match="configure_rings"):
        ip.push(Queue.NET, _cmds(1))
    assert dev.writes == []


def test_configure_rings_then_hand_made_records():
    """No plan: the rings alone, then hand-made records pushed and published."""
    from mcf.abi.meta import Meta, Op
    from mcf.driver import RingLayout
    ip, dev = _driver()
    lay = RingLayout.at(0x1000_0000, log2=3)
    buf = _buffer(RingLayout.nbytes(3))
    dev.set("CMD0_HEAD", 6)                   # the rings continue from the accepted index
    dev.set("CMD0_CONS", 6)
    ip.attach(buf, lay)
    ip.configure_rings(seq_timeout=500)
    rm = node_regmap()
    assert dev.writes == [
        ("CMD0_BASE_LO", 0x1000_0000), ("CMD0_BASE_HI", 0), ("CMD0_SIZE", 3),
        ("CMD1_BASE_LO", 0x1000_0000 + 8 * CMD_BYTES), ("CMD1_BASE_HI", 0), ("CMD1_SIZE", 3),
        ("SEQ_TIMEOUT", 500),
        ("SEQ0_CTRL", rm.register("SEQ0_CTRL").pack(run=1)),
        ("SEQ1_CTRL", rm.register("SEQ1_CTRL").pack(run=1))]
    dev.writes.clear()
    hdr = Meta(op=Op.CONTROL, src=0, dst=0, route_id=0, kv_id=0, length=0).pack()
    net = [Cmd(RecordClass.SEND, Queue.NET, meta=hdr), Cmd(RecordClass.NOP, Queue.NET),
           Cmd(RecordClass.MARK, Queue.NET, irq=True)]
    ip.push(Queue.NET, net)
    mem = bytes(buf)
    for i, c in enumerate(net):                         # slots 6, 7, 0 of an 8-entry ring
        at = ((6 + i) % 8) * CMD_BYTES
        assert mem[at: at + CMD_BYTES] == c.pack()
    ip.push(Queue.COMPUTE, [Cmd(RecordClass.MARK, Queue.COMPUTE)])
    assert mem[8 * CMD_BYTES: 9 * CMD_BYTES] == bytes(CMD_BYTES)   # put after push's read
    assert bytes(buf)[8 * CMD_BYTES: 9 * CMD_BYTES] == Cmd(RecordClass.MARK,
                                                           Queue.COMPUTE).pack()
    assert dev.writes == [("CMD0_PROD", 9), ("CMD1_PROD", 1)]
    with pytest.raises(RingFull, match="9 records, 8 of 8"):
        ip.put(Queue.NET, _cmds(9))


def test_a_ring_of_2_16_entries_keeps_one_free():
    """PROD − CONS is taken mod 2^16: at 2^16 entries a full ring would read as empty."""
    ring = CommandRing(Queue.NET, offset=0, log2=16)
    assert ring.free(cons=0) == ring.capacity == 65_535
    assert CommandRing(Queue.NET, offset=0, log2=15).free(cons=0) == 32_768
    mem = bytearray(CMD_BYTES << 16)
    with pytest.raises(RingFull):
        ring.put(mem, _cmds(65_536), cons=0)
    assert ring.prod == 0 and not any(mem)


def test_timeout_names_the_halted_record_by_halt_index():
    """``seq<q>_halt_index`` is the halted record's position in the sequencer's input: with no
    ring entry skipped it is the ring index, and the timeout names that record — even after
    records were skipped by the watchdog (``retired`` no longer points at it)."""
    from mcf.abi.meta import Meta, Op
    from mcf.driver import RingLayout, StepTimeout
    ip, dev = _driver()
    ip.attach(_buffer(RingLayout.nbytes(2)), RingLayout.at(0x1000_0000, log2=2))
    ip.configure_rings()
    kv = Meta(op=Op.KV_REPLICA, src=0, dst=0, route_id=0, kv_id=77, length=0).pack()
    recs = [Cmd(RecordClass.NOP, Queue.COMPUTE, meta=kv, wait=1),
            Cmd(RecordClass.NOP, Queue.COMPUTE, meta=kv, wait=3),
            Cmd(RecordClass.MARK, Queue.COMPUTE)]
    ip.push(Queue.COMPUTE, recs)
    dev.set("seq1_halt", SEQ_HALT.const({"halted": 1, "queue": Queue.COMPUTE,
                                         "cause": HaltCause.LANDED, "kv_id": 77}).as_bits())
    dev.set("seq1_halt_index", 1)
    dev.set("seq1_retired", 1)
    dev.set("seq1_skipped", 1)           # record 0 was skipped: retired alone would mislead
    with pytest.raises(StepTimeout) as e:
        ip.wait_marks({Queue.COMPUTE: 1}, timeout=0)
    assert e.value.queue is Queue.COMPUTE
    assert "waiting at record 1: NOP wait 3 kv_id 77" in str(e.value)
    dev.set("cmd1_bad_records", 1)       # an entry skipped at the ring: no index is claimed
    with pytest.raises(StepTimeout) as e:
        ip.wait_marks({Queue.COMPUTE: 1}, timeout=0)
    assert "waiting at record" not in str(e.value)

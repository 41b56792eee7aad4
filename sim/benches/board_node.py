"""cocotb bench: the PYNQ driver on the simulated KR260 (issue #12 items 1–2 tests; docs/board.md
"The simulated board").

The DUT is the flat node top (``mcf_node_sim``). Every host action is ordinary blocking PYNQ
code run in a thread with cocotb's ``bridge``: ``pynq.Overlay(<hwh>, device=SimBoard(dut))``
binds :class:`mcf.driver.NodeDriver`, whose reads and writes are AXI-Lite transfers on the RTL.
No register is poked from the side.

Tests (one Verilator build; pick with the runner's ``testcase``; parameters: ``hwh`` the
board's ``.hwh``, ``wrong_hwh`` one that names the kr260 top, ``seed``):

* ``bind_and_registers`` — ``Overlay`` binds the driver from the ``.hwh``; every plain RW
  register written through ``register_map`` with a random value reads back equal (through
  ``register_map`` and ``DefaultIP.read``); fields of ``NODE`` through ``register_map``; an
  address past the map answers SLVERR, which PYNQ raises (:class:`AxiBusError`), counts in
  ``BUS_ERRORS``, and the node still answers; ``snapshot()`` holds every status register;
  an ``.hwh`` naming the kr260 top on this sim RTL fails to bind on ``CAPS``.
* ``loopback_step`` — MARS's prefill step 1 of the ``tiny`` model on a 2-node ring, played by
  one board: link 0's TX is looped back to its own RX, held. As node 0 the driver programs
  the step (owner KV in DDR + ``DIR_LAND``, routes, rings, doorbells): its sends leave on link 0
  and are checked bit-exact against :func:`mcf.golden.nic.link_frame` (Meta, payload from the
  KV slot, CRC, link sequence); its COMPUTE queue then waits for node 1's copy, which never
  comes — ``wait_marks`` raises :class:`mcf.driver.StepTimeout` naming COMPUTE, with the
  records retired before the stuck FREE; the watchdog (``SEQ_TIMEOUT``) has halted the queue on
  that FREE (halt word: LANDED, its ``kv_id``; ``halt1`` interrupt cause), and ``skip`` of
  each FREE lets the step reach its MARK. The overlay is loaded again (PL reset) and the board
  becomes node 1: the held frames are released into link 0, land, the step completes (both
  MARKs), and every byte of node 1's KV region is checked (node 0's planned bytes at
  :func:`mcf.abi.landing.kv_address`, node 1's own bytes, the fill pattern elsewhere), with the
  landing, directory, send, ring and parser counters of the snapshot equal to the plan and
  node 1's own frames on link 1 bit-exact too. Cycle counts go to ``out``.
"""

from __future__ import annotations

import json
import random

import cocotb
import numpy as np
from cocotb.task import bridge, resume
from cocotb.triggers import ClockCycles

from mcf.abi.csrmap import node_regmap
from mcf.abi.meta import Meta
from mcf.abi.node import PayloadSource, Queue, RecordClass
from mcf.abi.node_config import SIM
from mcf.abi.regs import MCF_ID, WORD_BYTES, Access
from mcf.abi.sequencer import HaltCause
from mcf.golden.nic import LinkRxModel, Packet, link_frame
from mcf.mars.plan import tiny_plan
from mcf.node.layout import NodeLayout
from mcf.sim.board.device import AxiBusError, SimBoard
from mcf.sim.board.links import LinkPorts, frame_beats
from mcf.sim.toolchain import bench_params

FILL = 0x5A
PACKET_WIDTH = 64
SKIP_RW = {"SEQ0_CTRL", "SEQ1_CTRL", "IRQ_STATUS", "LINK_MAP", "NODE"}
"""RW registers the round trip leaves alone: writing them starts queues or moves links."""


def kv_slot_bytes(slot: int, kv_id: int, seed: int) -> bytes:
    return random.Random(seed * 65_537 + kv_id).randbytes(slot)


def expected_packets(prog, layout: NodeLayout, seed: int) -> list[Packet]:
    """The packets ``prog``'s SEND records put on the wire, in queue order (COMPUTE after NET:
    in the steps used here NET holds only its MARK)."""
    out = []
    for cmd in prog.net + prog.compute:
        if cmd.cls is not RecordClass.SEND:
            continue
        meta = Meta.unpack(cmd.meta)
        payload = b""
        if cmd.src is PayloadSource.KV:
            off = layout.kv_layout.land_off[meta.seq]
            payload = kv_slot_bytes(layout.kv.kv_slot, meta.kv_id, seed)[off: off + meta.length]
        out.append(Packet(meta, payload))
    return out


def check_frames(frames, packets: list[Packet]) -> None:
    """Captured link frames == the golden link frames of ``packets`` (sequence from 0)."""
    assert len(frames) == len(packets), (len(frames), len(packets))
    rx = LinkRxModel(PACKET_WIDTH, SIM.max_payload)
    for i, (frame, want) in enumerate(zip(frames, packets, strict=True)):
        beats = frame_beats(frame)
        got = rx.receive(beats)
        assert isinstance(got, Packet), f"frame {i}: the golden receiver says {got}"
        assert got.meta == want.meta, (i, got.meta, want.meta)
        assert got.payload == want.payload, f"frame {i}: payload differs"
        assert beats == link_frame(want, i, PACKET_WIDTH), f"frame {i}: beats differ"
    assert rx.counters["frames_ok"] == len(packets)


@cocotb.test()
async def bind_and_registers(dut):
    params = bench_params()
    rng = random.Random(params.get("seed", 1))
    board = SimBoard(dut, seed=params.get("seed", 1))
    LinkPorts(dut, dut.aclk, dut.aresetn)
    rm = node_regmap()
    out = {}

    def host():
        from pynq import Overlay

        from mcf.driver import BindError, NodeDriver, snapshot_type
        ol = Overlay(params["hwh"], device=board)
        ip = ol.node
        assert type(ip) is NodeDriver, type(ip)
        assert ip.config is SIM
        regs = ip.register_map
        assert int(regs.ID.ident) == MCF_ID
        assert int(regs.ID) == rm.id_word
        written = 0
        for addr, reg in rm:
            if reg.name in SKIP_RW or not all(f.access is Access.RW for f in reg.fields):
                continue
            word = reg.pack(**{f.name: rng.randrange(1 << f.width) for f in reg.fields})
            setattr(regs, reg.name, word)
            assert int(getattr(regs, reg.name)) == word, reg.name
            assert ip.read(addr) == word, reg.name
            written += 1
        regs.NODE.local_id = 3
        regs.NODE.num_nodes = 5
        assert ip.read_fields("NODE") == {"local_id": 3, "num_nodes": 5}
        ip.stop()
        assert [ip.read_fields(f"SEQ{q.value}_CTRL")["run"] for q in Queue] == [0, 0]
        ip.start()
        assert [ip.read_fields(f"SEQ{q.value}_CTRL")["run"] for q in Queue] == [1, 1]
        errors = ip.read_reg("BUS_ERRORS")
        ip.write_reduce_config(5, 2, final=True, result_route=7)     # a W port: reads 0
        assert ip.read_reg("REDUCE_CFG_WR") == 0 and ip.read_reg("BUS_ERRORS") == errors
        unmapped = len(rm) * WORD_BYTES
        for access in (lambda: ip.read(unmapped), lambda: ip.write(unmapped, 0x1234)):
            try:
                access()
            except AxiBusError as e:
                assert e.resp.name == "SLVERR", e
            else:
                raise AssertionError("an unmapped address did not fail")
        assert ip.read_reg("BUS_ERRORS") == errors + 2
        snap = ip.snapshot()
        assert type(snap) is snapshot_type()
        fields = snap.as_dict()
        assert fields["ID"] == rm.id_word and fields["CAPS"] == SIM.caps()
        assert fields["BUS_ERRORS"] == errors + 2
        out["written"], out["snapshot_fields"] = written, len(fields)
        try:
            out["bound"] = type(Overlay(params["wrong_hwh"], device=board).node).__name__
        except BindError as e:
            out["wrong_hwh"] = str(e)
        else:
            raise AssertionError("the kr260 driver bound to the sim RTL")

    await bridge(host)()
    assert out["written"] > 10, out
    assert "CAPS" in out["wrong_hwh"] and "kr260" in out["wrong_hwh"], out
    if params.get("out_registers"):
        with open(params["out_registers"], "w") as f:
            json.dump(out, f)


@cocotb.test()
async def loopback_step(dut):
    params = bench_params()
    seed = params.get("seed", 1)
    board = SimBoard(dut, seed=seed, pause=params.get("pause", 0.0))
    links = LinkPorts(dut, dut.aclk, dut.aresetn)
    links.hold(0)
    p = tiny_plan()
    index = 1
    out = {}
    limit = params.get("cycle_limit", 200_000)

    async def frames_after(before: list[int], n: int) -> int:
        """Wait until the links sent ``n`` frames after the counts ``before``."""
        for cycles in range(0, limit, 64):
            if sum(len(s) - b for s, b in zip(links.sent, before, strict=True)) >= n:
                return cycles
            await ClockCycles(dut.aclk, 64)
        raise AssertionError(f"{[len(s) for s in links.sent]} frames, {before} before, "
                             f"want {n} more")

    def place_own(buf, layout, node: int) -> None:
        mem = np.asarray(buf).view(np.uint8).reshape(-1)
        mem[:] = FILL
        for layer in range(p.model.layers):
            kv_id = p.encoder.kv_id(layer, index, node)
            at = layout.kv.kv_base + kv_id * layout.kv.kv_slot - layout.base
            data = kv_slot_bytes(layout.kv.kv_slot, kv_id, seed)
            mem[at: at + len(data)] = np.frombuffer(data, np.uint8)

    def host():
        from pynq import Overlay, allocate

        from mcf.driver import StepTimeout
        size = NodeLayout.for_plan(p, SIM).size
        bufs = [allocate((size,), np.uint8, target=board) for _ in range(2)]
        layouts = [NodeLayout.for_plan(p, SIM, base=int(b.device_address)) for b in bufs]

        # --- node 0: send, then stall on node 1's copy -------------------------------------------
        ip = Overlay(params["hwh"], device=board).node
        ip.attach(bufs[0], layouts[0])
        place_own(bufs[0], layouts[0], 0)
        ip.configure(p, 0, seq_timeout=params.get("watchdog", 2000))
        ip.declare_owned(p, index, 0)
        prog0 = ip.run_step(p, index, 0)
        sent0 = expected_packets(prog0, layouts[0], seed)
        resume(frames_after)([0] * links.links, len(sent0))
        try:
            ip.wait_marks(1, timeout=params.get("stall_s", 2e-4))
        except StepTimeout as e:
            out["stall"] = str(e)
            assert e.queue is Queue.COMPUTE, e
            first_dir = next(i for i, c in enumerate(prog0.compute) if c.cls is RecordClass.DIR)
            assert e.counters["seq1_retired"] == first_dir, e.counters
            assert f"waiting at record {first_dir}: DIR wait " in str(e), e
            assert e.counters["seq1_marks"] == 0
        else:
            raise AssertionError("node 0's step finished without node 1's KV")
        assert ip.read_reg("seq0_marks") == 1
        # the watchdog halted COMPUTE on the first FREE: skip each FREE, the step ends
        frees = [Meta.unpack(c.meta).kv_id for c in prog0.compute if c.cls is RecordClass.DIR]
        irq = ip.irq_status()
        assert irq["mark0"] and irq["halt1"] and not irq["mark1"], irq
        assert not any(ip.irq_status().values())           # RW1C: cleared
        for kv_id in frees:
            while not ip.halt(Queue.COMPUTE)["halted"]:
                ip.clock.sleep(1e-6)
            assert ip.halt(Queue.COMPUTE) == {"halted": 1, "queue": Queue.COMPUTE.value,
                                              "cause": HaltCause.LANDED.value, "kv_id": kv_id}
            ip.skip(Queue.COMPUTE)
        ip.wait_marks(1, timeout=1e-4)
        assert ip.read_reg("seq1_skipped") == len(frees) == ip.read_reg("seq1_timeouts")
        ip.stop()
        assert ip.read_fields("SEQ0_CTRL")["run"] == ip.read_fields("SEQ1_CTRL")["run"] == 0
        out["skipped"] = len(frees)
        check_frames(links.sent[0], sent0)
        out["node0_frames"] = len(sent0)

        # --- the same board as node 1: receive node 0's frames, finish the step ------------------
        ip = Overlay(params["hwh"], device=board).node
        before = [len(s) for s in links.sent]
        ip.attach(bufs[1], layouts[1])
        place_own(bufs[1], layouts[1], 1)
        ip.configure(p, 1)
        ip.declare_owned(p, index, 1)
        t0 = ip.clock.now()
        prog1 = ip.run_step(p, index, 1)
        assert resume(links.release)(0) == len(sent0)
        ip.wait_marks(1, timeout=params.get("step_s", 2e-3))
        landed = ip.wait_counter("land_packets", len(prog0.kv_sends), timeout=1e-3)
        out["node1_step_cycles"] = round((ip.clock.now() - t0) * 1e9 / board.period_ns)
        assert landed == len(prog0.kv_sends)
        sent1 = expected_packets(prog1, layouts[1], seed)
        resume(frames_after)(before, len(sent1))
        new = {ln: s[before[ln]:] for ln, s in enumerate(links.sent) if len(s) > before[ln]}
        assert len(new) == 1, f"node 1's frames on links {sorted(new)}"
        (ln1, frames1), = new.items()
        check_frames(frames1, sent1)
        out["node1_frames"], out["node1_link"] = len(sent1), ln1

        # bytes: node 0's planned fragments at node 1, node 1's own KV, fill elsewhere
        lay = layouts[1]
        kv = lay.kv
        region = np.asarray(bufs[1]).view(np.uint8).reshape(-1)
        want = np.full(kv.kv_count * kv.kv_slot, FILL, np.uint8)
        for layer in range(p.model.layers):
            kv_id = p.encoder.kv_id(layer, index, 1)
            want[kv_id * kv.kv_slot: (kv_id + 1) * kv.kv_slot] = np.frombuffer(
                kv_slot_bytes(kv.kv_slot, kv_id, seed), np.uint8)
        for pkt in sent0:
            if pkt.payload:
                at = lay.kv_address(pkt.meta.kv_id, pkt.meta.seq) - kv.kv_base
                want[at: at + len(pkt.payload)] = np.frombuffer(pkt.payload, np.uint8)
        start = kv.kv_base - lay.base
        got = region[start: start + len(want)]
        bad = np.flatnonzero(got != want)
        assert not len(bad), (f"{len(bad)} KV bytes differ, first at "
                              f"{kv.kv_base + int(bad[0]):#x}")

        snap = ip.snapshot().as_dict()
        assert snap["land_packets"] == len(prog0.kv_sends)
        assert snap["land_bytes"] == sum(len(x.payload) for x in sent0 if x.payload)
        assert not {k: v for k, v in snap.items() if k.startswith("land_") and v
                    and k not in ("land_packets", "land_bytes")}, snap
        assert snap["dir_frees"] == sum(c.cls is RecordClass.DIR for c in prog1.compute)
        assert snap["dir_free_refused_owner"] == snap["dir_free_refused_count"] == 0
        assert snap["send_packets"] == len(sent1)
        for q in range(2):
            assert snap[f"seq{q}_marks"] == 1
            assert snap[f"cmd{q}_bad_records"] == snap[f"seq{q}_bad_runtime"] == 0
        assert not {k: v for k, v in snap.items() if k.startswith("parser") and "_drop_" in k
                    and v}, snap
        out["counters"] = {k: v for k, v in snap.items() if v and k not in ("ID", "CAPS")}

    await bridge(host)()
    assert "COMPUTE" in out["stall"], out["stall"]
    if params.get("out"):
        with open(params["out"], "w") as f:
            json.dump(out, f)

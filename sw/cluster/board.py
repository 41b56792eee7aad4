"""The board back end of ``mcf run`` (issue #14 item 2; docs/cluster.md "The board back end"):
one node's host program in ordinary blocking PYNQ code, one per KR260, the hosts meeting through
MPI.

:func:`run_node` is everything node ``v``'s host does in a run, through a
:class:`mcf.driver.NodeDriver` (``Overlay(...).node``) and one ``allocate`` buffer: the model
image in the buffer, the node's configuration, every prefill step (embedding rows, routes, rings
and ATTEND lists, doorbells, both MARKs, every planned landing, the step's checks, the
directory), the head phase (the node that computed the prompt's last row runs the LM head on
it, :mod:`mcf.node.head`; its host reads the logits), then each decode token (records and
doorbells, the root's COMPUTE doorbell after a meeting, both MARKs, the root's checks; its
program ends with the LM head, whose logits the root's host reads). With ``--decode tp``
(``spec.decode == "tp"``) the node's :class:`mcf.node.tp_decode.TPDecodeImage` sits in the same
buffer above the node image, every host writes the token's input row and runs its shard of
every layer and its slice of the LM head, every host checks its node
(:func:`mcf.cluster.tp.check_tp_token`) and reads its node's logit slice, and the token is the
largest of the slices' (max, index) pairs after the meeting
(:func:`mcf.cluster.setup.decode_result`), as the simulated hosts do. The hosts meet only
through ``meet`` (:class:`Meet`): an MPI ``allgather`` on boards (:class:`MpiMeet`), the
co-simulation's window grid on simulated KR260s (``mcf.sim.benches.board_run``). Every check
of the simulated back end is made, on what the host reads from its node
(:mod:`mcf.cluster.checks`); the record is the same (:func:`mcf.cluster.setup.run_record`).

Time is the driver's clock (wall time on a board, simulated seconds on the simulated board),
given in cycles of ``clock_hz`` (``aclk``; :data:`mcf.abi.platform.ACLK_HZ` on a KR260, no fmax
claimed). A step runs from its first doorbell to the host seeing its last landing, so on a board
it includes the host's polling over the PS-PL bus. Runs on the board's Python 3.10.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..abi.node import Queue
from ..abi.platform import ACLK_HZ
from ..node.decode import decode_program
from ..node.layer import act_bytes, slice_positions
from .checks import (
    bad_counter_names,
    bad_counters,
    check_decode_root,
    check_layer_memory,
    check_owned_kv,
    check_step_counters,
    directory_ids,
    held_from_directory,
    link_counter_names,
    link_faults,
    step_counter_names,
)
from .setup import RunSetup, StepPrograms, decode_result, planned_landings, run_record
from .tp import check_tp_token

__all__ = ["Meet", "MpiMeet", "BusMemory", "BoardHost", "open_node", "run_node", "POLL_CYCLES",
           "STEP_LIMIT_CYCLES"]

POLL_CYCLES = 32
"""Cycles between two polls of a waiting host (as the simulated hosts)."""
STEP_LIMIT_CYCLES = 5_000_000
"""A prefill step or decode token taking longer fails the run (the simulated hosts' limit)."""


class Meet(Protocol):
    """How the hosts of a run meet: every host calls :meth:`gather` the same number of times;
    each call returns every node's ``value``, by node."""

    def gather(self, value=None) -> list: ...

    def check(self) -> None:
        """Raise if another host has failed (called while a host polls its node)."""


@dataclass
class MpiMeet:
    """:class:`Meet` over MPI: ``comm`` (``mpi4py``, one rank per node, rank = node). A failed
    rank ends the job (``comm.Abort``), so :meth:`check` has nothing to look at."""
    comm: object

    def gather(self, value=None) -> list:
        return self.comm.allgather(value)

    def check(self) -> None:
        return None


@dataclass
class BusMemory:
    """A host buffer (``pynq.allocate``) indexed by bus address: ``mem[a:b]`` reads and
    ``mem[a:b] = raw`` writes bytes at device addresses ``a..b`` of the buffer."""
    buffer: object

    def __post_init__(self):
        self.base = int(self.buffer.device_address)
        self.bytes = memoryview(self.buffer).cast("B")

    def _at(self, key: slice) -> slice:
        a, b = key.start - self.base, key.stop - self.base
        if a < 0 or b > len(self.bytes) or a > b:
            raise IndexError(f"bus addresses {key.start:#x}..{key.stop:#x} are outside the "
                             f"buffer {self.base:#x}..{self.base + len(self.bytes):#x}")
        return slice(a, b)

    def __getitem__(self, key: slice) -> bytes:
        return bytes(self.bytes[self._at(key)])

    def __setitem__(self, key: slice, raw) -> None:
        self.bytes[self._at(key)] = raw

    def write(self, writes: dict[int, bytes]) -> None:
        """``{bus address: bytes}``, in order; then the buffer's ``flush`` (if it has one)."""
        for addr, raw in writes.items():
            self[addr: addr + len(raw)] = raw
        flush = getattr(self.buffer, "flush", None)
        if flush is not None:
            flush()


@dataclass
class BoardHost:
    """Node ``node``'s host: its driver (configured on :meth:`setup_node`), its buffer and the
    run (``setup``; ``image``: the node image at the buffer's address; ``tp``: with
    ``--decode tp``, the node's :class:`~mcf.node.tp_decode.TPDecodeImage` above it)."""
    driver: object
    buffer: object
    setup: RunSetup
    node: int
    meet: Meet
    image: object
    clock_hz: float = ACLK_HZ
    seq_timeout: int = 0
    step_limit: int = STEP_LIMIT_CYCLES
    before_step: object = None    # called with a prefill step's index before its writes
    tp: object = None             # --decode tp: the node's TPDecodeImage
    mem: BusMemory = field(init=False)
    programs: StepPrograms = field(init=False)
    regmap: object = field(init=False)
    landed: int = 0

    def __post_init__(self):
        self.mem = BusMemory(self.buffer)
        self.programs = StepPrograms(self.setup, self.image)
        self.regmap = self.driver.regmap

    # --- time ------------------------------------------------------------------------------------

    def now(self) -> int:
        """The driver's clock in cycles of :attr:`clock_hz`."""
        return round(self.driver.clock.now() * self.clock_hz)

    def _wait(self, what: str, done, t0: int) -> None:
        """Poll ``done()`` every :data:`POLL_CYCLES` until true; fail after the step limit."""
        while not done():
            self.meet.check()
            if self.now() - t0 >= self.step_limit:
                raise AssertionError(f"node {self.node}: {what} not within {self.step_limit:,} "
                                     f"cycles; {self._diagnosis()}")
            self.driver.clock.sleep(POLL_CYCLES / self.clock_hz)

    def _diagnosis(self) -> str:
        state = {k: v for q in Queue for k, v in self.driver.queue_state(q).items() if v}
        return f"queues {state}"

    # --- the run ---------------------------------------------------------------------------------

    def setup_node(self) -> None:
        """The model image (and the TP decode image) into the buffer, then the node's
        configuration (after ``DIR_READY``)."""
        self.mem.write(self.image.image)
        if self.tp is not None:
            self.mem.write(self.tp.image)
        self.driver.attach(self.buffer, self.image.layout)
        self.driver.configure(self.setup.plan, self.node, seq_timeout=self.seq_timeout,
                              model=self.image, ready_timeout=self.step_limit / self.clock_hz)

    def _irq_marks(self, what: str) -> None:
        """Clear the MARK causes of ``IRQ_STATUS``; any other cause fails the run (a
        ``link_error`` naming this node and its faulty links)."""
        fields = self.driver.irq_status(clear=True)
        bad = {k: v for k, v in fields.items() if v and not k.startswith("mark")}
        if bad.get("link_error"):
            raise AssertionError(f"link fault at node {self.node}: " + "; ".join(
                self._link_faults()))
        assert not bad, f"node {self.node}: unexpected interrupt causes {bad} ({what})"

    def _link_faults(self) -> list[str]:
        return link_faults({n: self.driver.read_reg(n) for n in link_counter_names(self.regmap)})

    def _marks_at_least(self, marks: int) -> bool:
        return all(self.driver.read_reg(f"seq{q.value}_marks") >= marks for q in Queue)

    def prefill_step(self, step) -> dict:
        """This node's part of prefill step ``step``; returns what the others need (cycles,
        waits, the directory's view, KV bytes held)."""
        drv, p, image, idx, v = self.driver, self.setup.plan, self.image, step.index, self.node
        if self.before_step is not None:
            self.before_step(idx)
        m = image.tokens
        waits0 = drv.read_reg("seq1_wait_cycles")
        p0, _ = slice_positions(p, idx, v)
        self.mem.write(image.step_writes(np.arange(p0, p0 + m), self.setup.xa[p0:p0 + m]))
        drv.write_routes(step.routes.entries, v)
        progs = self.programs(idx)
        self.mem.write(progs[v].lists)
        drv.put(Queue.NET, progs[v].net)
        drv.put(Queue.COMPUTE, progs[v].compute)
        self.landed += planned_landings(p, idx, progs, v, m)
        t0 = self.now()
        for q in Queue:
            drv.doorbell(q)
        self._wait(f"the MARKs of prefill step {idx}",
                   lambda: self._marks_at_least(idx) or self._fault_seen(), t0)
        self._irq_marks(f"prefill step {idx}")
        marks = [drv.read_reg(f"seq{q.value}_marks") for q in Queue]
        assert marks == [idx, idx], f"node {v}: marks {marks} after prefill step {idx}"
        self._wait(f"the landings of prefill step {idx}",
                   lambda: drv.read_reg("land_packets") >= self.landed, t0)
        t1 = self.now()
        wait = drv.read_reg("seq1_wait_cycles") - waits0
        check_layer_memory(self.mem, v, p, idx, image, image.layout, self.setup.gold.prefill)
        check_step_counters(v, {n: drv.read_reg(n) for n in step_counter_names(self.regmap)},
                            self.landed)
        held = self.held()
        kv = sum(slice_positions(p, b, s)[1] * p.model.m_token
                 for b, s in held["owned"] + held["replicas"])
        return {"t0": t0, "t1": t1, "wait": wait, "owned": held["owned"],
                "replicas": held["replicas"], "kv_bytes": int(kv)}

    def _fault_seen(self) -> bool:
        return bool(self.driver.read_fields("IRQ_STATUS").get("link_error"))

    def held(self) -> dict[str, list]:
        """The prompt's KV this node holds, from its directory (``DIR_PEEK``/``DIR_ENTRY``)."""
        entries = [self.driver.peek_directory(kv_id)
                   for _, _, kv_id in directory_ids(self.setup.plan)]
        return held_from_directory(self.setup.plan, entries)

    def first_head(self, marks: int) -> dict | None:
        """This node's head phase after the prefill (:meth:`RunSetup.head_program`): both rings
        and doorbells, both MARKs (the ``marks``-th), no bad counter. The node that computed
        the prompt's last row returns the phase's cycles and the logits its LM head wrote."""
        drv, v = self.driver, self.node
        net, compute = self.setup.head_program(v, self.image)
        drv.put(Queue.NET, net)
        drv.put(Queue.COMPUTE, compute)
        t0 = self.now()
        for q in Queue:
            drv.doorbell(q)
        self._wait("the MARKs of the head phase", lambda: self._marks_at_least(marks), t0)
        cycles = self.now() - t0
        self._irq_marks("head phase")
        assert [drv.read_reg(f"seq{q.value}_marks") for q in Queue] == [marks] * 2
        bad = bad_counters({n: drv.read_reg(n) for n in bad_counter_names(self.regmap)})
        assert not bad, f"head phase node {v}: {bad}"
        logits = self.setup.first_logits(v, self.mem, self.image)
        return None if logits is None else {"cycles": cycles, "logits": logits}

    def decode_token(self, k: int, token: int, marks: int) -> dict:
        """This node's part of decode token ``k`` (input ``token``); the root returns the
        token's cycles and logits (TP: every node its cycles and its logit slice and pair,
        :meth:`RunSetup.decode_head`)."""
        drv, p, image, v = self.driver, self.setup.plan, self.image, self.node
        gold = self.setup.decode_gold(k)     # every host: the golden decodes in token order
        x = self.setup.golden.embed([token])[0]
        prog = decode_program(p, k, v, image) if self.tp is None else \
            self.tp.program(p, k, x)         # TP: every node's records and input row
        root = prog.root
        assert root == p.decode_owner(k)
        drv.apply(prog.writes)
        writes = dict(prog.ddr)
        if v == root and self.tp is None:
            writes[image.dx0] = act_bytes(np.reshape(x, (1, -1)))
        self.mem.write(writes)
        drv.put(Queue.NET, prog.net)
        drv.put(Queue.COMPUTE, prog.compute)
        assert not drv.irq_status(clear=False)["mark1"], f"node {v}: a MARK is pending"
        drv.doorbell(Queue.NET)
        if v != root:
            drv.doorbell(Queue.COMPUTE)
        self.meet.gather()                 # every node's records in place: the root starts
        out = {}
        t0 = self.now()
        if v == root:
            drv.doorbell(Queue.COMPUTE)
        self._wait(f"the MARKs of decode token {k}", lambda: self._marks_at_least(marks + 1), t0)
        if v == root or self.tp is not None:     # TP: every node ends with its head slice
            out["cycles"] = self.now() - t0
        assert [drv.read_reg(f"seq{q.value}_marks") for q in Queue] == [marks + 1] * 2
        self._irq_marks(f"decode token {k}")
        bad = bad_counters({n: drv.read_reg(n) for n in bad_counter_names(self.regmap)})
        assert not bad, f"token {k} node {v}: {bad}"
        if self.tp is not None:
            check_tp_token(self.mem, self.tp, gold, p, k)
            out.update(self.setup.decode_head(self.mem, image, self.tp))
        elif v == root:
            check_decode_root(self.mem, root, p, image, gold, k)
            out.update(self.setup.decode_head(self.mem, image))
        return out


def open_node(overlay, setup: RunSetup, node: int, meet: Meet, *, seq_timeout: int = 0,
              step_limit: int = STEP_LIMIT_CYCLES, cmd_log2: int = 10) -> BoardHost:
    """Node ``node``'s host on a loaded ``overlay`` (``pynq.Overlay`` of the node's bitstream,
    its ``node`` bound to :class:`mcf.driver.NodeDriver`): one ``pynq.allocate`` buffer on the
    overlay's device for the node image (with ``--decode tp`` the node's TP decode image above
    it, :meth:`RunSetup.tp_image`), which is built at the buffer's address. Cycles are
    of the device's ``aclk_hz`` when it has one (the simulated board), else
    :data:`~mcf.abi.platform.ACLK_HZ`."""
    from pynq import allocate

    from ..driver import NodeDriver

    if not isinstance(getattr(overlay, "node", None), NodeDriver):
        raise TypeError(f"the overlay's node is {type(getattr(overlay, 'node', None)).__name__},"
                        " not mcf.driver.NodeDriver: not an MCF node overlay, or mcf.driver "
                        "was not imported before pynq.Overlay")
    device = overlay.device

    def end(image) -> int:            # where the node's images end
        return image.alloc.at if setup.spec.decode != "tp" else \
            setup.tp_image(image, node).end

    buffer = allocate((end(setup.image(0, cmd_log2)),), dtype=np.uint8, target=device)
    image = setup.image(int(buffer.device_address), cmd_log2)
    tp = setup.tp_image(image, node) if setup.spec.decode == "tp" else None
    need = (image.alloc.at if tp is None else tp.end) - image.layout.base
    if need > buffer.nbytes:
        raise MemoryError(f"the node image needs {need} B at {image.layout.base:#x}, the "
                          f"buffer has {buffer.nbytes}")
    return BoardHost(overlay.node, buffer, setup, node, meet, image,
                     clock_hz=getattr(device, "aclk_hz", ACLK_HZ), seq_timeout=seq_timeout,
                     step_limit=step_limit, tp=tp)


def run_node(host: BoardHost, *, progress: bool = False) -> dict:
    """Everything ``host``'s node does in a run; meets the others only through
    ``host.meet``. Returns the run's record (the same on every node; ``AssertionError`` names
    the failed check)."""
    from tqdm import tqdm

    setup, p = host.setup, host.setup.plan
    wall0, c0 = time.monotonic(), host.now()
    host.setup_node()
    host.meet.gather()
    bar = tqdm(total=len(p.steps) + setup.spec.decode_tokens, unit="step", file=sys.stderr,
               desc=f"{setup.spec.policy} N={setup.nodes} (boards)", disable=not progress)
    steps = []
    for step in p.steps:
        steps.append(host.meet.gather(host.prefill_step(step)))
        bar.update()
    check_owned_kv(host.mem, host.node, p, host.image.layout, setup.gold.prefill)
    marks = len(p.steps) + 1
    first = next(v for v in host.meet.gather(host.first_head(marks)) if v is not None)
    logits = [first["logits"]]
    tokens = [int(np.argmax(logits[-1]))]
    decode_cycles, node_cycles = [], []
    for k in range(setup.spec.decode_tokens):
        got = host.meet.gather(host.decode_token(k, tokens[-1], marks))
        marks += 1
        token, row, cycles, per_node = decode_result(got)
        decode_cycles.append(cycles)
        node_cycles.append(per_node)
        logits.append(row)
        tokens.append(token)
        bar.update()
    bar.close()
    record = run_record(setup, steps, tokens, logits, decode_cycles, first["cycles"],
                        node_cycles)
    cycles, wall = host.now() - c0, time.monotonic() - wall0
    record.update(setup.prompt_record(tokens), backend="board", sim_cycles=cycles,
                  wall_seconds=wall, clock_hz=host.clock_hz,
                  node_cycles_per_second=setup.nodes * cycles / wall if wall > 0 else 0.0)
    return record

"""The PYNQ driver of one node top (issue #12 item 1; docs/board.md "The driver").

``NodeDriver`` is a :class:`pynq.DefaultIP` bound by the module reference's VLNV
(``xilinx.com:module_ref:<top>:1.0`` for both tops of :data:`mcf.abi.node_config.NODE_CONFIGS`).
Its ``register_map`` is the ABI's node map, injected into ``description["registers"]`` before
``DefaultIP.__init__`` (the hook PYNQ's own ``pynq.lib.cmac`` uses); on bind it reads ``ID`` and
``CAPS`` and refuses a node that does not match the ABI. The methods are the MARS runtime's:
configuration from a :class:`mcf.node.layout.NodeLayout` (:mod:`mcf.node.program`), reduction
configurations, command rings with their doorbells, sequencer run/stop, waits with a timeout that
names the stuck queue, and :meth:`NodeDriver.snapshot` of every status register.

A layout the node cannot hold (``KV_COUNT`` beyond the directory, a ring beyond
``CAPS.ring_max_log2``, both read from the device's ``CAPS``) is refused with one
:class:`~mcf.driver.node_map.LayoutError` line before any register is written. Without a MARS
plan, :meth:`NodeDriver.configure_rings` places only the two rings (a
:class:`~mcf.driver.node_map.RingLayout`) and starts the sequencers, so hand-made
:class:`mcf.abi.node.Cmd` records can be pushed (docs/board.md "The driver").

Completion is polled (``seq<q>_marks``, ``IRQ_STATUS``): the block design wires ``irq`` straight
to ``pl_ps_irq0`` with no AXI interrupt controller, so PYNQ exposes no ``Interrupt`` for it.
Time is measured by the device's ``clock`` when it has one (the simulated board's: simulated
seconds), else by the wall clock.

PYNQ is only needed to *use* the class: without it this module still imports (the board
runtime's check runs on plain Python) and ``NodeDriver`` raises :class:`ImportError` when made.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from ..abi.csrmap import node_regmap
from ..abi.directory import DIR_PEEK_READS
from ..abi.meta import META
from ..abi.nic import reduce_config
from ..abi.node import CMD_BYTES, Cmd, Queue
from ..abi.platform import MODULE_REF_VLNV
from ..abi.regs import WORD_BYTES
from .node_map import (
    BindError,
    CommandRing,
    DriverError,
    NodeLimits,
    StepTimeout,
    check_identity,
    check_layout,
    config_for_top,
    node_limits,
    ring_writes,
    snapshot_from,
    status_registers,
    unpack_halt,
)

try:
    from pynq import DefaultIP as _Base
    HAVE_PYNQ = True
except ImportError:       # the board runtime's own check runs without PYNQ
    HAVE_PYNQ = False

    class _Base:          # noqa: D101 - placeholder base; NodeDriver() raises below
        def __init__(self, description):
            raise ImportError("mcf.driver.NodeDriver needs PYNQ (pip install 'mcf[board]')")

__all__ = ["NodeDriver", "Clock", "WallClock", "node_vlnvs", "module_ref_vlnv", "HAVE_PYNQ"]


def module_ref_vlnv(top: str) -> str:
    """The VLNV Vivado gives the module reference of Verilog module ``top``."""
    return MODULE_REF_VLNV.format(name=top)


def node_vlnvs() -> list[str]:
    """The module-reference VLNV of every node top (``mcf_node``, ``mcf_node_sim``)."""
    from ..abi.node_config import NODE_CONFIGS
    return [module_ref_vlnv(cfg.top) for cfg in NODE_CONFIGS.values()]


class Clock(Protocol):
    """Where waits take their time from: seconds since an arbitrary origin, and a pause."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _halt_text(halt: dict[str, int]) -> str:
    from ..abi.sequencer import HaltCause
    if not halt["halted"]:
        return "not halted by the watchdog"
    cause = HaltCause(halt["cause"]).name if halt["cause"] in {c.value for c in HaltCause} \
        else halt["cause"]
    return f"halted by the watchdog ({cause}, kv_id/counter {halt['kv_id']})"


def _top_of(vlnv: str) -> str:
    parts = vlnv.split(":")
    if len(parts) != 4:
        raise BindError(f"not a VLNV: {vlnv!r}")
    return parts[2]


class NodeDriver(_Base):
    """One node top behind an AXI-Lite window (``s_axi_ctrl``).

    ``description``: PYNQ's IP description (``ip_dict`` entry). Raises :class:`BindError` if
    ``ID`` or ``CAPS`` disagree with the ABI. After :meth:`attach`, the rings live in the given
    host buffer (a ``pynq.allocate`` buffer covering the :class:`NodeLayout`)."""

    bindto = node_vlnvs() if HAVE_PYNQ else []

    def __init__(self, description):
        self.regmap = node_regmap()
        description = dict(description)
        description["registers"] = self.regmap.pynq_registers()
        super().__init__(description)
        self.config = config_for_top(_top_of(description.get("type", "")))
        dev_clock = getattr(self.device, "clock", None)
        self.clock: Clock = dev_clock if hasattr(dev_clock, "now") and hasattr(
            dev_clock, "sleep") else WallClock()
        self.buffer = None
        self.layout = None
        self.rings: list[CommandRing] = []
        self.net_retired = 0
        check_identity(self.read_reg("ID"), self.read_reg("CAPS"), self.config, self.regmap)

    # --- registers by name -------------------------------------------------------------------

    def read_reg(self, name: str) -> int:
        return int(self.read(self.regmap.addr(name)))

    def write_reg(self, name: str, value: int) -> None:
        self.write(self.regmap.addr(name), int(value))

    def write_fields(self, name: str, **fields: int) -> None:
        """Write register ``name`` packed from its fields (others at their reset values)."""
        self.write_reg(name, self.regmap.register(name).pack(**fields))

    def read_fields(self, name: str) -> dict[str, int]:
        return self.regmap.register(name).unpack(self.read_reg(name))

    def peek_directory(self, kv_id: int, tries: int = DIR_PEEK_READS) -> dict[str, int]:
        """The directory entry of ``kv_id`` (``DIR_PEEK`` written, ``DIR_ENTRY`` read until
        its ``fresh`` bit says the entry is that ``kv_id``'s)."""
        self.write_reg("DIR_PEEK", kv_id)
        for _ in range(tries):
            entry = self.read_fields("DIR_ENTRY")
            if entry["fresh"]:
                return entry
        raise RuntimeError(f"DIR_ENTRY of kv_id {kv_id} not fresh after {tries} reads")

    def apply(self, writes: Iterable) -> None:
        """Apply :class:`mcf.node.program.Write` s in order."""
        for w in writes:
            self.write_reg(w.reg, w.value)

    # --- configuration -------------------------------------------------------------------------

    @property
    def limits(self) -> NodeLimits:
        """What this node can hold, from its ``CAPS`` register read now (directory entries,
        largest ring), never above the bound configuration's."""
        return node_limits(self.read_reg("CAPS"), self.config)

    def check_layout(self, layout) -> None:
        """Raise :class:`LayoutError` unless the node can hold ``layout``
        (:func:`mcf.driver.node_map.check_layout` against :attr:`limits`). Reads only."""
        check_layout(layout, self.limits)

    def _check_rings_idle(self) -> None:
        for q in Queue:
            head, cons = self.read_reg(f"CMD{q.value}_HEAD"), self.read_reg(f"CMD{q.value}_CONS")
            if head != cons:
                raise DriverError(f"ring CMD{q.value} ({q.name}) still has records in flight "
                                  f"(CMD{q.value}_HEAD {head}, CMD{q.value}_CONS {cons}): "
                                  "a ring is moved only while idle")

    def attach(self, buffer, layout) -> None:
        """Use ``buffer`` (physically contiguous, e.g. ``pynq.allocate``) for ``layout``'s
        regions (a :class:`mcf.node.layout.NodeLayout`, or a
        :class:`~mcf.driver.node_map.RingLayout` for the rings alone): ``layout.base`` must be
        the buffer's physical address, and the node must hold the layout (:meth:`check_layout`).
        Writes no register."""
        self.check_layout(layout)
        if int(buffer.device_address) != layout.base:
            raise DriverError(f"layout base {layout.base:#x} is not the buffer's physical "
                              f"address {int(buffer.device_address):#x}")
        if buffer.nbytes < layout.size:
            raise DriverError(f"buffer of {buffer.nbytes} B is smaller than the layout "
                              f"({layout.size} B)")
        self.buffer, self.layout = buffer, layout

    def configure(self, plan, node: int, *, topology: str = "ring", seq_timeout: int = 0,
                  ready_timeout: float = 1e-3, model=None) -> None:
        """Prepare the node as ``node`` of ``plan`` (:func:`mcf.node.program.configure`:
        identity, link map, routes, KV rule and ``LAND_OFF``, QBUF/OBUF, rings, watchdog,
        interrupt enables, both sequencers running; with ``model``, a
        :class:`mcf.node.layer.ModelImage` in the buffer, its template, ACT K/V and ATTEND
        list tables), once the directory is cleared (``DIR_READY``). The rings continue from
        the hardware's accepted producer index (``CMDq_HEAD``)."""
        from ..node.program import configure
        if self.layout is None or not hasattr(self.layout, "kv"):
            raise DriverError("attach(buffer, NodeLayout) before configure() (a RingLayout "
                              "has no KV region: configure_rings() drives the rings alone)")
        self.check_layout(self.layout)
        self._check_rings_idle()
        self.wait_counter("DIR_READY", 1, timeout=ready_timeout)
        self.apply(configure(plan, self.layout, node, topology=topology,
                             seq_timeout=seq_timeout, regmap=self.regmap, model=model))
        self._make_rings()

    def configure_rings(self, *, seq_timeout: int | None = 0, ready_timeout: float = 1e-3) -> None:
        """Place the two command rings of the attached layout (a
        :class:`~mcf.driver.node_map.RingLayout` or a ``NodeLayout``) and start both
        sequencers — nothing else: no identity, routes, KV rule or interrupt enables. Then
        :meth:`put` / :meth:`push` take hand-made :class:`mcf.abi.node.Cmd` records (a SEND
        whose packet must leave the node needs ``NODE`` and a route of your own).

        Writes, once the layout is checked (:meth:`check_layout`), both rings are idle and the
        directory is cleared (``DIR_READY``): ``CMDq_BASE_LO``/``_HI``, ``CMDq_SIZE``,
        ``SEQ_TIMEOUT`` (unless ``seq_timeout`` is ``None``), ``SEQq_CTRL.run``. The rings
        continue from the hardware's accepted producer index (``CMDq_HEAD``)."""
        if self.layout is None:
            raise DriverError("attach(buffer, layout) before configure_rings()")
        self.check_layout(self.layout)
        self._check_rings_idle()
        self.wait_counter("DIR_READY", 1, timeout=ready_timeout)
        for reg, word in ring_writes(self.layout, self.regmap):
            self.write_reg(reg, word)
        if seq_timeout is not None:
            self.write_fields("SEQ_TIMEOUT", SEQ_TIMEOUT=seq_timeout)
        self.start()
        self._make_rings()

    def _make_rings(self) -> None:
        self.rings = [CommandRing(q, self.layout.cmd_base[q.value] - self.layout.base,
                                  self.layout.cmd_log2, self.read_reg(f"CMD{q.value}_HEAD"))
                      for q in Queue]
        self.net_retired = self.read_reg("seq0_retired")

    def write_routes(self, entries, node: int) -> None:
        """Route-table entries ``(node, route_id, entry)`` that belong to ``node``."""
        from ..node.program import route_writes
        self.apply(route_writes(entries, node, self.regmap))

    def write_reduce_config(self, route_id: int, k: int, *, final: bool = False,
                            result_route: int = 0) -> None:
        """One reduction-engine configuration (:func:`mcf.abi.nic.reduce_config`)."""
        self.write_fields("REDUCE_CFG_WR", route_id=route_id,
                          config=reduce_config(k, final=final, result_route=result_route))

    def declare_owned(self, plan, index: int, node: int) -> None:
        """``DIR_LAND`` the node's own KV of chunk ``index`` (placed in DDR by the host)."""
        from ..node.program import owner_declarations
        self.apply(owner_declarations(plan, index, node, self.regmap))

    # --- rings and sequencers --------------------------------------------------------------------

    def put(self, queue: Queue, cmds: list[Cmd]) -> None:
        """Write records into ring ``queue`` after the producer index (no doorbell)."""
        if self.buffer is None or not self.rings:
            raise DriverError("configure() or configure_rings() the node before writing a ring")
        ring = self.rings[queue.value]
        cons = self.read_reg(f"CMD{queue.value}_CONS")
        ring.put(memoryview(self.buffer).cast("B"), cmds, cons)
        flush = getattr(self.buffer, "flush", None)
        if flush is not None:
            flush()

    def doorbell(self, queue: Queue) -> None:
        """Publish everything :meth:`put` wrote: one write of ``CMDq_PROD``."""
        if not self.rings:
            raise DriverError("configure() or configure_rings() the node before a doorbell")
        q = queue.value
        self.write_fields(f"CMD{q}_PROD", **{f"CMD{q}_PROD": self.rings[q].prod})

    def push(self, queue: Queue, cmds: list[Cmd]) -> None:
        """:meth:`put` then :meth:`doorbell`."""
        self.put(queue, cmds)
        self.doorbell(queue)

    def run_step(self, plan, index: int, node: int) -> object:
        """Program prefill step ``index`` of ``plan`` on ``node`` (routes, both rings, both
        doorbells; :func:`mcf.node.program.step_program`) and return the
        :class:`mcf.node.program.StepProgram` written. Wait with :meth:`wait_marks`."""
        from ..node.program import step_program
        self.write_routes(plan.steps[index - 1].routes.entries, node)
        prog = step_program(plan, index, node, self.net_retired)
        self.net_retired += len(prog.net)
        self.put(Queue.NET, prog.net)
        self.put(Queue.COMPUTE, prog.compute)
        for q in Queue:
            self.doorbell(q)
        return prog

    def set_running(self, queue: Queue, run: bool) -> None:
        self.write_fields(f"SEQ{queue.value}_CTRL", run=int(run))

    def start(self) -> None:
        for q in Queue:
            self.set_running(q, True)

    def stop(self) -> None:
        for q in Queue:
            self.set_running(q, False)

    def skip(self, queue: Queue) -> None:
        """Retire a halted queue's waiting record unexecuted (the queue keeps running)."""
        self.write_fields(f"SEQ{queue.value}_CTRL", run=1, skip=1)

    def halt(self, queue: Queue) -> dict[str, int]:
        """The queue's watchdog halt word (``seq<q>_halt``: halted, queue, cause, kv_id)."""
        return unpack_halt(self.read_reg(f"seq{queue.value}_halt"))

    def irq_status(self, clear: bool = True) -> dict[str, int]:
        """``IRQ_STATUS`` by cause; ``clear`` writes the set bits back (RW1C)."""
        word = self.read_reg("IRQ_STATUS")
        if clear and word:
            self.write_reg("IRQ_STATUS", word)
        return self.regmap.register("IRQ_STATUS").unpack(word)

    # --- waits -----------------------------------------------------------------------------------

    def queue_state(self, queue: Queue) -> dict[str, int]:
        """The ring and sequencer registers of one queue (``CMDq_*``, ``cmdq_*``, ``seqq_*``)."""
        q = queue.value
        prefixes = (f"CMD{q}_", f"cmd{q}_", f"seq{q}_")
        out = {r.name: self.read_reg(r.name) for r in status_registers(self.regmap)
               if r.name.startswith(prefixes)}
        out[f"CMD{q}_PROD(host)"] = self.rings[q].prod if self.rings else 0
        return out

    def wait_marks(self, marks: dict[Queue, int] | int, *, timeout: float = 1.0,
                   poll: float = 1e-5) -> None:
        """Wait until ``seq<q>_marks`` reaches ``marks[q]`` (an int: the same for both
        queues). Raises :class:`StepTimeout` naming the first queue still short after
        ``timeout`` seconds of :attr:`clock`, with its ring and sequencer counters and the
        unpacked halt word."""
        want = marks if isinstance(marks, dict) else {q: marks for q in Queue}
        deadline = self.clock.now() + timeout
        while True:
            short = [q for q, m in want.items() if self.read_reg(f"seq{q.value}_marks") < m]
            if not short:
                return
            if self.clock.now() >= deadline:
                raise self._stuck(short[0], want[short[0]], timeout)
            self.clock.sleep(poll)

    def _stuck(self, q: Queue, marks: int, timeout: float) -> StepTimeout:
        state = self.queue_state(q)
        n = q.value
        retired = state[f"seq{n}_retired"]
        head = state[f"CMD{n}_HEAD"]
        msg = (f"queue {q.name} (CMD{n}/SEQ{n}) stuck after {timeout:g} s: seq{n}_marks "
               f"{state[f'seq{n}_marks']} of {marks}; {retired} of {head} records retired "
               f"(ring CONS {state[f'CMD{n}_CONS']}), wait cycles {state[f'seq{n}_wait_cycles']}, "
               f"{_halt_text(unpack_halt(state[f'seq{n}_halt']))}")
        halt = unpack_halt(state[f"seq{n}_halt"])
        skipped_at_ring = state[f"cmd{n}_bad_records"] or state[f"cmd{n}_read_errors"]
        unretired = (f"seq{n}_skipped", f"seq{n}_aborted")
        index = None
        if halt["halted"] and not skipped_at_ring:
            index = state[f"seq{n}_halt_index"]    # the halted record's ring index (§3)
        elif retired < head and not skipped_at_ring and not any(state[k] for k in unretired):
            index = retired              # every record so far retired in order: the next one
        if index is not None and self.rings:
            ring = self.rings[n]
            at = ring.offset + (index % ring.entries) * CMD_BYTES
            try:
                cmd = Cmd.unpack(bytes(memoryview(self.buffer).cast("B")[at: at + CMD_BYTES]))
                kv_id = (cmd.meta >> META["kv_id"].offset) & ((1 << META["kv_id"].width) - 1)
                msg += (f"; waiting at record {index}: {cmd.cls.name} wait {cmd.wait} "
                        f"kv_id {kv_id} arg {cmd.arg}")
            except ValueError:
                pass
        return StepTimeout(msg, q, state)

    def wait_counter(self, name: str, at_least: int, *, timeout: float = 1.0,
                     poll: float = 1e-5) -> int:
        """Wait until status register ``name`` ≥ ``at_least``; :class:`StepTimeout` (queue
        ``None``) with the register's value otherwise."""
        deadline = self.clock.now() + timeout
        while True:
            v = self.read_reg(name)
            if v >= at_least:
                return v
            if self.clock.now() >= deadline:
                raise StepTimeout(f"{name} = {v} after {timeout:g} s, want ≥ {at_least}",
                                  None, {name: v})
            self.clock.sleep(poll)

    # --- status ----------------------------------------------------------------------------------

    def snapshot(self):
        """Every read-only register, as the generated ``NodeSnapshot`` dataclass."""
        names = [r.name for r in status_registers(self.regmap)]
        return snapshot_from({n: self.read_reg(n) for n in names}, self.regmap)

    @property
    def window_bytes(self) -> int:
        return len(self.regmap) * WORD_BYTES

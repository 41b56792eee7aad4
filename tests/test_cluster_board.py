"""The board back end of ``mcf run`` (issue #14 item 2; docs/cluster.md "The board back end"):
the board runtime (:mod:`mcf.cluster.board`) drives simulated KR260s through the PYNQ driver, one
MPI rank per board, and the launcher's pieces for real boards (:mod:`mcf.cluster.board_rank`)."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from mcf.cli import main
from mcf.cluster import RunSpec
from mcf.cluster.board import BusMemory
from mcf.cluster.board_rank import FAILED, RECORD, board_command, parse_record
from mcf.cluster.board_rank import main as rank_main

# ---- the runtime's pieces -----------------------------------------------------------------------


class _Buffer(np.ndarray):
    """A numpy array with a ``device_address``, as ``pynq.allocate`` returns."""


def _buffer(addr: int, size: int) -> _Buffer:
    buf = np.zeros(size, dtype=np.uint8).view(_Buffer)
    buf.device_address = addr
    return buf


def test_bus_memory_is_the_buffer_at_its_device_address():
    buf = _buffer(0x4000, 64)
    mem = BusMemory(buf)
    mem.write({0x4010: b"\x01\x02\x03", 0x403E: b"\xaa\xbb"})
    assert buf[0x10:0x13].tolist() == [1, 2, 3] and buf[-2:].tolist() == [0xAA, 0xBB]
    assert mem[0x4010:0x4013] == b"\x01\x02\x03"
    for bad in (slice(0x3FFF, 0x4001), slice(0x403F, 0x4041)):
        with pytest.raises(IndexError, match="outside the buffer"):
            mem[bad]
    with pytest.raises(IndexError):
        mem[0x4040:0x4041] = b"\0"


def test_the_launcher_runs_one_rank_per_board_and_reads_rank_0s_record():
    spec = RunSpec(nodes=4, prompt_tokens=64)
    cmd = board_command("/opt/mpirun", spec, "hosts.txt", "/home/xilinx/mcf/mcf_node.bit",
                        timeout=1000)
    assert cmd[:6] == ["/opt/mpirun", "-n", "4", "--hostfile", "hosts.txt", "--map-by"]
    assert cmd[cmd.index("-m") + 1] == "mcf.cluster.board_rank"
    assert RunSpec(**json.loads(cmd[cmd.index("--spec") + 1])) == spec
    assert cmd[cmd.index("--overlay") + 1] == "/home/xilinx/mcf/mcf_node.bit"
    out = "progress\n" + RECORD + json.dumps({"tokens": [1, 2]}) + "\n"
    assert parse_record(out) == {"tokens": [1, 2]}
    with pytest.raises(AssertionError, match="node 1: step 2"):
        parse_record(out + FAILED + "node 1: step 2 differs\n")
    with pytest.raises(AssertionError, match="no rank printed a record"):
        parse_record("mpirun: could not reach board3\n")


@pytest.mark.parametrize("spec, msg", [
    ('{"nodes": 3}', "split evenly"),
    ('{"nodes": 2, "colour": 1}', "colour"),
    ("[1", "--spec"),
])
def test_a_board_rank_rejects_a_bad_spec_with_exit_2(spec, msg, capsys):
    assert rank_main(["--spec", spec, "--overlay", "x.bit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


@pytest.mark.parametrize("argv, msg", [
    (["--hostfile", "hosts"], "add --board"),
    (["--board", "--hostfile", "/nonexistent/hosts"], "no such file"),
    (["--board", "--hostfile", __file__, "--overlay", "x.bit", "--link-fault", "1"],
     "not with --hostfile"),
])
def test_mcf_run_board_bad_arguments_exit_2(argv, msg, capsys):
    assert main(["run", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]


def test_mcf_run_on_boards_needs_the_overlay(tmp_path, capsys):
    hosts = tmp_path / "hosts"
    hosts.write_text("kr260-0 slots=1\nkr260-1 slots=1\n")
    assert main(["run", "--quiet", "--board", "--hostfile", str(hosts)]) == 2
    assert "--overlay" in capsys.readouterr().err


# ---- RTL: simulated KR260s ----------------------------------------------------------------------


def test_the_board_runtime_runs_the_tiny_model_on_two_simulated_kr260s(tmp_path, capsys):
    """``mcf run --board``: two MPI ranks, each a simulated KR260 whose host is the board
    runtime over ``pynq.Overlay`` and the PYNQ driver: MARS prefill (64 tokens, 2 chunk steps)
    and 2 decode tokens, every step checked bit for bit by the runtime against the golden
    model, the tokens the golden model's, the KV layout read from the directories
    owner-only."""
    out = tmp_path / "run.json"
    assert main(["run", "--quiet", "--board", "--nodes", "2", "--prompt-tokens", "64",
                 "--decode-tokens", "2", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["backend"] == "board" and got["board"] == "simulated KR260"
    assert got["mpi_ranks"] == 2 and got["spec"] == asdict(RunSpec(
        nodes=2, prompt_tokens=64, decode_tokens=2))
    assert got["tokens"] == got["golden_tokens"] and len(got["tokens"]) == 3
    assert got["checks"] == {"bit_exact": True, "logits_bit_exact": True, "tokens_match": True,
                             "owner_only": True, "memory_within_budget": True}
    assert got["head_cycles"] > 0 and len(got["logits"]) == 3
    assert got["roots"] == [0, 1] and got["owned_tokens"] == {"0": 32, "1": 32}
    assert len(got["prefill_step_cycles"]) == 2 and min(got["prefill_step_cycles"]) > 0
    assert len(got["decode_cycles"]) == 2 and min(got["decode_cycles"]) > 0
    assert got["clock_hz"] == 1e8
    text = capsys.readouterr().out
    assert "board runtime on 2 simulated KR260s" in text and "check bit_exact" in text


def test_a_link_fault_stops_the_board_runtime_naming_node_and_link(capsys):
    """One bit flipped on node 0's cables as its host starts prefill step 1: node 1's link
    receiver drops the frame (CRC); node 1's runtime sees the ``link_error`` interrupt cause
    instead of its MARKs and stops the run with exit 1, naming the node and link."""
    assert main(["run", "--quiet", "--board", "--nodes", "2", "--prompt-tokens", "64",
                 "--decode-tokens", "0", "--link-fault", "1", "--link-fault-node", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("mcf run: stopped, link fault at node 1: link "), err
    assert "crc_errors 1" in err, err

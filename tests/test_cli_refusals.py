"""Every bad invocation of ``mcf`` is refused before work starts (issue #36 items 1 and 6): exit
status 2, exactly one line on stderr (``mcf <command>: error: ...`` naming the mistake), no
build, conversion, plan, simulation, sweep, wheel build or deploy started (each is replaced by
a tripwire) and no file or folder written. Also ``mcf --version``, whole help texts, the former
spellings still accepted, the hostfile parser and the progress lines."""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

import mcf.cluster  # noqa: F401 - binds the real plan before the tripwires (run's own check)
import mcf.commands.bench
import mcf.commands.demo
import mcf.commands.run
import mcf.deploy
import mcf.deploy.runtime
import mcf.hdl.convert
import mcf.mars
import mcf.sysmodel.evaluation
import mcf.sysmodel.sweep
from mcf.cli import SUBCOMMANDS, UsageError, build_parser, main
from mcf.commands._checks import Progress, hostfile_hosts

PLAN = ["plan", "--model", "tiny", "--prompt-tokens", "256", "--nodes", "4", "--chunk", "32",
        "--kv-budget-mib", "1"]
DEPLOY = ["deploy", "--overlay", "{t}/ov/mcf_node"]

# (command line with {t} for the case's folder, words the one line must hold)
CASES = {
    # mcf run: flags that need another flag
    "run-overlay-without-board": (["run", "--overlay", "x.bit"], "needs --board --hostfile"),
    "run-overlay-without-hostfile": (["run", "--board", "--overlay", "x.bit"],
                                     "needs --board --hostfile"),
    "run-python-without-hostfile": (["run", "--python", "python3.10"], "--python"),
    "run-fault-node-without-fault": (["run", "--link-fault-node", "1"], "add --link-fault"),
    "run-mpi-with-board": (["run", "--mpi", "--board"], "drop --mpi"),
    "run-hostfile-without-board": (["run", "--hostfile", "{t}/two_hosts"], "add --board"),
    # mcf run: the hostfile against --nodes, and its form
    "run-hostfile-one-line-two-nodes": (["run", "--board", "--hostfile", "{t}/one_host",
                                         "--overlay", "x.bit", "--nodes", "2"],
                                        "names 1 board(s) for --nodes 2"),
    "run-hostfile-two-lines-four-nodes": (["run", "--board", "--hostfile", "{t}/two_hosts",
                                           "--overlay", "x.bit", "--nodes", "4"],
                                          "names 2 board(s) for --nodes 4"),
    "run-hostfile-empty": (["run", "--board", "--hostfile", "{t}/empty", "--overlay", "x.bit"],
                           "no hosts in it"),
    "run-hostfile-only-comments": (["run", "--board", "--hostfile", "{t}/comments",
                                    "--overlay", "x.bit"], "no hosts in it"),
    "run-hostfile-bad-slots": (["run", "--board", "--hostfile", "{t}/bad_slots", "--overlay",
                                "x.bit"], "'slots=two' needs a whole number"),
    "run-hostfile-unknown-key": (["run", "--board", "--hostfile", "{t}/bad_key", "--overlay",
                                  "x.bit"], "'cpus=1' is not slots=N"),
    "run-hostfile-host-twice": (["run", "--board", "--hostfile", "{t}/twice", "--overlay",
                                 "x.bit"], "named twice"),
    "run-hostfile-binary": (["run", "--board", "--hostfile", "{t}/binary", "--overlay",
                             "x.bit"], "cannot be read"),
    # mcf run: --json PATH before the simulation
    "run-json-no-folder": (["run", "--json", "{t}/missing/run.json"], "no folder"),
    "run-json-a-directory": (["run", "--json", "{t}"], "is a directory"),
    "run-json-under-a-file": (["run", "--json", "{t}/file/run.json"], "is not a directory"),
    # mcf run: numbers, the checkpoint the integer model cannot take, token ids
    "run-kv-budget-nan": (["run", "--kv-budget-mib", "nan"], "--kv-budget-mib must be a finite"),
    "run-kv-budget-kib-inf": (["run", "--kv-budget-kib", "inf"],
                              "--kv-budget-kib must be a finite"),
    "run-kv-budget-twice": (["run", "--kv-budget-mib", "1", "--kv-budget-kib", "1024"],
                            "give the KV budget once"),
    "run-kv-budget-too-small": (["run", "--kv-budget-mib", "0.001"], "too small"),
    "run-seed-negative": (["run", "--seed", "-1"], "--seed must be at least 0"),
    "run-alpha-nan": (["run", "--alpha", "nan"], "--alpha must be a finite"),
    "run-timeout-negative": (["run", "--timeout", "-1"], "--timeout must be at least 0"),
    "run-intermediate-not-a-group-multiple": (["run", "--model", "{t}/ckpt_i192"],
                                              "intermediate_size 192 is not a multiple of the "
                                              "weight group 128"),
    "run-token-ids-beyond-vocab": (["run", "--model", "{t}/ckpt_v128", "--task", "passkey"],
                                   "do not fit the model's vocabulary of 128"),
    # mcf plan
    "plan-detail-without-json": ([*PLAN, "--detail"], "add --json"),
    "plan-no-prompt-tokens": (["plan", "--nodes", "2"], "--prompt-tokens N is required"),
    "plan-json-no-folder": ([*PLAN, "--json", "{t}/missing/plan.json"], "no folder"),
    "plan-json-a-directory": ([*PLAN, "--json", "{t}"], "is a directory"),
    "plan-metadata-is-a-file": ([*PLAN, "--emit-metadata", "{t}/file"],
                                "exists and is not a directory"),
    "plan-metadata-under-a-file": ([*PLAN, "--emit-metadata", "{t}/file/meta"],
                                   "is not a directory"),
    "plan-mesh-dims-on-a-ring": ([*PLAN, "--mesh-dims", "2x2"], "--mesh-dims applies to"),
    "plan-link-gbps-on-kr260": ([*PLAN, "--link-gbps", "25"], "uses the board's links"),
    "plan-keep-fetched-not-mars": ([*PLAN, "--policy", "ring", "--keep-fetched"],
                                   "--keep-fetched is a MARS option"),
    "plan-old-spelling-named": (["plan", "--seq-len", "1000", "--chunk", "512", "--nodes", "2"],
                                "--seq-len 1000 is not a multiple of --chunk 512"),
    # mcf verilog / build / bench: the output folder before any conversion or bench
    "verilog-only-no-names": (["verilog", "--out", "{t}/v", "--only"],
                              "--only needs at least one top name"),
    "verilog-out-is-a-file": (["verilog", "--out", "{t}/file"], "exists and is not a directory"),
    "verilog-jobs-0": (["verilog", "--out", "{t}/v", "--jobs", "0"], "--jobs"),
    "verilog-out-under-a-file": (["verilog", "--out", "{t}/file/v"], "is not a directory"),
    "build-out-is-a-file": (["build", "--board", "kr260", "--out", "{t}/file"],
                            "exists and is not a directory"),
    "build-out-under-a-file": (["build", "--board", "kr260", "--out", "{t}/file/b"],
                               "is not a directory"),
    "build-json-no-folder": (["build", "--board", "kr260", "--out", "{t}/b", "--json",
                              "{t}/missing/b.json"], "no folder"),
    "build-not-a-node-top": (["build", "--board", "kr260", "--out", "{t}/b", "--name",
                              "mcf_kv_quantizer"], "not a node top: the top has no port aclk"),
    "bench-out-is-a-file": (["bench", "csr", "--out", "{t}/file"],
                            "exists and is not a directory"),
    "bench-out-under-a-file": (["bench", "csr", "--out", "{t}/file/b"], "is not a directory"),
    "bench-json-no-folder": (["bench", "csr", "--json", "{t}/missing/b.json"], "no folder"),
    "bench-json-a-directory": (["bench", "csr", "--json", "{t}"], "is a directory"),
    "bench-unknown-after-json": (["bench", "--json", "cvs"], "unknown bench(es) cvs"),
    # mcf deploy
    "deploy-wheel-not-a-zip": ([*DEPLOY, "--hosts", "h0", "--wheel", "{t}/corrupt.whl"],
                               "not a valid mcf wheel"),
    "deploy-wheel-zip-without-metadata": ([*DEPLOY, "--hosts", "h0", "--wheel",
                                           "{t}/empty_zip.whl"], "not a valid mcf wheel"),
    "deploy-no-boards": (DEPLOY, "name the boards once"),
    "deploy-hosts-and-hostfile": ([*DEPLOY, "--hosts", "h0", "--hostfile", "{t}/two_hosts"],
                                  "name the boards once"),
    "deploy-hostfile-empty": ([*DEPLOY, "--hostfile", "{t}/empty"], "no hosts in it"),
    # mcf model
    "model-results-dir-missing": (["model", "--results-dir", "{t}/missing"],
                                  "--results-dir {t}/missing: no such directory"),
    "model-json-no-folder": (["model", "--json", "{t}/missing/m.json"], "no folder"),
    "model-evaluate-out-under-a-file": (["model", "--evaluate", "--quick", "--out",
                                         "{t}/file/r"], "is not a directory"),
    "model-validate-only-with-nodes": (["model", "--validate-only", "--nodes", "2"],
                                       "does not apply with --validate-only"),
    "model-quick-without-evaluate": (["model", "--quick"], "--quick needs --evaluate"),
    "model-old-spelling-named": (["model", "--seq", "1000", "--chunk", "512"],
                                 "--seq 1000 must be a positive multiple"),
    # mcf tables / demo
    "tables-from-missing": (["tables", "--readme", "{t}/README.md", "--from", "{t}/missing"],
                            "no such directory"),
    "tables-readme-a-directory": (["tables", "--readme", "{t}"], "is a directory"),
    "demo-out-under-a-file": (["demo", "--quiet", "--out", "{t}/file/r"], "is not a directory"),
}


class WorkStarted(Exception):
    """A tripwire fired: the command started work before refusing."""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two small Qwen2 checkpoints the float loader takes: intermediate_size 192 (not a
    multiple of the weight group) and a vocabulary of 128 (below the passkey task's ids)."""
    from mcf.model import TINY_MODEL, random_checkpoint, save_checkpoint

    root = tmp_path_factory.mktemp("ckpt")
    for name, cfg in (("ckpt_i192", replace(TINY_MODEL, intermediate_size=192)),
                      ("ckpt_v128", replace(TINY_MODEL, vocab_size=128))):
        save_checkpoint(root / name, cfg, random_checkpoint(cfg))
    return root


@pytest.fixture
def folder(tmp_path, checkpoints):
    """The case's folder: hostfiles, a corrupt wheel, a plain file, an overlay, a README and
    links to the checkpoints."""
    texts = {"one_host": "kr260-0 slots=1\n", "two_hosts": "kr260-0 slots=1\nkr260-1 slots=1\n",
             "empty": "", "comments": "# the boards\n\n", "bad_slots": "kr260-0 slots=two\n",
             "bad_key": "kr260-0 cpus=1\n", "twice": "kr260-0\nkr260-0\n",
             "corrupt.whl": "not a zip", "file": "x", "README.md": "# r\n"}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00kr260")
    with zipfile.ZipFile(tmp_path / "empty_zip.whl", "w") as zf:
        zf.writestr("mcf/__init__.py", "")
    (tmp_path / "ov").mkdir()
    for ext in ("bit", "hwh"):
        (tmp_path / "ov" / f"mcf_node.{ext}").write_text(ext)
    for name in ("ckpt_i192", "ckpt_v128"):
        (tmp_path / name).symlink_to(checkpoints / name)
    return tmp_path


@pytest.fixture
def tripwires(monkeypatch):
    """Every kind of work a command starts, replaced by a tripwire."""
    fired: list[str] = []

    def wire(name):
        def fire(*args, **kwargs):
            fired.append(name)
            raise WorkStarted(name)
        return fire

    for obj, attr in ((mcf.hdl.convert, "verilog_text"), (mcf.commands.run, "simulate"),
                      (mcf.commands.run, "on_boards"), (mcf.commands.bench, "run_benches"),
                      (mcf.mars, "plan"), (mcf.sysmodel.sweep, "run_sweep"),
                      (mcf.sysmodel.evaluation, "evaluate"), (mcf.commands.demo, "demo"),
                      (mcf.deploy.runtime, "build_wheel"), (mcf.deploy, "deploy")):
        monkeypatch.setattr(obj, attr, wire(f"{obj.__name__}.{attr}"))
    return fired


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size if p.is_file() else -1
            for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("argv, words", list(CASES.values()), ids=list(CASES))
def test_refused_with_one_line_and_exit_2_before_work(argv, words, folder, tripwires, capsys,
                                                      monkeypatch):
    monkeypatch.chdir(folder)
    argv = [a.replace("{t}", str(folder)) for a in argv]
    before = _tree(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and err.endswith("\n"), err
    assert lines[0].startswith(f"mcf {argv[0]}: error: "), lines[0]
    assert words.replace("{t}", str(folder)) in lines[0], lines[0]
    assert tripwires == []                                      # no work started
    assert _tree(folder) == before                              # nothing written


def test_the_checks_pass_a_good_invocation_on_to_the_work(folder, tripwires, monkeypatch):
    """The tripwires fire on a good command line (so the table above proves something)."""
    import mcf.sim.mpi

    monkeypatch.chdir(folder)
    monkeypatch.setattr(mcf.sim.mpi, "mpirun", lambda: "/usr/bin/mpirun")   # none needed here
    for argv in (["verilog", "--out", str(folder / "v"), "--only", "mcf_csr"],
                 [*PLAN, "--json", str(folder / "p.json")],
                 ["run", "--board", "--hostfile", str(folder / "two_hosts"), "--overlay",
                  "x.bit", "--json", str(folder / "r.json")],
                 ["bench", "csr", "--out", str(folder / "b")]):
        with pytest.raises(WorkStarted):
            main(argv)
    assert tripwires == ["mcf.hdl.convert.verilog_text", "mcf.mars.plan",
                         "mcf.commands.run.on_boards", "mcf.commands.bench.run_benches"]


def test_version_is_the_package_metadata(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out == f"mcf {version('mcf')}\n"


def test_every_help_text_is_whole_sentences():
    parser = build_parser()
    subs = next(a for a in parser._actions if a.choices and "run" in a.choices).choices
    assert sorted(subs) == sorted(SUBCOMMANDS)
    for text in [parser.description] + [subs[n].description for n in SUBCOMMANDS]:
        assert text and text.rstrip().endswith((".", ")")), text
        assert "``" not in text and ":mod:" not in text and "\n" not in text, text
        assert text.count("(") == text.count(")"), text
    assert parser.description.startswith("The mcf command line:")


def test_former_spellings_are_accepted_and_hidden(capsys, tmp_path):
    parser = build_parser()
    args = parser.parse_args(["run", "--kv-budget-kib", "512"])
    assert args.kv_budget_kib == 512 and args.kv_budget_mib is None
    assert parser.parse_args(["model", "--seq", "4096"]).seq == 4096
    assert parser.parse_args(["model", "--prompt-tokens", "4096"]).seq == 4096
    assert parser.parse_args(["plan", "--seq-len", "64", "--nodes", "1"]).seq_len == 64
    for cmd, old, new in (("plan", "--seq-len", "--prompt-tokens"),
                          ("model", "--seq ", "--prompt-tokens"),
                          ("run", "--kv-budget-kib ", "--kv-budget-mib")):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        out = capsys.readouterr().out
        assert new in out and f"{old}" not in out.split("options:")[0], (cmd, old)
    # --json PATH writes the file; --json alone prints (plan)
    path = tmp_path / "plan.json"
    assert main([*PLAN, "--json", str(path)]) == 0
    assert capsys.readouterr().out == ""
    assert main([*PLAN, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(path.read_text())


def test_hostfile_hosts(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# boards in node order\nkr260-0 slots=1  # first\n\nubuntu@kr260-1 "
                 "max_slots=1\n10.0.0.3\n")
    assert hostfile_hosts("--hostfile", f) == ["kr260-0", "ubuntu@kr260-1", "10.0.0.3"]
    for text, words in (("kr260-0 slots=0\n", "whole number >= 1"), ("a=b\n", "not a host"),
                        ("kr260-0 slots\n", "is not slots=N")):
        f.write_text(text)
        with pytest.raises(UsageError, match=words):
            hostfile_hosts("--hostfile", f)


def test_deploy_takes_the_hostfile_of_mcf_run(tmp_path):
    import argparse

    from mcf.commands.deploy import _targets

    (tmp_path / "hosts").write_text("kr260-0 slots=1\nkr260-1 slots=1\n")
    for ext in ("bit", "hwh"):
        (tmp_path / f"mcf_node.{ext}").write_text(ext)
    hosts, overlay = _targets(argparse.Namespace(hosts=None, hostfile=str(tmp_path / "hosts"),
                                                 overlay=str(tmp_path / "mcf_node")))
    assert [h.host for h in hosts] == ["kr260-0", "kr260-1"] and overlay.name == "mcf_node"


def test_progress_lines_off_a_terminal():
    """Off a terminal: nothing while the command is quick; past ``delay`` a line for the step
    under way (also when one step outlasts it), then none within ``every`` seconds, and one at
    the end; disabled: nothing."""
    import threading

    out = io.StringIO()
    with Progress("mcf x", 3, "stage", "run", delay=3600, stream=out) as bar:
        for label in ("a", "b", "c"):
            bar.step(label)
    assert out.getvalue() == ""
    out = io.StringIO()
    with Progress("mcf x", 3, "stage", "run", delay=0, every=3600, stream=out) as bar:
        for label in ("a", "b", "c"):
            bar.step(label)
    lines = out.getvalue().splitlines()
    assert lines[0] == "mcf x: stage 1/3: a ..." and len(lines) == 2
    assert lines[1].startswith("mcf x: stage: 3 run(s) in ")
    out = io.StringIO()
    with Progress("mcf x", 2, "stage", "run", delay=0, every=0, stream=out) as bar:
        bar.step("a")
        bar.step("b")
    assert out.getvalue().splitlines()[:2] == ["mcf x: stage 1/2: a ...", "mcf x: stage 2/2: b ..."]
    out = io.StringIO()                     # one long step: the line comes while it runs
    with Progress("mcf x", 2, "stage", "run", delay=0.05, stream=out) as bar:
        bar.step("slow")
        waited = threading.Event()
        for _ in range(200):
            if out.getvalue():
                break
            waited.wait(0.05)
        assert out.getvalue() == "mcf x: stage 1/2: slow ...\n"
    out = io.StringIO()
    with Progress("mcf x", 2, "stage", "run", enabled=False, delay=0, stream=out) as bar:
        bar.step("a")
    assert out.getvalue() == ""


def test_verilog_ports_of_the_top_alone():
    from mcf.commands.build import verilog_ports

    text = ("module \\top.inner (a, b);\n  input a;\n  output b;\nendmodule\n"
            "module top(clk, x, y);\n  input clk;\n  input [3:0] x;\n  output y;\nendmodule\n")
    assert verilog_ports(text) == ["a", "b", "clk", "x", "y"]
    assert verilog_ports(text, "top") == ["clk", "x", "y"]


@pytest.mark.parametrize("whole", [True, False], ids=["whole", "first-layer-view"])
def test_the_integer_model_check_before_the_run(whole, checkpoints, monkeypatch):
    """``mcf run``'s quantisation check, on the whole checkpoint and on the view a large one
    gets (its first layer, the first embedding rows): the same refusals, and token ids outside
    the vocabulary refused."""
    import numpy as np

    from mcf.cluster import RunSpec
    from mcf.commands import run as run_cmd
    from mcf.model import model_from_spec

    if not whole:
        monkeypatch.setattr(run_cmd, "QUANTIZE_CHECK_ELEMENTS", 0)
        monkeypatch.setattr(run_cmd, "QUANTIZE_CHECK_ROWS", 16)
    spec = RunSpec()
    cfg, tensors = model_from_spec("tiny")
    run_cmd._check_integer_model(spec, cfg, tensors, np.arange(cfg.vocab_size))
    for ids in ([cfg.vocab_size], [-1, 3]):
        with pytest.raises(UsageError, match="outside --model tiny's vocabulary 0..255"):
            run_cmd._check_integer_model(spec, cfg, tensors, np.array(ids))
    cfg, tensors = model_from_spec(str(checkpoints / "ckpt_i192"))
    with pytest.raises(UsageError, match="intermediate_size 192 is not a multiple"):
        run_cmd._check_integer_model(spec, cfg, tensors, np.arange(4))

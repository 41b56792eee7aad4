"""``mcf run``: one Qwen2 model end to end on a simulated KR260 cluster (issue #14 item 2,
docs/cluster.md): MARS's chunked prefill (or a baseline's) as the layer program on every node,
then KV-stationary decode, every step checked bit for bit against the run's integer golden
model; prints the generated tokens, the checks, the RTL-measured cycles and the agreement with
the float reference."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from ..cli import UsageError
from ._checks import add_alias, description, hostfile_hosts, spelling, writable_file

__all__ = ["register", "run", "simulate", "ddr_model_bytes"]


def ddr_model_bytes(cfg, spec) -> int:
    """The simulated DDR of each node (the bench's ``mem``): a power of two, at least 1 MiB,
    above a bound on the node image — every weight of the embedding (the tied LM head) and the
    model's layers at one byte (INT4 codes are half a byte; scales and biases far less), and
    every layer's activation buffers at 32 ACT words per hidden or intermediate column of a
    slice row (the bench refuses an image that does not fit, in one line)."""
    lay = cfg.layer
    hd, h, inter = lay.head_dim, lay.hidden, lay.intermediate
    per_layer = h * (lay.heads + 2 * lay.kv_heads) * hd + lay.heads * hd * h + 3 * h * inter
    weights = cfg.vocab_size * h + cfg.num_hidden_layers * per_layer
    rows = -(-spec.chunk // spec.nodes) + 1            # a slice, and the decode token
    acts = cfg.num_hidden_layers * rows * 32 * (h + inter) * 4
    return 1 << max(20, (weights + acts).bit_length())


def simulate(spec, *, progress: bool = True, timeout: int = 0,
             fault: dict | None = None, mpi: bool = False, board: bool = False,
             mem: int | None = None) -> dict:
    """Run ``spec`` (:class:`mcf.cluster.RunSpec`) on ``spec.nodes`` simulated node tops
    (Verilator, cached build) and return the bench's result (``mcf.sim.benches.cluster_run``):
    all nodes in one simulation, or (``mpi``) one node per MPI rank (:mod:`mcf.sim.mpi`), with
    the same cycles; ``board``: one simulated KR260 per MPI rank driven by the board runtime
    (``mcf.sim.benches.board_run``). ``fault = {"step": s, "node": v}`` flips a bit on the
    links leaving node ``v`` at prefill step ``s``. Raises
    ``AssertionError`` with the failing check. ``mem``: each node's simulated DDR in bytes
    (:func:`ddr_model_bytes`; ``None``: the bench's default)."""
    from dataclasses import asdict

    from ..sim import run as sim_run
    from ..sim.cluster import build_cluster, simulated_config

    params = {"spec": asdict(spec), "progress": progress, "timeout": timeout, "fault": fault}
    if mem is not None:
        params["mem"] = mem
    if progress:
        what = "one simulated KR260 per MPI rank" if board else "one node per MPI rank" \
            if mpi else f"the {spec.nodes}-node simulation"
        print(f"building {what} (cached after the first time) ...", file=sys.stderr,
              flush=True)
    if mpi or board:
        from ..sim.mpi import launch

        # builds RankTop once, before the ranks start
        return launch(params, bench="board_run" if board else "cluster_run")
    built = build_cluster(spec.nodes, config=simulated_config(spec.config))
    with tempfile.TemporaryDirectory() as tmp:      # one folder per run: runs may overlap
        out = Path(tmp) / "run.json"
        sim_run(built, "mcf.sim.benches.cluster_run", testcase="run", test_dir=Path(tmp),
                params={**params, "out": str(out)})
        return json.loads(out.read_text())


def on_boards(spec, hostfile: str, overlay: str, *, python: str = "python3",
              timeout: int = 0) -> dict:
    """Run ``spec`` on KR260 boards: ``mpirun`` one :mod:`mcf.cluster.board_rank` per board
    of ``hostfile`` (each loads ``overlay``, a path on the boards); returns rank 0's record.
    Raises ``AssertionError`` with the first rank's failure."""
    import subprocess

    from ..cluster.board_rank import board_command, parse_record
    from ..sim.mpi import mpi_env, mpirun

    cmd = board_command(mpirun(), spec, hostfile, overlay, python=python, timeout=timeout)
    proc = subprocess.run(cmd, env=mpi_env(), stdout=subprocess.PIPE, text=True)
    return parse_record(proc.stdout)


def _check_model(spec):
    """Load the model once here so a bad checkpoint fails before any simulation."""
    from ..abi.node_config import NODE_CONFIGS
    from ..cluster import RunError, make_plan, run_prompt
    from ..model import CheckpointError, model_from_spec

    try:
        cfg, tensors = model_from_spec(spec.model, seed=spec.seed) if spec.model == "tiny" \
            else model_from_spec(spec.model)
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None
    node = NODE_CONFIGS[spec.config]
    lay = cfg.layer
    if lay.head_dim != node.attn_head_dim or \
            lay.heads // lay.kv_heads > node.attn_heads:
        raise UsageError(f"--model {spec.model}: head_dim {lay.head_dim} with "
                         f"{lay.heads // lay.kv_heads} query heads per KV head does not fit the "
                         f"{node.name} node (head_dim {node.attn_head_dim}, "
                         f"{node.attn_heads} heads)")
    if spec.prompt_tokens + spec.decode_tokens > cfg.max_position_embeddings:
        raise UsageError(f"{spec.prompt_tokens} prompt + {spec.decode_tokens} decode tokens "
                         f"exceed the model's {cfg.max_position_embeddings} positions")
    try:
        plan = make_plan(spec, cfg)
        prompt, _ = run_prompt(spec, cfg)
    except RunError as exc:
        raise UsageError(str(exc)) from None
    if spec.decode == "tp":
        from ..cluster.tp import TPError, check_tp_run

        try:
            check_tp_run(cfg, spec.nodes, node)
        except TPError as exc:
            raise UsageError(f"--decode tp: {exc}") from None
    if not plan.totals.memory_ok:
        raise UsageError(f"--kv-budget-mib {spec.kv_budget / 2 ** 20:g}: the {spec.policy} plan "
                         f"needs {plan.totals.peak_node_kv_bytes / 2 ** 20:g} MiB of KV on a "
                         "node")
    _check_integer_model(spec, cfg, tensors, prompt)
    return cfg, tensors, plan


QUANTIZE_CHECK_ELEMENTS = 1 << 24
"""Checkpoints up to this many weights are quantised whole by the check before the run; a
larger one (minutes to quantise, which the simulation does anyway) on a view of it: its first
layer and the first :data:`QUANTIZE_CHECK_ROWS` embedding rows — every shape the group limits
apply to, since every layer has the same shapes."""
QUANTIZE_CHECK_ROWS = 1024


def _check_integer_model(spec, cfg, tensors, prompt) -> None:
    """The integer model's own checks, before the build: the checkpoint quantised as the run
    quantises it (:func:`mcf.golden.model.quantize_model`: the weight group divides every K, the
    scales fit), and the prompt's token ids inside the vocabulary."""
    import numpy as np

    from ..golden.model import quantize_model

    q_cfg, q_tensors = cfg, tensors
    if sum(int(np.size(t)) for t in tensors.values()) > QUANTIZE_CHECK_ELEMENTS:
        from dataclasses import replace

        from ..model.checkpoint import EMBED, LM_HEAD, NORM, layer_names

        rows = min(cfg.vocab_size, QUANTIZE_CHECK_ROWS)
        q_cfg = replace(cfg, num_hidden_layers=1, vocab_size=rows)
        q_tensors = {n: tensors[n] for n in layer_names(0).values()}
        q_tensors |= {NORM: tensors[NORM], EMBED: tensors[EMBED][:rows]}
        if not cfg.tie_word_embeddings:
            q_tensors[LM_HEAD] = tensors[LM_HEAD][:rows]
    try:
        quantize_model(q_cfg, q_tensors)
    except (ValueError, KeyError) as exc:
        raise UsageError(f"--model {spec.model}: the integer model cannot take it: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") \
            from None
    ids = np.asarray(prompt)
    if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
        raise UsageError(f"the prompt's token ids {int(ids.min())}..{int(ids.max())} fall "
                         f"outside --model {spec.model}'s vocabulary 0..{cfg.vocab_size - 1}")


def _with_model(spec, args):
    """``spec`` with ``--model`` / ``--checkpoint`` / ``--layers`` as its model spec
    (:func:`mcf.model.resolve_model`: writes the random-weight qwen2.5-1.5b on first use)."""
    from dataclasses import replace

    from ..model import CheckpointError, resolve_model

    try:
        return replace(spec, model=resolve_model(
            args.model, checkpoint=args.checkpoint, layers=args.layers,
            **({"progress": None} if args.quiet else {})))
    except CheckpointError as exc:
        raise UsageError(str(exc)) from None


def run(args) -> int:
    from ..cluster import RunError, RunSpec
    from ..golden.cluster import float_agreement

    hosts = _check_flags(args)
    try:
        spec = RunSpec(model=args.model, prompt_tokens=args.prompt_tokens, nodes=args.nodes,
                       policy=args.policy, decode_tokens=args.decode_tokens, chunk=args.chunk,
                       alpha=args.alpha, kv_budget=int(args.kv_budget_kib * 1024),
                       seed=args.seed, task=args.task, softmax=args.softmax,
                       config=args.node_config, decode=args.decode)
    except RunError as exc:
        raise UsageError(str(exc)) from None
    if hosts is not None and len(hosts) != spec.nodes:
        raise UsageError(f"--hostfile {args.hostfile} names {len(hosts)} board(s) for --nodes "
                         f"{spec.nodes}: one line per board, in node order")
    spec = _with_model(spec, args)
    cfg, tensors, plan = _check_model(spec)
    if args.mpi or args.board:
        from ..sim.mpi import mpirun

        try:
            mpirun()
        except FileNotFoundError as exc:
            raise UsageError(str(exc)) from None
    fault = None
    if args.link_fault is not None:
        if not 1 <= args.link_fault <= len(plan.steps):
            raise UsageError(f"--link-fault {args.link_fault}: the plan has prefill steps "
                             f"1..{len(plan.steps)}")
        if not 0 <= args.link_fault_node < spec.nodes or spec.nodes < 2:
            raise UsageError(f"--link-fault-node {args.link_fault_node}: no such node with "
                             f"links among {spec.nodes}")
        fault = {"step": args.link_fault, "node": args.link_fault_node}
    try:
        if args.hostfile:
            got = on_boards(spec, args.hostfile, args.overlay, python=args.python,
                            timeout=args.timeout)
        else:
            mem = ddr_model_bytes(cfg, spec) * (2 if spec.decode == "tp" else 1)
            got = simulate(spec, progress=not args.quiet, timeout=args.timeout, fault=fault,
                           mpi=args.mpi, board=args.board, mem=mem)
    except AssertionError as exc:
        first = str(exc).splitlines()[0]
        if first.startswith("link fault"):
            print(f"mcf run: stopped, {first}", file=sys.stderr)
        else:
            print(f"mcf run: a check failed: {first}", file=sys.stderr)
        return 1
    agree = float_agreement(cfg, tensors, got["prompt"], got["tokens"], got["logits"])
    got["float_agreement"] = {"top1": agree.top1,
                              "max_abs_logit_error": agree.max_abs_logit_error,
                              "cosine": agree.cosine}
    if args.json == "-":
        print(json.dumps(got))
        return 0 if all(got["checks"].values()) else 1
    if args.json:
        Path(args.json).write_text(json.dumps(got, indent=1))
    _print(got, spec)
    return 0 if all(got["checks"].values()) else 1


def _check_flags(args) -> list[str] | None:
    """Every check that needs neither the model nor the plan, before anything is loaded:
    flags that apply only with another, the numbers, ``--json PATH`` and the hostfile's form.
    Sets the defaults the other flags decide; returns the hostfile's boards (or ``None``)."""
    import math

    if args.hostfile is not None and not args.board:
        raise UsageError("--hostfile runs on boards: add --board")
    if args.overlay is not None and args.hostfile is None:
        raise UsageError("--overlay is the node's .bit on the boards: it needs --board "
                         "--hostfile")
    if args.python is not None and args.hostfile is None:
        raise UsageError("--python is the boards' interpreter: it needs --board --hostfile")
    if args.hostfile is not None and not Path(args.hostfile).is_file():
        raise UsageError(f"--hostfile {args.hostfile}: no such file")
    if args.hostfile is not None and not args.overlay:
        raise UsageError("--hostfile needs --overlay (the node's .bit on the boards)")
    if args.hostfile is not None and args.link_fault is not None:
        raise UsageError("--link-fault flips bits on simulated cables: not with --hostfile")
    if args.mpi and args.board:
        raise UsageError("--board already runs one MPI rank per node: drop --mpi")
    if args.link_fault_node is not None and args.link_fault is None:
        raise UsageError("--link-fault-node names the node whose links --link-fault "
                         "corrupts: add --link-fault STEP")
    args.link_fault_node = args.link_fault_node or 0
    args.python = args.python or "python3"
    if args.seed < 0:
        raise UsageError(f"--seed must be at least 0 (got {args.seed})")
    if args.timeout < 0:
        raise UsageError(f"--timeout must be at least 0 cycles (got {args.timeout})")
    if not (math.isfinite(args.alpha) and args.alpha >= 0):
        raise UsageError(f"--alpha must be a finite number >= 0, got {args.alpha}")
    kib = getattr(args, "kv_budget_kib", None)
    if kib is not None and args.kv_budget_mib is not None:
        raise UsageError("give the KV budget once: --kv-budget-mib (--kv-budget-kib is its "
                         "former spelling)")
    budget, flag = (args.kv_budget_mib * 1024, "--kv-budget-mib") if kib is None and \
        args.kv_budget_mib is not None else (1024.0 if kib is None else kib,
                                             spelling(args, "kv_budget_kib", "--kv-budget-mib"))
    if not (math.isfinite(budget) and budget > 0):
        raise UsageError(f"{flag} must be a finite number > 0")
    args.kv_budget_kib = budget
    if args.json not in (None, "-"):
        writable_file("--json", args.json)
    return None if args.hostfile is None else hostfile_hosts("--hostfile", args.hostfile)


def _backend(got: dict) -> str:
    if got.get("backend") != "board":
        return "sim node tops"
    return f"the board runtime on {got['mpi_ranks']} {got['board']}s, aclk " \
        f"{got['clock_hz'] / 1e6:g} MHz"


def _print(got: dict, spec) -> None:
    print(f"mcf run: model {spec.model}, {spec.prompt_tokens} prompt tokens, {spec.nodes} "
          f"nodes, policy {spec.policy}, chunk {spec.chunk}, {spec.decode_tokens} decode "
          f"tokens, softmax {spec.softmax}{', decode tp' if spec.decode == 'tp' else ''} "
          f"({_backend(got)}, cycles of aclk)")
    print(f"  generated tokens : {got['tokens']} (golden {got['golden_tokens']})")
    if got.get("task"):
        t = got["task"]
        print(f"  task {t['name']:<11}: answer {t['generated']}, expected {t['answer']}: "
              f"{'right' if t['correct'] else 'WRONG'}")
    width = max(map(len, got["checks"]), default=0)
    for name, ok in got["checks"].items():
        print(f"  check {name:<{width}}: {'pass' if ok else 'FAIL'}")
    print("  owned tokens     : " + ", ".join(f"node {k}: {v}"
                                               for k, v in got["owned_tokens"].items()))
    print(f"  TTFT             : {got['ttft_cycles']:,} cycles (prefill steps: "
          + ", ".join(f"{c:,}" for c in got["prefill_step_cycles"]) + ")")
    print("  exposed comm     : " + "; ".join(
        "step {}: {}".format(i + 1, "/".join(f"{w:,}" for w in ws))
        for i, ws in enumerate(got["exposed_comm_cycles"]))
        + " cycles (COMPUTE queue waiting, per node)")
    if got["decode_cycles"]:
        print("  decode           : " + ", ".join(f"{c:,}" for c in got["decode_cycles"])
              + " cycles per token (roots " + ", ".join(map(str, got["roots"])) + ")")
    fa = got["float_agreement"]
    print(f"  vs float         : top-1 {fa['top1']:.2f}, max |logit error| "
          f"{fa['max_abs_logit_error']:.2f}, cosine {fa['cosine']:.3f}")
    print(f"  simulation       : {got['sim_cycles']:,} cycles in {got['wall_seconds']:.0f} s "
          f"({got['node_cycles_per_second']:,.0f} node-cycles/s)")


def register(subs) -> None:
    from ..abi.attend import RUN_SOFTMAX
    from ..abi.node_config import NODE_CONFIGS
    from ..cluster import RUN_POLICIES, RUN_TASKS
    from ..cluster.spec import RUN_DECODE

    p = subs.add_parser("run", help="a Qwen2 model end to end on a simulated KR260 cluster",
                        description=description(__doc__))
    p.add_argument("--model", default="tiny",
                   help="'tiny' (random weights from --seed), 'retrieval' (the trained "
                        "checkpoint, see --task), 'qwen2.5-1.5b' (full dimension: random bf16 "
                        "weights written to build/models on first use, or --checkpoint) or a "
                        "Qwen2 checkpoint directory")
    p.add_argument("--checkpoint", metavar="DIR",
                   help="with --model qwen2.5-1.5b: a downloaded Qwen2.5-1.5B(-Instruct) "
                        "folder instead of the random-weight one (docs/model.md)")
    p.add_argument("--layers", type=int, metavar="K",
                   help="truncate the model to its first K layers (embedding, K layers, final "
                        "norm, lm_head; default all), e.g. --model qwen2.5-1.5b --layers 1")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="prompt length, a multiple of --chunk (default 64)")
    p.add_argument("--nodes", type=int, default=2, help="simulated KR260 nodes (default 2)")
    p.add_argument("--node-config", default="sim", choices=sorted(NODE_CONFIGS),
                   help="the node top's configuration (default sim: the tiny geometry, quick "
                        "to simulate; kr260: the bitstream's, for qwen2.5-1.5b)")
    p.add_argument("--policy", default="mars", choices=RUN_POLICIES,
                   help="prefill schedule (default mars)")
    p.add_argument("--decode-tokens", type=int, default=2,
                   help="greedy decode tokens after the first (default 2)")
    p.add_argument("--chunk", type=int, default=32, help="prefill chunk B (default 32)")
    p.add_argument("--alpha", type=float, default=0.5, help="MARS's alpha (eq 15, default 0.5)")
    p.add_argument("--kv-budget-mib", type=float, default=None, metavar="MIB",
                   help="per-node KV budget S_node in MiB (default 1; formerly --kv-budget-kib "
                        "in KiB)")
    add_alias(p, "--kv-budget-kib", "kv_budget_kib", type=float, metavar="KIB")
    p.add_argument("--seed", type=int, default=0, help="prompt and tiny-model seed")
    p.add_argument("--task", choices=sorted(RUN_TASKS),
                   help="pose a task instead of a random prompt (passkey: key-value retrieval, "
                        "for --model retrieval); its answer is scored")
    p.add_argument("--timeout", type=int, default=0,
                   help="sequencer watchdog in cycles (0: off)")
    p.add_argument("--link-fault", type=int, metavar="STEP",
                   help="flip one bit on the links leaving --link-fault-node at this prefill "
                        "step (1-based): the run must stop, naming the node and link")
    p.add_argument("--link-fault-node", type=int, default=None, metavar="NODE",
                   help="with --link-fault: the node whose outgoing links it corrupts "
                        "(default 0)")
    p.add_argument("--softmax", default="single", choices=RUN_SOFTMAX,
                   help="attention softmax: single (online, one pass) or two_phase (global "
                        "maximum first, exact sums: the same bits for any --nodes)")
    p.add_argument("--decode", default="root", choices=RUN_DECODE,
                   help="decode tokens: root (every layer on the token's root, replicated "
                        "weights; default) or tp (tensor-parallel over 2 nodes: column/row-"
                        "parallel projections and FFN all-reduced by the NICs, KV-parallel "
                        "attention, each head normalised at its owner; single softmax)")
    p.add_argument("--mpi", action="store_true",
                   help="one node per MPI rank (mpirun -n NODES; the same cycles and bits as "
                        "one simulation)")
    p.add_argument("--board", action="store_true",
                   help="drive every node with the board runtime (the PYNQ driver, one MPI "
                        "rank per node): simulated KR260s, or the boards of --hostfile")
    p.add_argument("--hostfile", help="with --board: run on these KR260s (Open MPI hostfile, "
                                      "one board per node, mcf deployed on each)")
    p.add_argument("--overlay", help="with --hostfile: the node's .bit on the boards")
    p.add_argument("--python", default=None,
                   help="with --hostfile: the boards' interpreter (the PYNQ virtualenv's, as "
                        "for mcf deploy; default python3)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="the full result as one JSON object: printed instead of the summary, "
                        "or written to PATH")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(handler=run)

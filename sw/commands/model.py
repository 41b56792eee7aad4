"""``mcf model``: the event-level system model calibrated from the RTL benches (issue #15 §3,
docs/system-model.md): MARS and the fair baselines on N nodes over a stated link assumption,
TTFT and exposed communication; ``--validate``: the model against the measured layer program;
``--evaluate``: the paper's evaluation reproduced — figures, tables, JSON (issue #15 §4,
docs/evaluation.md, :mod:`mcf.sysmodel.evaluation`)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from ..cli import UsageError
from ._checks import (
    Progress,
    add_alias,
    description,
    node_counts,
    spelling,
    writable_dir,
    writable_file,
)

__all__ = ["register", "run"]


def _validation(args, fig) -> dict:
    from ..sysmodel.validate import validate, validate_comm
    return {"calibrated": validate(fig, overheads=True).to_dict(),
            "engine_rates_alone": validate(fig, overheads=False).to_dict(),
            "communication_only": validate_comm(fig).to_dict()}


def _print_validation(v: dict, fig) -> None:
    for name, d in v.items():
        run, src = (fig.comm, "comm") if name == "communication_only" else (fig.layer, "layer")
        busy = "" if d["busy_fraction_predicted"] is None else (
            f"; lower node busy {d['busy_fraction_predicted']:.3f} vs "
            f"{d['busy_fraction_measured']:.3f}")
        print(f"model vs RTL, {name.replace('_', ' ')} ({fig.sources[src]}: {run.nodes} "
              f"{run.model}-model nodes, S = {run.seq_len}, B = {run.chunk}, link latency "
              f"{run.link_latency_cycles} cycles):")
        print("  predicted " + ", ".join(f"{p:.0f}" for p in d["predicted_step_cycles"])
              + " cycles vs measured " + ", ".join(str(m) for m in d["measured_step_cycles"]))
        print("  step errors " + ", ".join(f"{100 * e:+.1f} %" for e in d["step_errors"])
              + f" (max |error| {100 * d['max_abs_error']:.1f} %){busy}")


def run(args) -> int:
    from ..abi.node_config import NODE_CONFIGS
    from ..mars import MODELS, PlanError
    from ..mars.setting import SETTINGS, Setting, get_setting
    from ..mars.sweep import SCHEMES
    from ..sysmodel.calibration import CalibrationError, load_figures
    from ..sysmodel.network import LINKS
    from ..sysmodel.sweep import ModelSweep, run_sweep, summary, table
    from ..sysmodel.system import SystemSpec
    from ..sysmodel.work import LAYOUTS, SCOPES

    nodes = node_counts("--nodes", args.nodes)
    schemes = tuple(s.strip() for s in args.schemes.split(","))
    checks = (("--link", args.link, LINKS), ("--model", args.model, MODELS),
              ("--setting", args.setting, SETTINGS), ("--node-config", args.node_config,
                                                       NODE_CONFIGS),
              ("--scope", args.scope, SCOPES), ("--layout", args.layout, LAYOUTS))
    for flag, value, allowed in checks:
        if value not in allowed:
            raise UsageError(f"unknown {flag} {value!r} (one of {', '.join(allowed)})")
    for s in schemes:
        if s not in SCHEMES:
            raise UsageError(f"unknown scheme {s!r} (one of {', '.join(SCHEMES)})")
    if args.seq < 1 or args.chunk < 1 or args.seq % args.chunk:
        raise UsageError(f"{spelling(args, 'seq', '--prompt-tokens')} {args.seq} must be a "
                         f"positive multiple of --chunk {args.chunk}")
    for flag, value in (("--alpha", args.alpha), ("--kv-budget-mib", args.kv_budget_mib)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise UsageError(f"{flag} must be a finite number >= 0, got {value}")
    if args.clock_mhz is not None and not (math.isfinite(args.clock_mhz) and args.clock_mhz > 0):
        raise UsageError(f"--clock-mhz must be a finite number > 0, got {args.clock_mhz}")
    from ..mars import get_model
    from ..sysmodel.rates import check_fits
    model = get_model(args.model)
    try:
        check_fits(model, NODE_CONFIGS[args.node_config])
        setting = get_setting(args.setting, model)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for folder in args.results_dir or ():
        if not Path(folder).is_dir():
            raise UsageError(f"--results-dir {folder}: no such directory")
    if args.json not in (None, "-"):
        writable_file("--json", args.json)
    if args.evaluate:
        writable_dir("--out", args.out or "build/report")
    try:
        fig = load_figures(args.results_dir or None)
    except CalibrationError as exc:
        print(f"mcf model: error: {exc}", file=sys.stderr)
        return 1
    measured_fig = fig     # the validation replays the benches at the clock they assumed
    if args.clock_mhz is not None:
        from ..sysmodel.calibration import at_clock
        fig = at_clock(fig, args.clock_mhz * 1e6)
    if args.alpha is not None or args.kv_budget_mib is not None:
        setting = Setting("given", setting.alpha if args.alpha is None else args.alpha,
                          setting.kv_budget_mib if args.kv_budget_mib is None
                          else args.kv_budget_mib, f"flags over the {setting.name} setting")
    if args.evaluate:
        return _evaluate(args, setting, nodes, fig)
    out: dict = {}
    try:
        if args.validate:
            out["validation"] = _validation(args, measured_fig)
        if not args.validate_only:
            sw = ModelSweep(alpha=setting.alpha, kv_budget_mib=setting.kv_budget_mib,
                            setting=setting.name, model=args.model, seq_len=args.seq,
                            chunk=args.chunk, nodes=nodes, schemes=schemes, link=args.link,
                            node_config=args.node_config,
                            spec=SystemSpec(layout=args.layout, scope=args.scope,
                                            overheads=not args.no_overheads))
            with Progress("mcf model", len(nodes) * len(schemes), "system model", "run",
                          enabled=not args.quiet) as bar:
                rows = run_sweep(sw, fig, bar.step)
            out |= {"rows": rows, "speedups": summary(rows)}
    except CalibrationError as exc:
        print(f"mcf model: error: {exc}", file=sys.stderr)
        return 1
    except (PlanError, ValueError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    if args.json:
        out["calibration"] = dict(fig.sources)
        out["clock_hz"] = fig.clock_hz
        out["link"] = {"name": args.link, "assumption": LINKS[args.link].text}
        out["setting"] = setting.__dict__
        _emit_json(args, json.dumps(out))
        return 0
    if "validation" in out:
        _print_validation(out["validation"], fig)
        if "rows" in out:
            print()
    if "rows" in out:
        print(table(out["rows"], sw, fig))
    return 0


def _emit_json(args, text: str) -> None:
    """``--json``: the object printed, or written to ``--json PATH``."""
    if args.json == "-":
        print(text)
    else:
        Path(args.json).write_text(text + "\n")


def _evaluate(args, setting, nodes, fig) -> int:
    """``--evaluate``: every figure and table of the paper's evaluation into ``--out``."""
    from dataclasses import replace

    from ..mars import PlanError
    from ..sysmodel.calibration import CalibrationError
    from ..sysmodel.evaluation import EvalSpec, count_runs, evaluate, write_report
    out = writable_dir("--out", args.out or "build/report")
    try:
        spec = EvalSpec(alpha=setting.alpha, kv_budget_mib=setting.kv_budget_mib,
                        setting=setting.name, model=args.model, node_config=args.node_config,
                        link=args.link)
        if args.quick:
            spec = spec.quick()
        else:
            seqs = tuple(s for s in spec.seq_lens if s % args.chunk == 0)
            chunks = tuple(b for b in spec.chunks if args.seq % b == 0)
            spec = replace(spec, seq_len=args.seq, chunk=args.chunk, nodes=nodes,
                           memory_nodes=nodes[-2:], seq_lens=seqs or (args.chunk,),
                           chunks=chunks or (args.chunk,))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    bar = Progress("mcf model", count_runs(spec, fig.clock_hz), "evaluation", "run",
                   enabled=not args.quiet)
    try:
        ev = evaluate(spec, fig, bar.step)
    except CalibrationError as exc:
        bar.close()
        print(f"mcf model: error: {exc}", file=sys.stderr)
        return 1
    except (PlanError, ValueError) as exc:
        bar.close()
        raise UsageError(str(exc).splitlines()[0]) from None
    bar.close()
    try:
        written = write_report(ev, out)
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    if args.json:
        _emit_json(args, json.dumps(ev.to_dict(), default=str))
        return 0
    t = ev.targets()
    w = t["worst_mars_over_best_fair"]
    best = t["largest_map_speedup"]
    print(f"wrote {len(written)} files to {out}: " + ", ".join(p.name for p in written))
    print(f"MARS / best fair TTFT, worst over Table 1 and the map: {w['ratio']:.3f} "
          f"({w['where']}, {w['scope']}, N = {w['nodes']})")
    print(f"largest map speedup: {best['speedup']:.2f}x over {best['best_fair']} "
          f"({best['scope']}, compute x{best['compute_scale']:g}, {best['link_gbps']:g} Gb/s)")
    for c in ev.clocks:
        mars = {r.nodes: r.ttft_s for r in c.table_runs if r.scheme == "mars"
                and r.scope == "model"}
        print(f"at {c.clock_hz / 1e6:g} MHz: MARS TTFT (whole model) " + ", ".join(
            f"N = {n}: {t:.2f} s" for n, t in mars.items()))
        for path in dict.fromkeys(d.weight_path for d in c.decode):
            print(f"  decode tok/s, weights from {path}: " + ", ".join(
                f"{d.key} (context {d.context}) {d.tok_s:.1f}" for d in c.decode
                if d.weight_path == path))
    return 0


EVALUATE_EXCLUDES = (("--scope", "scope"), ("--layout", "layout"), ("--schemes", "schemes"),
                     ("--no-overheads", "no_overheads"), ("--validate", "validate"),
                     ("--validate-only", "validate_only"))
"""Flags ``--evaluate`` does not take: it models both scopes and its own schemes."""

VALIDATE_ONLY_EXCLUDES = (("--nodes", "nodes"), ("--prompt-tokens", "seq"), ("--chunk", "chunk"),
                          ("--schemes", "schemes"), ("--scope", "scope"), ("--layout", "layout"),
                          ("--no-overheads", "no_overheads"), ("--alpha", "alpha"),
                          ("--kv-budget-mib", "kv_budget_mib"), ("--clock-mhz", "clock_mhz"))
"""Flags of the sweep that ``--validate-only`` does not run."""

DEFAULTS = {"nodes": "2,4,8,16", "seq": 16384, "chunk": 1024, "scope": "model",
            "layout": "plan",
            "schemes": "mars,ring,zigzag,ring-unchunked,zigzag-unchunked,full,pd"}


def register(subs) -> None:
    p = subs.add_parser("model", help="event-level system model calibrated from the RTL benches",
                        description=description(__doc__))
    p.add_argument("--nodes", default=None, help="node counts, comma-separated "
                                                 "(default 2,4,8,16)")
    p.add_argument("--prompt-tokens", dest="seq", type=int, default=None, metavar="N",
                   help="prompt length S in tokens (default 16384; formerly --seq)")
    add_alias(p, "--seq", "seq", type=int, metavar="N")
    p.add_argument("--chunk", type=int, default=None, help="chunk size B in tokens "
                                                          "(default 1024)")
    p.add_argument("--link", default="kr260-ring",
                   help="link assumption: kr260-ring (default), switch10g or ideal")
    p.add_argument("--model", default="qwen2.5-1.5b", help="model preset (qwen2.5-1.5b, tiny)")
    p.add_argument("--schemes", default=None,
                   help="MARS and the baselines to model, comma-separated (default all: "
                        f"{DEFAULTS['schemes']})")
    p.add_argument("--setting", default="paper",
                   help="alpha and S_node: paper (0.5, 64 MiB; default) or board")
    p.add_argument("--alpha", type=float, default=None, help="override the setting's alpha")
    p.add_argument("--kv-budget-mib", type=float, default=None,
                   help="override the setting's S_node (MiB per node)")
    p.add_argument("--node-config", default="kr260", help="node configuration (kr260, sim)")
    p.add_argument("--clock-mhz", type=float, default=None, metavar="F",
                   help="turn cycles into seconds at F MHz (default: the ABI's assumed aclk, "
                        "mcf.abi.platform.ACLK_HZ); the links keep their bit/s and cable "
                        "latency in seconds; --validate still replays the benches at the clock "
                        "they assumed")
    p.add_argument("--scope", default=None,
                   help="what TTFT covers: model (the whole layer program, default) or "
                        "attention (the ATTEND records alone)")
    p.add_argument("--layout", default=None,
                   help="token layout: plan (MARS's ranges, default) or node-program (the "
                        "node's contiguous slices, as the RTL runs today)")
    p.add_argument("--no-overheads", action="store_true",
                   help="engine rates alone: no node-program overheads from the layer bench")
    p.add_argument("--validate", action="store_true",
                   help="also replay the node bench's layer program and print the error")
    p.add_argument("--validate-only", action="store_true",
                   help="only the validation (implies --validate)")
    p.add_argument("--results-dir", action="append", default=None, metavar="DIR",
                   help="where bench JSON is read (repeatable, in order; default build/bench "
                        "then docs/results)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="one JSON object instead of the table: printed, or written to PATH")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument("--evaluate", action="store_true",
                   help="reproduce the paper's evaluation (Fig. 3-5, Table 1, Table 2's decode "
                        "row, the crossover map): PNGs, summary.md and evaluation.json in --out")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="with --evaluate: the output folder (default build/report)")
    p.add_argument("--quick", action="store_true",
                   help="with --evaluate: the small grid (4K prompt, N = 2 and 4, a 2 x 2 map)")
    p.set_defaults(handler=_handler)


def _handler(args) -> int:
    if args.evaluate:
        for flag, attr in EVALUATE_EXCLUDES:
            if getattr(args, attr) not in (None, False):
                raise UsageError(f"{flag} does not apply with --evaluate (it models both "
                                 "scopes and its own schemes)")
        if args.quick:
            for flag, attr in (("--nodes", "nodes"), (spelling(args, "seq", "--prompt-tokens"),
                                                      "seq"), ("--chunk", "chunk")):
                if getattr(args, attr) is not None:
                    raise UsageError(f"{flag} does not apply with --quick (its grid is fixed)")
    else:
        for flag, attr in (("--out", "out"), ("--quick", "quick")):
            if getattr(args, attr) not in (None, False):
                raise UsageError(f"{flag} needs --evaluate")
    if args.validate_only:
        for flag, attr in VALIDATE_ONLY_EXCLUDES:
            if getattr(args, attr) not in (None, False):
                raise UsageError(f"{spelling(args, attr, flag)} does not apply with "
                                 "--validate-only (it replays the measured layer program)")
    for attr, value in DEFAULTS.items():
        if getattr(args, attr) is None:
            setattr(args, attr, value)
    if args.validate_only:
        args.validate = True
    return run(args)

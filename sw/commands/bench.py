"""``mcf bench [NAME ...|all] [--json [PATH]] [--small] [--no-synth] [--out DIR]``: run the
benches of :mod:`mcf.sim.perf` and write one ``DIR/<name>.json`` each (default ``build/bench``).

A bench that sees a mismatch or an unplanned drop refuses (:class:`mcf.sim.perf.BenchRefused`):
its figure is not written, the refusal is printed as one line and the exit status is 1.
``--json`` prints one JSON object (``--json PATH`` writes it to PATH): the bench's own for one
bench; for several, one member per bench plus ``resources`` (every top's yosys estimate, by
bench and top name). A ``--json`` value without a ``.`` or ``/`` is a bench's name, not a path
(``mcf bench --json decode`` prints decode's object).

``--from-record PATH`` (``qwen`` only): no simulation — the recorded result at PATH (a
``qwen.json`` an earlier ``mcf bench qwen`` wrote) with its prediction and errors recomputed by
today's system model (:func:`mcf.sim.perf.qwen.from_record`; its measured part kept).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

__all__ = ["run_benches", "register"]


ON_REQUEST = ("qwen", "attention_arrays")
"""Benches ``all`` leaves out, run when named: ``qwen`` (issue #35) builds the kr260 node and
simulates Qwen2.5-1.5B layers for hours; ``attention_arrays`` (issue #33) runs the attention
engine on the GEMM's arrays at the kr260 shape in amaranth.sim (~45 min on two processes)."""


def _benches() -> tuple[str, ...]:
    from mcf.sim.perf import BENCHES
    return BENCHES + tuple(n for n in ("depth", *ON_REQUEST) if n not in BENCHES)


def run_benches(names: list[str], *, small: bool, synth: bool, out: Path,
                progress=None) -> tuple[dict, list[str]]:
    """Run ``names``; returns ``(results, refusals)`` and writes ``out/<name>.json`` for every
    bench that reported."""
    from mcf.sim.perf import BenchRefused

    out.mkdir(parents=True, exist_ok=True)
    results, refusals = {}, []
    for name in names:
        if progress:
            progress(name)
        mod = importlib.import_module(f"mcf.sim.perf.{name}")
        try:
            result = mod.collect(small=small, synth=synth)
        except BenchRefused as exc:
            refusals.append(f"{name} refused: {exc}")
            continue
        result["small"] = small
        (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        results[name] = result
    return results, refusals


FROM_RECORD = ("qwen",)
"""Benches whose recorded result ``--from-record`` recomputes without a simulation."""


def _from_record(args) -> int:
    """``mcf bench qwen --from-record PATH``: the record's prediction and errors recomputed."""
    from mcf.sim.perf.qwen import from_record, render

    from ..cli import UsageError

    path = Path(args.from_record)
    try:
        record = json.loads(path.read_text())
        result = from_record(record)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"--from-record {path}: not a recorded qwen bench result "
                         f"({type(exc).__name__}: {exc})") from None
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "qwen.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.json == "-":
        print(json.dumps(result))
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    else:
        print(f"## qwen (from {path})\n\n{render(result)}\n")
    return 0


def _combined(results: dict) -> dict:
    combined = dict(results)
    combined["resources"] = {f"{bench}.{top}": res
                             for bench, r in results.items()
                             for top, res in (r.get("resources") or {}).items()}
    return combined


def run(args) -> int:
    from ..cli import UsageError

    known = _benches()
    j = args.json
    if j not in (None, "-") and (j in known or j == "all" or not set("./") & set(j)):
        args.names, args.json = [*args.names, j], "-"   # `mcf bench --json decode`: a name
    names = [n for n in known if n not in ON_REQUEST] if args.names in ([], ["all"]) \
        else args.names
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"unknown bench(es) {', '.join(unknown)}; known: "
                         f"{', '.join(known)}, all")
    if args.from_record is not None and names != list(FROM_RECORD):
        raise UsageError(f"--from-record recomputes a recorded {', '.join(FROM_RECORD)} run: "
                         f"name only {', '.join(FROM_RECORD)}")
    from ._checks import writable_dir, writable_file
    writable_dir("--out", args.out)
    if args.json not in (None, "-"):
        writable_file("--json", args.json)
    if args.from_record is not None:
        return _from_record(args)

    def say(name):
        print(f"mcf bench: running {name}{' (small)' if args.small else ''}", file=sys.stderr)

    results, refusals = run_benches(names, small=args.small, synth=not args.no_synth,
                                    out=Path(args.out), progress=say)
    for line in refusals:
        print(f"mcf bench: {line}", file=sys.stderr)
    if args.json:
        obj = results[names[0]] if len(names) == 1 and results else _combined(results)
        if results and args.json == "-":
            print(json.dumps(obj))
        elif results:
            Path(args.json).write_text(json.dumps(obj, indent=1) + "\n")
    else:
        for name, result in results.items():
            mod = importlib.import_module(f"mcf.sim.perf.{name}")
            print(f"## {name}\n\n{mod.render(result)}\n")
    return 1 if refusals else 0


def register(subs) -> None:
    from ._checks import description
    p = subs.add_parser("bench", help="measure cycles and resources; write build/bench/*.json",
                        description=description(__doc__))
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="packet, nic, compute, attention, csr, plan, node, cluster, eth, task, "
                        "decode, depth, qwen (hours), attention_arrays (~45 min; these two not "
                        "in all), or all (default all)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="one JSON object instead of the tables: printed, or written to PATH")
    p.add_argument("--small", action="store_true", help="reduced sizes (what CI runs)")
    p.add_argument("--no-synth", action="store_true", help="skip the yosys resource estimates")
    p.add_argument("--out", default="build/bench",
                   help="folder for <name>.json (default %(default)s)")
    p.add_argument("--from-record", metavar="PATH", default=None,
                   help="qwen only: recompute a recorded result's prediction and errors with "
                        "today's model (no simulation)")
    p.set_defaults(handler=run)

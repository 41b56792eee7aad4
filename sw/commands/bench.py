"""``mcf bench [NAME ...|all] [--json [PATH]] [--small] [--no-synth] [--out DIR]``: run the
benches of :mod:`mcf.sim.perf` and write one ``DIR/<name>.json`` each (default ``build/bench``).

A bench that sees a mismatch or an unplanned drop refuses (:class:`mcf.sim.perf.BenchRefused`):
its figure is not written, the refusal is printed as one line and the exit status is 1.
``--json`` prints one JSON object (``--json PATH`` writes it to PATH): the bench's own for one
bench; for several, one member per bench plus ``resources`` (every top's yosys estimate, by
bench and top name). A ``--json`` value without a ``.`` or ``/`` is a bench's name, not a path
(``mcf bench --json decode`` prints decode's object).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

__all__ = ["run_benches", "register"]


ON_REQUEST = ("qwen",)
"""Benches ``all`` leaves out: ``qwen`` (issue #35) builds the kr260 node and simulates
Qwen2.5-1.5B layers for hours; it runs when named."""


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
    from ._checks import writable_dir, writable_file
    writable_dir("--out", args.out)
    if args.json not in (None, "-"):
        writable_file("--json", args.json)

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
                        "decode, depth, qwen (hours; not in all), or all (default all)")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                   help="one JSON object instead of the tables: printed, or written to PATH")
    p.add_argument("--small", action="store_true", help="reduced sizes (what CI runs)")
    p.add_argument("--no-synth", action="store_true", help="skip the yosys resource estimates")
    p.add_argument("--out", default="build/bench",
                   help="folder for <name>.json (default %(default)s)")
    p.set_defaults(handler=run)

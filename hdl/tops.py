"""Every top-level design ``mcf verilog`` writes: name → factory returning a
:class:`mcf.hdl.flat.FlatTop` (flat Xilinx-style port names). Add a line when a top lands."""

from __future__ import annotations

from collections.abc import Callable

from .flat import FlatTop

TOPS: dict[str, Callable[[], FlatTop]] = {}

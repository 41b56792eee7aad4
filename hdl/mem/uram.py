"""A wide memory shaped to URAM288's 72-bit columns (UltraScale+, docs/node.md §11).

Synthesis builds a ``W``-bit memory from ``⌈W / 72⌉`` URAM288 columns: a 1,024-bit word takes
15, the last holding 16 bits. :class:`UramColumns` keeps the whole 72-bit columns in URAM and
the remainder in block RAM (or LUT-RAM, as synthesis picks by its size), one memory each, at
the same addresses: a 1,024-bit word in 14 URAM and a 16-bit memory.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import Out

__all__ = ["UramColumns", "URAM_WIDTH"]

URAM_WIDTH = 72
"""Bits of a URAM288 word (4,096 × 72)."""


class UramColumns(wiring.Component):
    """One write port and one read port (synchronous, ``en``) on a ``width``-bit memory of
    ``depth`` words: bits ``[0, 72·⌊width/72⌋)`` in URAM (``ram_style = "ultra"``), the rest
    in a memory of its own (``ram_style = "block"``). Same cycles and bits as one
    :class:`amaranth.lib.memory.Memory` with those ports (not transparent).

    Members
    -------
    w : Out(memory.WritePort.Signature(addr_width, width))
    r : Out(memory.ReadPort.Signature(addr_width, width))
        ``data`` the cycle after ``addr`` while ``en``.
    """

    def __init__(self, width: int, depth: int):
        if width < 1 or depth < 1:
            raise ValueError("width and depth must be >= 1")
        self.width, self.depth = width, depth
        aw = max(1, (depth - 1).bit_length())
        super().__init__({
            "w": Out(memory.WritePort.Signature(addr_width=aw, shape=width)),
            "r": Out(memory.ReadPort.Signature(addr_width=aw, shape=width)),
        })

    def elaborate(self, platform):
        m = Module()
        main = self.width // URAM_WIDTH * URAM_WIDTH
        parts = [(0, main, "ultra"), (main, self.width, "block")]
        for k, (lo, hi, style) in enumerate(p for p in parts if p[1] > p[0]):
            mem = memory.Memory(shape=hi - lo, depth=self.depth, init=[],
                                attrs={"ram_style": style})
            m.submodules[f"col{k}"] = mem
            wp, rp = mem.write_port(), mem.read_port(transparent_for=())
            m.d.comb += [wp.addr.eq(self.w.addr), wp.en.eq(self.w.en),
                         wp.data.eq(self.w.data[lo:hi]),
                         rp.addr.eq(self.r.addr), rp.en.eq(self.r.en),
                         self.r.data[lo:hi].eq(rp.data)]
        return m

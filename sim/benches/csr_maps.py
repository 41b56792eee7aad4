"""Register maps the CSR benches and tests elaborate (no cocotb import here).

``kinds`` exercises every access kind, fields straddling byte lanes, non-zero reset values and
registers mixing kinds; ``node`` is the real node map from :func:`mcf.abi.csrmap.node_regmap`.
"""

from __future__ import annotations

from mcf.abi.csrmap import node_regmap
from mcf.abi.regs import Access, Field, Register, RegisterMap

__all__ = ["kinds_regmap", "MAPS"]

KINDS_MAP_VERSION = 0x0001


def kinds_regmap() -> RegisterMap:
    regs = RegisterMap("csr_kinds", KINDS_MAP_VERSION)
    regs.add(Register("CTRL", (
        Field("enable", 1, Access.RW, 1),
        Field("mode", 3, Access.RW, 5),
        Field("limit", 12, Access.RW, 0xABC),   # bits 15:4, straddles lanes 0 and 1
        Field("shift", 9, Access.RW, 0x101),    # bits 24:16, straddles lanes 2 and 3
    ), "RW fields across byte lanes"))
    regs.add(Register.single("SCRATCH", 32, Access.RW, 0x1234_5678))
    regs.add(Register("CMD", (
        Field("go", 1, Access.W),
        Field("arg", 15, Access.W, 0x11),
        Field("tag", 8, Access.W),
    ), "write-only fields with strobes"))
    regs.add(Register("STATUS", (
        Field("busy", 1, Access.R),
        Field("level", 10, Access.R),
        Field("err", 5, Access.RW1C),
        Field("flags", 16, Access.RW1C, 0x8001),
    ), "hardware status and sticky flags"))
    regs.add(Register.single("IRQ", 32, Access.RW1C))
    regs.add(Register("MIX", (
        Field("hw", 4, Access.R),
        Field("cfg", 8, Access.RW, 0x5A),
        Field("kick", 4, Access.W),
        Field("evt", 8, Access.RW1C),
        Field("top", 7, Access.RW, 0x40),
    ), "every kind in one word"))
    regs.add(Register.single("COUNT", 32, Access.R))
    return regs


MAPS = {"kinds": kinds_regmap, "node": node_regmap}

"""Documentation generated from the ABI objects (never written by hand): bit diagrams of
layouts, enum tables and register maps, as plain text or Markdown."""

from __future__ import annotations

from amaranth.lib import data
from amaranth.lib import enum as aenum

from .regs import RegisterMap


def layout_rows(layout: data.StructLayout) -> list[tuple[str, int, int, str]]:
    """(name, lsb, msb, shape) per field, LSB first."""
    rows = []
    for name, fld in layout:
        shape = fld.shape
        desc = shape.__name__ if isinstance(shape, type) else repr(shape)
        rows.append((name, fld.offset, fld.offset + fld.width - 1, desc))
    return rows


def bit_diagram(layout: data.StructLayout, title: str, row_bits: int = 32) -> str:
    """ASCII diagram, one row per ``row_bits`` bits, MSB on the left."""
    lines = [f"{title} ({layout.size} bits)", ""]
    for base in range(0, layout.size, row_bits):
        top = min(base + row_bits, layout.size) - 1
        cells = []
        for name, fld in sorted(layout, key=lambda nf: -nf[1].offset):
            lo, hi = max(fld.offset, base), min(fld.offset + fld.width - 1, top)
            if lo > hi:
                continue
            w = hi - lo + 1
            label = name if (lo, hi) == (fld.offset, fld.offset + fld.width - 1) \
                else f"{name}[{hi - fld.offset}:{lo - fld.offset}]"
            cells.append(f" {label}:{w} ".center(max(w * 2, len(label) + 4)))
        lines.append(f"{top:>3} |" + "|".join(cells) + f"| {base}")
    return "\n".join(lines)


def enum_table(enum_cls: type[aenum.Enum]) -> str:
    width = aenum.EnumMeta.as_shape(enum_cls).width
    lines = [f"{enum_cls.__name__} ({width} bits)"]
    lines += [f"  {m.value:>3}  {m.name}" for m in enum_cls]
    return "\n".join(lines)


def layout_markdown(layout: data.StructLayout, title: str) -> str:
    lines = [f"### {title} ({layout.size} bits)", "", "| field | bits | shape |", "|---|---|---|"]
    lines += [f"| `{n}` | {hi}:{lo} | {s} |" for n, lo, hi, s in layout_rows(layout)]
    return "\n".join(lines)


def regmap_text(regmap: RegisterMap) -> str:
    lines = [f"Register map {regmap.name} (v{regmap.version:#06x}, {regmap.size} bytes)",
             f"{'addr':>6}  {'register':<28} {'field':<20} {'bits':>7}  access  reset"]
    for addr, reg in regmap:
        for fld, off in reg.offsets():
            lines.append(f"{addr:#06x}  {reg.name:<28} {fld.name:<20} "
                         f"{off + fld.width - 1:>3}:{off:<3}  {fld.access.value:<6}  "
                         f"{fld.reset:#x}")
    return "\n".join(lines)

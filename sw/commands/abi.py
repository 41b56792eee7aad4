"""``mcf abi``: print the metadata layout, the enums, the dispatch rules and the register map —
all generated from :mod:`mcf.abi`."""

from __future__ import annotations

from ..abi import DISPATCH_RULES, META, Collective, InvalidateKind, Op, Port, ReduceOp, Stage
from ..abi.csrmap import DropCause, node_regmap
from ..abi.doc import bit_diagram, enum_table, layout_markdown, regmap_text


def _rule_text(rule) -> str:
    conds = []
    if rule.op is not None:
        conds.append("op in {" + ", ".join(o.name for o in rule.op) + "}")
    if rule.collective is not None:
        conds.append("collective in {" + ", ".join(c.name for c in rule.collective) + "}")
    if rule.reduce_op_not_none is not None:
        conds.append("reduce_op " + ("!=" if rule.reduce_op_not_none else "==") + " NONE")
    if rule.dst_is_local is not None:
        conds.append("dst " + ("==" if rule.dst_is_local else "!=") + " local_id")
    return f"  {' and '.join(conds) or 'otherwise':<60} -> {rule.port.name}"


def render(markdown: bool = False) -> str:
    parts = [layout_markdown(META, "Meta") if markdown else bit_diagram(META, "Meta")]
    parts += [enum_table(e) for e in (Stage, Op, InvalidateKind, Collective, ReduceOp, Port,
                                      DropCause)]
    parts.append("Dispatch (first match wins)\n" + "\n".join(_rule_text(r) for r in DISPATCH_RULES))
    parts.append(regmap_text(node_regmap()))
    text = "\n\n".join(parts)
    return f"```\n{text}\n```" if markdown else text


def register(subs) -> None:
    p = subs.add_parser("abi", help="print the packet metadata layout and the register map")
    p.add_argument("--markdown", action="store_true", help="Markdown output for docs")
    p.set_defaults(handler=lambda a: print(render(a.markdown)))

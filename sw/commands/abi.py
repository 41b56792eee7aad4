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


def _records():
    """The other records software and hardware exchange, by name."""
    from ..abi.compute import DMA_DESC, GEMM_JOB
    from ..abi.kv import attn_job_layout
    from ..abi.nic import REDUCE_CONFIG
    from ..abi.query import QUERY_HEADER, QUERY_SCALE
    return [("Decode query header (mcf.abi.query)", QUERY_HEADER),
            ("Decode query head scale word", QUERY_SCALE),
            ("DMA descriptor (mcf.abi.compute)", DMA_DESC),
            ("GEMM job", GEMM_JOB),
            ("Attention job, 6 heads (mcf.abi.kv)", attn_job_layout(6)),
            ("Reduction configuration entry (mcf.abi.nic)", REDUCE_CONFIG)]


def _limits() -> str:
    from ..abi.csrmap import COUNTER_BITS
    from ..abi.framing import MAX_PAYLOAD
    from ..abi.limits import REDUCE_SLOTS
    from ..abi.node_config import NODE_CONFIGS
    from ..abi.platform import HP_PORTS, K26
    from ..abi.quant import GROUP_SIZE
    from ..abi.softmax import LANE_BITS
    rows = [("MAX_PAYLOAD", f"{MAX_PAYLOAD} B", "largest packet payload, every engine and MARS"),
            ("REDUCE_SLOTS", REDUCE_SLOTS, "a stand-alone reduction engine's open reductions "
             "(node tops: " + ", ".join(f"{c.name} {c.reduce_slots}"
                                       for c in NODE_CONFIGS.values()) + ")"),
            ("COUNTER_BITS", COUNTER_BITS, "status counters (wrap)"),
            ("GROUP_SIZE", GROUP_SIZE, "INT4 weight quantisation group (K elements)"),
            ("LANE_BITS", LANE_BITS, "element lane of states and NIC reductions"),
            ("HP_PORTS", HP_PORTS, "PS HP ports for the PL's DMA loaders"),
            ("K26", ", ".join(f"{k} {v}" for k, v in K26.items()), "PL capacity")]
    return "Limits\n" + "\n".join(f"  {n:<13} {v!s:<52} {d}" for n, v, d in rows)


def render(markdown: bool = False) -> str:
    parts = [layout_markdown(META, "Meta") if markdown else bit_diagram(META, "Meta")]
    parts += [layout_markdown(layout, title) if markdown else bit_diagram(layout, title)
              for title, layout in _records()]
    parts.append(_limits())
    parts += [enum_table(e) for e in (Stage, Op, InvalidateKind, Collective, ReduceOp, Port,
                                      DropCause)]
    parts.append("Dispatch (first match wins)\n" + "\n".join(_rule_text(r) for r in DISPATCH_RULES))
    parts.append(regmap_text(node_regmap()))
    text = "\n\n".join(parts)
    return f"```\n{text}\n```" if markdown else text


def register(subs) -> None:
    from ._checks import description
    p = subs.add_parser("abi", help="print the packet metadata layout and the register map",
                        description=description(__doc__))
    p.add_argument("--markdown", action="store_true", help="Markdown output for docs")
    p.set_defaults(handler=lambda a: print(render(a.markdown)))

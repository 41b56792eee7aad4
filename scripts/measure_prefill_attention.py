"""Prefill attention on the GEMM's arrays, measured in RTL (issue #33): QKᵀ + P·V
multiply-accumulates per cycle of one causal PREFILL_TILE step on a node configuration's whole
NodeCompute in Verilator (:func:`mcf.sim.perf.attention.prefill_attention`; the configurations
of ``scripts/node_resource_parts.py``, ``kr260`` by default), and with ``--tiled`` the
four parameters of the tiled rate at that configuration's shape
(:func:`mcf.sim.perf.attention.tiled` with the configuration).

    python scripts/measure_prefill_attention.py                  # 256 tokens x 1,024 keys
    python scripts/measure_prefill_attention.py --small          # 16 tokens x 512 keys
    python scripts/measure_prefill_attention.py --tiled --json build/bench/prefill_attention.json

The first run builds the configuration's NodeCompute with Verilator (cached in ``build/sim``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from node_resource_parts import CONFIGS


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=sorted(c for c, v in CONFIGS.items() if v.tiled),
                    default="kr260")
    ap.add_argument("--small", action="store_true", help="the reduced step (16 tokens, 2 blocks)")
    ap.add_argument("--tiled", action="store_true",
                    help="also the tiled rate's four parameters at the configuration's shape")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)

    from mcf.sim.perf import BenchRefused
    from mcf.sim.perf.attention import prefill_attention, tiled

    cfg = CONFIGS[args.config]
    out: dict = {}
    t0 = time.monotonic()
    try:
        out["prefill"] = p = prefill_attention(cfg, small=args.small)
        print(f"{cfg.name}: {p['tokens']} tokens x {p['shape']['heads']} heads against "
              f"{p['keys']} keys ({p['shape']['blocks']}): {p['macs']:,} MACs in "
              f"{p['cycles']:,} cycles = {p['prefill_attention_macs_per_cycle']:.1f} MACs/cycle "
              f"of {p['macs_per_cycle_peak']} ({p['utilization']:.1%}); rows bit-exact")
        if args.tiled:
            out["tiled"] = t = tiled(small=args.small, cfg=cfg)
            print(f"tiled rate at {t['shape']}: record {t['record_cycles']}, row "
                  f"{t['row_cycles']}, row x block {t['row_block_cycles']}, key "
                  f"{t['key_cycles']} cycles; check records within {t['max_abs_error']:.1%}")
            for name, r in t["records"].items():
                print(f"  {name:<24} {r['role']:<5} {r['cycles']:>8} cycles, predicted "
                      f"{r['predicted']:>8} ({r['error']:+.1%})")
    except BenchRefused as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    out["wall_seconds"] = round(time.monotonic() - t0, 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

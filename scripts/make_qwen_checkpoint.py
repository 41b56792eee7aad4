"""Write the random-weight Qwen2.5-1.5B checkpoint that ``--model qwen2.5-1.5b`` names (issue
#35 item 1): Qwen2.5-1.5B-Instruct's real ``config.json`` geometry (hidden 1,536, 28 layers,
12 / 2 heads of 128, intermediate 8,960, RoPE θ = 10⁶, ε = 10⁻⁶, tied embeddings, vocabulary
151,936, 32,768 positions) with weights drawn from a seed, as bf16 safetensors (numpy and the
``safetensors`` package only, no torch)::

    python scripts/make_qwen_checkpoint.py --layers 1     # 0.56 GB: embedding + layer 0
    python scripts/make_qwen_checkpoint.py                # 3.1 GB: all 28 layers

It goes to ``build/models/qwen2.5-1.5b-random-s<seed>/`` (``$MCF_BUILD_DIR`` moves ``build``;
never committed) unless ``--out`` says otherwise. ``mcf run --model qwen2.5-1.5b`` calls the
same function (:func:`mcf.model.qwen.random_qwen`) on first use, so running this script is
optional. The same seed gives the same bits on every machine; ``--layers K`` writes only the
embedding and the first K layers (``config.json`` still says 28: such a folder loads with
``--layers K`` or fewer), and running again with more layers adds the missing ones. Measured
CPU time: about 10 s for the embedding and 1.5 s per layer (wall time more, with the disk);
peak memory 2.8 GB.
The weights are :func:`mcf.model.random_checkpoint`'s: ``W ~ N(0, 1/K)``, biases
``N(0, 0.1²)``, norms ``1 + N(0, 0.1²)``, embedding ``N(0, 0.25²)``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from checkout import import_mcf  # scripts/checkout.py (this folder is on sys.path)


def main(argv: list[str] | None = None) -> int:
    import_mcf()
    from mcf.model import QWEN25_1P5B_MODEL, CheckpointError, write_random_checkpoint
    from mcf.model.qwen import QWEN_SEED, random_qwen

    full = QWEN25_1P5B_MODEL.num_hidden_layers
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=full, metavar="K",
                    help=f"write the first K layers' tensors only (1..{full}, default {full}: "
                         "the whole 3.1 GB model)")
    ap.add_argument("--seed", type=int, default=QWEN_SEED,
                    help=f"weight seed (default {QWEN_SEED}, the one --model qwen2.5-1.5b uses)")
    ap.add_argument("--out", type=Path, metavar="DIR",
                    help="the folder (default build/models/qwen2.5-1.5b-random-s<seed>)")
    args = ap.parse_args(argv)
    if not 1 <= args.layers <= full:
        ap.error(f"--layers {args.layers}: the model has 1..{full} layers")
    if args.seed < 0:
        ap.error("--seed must be non-negative")
    t0 = time.monotonic()
    try:
        if args.out is None:
            d = random_qwen(args.layers, seed=args.seed, progress=_say)
        else:
            d = args.out
            write_random_checkpoint(d, QWEN25_1P5B_MODEL, args.seed, args.layers,
                                    progress=_say)
    except (CheckpointError, OSError) as exc:
        print(f"make_qwen_checkpoint: {exc}", file=sys.stderr)
        return 2
    size = sum(f.stat().st_size for f in Path(d).iterdir() if f.is_file())
    print(f"{d}: layers 0..{args.layers - 1} of {full}, {size / 1e9:.2f} GB, "
          f"{time.monotonic() - t0:.0f} s")
    return 0


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())

"""Greedy retrieval accuracy of a checkpoint with the project's own numpy models (no torch):
the float reference (:class:`mcf.model.FloatModel`) and the integer golden model
(:class:`mcf.model.IntModel`, INT4 weights and per-token INT4 KV, the arithmetic the RTL matches;
``int_channel``: the same with the per-channel-K INT4 KV format) on the fixed-seed prompts of
:func:`mcf.model.task.make_prompt` (seeds ``0 .. n-1``).

    OMP_NUM_THREADS=1 python scripts/eval_retrieval.py --models float int int_channel \\
        --lengths 256 512 1024 2048 4094 --n 50 --jobs 2 --write-card \\
        --json docs/results/retrieval_accuracy.json --figure docs/figures/retrieval_accuracy.png

``--float-lengths`` gives the float reference its own lengths (the integer models take ~20 s
per 4094-token prompt on one core, the float one ~1 s). ``--jobs`` runs the (model, length)
pairs in that many processes. ``--json`` writes every figure measured; ``--figure`` plots
accuracy against the prompt length.

``--write-card`` replaces the integer-golden section of the checkpoint's ``README.md`` (between
``<!-- eval:int -->`` markers) with the table measured here and the command that made it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from mcf.model.checkpoint import RETRIEVAL_DIR  # noqa: E402
from mcf.model.evaluate import MODELS, measure  # noqa: E402

BEGIN, END = "<!-- eval:int -->", "<!-- /eval:int -->"


def card_section(res: dict, n: int, argv: list[str]) -> str:
    """The markdown table of ``res`` between the card's markers."""
    names = {"float": "float reference (`FloatModel`, numpy)",
             "int": "integer golden (`IntModel`: INT4 weights, per-token INT4 KV)",
             "int_channel": "integer golden, per-channel-K INT4 KV (`kv_format=PER_CHANNEL_K`)"}
    rows = [f"| {names[m]} | {L} | {n} | {100 * a.accuracy:.1f} % | "
            f"{', '.join(map(str, a.wrong_seeds)) or '—'} |"
            for m, by in res.items() for L, a in sorted(by.items())]
    cmd = "OMP_NUM_THREADS=1 python scripts/eval_retrieval.py " + " ".join(argv)
    return "\n".join([BEGIN, "Greedy exact-match accuracy of the project's numpy models on "
                      "the same prompts (seeds `0 .. n-1`):", "",
                      "| model | prompt tokens | prompts | accuracy | wrong seeds |",
                      "|---|---|---|---|---|", *rows, "", "    " + cmd, END])


def write_json(res: dict, n: int, path: Path) -> None:
    """Every figure of ``res`` as JSON (``{model: {length: {accuracy, prompts, wrong_seeds,
    seconds_per_prompt}}}``)."""
    import json
    out = {m: {str(L): {"accuracy": a.accuracy, "prompts": a.prompts,
                        "wrong_seeds": list(a.wrong_seeds),
                        "seconds_per_prompt": round(a.seconds_per_prompt, 3)}
               for L, a in sorted(by.items())} for m, by in res.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {path}")


def plot(res: dict, n: int, path: Path) -> None:
    """Accuracy (%) against the prompt length, one line per model (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = {"float": "float reference", "int": "INT4 weights + per-token INT4 KV",
              "int_channel": "INT4 weights + per-channel-K INT4 KV"}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for m, by in res.items():
        xs = sorted(by)
        ax.plot(xs, [100 * by[x].accuracy for x in xs], marker="o", label=labels[m])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel(f"exact-match accuracy, % ({n} prompts)")
    ax.set_title("Passkey retrieval, trained tiny Qwen2 (numpy models)")
    ax.grid(alpha=0.3)
    ax.set_ylim(min(90.0, ax.get_ylim()[0]), 100.5)
    ax.legend(loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=RETRIEVAL_DIR)
    ap.add_argument("--models", nargs="+", choices=tuple(MODELS),
                    default=["float", "int"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--float-lengths", type=int, nargs="+")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=1, help="processes (one per model and length)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--write-card", action="store_true")
    args = ap.parse_args(argv)
    pairs = [(m, L) for m in args.models
             for L in ((args.float_lengths or args.lengths) if m == "float" else args.lengths)]

    def say(a):
        print(f"{a.model} {a.length}: accuracy {a.accuracy:.4f} on {a.prompts} prompts "
              f"({a.seconds_per_prompt:.2f} s per prompt), wrong seeds {list(a.wrong_seeds)}",
              flush=True)

    res = measure(args.checkpoint, pairs, args.n, args.jobs, progress=say)
    if args.json:
        write_json(res, args.n, args.json)
    if args.figure:
        plot(res, args.n, args.figure)
    if args.write_card:
        card = args.checkpoint / "README.md"
        text = card.read_text()
        if BEGIN not in text or END not in text:
            print(f"{card}: no {BEGIN} section", file=sys.stderr)
            return 2
        new = text[:text.index(BEGIN)] + card_section(res, args.n, argv) + \
            text[text.index(END) + len(END):]
        tmp = card.with_name("README.md.part")
        tmp.write_text(new)
        os.replace(tmp, card)
        print(f"updated {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

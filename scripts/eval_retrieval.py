"""Greedy retrieval accuracy of a checkpoint with the project's own numpy models (no torch):
the float reference (:class:`mcf.model.FloatModel`) and the integer golden model
(:class:`mcf.golden.model.IntModel`, INT4 weights and per-token INT4 KV, the arithmetic the RTL
matches;
``int_channel``: the same with the per-channel-K INT4 KV format; ``int_tiled`` /
``int_channel_tiled``: those two with the tiled P8 prefill attention (PREFILL_TILE,
``prefill_mode="tiled"``); ``mars_n2``/``mars_n4``: the
golden model of a cluster run on 2/4 node tops, the bits the RTL equals) on the fixed-seed
prompts of :func:`mcf.model.task.make_prompt` (seeds ``0 .. n-1``); :mod:`mcf.model.evaluate`
measures.

    OMP_NUM_THREADS=1 python scripts/eval_retrieval.py --models float int int_channel \\
        --lengths 256 512 1024 2048 4094 --n 50 --jobs 2 --write-card \\
        --json docs/results/retrieval_accuracy.json --figure docs/figures/retrieval_accuracy.png
    OMP_NUM_THREADS=1 python scripts/eval_retrieval.py --models int_channel_tiled int_tiled \\
        --lengths 256 512 1024 --n 50 --jobs 1 \\
        --json docs/results/retrieval_accuracy.json --figure docs/figures/retrieval_accuracy.png
    OMP_NUM_THREADS=1 python scripts/eval_retrieval.py --models mars_n2 mars_n4 \\
        --lengths 512 --n 50 --jobs 2 --write-card \\
        --json docs/results/retrieval_accuracy.json --figure docs/figures/retrieval_accuracy.png

``--float-lengths`` gives the float reference its own lengths (the integer models take ~20 s
per 4094-token prompt on one core, the float one ~1 s). ``--jobs`` runs the (model, length)
pairs in that many processes. ``--json`` merges every figure measured into the file (a
(model, length) measured again replaces the old one; the commands that made the file are kept
in it), and ``--figure`` and ``--write-card`` then show the whole file, so models run at
different lengths can be measured by separate commands. ``--figure`` plots accuracy against
the prompt length.

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


NAMES = {"float": "float reference (`FloatModel`, numpy)",
         "int": "integer golden (`IntModel`: INT4 weights, per-token INT4 KV)",
         "int_channel": "integer golden, per-channel-K INT4 KV (`kv_format=PER_CHANNEL_K`)",
         "int_tiled": "integer golden, per-token INT4 KV, tiled P8 prefill attention "
                      "(`prefill_mode='tiled'`)",
         "int_channel_tiled": "integer golden, per-channel-K INT4 KV, tiled P8 prefill "
                              "attention (`prefill_mode='tiled'`)",
         "mars_n2": "cluster-run golden, 2 nodes (what the RTL equals bit for bit)",
         "mars_n4": "cluster-run golden, 4 nodes (what the RTL equals bit for bit)"}
LABELS = {"float": "float reference", "int": "INT4 weights + per-token INT4 KV",
          "int_channel": "INT4 weights + per-channel-K INT4 KV",
          "int_tiled": "per-token INT4 KV, tiled P8 prefill",
          "int_channel_tiled": "per-channel-K INT4 KV, tiled P8 prefill",
          "mars_n2": "cluster run's golden, 2 nodes", "mars_n4": "cluster run's golden, 4 nodes"}


def table(res: dict) -> dict:
    """``{model: {length: {accuracy, prompts, wrong_seeds, seconds_per_prompt}}}`` of
    :func:`mcf.model.evaluate.measure`'s result (lengths as strings: the JSON form)."""
    return {m: {str(L): {"accuracy": a.accuracy, "prompts": a.prompts,
                         "wrong_seeds": list(a.wrong_seeds),
                         "seconds_per_prompt": round(a.seconds_per_prompt, 3)}
                for L, a in sorted(by.items())} for m, by in res.items()}


def merge(old: dict, new: dict) -> dict:
    """``old`` with every (model, length) of ``new`` replaced or added, models in
    :data:`MODELS` order, lengths ascending."""
    out = {m: dict(old.get(m, {})) for m in MODELS if m in old or m in new}
    for m, by in new.items():
        out[m].update(by)
    return {m: dict(sorted(by.items(), key=lambda kv: int(kv[0]))) for m, by in out.items()}


def card_section(tab: dict, commands: list[str]) -> str:
    """The markdown table of ``tab`` between the card's markers."""
    rows = [f"| {NAMES[m]} | {L} | {a['prompts']} | {100 * a['accuracy']:.1f} % | "
            f"{', '.join(map(str, a['wrong_seeds'])) or '—'} |"
            for m, by in tab.items() for L, a in by.items()]
    return "\n".join([BEGIN, "Greedy exact-match accuracy of the project's numpy models on "
                      "the same prompts (seeds `0 .. n-1`):", "",
                      "| model | prompt tokens | prompts | accuracy | wrong seeds |",
                      "|---|---|---|---|---|", *rows, "",
                      *("    " + c for c in commands), END])


def plot(tab: dict, path: Path) -> None:
    """Accuracy (%) against the prompt length, one line per model (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    styles = {"int": dict(marker="o", ms=9, lw=3, alpha=0.6),
              "int_channel": dict(marker="x", ms=7, ls="--"),
              "int_tiled": dict(marker="^", ms=8, ls=":", mfc="none"),
              "int_channel_tiled": dict(marker="v", ms=8, ls="-.", mfc="none"),
              "mars_n2": dict(marker="s", ls="none", ms=8, mfc="none"),
              "mars_n4": dict(marker="D", ls="none", ms=11, mfc="none")}
    for m, by in tab.items():
        xs = sorted(by, key=int)
        ax.plot([int(x) for x in xs], [100 * by[x]["accuracy"] for x in xs],
                label=LABELS[m], **styles.get(m, dict(marker="o")))
    n = sorted({a["prompts"] for by in tab.values() for a in by.values()})
    ax.set_xscale("log", base=2)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel(f"exact-match accuracy, % ({'/'.join(map(str, n))} prompts)")
    ax.set_title("Passkey retrieval, trained tiny Qwen2 (numpy models)")
    ax.grid(alpha=0.3)
    ax.set_ylim(min(90.0, ax.get_ylim()[0]), 100.5)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=RETRIEVAL_DIR)
    ap.add_argument("--models", nargs="+", choices=tuple(MODELS),
                    default=["float", "int"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--float-lengths", type=int, nargs="+")
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=1, help="processes (one per model and length)")
    ap.add_argument("--json", type=Path, help="merge the figures into this JSON file")
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--write-card", action="store_true")
    args = ap.parse_args(argv)
    pairs = [(m, L) for m in args.models
             for L in ((args.float_lengths or args.lengths) if m == "float" else args.lengths)]

    def say(a):
        print(f"{a.model} {a.length}: accuracy {a.accuracy:.4f} on {a.prompts} prompts "
              f"({a.seconds_per_prompt:.2f} s per prompt), wrong seeds {list(a.wrong_seeds)}",
              flush=True)

    tab = table(measure(args.checkpoint, pairs, args.n, args.jobs, progress=say))
    command = "OMP_NUM_THREADS=1 python scripts/eval_retrieval.py " + " ".join(argv)
    commands = [command]
    if args.json:
        old = json.loads(args.json.read_text()) if args.json.exists() else {}
        commands = [c for c in old.get("commands", []) if c != command] + commands
        tab = merge(old.get("models", {}), tab)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"commands": commands, "models": tab}, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.figure:
        plot(tab, args.figure)
    if args.write_card:
        card = args.checkpoint / "README.md"
        text = card.read_text()
        if BEGIN not in text or END not in text:
            print(f"{card}: no {BEGIN} section", file=sys.stderr)
            return 2
        new = text[:text.index(BEGIN)] + card_section(tab, commands) + \
            text[text.index(END) + len(END):]
        tmp = card.with_name("README.md.part")
        tmp.write_text(new)
        os.replace(tmp, card)
        print(f"updated {card}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

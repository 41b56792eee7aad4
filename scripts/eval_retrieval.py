"""Greedy retrieval accuracy of a checkpoint with the project's own numpy models (no torch):
the float reference (:class:`mcf.model.FloatModel`) and the integer golden model
(:class:`mcf.model.IntModel`, INT4 weights and per-token INT4 KV, the arithmetic the RTL matches)
on the fixed-seed prompts of :func:`mcf.model.task.make_prompt` (seeds ``0 .. n-1``).

    OMP_NUM_THREADS=1 python scripts/eval_retrieval.py --models float int --lengths 256 512 \\
        --n 50 --write-card

``--write-card`` replaces the integer-golden section of the checkpoint's ``README.md`` (between
``<!-- eval:int -->`` markers) with the table measured here and the command that made it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from mcf.model import FloatModel, IntModel, load_checkpoint, quantize_model  # noqa: E402
from mcf.model.checkpoint import RETRIEVAL_DIR  # noqa: E402
from mcf.model.task import PASSKEY, accuracy, make_prompt  # noqa: E402

BEGIN, END = "<!-- eval:int -->", "<!-- /eval:int -->"


def measure(directory, models, lengths, n: int) -> dict:
    """``{model: {length: (accuracy, seconds per prompt)}}`` and print each line."""
    cfg, tensors = load_checkpoint(directory)
    runners = {}
    if "float" in models:
        fm = FloatModel(cfg, tensors)
        runners["float"] = lambda toks: fm.generate(toks, PASSKEY.value_len).tokens
    if "int" in models:
        im = IntModel(quantize_model(cfg, tensors))
        runners["int"] = lambda toks: im.generate(toks, PASSKEY.value_len).tokens
    out: dict = {}
    for name, run in runners.items():
        for length in lengths:
            ps = [make_prompt(length, s) for s in range(n)]
            t0 = time.monotonic()
            preds = [run(p.tokens) for p in ps]
            dt = (time.monotonic() - t0) / n
            acc = accuracy(preds, [p.answer for p in ps])
            miss = [s for s, (p, q) in enumerate(zip(ps, preds))
                    if not np.array_equal(q, p.answer)]
            out.setdefault(name, {})[length] = (acc, dt, miss)
            print(f"{name} {length}: accuracy {acc:.4f} on {n} prompts "
                  f"({dt:.1f} s per prompt), wrong seeds {miss}", flush=True)
    return out


def card_section(res: dict, n: int, argv: list[str]) -> str:
    """The markdown table of ``res`` between the card's markers."""
    names = {"float": "float reference (`FloatModel`, numpy)",
             "int": "integer golden (`IntModel`: INT4 weights, per-token INT4 KV)"}
    rows = [f"| {names[m]} | {L} | {n} | {100 * a:.1f} % | {', '.join(map(str, miss)) or '—'} |"
            for m, by in res.items() for L, (a, _, miss) in by.items()]
    cmd = "OMP_NUM_THREADS=1 python scripts/eval_retrieval.py " + " ".join(argv)
    return "\n".join([BEGIN, "Greedy exact-match accuracy of the project's numpy models on "
                      "the same prompts (seeds `0 .. n-1`):", "",
                      "| model | prompt tokens | prompts | accuracy | wrong seeds |",
                      "|---|---|---|---|---|", *rows, "", "    " + cmd, END])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=RETRIEVAL_DIR)
    ap.add_argument("--models", nargs="+", choices=("float", "int"), default=["float", "int"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--write-card", action="store_true")
    args = ap.parse_args(argv)
    res = measure(args.checkpoint, args.models, args.lengths, args.n)
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

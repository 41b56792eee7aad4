"""Retrieval accuracy of a checkpoint with the project's own numpy models (issue #17 §3; no
torch): greedy exact match on the fixed-seed prompts of :func:`mcf.model.task.make_prompt`
(seeds ``0 .. n-1``) for

* ``float`` — the float32 reference (:class:`mcf.model.FloatModel`);
* ``int`` — the integer golden model the RTL matches (:class:`mcf.model.IntModel`: INT4
  weights, per-token INT4 KV);
* ``int_channel`` — the same with the per-channel-K INT4 KV format
  (``kv_format=KVFormat.PER_CHANNEL_K``).

On one core a 4094-token prompt takes ~20 s in either integer model and ~1 s in float.
``scripts/eval_retrieval.py`` and ``mcf bench task`` (:mod:`mcf.sim.bench.task`) use this.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..abi.kv_channel import KVFormat
from .checkpoint import load_checkpoint
from .golden import IntModel, quantize_model
from .reference import FloatModel
from .task import PASSKEY, accuracy, make_prompt

__all__ = ["MODELS", "Accuracy", "answerer", "measure_one", "measure"]

MODELS = {"float": None, "int": KVFormat.PER_TOKEN, "int_channel": KVFormat.PER_CHANNEL_K}
"""Model names → the integer model's KV format (``None``: the float reference)."""


@dataclass(frozen=True)
class Accuracy:
    """One model at one prompt length."""
    model: str
    length: int
    prompts: int
    accuracy: float
    seconds_per_prompt: float
    wrong_seeds: tuple[int, ...]


def answerer(directory: Path, model: str):
    """``tokens → greedy answer tokens`` of ``model`` (a name of :data:`MODELS`) on the
    checkpoint in ``directory``."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    cfg, tensors = load_checkpoint(directory)
    if MODELS[model] is None:
        fm = FloatModel(cfg, tensors)
        return lambda toks: fm.generate(toks, PASSKEY.value_len).tokens
    im = IntModel(quantize_model(cfg, tensors), kv_format=MODELS[model])
    return lambda toks: im.generate(toks, PASSKEY.value_len).tokens


def measure_one(directory: Path, model: str, length: int, n: int) -> Accuracy:
    """Accuracy of ``model`` on the prompts of seeds ``0 .. n-1`` at ``length`` tokens."""
    run = answerer(directory, model)
    prompts = [make_prompt(length, s) for s in range(n)]
    t0 = time.monotonic()
    preds = [run(p.tokens) for p in prompts]
    dt = (time.monotonic() - t0) / n
    wrong = tuple(s for s, (p, q) in enumerate(zip(prompts, preds))
                  if not np.array_equal(q, p.answer))
    return Accuracy(model, length, n, accuracy(preds, [p.answer for p in prompts]), dt, wrong)


def measure(directory: Path, pairs: list[tuple[str, int]], n: int, jobs: int = 1,
            progress=None) -> dict[str, dict[int, Accuracy]]:
    """:func:`measure_one` of every ``(model, length)`` pair, in ``jobs`` processes;
    ``progress(acc)`` is called as each finishes. Returns ``{model: {length: Accuracy}}``."""
    for m, _ in pairs:
        if m not in MODELS:
            raise ValueError(f"unknown model {m!r}; known: {', '.join(MODELS)}")
    out: dict[str, dict[int, Accuracy]] = {}
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = [pool.submit(measure_one, directory, m, L, n) for m, L in pairs]
        for f in futs:
            acc = f.result()
            out.setdefault(acc.model, {})[acc.length] = acc
            if progress:
                progress(acc)
    return out

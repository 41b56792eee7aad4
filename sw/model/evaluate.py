"""Retrieval accuracy of a checkpoint with the project's own numpy models (issue #17 §3; no
torch): greedy exact match on the fixed-seed prompts of :func:`mcf.model.task.make_prompt`
(seeds ``0 .. n-1``) for

* ``float`` — the float32 reference (:class:`mcf.model.FloatModel`);
* ``int`` — the integer golden model the RTL matches (:class:`mcf.golden.model.IntModel`: INT4
  weights, per-token INT4 KV);
* ``int_channel`` — the same with the per-channel-K INT4 KV format
  (``kv_format=KVFormat.PER_CHANNEL_K``);
* ``int_tiled``, ``int_channel_tiled`` — ``int`` / ``int_channel`` with the prefill attention a
  node with the tiled path runs (``prefill_mode="tiled"``: ATTEND PREFILL_TILE, P·V in the P8
  format, :func:`mcf.golden.attention_tiled.attend_prefill_tiled`); decode unchanged;
* ``mars_n2``, ``mars_n4`` — the golden model of a cluster run on 2 / 4 node tops
  (:func:`mcf.golden.cluster.golden_run`: MARS prefill in 32-token chunks, decode states merged
  along the chain), whose bits ``mcf run`` checks the RTL against at every step; prompt lengths a
  multiple of 32.

On one core a 4094-token prompt takes ~20 s in either integer model and ~1 s in float.
``scripts/eval_retrieval.py`` and ``mcf bench task`` (:mod:`mcf.sim.perf.task`) use this.
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..abi.kv_channel import KVFormat
from ..golden.model import IntModel, quantize_model
from .checkpoint import load_checkpoint
from .reference import FloatModel
from .task import PASSKEY, accuracy, make_prompt

__all__ = ["MODELS", "INT_MODELS", "CLUSTERS", "Accuracy", "int_model", "answerer",
           "measure_one", "measure"]

INT_MODELS = {
    "int": dict(kv_format=KVFormat.PER_TOKEN, prefill_mode="single"),
    "int_channel": dict(kv_format=KVFormat.PER_CHANNEL_K, prefill_mode="single"),
    "int_tiled": dict(kv_format=KVFormat.PER_TOKEN, prefill_mode="tiled"),
    "int_channel_tiled": dict(kv_format=KVFormat.PER_CHANNEL_K, prefill_mode="tiled"),
}
"""Integer models → their :class:`mcf.golden.model.IntModel` arguments (KV format, prefill mode)."""
CLUSTERS = {"mars_n2": 2, "mars_n4": 4}
"""Cluster-run golden models → their nodes."""
MODELS = ("float", *INT_MODELS, *CLUSTERS)


@dataclass(frozen=True)
class Accuracy:
    """One model at one prompt length."""
    model: str
    length: int
    prompts: int
    accuracy: float
    seconds_per_prompt: float
    wrong_seeds: tuple[int, ...]


def _check(model: str) -> None:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")


def int_model(qm, model: str) -> IntModel:
    """The :class:`mcf.golden.model.IntModel` of the integer model named ``model`` (a name of
    :data:`INT_MODELS`) over the quantised model ``qm``."""
    if model not in INT_MODELS:
        raise ValueError(f"{model!r} is not an integer model; known: {', '.join(INT_MODELS)}")
    return IntModel(qm, **INT_MODELS[model])


def answerer(directory: Path, model: str):
    """``tokens → greedy answer tokens`` of ``model`` (a name of :data:`MODELS`) on the
    checkpoint in ``directory``."""
    _check(model)
    cfg, tensors = load_checkpoint(directory)
    if model == "float":
        fm = FloatModel(cfg, tensors)
        return lambda toks: fm.generate(toks, PASSKEY.value_len).tokens
    if model in CLUSTERS:
        return _cluster_answerer(quantize_model(cfg, tensors), CLUSTERS[model])
    im = int_model(quantize_model(cfg, tensors), model)
    return lambda toks: im.generate(toks, PASSKEY.value_len).tokens


def _cluster_answerer(qm, nodes: int):
    from ..cluster import RunSpec, make_plan
    from ..golden.cluster import golden_run

    def run(toks):
        spec = RunSpec(model="retrieval", prompt_tokens=len(toks), nodes=nodes,
                       decode_tokens=PASSKEY.value_len - 1)
        return np.array(golden_run(qm, make_plan(spec, qm.cfg), toks,
                                   PASSKEY.value_len - 1).tokens)
    return run


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
    for m, _ in pairs:                  # before any process starts
        _check(m)
    out: dict[str, dict[int, Accuracy]] = {}
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = [pool.submit(measure_one, directory, m, L, n) for m, L in pairs]
        for f in futs:
            acc = f.result()
            out.setdefault(acc.model, {})[acc.length] = acc
            if progress:
                progress(acc)
    return out

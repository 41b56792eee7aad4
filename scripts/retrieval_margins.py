"""Answer margins of the `retrieval` checkpoint on chosen passkey prompts, in the project's numpy
models and in ablations of the integer one (docs/evaluation.md, "Retrieval accuracy against the
context length"). The default prompts, seeds 23 and 49 at 4,094 tokens, are the two that both
INT4 KV formats lost with the first checkpoint (trained up to 2,048 tokens).

The margin is the logit of the right answer token minus the best wrong one (float logits; ACT
codes for the integer models): ``m0`` after the prompt (the first answer token), ``m1`` one
decode step later with the right first token fed in (teacher forced). A prompt is answered
right iff both are positive. Rows:

* ``float`` — :class:`mcf.model.FloatModel` on the checkpoint; ``float_w4`` — the same on the
  dequantised INT4 weights (:meth:`mcf.golden.model.QuantModel.dequantized`);
* ``int``, ``int_channel`` — :class:`mcf.golden.model.IntModel` with per-token / per-channel INT4 K
  (``KVFormat.PER_TOKEN`` / ``PER_CHANNEL_K``), the RTL's arithmetic; ``int_channel_exact_fold``
  — ``int_channel`` with each group's folded query exact (:class:`ExactFoldModel`);
  ``int_channel_g8`` — ``int_channel`` with channel-scale groups of 8 tokens instead of
  :data:`mcf.abi.kv.KV_GROUP` (a golden-model parameter only: the RTL's format has 32);
* ``fa_*`` — ablations: the integer model (INT4 weights, integer norms, projections, RoPE, MLP,
  head) with its attention replaced by a float64 softmax on Q, K, V each either as the golden
  model quantises them (Q: INT8 per token and head, :func:`mcf.abi.quant.requantize`; K, V:
  per-token INT4, :func:`mcf.abi.kv.quantize_kv_rows`) or unquantised (the ACT rows).
  ``fa_quant`` quantises all three (only the softmax differs from ``int``); ``fa_act`` none;
  ``fa_k4`` K only; ``fa_kfloat`` everything but K; ``fa_k4_l0h1`` K of KV head 1 of layer 0
  only; ``fa_k4_not_l0h1`` K of every other KV head.

    OMP_NUM_THREADS=1 python scripts/retrieval_margins.py --json docs/results/retrieval_margins.json

(``--seeds 23 49 --tokens 4094`` are the defaults; one process, ~20 s per integer run of a
4,094-token prompt on a free core.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from mcf.abi.fixed import saturate  # noqa: E402
from mcf.abi.kv import KV_SCALE, dequantize, dequantize_q, quantize_kv_rows  # noqa: E402
from mcf.abi.kv_channel import KVFormat  # noqa: E402
from mcf.abi.quant import requantize  # noqa: E402
from mcf.abi.softmax import SCORE, SCORE_FRAC  # noqa: E402
from mcf.golden import attention as golden_attention  # noqa: E402
from mcf.golden.model import IntModel, quantize_model
from mcf.model.checkpoint import RETRIEVAL_DIR, load_checkpoint  # noqa: E402
from mcf.model.reference import FloatModel  # noqa: E402
from mcf.model.task import make_prompt  # noqa: E402
from mcf.quant import from_act, to_act  # noqa: E402

L0H1 = ((0, 1),)


def exact_channel_scores(q, sq, blk):
    """:func:`mcf.golden.attention.channel_scores` with each group's folded query exact: the
    real INT8 query times the group's real K (INT4 codes · channel scales · record ``sk``), in
    float64, rounded to the score format — no requantisation of ``q·s`` to INT8."""
    k = (np.asarray(blk.k, dtype=np.float64) * KV_SCALE.to_float(blk.ks)
         * KV_SCALE.to_float(blk.sk)[:, None])
    t = dequantize_q(q, sq) @ k.T / np.sqrt(k.shape[1]) * np.log2(np.e) * (1 << SCORE_FRAC)
    return saturate(np.rint(t).astype(np.int64), SCORE.width, SCORE.signed)


class ExactFoldModel(IntModel):
    """The per-channel integer model (build with ``kv_format=KVFormat.PER_CHANNEL_K``) scoring
    its groups with :func:`exact_channel_scores` instead of the INT8 folded query
    (:func:`mcf.abi.kv.fold_query`); everything else bit for bit the golden model."""

    def _run(self, tokens, decode: bool):
        saved = golden_attention.channel_scores
        golden_attention.channel_scores = exact_channel_scores
        try:
            return super()._run(tokens, decode)
        finally:
            golden_attention.channel_scores = saved


@dataclass
class FloatAttnModel(IntModel):
    """:class:`IntModel` whose attention is ``softmax(q·k/sqrt(d))·v`` in float64 over the whole
    causal context. ``q``: ``"int8"`` or ``"act"``; ``k``, ``v``: ``"int4"`` or ``"act"``;
    ``k_heads``: the (layer, KV head) pairs whose K is INT4 when ``k == "int4"`` (None: all);
    ``k_invert``: every pair but those."""
    q: str = "int8"
    k: str = "int4"
    v: str = "int4"
    k_heads: tuple | None = None
    k_invert: bool = False

    def reset(self) -> None:
        super().reset()
        n = self.cfg.num_key_value_heads * self.cfg.head_dim
        self.acts = [[np.zeros((0, n), np.int64) for _ in "kv"]      # ACT K, V rows per layer
                     for _ in range(self.cfg.num_hidden_layers)]

    @property
    def length(self) -> int:
        return self.acts[0][0].shape[0]

    def _k_int4(self, layer: int, g: int) -> bool:
        return self.k == "int4" and (self.k_heads is None
                                     or ((layer, g) in self.k_heads) != self.k_invert)

    def _attention(self, layer: int, decode: bool):
        c = self.cfg
        d, heads, kvh = c.head_dim, c.num_attention_heads, c.num_key_value_heads

        def real(a, int4: bool):          # ACT rows [T, d] → float, per-token INT4 if asked
            return dequantize(*quantize_kv_rows(a), KV_SCALE) if int4 else from_act(a)

        def attn(q, k, v, pos):
            st = self.acts[layer]
            st[0], st[1] = np.concatenate([st[0], k]), np.concatenate([st[1], v])
            t, n = q.shape[0], st[0].shape[0]
            qh = q.reshape(t, heads, d)
            if self.q == "int8":
                qc, qm, qe = requantize(qh)
                qf = dequantize_q(qc, np.stack([qm, qe], axis=-1))
            else:
                qf = from_act(qh)
            mask = np.arange(n)[None, :] <= np.asarray(pos)[:, None]
            out = np.empty((t, heads, d))
            for g in range(kvh):
                kf = real(st[0][:, g * d:(g + 1) * d], self._k_int4(layer, g))
                vf = real(st[1][:, g * d:(g + 1) * d], self.v == "int4")
                for h in range(g * heads // kvh, (g + 1) * heads // kvh):
                    s = np.where(mask, qf[:, h] @ kf.T / np.sqrt(d), -np.inf)
                    p = np.exp(s - s.max(axis=1, keepdims=True))
                    out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ vf
            return to_act(out.reshape(t, -1))

        return attn


def rows(cfg, tensors) -> dict:
    """``{name: (description, factory)}`` of every model measured."""
    qm = quantize_model(cfg, tensors)

    def fa(**kw):
        return lambda: FloatAttnModel(qm, **kw)
    return {
        "float": ("float reference", lambda: FloatModel(cfg, tensors)),
        "float_w4": ("float, dequantised INT4 weights",
                     lambda: FloatModel(cfg, qm.dequantized())),
        "int": ("integer golden, per-token INT4 K", lambda: IntModel(qm)),
        "int_channel": ("integer golden, per-channel INT4 K",
                        lambda: IntModel(qm, kv_format=KVFormat.PER_CHANNEL_K)),
        "int_channel_exact_fold": ("per-channel INT4 K, folded query exact",
                                   lambda: ExactFoldModel(qm, kv_format=KVFormat.PER_CHANNEL_K)),
        "int_channel_g8": ("per-channel INT4 K in groups of 8 tokens",
                           lambda: IntModel(qm, kv_format=KVFormat.PER_CHANNEL_K, kv_group=8)),
        "fa_quant": ("int + float softmax (Q8, K4, V4)", fa()),
        "fa_act": ("int + float attention, no Q/K/V quant", fa(q="act", k="act", v="act")),
        "fa_k4": ("int + float attn, K4 only", fa(q="act", v="act")),
        "fa_kfloat": ("int + float attn, Q8 V4, float K", fa(k="act")),
        "fa_k4_l0h1": ("int + float attn, K4 in L0 KV head 1 only",
                       fa(q="act", v="act", k_heads=L0H1)),
        "fa_k4_not_l0h1": ("int + float attn, K4 except L0 KV head 1",
                           fa(q="act", v="act", k_heads=L0H1, k_invert=True)),
    }


def margin(logits, right: int) -> tuple[float, int]:
    """(logit of ``right`` − the best other logit, that other token)."""
    lg = np.asarray(logits, dtype=np.float64)
    other = np.where(np.arange(lg.size) == right, -np.inf, lg)
    j = int(np.argmax(other))
    return float(lg[right] - lg[j]), j


def margins(model, prompt) -> dict:
    """``m0``/``m1`` (and the best wrong tokens ``w0``/``w1``) of ``model`` on ``prompt``."""
    a0, a1 = (int(x) for x in prompt.answer)
    if isinstance(model, FloatModel):
        cache = model.new_cache()
        l0 = model.forward(prompt.tokens, cache)[-1]
        l1 = model.forward([a0], cache)[-1]
    else:
        model.reset()
        l0 = from_act(model.prefill(prompt.tokens)[-1])
        l1 = from_act(model.decode(a0))
    (m0, w0), (m1, w1) = margin(l0, a0), margin(l1, a1)
    return {"m0": round(m0, 3), "w0": w0, "m1": round(m1, 3), "w1": w1}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=RETRIEVAL_DIR)
    ap.add_argument("--seeds", type=int, nargs="+", default=[23, 49])
    ap.add_argument("--tokens", type=int, default=4094)
    ap.add_argument("--rows", nargs="+", help="names of the rows to run (default: all)")
    ap.add_argument("--json", type=Path, help="write the margins to this JSON file")
    args = ap.parse_args(argv)
    cfg, tensors = load_checkpoint(args.checkpoint)
    table = rows(cfg, tensors)
    names = args.rows or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {', '.join(table)}")
    prompts = [make_prompt(args.tokens, s) for s in args.seeds]
    res: dict = {}
    t0 = time.monotonic()
    with tqdm(total=len(names) * len(prompts), desc="margins") as bar:
        for n in names:
            model = table[n][1]()
            for p in prompts:
                bar.set_postfix_str(f"{n} seed {p.seed}")
                res.setdefault(n, {})[str(p.seed)] = margins(model, p)
                bar.update()
    secs = time.monotonic() - t0
    head = "".join(f" | seed {s} m0 | seed {s} m1" for s in args.seeds)
    print(f"\n{args.tokens}-token prompts, margin = right logit − best wrong (✗: answered "
          f"wrong)\n\n| model{head} |\n|---{'|---' * 2 * len(args.seeds)}|")
    for n in names:
        cells = "".join(f" | {r['m0']:+.2f}{'' if r['m0'] > 0 else ' ✗'} | "
                        f"{r['m1']:+.2f}{'' if r['m1'] > 0 else ' ✗'}"
                        for r in res[n].values())
        print(f"| {table[n][0]}{cells} |")
    print(f"\n{secs:.0f} s")
    if args.json:
        cmd = "OMP_NUM_THREADS=1 python scripts/retrieval_margins.py " + " ".join(argv)
        args.json.write_text(json.dumps({"command": cmd, "tokens": args.tokens,
                                         "seconds": round(secs), "rows": res}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

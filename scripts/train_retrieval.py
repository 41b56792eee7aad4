"""Train the ``retrieval`` checkpoint (``sw/model/retrieval/``, issue #17): a tiny Hugging Face
``Qwen2ForCausalLM`` with the node's layer geometry, on the key–value retrieval task of
:mod:`mcf.model.task`, on one CPU core.

Run it in a throwaway venv, never inside the repo and never as a project dependency:

    python3 -m venv /tmp/trainvenv
    /tmp/trainvenv/bin/pip install torch==2.13.0 transformers safetensors numpy \
        amaranth==0.5.10 tqdm
    OMP_NUM_THREADS=1 /tmp/trainvenv/bin/python scripts/train_retrieval.py

* **Model**: :data:`mcf.golden.qwen_layer.TINY` per layer (hidden 128, 4 query / 2 KV heads of
  32, intermediate 256, θ = 10^6, ε = 10^-6; GQA, RoPE, QKV bias, RMSNorm, SwiGLU), ``--layers``
  layers, the task's 256-token vocabulary, tied embeddings, 4096 positions
  (:func:`model_config`).
* **Data**: :func:`mcf.model.task.make_batch` from one ``numpy`` generator seeded ``--seed``;
  sequence lengths drawn log-uniformly (multiples of 16) from ``--min-len`` to a maximum that
  grows linearly from ``--start-len`` to ``--max-len`` over the first ``--ramp`` of the steps; about
  ``--tokens`` tokens per batch; a share ``--adjacent`` of the sequences asks first for a pair
  planted right before the query (``make_batch(adjacent=...)``). Loss: cross-entropy on the
  answer tokens only.
* **Optimiser**: AdamW (β = 0.9, 0.98, weight decay 0.01), ``--lr`` with a linear warm-up of
  ``--warmup`` steps and a cosine decay to 10 % at ``--steps``; gradients clipped at 1. torch's
  seed is ``--seed`` too; one thread.
* **Budget**: training stops at ``--steps`` or after ``--budget-min`` minutes of wall time,
  whichever comes first (the card records which).
* **Output**: ``config.json`` + bf16 ``model.safetensors`` through
  :func:`mcf.model.save_checkpoint`, then the greedy accuracy of the *saved* (bf16) checkpoint,
  reloaded with ``Qwen2ForCausalLM.from_pretrained`` in float32, on ``--eval-n`` prompts
  (:func:`mcf.model.task.make_prompt`, seeds ``0 .. n-1``) per length of ``--eval-lengths``, and
  the model card ``README.md`` (:func:`write_card`). ``--card-from`` redoes just this last
  part for a checkpoint already trained, from ``/tmp/train_retrieval_summary.json`` (written
  after training) or ``/tmp/train_retrieval_log.json`` (written at the end, with the
  evaluation).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from checkout import import_mcf  # scripts/checkout.py (this folder is on sys.path)

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "sw" / "model" / "retrieval"
CARD_EVAL_BEGIN = "<!-- eval:int -->"
CARD_EVAL_END = "<!-- /eval:int -->"


def model_config(layers: int):
    """The :class:`mcf.model.Qwen2Config` of the retrieval model with ``layers`` layers."""
    from mcf.golden.qwen_layer import TINY
    from mcf.model import Qwen2Config
    from mcf.model.task import VOCAB

    return Qwen2Config.from_layer(TINY, layers=layers, vocab=VOCAB.size, tied=True,
                                  max_positions=4096)


def hf_model(cfg, seed: int):
    """A freshly initialised ``Qwen2ForCausalLM`` of ``cfg`` (torch seeded ``seed``)."""
    import torch
    from transformers import Qwen2Config as HFConfig
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    conf = HFConfig(**{k: v for k, v in cfg.to_hf().items() if k != "torch_dtype"})
    conf._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(conf)


def lr_at(step: int, args) -> float:
    """Linear warm-up, then cosine from ``lr`` down to ``lr / 10`` at ``args.steps``."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def length_at(step: int, rng: np.random.Generator, args) -> int:
    """The training length of ``step``: log-uniform in ``[min_len, cap]``, rounded to a multiple
    of 16, the cap growing from ``start_len`` to ``max_len`` over the first ``ramp`` of the
    steps (log-uniform: most batches short and cheap, some as long as the cap)."""
    frac = min(1.0, step / max(1, args.ramp * args.steps))
    cap = args.start_len + frac * (args.max_len - args.start_len)
    length = math.exp(rng.uniform(math.log(args.min_len), math.log(cap)))
    return max(args.min_len, 16 * int(round(length / 16)))


def train(model, args, log) -> dict:
    """The training loop; returns its summary (steps, wall time, why it stopped)."""
    import torch
    from tqdm import tqdm

    from mcf.model.task import IGNORE, PASSKEY, make_batch

    rng = np.random.default_rng(args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                            weight_decay=0.01)
    model.train()
    t0 = time.monotonic()
    stop = "steps"
    ema_loss = ema_acc = None
    seen = 0
    bar = tqdm(range(args.steps), desc="train", unit="step", mininterval=5)
    step = 0
    for step in bar:
        if time.monotonic() - t0 > args.budget_min * 60:
            stop = "budget"
            break
        length = length_at(step, rng, args)
        batch = make_batch(length, max(1, args.tokens // length), rng, PASSKEY,
                           adjacent=args.adjacent)
        x = torch.from_numpy(batch.tokens)
        y = torch.from_numpy(batch.targets)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            m = y != IGNORE
            acc = (logits.argmax(-1)[m] == y[m]).float().mean().item()
        seen += x.numel()
        ema_loss = loss.item() if ema_loss is None else 0.95 * ema_loss + 0.05 * loss.item()
        ema_acc = acc if ema_acc is None else 0.95 * ema_acc + 0.05 * acc
        bar.set_postfix(loss=f"{ema_loss:.3f}", acc=f"{ema_acc:.3f}", len=length,
                        refresh=False)
        if step % args.log_every == 0:
            log.append({"step": step, "len": length, "loss": round(loss.item(), 4),
                        "token_acc": round(acc, 4), "lr": lr_at(step, args),
                        "time_s": round(time.monotonic() - t0, 1)})
    else:
        step = args.steps
    bar.close()
    return {"steps": step, "stopped_by": stop, "tokens": seen,
            "wall_s": round(time.monotonic() - t0, 1),
            "final_ema_loss": ema_loss, "final_ema_token_acc": ema_acc}


def greedy(model, prompts: np.ndarray, k: int) -> np.ndarray:
    """Greedy ``k`` tokens after each row of ``prompts[B, L]`` (KV cache)."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(prompts), use_cache=True)
        toks = [out.logits[:, -1].argmax(-1)]
        for _ in range(k - 1):
            cache = getattr(out, "cache", None) or out.past_key_values
            out = model(input_ids=toks[-1][:, None], cache=cache, use_cache=True)
            toks.append(out.logits[:, -1].argmax(-1))
    return torch.stack(toks, 1).numpy()


def evaluate(directory, lengths, n: int, batch: int = 8) -> dict:
    """Greedy accuracy of the checkpoint in ``directory`` (float32 compute) per prompt length,
    on prompts of seeds ``0 .. n-1``; also the depths of the misses."""
    import torch
    from tqdm import tqdm
    from transformers import Qwen2ForCausalLM

    from mcf.model.task import PASSKEY, accuracy, make_prompt

    model = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                             attn_implementation="sdpa")
    model.eval()
    res = {}
    for length in lengths:
        ps = [make_prompt(length, s) for s in range(n)]
        preds = []
        for i in tqdm(range(0, n, batch), desc=f"eval {length}", mininterval=5):
            toks = np.stack([p.tokens for p in ps[i:i + batch]])
            preds.extend(greedy(model, toks, PASSKEY.value_len))
        acc = accuracy(preds, [p.answer for p in ps])
        miss = [round(p.depth, 3) for p, q in zip(ps, preds) if not np.array_equal(q, p.answer)]
        res[int(length)] = {"n": n, "acc": acc, "miss_depths": miss}
        print(f"length {length}: accuracy {acc:.4f} ({n} prompts)", flush=True)
    return res


def write_card(directory: Path, cfg, args, summary: dict, evals: dict, nbytes: int) -> None:
    """The model card ``README.md``: task, data, training set-up, float accuracy; keeps the
    integer golden section written by ``scripts/eval_retrieval.py`` if there is one."""
    import torch
    import transformers

    from mcf.model.task import PASSKEY, VOCAB, min_length

    card = directory / "README.md"
    keep = ""
    if card.is_file():
        old = card.read_text()
        if CARD_EVAL_BEGIN in old and CARD_EVAL_END in old:
            keep = old[old.index(CARD_EVAL_BEGIN):old.index(CARD_EVAL_END) + len(CARD_EVAL_END)]
    if not keep:
        keep = (f"{CARD_EVAL_BEGIN}\n(not measured yet: `python scripts/eval_retrieval.py "
                f"--write-card`)\n{CARD_EVAL_END}")
    rows = "\n".join(f"| {L} | {e['n']} | {100 * e['acc']:.1f} % | "
                     f"{', '.join(f'{d:.3f}' for d in e['miss_depths']) or '—'} |"
                     for L, e in evals.items())
    p = cfg.to_hf()
    v = VOCAB
    cmd = "OMP_NUM_THREADS=1 /tmp/trainvenv/bin/python scripts/train_retrieval.py " + \
        " ".join(f"--{k.replace('_', '-')} {' '.join(map(str, x)) if isinstance(x, list) else x}"
                 for k, x in sorted(vars(args).items()) if k not in ("out", "card_from"))
    text = f"""# `retrieval` — a tiny Qwen2 trained for long-context key–value retrieval

The checkpoint `mcf run --model retrieval` loads (issue #17): Hugging Face `Qwen2ForCausalLM`,
bf16 safetensors ({nbytes} bytes) + `config.json`, loadable by
`mcf.model.load_checkpoint` and by `transformers`' `from_pretrained`. Made by
`scripts/train_retrieval.py` on one CPU core; do not edit by hand.

## Architecture
{cfg.num_hidden_layers} layers of the node's layer geometry (`mcf.golden.qwen_layer.TINY`):
hidden {cfg.hidden_size}, {cfg.num_attention_heads} query / {cfg.num_key_value_heads} KV heads of
{cfg.head_dim} (GQA), intermediate {cfg.intermediate_size} (SwiGLU), RoPE θ = {p['rope_theta']:g},
RMSNorm ε = {p['rms_norm_eps']:g}, QKV bias, tied embeddings, vocabulary {cfg.vocab_size},
{cfg.max_position_embeddings} positions.

## Task (`mcf.model.task`)
`BOS filler… PUT k v v filler… PUT k v v … filler… ASK k` → the queried key's value tokens,
greedily. {PASSKEY.n_pairs} pairs planted at uniformly random places, key {PASSKEY.key_len}
token, value {PASSKEY.value_len} tokens; the queried pair
is one of them, chosen uniformly, so it can sit anywhere in the context. Token ids: PAD {v.pad},
BOS {v.bos}, PUT {v.put}, ASK {v.ask}, filler [{v.filler[0]}, {v.filler[1]}), keys and values
from the symbols [{v.symbols[0]}, {v.symbols[1]}), all distinct within a prompt
(`mcf.model.task.VOCAB`).
Evaluation prompt `i` of length `L` is `make_prompt(L, seed=i)` (shortest prompt:
{min_length()} tokens); an answer counts when both greedy tokens are right (`score`).

## Training
Training sequences (`make_batch`): the same contexts followed by {PASSKEY.n_pairs} queries with
their answers, loss on the answer tokens only; lengths log-uniform (multiples of 16) from
{args.min_len} up to a cap growing from {args.start_len} to {args.max_len} over the first
{int(100 * args.ramp)} % of the steps, ≈ {args.tokens} tokens per batch; in
{100 * args.adjacent:g} % of the sequences the first query asks for a pair planted right before
it (`PUT k v v ASK k`, which uniform placement makes rare: about one prompt in L − 18 of
L tokens). AdamW
(β 0.9/0.98, weight decay 0.01), learning rate {args.lr:g}, {args.warmup} warm-up steps, cosine
to 10 %, gradient clip 1; data and torch seed {args.seed}; torch {torch.__version__}, transformers
{transformers.__version__}, 1 thread.

Trained {summary['steps']} steps ({summary['tokens']} tokens) in {summary['wall_s'] / 60:.1f} min
of wall time (stopped by {summary['stopped_by']}); last smoothed training loss
{summary['final_ema_loss']:.4f}, answer-token accuracy {summary['final_ema_token_acc']:.4f}.

    {cmd}

## Accuracy in float (this bf16 checkpoint, float32 compute, `transformers`)
Greedy exact-match accuracy on prompts `make_prompt(L, seed)` for seeds `0 .. n-1`
(a prompt of 4094 tokens plus its 2 answer tokens fills the 4096 positions):

| prompt tokens | prompts | accuracy | depth of the queried pair in the missed prompts |
|---|---|---|---|
{rows}

Depth is the queried `PUT`'s position / (L − 1): 0 at the start of the context; the last slot,
`(L − 6) / (L − 1)`, is the pair right before `ASK` with no filler in between.

## Integer golden model (`mcf.golden.model.IntModel`)
{keep}
"""
    tmp = card.with_name("README.md.part")
    tmp.write_text(text)
    os.replace(tmp, card)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=6400)
    ap.add_argument("--budget-min", type=float, default=60.0)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--min-len", type=int, default=48)
    ap.add_argument("--start-len", type=int, default=64)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--ramp", type=float, default=0.5)
    ap.add_argument("--adjacent", type=float, default=0.1)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--eval-lengths", type=int, nargs="+",
                    default=[256, 512, 1024, 2048, 4094])
    ap.add_argument("--eval-n", type=int, default=500)
    ap.add_argument("--card-from", type=Path, metavar="JSON",
                    help="skip training: rewrite the card of the checkpoint in --out from a "
                         "saved summary (evaluating it unless the file holds the evaluation too)")
    args = ap.parse_args(argv)
    import_mcf()
    import torch

    from mcf.model import save_checkpoint

    torch.set_num_threads(1)
    cfg = model_config(args.layers)
    model = hf_model(cfg, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params} parameters, {cfg.num_hidden_layers} layers", flush=True)
    log: list = []
    evals = None
    if args.card_from:
        saved = json.loads(args.card_from.read_text())
        summary = saved.get("summary", saved)
        evals = saved.get("eval")
        log = saved.get("log", [])
    else:
        summary = train(model, args, log)
        print(json.dumps(summary), flush=True)
        tensors = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
        save_checkpoint(args.out, cfg, tensors, dtype="bf16")
        (Path("/tmp") / "train_retrieval_summary.json").write_text(json.dumps(summary))
    if evals is None:
        evals = evaluate(args.out, args.eval_lengths, args.eval_n)
    nbytes = (args.out / "model.safetensors").stat().st_size
    write_card(args.out, cfg, args, summary, evals, nbytes)
    (Path("/tmp") / "train_retrieval_log.json").write_text(
        json.dumps({"summary": summary, "eval": evals, "log": log}, indent=1))
    print(f"wrote {args.out} (model.safetensors {nbytes} bytes); log in "
          "/tmp/train_retrieval_log.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

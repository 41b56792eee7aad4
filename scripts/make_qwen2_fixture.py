"""Make ``tests/fixtures/qwen2_tiny_logits.npz``: Hugging Face ``transformers``' Qwen2 on the
tiny random checkpoint, the reference CI compares :class:`mcf.model.FloatModel` against without
installing torch.

Run it in a throwaway venv, never inside the repo and never as a project dependency:

    python -m venv /tmp/hfvenv
    /tmp/hfvenv/bin/pip install torch==2.13.0 transformers safetensors numpy amaranth==0.5.10
    /tmp/hfvenv/bin/python scripts/make_qwen2_fixture.py

It builds the checkpoint with :func:`mcf.model.random_checkpoint` (``TINY_MODEL``, seed
:data:`mcf.model.checkpoint.TINY_SEED`) and writes it with :func:`mcf.model.save_checkpoint`
as f32 and as bf16 into a temporary directory. It loads each with
``Qwen2ForCausalLM.from_pretrained`` (float32 compute, eager attention) and records, for a
fixed prompt of ``PROMPT_LEN`` tokens, the logits after every prompt token and ``DECODE``
greedy tokens with the logits that chose them (full forward per step, no cache). It first
checks that :func:`mcf.model.checkpoint.to_bf16` rounds every tensor exactly as torch's
``.to(torch.bfloat16)``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from checkout import import_mcf  # scripts/checkout.py (this folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
PROMPT_SEED = 1
PROMPT_LEN = 16
DECODE = 4


def run_hf(directory, prompt, decode):
    import torch
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(directory, dtype=torch.float32,
                                             attn_implementation="eager")
    model.eval()
    ids = [int(t) for t in prompt]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
        prompt_logits = logits.copy()
        toks, steps = [], []
        for _ in range(decode):
            steps.append(logits[-1].copy())
            toks.append(int(np.argmax(logits[-1])))
            logits = model(torch.tensor([ids + toks])).logits[0].float().numpy()
    return prompt_logits, np.array(toks, np.int64), np.array(steps, np.float32)


def check_bf16(tensors) -> None:
    """Our float32 → bf16 rounding (:func:`mcf.model.checkpoint.to_bf16`) equals torch's."""
    import torch

    from mcf.model.checkpoint import to_bf16

    for name, t in tensors.items():
        ours = to_bf16(t)
        theirs = torch.from_numpy(t).to(torch.bfloat16).view(torch.int16).numpy()
        if not np.array_equal(ours.view(np.int16), theirs):
            raise SystemExit(f"bf16 rounding differs from torch on {name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" /
                    "qwen2_tiny_logits.npz")
    args = ap.parse_args(argv)
    import_mcf()
    import torch
    import transformers

    from mcf.model import TINY_MODEL, random_checkpoint, save_checkpoint
    from mcf.model.checkpoint import TINY_SEED as SEED

    cfg = TINY_MODEL
    tensors = random_checkpoint(cfg, SEED)
    check_bf16(tensors)
    prompt = np.random.default_rng(PROMPT_SEED).integers(0, cfg.vocab_size, PROMPT_LEN)
    out = {"seed": np.int64(SEED), "prompt": prompt.astype(np.int64),
           "versions": np.array(f"torch {torch.__version__}, "
                                f"transformers {transformers.__version__}")}
    for dtype in ("f32", "bf16"):
        with tempfile.TemporaryDirectory() as d:
            save_checkpoint(d, cfg, tensors, dtype=dtype)
            pl, toks, steps = run_hf(d, prompt, DECODE)
        out[f"{dtype}_prompt_logits"] = pl.astype(np.float32)
        out[f"{dtype}_tokens"] = toks
        out[f"{dtype}_step_logits"] = steps
        print(f"{dtype}: greedy tokens {toks.tolist()}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

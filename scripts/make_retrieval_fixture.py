"""Make ``tests/fixtures/retrieval_logits.npz``: Hugging Face ``transformers``' Qwen2 on the
committed ``retrieval`` checkpoint (``sw/model/retrieval/``) for a few fixed-seed retrieval
prompts, the reference CI compares :class:`mcf.model.FloatModel` against without torch
(issue #17 §4).

Run it in a throwaway venv, never inside the repo and never as a project dependency:

    python3 -m venv /tmp/trainvenv
    /tmp/trainvenv/bin/pip install torch==2.13.0 transformers safetensors numpy amaranth==0.5.10
    /tmp/trainvenv/bin/python scripts/make_retrieval_fixture.py

For every ``(length, seed)`` of :data:`PROMPTS` it builds the prompt with
:func:`mcf.model.task.make_prompt`, loads the checkpoint with
``Qwen2ForCausalLM.from_pretrained`` (float32 compute, eager attention) and records the greedy
answer tokens (``value_len`` of them, a full forward per step, no cache) and the logits that
chose each of them. It first checks that the checkpoint's config is what
:func:`mcf.model.load_checkpoint` reads and that ``transformers`` sees the same tensors.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from checkout import import_mcf  # scripts/checkout.py (this folder is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ((64, 0), (128, 1), (256, 2), (512, 3), (512, 4), (1024, 5))
"""``(prompt tokens, seed)`` of the fixture's prompts."""


def greedy_hf(model, prompt, k: int):
    """``k`` greedy tokens after ``prompt`` and the logits ``[k, V]`` that chose them."""
    import torch

    ids = [int(t) for t in prompt]
    toks, steps = [], []
    with torch.no_grad():
        for _ in range(k):
            last = model(torch.tensor([ids + toks])).logits[0, -1].float().numpy()
            steps.append(last.copy())
            toks.append(int(np.argmax(last)))
    return np.array(toks, np.int64), np.array(steps, np.float32)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" /
                    "retrieval_logits.npz")
    args = ap.parse_args(argv)
    import_mcf()
    import torch
    import transformers
    from transformers import Qwen2ForCausalLM

    from mcf.model import load_checkpoint
    from mcf.model.checkpoint import RETRIEVAL_DIR, expected_shapes
    from mcf.model.task import PASSKEY, make_prompt, score

    torch.set_num_threads(1)
    cfg, tensors = load_checkpoint(RETRIEVAL_DIR)
    model = Qwen2ForCausalLM.from_pretrained(RETRIEVAL_DIR, dtype=torch.float32,
                                             attn_implementation="eager")
    model.eval()
    state = model.state_dict()
    for name in expected_shapes(cfg):
        if not np.array_equal(state[name].numpy(), tensors[name]):
            raise SystemExit(f"transformers reads {name} differently from load_checkpoint")
    lengths, seeds, prompts, answers, logits = [], [], [], [], []
    for length, seed in PROMPTS:
        p = make_prompt(length, seed)
        toks, steps = greedy_hf(model, p.tokens, PASSKEY.value_len)
        print(f"length {length} seed {seed}: greedy {toks.tolist()}, answer "
              f"{p.answer.tolist()}, {'right' if score(toks, p.answer) else 'WRONG'}")
        lengths.append(length)
        seeds.append(seed)
        prompts.append(p.tokens)
        answers.append(toks)
        logits.append(steps)
    out = {"lengths": np.array(lengths, np.int64), "seeds": np.array(seeds, np.int64),
           "prompt_tokens": np.concatenate(prompts).astype(np.int16),
           "tokens": np.array(answers, np.int64), "logits": np.array(logits, np.float32),
           "versions": np.array(f"torch {torch.__version__}, "
                                f"transformers {transformers.__version__}")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

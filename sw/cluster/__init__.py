"""The cluster (issue #14): one run of a Qwen2 model over N nodes — MARS's chunked prefill, then
KV-stationary decode — and what a run is (:mod:`.spec`); its integer golden model is
:mod:`mcf.golden.cluster`. See docs/cluster.md."""

from __future__ import annotations

from .spec import (
    RUN_POLICIES,
    RUN_TASKS,
    RunError,
    RunSpec,
    make_plan,
    model_spec,
    prompt_tokens,
    run_prompt,
)

__all__ = ["RunSpec", "RunError", "RUN_POLICIES", "make_plan", "model_spec", "prompt_tokens",
           "RUN_TASKS", "run_prompt"]

"""The cluster (issue #14): one run of a Qwen2 model over N nodes — MARS's chunked prefill, then
KV-stationary decode — its integer golden model (:mod:`.golden`) and what a run is
(:mod:`.spec`). See docs/cluster.md."""

from __future__ import annotations

from .golden import (
    ClusterGolden,
    FloatAgreement,
    GoldenRun,
    float_agreement,
    golden_run,
    greedy,
    plan_slices,
)
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

__all__ = ["ClusterGolden", "GoldenRun", "FloatAgreement", "float_agreement", "golden_run",
           "greedy", "plan_slices", "RunSpec", "RunError", "RUN_POLICIES", "make_plan",
           "model_spec", "prompt_tokens", "RUN_TASKS", "run_prompt"]

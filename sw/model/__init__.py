"""A Qwen2 causal LM end to end (issue #14 item 1): configuration (:mod:`.config`), Hugging Face
checkpoints (:mod:`.checkpoint`), the float32 reference forward (:mod:`.reference`) and
Qwen2.5-1.5B at full dimension (:mod:`.qwen`, issue #35); the integer golden forward the RTL
matches bit for bit is :mod:`mcf.golden.model`. See docs/model.md. The
key–value retrieval task of the trained ``retrieval`` checkpoint (issue #17) is :mod:`.task`."""

from __future__ import annotations

from .checkpoint import (
    CheckpointError,
    expected_shapes,
    load_checkpoint,
    model_from_spec,
    random_checkpoint,
    read_config,
    save_checkpoint,
    truncate,
    write_random_checkpoint,
)
from .config import QWEN25_1P5B_MODEL, TINY_MODEL, ConfigError, Qwen2Config, token_ids
from .qwen import QWEN_NAME, random_qwen, resolve_model
from .reference import FloatModel, Generation
from .task import PASSKEY, Prompt, TaskSpec, accuracy, make_batch, make_prompt, score

__all__ = ["Qwen2Config", "ConfigError", "TINY_MODEL", "QWEN25_1P5B_MODEL", "CheckpointError",
           "expected_shapes", "random_checkpoint", "save_checkpoint", "write_random_checkpoint",
           "load_checkpoint", "read_config", "truncate", "model_from_spec", "token_ids",
           "QWEN_NAME", "random_qwen", "resolve_model",
           "FloatModel", "Generation",
           "TaskSpec", "PASSKEY", "Prompt", "make_prompt", "make_batch", "score", "accuracy"]

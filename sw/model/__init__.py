"""A Qwen2 causal LM end to end (issue #14 item 1): configuration (:mod:`.config`), Hugging Face
checkpoints (:mod:`.checkpoint`), the float32 reference forward (:mod:`.reference`) and the
integer golden forward the RTL matches bit for bit (:mod:`.golden`). See docs/model.md. The
key–value retrieval task of the trained ``retrieval`` checkpoint (issue #17) is :mod:`.task`."""

from __future__ import annotations

from .checkpoint import (
    CheckpointError,
    expected_shapes,
    load_checkpoint,
    model_from_spec,
    random_checkpoint,
    save_checkpoint,
)
from .config import TINY_MODEL, ConfigError, Qwen2Config
from .golden import IntGeneration, IntModel, QuantModel, embed_codes, quantize_model
from .reference import FloatModel, Generation
from .task import PASSKEY, Prompt, TaskSpec, accuracy, make_batch, make_prompt, score

__all__ = ["Qwen2Config", "ConfigError", "TINY_MODEL", "CheckpointError", "expected_shapes",
           "random_checkpoint", "save_checkpoint", "load_checkpoint", "model_from_spec",
           "FloatModel", "Generation",
           "QuantModel", "quantize_model", "embed_codes", "IntModel", "IntGeneration",
           "TaskSpec", "PASSKEY", "Prompt", "make_prompt", "make_batch", "score", "accuracy"]

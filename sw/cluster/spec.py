"""What one cluster run is (issue #14 item 2): the model, the prompt, the nodes, MARS's policy,
the decode tokens — checked once, with one clear line per mistake (:class:`RunError`).

The plan is MARS's own (:func:`mcf.mars.plan`) on the KR260 ring of ``nodes`` boards, with the
model's geometry (:func:`model_spec`), the chunk, ``α`` and the per-node KV budget ``S_node``
given; the prompt is drawn from the vocabulary by a fixed seed (:func:`prompt_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..abi.attend import ATTEND_ARG, RUN_SOFTMAX
from ..abi.node_config import NODE_CONFIGS
from ..mars import POLICIES, ClusterSpec, PlanError, make_topology, plan
from ..mars.model import ModelSpec
from ..model import Qwen2Config

__all__ = ["RunSpec", "RunError", "RUN_POLICIES", "RUN_TASKS", "RUN_DECODE", "model_spec",
           "make_plan", "prompt_tokens", "run_prompt"]

RUN_POLICIES = tuple(p for p in POLICIES if p != "pd")
"""Policies a cluster run executes (PD disaggregation has no chunked node program)."""


def _tasks() -> dict:
    from ..model.task import PASSKEY
    return {"passkey": PASSKEY}


RUN_TASKS = _tasks()
"""Tasks a run can pose (``--task``): the key–value retrieval of :mod:`mcf.model.task`, which
the trained ``retrieval`` checkpoint answers."""


RUN_DECODE = ("root", "tp")
"""How a run's decode tokens run (``--decode``): ``root`` — every layer on the token's root, the
other nodes attending over the KV they hold (replicated weights); ``tp`` — tensor-parallel over
the nodes (:mod:`mcf.node.tp_decode`; two nodes, single-pass softmax)."""


class RunError(ValueError):
    """A run that cannot be made as asked (the message is one line for the user)."""


@dataclass(frozen=True)
class RunSpec:
    """One run: ``model`` (``"tiny"`` or a Hugging Face Qwen2 checkpoint directory),
    ``prompt_tokens`` (a multiple of ``chunk``), ``nodes``, ``policy``, ``decode_tokens``,
    ``chunk``, ``alpha`` (eq 15), ``kv_budget`` (``S_node``, bytes), ``seed`` (the prompt and
    the tiny model's weights), ``config`` (the node top's configuration), ``task`` (``None``:
    a random prompt; a :data:`RUN_TASKS` name: that task's prompt, whose answer the first
    generated tokens are scored against), ``softmax`` (:data:`mcf.abi.attend.RUN_SOFTMAX`:
    ``two_phase`` makes every bit of the run independent of ``nodes``), ``decode``
    (:data:`RUN_DECODE`)."""
    model: str = "tiny"
    prompt_tokens: int = 64
    nodes: int = 2
    policy: str = "mars"
    decode_tokens: int = 2
    chunk: int = 32
    alpha: float = 0.5
    kv_budget: int = 1 << 20
    seed: int = 0
    config: str = "sim"
    task: str | None = None
    softmax: str = "single"
    decode: str = "root"

    def __post_init__(self):
        if self.nodes < 1:
            raise RunError(f"--nodes must be at least 1 (got {self.nodes})")
        if self.nodes > 8:
            raise RunError(f"--nodes {self.nodes}: the simulated ring holds at most 8 nodes")
        if self.policy not in RUN_POLICIES:
            raise RunError(f"--policy {self.policy!r}: one of {', '.join(RUN_POLICIES)}")
        if self.chunk < 1 or self.prompt_tokens < 1:
            raise RunError("--prompt-tokens and --chunk must be at least 1")
        if self.prompt_tokens % self.chunk:
            raise RunError(f"--prompt-tokens {self.prompt_tokens} is not a multiple of the "
                           f"chunk {self.chunk}")
        if self.chunk % self.nodes:
            raise RunError(f"--chunk {self.chunk} does not split evenly over {self.nodes} "
                           "nodes")
        if self.decode_tokens < 0:
            raise RunError("--decode-tokens must be at least 0")
        if self.kv_budget < 1:
            raise RunError("--kv-budget must be at least 1 byte")
        if self.softmax not in RUN_SOFTMAX:
            raise RunError(f"--softmax {self.softmax!r}: one of {', '.join(RUN_SOFTMAX)}")
        if self.config not in NODE_CONFIGS:
            raise RunError(f"--config {self.config!r}: one of {', '.join(NODE_CONFIGS)}")
        if self.decode not in RUN_DECODE:
            raise RunError(f"--decode {self.decode!r}: one of {', '.join(RUN_DECODE)}")
        if self.decode == "tp" and self.nodes != 2:
            raise RunError(f"--decode tp runs on 2 nodes, not {self.nodes} (more nodes need "
                           "partial KV heads and each head owner's merge order: not built)")
        if self.decode == "tp" and self.softmax != "single":
            raise RunError("--decode tp runs the single-pass softmax (the two-phase maxima on "
                           "the head owners' trees are not built)")
        block = NODE_CONFIGS[self.config].attn_block     # a slice is one KV block
        if self.chunk // self.nodes > block:
            raise RunError(f"--chunk {self.chunk} over {self.nodes} node(s) gives slices of "
                           f"{self.chunk // self.nodes} tokens; the {self.config} node's KV "
                           f"blocks hold at most {block} (a smaller --chunk or more --nodes)")
        if self.task is not None:
            if self.task not in RUN_TASKS:
                raise RunError(f"--task {self.task!r}: one of {', '.join(RUN_TASKS)}")
            need = RUN_TASKS[self.task].value_len - 1
            if self.decode_tokens < need:
                raise RunError(f"--task {self.task}: the answer has {need + 1} tokens, so "
                               f"--decode-tokens must be at least {need}")


def model_spec(cfg: Qwen2Config, name: str = "model") -> ModelSpec:
    """MARS's view of a Qwen2 configuration."""
    return ModelSpec(name, layers=cfg.num_hidden_layers, q_heads=cfg.num_attention_heads,
                     kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                     hidden=cfg.hidden_size, intermediate=cfg.intermediate_size,
                     vocab=cfg.vocab_size)


def make_plan(spec: RunSpec, cfg: Qwen2Config):
    """MARS's plan of the run on the KR260 ring (raises :class:`RunError`). Decode states are
    reduced along a chain (:mod:`mcf.mars.routes`), so every engine merges at most two states
    and the merged bits do not depend on the order the states arrive in."""
    nodes = spec.nodes
    cl = ClusterSpec(nodes, spec.kv_budget, spec.kv_budget,
                     make_topology("kr260-ring", nodes),
                     reduce_slots=NODE_CONFIGS[spec.config].reduce_slots,
                     node_config=spec.config, decode_reduce="chain")
    try:
        p = plan(model_spec(cfg, spec.model), cl, spec.prompt_tokens, spec.chunk,
                 spec.policy, alpha=spec.alpha)
    except PlanError as exc:
        raise RunError(str(exc)) from None
    from ..node.layer import max_read_set

    field = (1 << ATTEND_ARG["blocks"].shape.width) - 1
    longest, limit = max_read_set(p), min(field, NODE_CONFIGS[spec.config].attn_max_list)
    if longest > limit:
        raise RunError(f"--prompt-tokens {spec.prompt_tokens} in chunks of {spec.chunk} over "
                       f"{nodes} node(s): an ATTEND list of {longest} KV blocks; the "
                       f"{spec.config} node's ATTEND executor takes at most {limit} "
                       f"(a larger --chunk)")
    from ..node.decode import decode_layout
    from .setup import decode_held

    blocks, held = decode_held(p, spec.decode_tokens)
    try:        # the node's directory depth and LAND_OFF table (generate-time sizes)
        decode_layout(p, NODE_CONFIGS[spec.config], decode_blocks=blocks, held=held)
    except ValueError as exc:
        raise RunError(f"--prompt-tokens {spec.prompt_tokens}, --chunk {spec.chunk}, --nodes "
                       f"{nodes}, --decode-tokens {spec.decode_tokens}: {exc}") from None
    return p


def run_prompt(spec: RunSpec, cfg: Qwen2Config) -> tuple[np.ndarray, np.ndarray | None]:
    """The run's prompt and, for a ``task``, the answer the model should generate: a task
    prompt of ``prompt_tokens`` tokens from ``seed`` (:func:`mcf.model.task.make_prompt`),
    else :func:`prompt_tokens` (no answer). Raises :class:`RunError`."""
    if spec.task is None:
        return prompt_tokens(cfg, spec.prompt_tokens, spec.seed), None
    from ..model.task import make_prompt, min_length

    task = RUN_TASKS[spec.task]
    if task.vocab.size > cfg.vocab_size:
        raise RunError(f"--task {spec.task}: its {task.vocab.size} token ids do not fit the "
                       f"model's vocabulary of {cfg.vocab_size}")
    if spec.prompt_tokens < min_length(task):
        raise RunError(f"--task {spec.task}: --prompt-tokens must be at least "
                       f"{min_length(task)}")
    p = make_prompt(spec.prompt_tokens, spec.seed, task)
    return p.tokens, p.answer


def prompt_tokens(cfg: Qwen2Config, n: int, seed: int) -> np.ndarray:
    """``n`` token ids drawn uniformly from the vocabulary (fixed ``seed``)."""
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, n, dtype=np.int64)

"""Hugging Face Qwen2 checkpoints: tensor names, a seeded random checkpoint, and the
``config.json`` + ``*.safetensors`` reader/writer (the ``safetensors`` package, no torch).

* :func:`random_checkpoint` — float32 tensors named exactly as ``Qwen2ForCausalLM``'s state
  dict (``lm_head.weight`` only when the embeddings are not tied), from a fixed seed. Layer
  weights come from :func:`mcf.golden.qwen_layer.random_layer` (``W ~ N(0, 1/K)``, biases
  ``N(0, 0.1²)``, RMSNorm weights ``1 + N(0, 0.1²)``); embeddings are ``N(0, EMBED_STD²)``.
* :func:`save_checkpoint` — ``config.json`` and one ``model.safetensors`` (or shards
  ``model-0000i-of-0000n.safetensors`` + ``model.safetensors.index.json``) in ``bf16`` (round to
  nearest even, as torch's ``.to(bfloat16)``) or ``f32``, with the ``{"format": "pt"}``
  metadata ``transformers`` expects. Files are written beside and renamed into place.
* :func:`load_checkpoint` — reads them back as float32 (F32/F16 through ``safe_open``; BF16,
  which numpy cannot hold, from the file's header offsets: ``bits << 16``). A directory that is
  not a Qwen2 checkpoint, or misses a tensor, or has one of the wrong shape, raises
  :class:`CheckpointError` with one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from mcf.golden.qwen_layer import random_layer

from .config import ConfigError, Qwen2Config

__all__ = ["CheckpointError", "EMBED_STD", "layer_names", "expected_shapes",
           "random_checkpoint", "save_checkpoint", "load_checkpoint", "to_bf16", "from_bf16",
           "layer_weights", "SAFETENSORS_METADATA", "TINY_SEED", "RETRIEVAL_DIR",
           "model_from_spec"]

EMBED_STD = 0.25
"""Standard deviation of the random embedding table: with a unit-RMS final hidden state the
tied lm_head gives logits of standard deviation ≈ ``sqrt(hidden) · EMBED_STD`` (≈ 2.8 for
hidden 128), a peaked but not degenerate next-token distribution."""

SAFETENSORS_METADATA = {"format": "pt"}

_LAYER = {  # mcf.golden.qwen_layer name → HF name under model.layers.{i}.
    "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
    "bq": "self_attn.q_proj.bias", "bk": "self_attn.k_proj.bias", "bv": "self_attn.v_proj.bias",
    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
    "g1": "input_layernorm.weight", "g2": "post_attention_layernorm.weight",
}
EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"
LM_HEAD = "lm_head.weight"


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used (one-line message)."""


def layer_names(i: int) -> dict[str, str]:
    """``{qwen_layer name: HF state-dict name}`` of layer ``i``."""
    return {k: f"model.layers.{i}.{v}" for k, v in _LAYER.items()}


def layer_weights(tensors: dict, i: int) -> dict:
    """Layer ``i``'s tensors under the names :mod:`mcf.golden.qwen_layer` uses."""
    return {k: tensors[v] for k, v in layer_names(i).items()}


def expected_shapes(cfg: Qwen2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``cfg`` must hold, with its shape."""
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nq, nkv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    per = {"q": (nq, h), "k": (nkv, h), "v": (nkv, h), "o": (h, nq), "bq": (nq,),
           "bk": (nkv,), "bv": (nkv,), "gate": (inter, h), "up": (inter, h),
           "down": (h, inter), "g1": (h,), "g2": (h,)}
    out = {EMBED: (cfg.vocab_size, h), NORM: (h,)}
    for i in range(cfg.num_hidden_layers):
        out.update({layer_names(i)[k]: s for k, s in per.items()})
    if not cfg.tie_word_embeddings:
        out[LM_HEAD] = (cfg.vocab_size, h)
    return out


def random_checkpoint(cfg: Qwen2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """A float32 checkpoint of ``cfg`` from ``seed`` (same seed, same bits)."""
    rng = np.random.default_rng(seed)
    lay = cfg.layer
    out = {EMBED: (EMBED_STD * rng.standard_normal((cfg.vocab_size, cfg.hidden_size)))
           .astype(np.float32)}
    for i in range(cfg.num_hidden_layers):
        w = random_layer(lay, seed=int(rng.integers(1 << 31)))
        out.update({layer_names(i)[k]: v for k, v in w.items()})
    out[NORM] = (1 + 0.1 * rng.standard_normal(cfg.hidden_size)).astype(np.float32)
    if not cfg.tie_word_embeddings:
        out[LM_HEAD] = (EMBED_STD * rng.standard_normal((cfg.vocab_size, cfg.hidden_size))
                        ).astype(np.float32)
    return out


# --- bf16 -------------------------------------------------------------------------------------

def to_bf16(x) -> np.ndarray:
    """float32 → bf16 bit patterns (uint16), round to nearest, ties to even."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        raise CheckpointError("cannot store non-finite values as bf16")
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def from_bf16(bits) -> np.ndarray:
    """bf16 bit patterns → float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# --- writing ----------------------------------------------------------------------------------

_DTYPES = {"bf16": "bfloat16", "f32": "float32"}


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    from safetensors import TensorSpec, serialize_file

    keep, specs = [], {}
    for name, t in tensors.items():
        t = np.asarray(t, dtype=np.float32)
        a = to_bf16(t).astype("<u2") if dtype == "bf16" else np.ascontiguousarray(t, "<f4")
        keep.append(a)
        specs[name] = TensorSpec(dtype=_DTYPES[dtype], shape=list(t.shape),
                                 data_ptr=a.ctypes.data, data_len=a.nbytes)
    tmp = path.with_name(path.name + ".part")
    serialize_file(specs, str(tmp), metadata=SAFETENSORS_METADATA)
    os.replace(tmp, path)
    del keep


def _write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def save_checkpoint(directory, cfg: Qwen2Config, tensors: dict[str, np.ndarray],
                    dtype: str = "bf16", shard_bytes: int | None = None) -> list[Path]:
    """Write ``cfg`` and ``tensors`` as a Hugging Face checkpoint; returns the files written.
    ``shard_bytes``: start a new shard once one holds this many bytes (None: one file).
    Tied checkpoints omit ``lm_head.weight`` (as ``save_pretrained`` does)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    shapes = expected_shapes(cfg)
    _check(shapes, tensors)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    names = list(shapes)
    width = 2 if dtype == "bf16" else 4
    shards: list[list[str]] = [[]]
    size = 0
    for n in names:
        nbytes = int(np.prod(shapes[n])) * width
        if shard_bytes is not None and shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(n)
        size += nbytes
    written = []
    if len(shards) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                 for i in range(len(shards))]
    for f, part in zip(files, shards):
        _write_safetensors(d / f, {n: tensors[n] for n in part}, dtype)
        written.append(d / f)
    if len(shards) > 1:
        total = sum(int(np.prod(shapes[n])) * width for n in names)
        index = {"metadata": {"total_size": total},
                 "weight_map": {n: f for f, part in zip(files, shards) for n in part}}
        _write_json(d / "model.safetensors.index.json", index)
        written.append(d / "model.safetensors.index.json")
    conf = cfg.to_hf()
    conf["torch_dtype"] = _DTYPES[dtype]
    _write_json(d / "config.json", conf)
    written.append(d / "config.json")
    return written


# --- reading ----------------------------------------------------------------------------------

def _check(shapes: dict, tensors: dict) -> None:
    missing = [n for n in shapes if n not in tensors]
    if missing:
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint lacks tensor {missing[0]}{more}")
    for n, s in shapes.items():
        if tuple(np.shape(tensors[n])) != tuple(s):
            raise CheckpointError(f"tensor {n} has shape {tuple(np.shape(tensors[n]))}, "
                                  f"expected {tuple(s)}")


def _header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def _read_file(path: Path, want: set[str]) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError, safe_open

    out: dict[str, np.ndarray] = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            keys = [k for k in f.keys() if k in want]  # noqa: SIM118 (not a dict)
            bf16 = []
            for k in keys:
                if f.get_slice(k).get_dtype() == "BF16":
                    bf16.append(k)
                else:
                    out[k] = np.asarray(f.get_tensor(k), dtype=np.float32)
    except SafetensorError as e:
        raise CheckpointError(f"{path.name}: {e}") from None
    if bf16:
        header, base = _header(path)
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        for k in bf16:
            lo, hi = header[k]["data_offsets"]
            bits = raw[base + lo: base + hi].view("<u2").reshape(header[k]["shape"])
            out[k] = from_bf16(bits)
        del raw
    return out


def load_checkpoint(directory) -> tuple[Qwen2Config, dict[str, np.ndarray]]:
    """Read a Hugging Face Qwen2 checkpoint directory → (config, float32 tensors by HF name).
    Extra tensors are ignored; a tied checkpoint's ``lm_head.weight``, if present, too."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"{d}: not a directory")
    conf = d / "config.json"
    if not conf.is_file():
        raise CheckpointError(f"{d}: no config.json")
    try:
        cfg = Qwen2Config.from_hf(json.loads(conf.read_text()))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{conf}: not JSON ({e.msg})") from None
    except ConfigError as e:
        raise CheckpointError(f"{conf}: {e}") from None
    shapes = expected_shapes(cfg)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        wmap = json.loads(index.read_text()).get("weight_map", {})
        files = sorted({d / f for n, f in wmap.items() if n in shapes})
    else:
        files = sorted(d.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{d}: no *.safetensors files")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{d}: index names a missing file {f.name}")
        tensors.update(_read_file(f, set(shapes)))
    _check(shapes, tensors)
    return cfg, tensors


TINY_SEED = 0
"""The seed of the ``tiny`` model named on command lines (the fixture's seed too)."""


RETRIEVAL_DIR = Path(__file__).resolve().parent / "retrieval"
"""The trained ``retrieval`` checkpoint shipped with the package (issue #17: a tiny Qwen2 for
the key–value retrieval task of :mod:`mcf.model.task`; its model card is the README there)."""


def model_from_spec(spec: str, seed: int = TINY_SEED) -> tuple[Qwen2Config, dict]:
    """``"tiny"`` → (:data:`mcf.model.TINY_MODEL`, :func:`random_checkpoint` of ``seed``);
    ``"retrieval"`` → the shipped checkpoint :data:`RETRIEVAL_DIR` (``seed`` unused);
    anything else is a checkpoint directory for :func:`load_checkpoint`."""
    from .config import TINY_MODEL

    if spec == "tiny":
        return TINY_MODEL, random_checkpoint(TINY_MODEL, seed)
    if spec == "retrieval":
        return load_checkpoint(RETRIEVAL_DIR)
    return load_checkpoint(spec)

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
  :func:`write_random_checkpoint` streams :func:`random_checkpoint`'s tensors part by part
  (the embedding, then one shard per layer), so a model of any size is written in the memory of
  its largest tensor, and may stop after its first layers.
* :func:`load_checkpoint` — reads them back as float32 (F32/F16 through ``safe_open``; BF16,
  which numpy cannot hold, from the file's header offsets: ``bits << 16``); ``layers=K`` reads
  the first ``K`` layers only and returns the model truncated to them. A directory that is
  not a Qwen2 checkpoint (:class:`ConfigError`, naming the field), or misses a tensor, or has
  one of the wrong shape, or a file that is not what its name says, raises
  :class:`CheckpointError` with one line.
* :func:`model_from_spec` — a model named on a command line: ``tiny``, ``retrieval``,
  ``qwen2.5-1.5b`` (:mod:`.qwen`) or a checkpoint directory, optionally ``SPEC:layers=K``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from mcf.golden.qwen_layer import random_layer

from .config import CheckpointError, ConfigError, Qwen2Config

__all__ = ["CheckpointError", "EMBED_STD", "layer_names", "expected_shapes",
           "random_checkpoint", "random_parts", "save_checkpoint", "write_random_checkpoint",
           "load_checkpoint", "to_bf16", "from_bf16", "layer_weights", "truncate",
           "SAFETENSORS_METADATA", "TINY_SEED", "RETRIEVAL_DIR", "model_from_spec",
           "split_spec", "join_spec"]

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


def random_parts(cfg: Qwen2Config, seed: int = 0, layers: int | None = None,
                 first: int = 0) -> Iterator[tuple[int | None, dict[str, np.ndarray]]]:
    """:func:`random_checkpoint` part by part: ``(None, {embedding, final norm, lm_head when
    untied})``, then ``(i, {layer i's tensors})`` for layers ``first .. layers - 1`` (default:
    to the last). Every tensor has the bits :func:`random_checkpoint` gives it: the layers'
    seeds are drawn in order whether or not the layers are made."""
    rng = np.random.default_rng(seed)
    shape = (cfg.vocab_size, cfg.hidden_size)
    embed = rng.standard_normal(shape)
    embed *= EMBED_STD
    embed = embed.astype(np.float32)
    seeds = [int(rng.integers(1 << 31)) for _ in range(cfg.num_hidden_layers)]
    head = {NORM: (1 + 0.1 * rng.standard_normal(cfg.hidden_size)).astype(np.float32)}
    if not cfg.tie_word_embeddings:
        head[LM_HEAD] = (EMBED_STD * rng.standard_normal(shape)).astype(np.float32)
    yield None, {EMBED: embed, **head}
    del embed, head
    n = cfg.num_hidden_layers if layers is None else cfg.truncated(layers).num_hidden_layers
    lay = cfg.layer
    for i in range(first, n):
        w = random_layer(lay, seed=seeds[i])
        yield i, {layer_names(i)[k]: v for k, v in w.items()}


def random_checkpoint(cfg: Qwen2Config, seed: int = 0) -> dict[str, np.ndarray]:
    """A float32 checkpoint of ``cfg`` from ``seed`` (same seed, same bits). Layer weights from
    :func:`mcf.golden.qwen_layer.random_layer` with seeds drawn after the embedding, then the
    final norm and (untied) the lm_head."""
    out: dict[str, np.ndarray] = {}
    for _, part in random_parts(cfg, seed):
        out.update(part)
    return out


def truncate(cfg: Qwen2Config, tensors: dict, layers: int | None
             ) -> tuple[Qwen2Config, dict[str, np.ndarray]]:
    """The model cut to its first ``layers`` layers (``None``: unchanged): the embedding,
    those layers, the final norm and the lm_head — the same forward with the later layers
    left out."""
    if layers is None:
        return cfg, tensors
    try:
        short = cfg.truncated(layers)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    return short, {n: tensors[n] for n in expected_shapes(short)}


# --- bf16 -------------------------------------------------------------------------------------

def to_bf16(x) -> np.ndarray:
    """float32 → bf16 bit patterns (uint16), round to nearest, ties to even."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.shape, np.uint16)
    flat, dst = x.reshape(-1).view(np.uint32), out.reshape(-1)
    step = 1 << 20          # in slices: a few MB of temporaries, not 4x the tensor
    for lo in range(0, flat.size, step):
        u = flat[lo:lo + step]
        if np.any((u & 0x7F800000) == 0x7F800000):
            raise CheckpointError("cannot store non-finite values as bf16")
        # finite: |u| <= 0x7F7FFFFF, so the sum stays below 2^32
        dst[lo:lo + step] = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    return out


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


RANDOM_SEED_KEY = "mcf_random_seed"
"""Key of the index metadata that records the seed of a :func:`write_random_checkpoint`."""


def _part_file(i: int | None) -> str:
    return "model-embed.safetensors" if i is None else f"model-layer-{i:03d}.safetensors"


def write_random_checkpoint(directory, cfg: Qwen2Config, seed: int = 0,
                            layers: int | None = None, dtype: str = "bf16",
                            progress: Callable[[str], None] | None = None) -> list[Path]:
    """Write :func:`random_checkpoint` ``(cfg, seed)`` as a Hugging Face checkpoint, one
    tensor group at a time: ``model-embed.safetensors`` (embedding, final norm, lm_head when
    untied), ``model-layer-NNN.safetensors`` per layer, ``model.safetensors.index.json`` (its
    metadata records the seed) and ``config.json`` (``cfg`` whole, even when ``layers`` stops
    early: such a checkpoint loads with ``load_checkpoint(dir, layers=K)``, K ≤ ``layers``).
    Memory: the largest tensor a few times over, not the model. A directory already holding
    this ``cfg`` and ``seed`` keeps its parts and gets only the missing layers, so asking for
    more layers later extends it (and one that holds them all is left untouched: nothing is
    drawn). ``progress(message)`` is called before each part. Returns the files written now
    (none when nothing was missing)."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    n = cfg.num_hidden_layers if layers is None else cfg.truncated(layers).num_hidden_layers
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    index, conf = d / "model.safetensors.index.json", cfg.to_hf()
    conf["torch_dtype"] = _DTYPES[dtype]
    wmap: dict[str, str] = {}
    if index.is_file() and (d / "config.json").is_file():
        old = _read_json(index, "the shard index")
        same = _read_json(d / "config.json", "config.json") == conf
        if same and isinstance(old, dict) and \
                old.get("metadata", {}).get(RANDOM_SEED_KEY) == seed:
            wmap = {k: f for k, f in old.get("weight_map", {}).items() if (d / f).is_file()}
    width = 2 if dtype == "bf16" else 4
    written: list[Path] = []
    have = _layers_held(wmap, cfg)
    head = [k for k in expected_shapes(cfg.truncated(1)) if not k.startswith("model.layers.")]
    if have >= n and all(wmap.get(k) == _part_file(None) for k in head):
        return written                  # nothing missing: no tensor drawn
    if progress:
        progress(f"drawing {cfg.num_hidden_layers}-layer model weights from seed {seed} for "
                 f"layers {have}..{n - 1} of {d}")
    for i, part in random_parts(cfg, seed, n, first=have):
        f = _part_file(i)
        if all(wmap.get(k) == f for k in part):
            continue
        if progress:
            mib = sum(v.size for v in part.values()) * width / 2**20
            what = "the embedding" if i is None else f"layer {i} ({i + 1} of {n})"
            progress(f"writing {what}, {mib:.0f} MiB, to {d / f}")
        _write_safetensors(d / f, part, dtype)
        wmap.update({k: f for k in part})
        written.append(d / f)
    shapes = expected_shapes(cfg)
    total = sum(int(np.prod(shapes[k])) * width for k in wmap)
    _write_json(index, {"metadata": {"total_size": total, RANDOM_SEED_KEY: seed},
                        "weight_map": dict(sorted(wmap.items()))})
    _write_json(d / "config.json", conf)
    return written + [index, d / "config.json"]


# --- reading ----------------------------------------------------------------------------------

def _check(shapes: dict, tensors: dict, hint: str = "") -> None:
    missing = [n for n in shapes if n not in tensors]
    if missing:
        more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"checkpoint lacks tensor {missing[0]}{more}{hint}")
    for n, s in shapes.items():
        if tuple(np.shape(tensors[n])) != tuple(s):
            raise CheckpointError(f"tensor {n} has shape {tuple(np.shape(tensors[n]))}, "
                                  f"expected {tuple(s)}")


def _header(path: Path) -> tuple[dict, int]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n)), 8 + n


def _read_json(path: Path, what: str):
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        msg = e.msg if isinstance(e, json.JSONDecodeError) else "not UTF-8 text"
        raise CheckpointError(f"{path}: {what} is not JSON ({msg})") from None
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read {what} ({e.strerror})") from None


def _weight_map(index: Path) -> dict[str, str]:
    d = _read_json(index, "the shard index")
    wmap = d.get("weight_map") if isinstance(d, dict) else None
    if not isinstance(wmap, dict) or not all(isinstance(f, str) for f in wmap.values()):
        raise CheckpointError(f"{index}: no weight_map of tensor name -> file name")
    for f in set(wmap.values()):
        if Path(f).name != f:
            raise CheckpointError(f"{index}: weight_map names {f!r}, not a file of the "
                                  "checkpoint's folder")
    return wmap


def _layers_held(tensors: dict, cfg: Qwen2Config) -> int:
    """How many leading layers ``tensors`` holds completely."""
    n = 0
    while n < cfg.num_hidden_layers and all(v in tensors for v in layer_names(n).values()):
        n += 1
    return n


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


def read_config(directory) -> Qwen2Config:
    """The :class:`Qwen2Config` of a checkpoint directory's ``config.json`` (raises
    :class:`ConfigError` / :class:`CheckpointError`, one line naming the file)."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"{d}: not a directory")
    conf = d / "config.json"
    if not conf.is_file():
        raise CheckpointError(f"{d}: no config.json")
    try:
        return Qwen2Config.from_hf(_read_json(conf, "config.json"))
    except ConfigError as e:
        raise ConfigError(f"{conf}: {e}") from None


def load_checkpoint(directory, layers: int | None = None
                    ) -> tuple[Qwen2Config, dict[str, np.ndarray]]:
    """Read a Hugging Face Qwen2 checkpoint directory → (config, float32 tensors by HF name).
    ``layers``: read only the first ``layers`` layers and return the truncated model
    (:func:`truncate`); a checkpoint that holds only its first layers' tensors (as
    :func:`write_random_checkpoint` may write) loads this way. Extra tensors are ignored; a
    tied checkpoint's ``lm_head.weight``, if present, too."""
    d = Path(directory)
    full = read_config(d)
    try:
        cfg = full if layers is None else full.truncated(layers)
    except ConfigError as e:
        raise CheckpointError(f"{d}: {e}") from None
    shapes = expected_shapes(cfg)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        wmap = _weight_map(index)
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
    held = _layers_held(tensors, cfg)
    hint = "" if held in (0, cfg.num_hidden_layers) else \
        f"; it holds the first {held} of {full.num_hidden_layers} layers (--layers {held} or less)"
    _check(shapes, tensors, hint)
    return cfg, tensors


TINY_SEED = 0
"""The seed of the ``tiny`` model named on command lines (the fixture's seed too)."""


RETRIEVAL_DIR = Path(__file__).resolve().parent / "retrieval"
"""The trained ``retrieval`` checkpoint shipped with the package (issue #17: a tiny Qwen2 for
the key–value retrieval task of :mod:`mcf.model.task`; its model card is the README there)."""


_LAYERS_SUFFIX = re.compile(r"^(?P<base>.+):layers=(?P<k>[0-9]+)$")


def split_spec(spec: str) -> tuple[str, int | None]:
    """``"SPEC:layers=K"`` → ``("SPEC", K)``; a spec without the suffix → ``(spec, None)``."""
    m = _LAYERS_SUFFIX.match(str(spec))
    return (m["base"], int(m["k"])) if m else (str(spec), None)


def join_spec(base: str, layers: int | None) -> str:
    """The inverse of :func:`split_spec`: the one string a run's spec carries to every
    process that loads the model."""
    return str(base) if layers is None else f"{base}:layers={int(layers)}"


def model_from_spec(spec: str, seed: int = TINY_SEED,
                    progress: Callable[[str], None] | None = None
                    ) -> tuple[Qwen2Config, dict]:
    """``"tiny"`` → (:data:`mcf.model.TINY_MODEL`, :func:`random_checkpoint` of ``seed``);
    ``"retrieval"`` → the shipped checkpoint :data:`RETRIEVAL_DIR` (``seed`` unused);
    ``"qwen2.5-1.5b"`` → the random-weight Qwen2.5-1.5B checkpoint in the build folder
    (:func:`mcf.model.qwen.random_qwen`, written on first use, ``progress`` told);
    anything else is a checkpoint directory for :func:`load_checkpoint`. A ``:layers=K``
    suffix truncates the model to its first ``K`` layers (:func:`truncate`)."""
    from .config import TINY_MODEL
    from .qwen import QWEN_NAME, random_qwen

    base, layers = split_spec(spec)
    if base == "tiny":
        return truncate(TINY_MODEL, random_checkpoint(TINY_MODEL, seed), layers)
    if base == "retrieval":
        return load_checkpoint(RETRIEVAL_DIR, layers)
    if base == QWEN_NAME:
        made = random_qwen(layers) if progress is None else random_qwen(layers,
                                                                          progress=progress)
        return load_checkpoint(made, layers)
    return load_checkpoint(base, layers)

"""The checkpoint loader's Hugging Face semantics (issue #36): config.json variants written to a
folder beside a real tiny checkpoint and read by ``load_checkpoint``. Values ``transformers``
derives are derived the same way; what the float and integer models do not implement, or a
field of the wrong type, is refused with one ``ConfigError`` line naming the field — never a
traceback of another class, never a silent change of the forward. Token ids outside the
vocabulary are refused by both models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mcf.golden.model import IntModel, quantize_model
from mcf.model import (
    TINY_MODEL,
    CheckpointError,
    ConfigError,
    FloatModel,
    Qwen2Config,
    load_checkpoint,
    random_checkpoint,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("tiny")
    save_checkpoint(d, TINY_MODEL, random_checkpoint(TINY_MODEL, 0), dtype="bf16")
    return d


def _with_config(ckpt: Path, tmp: Path, change: dict | None = None, raw=None) -> Path:
    """A folder with ``ckpt``'s weights and its config.json changed (``None`` deletes a key)
    or replaced by ``raw`` (a JSON value, or a string written as is)."""
    for f in ckpt.iterdir():
        if f.suffix == ".safetensors":
            (tmp / f.name).symlink_to(f)
    if raw is not None:
        text = raw if isinstance(raw, str) else json.dumps(raw)
    else:
        d = json.loads((ckpt / "config.json").read_text())
        for k, v in (change or {}).items():
            if v is _DEL:
                d.pop(k, None)
            else:
                d[k] = v
        text = json.dumps(d)
    (tmp / "config.json").write_text(text)
    return tmp


_DEL = object()

# (change to the tiny config.json, the field the one-line message must name)
REFUSED = [
    # RoPE scaling, old and new spellings, and a scaling that is not an object
    ({"rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "rope_scaling"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                       "original_max_position_embeddings": 32768}}, "rope_scaling"),
    ({"rope_theta": _DEL, "rope_parameters": {"rope_type": "linear", "factor": 4,
                                              "rope_theta": 1e6}}, "rope_parameters"),
    ({"rope_parameters": {"full_attention": {"rope_type": "llama3", "factor": 8.0}}},
     "rope_parameters.full_attention"),
    ({"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"rope_scaling": "linear"}, "rope_scaling"),
    ({"rope_parameters": [1e6]}, "rope_parameters"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "rope_theta"),
    ({"rope_theta": "1e6"}, "rope_theta"),
    ({"rope_theta": -1.0}, "rope_theta"),
    # activation
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act"),
    ({"hidden_act": None}, "hidden_act"),
    # sliding windows, by transformers' own fields
    ({"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0},
     "use_sliding_window"),
    ({"use_sliding_window": True}, "use_sliding_window"),         # window defaults to 4096
    ({"use_sliding_window": "yes"}, "use_sliding_window"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "layer_types"),
    ({"layer_types": "full_attention"}, "layer_types"),
    # a pre-quantised checkpoint
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, "quantization_config"),
    # wrong types
    ({"num_key_value_heads": "two"}, "num_key_value_heads"),
    ({"num_key_value_heads": 2.0}, "num_key_value_heads"),
    ({"num_key_value_heads": True}, "num_key_value_heads"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"hidden_size": "128"}, "hidden_size"),
    ({"num_hidden_layers": [2]}, "num_hidden_layers"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"intermediate_size": 256.5}, "intermediate_size"),
    ({"vocab_size": -1}, "vocab_size"),
    ({"num_attention_heads": 0}, "num_attention_heads"),
    ({"head_dim": 64}, "head_dim"),
    ({"head_dim": "32"}, "head_dim"),
    ({"rms_norm_eps": "1e-6"}, "rms_norm_eps"),
    ({"rms_norm_eps": 0}, "rms_norm_eps"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
    ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
    ({"max_position_embeddings": "4096"}, "max_position_embeddings"),
    ({"architectures": "Qwen2ForCausalLM"}, "architectures"),
    ({"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, "Qwen2"),
    ({"model_type": "qwen2", "architectures": ["Qwen2ForSequenceClassification"]}, "Qwen2"),
    ({"model_type": _DEL, "architectures": _DEL}, "Qwen2"),
    ({"hidden_size": _DEL}, "hidden_size"),
    ({"vocab_size": None}, "vocab_size"),
]


@pytest.mark.parametrize("change, field", REFUSED,
                         ids=[f"{i}-{f}" for i, (_, f) in enumerate(REFUSED)])
def test_refused_by_name(ckpt, tmp_path, change, field):
    d = _with_config(ckpt, tmp_path, change)
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(d)
    msg = str(exc.value)
    assert field in msg and "\n" not in msg, msg
    assert isinstance(exc.value, CheckpointError)     # one class for the CLI to catch
    with pytest.raises(ConfigError):                  # the parser alone says the same
        Qwen2Config.from_hf(json.loads((d / "config.json").read_text()))


# (config.json text or JSON value, what the message says): never another exception class
BAD_FILES = [
    ([TINY_MODEL.to_hf()], "JSON object"),
    ("null", "JSON object"),
    ('"qwen2"', "JSON object"),
    ("{", "not JSON"),
    ("", "not JSON"),
    ("\udcff", "not JSON"),
]


@pytest.mark.parametrize("raw, msg", BAD_FILES)
def test_bad_config_files(ckpt, tmp_path, raw, msg):
    if raw == "\udcff":
        for f in ckpt.iterdir():
            if f.suffix == ".safetensors":
                (tmp_path / f.name).symlink_to(f)
        (tmp_path / "config.json").write_bytes(b"\xff\xfe{")
    else:
        _with_config(ckpt, tmp_path, raw=raw)
    with pytest.raises(CheckpointError, match=msg) as exc:
        load_checkpoint(tmp_path)
    assert "config.json" in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("index, msg", [
    ("{not json", "not JSON"),
    ("[]", "weight_map"),
    ('{"weight_map": ["model.safetensors"]}', "weight_map"),
    ('{"weight_map": {"model.norm.weight": 3}}', "weight_map"),
    ('{"weight_map": {"model.norm.weight": "../model.safetensors"}}', "not a file"),
    ('{"weight_map": {"model.norm.weight": "gone.safetensors"}}', "missing file gone"),
])
def test_bad_shard_index(ckpt, tmp_path, index, msg):
    _with_config(ckpt, tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(index)
    with pytest.raises(CheckpointError, match=msg):
        load_checkpoint(tmp_path)


def _hf(change: dict) -> Qwen2Config:
    d = TINY_MODEL.to_hf()
    for k, v in change.items():
        if v is _DEL:
            d.pop(k, None)
        else:
            d[k] = v
    return Qwen2Config.from_hf(d)


def test_hf_semantics_of_missing_and_null_fields():
    # num_key_value_heads null or missing: transformers' "same as the attention heads"
    for change in ({"num_key_value_heads": None}, {"num_key_value_heads": _DEL}):
        cfg = _hf(change)
        assert cfg.num_key_value_heads == cfg.num_attention_heads == 4
    # head_dim null or missing: hidden_size / heads
    assert _hf({"head_dim": None}).head_dim == _hf({"head_dim": _DEL}).head_dim == 32
    # transformers' Qwen2Config defaults
    bare = _hf({k: _DEL for k in ("rope_theta", "rms_norm_eps", "tie_word_embeddings",
                                  "max_position_embeddings", "hidden_act", "rope_scaling",
                                  "use_sliding_window")})
    assert (bare.rope_theta, bare.rms_norm_eps, bare.tie_word_embeddings,
            bare.max_position_embeddings) == (10000.0, 1e-6, False, 32768)
    # SiLU under its other transformers name
    assert _hf({"hidden_act": "swish"}) == TINY_MODEL
    # unscaled RoPE in every spelling; θ from rope_parameters (transformers 5)
    for change in ({"rope_scaling": None}, {"rope_scaling": {"rope_type": "default"}},
                   {"rope_scaling": {"type": "default"}},
                   {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
                   {"rope_theta": _DEL,
                    "rope_parameters": {"full_attention": {"rope_type": "default",
                                                           "rope_theta": 1e6}}},
                   {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 1.0}}):
        assert _hf(change) == TINY_MODEL, change
    assert _hf({"rope_theta": _DEL, "rope_parameters": {"rope_theta": 5e5}}).rope_theta == 5e5
    assert _hf({"rope_theta": 500000}).rope_theta == 5e5        # an integer θ is a number
    # sliding window off, or on without a window: full attention everywhere, as transformers
    for change in ({"use_sliding_window": False, "sliding_window": 4096,
                    "max_window_layers": 0},
                   {"use_sliding_window": True, "sliding_window": None},
                   {"layer_types": ["full_attention"] * 2}):
        assert _hf(change) == TINY_MODEL, change
    # training-only and unknown fields change nothing
    assert _hf({"attention_dropout": 0.1, "initializer_range": 0.5, "use_mrope": False,
                "bos_token_id": 151643, "torch_dtype": "bfloat16",
                "attention_bias": False}) == TINY_MODEL
    # architectures alone or model_type alone identify a Qwen2 causal LM
    assert _hf({"model_type": _DEL}) == _hf({"architectures": _DEL}) == TINY_MODEL
    # tie_word_embeddings is read, not assumed: an untied config needs lm_head.weight
    assert not _hf({"tie_word_embeddings": False}).tie_word_embeddings


def test_untied_config_needs_its_lm_head(ckpt, tmp_path):
    d = _with_config(ckpt, tmp_path, {"tie_word_embeddings": False})
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_checkpoint(d)


def test_null_kv_heads_loads_and_runs(tmp_path):
    """A checkpoint whose config says num_key_value_heads null (HF: one KV head per query
    head) has full-size K/V projections; it loads and runs."""
    cfg = Qwen2Config(hidden_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=4, head_dim=32, intermediate_size=256, vocab_size=64)
    save_checkpoint(tmp_path, cfg, random_checkpoint(cfg, 1), dtype="f32")
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["num_key_value_heads"] = None
    (tmp_path / "config.json").write_text(json.dumps(conf))
    got, t = load_checkpoint(tmp_path)
    assert got == cfg
    gen = IntModel(quantize_model(got, t)).generate([1, 2, 3], 1)
    assert gen.prompt_logits.shape == (3, 64)


@pytest.fixture(scope="module")
def tiny():
    t = random_checkpoint(TINY_MODEL, 0)
    return FloatModel(TINY_MODEL, t), IntModel(quantize_model(TINY_MODEL, t))


@pytest.mark.parametrize("tokens", [[-1], [256], [3, 300], [2**40], [1.5], ["a"], [True]])
def test_token_ids_out_of_range_are_refused(tiny, tokens):
    fm, im = tiny
    with pytest.raises(ValueError, match="token id"):
        fm.forward(tokens, fm.new_cache())
    with pytest.raises(ValueError, match="token id"):
        fm.generate(tokens, 1)
    with pytest.raises(ValueError, match="token id"):
        im.generate(tokens, 1)
    im.reset()
    with pytest.raises(ValueError, match="token id"):
        im.prefill(tokens)
    assert im.length == 0                       # nothing was appended to the KV cache
    if len(tokens) == 1:
        im.prefill([1])
        with pytest.raises(ValueError, match="token id"):
            im.decode(tokens[0])
        assert im.length == 1


def test_token_ids_at_the_edges_run(tiny):
    fm, im = tiny
    a = fm.forward([0, 255], fm.new_cache())
    b = fm.forward(np.array([0, 255], dtype=np.uint8), fm.new_cache())
    assert a.shape == (2, 256) and np.array_equal(a, b)
    assert not np.array_equal(fm.forward([255], fm.new_cache()),
                              fm.forward([0], fm.new_cache()))
    im.reset()
    assert im.prefill([0, 255]).shape == (2, 256)

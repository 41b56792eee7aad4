"""mcf.model: Qwen2Config from/to config.json, the seeded random checkpoint, safetensors
save/load (bf16 and f32, one file and shards), bf16 rounding, and bad checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from mcf.golden.model import IntModel, quantize_model
from mcf.golden.qwen_layer import TINY
from mcf.model import (
    TINY_MODEL,
    CheckpointError,
    ConfigError,
    Qwen2Config,
    expected_shapes,
    load_checkpoint,
    random_checkpoint,
    save_checkpoint,
)
from mcf.model.checkpoint import LM_HEAD, from_bf16, to_bf16


def test_tiny_model_is_the_golden_tiny_layer():
    assert TINY_MODEL.layer == TINY
    assert (TINY_MODEL.num_hidden_layers, TINY_MODEL.vocab_size) == (2, 256)
    assert TINY_MODEL.tie_word_embeddings


def test_config_json_round_trip_and_variants():
    d = TINY_MODEL.to_hf()
    assert d["model_type"] == "qwen2" and d["architectures"] == ["Qwen2ForCausalLM"]
    assert Qwen2Config.from_hf(json.loads(json.dumps(d))) == TINY_MODEL
    # newer transformers: rope_theta inside rope_parameters; head_dim absent
    d2 = {k: v for k, v in d.items() if k not in ("rope_theta", "head_dim")}
    d2["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert Qwen2Config.from_hf(d2).rope_theta == 5e5
    assert Qwen2Config.from_hf(d2).head_dim == 32


@pytest.mark.parametrize("change, msg", [
    ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "not a Qwen2"),
    ({"hidden_size": None}, "lacks hidden_size"),
    ({"head_dim": 64}, "head_dim 64"),
    ({"num_key_value_heads": 3}, "not a multiple of 3 KV heads"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "not supported"),
    ({"use_sliding_window": True}, "sliding-window"),
])
def test_config_rejects(change, msg):
    d = TINY_MODEL.to_hf()
    for k, v in change.items():
        if v is None:
            del d[k]
        else:
            d[k] = v
    with pytest.raises(ConfigError, match=msg):
        Qwen2Config.from_hf(d)


def test_random_checkpoint_names_shapes_and_seed():
    a = random_checkpoint(TINY_MODEL, 3)
    assert {n: v.shape for n, v in a.items()} == expected_shapes(TINY_MODEL)
    assert all(v.dtype == np.float32 for v in a.values())
    assert LM_HEAD not in a
    b = random_checkpoint(TINY_MODEL, 3)
    c = random_checkpoint(TINY_MODEL, 4)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert a["model.layers.1.self_attn.q_proj.bias"].shape == (128,)
    assert a["model.layers.0.self_attn.k_proj.weight"].shape == (64, 128)


def test_bf16_rounding_ties_to_even():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -2.5, 0.0, 3e38],
                 dtype=np.float32)
    want = np.array([1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -2.5, 0.0, 3e38], dtype=np.float32)
    got = from_bf16(to_bf16(x))
    assert np.array_equal(got[:6], want[:6])
    assert abs(got[6] / 3e38 - 1) < 2**-8
    with pytest.raises(CheckpointError):
        to_bf16(np.array([np.inf], np.float32))


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("shard", [None, 40_000])
def test_save_load_round_trip(tmp_path: Path, dtype, shard):
    t = random_checkpoint(TINY_MODEL, 1)
    files = save_checkpoint(tmp_path, TINY_MODEL, t, dtype=dtype, shard_bytes=shard)
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) == (1 if shard is None else len(shards)) and shards
    if shard is not None:
        assert len(shards) > 2 and (tmp_path / "model.safetensors.index.json") in files
    assert not list(tmp_path.glob("*.part"))
    cfg, u = load_checkpoint(tmp_path)
    assert cfg == TINY_MODEL and set(u) == set(t)
    for n in t:
        want = from_bf16(to_bf16(t[n])) if dtype == "bf16" else t[n]
        assert u[n].dtype == np.float32 and np.array_equal(u[n], want), n
    if dtype == "bf16":
        rel = max(float(np.max(np.abs(u[n] - t[n]) / np.maximum(np.abs(t[n]), 1e-30)))
                  for n in t)
        assert 0 < rel <= 2**-8


def test_untied_checkpoint_keeps_lm_head(tmp_path: Path):
    cfg = Qwen2Config.from_layer(TINY, layers=1, vocab=64, tied=False)
    t = random_checkpoint(cfg, 2)
    assert t[LM_HEAD].shape == (64, 128)
    save_checkpoint(tmp_path, cfg, t, dtype="f32")
    cfg2, u = load_checkpoint(tmp_path)
    assert not cfg2.tie_word_embeddings and np.array_equal(u[LM_HEAD], t[LM_HEAD])
    qm = quantize_model(cfg2, u)
    assert qm.lm_head is not qm.embed


def test_loaded_bf16_checkpoint_quantises_and_runs(tmp_path: Path):
    save_checkpoint(tmp_path, TINY_MODEL, random_checkpoint(TINY_MODEL, 5), dtype="bf16")
    cfg, t = load_checkpoint(tmp_path)
    gen = IntModel(quantize_model(cfg, t)).generate([1, 2, 3, 4, 5], 2)
    assert gen.prompt_logits.shape == (5, 256) and gen.tokens.shape == (2,)




def test_bad_checkpoints(tmp_path: Path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(tmp_path)
    t = random_checkpoint(TINY_MODEL, 0)
    del t["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(CheckpointError, match="lacks tensor model.layers.1.mlp.up_proj"):
        save_checkpoint(tmp_path, TINY_MODEL, t)
    assert not list(tmp_path.iterdir())          # nothing half-written

    # a file written for one config, read under another: a missing tensor, a wrong shape
    save_checkpoint(tmp_path, TINY_MODEL, random_checkpoint(TINY_MODEL, 0), dtype="f32")
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(CheckpointError, match=r"lacks tensor model\.layers\.2\..* more"):
        load_checkpoint(tmp_path)
    conf["num_hidden_layers"], conf["intermediate_size"] = 2, 384
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(CheckpointError, match="has shape .* expected"):
        load_checkpoint(tmp_path)
    conf["model_type"], conf["architectures"] = "gpt2", ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(conf))
    with pytest.raises(CheckpointError, match="not a Qwen2 checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="not JSON"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL.to_hf()))
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(tmp_path)


def test_quantize_rejects_ungrouped_widths():
    cfg = Qwen2Config(hidden_size=96, num_hidden_layers=1, num_attention_heads=3,
                      num_key_value_heads=1, head_dim=32, intermediate_size=192, vocab_size=16)
    with pytest.raises(ValueError, match="multiple of the weight group"):
        quantize_model(cfg, random_checkpoint(cfg, 0))


def test_qwen25_1p5b_config_is_the_golden_geometry():
    """A Qwen2.5-1.5B-style config.json (as published; sliding window present but off) maps to
    mcf.golden.qwen_layer.QWEN25_1P5B."""
    from mcf.golden.qwen_layer import QWEN25_1P5B

    d = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
         "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
         "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
         "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": True,
         "max_position_embeddings": 32768, "sliding_window": 32768, "max_window_layers": 21,
         "use_sliding_window": False, "torch_dtype": "bfloat16"}
    cfg = Qwen2Config.from_hf(d)
    assert cfg.layer == QWEN25_1P5B and cfg.num_hidden_layers == 28
    assert expected_shapes(cfg)["model.embed_tokens.weight"] == (151936, 1536)


def test_model_from_spec(tmp_path: Path):
    from mcf.model import model_from_spec

    cfg, t = model_from_spec("tiny")
    assert cfg == TINY_MODEL
    ref = random_checkpoint(TINY_MODEL, 0)
    assert all(np.array_equal(t[n], ref[n]) for n in ref)
    save_checkpoint(tmp_path, TINY_MODEL, random_checkpoint(TINY_MODEL, 9), dtype="f32")
    cfg2, t2 = model_from_spec(str(tmp_path))
    assert cfg2 == TINY_MODEL and np.array_equal(
        t2[NORM_NAME], random_checkpoint(TINY_MODEL, 9)[NORM_NAME])
    with pytest.raises(CheckpointError, match="not a directory"):
        model_from_spec(str(tmp_path / "tinyy"))


NORM_NAME = "model.norm.weight"

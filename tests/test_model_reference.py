"""mcf.model.FloatModel against Hugging Face transformers' Qwen2ForCausalLM: the committed fixture
``tests/fixtures/qwen2_tiny_logits.npz`` (made by ``scripts/make_qwen2_fixture.py`` in a
throwaway venv with torch) holds HF's logits for the tiny checkpoint of the recorded seed, saved
by ``save_checkpoint`` as f32 and as bf16. CI rebuilds the same checkpoint from the seed, writes
and reads it with our safetensors code and compares without torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mcf.model import TINY_MODEL, FloatModel, load_checkpoint, random_checkpoint, save_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "qwen2_tiny_logits.npz"

# float32 arithmetic in a different order (numpy vs torch): measured max |Δlogit| 8.1e-6 on
# logits up to 11; 1e-4 leaves 12x margin and is still 1000x below the smallest top-1 margin.
ATOL = 1e-4


@pytest.fixture(scope="module")
def hf():
    return np.load(FIXTURE)


def test_fixture_is_small():
    assert FIXTURE.stat().st_size < 200_000


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_float_forward_matches_transformers(hf, dtype, tmp_path):
    save_checkpoint(tmp_path, TINY_MODEL, random_checkpoint(TINY_MODEL, int(hf["seed"])),
                    dtype=dtype)
    cfg, t = load_checkpoint(tmp_path)
    k = len(hf[f"{dtype}_tokens"])
    gen = FloatModel(cfg, t).generate(hf["prompt"], k)
    np.testing.assert_allclose(gen.prompt_logits, hf[f"{dtype}_prompt_logits"], rtol=0,
                               atol=ATOL)
    np.testing.assert_allclose(gen.step_logits, hf[f"{dtype}_step_logits"], rtol=0, atol=ATOL)
    assert np.array_equal(gen.tokens, hf[f"{dtype}_tokens"])
    # the greedy choices are not near-ties (else ATOL could flip them)
    s = np.sort(gen.step_logits, axis=1)
    assert np.min(s[:, -1] - s[:, -2]) > 100 * ATOL


def test_bf16_weights_move_the_logits(hf):
    """The two fixture runs differ by more than ATOL: the bf16 comparison tests bf16 reading."""
    d = np.abs(hf["bf16_prompt_logits"] - hf["f32_prompt_logits"]).max()
    assert d > 10 * ATOL


def test_decode_with_cache_equals_full_forward():
    fm = FloatModel(TINY_MODEL, random_checkpoint(TINY_MODEL, 7))
    toks = np.random.default_rng(3).integers(0, 256, 12)
    full = fm.forward(toks, fm.new_cache())
    cache = fm.new_cache()
    parts = [fm.forward(toks[:5], cache)] + [fm.forward(toks[i:i + 1], cache)
                                             for i in range(5, 12)]
    assert cache.length == 12
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=1e-5)

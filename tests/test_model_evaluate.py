"""``mcf.model.evaluate``: the retrieval accuracy of each model, as the bench and
``scripts/eval_retrieval.py`` measure it."""

import numpy as np
import pytest

from mcf.abi.kv_channel import KVFormat
from mcf.cluster import RunSpec, make_plan, run_prompt
from mcf.golden.attention import KVChannelCache
from mcf.golden.cluster import golden_run
from mcf.golden.model import KVStore, quantize_model
from mcf.model import model_from_spec
from mcf.model.checkpoint import EMBED, RETRIEVAL_DIR, load_checkpoint, save_checkpoint
from mcf.model.evaluate import INT_MODELS, MODELS, answerer, int_model, measure, measure_one
from mcf.model.task import make_prompt


def test_cluster_golden_answerer_is_the_run_golden():
    """``mars_n2`` answers with the tokens of the run golden ``mcf run`` checks the RTL against,
    on the prompt ``mcf run --task passkey`` poses."""
    cfg, tensors = model_from_spec("retrieval")
    spec = RunSpec(model="retrieval", nodes=2, prompt_tokens=64, decode_tokens=1, seed=2,
                   task="passkey")
    prompt, answer = run_prompt(spec, cfg)
    assert np.array_equal(prompt, make_prompt(64, 2).tokens)
    want = golden_run(quantize_model(cfg, tensors), make_plan(spec, cfg), prompt, 1).tokens
    assert answerer(RETRIEVAL_DIR, "mars_n2")(prompt).tolist() == want == answer.tolist()


def test_measure_reports_every_pair():
    got = measure(RETRIEVAL_DIR, [("float", 64), ("int", 64), ("mars_n4", 64)], 3)
    assert sorted(got) == ["float", "int", "mars_n4"]
    for m, by in got.items():
        a = by[64]
        assert (a.model, a.length, a.prompts) == (m, 64, 3)
        assert a.accuracy == 1 - len(a.wrong_seeds) / 3
    assert measure_one(RETRIEVAL_DIR, "int_channel", 64, 1).wrong_seeds == ()


def test_wrong_answers_are_counted(tmp_path):
    """A checkpoint whose embedding (= the tied LM head) is zero scores every token 0 and
    answers token 0 (PAD) to every prompt: every seed is reported wrong."""
    cfg, tensors = load_checkpoint(RETRIEVAL_DIR)
    save_checkpoint(tmp_path, cfg, {**tensors, EMBED: np.zeros_like(tensors[EMBED])})
    for m in ("float", "int_channel"):
        a = measure_one(tmp_path, m, 64, 2)
        assert (a.accuracy, a.wrong_seeds) == (0.0, (0, 1))


def test_unknown_model_is_refused():
    assert "mars_n2" in MODELS
    with pytest.raises(ValueError, match="unknown model 'bf16'"):
        measure(RETRIEVAL_DIR, [("bf16", 64)], 1)


def test_integer_model_names_build_their_int_model():
    """Each integer name builds the :class:`IntModel` it stands for: KV format and prefill
    attention (``*_tiled``: the P8 PREFILL_TILE rule); other names are refused."""
    qm = quantize_model(*load_checkpoint(RETRIEVAL_DIR))
    want = {"int": (KVFormat.PER_TOKEN, "single", KVStore),
            "int_channel": (KVFormat.PER_CHANNEL_K, "single", KVChannelCache),
            "int_tiled": (KVFormat.PER_TOKEN, "tiled", KVStore),
            "int_channel_tiled": (KVFormat.PER_CHANNEL_K, "tiled", KVChannelCache)}
    assert sorted(INT_MODELS) == sorted(want)
    assert all(m in MODELS for m in want)
    for name, (fmt, mode, store) in want.items():
        im = int_model(qm, name)
        assert (im.kv_format, im.prefill_mode) == (fmt, mode)
        assert type(im.kv[0][0]) is store
    with pytest.raises(ValueError, match="not an integer model"):
        int_model(qm, "mars_n2")

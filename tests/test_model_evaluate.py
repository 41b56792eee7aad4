"""``mcf.model.evaluate``: the retrieval accuracy of each model, as the bench and
``scripts/eval_retrieval.py`` measure it."""

import numpy as np
import pytest

from mcf.cluster import RunSpec, golden_run, make_plan, run_prompt
from mcf.model import model_from_spec, quantize_model
from mcf.model.checkpoint import EMBED, RETRIEVAL_DIR, load_checkpoint, save_checkpoint
from mcf.model.evaluate import MODELS, answerer, measure, measure_one
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

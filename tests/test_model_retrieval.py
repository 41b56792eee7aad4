"""The trained ``retrieval`` checkpoint and its task (issue #17 §1, §4): the task generator is
deterministic and its prompts well formed; the shipped checkpoint loads through
``load_checkpoint`` with the sim node's geometry; our float reference gives the greedy answers
and logits ``transformers`` gave (``tests/fixtures/retrieval_logits.npz``, made by
``scripts/make_retrieval_fixture.py``); bad checkpoints raise the loader's error. No torch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mcf.abi.node_config import NODE_CONFIGS
from mcf.golden.qwen_layer import TINY
from mcf.model import CheckpointError, FloatModel, load_checkpoint, model_from_spec
from mcf.model.checkpoint import EMBED, RETRIEVAL_DIR, expected_shapes, save_checkpoint
from mcf.model.task import (
    IGNORE,
    PASSKEY,
    VOCAB,
    TaskSpec,
    Vocab,
    accuracy,
    make_batch,
    make_prompt,
    min_length,
    score,
)

FIXTURE = Path(__file__).parent / "fixtures" / "retrieval_logits.npz"


def _in(r, x) -> np.ndarray:
    return (np.asarray(x) >= r[0]) & (np.asarray(x) < r[1])


# --- the task generator -----------------------------------------------------------------------

def test_vocab_layout():
    v = VOCAB
    assert v.size == 256
    assert (v.pad, v.bos, v.put, v.ask) == (0, 1, 2, 3)
    assert v.filler[1] <= v.symbols[0] and v.symbols[1] <= v.size
    assert Vocab.count(v.symbols) >= PASSKEY.n_pairs * (PASSKEY.key_len + PASSKEY.value_len)
    with pytest.raises(ValueError, match="overlap"):
        Vocab(symbols=(100, 256))
    with pytest.raises(ValueError, match="special"):
        Vocab(filler=(2, 128))
    with pytest.raises(ValueError, match="do not fit"):
        TaskSpec(n_pairs=43, value_len=2)
    assert min_length() == 1 + 4 * 4 + 2


@pytest.mark.parametrize("length, seed", [(19, 0), (64, 1), (256, 7), (1000, 3), (4094, 11)])
def test_prompt_is_well_formed(length, seed):
    v, s = VOCAB, PASSKEY
    p = make_prompt(length, seed)
    t = p.tokens
    assert t.dtype == np.int64 and t.shape == (length,) and p.length == length
    assert t[0] == v.bos and t[-2] == v.ask and np.array_equal(t[-1:], p.key)
    assert np.count_nonzero(t == v.ask) == 1 and np.count_nonzero(t == v.bos) == 1
    puts = np.flatnonzero(t == v.put)
    assert len(puts) == s.n_pairs
    body = np.ones(length, bool)
    body[[0, length - 2, length - 1]] = False
    keys, vals = [], []
    for q in puts:
        body[q:q + s.pair_tokens] = False
        keys.append(t[q + 1])
        vals.extend(t[q + 2:q + s.pair_tokens])
    assert _in(v.symbols, keys + vals).all()
    assert len(set(keys + vals)) == s.n_pairs * (s.key_len + s.value_len)   # all distinct
    assert _in(v.filler, t[body]).all()                     # everything else is filler
    assert t[p.target_pos] == v.put and t[p.target_pos + 1] == p.key[0]
    assert np.array_equal(t[p.target_pos + 2:p.target_pos + s.pair_tokens], p.answer)
    assert p.answer.dtype == np.int64 and p.answer.shape == (s.value_len,)


def test_prompt_is_deterministic_and_spreads_the_key():
    a, b = make_prompt(512, 5), make_prompt(512, 5)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.answer, b.answer)
    assert not np.array_equal(a.tokens, make_prompt(512, 6).tokens)
    # pinned: the generator's output must not drift between numpy versions or edits
    p = make_prompt(64, 3)
    assert p.tokens[:8].tolist() == [1, 85, 120, 2, 160, 254, 146, 113]
    assert p.answer.tolist() == [254, 146] and p.target_pos == 3
    depths = [make_prompt(256, s).depth for s in range(200)]
    assert min(depths) < 0.05 and max(depths) > 0.9
    with pytest.raises(ValueError, match="minimum"):
        make_prompt(min_length() - 1, 0)
    with pytest.raises(ValueError, match="non-negative"):
        make_prompt(64, -1)


def test_training_batch_targets_only_the_answers():
    b1 = make_batch(96, 3, np.random.default_rng(4))
    b2 = make_batch(96, 3, np.random.default_rng(4))
    assert np.array_equal(b1.tokens, b2.tokens) and np.array_equal(b1.targets, b2.targets)
    assert b1.tokens.shape == b1.targets.shape == (3, 96)
    s, v = PASSKEY, VOCAB
    for toks, tgt in zip(b1.tokens, b1.targets):
        where = np.flatnonzero(tgt != IGNORE)
        assert len(where) == s.n_pairs * s.value_len
        assert np.array_equal(tgt[where], toks[where + 1])
        assert _in(v.symbols, tgt[where]).all()
        asks = np.flatnonzero(toks == v.ask)
        assert len(asks) == s.n_pairs
        for a in asks:                                      # ASK k v v: k's planted values
            q = np.flatnonzero(toks[:asks[0]] == v.put)
            hit = q[toks[q + 1] == toks[a + 1]]
            assert len(hit) == 1
            assert np.array_equal(toks[a + 2:a + 4], toks[hit[0] + 2:hit[0] + 4])
            assert list(where[where > a][:2]) == [a + 1, a + 2]
    with pytest.raises(ValueError, match="too short"):
        make_batch(32, 1, np.random.default_rng(0))


def test_training_batch_adjacent_case():
    """``adjacent=1``: every sequence plants its last pair right before the first ``ASK`` and
    asks for it first; ``adjacent=0`` (the default) draws nothing extra from the generator."""
    s, v = PASSKEY, VOCAB
    b = make_batch(128, 4, np.random.default_rng(2), adjacent=1.0)
    for toks in b.tokens:
        a = np.flatnonzero(toks == v.ask)[0]
        assert toks[a - s.pair_tokens] == v.put
        assert toks[a + 1] == toks[a - s.pair_tokens + 1]           # asks for that pair
        assert np.array_equal(toks[a + 2:a + 4], toks[a - 2:a])
    b0 = make_batch(128, 4, np.random.default_rng(2))
    bz = make_batch(128, 4, np.random.default_rng(2), adjacent=0.0)
    assert np.array_equal(b0.tokens, bz.tokens)


def test_score_and_accuracy():
    assert score([200, 201], np.array([200, 201]))
    assert score([200, 201, 5], [200, 201])
    assert not score([200, 202], [200, 201])
    assert not score([200], [200, 201])
    assert accuracy([[1, 2], [1, 3], [4, 4], [1, 2]], [[1, 2]] * 4) == 0.5
    with pytest.raises(ValueError):
        accuracy([[1, 2]], [])


# --- the shipped checkpoint -------------------------------------------------------------------

def test_checkpoint_loads_with_the_sim_node_geometry():
    cfg, tensors = model_from_spec("retrieval")
    assert (cfg, set(tensors)) == (load_checkpoint(RETRIEVAL_DIR)[0], set(expected_shapes(cfg)))
    assert cfg.layer == TINY
    node = NODE_CONFIGS["sim"]
    assert cfg.head_dim == node.attn_head_dim == 32
    assert cfg.num_attention_heads // cfg.num_key_value_heads <= node.attn_heads
    assert cfg.hidden_size <= node.vec_n_max and cfg.intermediate_size <= node.gemm_k_max
    assert 2 <= cfg.num_hidden_layers <= 4
    assert cfg.vocab_size == VOCAB.size and cfg.tie_word_embeddings
    assert cfg.max_position_embeddings == 4096
    assert (cfg.rope_theta, cfg.rms_norm_eps) == (1e6, 1e-6)
    conf = json.loads((RETRIEVAL_DIR / "config.json").read_text())
    assert conf["torch_dtype"] == "bfloat16" and conf["architectures"] == ["Qwen2ForCausalLM"]
    size = (RETRIEVAL_DIR / "model.safetensors").stat().st_size
    assert size <= 2 * 2**20
    assert size == pytest.approx(2 * sum(t.size for t in tensors.values()), abs=4096)
    assert "Accuracy" in (RETRIEVAL_DIR / "README.md").read_text()
    assert all(np.isfinite(t).all() for t in tensors.values())


def test_package_data_ships_the_checkpoint():
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[1]
    pd = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["mcf.model"]
    assert RETRIEVAL_DIR.parent == root / "sw" / "model"
    for f in ("config.json", "model.safetensors", "README.md"):
        assert f"retrieval/{f}" in pd and (RETRIEVAL_DIR / f).is_file()


@pytest.fixture(scope="module")
def fixture():
    return np.load(FIXTURE)


def test_float_reference_matches_transformers(fixture):
    assert FIXTURE.stat().st_size < 200_000
    cfg, tensors = model_from_spec("retrieval")
    fm = FloatModel(cfg, tensors)
    offsets = np.concatenate([[0], np.cumsum(fixture["lengths"])])
    assert len(fixture["lengths"]) >= 4
    for i, (length, seed) in enumerate(zip(fixture["lengths"], fixture["seeds"])):
        p = make_prompt(int(length), int(seed))
        assert np.array_equal(p.tokens, fixture["prompt_tokens"][offsets[i]:offsets[i + 1]])
        g = fm.generate(p.tokens, PASSKEY.value_len)
        assert np.array_equal(g.tokens, fixture["tokens"][i])
        np.testing.assert_allclose(g.step_logits, fixture["logits"][i], rtol=1e-3, atol=1e-3)
        assert score(g.tokens, p.answer), f"length {length} seed {seed}: {g.tokens} != " \
                                          f"{p.answer}"


# --- bad checkpoints --------------------------------------------------------------------------

def test_non_qwen2_config_is_rejected(tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(RETRIEVAL_DIR, d)
    conf = json.loads((d / "config.json").read_text())
    conf.update(model_type="llama", architectures=["LlamaForCausalLM"])
    (d / "config.json").write_text(json.dumps(conf))
    with pytest.raises(CheckpointError, match="not a Qwen2"):
        load_checkpoint(d)


def test_missing_or_misshapen_tensor_is_rejected(tmp_path):
    cfg, tensors = load_checkpoint(RETRIEVAL_DIR)
    d = tmp_path / "ckpt"
    save_checkpoint(d, cfg, tensors)
    assert load_checkpoint(d)[0] == cfg
    from safetensors.numpy import save_file

    name = "model.layers.1.mlp.down_proj.weight"
    save_file({k: v for k, v in tensors.items() if k != name}, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"lacks tensor {name}"):
        load_checkpoint(d)
    bad = dict(tensors)
    bad[EMBED] = bad[EMBED][:-1]
    save_file(bad, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError, match="has shape"):
        load_checkpoint(d)


def test_the_margins_script_runs_every_row_and_the_softmax_ablation_tracks_the_golden(
        tmp_path, monkeypatch):
    """``scripts/retrieval_margins.py`` (docs/evaluation.md) on one short prompt: every row
    answers it, and the float-softmax ablation on the golden model's own INT8 Q and INT4 K, V
    stays within half a logit of the golden model (the fixed-point softmax is not the loss)."""
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).parent.parent / "scripts" / "retrieval_margins.py"
    spec = importlib.util.spec_from_file_location("retrieval_margins", path)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, script)     # its dataclass looks itself up
    spec.loader.exec_module(script)
    out = tmp_path / "m.json"
    assert script.main(["--seeds", "0", "--tokens", "64", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {"float", "float_w4", "int", "int_channel", "fa_quant", "fa_k4_l0h1"} <= set(rows)
    assert all(r["0"]["m0"] > 0 and r["0"]["m1"] > 0 for r in rows.values())
    for m in ("m0", "m1"):
        assert abs(rows["fa_quant"]["0"][m] - rows["int"]["0"][m]) < 0.5

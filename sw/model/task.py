"""Synthetic long-context key–value retrieval (issue #17): the task the ``retrieval`` checkpoint
(``mcf/model/retrieval/``) is trained on and scored by. numpy only, Python 3.10.

A prompt of ``length`` tokens is ::

    BOS  filler … PUT k₁ v₁₁ v₁₂  filler … PUT k₂ v₂₁ v₂₂ … filler …  ASK k

``n_pairs`` key–value pairs are planted at random places in a context of i.i.d. filler tokens
(all key and value tokens distinct, so every answer is unambiguous); the query names one of
the planted keys, chosen uniformly, and the model must produce that key's value tokens greedily
(:attr:`Prompt.answer`). The target pair can sit anywhere, from just after ``BOS`` to just
before ``ASK``. Keys and values are drawn together from one *symbol* range of :data:`VOCAB`
(the one source of truth for the vocabulary layout), all distinct within a prompt, and filler
from a disjoint range, so a symbol occurs in the context only where it was planted. (One
shared range lets a single "find this token, copy what follows" circuit answer both the first
answer token, keyed by ``k``, and the next ones, keyed by the previous value token.)

* :func:`make_prompt` — one fixed-seed evaluation prompt (same ``length`` and ``seed``, same
  tokens, on every machine: :class:`numpy.random.Generator` with ``PCG64``).
* :func:`make_batch` — training sequences: the same context followed by ``queries`` queries,
  each with its answer, and next-token targets that are :data:`IGNORE` except where the next
  token is an answer token.
* :func:`score`, :func:`accuracy` — exact match of the greedy answer tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Vocab", "VOCAB", "TaskSpec", "PASSKEY", "Prompt", "Batch", "IGNORE",
           "make_prompt", "make_batch", "score", "accuracy", "min_length"]

IGNORE = -100
"""Target of a position that is not scored (the ``ignore_index`` of a cross-entropy loss)."""


@dataclass(frozen=True)
class Vocab:
    """Token ids of the task: four specials, then the filler range and the symbol range keys
    and values are drawn from (``[first, stop)``, disjoint). ``size`` is the model vocabulary
    it fits in; ids 4 .. 15 are reserved."""
    pad: int = 0
    bos: int = 1
    put: int = 2        # starts a planted pair: PUT key… value…
    ask: int = 3        # starts the query: ASK key…
    filler: tuple[int, int] = (16, 128)
    symbols: tuple[int, int] = (128, 256)
    size: int = 256

    def __post_init__(self):
        ranges = sorted([self.filler, self.symbols])
        specials = (self.pad, self.bos, self.put, self.ask)
        if len(set(specials)) != len(specials):
            raise ValueError("special token ids must differ")
        for lo, hi in ranges:
            if not 0 <= lo < hi <= self.size:
                raise ValueError(f"token range [{lo}, {hi}) outside [0, {self.size})")
            if any(lo <= s < hi for s in specials):
                raise ValueError(f"token range [{lo}, {hi}) holds a special token")
        for (_, hi), (lo, _) in zip(ranges, ranges[1:]):
            if lo < hi:
                raise ValueError("filler and symbol ranges overlap")

    @staticmethod
    def count(r: tuple[int, int]) -> int:
        return r[1] - r[0]


VOCAB = Vocab()
"""The vocabulary layout of the ``retrieval`` model (256 ids)."""


@dataclass(frozen=True)
class TaskSpec:
    """Shape of a task instance: planted pairs, tokens per key and per value."""
    n_pairs: int = 4
    key_len: int = 1
    value_len: int = 2
    vocab: Vocab = VOCAB

    def __post_init__(self):
        if self.n_pairs < 1 or self.key_len < 1 or self.value_len < 1:
            raise ValueError("n_pairs, key_len and value_len must be positive")
        if self.n_pairs * (self.key_len + self.value_len) > Vocab.count(self.vocab.symbols):
            raise ValueError(f"{self.n_pairs} pairs of {self.key_len} + {self.value_len} "
                             "distinct symbols do not fit the symbol range")

    @property
    def pair_tokens(self) -> int:
        """Tokens of one planted pair: ``PUT key… value…``."""
        return 1 + self.key_len + self.value_len

    @property
    def query_tokens(self) -> int:
        """Tokens of the query: ``ASK key…``."""
        return 1 + self.key_len


PASSKEY = TaskSpec()
"""The task of the ``retrieval`` checkpoint: 4 pairs, 1-token keys, 2-token values."""


def min_length(spec: TaskSpec = PASSKEY) -> int:
    """The shortest prompt: ``BOS``, the pairs and the query, no filler."""
    return 1 + spec.n_pairs * spec.pair_tokens + spec.query_tokens


@dataclass(frozen=True)
class Prompt:
    """One retrieval prompt and its expected greedy answer."""
    tokens: np.ndarray      # [length] int64: BOS … ASK key
    answer: np.ndarray      # [value_len] int64: the queried key's value tokens
    key: np.ndarray         # [key_len] int64: the queried key
    target_pos: int         # position of the queried pair's PUT token
    length: int
    seed: int

    @property
    def depth(self) -> float:
        """Where the queried pair sits in the context: 0 at the start, 1 just before ``ASK``."""
        return self.target_pos / max(1, self.length - 1)


@dataclass(frozen=True)
class Batch:
    """Training sequences: ``tokens[B, L]`` and next-token ``targets[B, L]`` (``targets[:, t]``
    is ``tokens[:, t + 1]`` where that is an answer token, else :data:`IGNORE`)."""
    tokens: np.ndarray
    targets: np.ndarray


def _context(rng: np.random.Generator, body: int, spec: TaskSpec, last_at_end: bool = False):
    """``BOS`` + ``body`` tokens of filler with the pairs planted; returns (tokens, keys
    ``[n, key_len]``, values ``[n, value_len]``, PUT positions ``[n]``). ``last_at_end``: no
    filler after the last pair."""
    v = spec.vocab
    n = spec.n_pairs
    filler = body - n * spec.pair_tokens
    if filler < 0:
        raise ValueError(f"{body} context tokens cannot hold {n} pairs of {spec.pair_tokens}")
    sym = rng.choice(np.arange(*v.symbols), size=n * (spec.key_len + spec.value_len),
                     replace=False).reshape(n, spec.key_len + spec.value_len)
    keys, vals = sym[:, :spec.key_len], sym[:, spec.key_len:]
    cuts = np.sort(rng.integers(0, filler + 1, size=n))     # filler tokens before each pair
    if last_at_end:
        cuts[-1] = filler
    fill = rng.integers(*v.filler, size=filler)
    out, puts, prev = [np.array([v.bos])], [], 0
    for i in range(n):
        out.append(fill[prev:cuts[i]])
        puts.append(1 + int(cuts[i]) + i * spec.pair_tokens)
        out.append(np.concatenate([[v.put], keys[i], vals[i]]))
        prev = int(cuts[i])
    out.append(fill[prev:])
    toks = np.concatenate(out).astype(np.int64)
    return toks, keys.astype(np.int64), vals.astype(np.int64), np.array(puts, np.int64)


def make_prompt(length: int, seed: int, spec: TaskSpec = PASSKEY) -> Prompt:
    """The evaluation prompt of ``length`` tokens (ending in ``ASK key``) from ``seed``."""
    length, seed = int(length), int(seed)
    if length < min_length(spec):
        raise ValueError(f"prompt length {length} < the minimum {min_length(spec)}")
    if seed < 0:
        raise ValueError("seed must be non-negative")
    rng = np.random.default_rng([seed, length])
    toks, keys, vals, puts = _context(rng, length - 1 - spec.query_tokens, spec)
    q = int(rng.integers(spec.n_pairs))
    tokens = np.concatenate([toks, [spec.vocab.ask], keys[q]]).astype(np.int64)
    return Prompt(tokens=tokens, answer=vals[q].copy(), key=keys[q].copy(),
                  target_pos=int(puts[q]), length=length, seed=seed)


def make_batch(length: int, size: int, rng: np.random.Generator, spec: TaskSpec = PASSKEY,
               queries: int | None = None, adjacent: float = 0.0) -> Batch:
    """``size`` training sequences of ``length`` tokens: a context, then ``queries`` (default
    ``n_pairs``) queries ``ASK key value…`` over distinct planted pairs in random order. Only
    the answer tokens are targets. With probability ``adjacent`` a sequence has its last pair
    right before the first query and asks for that pair first: the case ``PUT k v… ASK k``,
    which uniform placement makes rare (about ``n_pairs / length``) but evaluation prompts
    contain. Same ``rng`` state, same batch."""
    q = spec.n_pairs if queries is None else int(queries)
    if not 1 <= q <= spec.n_pairs:
        raise ValueError(f"queries must be in 1..{spec.n_pairs}")
    tail = q * (spec.query_tokens + spec.value_len)
    if length - tail - 1 < spec.n_pairs * spec.pair_tokens:
        raise ValueError(f"training length {length} too short for {q} queries")
    tokens = np.empty((size, length), np.int64)
    targets = np.full((size, length), IGNORE, np.int64)
    for b in range(size):
        edge = adjacent > 0 and rng.random() < adjacent
        toks, keys, vals, _ = _context(rng, length - 1 - tail, spec, last_at_end=edge)
        row, tgt = [toks], []
        at = len(toks)
        order = rng.permutation(spec.n_pairs)
        if edge:
            order = np.concatenate([[spec.n_pairs - 1], order[order != spec.n_pairs - 1]])
        for i in order[:q]:
            row.append(np.concatenate([[spec.vocab.ask], keys[i], vals[i]]))
            first = at + spec.query_tokens       # position of the first answer token
            tgt.extend(range(first - 1, first - 1 + spec.value_len))
            at += spec.query_tokens + spec.value_len
        seq = np.concatenate(row)
        tokens[b] = seq
        idx = np.array(tgt)
        targets[b, idx] = seq[idx + 1]
    return Batch(tokens, targets)


def score(predicted, answer) -> bool:
    """True when the greedy tokens ``predicted`` start with exactly the ``answer`` tokens."""
    p = np.asarray(predicted, dtype=np.int64).ravel()
    a = np.asarray(answer, dtype=np.int64).ravel()
    return len(p) >= len(a) and bool(np.array_equal(p[:len(a)], a))


def accuracy(predicted: list, answers: list) -> float:
    """Fraction of prompts whose greedy tokens :func:`score` right."""
    if len(predicted) != len(answers) or not answers:
        raise ValueError("need as many predictions as answers, at least one")
    return sum(score(p, a) for p, a in zip(predicted, answers)) / len(answers)

"""Bit-exact golden model of the attention engine (paper §3.1, §4 end, §5) and a float64 reference.

The model mirrors the hardware's order of operations (``mcf.hdl.compute.attention``):

* A **job** is one query token × one group of ``G = Hq/Hkv`` query heads sharing a KV head
  (INT8 ``q[G, d]`` with scales ``sq[G, 2]`` = ``(m, e)`` of :class:`mcf.abi.quant.Scale`), over a
  list of KV blocks (``KVBlock``: INT4 K/V rows with per-token scales and token positions).
* Per block, the K rows are scored first (exact integer dot product, then
  :func:`mcf.abi.kv.score`); keys with ``pos > q_pos`` are masked when ``causal``. Then the block
  state is formed against the **block** maximum ``m_b``: ``p = exp2_neg(m_b − t)``,
  ``w = v_weight(p, sv)``, ``l_b = Σ p``, ``o_b = Σ w·v`` (exact sums, saturated to 32 bits once).
* **Single-pass mode** (decode partial states and prefill): the running state is
  ``merge_state(running, block_state)`` — block by block, starting from the empty state. The single
  pass is therefore *by construction* the in-order merge of per-block states, and a KV set split
  into parts that are merged in this order gives the same bits.
* **Max mode** (two-phase, phase 1): only the K rows are scored; the result is the maximum per head
  (``M_EMPTY`` for an empty shard).
* **Fixed-max mode** (two-phase, phase 2): every exponential is taken against the given global
  maximum ``M`` (``p = exp2_neg(M − t)``), sums are exact integers wrapped to 32 bits, the state is
  ``(M, l, o)``. Integer sums are associative and commutative, so summing the states of any split
  of the KV set, in any order, gives identical bits — independent of the number of nodes.
* **Normalise** (prefill output): ``o / l`` by :func:`mcf.abi.softmax.normalize`.

Both KV formats (:class:`mcf.abi.kv.KVFormat`) go through the same functions: a block is a
:class:`KVBlock` (per token) or a :class:`KVChannelBlock` (K per channel per group of
:data:`mcf.abi.kv.KV_GROUP` tokens, scored through the folded query of its group,
:func:`channel_scores`; closed groups, then the open group of :class:`KVChannelCache`); a
job may even mix the two classes. Everything after the scores is format-independent, so every mode,
the causal mask, GQA and the split invariance of the two-phase mode carry over.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcf.abi.fixed import saturate, wrap
from mcf.abi.kv import (
    KV_SCALE,
    dequantize,
    dequantize_q,
    q_multiplier,
    quantize_kv_rows,
    score,
    score_shift,
    v_weight,
)
from mcf.abi.kv_channel import (
    KV_GROUP,
    KV_ONE,
    fold_query,
    group_sizes,
    quantize_k_open,
    quantize_kv_channel,
)
from mcf.abi.softmax import (
    LANE_BITS,
    M_EMPTY,
    STATE_L,
    STATE_O,
    exp2_neg,
    merge_state,
    normalize,
)

__all__ = [
    "KVBlock", "State", "job_scores", "block_state", "attend_single", "attend_causal_rows",
    "attend_prefill", "attend_max", "attend_fixed", "attend", "normalize_state",
    "float_attention", "MODES",
    "KVChannelBlock", "channel_scores", "dequantize_k", "KVChannelCache",
]

MODES = ("single", "max", "fixed")


@dataclass
class KVBlock:
    """One KV block of one KV head as the engine sees it (codes, not bytes)."""
    k: np.ndarray    # [T, d] INT4 codes
    sk: np.ndarray   # [T] KV_SCALE codes
    v: np.ndarray    # [T, d] INT4 codes
    sv: np.ndarray   # [T] KV_SCALE codes
    pos: np.ndarray  # [T] token positions

    def __len__(self) -> int:
        return int(np.asarray(self.k).shape[0])

    def slice(self, lo: int, hi: int) -> KVBlock:
        return KVBlock(self.k[lo:hi], self.sk[lo:hi], self.v[lo:hi], self.sv[lo:hi],
                       self.pos[lo:hi])

    @staticmethod
    def concat(blocks: list[KVBlock]) -> KVBlock:
        return KVBlock(*(np.concatenate([getattr(b, f) for b in blocks])
                         for f in ("k", "sk", "v", "sv", "pos")))


@dataclass
class State:
    """Per-head states of one job: ``m[G]``, ``l[G]``, ``o[G, d]`` (int64 codes)."""
    m: np.ndarray
    l: np.ndarray  # noqa: E741 - the paper's name
    o: np.ndarray

    def head(self, h: int):
        return np.int64(self.m[h]), np.int64(self.l[h]), self.o[h].astype(np.int64)

    @staticmethod
    def from_heads(heads) -> State:
        return State(np.array([int(s[0]) for s in heads], dtype=np.int64),
                     np.array([int(s[1]) for s in heads], dtype=np.int64),
                     np.stack([np.asarray(s[2], dtype=np.int64) for s in heads]))

    @staticmethod
    def empty(heads: int, head_dim: int) -> State:
        return State(np.full(heads, M_EMPTY, dtype=np.int64), np.zeros(heads, dtype=np.int64),
                     np.zeros((heads, head_dim), dtype=np.int64))

    def __eq__(self, other) -> bool:
        return (isinstance(other, State) and np.array_equal(self.m, other.m)
                and np.array_equal(self.l, other.l) and np.array_equal(self.o, other.o))


def job_scores(q, sq, blk: KVBlock, q_pos: int = 0, causal: bool = False):
    """Scores ``t[G, T]`` and the key mask ``valid[T]`` of one block for one job (a
    :class:`KVChannelBlock` is scored through :func:`channel_scores`)."""
    if isinstance(blk, KVChannelBlock):
        return channel_scores(q, sq, blk), _valid(blk, q_pos, causal)
    q = np.asarray(q, dtype=np.int64)
    sq = np.asarray(sq, dtype=np.int64)
    head_dim = q.shape[-1]
    acc = q @ np.asarray(blk.k, dtype=np.int64).T                     # exact integer
    t = score(acc, np.asarray(blk.sk)[None, :], q_multiplier(sq[:, 0], head_dim)[:, None],
              score_shift(sq[:, 1])[:, None])
    valid = np.ones(len(blk), dtype=bool)
    if causal:
        valid = np.asarray(blk.pos, dtype=np.int64) <= q_pos
    return t, valid


def _sums(p, blk: KVBlock):
    """Exact ``Σ p`` and ``Σ w·v`` per head (int64)."""
    w = v_weight(p, np.asarray(blk.sv)[None, :])                     # [G, T]
    return p.sum(axis=1), w @ np.asarray(blk.v, dtype=np.int64)       # [G], [G, d]


def block_state(t, valid, blk: KVBlock) -> State:
    """A block's state against its own maximum, saturated once to the state formats.

    ``valid`` is the key mask of the job (``[T]``) or one mask per head row (``[G, T]``); a row
    with no unmasked key gets the empty state."""
    heads = t.shape[0]
    valid = np.broadcast_to(valid, t.shape)
    if not valid.any():
        return State.empty(heads, np.asarray(blk.v).shape[1])
    m = np.where(valid, t, np.iinfo(np.int64).min).max(axis=1)
    d = np.where(valid, m[:, None] - t, 0)
    p = np.where(valid, exp2_neg(d), 0)
    l_sum, o = _sums(p, blk)
    m = np.where(valid.any(axis=1), m, M_EMPTY)
    return State(m.astype(np.int64), saturate(l_sum, STATE_L.width, signed=False),
                 saturate(o, STATE_O.width, signed=True))


def attend_single(q, sq, blocks: list[KVBlock], q_pos: int = 0, causal: bool = False) -> State:
    """Single pass: ``running = merge_state(running, block_state)`` block by block."""
    q = np.asarray(q)
    heads, head_dim = q.shape
    run = State.empty(heads, head_dim)
    for blk in blocks:
        t, valid = job_scores(q, sq, blk, q_pos, causal)
        b = block_state(t, valid, blk)
        run = State(*merge_state((run.m, run.l, run.o), (b.m, b.l, b.o)))
    return run


def attend_causal_rows(q, sq, blocks: list, q_pos) -> State:
    """Causal single pass of many jobs at once (a prefill chunk): row ``r`` of ``q[R, d]`` /
    ``sq[R, 2]`` is a query head at position ``q_pos[r]``, and gets the bits of
    ``attend_single(q[r:r+1], sq[r:r+1], [b for b in blocks if b.pos[0] <= q_pos[r]],
    q_pos[r], causal=True)``: the blocks up to its own position, in order, masked causally."""
    q = np.asarray(q, dtype=np.int64)
    sq = np.asarray(sq, dtype=np.int64)
    q_pos = np.asarray(q_pos, dtype=np.int64)
    run = State.empty(*q.shape)
    for blk in blocks:
        if len(blk) == 0:             # merging the empty state changes no bit
            continue
        rows = np.flatnonzero(q_pos >= int(blk.pos[0]))
        if rows.size == 0:
            continue
        t, _ = job_scores(q[rows], sq[rows], blk)
        valid = np.asarray(blk.pos, dtype=np.int64)[None, :] <= q_pos[rows, None]
        b = block_state(t, valid, blk)
        m, l_sum, o = merge_state((run.m[rows], run.l[rows], run.o[rows]), (b.m, b.l, b.o))
        run.m[rows], run.l[rows], run.o[rows] = m, l_sum, o
    return run


def attend_exact_rows(q, sq, blocks: list, q_pos) -> State:
    """Causal two-phase attention of many jobs at once: row ``r`` gets the bits of
    ``attend_fixed(q[r:r+1], sq[r:r+1], blocks, attend_max(..., causal=True), q_pos[r],
    causal=True)`` — the ATTEND PREFILL EXACT rule. The sums are exact, so the result does not
    depend on how the keys are cut into ``blocks`` (nor on their order)."""
    q = np.asarray(q, dtype=np.int64)
    sq = np.asarray(sq, dtype=np.int64)
    q_pos = np.asarray(q_pos, dtype=np.int64)
    rows, head_dim = q.shape
    scored = []
    m = np.full(rows, M_EMPTY, dtype=np.int64)
    for blk in blocks:
        if len(blk) == 0:
            continue
        t, _ = job_scores(q, sq, blk)
        valid = np.asarray(blk.pos, dtype=np.int64)[None, :] <= q_pos[:, None]
        m = np.maximum(m, np.where(valid, t, M_EMPTY).max(axis=1))
        scored.append((t, valid, blk))
    l_sum = np.zeros(rows, dtype=np.int64)
    o = np.zeros((rows, head_dim), dtype=np.int64)
    for t, valid, blk in scored:
        p = np.where(valid, exp2_neg(np.maximum(m[:, None] - t, 0)), 0)
        ls, os_ = _sums(p, blk)
        l_sum += ls
        o += os_
    return State(m, l_sum & ((1 << LANE_BITS) - 1), wrap(o, LANE_BITS, signed=True))


def attend_prefill(qc, sq, blocks: list, pos, exact: bool = False) -> np.ndarray:
    """A prefill chunk's attention output: INT8 query heads ``qc[t, G, d]`` with scales
    ``sq[t, G, 2]`` at positions ``pos[t]`` → NORM_OUT codes ``[t, G, d]``
    (:func:`attend_causal_rows` over every row — :func:`attend_exact_rows` with ``exact`` —
    then ``o / l``)."""
    t, g, d = np.shape(qc)
    rows = attend_exact_rows if exact else attend_causal_rows
    st = rows(np.reshape(qc, (t * g, d)), np.reshape(sq, (t * g, 2)), blocks,
              np.repeat(np.asarray(pos, dtype=np.int64), g))
    return normalize_state(st).reshape(t, g, d)


def attend_max(q, sq, blocks: list[KVBlock], q_pos: int = 0, causal: bool = False):
    """Two-phase, phase 1: maximum score per head (``M_EMPTY`` if no unmasked key)."""
    heads = np.asarray(q).shape[0]
    m = np.full(heads, M_EMPTY, dtype=np.int64)
    for blk in blocks:
        t, valid = job_scores(q, sq, blk, q_pos, causal)
        if valid.any():
            m = np.maximum(m, np.where(valid[None, :], t, M_EMPTY).max(axis=1))
    return m


def attend_fixed(q, sq, blocks: list[KVBlock], m_fix, q_pos: int = 0, causal: bool = False):
    """Two-phase, phase 2: exponentials against the given ``m_fix[G]``, exact wrapped sums.

    Returns ``(State, violations)``; a key scoring above ``m_fix`` (bad input) is clamped to
    ``p = 1`` and counted, as the hardware counts it."""
    q = np.asarray(q)
    heads, head_dim = q.shape
    m_fix = np.asarray(m_fix, dtype=np.int64)
    l_sum = np.zeros(heads, dtype=np.int64)
    o = np.zeros((heads, head_dim), dtype=np.int64)
    bad = 0
    for blk in blocks:
        t, valid = job_scores(q, sq, blk, q_pos, causal)
        d = m_fix[:, None] - t
        bad += int(((d < 0) & valid[None, :]).sum())
        p = np.where(valid[None, :], exp2_neg(np.maximum(d, 0)), 0)
        ls, os_ = _sums(p, blk)
        l_sum += ls
        o += os_
    l_out = l_sum & ((1 << LANE_BITS) - 1)
    return State(m_fix.copy(), l_out, wrap(o, LANE_BITS, signed=True)), bad


def attend(mode: str, q, sq, blocks, q_pos=0, causal=False, m_fix=None):
    """Dispatch by mode name (``single`` / ``max`` / ``fixed``)."""
    if mode == "single":
        return attend_single(q, sq, blocks, q_pos, causal)
    if mode == "max":
        return attend_max(q, sq, blocks, q_pos, causal)
    if mode == "fixed":
        return attend_fixed(q, sq, blocks, m_fix, q_pos, causal)[0]
    raise ValueError(f"unknown mode {mode!r}")


def normalize_state(st: State) -> np.ndarray:
    """``o / l`` per head as NORM_OUT codes ``[G, d]``."""
    return np.stack([normalize(st.l[h], st.o[h]) for h in range(len(st.m))])


def float_attention(q, sq, blocks: list[KVBlock], q_pos: int = 0, causal: bool = False):
    """float64 reference on the same quantised inputs: ``softmax(q·k/sqrt(d)) · v`` per head.
    Returns ``(out[G, d], m_log2[G], l[G], o[G, d])`` with ``l``/``o`` relative to ``m_log2``
    (the exact counterparts of the integer state, in real units)."""
    qf = dequantize_q(q, sq)
    heads, head_dim = qf.shape
    if not blocks or sum(len(b) for b in blocks) == 0:
        z = np.zeros((heads, head_dim))
        return z, np.full(heads, -np.inf), np.zeros(heads), z
    kf = np.concatenate([dequantize_k(b) for b in blocks])
    vf = np.concatenate([dequantize(b.v, b.sv, KV_SCALE) for b in blocks])
    pos = np.concatenate([np.asarray(b.pos, dtype=np.int64) for b in blocks])
    valid = pos <= q_pos if causal else np.ones(len(pos), dtype=bool)
    t = (qf @ kf.T) / np.sqrt(head_dim) * np.log2(np.e)               # log2 domain
    t = np.where(valid[None, :], t, -np.inf)
    m = t.max(axis=1)
    p = np.exp2(t - m[:, None])
    l_sum = p.sum(axis=1)
    o = p @ vf
    return o / np.where(l_sum > 0, l_sum, 1)[:, None], m, l_sum, o



# --- test-data generators (seeded by the caller; shared by the tests and the benches) -----------

def random_blocks(rng: np.random.Generator, lens, head_dim: int, pos0: int = 0,
                  k_sigma: float = 1.0, v_sigma: float = 1.0) -> list[KVBlock]:
    """Blocks of the given lengths with consecutive positions from ``pos0``; float K/V drawn
    N(0, σ²) per element (a few outlier channels in K), quantised with the ABI quantiser."""
    from mcf.abi.kv import quantize_kv_float

    out, pos = [], pos0
    for n in lens:
        kf = rng.normal(0.0, k_sigma, (n, head_dim))
        kf[:, : max(1, head_dim // 32)] *= 4.0
        vf = rng.normal(0.0, v_sigma, (n, head_dim))
        k, sk = quantize_kv_float(kf)
        v, sv = quantize_kv_float(vf)
        out.append(KVBlock(k, sk, v, sv, np.arange(pos, pos + n, dtype=np.int64)))
        pos += n
    return out


def random_query(rng: np.random.Generator, heads: int, head_dim: int, sigma: float = 1.0,
                 peak: KVBlock | None = None, peak_row: int = 0, gain: float = 3.0):
    """INT8 query ``[G, d]`` + scales ``[G, 2]`` (m, e). With ``peak``, each head is aligned to
    that key row (scaled by ``gain``) so the score distribution is sharply peaked."""
    from mcf.abi.kv import quantize_q

    qf = rng.normal(0.0, sigma, (heads, head_dim))
    if peak is not None:
        kf = dequantize(peak.k[peak_row:peak_row + 1], peak.sk[peak_row:peak_row + 1], KV_SCALE)
        qf = qf * 0.2 + gain * kf / np.linalg.norm(kf) * np.sqrt(head_dim)
    return quantize_q(qf)


# --- second KV format: K per channel over groups of tokens (mcf.abi.kv_channel) ----------------

@dataclass
class KVChannelBlock:
    """KV rows of one KV head in the per-channel-K format (codes, not bytes).

    ``ks[t]`` holds the K channel scales of token ``t``'s **group** (its header; rows are
    equal within a group), so any subset of the keys (``take``/``slice``, e.g. a node's shard of
    a two-phase split) keeps its scores: a key's score depends on its own codes, its ``sk`` and
    its group's header only. The engine folds the header into the query once per group
    (:func:`mcf.abi.kv.fold_query`). ``sk`` is ``KV_ONE`` in closed groups (the default) and the
    per-token scale in an open group (:func:`mcf.abi.kv.quantize_k_open`)."""
    k: np.ndarray    # [T, d] INT4 codes
    ks: np.ndarray   # [T, d] KV_SCALE codes of the token's group (one row per group, repeated)
    v: np.ndarray    # [T, d] INT4 codes
    sv: np.ndarray   # [T] KV_SCALE codes (per token)
    pos: np.ndarray  # [T] token positions
    sk: np.ndarray | None = None   # [T] record sk (None: KV_ONE for every token)

    def __post_init__(self):
        if self.sk is None:
            self.sk = np.full(len(self), KV_ONE, dtype=np.int64)

    def __len__(self) -> int:
        return int(np.asarray(self.k).shape[0])

    def take(self, idx) -> KVChannelBlock:
        return KVChannelBlock(self.k[idx], self.ks[idx], self.v[idx], self.sv[idx],
                              self.pos[idx], self.sk[idx])

    def slice(self, lo: int, hi: int) -> KVChannelBlock:
        return self.take(slice(lo, hi))

    @staticmethod
    def concat(blocks: list[KVChannelBlock]) -> KVChannelBlock:
        return KVChannelBlock(*(np.concatenate([getattr(b, f) for b in blocks])
                                for f in ("k", "ks", "v", "sv", "pos", "sk")))

    @staticmethod
    def from_groups(k4, kscale, v4, sv, pos, group: int = KV_GROUP, sk=None) -> KVChannelBlock:
        """From the payload view (``kscale[n_groups, d]``, groups of ``group`` tokens from the
        first row, see :func:`mcf.abi.kv.unpack_kv_channel_block`)."""
        sizes = group_sizes(np.asarray(k4).shape[0], group)
        ks = np.repeat(np.asarray(kscale, dtype=np.int64), sizes, axis=0)
        return KVChannelBlock(np.asarray(k4, dtype=np.int64), ks, np.asarray(v4, dtype=np.int64),
                              np.asarray(sv, dtype=np.int64), np.asarray(pos, dtype=np.int64),
                              None if sk is None else np.asarray(sk, dtype=np.int64))

    @staticmethod
    def quantize_open(k_act, v_act, pos, s_prev=None) -> KVChannelBlock:
        """An open group (decode residual): K prescaled by the previous closed group's channel
        scales ``s_prev`` (``KV_ONE`` if None) and quantised per token, V per token."""
        k_act = np.asarray(k_act, dtype=np.int64)
        d = k_act.shape[1]
        s = np.full(d, KV_ONE, dtype=np.int64) if s_prev is None else np.asarray(s_prev)
        k4, sk = quantize_k_open(k_act, s)
        v4, sv = quantize_kv_rows(np.asarray(v_act, dtype=np.int64))
        return KVChannelBlock(k4, np.repeat(s[None].astype(np.int64), len(k4), axis=0), v4, sv,
                              np.asarray(pos, dtype=np.int64), sk)

    @staticmethod
    def quantize(k_act, v_act, pos, group: int = KV_GROUP) -> KVChannelBlock:
        """ACT K/V rows → block, with the on-chip quantiser (:func:`quantize_kv_channel`)."""
        return KVChannelBlock.from_groups(*quantize_kv_channel(k_act, v_act, group), pos, group)

    def engine_view(self) -> list[tuple[np.ndarray, KVBlock]]:
        """What the engine sees: runs of consecutive rows sharing a header, each as
        ``(header[d], KVBlock)`` with the record ``sk`` as the per-token K scale. Scoring each
        run's KVBlock with the query folded by its header (:func:`mcf.abi.kv.fold_query`)
        gives :func:`channel_scores` bit for bit; the **block** (not the run) stays the unit
        of ``block_state`` (the engine reloads the query between runs during the block's K
        rows; V rows need no fold)."""
        ks = np.asarray(self.ks)
        out, lo = [], 0
        for hi in range(1, len(self) + 1):
            if hi == len(self) or np.any(ks[hi] != ks[lo]):
                idx = slice(lo, hi)
                out.append((ks[lo].copy(), KVBlock(self.k[idx], self.sk[idx], self.v[idx],
                                                   self.sv[idx], self.pos[idx])))
                lo = hi
        return out

    def groups(self, group: int = KV_GROUP) -> np.ndarray:
        """``kscale[n_groups, d]`` of a block whose groups start at row 0 (payload view)."""
        sizes = group_sizes(len(self), group)
        starts = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
        for lo, n in zip(starts, sizes):
            if np.any(self.ks[lo:lo + n] != self.ks[lo]):
                raise ValueError("rows of a group carry different channel scales")
        return np.asarray(self.ks)[starts] if sizes else np.zeros((0, self.k.shape[1]))


def _valid(blk, q_pos: int, causal: bool):
    if causal:
        return np.asarray(blk.pos, dtype=np.int64) <= q_pos
    return np.ones(len(blk), dtype=bool)


def channel_scores(q, sq, blk: KVChannelBlock):
    """Scores ``t[G, T]`` of a per-channel block: per distinct group header, the query is
    folded once (:func:`mcf.abi.kv.fold_query`) and every record of the group is scored with
    the per-token score path and its ``sk`` (``KV_ONE`` in closed groups)."""
    q = np.asarray(q, dtype=np.int64)
    sq = np.asarray(sq, dtype=np.int64)
    heads, head_dim = q.shape
    t = np.zeros((heads, len(blk)), dtype=np.int64)
    if len(blk) == 0:
        return t
    uniq, inv = np.unique(np.asarray(blk.ks, dtype=np.int64), axis=0, return_inverse=True)
    inv = np.asarray(inv).ravel()
    k = np.asarray(blk.k, dtype=np.int64)
    for u in range(uniq.shape[0]):
        idx = np.flatnonzero(inv == u)
        qf, sf = fold_query(q, sq, uniq[u])
        acc = qf @ k[idx].T                                           # exact integer
        t[:, idx] = score(acc, np.asarray(blk.sk)[idx][None, :],
                          q_multiplier(sf[:, 0], head_dim)[:, None],
                          score_shift(sf[:, 1])[:, None])
    return t


def dequantize_k(blk) -> np.ndarray:
    """Real K rows of a block of either format."""
    if isinstance(blk, KVChannelBlock):
        return (np.asarray(blk.k, dtype=np.float64) * KV_SCALE.to_float(blk.ks)
                * KV_SCALE.to_float(blk.sk)[:, None])
    return dequantize(blk.k, blk.sk, KV_SCALE)


class KVChannelCache:
    """One KV head's per-channel-K cache with KIVI's residual buffer (decode model).

    Closed groups are :class:`KVChannelBlock` rows, quantised from ACT rows by the on-chip
    quantiser. Tokens of the group that is not full yet (at most ``group − 1``) wait in the
    **residual buffer** as their ACT K/V rows (the exact input of the quantiser, so a group
    closed during decode has the bits it would have had in a prefill chunk); attention sees
    them as an **open group** (:meth:`KVChannelBlock.quantize_open`): header = the previous
    closed group's channel scales (``KV_ONE`` if none), K prescaled by them and quantised per
    token with its own ``sk`` — scored by the same per-group fold as every group. When the
    group fills it is quantised per channel and replaces the open group; V codes and ``sv`` of
    its tokens do not change (V is per token in both)."""

    def __init__(self, head_dim: int, group: int = KV_GROUP):
        self.head_dim, self.group = head_dim, group
        self.closed: list[KVChannelBlock] = []
        self.res_k = np.zeros((0, head_dim), dtype=np.int64)
        self.res_v = np.zeros((0, head_dim), dtype=np.int64)
        self.res_pos = np.zeros(0, dtype=np.int64)
        self.next_pos = 0

    def __len__(self) -> int:
        return sum(len(b) for b in self.closed) + len(self.res_pos)

    def append(self, k_act, v_act) -> list[KVChannelBlock]:
        """Append ACT K/V rows (a prefill chunk or one decode token, ``[T, d]``); returns the
        groups this closed (each is one group payload for the KV memory)."""
        k_act = np.asarray(k_act, dtype=np.int64).reshape(-1, self.head_dim)
        v_act = np.asarray(v_act, dtype=np.int64).reshape(-1, self.head_dim)
        n = k_act.shape[0]
        self.res_k = np.concatenate([self.res_k, k_act])
        self.res_v = np.concatenate([self.res_v, v_act])
        self.res_pos = np.concatenate([self.res_pos,
                                       np.arange(self.next_pos, self.next_pos + n)])
        self.next_pos += n
        done = []
        while len(self.res_pos) >= self.group:
            g = self.group
            done.append(KVChannelBlock.quantize(self.res_k[:g], self.res_v[:g],
                                                self.res_pos[:g], g))
            self.res_k, self.res_v, self.res_pos = (self.res_k[g:], self.res_v[g:],
                                                    self.res_pos[g:])
        self.closed += done
        return done

    def residual(self) -> KVChannelBlock:
        """The residual tokens as an open group (possibly empty)."""
        s_prev = np.asarray(self.closed[-1].ks[0]) if self.closed else None
        return KVChannelBlock.quantize_open(self.res_k, self.res_v, self.res_pos.copy(), s_prev)

    def blocks(self, max_block: int = 256) -> list:
        """What an attention job reads: closed groups packed into per-channel blocks of at most
        ``max_block`` tokens (whole groups), then the residual block if it is not empty."""
        per = max(1, max_block // self.group)
        out = [KVChannelBlock.concat(self.closed[i:i + per])
               for i in range(0, len(self.closed), per)]
        if len(self.res_pos):
            out.append(self.residual())
        return out

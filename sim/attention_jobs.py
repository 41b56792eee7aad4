"""Stimulus encoding and expected payloads for the attention engine's streams (paper §5), shared
by the amaranth.sim tests, the engine driver (:mod:`mcf.sim.attention_drive`), the benchmarks
(:mod:`mcf.sim.perf`) and the cocotb benches (no cocotb import here). Everything is packed with
the ABI layouts (``mcf.abi.kv``) and predicted with the golden model (``mcf.golden.attention``),
never by the DUT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mcf.abi.kv import (
    KV_ELEM,
    Q_ELEM,
    AttnMode,
    attn_job_layout,
    job_out_words,
    job_payloads,
    kv_beat_layout,
    q_beat_layout,
)
from mcf.abi.quant import SCALE_EXP_BITS
from mcf.abi.softmax import LANE_BITS
from mcf.golden.attention import (
    KVBlock,
    attend_fixed,
    attend_max,
    attend_single,
    normalize_state,
    random_blocks,
    random_query,
)

__all__ = ["Job", "pack", "job_word", "q_words", "k_words", "v_words", "kh_words", "job_k_words",
           "job_v_words", "expected_words", "expected_ends", "words_from_beats", "make_jobs",
           "MASK32"]

MASK32 = (1 << LANE_BITS) - 1


@dataclass
class Job:
    mode: AttnMode
    q: np.ndarray
    sq: np.ndarray
    blocks: list[KVBlock]
    normalize: bool = False
    causal: bool = False
    q_pos: int = 0
    m_fix: np.ndarray | None = None
    extra: dict = field(default_factory=dict)

    @property
    def heads(self) -> int:
        return int(self.q.shape[0])


def pack(layout, **fields) -> int:
    return layout.const(fields).as_bits()


def _lanes_word(values, width: int) -> int:
    word = 0
    for i, v in enumerate(values):
        word |= (int(v) & ((1 << width) - 1)) << (width * i)
    return word


def job_word(job: Job, max_heads: int) -> int:
    return pack(attn_job_layout(max_heads), mode=job.mode, normalize=int(job.normalize),
                causal=int(job.causal), heads=job.heads, n_blocks=len(job.blocks),
                q_pos=job.q_pos)


def q_words(job: Job, lanes: int) -> list[int]:
    lay = q_beat_layout(lanes)
    m_fix = job.m_fix if job.m_fix is not None else np.zeros(job.heads, dtype=np.int64)
    out = []
    for h in range(job.heads):
        for c in range(0, job.q.shape[1], lanes):
            out.append(pack(lay, data=_lanes_word(job.q[h, c:c + lanes], Q_ELEM.width),
                            scale_m=int(job.sq[h, 0]),
                            scale_e=int(job.sq[h, 1]) & ((1 << SCALE_EXP_BITS) - 1),
                            m_fix=int(m_fix[h]) & MASK32))
    return out


def _rows_words(blk: KVBlock, lanes: int, src, is_v: int) -> list[int]:
    lay = kv_beat_layout(lanes)
    d = np.asarray(blk.k).shape[1]
    out = []
    for j in range(len(blk)):
        for c in range(0, d, lanes):
            last = j == len(blk) - 1 and c + lanes >= d
            out.append(pack(lay, data=_lanes_word(src[j, c:c + lanes], KV_ELEM.width),
                            scale_k=int(blk.sk[j]), scale_v=int(blk.sv[j]),
                            pos=int(blk.pos[j]), v=is_v, last=int(last)))
    return out


def k_words(blk: KVBlock, lanes: int) -> list[int]:
    """K-stream beats of a block: its K rows, ``last`` on the final beat."""
    return _rows_words(blk, lanes, blk.k, 0)


def v_words(blk: KVBlock, lanes: int) -> list[int]:
    """V-stream beats of a block: its V rows, ``last`` on the final beat."""
    return _rows_words(blk, lanes, blk.v, 1)


def kh_words(blk, lanes: int, group: int) -> list[int]:
    """Header-stream beats of a per-channel-K block (:class:`mcf.golden.attention.KVChannelBlock`):
    per group of ``group`` rows from the first row, its ``d`` K channel scales, ``lanes`` per
    beat (:func:`mcf.abi.kv.kv_header_layout`)."""
    out = []
    for hdr in blk.groups(group):
        out += [_lanes_word(hdr[c:c + lanes], 16) for c in range(0, len(hdr), lanes)]
    return out


def job_k_words(job: Job, lanes: int) -> list[int]:
    return [w for b in job.blocks for w in k_words(b, lanes)]


def job_v_words(job: Job, lanes: int) -> list[int]:
    """V-stream beats of a job (none in MAX mode: phase 1 needs only the K rows)."""
    if job.mode == AttnMode.MAX:
        return []
    return [w for b in job.blocks for w in v_words(b, lanes)]


def expected_words(job: Job) -> list[int]:
    """The payload words the engine must emit for ``job`` (golden model)."""
    if job.mode == AttnMode.MAX:
        m = attend_max(job.q, job.sq, job.blocks, job.q_pos, job.causal)
        words = [int(x) for x in m]
    else:
        if job.mode == AttnMode.SINGLE:
            st = attend_single(job.q, job.sq, job.blocks, job.q_pos, job.causal)
        else:
            st = attend_fixed(job.q, job.sq, job.blocks, job.m_fix, job.q_pos, job.causal)[0]
        if job.normalize:
            words = [int(x) for x in normalize_state(st).ravel()]
        else:
            words = []
            for h in range(job.heads):
                words += [int(st.m[h]), int(st.l[h]), *(int(x) for x in st.o[h])]
    words = [w & MASK32 for w in words]
    assert len(words) == job_out_words(job.mode, job.normalize, job.heads, job.q.shape[1])
    return words


def expected_ends(job: Job) -> list[int]:
    """Word counts at which the job's payloads end (``last``), relative to the job's start."""
    n = len(expected_words(job))
    k = job_payloads(job.mode, job.normalize, job.heads)
    return [n // k * (i + 1) for i in range(k)]


def words_from_beats(beats, data_width: int) -> tuple[list[int], list[int]]:
    """(words, end indices) from ``(data, keep, last)`` beats; checks keep is a prefix mask."""
    words, ends = [], []
    wpb = data_width // LANE_BITS
    for data, keep, last in beats:
        nbytes = bin(int(keep)).count("1")
        assert keep == (1 << nbytes) - 1 and nbytes % 4 == 0, f"bad keep {keep:#x}"
        assert last or nbytes == data_width // 8, "only the final beat may be partial"
        for i in range(min(wpb, nbytes // 4)):
            words.append((int(data) >> (LANE_BITS * i)) & MASK32)
        if last:
            ends.append(len(words))
    return words, ends


def make_jobs(seed: int, head_dim: int, max_block: int, configs) -> list[Job]:
    """Jobs from compact configs ``(mode, heads, block_lens, kwargs)``; two-phase jobs get the
    maximum of their own blocks (``m_delta`` lowers it to provoke counted violations)."""
    rng = np.random.default_rng(seed)
    jobs = []
    for mode, heads, lens, kw in configs:
        kw = dict(kw)
        peaked = kw.pop("peaked", False)
        pos0 = kw.pop("pos0", 0)
        blocks = random_blocks(rng, lens, head_dim, pos0=pos0)
        flat = KVBlock.concat(blocks) if blocks else None
        q, sq = random_query(rng, heads, head_dim,
                             peak=flat if peaked and flat is not None else None,
                             peak_row=int(rng.integers(len(flat))) if peaked and flat else 0)
        job = Job(mode, q, sq, blocks, **{k: v for k, v in kw.items() if k != "m_delta"})
        if mode == AttnMode.FIXED:
            m = attend_max(q, sq, blocks, job.q_pos, job.causal)
            job.m_fix = m - kw.get("m_delta", 0)
        jobs.append(job)
    return jobs

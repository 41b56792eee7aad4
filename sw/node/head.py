"""The LM head on the node (issue #34 item 2, docs/cluster.md "Who runs what"): the final RMSNorm
and the INT4 head GEMM of one last-layer row as a JOB template, so the host keeps only the
embedding lookup and the token choice.

A head template (:meth:`HeadImage._head_template`) is, on one ACT row ``x``:

1. ``RMSNORM`` of ``x`` with the final norm's GAMMA codes (``QuantModel.norm``);
2. ``REQUANT`` of the normed row (INT8 codes + scale word, as every projection's input);
3. the head GEMM (``M = 1``, ``K = hidden``, ``N = vocab``) as one GEMM job per **vocabulary
   slice** (:func:`head_slices`): each slice's rows are their own weight matrix laid out by
   :func:`mcf.quant.gemm_stripe_image` like every projection, read by the stripe readers
   through one STRIPE entry, whose pitch must stay below :data:`MAX_PITCH`; slice ``[r0, r1)``
   writes its ACT logit words at ``logits + 4·r0``.

The ``vocab`` ACT words at :attr:`HeadImage.logits` are then
:meth:`mcf.golden.model.IntModel.head`'s logit codes bit for bit (the golden's
``V.rmsnorm`` → ``requantize`` → ``gemm``; a GEMM output row depends only on its own weight
row, so slicing the vocabulary does not change a bit); the host reads them and picks the token.

Templates (after the prefill's and the decode's): ``head_template0`` runs the head on the decode
token's last-layer row (``dbufs[-1].buf["y"]``, appended to the root's decode program before
its MARK by :func:`mcf.node.decode.decode_program`); ``head_template0 + 1 + r`` on row ``r`` of
the prefill slice's last-layer output (the prompt's last row, at the node that computed it).

A tensor-parallel decode token (:mod:`mcf.node.tp_decode`) runs the head on every node over the
node's vocabulary rows ``[v0, v1)`` only: :meth:`HeadImage.head_rows` lays out those rows'
stripe images (in the TP image), :meth:`HeadImage._head_template` with ``rows`` builds the
template over them, writing logits ``v0 .. v1 − 1`` at their places, and
:meth:`HeadImage.read_logits` with ``rows`` reads that slice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..abi.compute import STRIPE_ALIGN, StripeJob
from ..abi.jobs import (
    ENTRY_BYTES,
    JOB_ARG,
    STRIPE_PITCH_BITS,
    TemplateBuilder,
    template_image,
)
from ..abi.node import Cmd, Queue, RecordClass
from ..abi.node_config import AXI_WIDTH, NodeConfig
from ..abi.quant import VectorOp, norm_eps_code
from ..quant import QuantWeight, gemm_stripe_image
from .decode import DecodeImage
from .layer import act_bytes
from .layout import REGION_ALIGN

__all__ = ["MAX_PITCH", "HeadImage", "head_slices", "slice_weight", "stripe_bytes_per_row",
           "head_weight_bytes"]

MAX_PITCH = (STRIPE_ALIGN << STRIPE_PITCH_BITS) - STRIPE_ALIGN
"""The largest stripe pitch a template's STRIPE entry carries (8 MiB − 4 KiB): the bound on one
head GEMM job's weight matrix (each of the ``hp_ports`` stripes at most this long)."""


def slice_weight(qw: QuantWeight, r0: int, r1: int) -> QuantWeight:
    """Rows ``r0 .. r1 - 1`` of ``qw`` (their codes and scale mantissas; the shared exponent)."""
    return QuantWeight(qw.q[r0:r1], qw.m[r0:r1], qw.e, qw.group)


def _tile_stripe(k: int, group: int, config: NodeConfig) -> int:
    """Bytes one ``gemm_rows``-row tile adds to each stripe of a ``K = k`` matrix."""
    rows = config.gemm_rows
    qw = QuantWeight(np.zeros((rows, k), dtype=np.int64),
                     np.zeros((rows, k // group), dtype=np.int64), 0, group)
    _, job = gemm_stripe_image(qw, rows, config.gemm_lanes, ports=config.hp_ports,
                               beat_bytes=AXI_WIDTH // 8)
    return job.length


def stripe_bytes_per_row(k: int, group: int, config: NodeConfig) -> float:
    """Weight bytes the stripe readers read per head row (all stripes; codes and scales)."""
    return _tile_stripe(k, group, config) * config.hp_ports / config.gemm_rows


def head_weight_bytes(vocab: int, k: int, group: int, config: NodeConfig) -> int:
    """Bytes of the whole head as the stripe readers read it (every slice, every stripe)."""
    rows = config.gemm_rows
    return -(-vocab // rows) * _tile_stripe(k, group, config) * config.hp_ports


def head_slices(vocab: int, k: int, group: int, config: NodeConfig,
                max_pitch: int = MAX_PITCH) -> list[tuple[int, int]]:
    """The head's vocabulary slices ``[(r0, r1), ...]``: whole ``gemm_rows`` tiles, as many per
    slice as keep a stripe's pitch within ``max_pitch`` (a multiple of
    :data:`~mcf.abi.compute.STRIPE_ALIGN`); the last slice the remainder."""
    rows = config.gemm_rows
    if max_pitch % STRIPE_ALIGN or not 0 < max_pitch <= MAX_PITCH:
        raise ValueError(f"a stripe pitch of {max_pitch}: a multiple of {STRIPE_ALIGN} up to "
                         f"{MAX_PITCH}")
    if vocab % rows:
        raise ValueError(f"a vocabulary of {vocab}: the head GEMM takes a multiple of {rows} "
                         "rows")
    tiles = max_pitch // _tile_stripe(k, group, config)
    if tiles < 1:
        raise ValueError(f"one {rows}-row tile of the head is longer than a {max_pitch}-byte "
                         "stripe pitch")
    step = tiles * rows
    return [(r0, min(r0 + step, vocab)) for r0 in range(0, vocab, step)]


@dataclass
class HeadImage(DecodeImage):
    """:class:`~mcf.node.decode.DecodeImage` plus the LM head (module docstring): the final
    norm's GAMMA codes ``norm``, the head weights ``lm_head`` (the tied embedding or a separate
    ``lm_head``) as one stripe image per vocabulary slice (``max_pitch``:
    :func:`head_slices`), a normed row, its requantised row, the logits (``vocab`` ACT words at
    :attr:`logits`) and ``1 + tokens`` head templates (decode row; each prefill slice row)."""
    lm_head: QuantWeight | None = None
    norm: np.ndarray | None = None
    max_pitch: int = MAX_PITCH
    slices: list[tuple[int, int]] = field(default_factory=list)
    head_jobs: list[StripeJob] = field(default_factory=list)

    def __post_init__(self):
        super().__post_init__()
        if self.lm_head is None or self.norm is None:
            raise ValueError("a HeadImage needs the head weights and the final norm")
        cfg, c, alloc = self.cfg, self.config, self.alloc
        h = cfg.hidden
        vocab, k = self.lm_head.q.shape
        if k != h:
            raise ValueError(f"head weights of K = {k}, hidden {h}")
        self.vocab = vocab
        self.slices = head_slices(vocab, k, self.lm_head.group, c, self.max_pitch)
        self.head_gamma = alloc(h * 4)
        self.image[self.head_gamma] = act_bytes(np.asarray(self.norm) & 0xFFFF)
        self.head_n = alloc(h * 4)
        self.head_xq = alloc(h + 64)
        self.logits = alloc(vocab * 4)
        self.head_jobs = self.head_rows(0, vocab, alloc, self.image)
        self.head_template0 = len(self.templates)
        rows = [self.dbufs[-1].buf["y"]] + [self.bufs[-1].buf["y"] + r * h * 4
                                            for r in range(self.tokens)]
        self.templates += [self._head_template(x) for x in rows]
        del self.image[self.table]
        entries = len(self.templates) + sum(len(t) for t in self.templates)   # table + bodies
        self.table = alloc(ENTRY_BYTES * entries, REGION_ALIGN)
        raw, self.table_len = template_image(self.templates, self.table)
        self.image[self.table] = raw
        self.size = alloc.at - self.layout.base

    def head_rows(self, v0: int, v1: int, alloc, image: dict) -> list[StripeJob]:
        """The stripe images of the head's rows ``[v0, v1)`` (whole ``gemm_rows`` tiles), one
        per :func:`head_slices` slice of those rows, placed by ``alloc`` into ``image``; their
        :class:`~mcf.abi.compute.StripeJob` list (``self.slices`` for the whole head; the
        slices of ``[v0, v1)`` are :meth:`row_slices`)."""
        c = self.config
        jobs = []
        for r0, r1 in self.row_slices(v0, v1):
            raw, job = gemm_stripe_image(slice_weight(self.lm_head, r0, r1), c.gemm_rows,
                                         c.gemm_lanes, ports=c.hp_ports,
                                         beat_bytes=AXI_WIDTH // 8)
            at = alloc(len(raw), STRIPE_ALIGN)
            image[at] = raw
            jobs.append(dataclasses.replace(job, addr=at))
        return jobs

    def row_slices(self, v0: int, v1: int) -> list[tuple[int, int]]:
        """:func:`head_slices` of the head's rows ``[v0, v1)`` (global row numbers)."""
        rows = self.config.gemm_rows
        if v0 % rows or not 0 <= v0 < v1 <= self.vocab:
            raise ValueError(f"head rows {v0}..{v1}: whole {rows}-row tiles of {self.vocab}")
        return [(v0 + a, v0 + b) for a, b in head_slices(v1 - v0, self.cfg.hidden,
                                                         self.lm_head.group, self.config,
                                                         self.max_pitch)]

    def _head_template(self, x: int, rows: tuple[int, int] | None = None,
                       jobs: list[StripeJob] | None = None):
        """The head template on the ACT row at ``x`` over the head's rows ``rows`` (default:
        all) whose stripe images are ``jobs`` (:meth:`head_rows`; default: the image's own):
        RMSNORM, REQUANT, one GEMM per slice writing logit ``r`` at ``logits + 4·r``."""
        cfg, c, h = self.cfg, self.config, self.cfg.hidden
        slices = self.slices if rows is None else self.row_slices(*rows)
        jobs = self.head_jobs if jobs is None else jobs
        t = TemplateBuilder(norm_eps_code(cfg.eps), c.gemm_rows, c.gemm_lanes, c.vec_lanes)
        t.vector(VectorOp.RMSNORM, h, 1, x, self.head_gamma, self.head_n)
        t.requant(h, 1, self.head_n, self.head_xq)
        t.gemms([(self.head_xq, 1, h, job, slice_weight(self.lm_head, r0, r1),
                  self.logits + r0 * 4)
                 for (r0, r1), job in zip(slices, jobs, strict=True)])
        return t.entries

    def head_template(self, row: int | None = None) -> int:
        """The head template on the decode row (``row`` None) or prefill slice row ``row``."""
        if row is None:
            return self.head_template0
        if not 0 <= row < self.tokens:
            raise ValueError(f"row {row} of a {self.tokens}-token slice")
        return self.head_template0 + 1 + row

    def head_job(self, row: int | None = None) -> Cmd:
        """The COMPUTE record running the head (:meth:`head_template`)."""
        return Cmd(RecordClass.JOB, Queue.COMPUTE,
                   arg=JOB_ARG.const({"template": self.head_template(row)}).as_bits())

    def read_logits(self, mem, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The ACT logit codes of the head's rows ``rows`` (default: all ``vocab``) from a
        node's DDR (``mem[a:b]`` by bus address)."""
        v0, v1 = (0, self.vocab) if rows is None else rows
        raw = bytes(mem[self.logits + v0 * 4: self.logits + v1 * 4])
        return np.frombuffer(raw, dtype="<i4").astype(np.int64)

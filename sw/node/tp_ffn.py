"""The tensor-parallel FFN of one decode token on the node (issue #34 item 3, docs/cluster.md
"Tensor-parallel decode"): column-parallel gate/up, SiLU·mul on the node's shard, then the
row-parallel down step of :mod:`mcf.node.tp`, every node ending with the down output row.

Node ``i`` owns the intermediate rows ``r = [r0, r1)`` (:func:`mcf.golden.tp_decode.tp_split`'s
``inter[i]``). Its DDR image (:class:`TPFFNImage`), from byte address ``base``:

* the down step's :class:`~mcf.node.tp.RowParallelImage` for W_down and the K range ``r``
  (its weight shard, bias stripes, ACT input row, buffers and three templates);
* the **gate and up shards**: rows ``r`` of W_gate and W_up as stripe images
  (:func:`mcf.quant.gemm_stripe_image`, K = hidden);
* the **input**: the replicated normed row as the post-attention RMSNorm's requantisation leaves
  it (``hidden`` INT8 codes, then the scale word: the GEMM's activation layout), written by
  :meth:`TPFFNImage.x_writes`;
* ``g`` / ``u``: the node's gate and up rows (``r1 − r0`` ACT words each).

Its four templates (:meth:`TPFFNImage.records` issues them): **0** — GEMM gate and GEMM up over
the shard rows, then ``SILU_MUL`` of ``g`` and ``u`` written straight into the down step's ACT
input row at offset ``r0 − j0·group`` (the row's other words stay zero: "the node's shard at
offset k0 − j0·group, zeros elsewhere"); **1–3** — the down step's ABSMAX, REQUANT_EXT +
``acc_out``, ``acc_in`` (:func:`mcf.node.tp.max_records`, :func:`mcf.node.tp.sum_records` with
``first = 1``).

:func:`mcf.golden.node_tp.golden_ffn` chains the engines' golden models over exactly these
buffers; its output equals :func:`mcf.golden.tp_decode.tp_ffn` and the replicated FFN bit for
bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..abi.compute import STRIPE_ALIGN, StripeJob
from ..abi.jobs import ENTRY_BYTES, JOB_ARG, TemplateBuilder, template_image
from ..abi.node import Cmd, Queue, RecordClass
from ..abi.node_config import AXI_WIDTH, NodeConfig
from ..abi.quant import VectorOp
from ..golden.tp_decode import Range, _rows
from ..quant import QuantWeight, gemm_stripe_image, token_scale_words
from .layer import _Alloc
from .tp import RowParallelImage, max_records, sum_records

__all__ = ["FFNBuffers", "TPFFNImage"]


@dataclass(frozen=True)
class FFNBuffers:
    """Byte addresses of the column-parallel part: ``xq`` the input codes (``hidden`` bytes)
    then its scale word, ``g`` / ``u`` the gate and up rows, ``s`` where SILU_MUL writes (the
    down step's ACT row + ``4·lo``); ``gate`` / ``up`` the shards' stripe jobs."""
    xq: int
    g: int
    u: int
    s: int
    gate: StripeJob
    up: StripeJob


@dataclass
class TPFFNImage:
    """One node's DDR image of the TP FFN for the intermediate rows ``r`` of ``gate``/``up``
    (``I × hidden``) and ``down`` (``hidden × I``), from ``base`` (module docstring); the down
    step's MBUF and SUM-window arguments as :class:`~mcf.node.tp.RowParallelImage`'s. ``image``:
    ``{address: bytes}``; ``templates`` / ``table`` / ``table_len``: the four templates and
    their table."""
    gate: QuantWeight
    up: QuantWeight
    down: QuantWeight
    r: Range
    config: NodeConfig
    base: int
    mbuf_base: int
    q_heads: int
    eps_code: int = 0
    parity: int = 0
    head0: int = 0
    sum_base: int | None = None
    sum_slot0: int = 0
    image: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self):
        c, (r0, r1) = self.config, self.r
        hidden, inter = self.gate.q.shape[1], self.gate.q.shape[0]
        if self.up.q.shape != self.gate.q.shape or self.down.q.shape != (hidden, inter):
            raise ValueError("gate/up must be I x hidden and down hidden x I")
        if not 0 <= r0 < r1 <= inter:
            raise ValueError(f"intermediate rows {self.r} of {inter}")
        ni = r1 - r0
        if ni % c.gemm_rows or ni % c.vec_lanes:
            raise ValueError(f"{ni} gate/up rows are not whole {c.gemm_rows}-row tiles")
        if not c.gemm_limits.accepts(1, hidden // c.gemm_lanes, ni // c.gemm_rows):
            raise ValueError(f"the {c.name} GEMM refuses a {ni} x {hidden} gate/up shard")
        self.row = RowParallelImage(self.down, self.r, c, self.base, self.mbuf_base,
                                    self.q_heads, self.eps_code, parity=self.parity,
                                    head0=self.head0, sum_base=self.sum_base,
                                    sum_slot0=self.sum_slot0)
        self.image.update(self.row.image)
        del self.image[self.row.table]          # the FFN's table holds the down templates
        s = self.row.buf.x + self.row.shard.lo * 4
        if s % (AXI_WIDTH // 8):
            raise ValueError("the SiLU shard does not start on a bus beat of the ACT row")
        alloc = _Alloc(self.row.end)
        beat = AXI_WIDTH // 8
        jobs = {}
        for name in ("gate", "up"):
            raw, job = gemm_stripe_image(_rows(getattr(self, name), self.r), c.gemm_rows,
                                         c.gemm_lanes, ports=c.hp_ports, beat_bytes=beat)
            at = alloc(len(raw), STRIPE_ALIGN)
            self.image[at] = raw
            jobs[name] = dataclasses.replace(job, addr=at)
        self.buf = FFNBuffers(xq=alloc(hidden + beat), g=alloc(ni * 4), u=alloc(ni * 4), s=s,
                              **jobs)
        self.templates = [self._column(), *self.row.templates]
        self.table = alloc(ENTRY_BYTES * (len(self.templates)
                                          + sum(len(t) for t in self.templates)), STRIPE_ALIGN)
        raw, self.table_len = template_image(self.templates, self.table)
        self.image[self.table] = raw
        self.end = alloc.at

    @property
    def hidden(self) -> int:
        return self.gate.q.shape[1]

    def _column(self):
        c, b, (r0, r1) = self.config, self.buf, self.r
        t = TemplateBuilder(self.eps_code, c.gemm_rows, c.gemm_lanes, c.vec_lanes)
        t.gemms([(b.xq, 1, self.hidden, b.gate, _rows(self.gate, self.r), b.g),
                 (b.xq, 1, self.hidden, b.up, _rows(self.up, self.r), b.u)])
        t.vector(VectorOp.SILU_MUL, r1 - r0, 1, b.g, b.u, b.s, b_stride=(r1 - r0) * 4)
        return t.entries

    def x_writes(self, xq, xm, xe) -> dict[int, bytes]:
        """The replicated normed row: ``hidden`` INT8 codes ``xq`` and its scale ``xm``/``xe``
        (:func:`mcf.abi.quant.requantize`'s) into the input buffer."""
        codes = np.asarray(xq, dtype=np.int64).ravel()
        if codes.size != self.hidden:
            raise ValueError(f"{codes.size} codes for a {self.hidden}-wide row")
        raw = codes.astype(np.int8).tobytes() + token_scale_words(np.atleast_1d(xm),
                                                                  np.atleast_1d(xe))
        return {self.buf.xq: raw}

    def records(self, node: int, root: int, nodes: int, reduce_route: int, bcast_route: int,
                qbuf_base: int, tag_base: int, first: int = 0, maxes_landed: int = 0,
                sums_landed: int = 0) -> list[Cmd]:
        """``node``'s COMPUTE records of the FFN (the table's templates from ``first``): the
        column JOB, then the down step's :func:`~mcf.node.tp.max_records` and
        :func:`~mcf.node.tp.sum_records` (their arguments; ``maxes_landed`` / ``sums_landed``
        their ``landed``: the landings of earlier steps since the last clearing MARK)."""
        args = (self.row, node, root, nodes, reduce_route, bcast_route, qbuf_base, tag_base,
                first + 1)
        column = Cmd(RecordClass.JOB, Queue.COMPUTE,
                     arg=JOB_ARG.const({"template": first}).as_bits())
        return [column] + max_records(*args, landed=maxes_landed) + \
            sum_records(*args, landed=sums_landed)

"""The post-attention half of a tensor-parallel decode layer on the node (issue #34 item 3,
docs/cluster.md "Tensor-parallel decode"): the row-parallel O step over the node's query heads,
then on every node the residual ADD, RMSNorm and REQUANT of the whole hidden row into the TP
FFN's input, the FFN (:mod:`mcf.node.tp_ffn`) and the final residual ADD — the ops and order of
:func:`mcf.golden.tp_decode.tp_post_attention` (:func:`~mcf.golden.tp_decode.tp_layer` after
attention), every node ending with the layer's output row.

Node ``i`` of a :class:`~mcf.golden.tp_decode.TPSplit` holds the attention rows of its query
heads (the O step's K range ``split.q_rows(i)``; written by the host for now,
:meth:`TPPostImage.att_writes`) and the layer's input row ``x`` (the residual, replicated;
:meth:`TPPostImage.x_writes`). Its DDR image (:class:`TPPostImage`), from byte address ``base``:

* the **SUM window**: ``2·S`` decode-lander SUM slots (``S`` = the payloads of one ``hidden``
  row, :func:`mcf.node.tp.sum_payloads`), the O step's result in slots ``0 … S−1``, the down
  step's in ``S … 2S−1`` (:meth:`TPPostImage.sum_registers`: one ``SUM_BASE``, ``DEC_SUM_SLOTS
  = 2S``);
* the buffers ``x``, ``g2`` (γ2 codes), ``h``, ``n2``, ``y`` (:class:`PostBuffers`);
* the O step's :class:`~mcf.node.tp.RowParallelImage` (W_o's columns ``q_rows(i)``, its MAX
  result in MBUF slot ``(parity, head0 = 0)``) and the :class:`~mcf.node.tp_ffn.TPFFNImage` of
  the node's intermediate rows (its down step's MAX result in slot ``(parity, head0 = 1)``);
  the two steps' tags are therefore distinct too (``TAG_BASE + 0`` / ``+ 1`` for the maxima,
  the SUM window's ``sum_tag(…, 0 … 2S−1)`` for the sums);
* one template table of nine templates: **0–2** the O step's (ABSMAX; REQUANT_EXT + GEMM
  ``acc_out``; GEMM ``acc_in`` → ``o.y``); **3** ``ADD(x, o.y) → h``, ``RMSNORM(h, γ2) → n2``,
  ``REQUANT(n2)`` → the FFN's input (``hidden`` codes and the scale word at its ``xq``);
  **4–7** the FFN's (column gate/up + SILU_MUL; the down step's three); **8** ``ADD(h, d.y) →
  y``.

**Two all-reduce steps in one token: cumulative WAIT thresholds.** ``MAXES_LANDED`` and
``SUMS_LANDED`` count from the last MARK that cleared them; the down step waits for
``MAXES_LANDED ≥ 2`` and ``SUMS_LANDED ≥ 2S`` (the O step's landings plus its own) instead of a
clearing MARK between the steps. Chosen because (1) it costs no record and no pipeline drain
between the steps on the token's critical path; (2) a clearing MARK would clear the counters'
whole mask — the decode token's ``COUNTER_CLEAR`` also clears ``RESULTS_LANDED`` /
``QUERIES_LANDED``, which attention on the same rings uses — or need a mask of its own; (3) it
cannot be early: a node's down-step result can land only after the reduction has every node's
contribution, its own included, which the node sends after its O step's WAIT; (4) the counts at
the token's end (2 maxima, ``2S`` sums) show both steps landed. The price: a step's threshold
depends on the steps before it in the token (here fixed: O then down).

:func:`mcf.golden.node_tp.golden_post` chains the engines' golden models over exactly these
buffers (:func:`~mcf.golden.node_tp.golden_step`, ``V.residual_add``, ``V.rmsnorm``,
:func:`mcf.abi.quant.requantize`, :func:`~mcf.golden.node_tp.golden_ffn`); its output equals
:func:`mcf.golden.tp_decode.tp_post_attention` bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..abi.compute import STRIPE_ALIGN
from ..abi.decode_land import DEC_ADDR_BITS, SUM_SLOT_BYTES, SUM_SLOTS_BITS
from ..abi.jobs import ENTRY_BYTES, JOB_ARG, TemplateBuilder, template_image
from ..abi.node import Cmd, Queue, RecordClass
from ..abi.node_config import NodeConfig
from ..abi.quant import VectorOp, norm_eps_code
from ..golden.qwen_layer import LayerConfig, QuantLayer
from ..golden.tp_decode import TPSplit
from .layer import _Alloc, act_bytes
from .tp import RowParallelImage, max_records, sum_payloads, sum_records
from .tp_ffn import TPFFNImage

__all__ = ["PostBuffers", "TPPostImage"]

_NORM, _FFN, _FINAL = 3, 4, 8          # template indices (module docstring)


@dataclass(frozen=True)
class PostBuffers:
    """Byte addresses of the layer's own buffers: ``window`` the SUM window (``SUM_BASE``),
    ``x`` the input row, ``g2`` the γ2 codes, ``h`` = ``x + o.y``, ``n2`` its RMSNorm, ``y``
    the output row (``hidden`` ACT words each)."""
    window: int
    x: int
    g2: int
    h: int
    n2: int
    y: int


@dataclass
class TPPostImage:
    """Node ``node``'s DDR image of a layer's post-attention half (module docstring) for the
    quantised layer ``ql`` of ``cfg`` split by ``split``, from ``base``; MBUF at ``mbuf_base``
    with ``q_heads`` slots per parity, the two steps' maxima in ``(parity, 0)`` and
    ``(parity, 1)``. ``o`` / ``ffn``: the steps' images; ``image``: ``{address: bytes}``;
    ``templates`` / ``table`` / ``table_len``: the nine templates and their table. ``x_at`` /
    ``window_at`` / ``o_x_at``: the input row, the SUM window and the O step's padded input row
    where another part of the node's image keeps them (None: its own; every layer of a TP token
    shares one window, :mod:`mcf.node.tp_decode`)."""
    ql: QuantLayer
    cfg: LayerConfig
    split: TPSplit
    node: int
    config: NodeConfig
    base: int
    mbuf_base: int
    q_heads: int
    parity: int = 0
    x_at: int | None = None
    window_at: int | None = None
    o_x_at: int | None = None
    image: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self):
        c, cfg, h = self.config, self.cfg, self.cfg.hidden
        if self.q_heads < 2:
            raise ValueError("the two steps' maxima need two MBUF slots (q_heads >= 2)")
        if h % c.vec_lanes:
            raise ValueError(f"hidden {h} is not whole {c.vec_lanes}-lane beats")
        self.sum_step = len(sum_payloads(h, 0, 0, 0, 0))
        if 2 * self.sum_step >= 1 << SUM_SLOTS_BITS:
            raise ValueError(f"hidden {h} needs {2 * self.sum_step} SUM slots")
        alloc = _Alloc(self.base)
        window = alloc(2 * self.sum_step * SUM_SLOT_BYTES) if self.window_at is None \
            else self.window_at
        x = alloc(h * 4) if self.x_at is None else self.x_at
        g2 = alloc(h * 4)
        if self.x_at is None:
            self.image[x] = bytes(h * 4)
        self.image[g2] = act_bytes(self.ql.gamma["g2"] & 0xFFFF)
        self.buf = PostBuffers(window, x, g2, alloc(h * 4), alloc(h * 4), alloc(h * 4))
        eps = norm_eps_code(cfg.eps)
        self.o = RowParallelImage(self.ql.qw["o"], self.split.q_rows(self.node), c,
                                  alloc(0, STRIPE_ALIGN), self.mbuf_base, self.q_heads, eps,
                                  parity=self.parity, head0=0, sum_base=window, sum_slot0=0,
                                  x_at=self.o_x_at)
        self.ffn = TPFFNImage(self.ql.qw["gate"], self.ql.qw["up"], self.ql.qw["down"],
                              self.split.inter[self.node], c, self.o.end, self.mbuf_base,
                              self.q_heads, eps, parity=self.parity, head0=1, sum_base=window,
                              sum_slot0=self.sum_step)
        for part in (self.o, self.ffn):
            self.image.update(part.image)
            del self.image[part.table]          # the layer's table holds every template
        if len(self.ffn.templates) != _FINAL - _FFN or len(self.o.templates) != _NORM:
            raise AssertionError("the template indices do not match the steps' templates")
        self.templates = [*self.o.templates, self._norm(), *self.ffn.templates, self._final()]
        alloc = _Alloc(self.ffn.end)
        self.table = alloc(ENTRY_BYTES * (len(self.templates)
                                          + sum(len(t) for t in self.templates)), STRIPE_ALIGN)
        raw, self.table_len = template_image(self.templates, self.table)
        self.image[self.table] = raw
        self.end = alloc.at

    def _builder(self) -> TemplateBuilder:
        c = self.config
        return TemplateBuilder(norm_eps_code(self.cfg.eps), c.gemm_rows, c.gemm_lanes,
                               c.vec_lanes)

    def _norm(self):
        b, h = self.buf, self.cfg.hidden
        t = self._builder()
        t.vector(VectorOp.ADD, h, 1, b.x, self.o.buf.y, b.h, b_stride=h * 4)
        t.vector(VectorOp.RMSNORM, h, 1, b.h, b.g2, b.n2)
        t.requant(h, 1, b.n2, self.ffn.buf.xq)
        return t.entries

    def _final(self):
        b, h = self.buf, self.cfg.hidden
        t = self._builder()
        t.vector(VectorOp.ADD, h, 1, b.h, self.ffn.row.buf.y, b.y, b_stride=h * 4)
        return t.entries

    # ---- host writes ---------------------------------------------------------------------------
    def sum_registers(self) -> dict[str, int]:
        """The decode lander's SUM window of both steps: ``SUM_BASE`` = ``window``,
        ``DEC_SUM_SLOTS`` = ``2S``."""
        base = self.buf.window % (1 << DEC_ADDR_BITS)
        regs = {"SUM_BASE_LO": base & 0xFFFF_FFFF, "SUM_BASE_HI": base >> 32,
                "DEC_SUM_SLOTS": 2 * self.sum_step}
        if regs != self.ffn.row.sum_registers():
            raise AssertionError("the down step's slots are not the window's last")
        return regs

    def x_writes(self, x) -> dict[int, bytes]:
        """The layer's input row (``hidden`` ACT words, the residual)."""
        x = np.asarray(x, dtype=np.int64).ravel()
        if x.size != self.cfg.hidden:
            raise ValueError(f"{x.size} words for a {self.cfg.hidden}-wide row")
        return {self.buf.x: act_bytes(x)}

    def att_writes(self, att) -> dict[int, bytes]:
        """The node's attention rows, taken from the whole ``[H_q·d]`` rows ``att``."""
        a, b = self.split.q_rows(self.node)
        return self.o.x_writes(np.asarray(att, dtype=np.int64).ravel()[a:b])

    def records(self, root: int, reduce_route: int, bcast_route: int, qbuf_base: int,
                tag_base: int, first: int = 0, maxes_landed: int = 0,
                sums_landed: int = 0) -> list[Cmd]:
        """The node's COMPUTE records of the half (no MARK): the O step's
        :func:`~mcf.node.tp.max_records` / :func:`~mcf.node.tp.sum_records`, the norm JOB, the
        FFN's :meth:`~mcf.node.tp_ffn.TPFFNImage.records` with the O step's landings counted in
        (cumulative WAIT thresholds, module docstring), the final ADD JOB. ``first``: the half's
        first template in the node's table; ``maxes_landed`` / ``sums_landed``: the landings of
        earlier steps since the counters were last cleared (earlier layers of the token)."""
        args = (self.node, root, self.split.nodes, reduce_route, bcast_route, qbuf_base,
                tag_base)
        return [*max_records(self.o, *args, first=first, landed=maxes_landed),
                *sum_records(self.o, *args, first=first, landed=sums_landed),
                self.job(_NORM, first),
                *self.ffn.records(*args, first=first + _FFN, maxes_landed=maxes_landed + 1,
                                  sums_landed=sums_landed + self.o.sum_slots),
                self.job(_FINAL, first)]

    def job(self, template: int, first: int = 0) -> Cmd:
        if not 0 <= template < len(self.templates):
            raise ValueError(f"template {template} of {len(self.templates)}")
        return Cmd(RecordClass.JOB, Queue.COMPUTE,
                   arg=JOB_ARG.const({"template": first + template}).as_bits())

"""The decode step on the node top (issue #11 §1.4, docs/node.md §7; paper §4, KV-stationary
decode): after a MARS prefill has left the prompt's KV with its owners, one decode token ``k``
runs every layer on the cluster from the rings alone — the root (MARS's
:meth:`~mcf.mars.plan.Plan.decode_owner`) computes the token, every node attends over the KV it
holds, the reduction engines merge the per-node states along MARS's tree and the root's decode
lander normalises the result into ``OBUF``, the O-projection's input.

Per layer ``l`` the COMPUTE records are (:func:`decode_program`):

* **root** — ``JOB`` (template ``2L + 2l``, one token: RMSNorm, Q/K/V, RoPE; K/V into the
  token's ACT K/V row; Q requantised per query head into the root's query records, one record
  per KV head); the **query multicast**: MARS's query records, cut at KV-head groups (below),
  each a ``SEND src=QBUF`` of its record; one ``EMIT`` per KV head — the new token's K/V landed
  locally only (decode KV is owner-only at the root), in the root's **decode block**; a NOP
  barrier until the EMITs have landed.
* **every node** (the root too) — per KV head ``g``: (holders) ``WAIT(QUERIES_LANDED ≥ n)``
  for the payload that carries ``g``'s heads, ``ATTEND`` (DECODE, ``H_q/H_kv`` heads) over the
  KV blocks the node owns in list order (the root's list ends with its decode block), then one
  ``SEND src=ATTN`` per query head with MARS's ``PARTIAL_STATE`` Meta. A node that owns no KV
  sends the empty state from DDR (``SEND src=QBUF`` of a constant payload).
* **root** — ``WAIT(RESULTS_LANDED ≥ H_q·(l+1))``, then ``JOB`` (template ``2L + 2l + 1``:
  requantise the layer parity's ``OBUF`` rows, O projection, residual, RMSNorm, SwiGLU MLP,
  residual) — the next layer's input.

**Two-phase** (a :class:`DecodeImage` with ``softmax="two_phase"``): the ATTEND of each KV
head is split so that the result does not depend on how the KV is spread over the nodes —

* every node, per KV head ``g`` (after its query): ``ATTEND`` (DECODE, MAX) → ``SEND src=ATTN``
  of the ``H_q/H_kv`` maxima as an ``Op.REDUCTION`` with ``ReduceOp.MAX`` on the states'
  reduction route and tag (:func:`max_meta`; a node without KV sends ``M_EMPTY`` words from
  DDR); the root's engine lands the all-reduced maxima in its **MBUF** slot;
* every node, per KV head: ``WAIT(MAXES_LANDED ≥ l·H_kv + g + 1)``; the root then multicasts
  its MBUF slot to the others on the query's broadcast tree (``SEND src=QBUF``, landed in
  their MBUF); ``ATTEND`` (DECODE, FIXED, the list header's ``out_addr`` = that MBUF slot) and
  the states' SENDs as in the single pass. A state leaves a node only after its KV head's
  maxima landed there, so a MAX reduction and the state reduction with the same tag are never
  open in one engine at once. States with one ``m`` merge (``SOFTMAX_MERGE``) as exact sums.

The token's COMPUTE ring ends with a ``MARK`` (interrupt; on a
:class:`mcf.node.head.HeadImage` the root's record before it is the LM head's ``JOB``,
:meth:`DecodeImage.head_job`: final RMSNorm and the head GEMM on the last layer's output, the
logits into DDR) whose clear mask re-bases
``RESULTS_LANDED``, ``QUERIES_LANDED``, ``MAXES_LANDED`` and ``SUMS_LANDED``
(:data:`COUNTER_CLEAR`): the next token counts from zero
(the first token counts from reset — a prefill lands none of them); at the root it is the
token's end.
The NET ring holds one ``MARK`` without interrupt (decode sends nothing from NET; the two
queues' MARK counts stay equal).

**Where decode KV lives.** MARS names no ``kv_id`` for decode-appended KV; this module gives
the root's decode tokens **decode blocks**: block ``C + 1 + b`` of the root's slice in MARS's
formula (``kv_id = ((block − 1)·N + slice)·L + layer``), each a normal KV slot of ``⌈B/N⌉``
tokens per KV head. :func:`decode_layout` is :meth:`NodeLayout.for_plan` with those slots added
to the KV region and one ``LAND_OFF`` entry per (token, KV head) of a decode block after the
prefill's fragments (:func:`decode_seq`).

**Queries at KV-head granularity.** An ATTEND reads one query record of exactly ``H_q/H_kv``
heads (its header's ``heads``), so each MARS query fragment is sent as one payload per KV head
(:func:`query_payloads`: same Meta, ``kv_id = decode_tag(k, head0)``, the length of ``H_q/H_kv``
heads); a holder's payloads land in QBUF slots ``(l mod 2)·H_q + g·H_q/H_kv``.

**The golden**: :func:`mcf.golden.node_decode.golden_decode` (the hardware's order: each
node's single-pass ATTEND over its list, the states merged along the reduction tree, the root's
``normalize``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..abi.attend import (
    ATT_ENTRY_BYTES,
    AttendArg,
    AttendBlock,
    AttendHeader,
    AttendMode,
    AttendSoftmax,
    attend_list_bytes,
    max_payload_bytes,
)
from ..abi.csrmap import node_regmap
from ..abi.decode_land import mbuf_slot, obuf_row_bytes, tag_head
from ..abi.emit import EmitArg
from ..abi.jobs import ENTRY_BYTES, JOB_ARG, TemplateBuilder, template_image
from ..abi.kv import kv_token_bytes
from ..abi.kv_reader import block_address
from ..abi.landing import LAND_OFF_ENTRIES, KvLayout, LandingConfig
from ..abi.meta import Collective, Meta, Op, ReduceOp, Stage
from ..abi.node import Cmd, PayloadSource, Queue, RecordClass
from ..abi.quant import VectorOp, norm_eps_code, rope_words
from ..abi.query import (
    QUERY_HEADER,
    QUERY_HEADER_BYTES,
    query_bytes,
    query_head_bytes,
)
from ..abi.regs import RegisterMap
from ..abi.sequencer import SeqCounter
from ..abi.softmax import M_EMPTY, empty_state, pack_state
from .layer import ModelImage, act_bytes, pair_ordered, slice_positions
from .layout import REGION_ALIGN, NodeLayout
from .program import Write, route_writes

__all__ = ["DecodeImage", "DecodeBuffers", "DecodeProgram", "decode_layout", "decode_kv_id",
           "decode_seq", "decode_slot", "owned_blocks", "query_payloads", "decode_writes",
           "decode_program", "reduction_parents", "slice_tokens", "COUNTER_CLEAR", "max_meta"]

COUNTER_CLEAR = (1 << SeqCounter.RESULTS_LANDED.value) | (1 << SeqCounter.QUERIES_LANDED.value) \
    | (1 << SeqCounter.MAXES_LANDED.value) | (1 << SeqCounter.SUMS_LANDED.value)
"""The clear mask of a decode token's last MARK: every decode-lander counter a token's WAITs
test. ``SUMS_LANDED`` (tensor-parallel decode's SUM window) does not move in replicated decode
(``DEC_SUM_SLOTS = 0`` closes the window), so re-basing it there changes nothing; a TP token's
cumulative thresholds (:mod:`mcf.node.tp_layer`) then count from its own start."""


def slice_tokens(plan) -> int:
    """Tokens of a slice, and of a decode block: ``⌈B/N⌉``."""
    return -(-plan.chunk // plan.cluster.nodes)


def _prefill_seqs(plan) -> int:
    return len(plan.encoder.fragments(slice_tokens(plan)))


def decode_seq(plan, token: int, kv_head: int) -> int:
    """``Meta.seq`` of token ``token`` (0-based in its decode block) of KV head ``kv_head``: the
    ``LAND_OFF`` entries after the prefill's fragments."""
    seq = _prefill_seqs(plan) + token * plan.model.kv_heads + kv_head
    if not 0 <= token < slice_tokens(plan) or seq >= LAND_OFF_ENTRIES:
        raise ValueError(f"decode token {token} of KV head {kv_head} has no LAND_OFF entry "
                         f"({LAND_OFF_ENTRIES} entries, {slice_tokens(plan)} tokens a block)")
    return seq


def decode_kv_id(plan, layer: int, node: int, block: int = 0) -> int:
    """``kv_id`` of ``node``'s decode block ``block`` (0-based) in ``layer``: MARS's formula for
    block ``C + 1 + block`` of slice ``node``."""
    return plan.encoder.kv_id(layer, plan.num_chunks + 1 + block, node)


def decode_layout(plan, config, base: int = 0, cmd_log2: int = 10,
                  decode_blocks: int = 1, held: int | None = None) -> NodeLayout:
    """:meth:`NodeLayout.for_plan` with ``decode_blocks`` decode blocks per node added to the KV
    region (``KV_COUNT = L·(C + decode_blocks)·N``; QBUF and OBUF move up) and the
    ``LAND_OFF`` entries of :func:`decode_seq` — for the first ``held`` tokens of a decode
    block (``None``: all ``⌈B/N⌉``; a run passes the most decode tokens one node holds, so a
    large slice does not ask for entries no token uses)."""
    if decode_blocks < 1:
        raise ValueError("decode_blocks must be at least 1")
    if held is not None and held < 0:
        raise ValueError("held must be at least 0")
    lay = NodeLayout.for_plan(plan, config, base, cmd_log2)
    n, layers = plan.cluster.nodes, plan.model.layers
    count = layers * (plan.num_chunks + decode_blocks) * n
    if count > config.kv_count:
        raise ValueError(f"{count} kv_ids with {decode_blocks} decode blocks; the "
                         f"{config.name} node's directory holds {config.kv_count}")
    kvl = lay.kv_layout
    table = list(kvl.land_off)
    rec = kv_token_bytes(plan.model.head_dim)
    T = slice_tokens(plan)
    for t in range(T if held is None else min(T, held)):
        for g in range(plan.model.kv_heads):
            table[decode_seq(plan, t, g)] = g * kvl.head_stride + t * rec

    def end(c: int) -> int:
        a = lay.kv.kv_base + c * lay.kv.kv_slot
        return -(-a // REGION_ALIGN) * REGION_ALIGN

    shift = end(count) - end(lay.kv.kv_count)
    return replace(lay, kv=LandingConfig(lay.kv.kv_base, lay.kv.kv_slot, count),
                   kv_layout=KvLayout(kvl.head_stride, kvl.kv_slot, tuple(table)),
                   qbuf_base=lay.qbuf_base + shift, obuf_base=lay.obuf_base + shift,
                   mbuf_base=lay.mbuf_base + shift,
                   size=lay.size + shift)


def decode_slot(plan, k: int) -> tuple[int, int]:
    """``(root, j)``: token ``k``'s owner and its index among the owner's decode tokens."""
    root = plan.decode_owner(k)
    return root, sum(plan.decode_owner(i) == root for i in range(k))


def _decode_tokens(plan, k: int, node: int) -> list[int]:
    """Decode tokens ``≤ k`` whose KV ``node`` holds, in its order (KV-stationary)."""
    return [i for i in range(k + 1) if plan.decode_owner(i) == node]


def owned_blocks(plan) -> dict[int, list[tuple[int, int]]]:
    """The prompt's ``(block, slice)`` KV blocks each node owns after the prefill (MARS's
    directory), in ``(block, slice)`` order: what a node's decode ATTEND lists name."""
    d = plan.scheduler.dir
    out: dict[int, list] = {n: [] for n in range(plan.cluster.nodes)}
    for key in sorted(d.slices()):
        out[d.owner(key)].append(key)
    return out


def query_payloads(plan, k: int, rep: int) -> list[tuple[int, Meta, int]]:
    """The root's query payloads of token ``k`` in issue order: MARS's query records
    (:meth:`~mcf.mars.plan.Plan.decode_records`) cut into one payload per KV head of ``rep``
    query heads — ``(wait, meta, head0)``, ``wait`` being MARS's ``Record.wait`` on the first
    payload of a record. Raises ``ValueError`` if a MARS fragment splits a KV-head group."""
    enc, hd = plan.encoder, plan.model.head_dim
    tag0 = enc.decode_tag(k, 0)
    out = []
    for r in plan.decode_records(k):
        if r.meta.op != Op.QUERY:
            continue
        head0 = tag_head(r.meta.kv_id, tag0)
        count = (r.meta.length - QUERY_HEADER_BYTES) // query_head_bytes(hd)
        if head0 % rep or count % rep:
            raise ValueError(f"query fragment of heads {head0}..{head0 + count - 1} splits a "
                             f"group of {rep} query heads (one ATTEND reads whole groups)")
        for i, h0 in enumerate(range(head0, head0 + count, rep)):
            meta = replace(r.meta, kv_id=enc.decode_tag(k, h0), length=query_bytes(rep, hd))
            out.append((r.wait if i == 0 else 0, meta, h0))
    return out


def reduction_parents(plan, root: int) -> dict[int, int]:
    """Parent of every other node on ``root``'s reduction tree (MARS's routes)."""
    routes = plan.scheduler.routes
    return {n: routes.parent(root, n) for n in range(plan.cluster.nodes) if n != root}


# ---- the node's decode image -------------------------------------------------------------------


@dataclass
class DecodeBuffers:
    """One layer's one-token buffers: input row ``x``, the same named rows as the prefill's
    :class:`~mcf.node.layer.LayerBuffers`, requantised rows ``xq``, the token's ACT K/V row
    ``kv`` (EMIT row ``row``) and the root's query records ``qrec`` (one per KV head)."""
    x: int
    buf: dict[str, int]
    xq: dict[int, int]
    kv: int
    row: int
    qrec: int


@dataclass
class DecodeImage(ModelImage):
    """:class:`~mcf.node.layer.ModelImage` plus what a decode token needs: one-token buffers
    per layer (:class:`DecodeBuffers`), the decode position's RoPE words, the constant empty
    state and empty maxima (``M_EMPTY`` words: a node without KV in a two-phase run), two more
    templates per layer (``2L + 2l``, ``2L + 2l + 1``; the table is rebuilt with the
    prefill's first) and a list region, one list per (layer, KV head) of up to ``max_blocks``
    prompt blocks plus the decode blocks. Build it on a :func:`decode_layout`."""
    decode_blocks: int = 1
    dbufs: list[DecodeBuffers] = field(default_factory=list)

    def __post_init__(self):
        super().__post_init__()
        cfg, alloc = self.cfg, self.alloc
        hd, h, inter = cfg.head_dim, cfg.hidden, cfg.intermediate
        nq, nkv, L = cfg.heads * hd, cfg.kv_heads * hd, len(self.layers)
        rep = cfg.heads // cfg.kv_heads

        def put(raw: bytes) -> int:
            a = alloc(len(raw))
            self.image[a] = raw
            return a

        self.drq = alloc(nq * 4)
        self.drk = alloc(hd * 4)
        self.empty = put(pack_state(*empty_state(hd)))
        self.empty_max = put(np.full(rep, M_EMPTY & 0xFFFF_FFFF, dtype="<u4").tobytes())
        if self.empty < self.layout.qbuf_base:
            raise ValueError("the image must lie above QBUF (SEND src=QBUF offsets)")
        stride = self.row_stride
        a = alloc(L * stride + stride)
        kv0 = a + (-(a - self.kv)) % stride
        x = alloc(h * 4)
        self.dx0 = x
        for layer in range(L):
            buf = {name: alloc(n * 4) for name, n in (
                ("n1", h), ("q", nq), ("k", nkv), ("v", nkv), ("qr", nq), ("o", h), ("h", h),
                ("n2", h), ("g", inter), ("u", inter), ("s", inter), ("d", h), ("y", h))}
            xq = {n: alloc(n + 64) for n in (h, nq, inter)}
            row = (kv0 - self.kv) // stride + layer
            qrec = alloc(cfg.kv_heads * self.q_slot)
            self.dbufs.append(DecodeBuffers(x, buf, xq, kv0 + layer * stride, row, qrec))
            x = buf["y"]
        self.template0 = 2 * L
        templates = [t for lb in self.bufs for t in self._templates(lb)]
        for layer in range(L):
            templates += self._decode_templates(layer)
        self.templates = templates
        del self.image[self.table]
        self.table = alloc(ENTRY_BYTES * (len(templates) + sum(len(t) for t in templates)),
                           REGION_ALIGN)     # the table's rows, then every entry
        raw, self.table_len = template_image(templates, self.table)
        self.image[self.table] = raw
        self.per_list = 1 + self.max_blocks + self.decode_blocks
        self.dlists = alloc(L * cfg.kv_heads * self.per_list * ATT_ENTRY_BYTES, REGION_ALIGN)
        last = (self.dlists - self.lists) // ATT_ENTRY_BYTES + L * cfg.kv_heads * self.per_list
        if last > 1 << 16 or self.dbufs[-1].row >= 1 << 16:
            raise ValueError("decode lists or K/V rows beyond the ATTEND/EMIT index range")
        self.size = alloc.at - self.layout.base

    def _decode_templates(self, layer: int):
        cfg, c = self.cfg, self.config
        hd, h, inter = cfg.head_dim, cfg.hidden, cfg.intermediate
        nq, nkv = cfg.heads * hd, cfg.kv_heads * hd
        rep, pair = cfg.heads // cfg.kv_heads, 2 * hd * 4
        lb, db = self.bufs[layer], self.dbufs[layer]
        mats = pair_ordered(self.layers[layer], cfg)
        buf, xq = db.buf, db.xq

        def mm(names, k, xa):
            return [(xq[xa], 1, k, lb.blobs[n], mats[n][0], buf[s]) for n, s in names]

        eps = norm_eps_code(cfg.eps)
        t0 = TemplateBuilder(eps, c.gemm_rows, c.gemm_lanes, c.vec_lanes)
        t0.vector(VectorOp.RMSNORM, h, 1, db.x, lb.g1, buf["n1"])
        t0.requant(h, 1, buf["n1"], xq[h])
        t0.gemms(mm((("q", "q"), ("k", "k"), ("v", "v")), h, h))
        t0.vector(VectorOp.ROPE, nq, 1, buf["q"], self.drq, buf["qr"], b_stride=nq * 4)
        for g in range(cfg.kv_heads):
            t0.vector(VectorOp.ROPE, hd, 1, buf["k"] + g * hd * 4, self.drk, db.kv + g * pair,
                      a_stride=nkv * 4, b_stride=hd * 4, out_stride=self.row_stride)
            t0.vector(VectorOp.ADD, hd, 1, buf["v"] + g * hd * 4, self.zero,
                      db.kv + g * pair + hd * 4, a_stride=nkv * 4, b_stride=0,
                      out_stride=self.row_stride)
        hb = query_head_bytes(hd)
        for hq in range(cfg.heads):
            g, i = divmod(hq, rep)
            head = db.qrec + g * self.q_slot + QUERY_HEADER_BYTES + i * hb
            t0.requant_to(hd, 1, buf["qr"] + hq * hd * 4, nq * 4,
                          [(head + 4, hd, 0, 1), (head, 4, 0, 1)])

        t1 = TemplateBuilder(eps, c.gemm_rows, c.gemm_lanes, c.vec_lanes)
        t1.requant(nq, 1, self.obuf_rows(layer), xq[nq])
        t1.gemms(mm((("o", "o"),), nq, nq))
        t1.vector(VectorOp.ADD, h, 1, db.x, buf["o"], buf["h"], b_stride=h * 4)
        t1.vector(VectorOp.RMSNORM, h, 1, buf["h"], lb.g2, buf["n2"])
        t1.requant(h, 1, buf["n2"], xq[h])
        t1.gemms(mm((("gate", "g"), ("up", "u")), h, h))
        t1.vector(VectorOp.SILU_MUL, inter, 1, buf["g"], buf["u"], buf["s"], b_stride=inter * 4)
        t1.requant(inter, 1, buf["s"], xq[inter])
        t1.gemms(mm((("down", "d"),), inter, inter))
        t1.vector(VectorOp.ADD, h, 1, buf["h"], buf["d"], buf["y"], b_stride=h * 4)
        return [t0.entries, t1.entries]

    def head_job(self, row: int | None = None):
        """The COMPUTE record of the LM head (None: this image has none;
        :class:`mcf.node.head.HeadImage` has)."""
        return None

    def obuf_rows(self, layer: int) -> int:
        """First OBUF row of ``layer``'s parity: ``H_q`` rows in head order = the attention
        output row the O projection reads."""
        return self.layout.obuf_base + (layer & 1) * self.cfg.heads * \
            obuf_row_bytes(self.cfg.head_dim)

    def query_record(self, layer: int, kv_head: int) -> int:
        """The root's query record of ``kv_head``'s query heads in ``layer``."""
        return self.dbufs[layer].qrec + kv_head * self.q_slot

    def qbuf_slot(self, layer: int, kv_head: int) -> int:
        """Where a holder's decode lander puts that record (QBUF slot)."""
        rep = self.cfg.heads // self.cfg.kv_heads
        lay = self.layout
        return lay.qbuf_base + ((layer & 1) * lay.q_heads + kv_head * rep) * lay.qbuf_slot

    def mbuf_slot(self, layer: int, kv_head: int) -> int:
        """The MBUF slot where ``layer``'s all-reduced maxima of ``kv_head``'s query heads land
        (two-phase decode; the FIXED ATTEND's ``out_addr``)."""
        rep = self.cfg.heads // self.cfg.kv_heads
        return mbuf_slot(self.layout.mbuf_base, self.cfg.heads, layer, kv_head * rep)

    def list_index(self, layer: int, kv_head: int) -> int:
        """ATTEND list index (entries from ``ATT_LIST_BASE`` = :attr:`lists`)."""
        first = (self.dlists - self.lists) // ATT_ENTRY_BYTES
        return first + (layer * self.cfg.kv_heads + kv_head) * self.per_list

    def decode_writes(self, position: int, x=None) -> dict[int, bytes]:
        """The root's DDR writes before a token at ``position``: RoPE words, the headers of
        its query records, and (``x``: one ACT row) the first layer's input."""
        cfg = self.cfg
        rep = cfg.heads // cfg.kv_heads
        pos = np.array([position])
        out = {self.drq: act_bytes(rope_words(pos, cfg.heads * cfg.head_dim, cfg.head_dim,
                                              cfg.theta)),
               self.drk: act_bytes(rope_words(pos, cfg.head_dim, cfg.head_dim, cfg.theta))}
        for layer in range(len(self.layers)):
            for g in range(cfg.kv_heads):
                hdr = QUERY_HEADER.const({"pos": position, "layer": layer, "head0": g * rep,
                                          "heads": rep}).as_bits()
                out[self.query_record(layer, g)] = hdr.to_bytes(QUERY_HEADER_BYTES, "little")
        if x is not None:
            out[self.dx0] = act_bytes(np.asarray(x).reshape(1, -1))
        return out


# ---- records -----------------------------------------------------------------------------------


@dataclass
class DecodeProgram:
    """One node's records for one decode token and what the host writes before the doorbells:
    ``writes`` (registers), ``ddr`` (``{address: bytes}``: ATTEND lists; the root's RoPE words
    and query headers — its input row is the caller's, :meth:`DecodeImage.decode_writes`)."""
    root: int
    position: int
    net: list[Cmd] = field(default_factory=list)
    compute: list[Cmd] = field(default_factory=list)
    writes: list[Write] = field(default_factory=list)
    ddr: dict[int, bytes] = field(default_factory=dict)


def decode_writes(plan, k: int, node: int, regmap: RegisterMap | None = None) -> list[Write]:
    """Register writes of token ``k`` on ``node``: ``DEC_TAG_BASE`` (``decode_tag(k, 0)``), the
    decode bank's routes (MARS's broadcast and reduction trees) and the node's
    ``REDUCE_CFG_WR`` entry for the root's tree."""
    rm = regmap or node_regmap()

    def _w(reg: str, **fields: int) -> Write:
        return Write(reg, rm.register(reg).pack(**fields))

    out = [_w("DEC_TAG_BASE", DEC_TAG_BASE=plan.encoder.decode_tag(k, 0))]
    out += route_writes(plan.decode_routes()[2].entries, node, rm)
    for e in plan.decode_reduce_configs(k):
        if e.node == node:
            out.append(_w("REDUCE_CFG_WR", route_id=e.route_id, config=e.entry()))
    return out


def _cmd(cls: RecordClass, **kw) -> Cmd:
    return Cmd(cls, Queue.COMPUTE, **kw)


def decode_program(plan, k: int, node: int, image: DecodeImage) -> DecodeProgram:
    """``node``'s records of decode token ``k`` (module docstring) on a :class:`DecodeImage`
    built over :func:`decode_layout`."""
    cfg, lay = image.cfg, image.layout
    L, hd, H = plan.model.layers, cfg.head_dim, cfg.heads
    rep, rec = cfg.heads // cfg.kv_heads, kv_token_bytes(cfg.head_dim)
    if (plan.model.q_heads, plan.model.kv_heads, plan.model.head_dim) != \
            (cfg.heads, cfg.kv_heads, hd):
        raise ValueError("the plan's model and the image's layer geometry differ")
    root, j = decode_slot(plan, k)
    T = slice_tokens(plan)
    if j // T >= image.decode_blocks:
        raise ValueError(f"decode token {k} is the root's {j + 1}th; the image holds "
                         f"{image.decode_blocks} decode block(s) of {T} tokens")
    position = plan.num_chunks * plan.chunk + k
    prog = DecodeProgram(root, position, writes=decode_writes(plan, k, node))
    queries = query_payloads(plan, k, rep)
    through = {}                                   # (layer, kv head) -> payloads landed by then
    for i, (_, meta, h0) in enumerate(queries):
        through[(meta.seq, h0 // rep)] = i + 1
    states = [r.meta for r in plan.decode_records(k)
              if r.node == node and r.meta.op == Op.PARTIAL_STATE]
    owned = owned_blocks(plan)[node]
    mine = _decode_tokens(plan, k, node)
    out = prog.compute
    waited = 0
    for layer in range(L):
        if node == root:
            out.append(_cmd(RecordClass.JOB, arg=JOB_ARG.const(
                {"template": image.template0 + 2 * layer}).as_bits()))
            for wait, meta, h0 in (q for q in queries if q[1].seq == layer):
                if wait > waited:
                    out.append(_cmd(RecordClass.WAIT, arg=SeqCounter.RESULTS_LANDED.value,
                                    wait=wait))
                    waited = wait
                out.append(_cmd(RecordClass.SEND, meta=meta.pack(), src=PayloadSource.QBUF,
                                arg=image.query_record(layer, h0 // rep) - lay.qbuf_base))
            kv_id = decode_kv_id(plan, layer, root, j // T)
            for g in range(cfg.kv_heads):
                meta = Meta(stage=Stage.DECODE, op=Op.KV_REPLICA, collective=Collective.P2P,
                            src=node, dst=node, route_id=0, kv_id=kv_id,
                            seq=decode_seq(plan, j % T, g), length=rec)
                out.append(_cmd(RecordClass.EMIT, meta=meta.pack(),
                                arg=EmitArg(image.dbufs[layer].row, g, 1).pack()))
            out.append(_cmd(RecordClass.NOP, meta=Meta(kv_id=kv_id).pack(),
                            wait=cfg.kv_heads * (j % T + 1)))
        if image.softmax == "two_phase":
            _two_phase(prog, plan, k, node, root, layer, image, states, through, owned, mine)
        else:
            _single_pass(prog, plan, k, node, root, layer, image, states, through, owned, mine)
        if node == root:
            waited = H * (layer + 1)
            out.append(_cmd(RecordClass.WAIT, arg=SeqCounter.RESULTS_LANDED.value,
                            wait=waited))
            out.append(_cmd(RecordClass.JOB, arg=JOB_ARG.const(
                {"template": image.template0 + 2 * layer + 1}).as_bits()))
    head = image.head_job() if node == root else None
    if head is not None:
        out.append(head)
    out.append(_cmd(RecordClass.MARK, irq=True, arg=COUNTER_CLEAR))
    prog.net.append(Cmd(RecordClass.MARK, Queue.NET))
    if node == root:
        prog.ddr.update(image.decode_writes(position))
    return prog


def _attend(prog, plan, image: DecodeImage, node: int, root: int, layer: int, g: int,
            owned, mine, softmax: AttendSoftmax) -> bool:
    """The ATTEND of ``layer`` and KV head ``g`` over ``node``'s blocks (its list written into
    ``prog.ddr``; the header's ``out_addr`` is the MBUF slot FIXED reads); False when the node
    holds no KV."""
    ents = _list_blocks(plan, image, node, layer, g, owned, mine)
    if not ents:
        return False
    rep = image.cfg.heads // image.cfg.kv_heads
    q = image.query_record(layer, g) if node == root else image.qbuf_slot(layer, g)
    idx = image.list_index(layer, g)
    prog.ddr[image.lists + idx * ATT_ENTRY_BYTES] = \
        attend_list_bytes(AttendHeader(q, image.mbuf_slot(layer, g)), ents)
    prog.compute.append(_cmd(RecordClass.ATTEND, arg=AttendArg(
        idx, len(ents), AttendMode.DECODE.value, rep, softmax).pack()))
    return True


def _states(prog, image: DecodeImage, metas, held: bool) -> None:
    """One SEND per query head's state: the ATTEND's (``held``) or the empty state."""
    for meta in metas:
        if held:
            prog.compute.append(_cmd(RecordClass.SEND, meta=meta.pack(), src=PayloadSource.ATTN))
        else:
            prog.compute.append(_cmd(RecordClass.SEND, meta=meta.pack(), src=PayloadSource.QBUF,
                                     arg=image.empty - image.layout.qbuf_base))


def _groups(image: DecodeImage, tag0: int, states, layer: int) -> dict[int, list[Meta]]:
    """``layer``'s state Metas of this node by KV head, in issue order."""
    rep = image.cfg.heads // image.cfg.kv_heads
    out: dict[int, list[Meta]] = {}
    for meta in (s for s in states if s.seq == layer):
        head = tag_head(meta.kv_id, tag0)
        out.setdefault(head // rep, []).append(meta)
    return out


def _single_pass(prog, plan, k, node, root, layer, image, states, through, owned, mine):
    """Per KV head: wait for its query (holders), one DECODE SINGLE ATTEND, the states."""
    for g, metas in _groups(image, plan.encoder.decode_tag(k, 0), states, layer).items():
        if node != root:
            prog.compute.append(_cmd(RecordClass.WAIT, arg=SeqCounter.QUERIES_LANDED.value,
                                     wait=through[(layer, g)]))
        held = _attend(prog, plan, image, node, root, layer, g, owned, mine,
                       AttendSoftmax.SINGLE)
        _states(prog, image, metas, held)


def max_meta(plan, k: int, node: int, root: int, layer: int, head0: int, rep: int,
             route_id: int) -> Meta:
    """A node's maxima of query heads ``head0 ..`` for ``root``'s ``ReduceOp.MAX`` reduction
    (the states' reduction route and tag: a FIXED state is sent only after the maxima of its
    KV head have landed, so the two never meet in an engine)."""
    return Meta(stage=Stage.DECODE, op=Op.REDUCTION, collective=Collective.ALL_REDUCE,
                reduce_op=ReduceOp.MAX, src=node, dst=root, route_id=route_id,
                kv_id=plan.encoder.decode_tag(k, head0), length=max_payload_bytes(rep),
                seq=layer)


def _two_phase(prog, plan, k, node, root, layer, image, states, through, owned, mine):
    """Phase 1 per KV head: wait for its query (holders), DECODE MAX, the maxima to the root's
    ``ReduceOp.MAX`` reduction (the constant ``M_EMPTY`` payload from a node without KV).
    Phase 2 per KV head: wait for the all-reduced maxima in MBUF (the root first multicasts
    them to the other nodes), DECODE FIXED against them, the states (``SOFTMAX_MERGE`` of
    states with one ``m``: exact sums)."""
    rep = image.cfg.heads // image.cfg.kv_heads
    kvh = image.cfg.kv_heads
    groups = _groups(image, plan.encoder.decode_tag(k, 0), states, layer)
    bcast, _reduce, _ = plan.decode_routes()
    out = prog.compute
    held = {}
    for g, metas in groups.items():
        if node != root:
            out.append(_cmd(RecordClass.WAIT, arg=SeqCounter.QUERIES_LANDED.value,
                            wait=through[(layer, g)]))
        held[g] = _attend(prog, plan, image, node, root, layer, g, owned, mine,
                          AttendSoftmax.MAX)
        meta = max_meta(plan, k, node, root, layer, g * rep, rep, metas[0].route_id)
        if held[g]:
            out.append(_cmd(RecordClass.SEND, meta=meta.pack(), src=PayloadSource.ATTN))
        else:
            out.append(_cmd(RecordClass.SEND, meta=meta.pack(), src=PayloadSource.QBUF,
                            arg=image.empty_max - image.layout.qbuf_base))
    others = [d for d in range(plan.cluster.nodes) if d != root]
    for g, metas in groups.items():
        out.append(_cmd(RecordClass.WAIT, arg=SeqCounter.MAXES_LANDED.value,
                        wait=layer * kvh + g + 1))
        if node == root and others:
            meta = Meta(stage=Stage.DECODE, op=Op.REDUCTION, collective=Collective.MULTICAST,
                        src=root, dst=others[0], route_id=bcast[root],
                        kv_id=plan.encoder.decode_tag(k, g * rep),
                        length=max_payload_bytes(rep), seq=layer)
            out.append(_cmd(RecordClass.SEND, meta=meta.pack(), src=PayloadSource.QBUF,
                            arg=image.mbuf_slot(layer, g) - image.layout.qbuf_base))
        if held[g]:
            _attend(prog, plan, image, node, root, layer, g, owned, mine, AttendSoftmax.FIXED)
        _states(prog, image, metas, held[g])


def _list_blocks(plan, image: DecodeImage, node: int, layer: int, g: int, owned, mine):
    """The ATTEND list entries of ``node`` for ``layer`` and KV head ``g``: its prompt blocks,
    then its decode blocks (``mine``: the decode tokens it holds)."""
    lay, enc = image.layout, plan.encoder
    if len(owned) > image.max_blocks:
        raise ValueError(f"node {node} owns {len(owned)} prompt blocks; the image's lists "
                         f"hold {image.max_blocks}")
    ents = []
    for b, s in owned:
        q0, qn = slice_positions(plan, b, s)
        ents.append(AttendBlock(block_address(lay.kv, enc.kv_id(layer, b, s), g, lay.kv_layout),
                                qn, q0))
    T = slice_tokens(plan)
    p0 = plan.num_chunks * plan.chunk
    for blk in range(-(-len(mine) // T)):
        toks = mine[blk * T:(blk + 1) * T]
        ents.append(AttendBlock(block_address(lay.kv, decode_kv_id(plan, layer, node, blk), g,
                                              lay.kv_layout), len(toks), p0 + toks[0]))
    return ents

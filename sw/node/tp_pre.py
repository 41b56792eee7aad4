"""The pre-attention half of a tensor-parallel decode layer on the node (issue #34 item 3,
docs/cluster.md "Tensor-parallel decode"): on every node RMSNorm + REQUANT of the whole input
row (the residual is replicated), the node's column-parallel Q rows (its query heads), K and V
rows (its KV heads, :func:`mcf.golden.tp_decode.tp_split`'s ``kv_rows``) and RoPE on Q and K;
the query requantised per head into query records (the format the ATTEND records read); then
the messages: each node multicasts its query records into every other node's QBUF slots
(:meth:`TPPreImage.records`; the KV-parallel ATTEND of replicated decode can then run on every
node for every head), and each node EMITs its K/V rows of the new token to the token's root,
where they land in the root's decode block exactly where replicated decode's root EMIT lands its
own K/V row (:func:`mcf.node.decode.decode_kv_id`, :func:`mcf.node.decode.decode_seq`).

Node ``i`` of a :class:`~mcf.golden.tp_decode.TPSplit` needs **whole KV-head groups**: its
query heads ``split.heads[i]`` must be whole groups of ``H_q/H_kv`` heads (one ATTEND reads one
query record of a KV head's query heads) and its K/V rows ``split.kv_rows[i]`` whole KV heads
(the EMIT quantises a head's row with one scale). Tiny and Qwen2.5-1.5B at N = 2 qualify;
Qwen2.5-1.5B at N = 4 (half a group and half a KV head per node) is refused (the ACT gather of
partial heads at the root is not built).

Its DDR image (:class:`TPPreImage`), from byte address ``base``: the node's rows of the
pair-ordered W_q, W_k, W_v (:func:`mcf.node.layer.pair_ordered`: Q and K rows in RoPE pair
order, so a head's pairs are adjacent and RoPE runs on the node's rows alone) with their biases
as stripe images; γ1; a zero row; the buffers (:class:`PreBuffers`): the input row ``x``,
``n1``, the INT8 codes ``xq`` and scale word, the GEMM outputs ``q`` / ``k`` / ``v``, the RoPE
words ``rq`` / ``rk`` (written per position, :meth:`TPPreImage.pre_writes`), the post-RoPE
``qr``, the ACT K/V row ``kv`` (one pair — K row with RoPE, V row — per own KV head: the EMIT
row layout, :mod:`mcf.abi.emit`; ``EMIT_KV_BASE`` / ``EMIT_ROW_STRIDE`` from
:meth:`TPPreImage.emit_config`) and the query records ``qrec`` (one slot of
:func:`mcf.abi.decode_land.query_slot_bytes` per own KV head, header written by the host).
One template (one JOB): ``RMSNORM(x, γ1) → n1``, ``REQUANT(n1) → xq``, GEMM Q, K, V over the
node's rows, ``ROPE(q) → qr``, per own KV head ``ROPE(k) →`` the pair's K row and ``ADD(v, 0)
→`` its V row, per own query head ``REQUANT`` into its query record — the ops of replicated
decode's first template (:class:`mcf.node.decode.DecodeImage`) on the node's rows.

:func:`mcf.golden.node_tp.golden_pre` chains the engines' golden models over exactly these
buffers; its gathered query records and K/V records equal replicated decode's
(:func:`mcf.golden.node_decode.golden_decode`) bit for bit, and its rows equal
:func:`mcf.golden.tp_decode.tp_pre_attention`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..abi.compute import STRIPE_ALIGN, StripeJob
from ..abi.decode_land import query_slot_bytes
from ..abi.emit import EmitArg, EmitConfig, kv_pair_bytes
from ..abi.jobs import ENTRY_BYTES, JOB_ARG, TemplateBuilder, template_image
from ..abi.kv import kv_token_bytes
from ..abi.meta import Collective, Meta, Op, Stage
from ..abi.node import Cmd, PayloadSource, Queue, RecordClass
from ..abi.node_config import AXI_WIDTH, NodeConfig
from ..abi.quant import VectorOp, norm_eps_code, rope_words
from ..abi.query import QUERY_HEADER, QUERY_HEADER_BYTES, query_bytes, query_head_bytes
from ..abi.sequencer import SeqCounter
from ..golden.qwen_layer import LayerConfig, QuantLayer
from ..golden.tp_decode import Range, TPSplit, _rows
from ..quant import gemm_stripe_image
from .decode import decode_kv_id, decode_seq, decode_slot, slice_tokens
from .layer import _Alloc, act_bytes, pair_ordered

__all__ = ["PreBuffers", "TPPreImage"]


@dataclass(frozen=True)
class PreBuffers:
    """Byte addresses of the half's buffers (module docstring) and the three stripe jobs."""
    x: int
    g1: int
    zero: int
    n1: int
    xq: int
    q: int
    k: int
    v: int
    rq: int
    rk: int
    qr: int
    kv: int
    qrec: int
    wq: StripeJob
    wk: StripeJob
    wv: StripeJob


@dataclass
class TPPreImage:
    """Node ``node``'s DDR image of layer ``layer``'s pre-attention half (module docstring) for
    the quantised layer ``ql`` of ``cfg`` split by ``split``, from ``base``. ``heads`` /
    ``kv_heads``: its query heads and KV heads (ranges); ``x_at`` / ``kv_at``: the input row and
    the ACT K/V row where another part of the node's image keeps them (None: its own);
    ``image``: ``{address: bytes}``;
    ``templates`` / ``table`` / ``table_len``: its one template and the table."""
    ql: QuantLayer
    cfg: LayerConfig
    split: TPSplit
    node: int
    config: NodeConfig
    base: int
    layer: int = 0
    x_at: int | None = None
    kv_at: int | None = None
    image: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self):
        c, cfg, i = self.config, self.cfg, self.node
        hd, h = cfg.head_dim, cfg.hidden
        rep = cfg.heads // cfg.kv_heads
        self.heads = self.split.heads[i]
        k0, k1 = self.split.kv_rows[i]
        if self.heads[0] % rep or self.heads[1] % rep:
            raise ValueError(f"node {i}'s query heads {self.heads} are not whole groups of "
                             f"{rep} (one ATTEND reads one KV head's query record)")
        if k0 % hd or k1 % hd:
            raise ValueError(f"node {i}'s K/V rows {(k0, k1)} are not whole KV heads of {hd} "
                             f"(the gather of partial heads is not built)")
        self.kv_heads = (k0 // hd, k1 // hd)
        self.q_rows, self.kv_rows = self.split.q_rows(i), (k0, k1)
        nq, nkv = self.q_rows[1] - self.q_rows[0], k1 - k0
        self.q_slot = query_slot_bytes(rep, hd)
        self.mats = pair_ordered(self.ql, cfg)
        alloc = _Alloc(self.base)
        beat = AXI_WIDTH // 8
        jobs = {}
        for name, r in (("q", self.q_rows), ("k", self.kv_rows), ("v", self.kv_rows)):
            qw, b = self._rows(name, r)
            if not c.gemm_limits.accepts(1, h // c.gemm_lanes, qw.q.shape[0] // c.gemm_rows) \
                    or qw.q.shape[0] % c.gemm_rows:
                raise ValueError(f"the {c.name} GEMM refuses a {qw.q.shape[0]} x {h} {name} "
                                 f"shard")
            raw, job = gemm_stripe_image(qw, c.gemm_rows, c.gemm_lanes, b, ports=c.hp_ports,
                                         beat_bytes=beat)
            at = alloc(len(raw), STRIPE_ALIGN)
            self.image[at] = raw
            jobs["w" + name] = dataclasses.replace(job, addr=at)

        def put(raw: bytes) -> int:
            a = alloc(len(raw))
            self.image[a] = raw
            return a

        self.row_stride = (self.kv_heads[1] - self.kv_heads[0]) * kv_pair_bytes(hd)
        self.buf = PreBuffers(
            x=put(bytes(h * 4)) if self.x_at is None else self.x_at,
            g1=put(act_bytes(self.ql.gamma["g1"] & 0xFFFF)),
            zero=put(bytes(hd * 4)), n1=alloc(h * 4), xq=alloc(h + beat), q=alloc(nq * 4),
            k=alloc(nkv * 4), v=alloc(nkv * 4), rq=alloc(nq * 4), rk=alloc(nkv * 4),
            qr=alloc(nq * 4), kv=alloc(self.row_stride) if self.kv_at is None else self.kv_at,
            qrec=alloc((self.kv_heads[1] - self.kv_heads[0]) * self.q_slot), **jobs)
        self.templates = [self._template()]
        self.table = alloc(ENTRY_BYTES * (len(self.templates)
                                          + sum(len(t) for t in self.templates)), STRIPE_ALIGN)
        raw, self.table_len = template_image(self.templates, self.table)
        self.image[self.table] = raw
        self.end = alloc.at

    def _rows(self, name: str, r: Range):
        qw, b = self.mats[name]
        return _rows(qw, r), np.asarray(b)[r[0]:r[1]]

    def _template(self):
        c, cfg, b = self.config, self.cfg, self.buf
        hd, h = cfg.head_dim, cfg.hidden
        rep = cfg.heads // cfg.kv_heads
        nq, nkv = self.q_rows[1] - self.q_rows[0], self.kv_rows[1] - self.kv_rows[0]
        t = TemplateBuilder(norm_eps_code(cfg.eps), c.gemm_rows, c.gemm_lanes, c.vec_lanes)
        t.vector(VectorOp.RMSNORM, h, 1, b.x, b.g1, b.n1)
        t.requant(h, 1, b.n1, b.xq)
        t.gemms([(b.xq, 1, h, b.wq, self._rows("q", self.q_rows)[0], b.q),
                 (b.xq, 1, h, b.wk, self._rows("k", self.kv_rows)[0], b.k),
                 (b.xq, 1, h, b.wv, self._rows("v", self.kv_rows)[0], b.v)])
        t.vector(VectorOp.ROPE, nq, 1, b.q, b.rq, b.qr, b_stride=nq * 4)
        pair = kv_pair_bytes(hd)
        for g in range(self.kv_heads[1] - self.kv_heads[0]):
            t.vector(VectorOp.ROPE, hd, 1, b.k + g * hd * 4, b.rk + g * hd * 4, b.kv + g * pair,
                     a_stride=nkv * 4, b_stride=hd * 4, out_stride=self.row_stride)
            t.vector(VectorOp.ADD, hd, 1, b.v + g * hd * 4, b.zero, b.kv + g * pair + hd * 4,
                     a_stride=nkv * 4, b_stride=0, out_stride=self.row_stride)
        hb = query_head_bytes(hd)
        for hl in range(nq // hd):
            g, i = divmod(hl, rep)
            head = b.qrec + g * self.q_slot + QUERY_HEADER_BYTES + i * hb
            t.requant_to(hd, 1, b.qr + hl * hd * 4, nq * 4,
                         [(head + 4, hd, 0, 1), (head, 4, 0, 1)])
        return t.entries

    # ---- host writes ---------------------------------------------------------------------------
    def emit_config(self) -> EmitConfig:
        """``EMIT_KV_BASE`` / ``EMIT_ROW_STRIDE``: the node's ACT K/V row is row 0."""
        return EmitConfig(self.buf.kv, self.row_stride)

    def query_record(self, kv_head: int) -> int:
        """The node's query record of its KV head ``kv_head`` (a global KV-head index)."""
        g0, g1 = self.kv_heads
        if not g0 <= kv_head < g1:
            raise ValueError(f"KV head {kv_head} is not node {self.node}'s ({g0}..{g1 - 1})")
        return self.buf.qrec + (kv_head - g0) * self.q_slot

    def pre_writes(self, position: int, x=None) -> dict[int, bytes]:
        """The host's writes before a token at ``position``: the RoPE words of the node's Q and
        K rows, the headers of its query records, and (``x``: ``hidden`` ACT words) the input
        row."""
        cfg, b = self.cfg, self.buf
        hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
        pos = np.array([position])
        nq, nkv = self.q_rows[1] - self.q_rows[0], self.kv_rows[1] - self.kv_rows[0]
        out = {b.rq: act_bytes(rope_words(pos, nq, hd, cfg.theta)),
               b.rk: act_bytes(rope_words(pos, nkv, hd, cfg.theta))}
        for g in range(*self.kv_heads):
            hdr = QUERY_HEADER.const({"pos": position, "layer": self.layer, "head0": g * rep,
                                      "heads": rep}).as_bits()
            out[self.query_record(g)] = hdr.to_bytes(QUERY_HEADER_BYTES, "little")
        if x is not None:
            x = np.asarray(x, dtype=np.int64).ravel()
            if x.size != cfg.hidden:
                raise ValueError(f"{x.size} words for a {cfg.hidden}-wide row")
            out[b.x] = act_bytes(x)
        return out

    def records(self, plan, k: int, qbuf_base: int, queries_landed: int = 0,
                template: int = 0, emit_row: int = 0) -> list[Cmd]:
        """The node's COMPUTE records of the half for decode token ``k`` of ``plan`` (no MARK):
        the JOB; per own KV head ``g`` a ``SEND src=QBUF`` of its query record multicast on
        the node's broadcast tree (``decode_routes()[0][node]``; ``Op.QUERY``, ``kv_id =
        decode_tag(k, g·H_q/H_kv)``, ``seq`` = layer: the decode lander's QBUF slot of ``g``'s
        heads); per own KV head an ``EMIT`` of its K/V pair for the token's root's decode block
        (``decode_kv_id``, ``seq = decode_seq``): at the root it lands locally, elsewhere it is
        teed (``replicate``) and sent by a ``SEND src=EMIT`` on the root's unicast route (the
        local copy lands in the node's own, otherwise unused, slot of that decode block);
        ``WAIT QUERIES_LANDED ≥ queries_landed +`` the other nodes' query records; at the root
        a ``NOP`` barrier until the token's K/V of every KV head has landed (as replicated
        decode's root). ``qbuf_base``: the node's QBUF (SEND ``src=QBUF`` offsets); ``template``:
        the half's template in the node's table; ``emit_row``: the K/V row's EMIT row index
        (rows of ``row_stride`` bytes from ``EMIT_KV_BASE``)."""
        cfg, i = self.cfg, self.node
        rep, hd = cfg.heads // cfg.kv_heads, cfg.head_dim
        if self.buf.qrec < qbuf_base:
            raise ValueError("the image must lie above QBUF (SEND src=QBUF offsets)")
        nodes = self.split.nodes
        if plan.cluster.nodes != nodes:
            raise ValueError(f"a {plan.cluster.nodes}-node plan for a {nodes}-node split")
        root, j = decode_slot(plan, k)
        T = slice_tokens(plan)
        bcast = plan.decode_routes()[0]
        others = [d for d in range(nodes) if d != i]
        out = [Cmd(RecordClass.JOB, Queue.COMPUTE,
                   arg=JOB_ARG.const({"template": template}).as_bits())]
        for g in range(*self.kv_heads) if others else ():
            meta = Meta(stage=Stage.DECODE, op=Op.QUERY, collective=Collective.MULTICAST,
                        src=i, dst=others[0], route_id=bcast[i],
                        kv_id=plan.encoder.decode_tag(k, g * rep), length=query_bytes(rep, hd),
                        seq=self.layer)
            out.append(Cmd(RecordClass.SEND, Queue.COMPUTE, meta=meta.pack(),
                           src=PayloadSource.QBUF, arg=self.query_record(g) - qbuf_base))
        kv_id = decode_kv_id(plan, self.layer, root, j // T)
        for g in range(*self.kv_heads):
            meta = Meta(stage=Stage.DECODE, op=Op.KV_REPLICA, collective=Collective.P2P,
                        src=i, dst=root, route_id=0 if i == root else
                        plan.scheduler.routes.unicast(root), kv_id=kv_id,
                        seq=decode_seq(plan, j % T, g), length=kv_token_bytes(hd))
            arg = EmitArg(emit_row, g - self.kv_heads[0], 1).pack()
            out.append(Cmd(RecordClass.EMIT, Queue.COMPUTE, meta=meta.pack(), arg=arg,
                           replicate=i != root))
            if i != root:
                out.append(Cmd(RecordClass.SEND, Queue.COMPUTE, meta=meta.pack(),
                               src=PayloadSource.EMIT))
        others_q = cfg.kv_heads - (self.kv_heads[1] - self.kv_heads[0])
        if others_q:
            out.append(Cmd(RecordClass.WAIT, Queue.COMPUTE, arg=SeqCounter.QUERIES_LANDED.value,
                           wait=queries_landed + others_q))
        if i == root:
            out.append(Cmd(RecordClass.NOP, Queue.COMPUTE, meta=Meta(kv_id=kv_id).pack(),
                           wait=cfg.kv_heads * (j % T + 1)))
        return out

"""Tensor-parallel decode tokens on the node tops (issue #34; docs/cluster.md "Tensor-parallel
decode"): the KV-parallel attention with each query head's result at its TP owner, and
:class:`TPDecodeImage`, every layer of a TP token (pre half, that attention, post half) in one
node program.

The attention (:func:`attend_records`) is the step between the
pre-attention half (:mod:`mcf.node.tp_pre`, which gathers every query record on every node and
the token's K/V at its root) and the post-attention half (:mod:`mcf.node.tp_layer`, which reads
each node's own heads' attention rows).

Per layer ``l`` and KV head ``g`` every node runs what replicated decode's holders run
(:mod:`mcf.node.decode`, single pass): ATTEND (DECODE, ``H_q/H_kv`` heads) over the KV it holds
— the token's root's list ends with the new token — and one ``SEND src=ATTN`` per query head
``h`` (``PARTIAL_STATE``, tag ``decode_tag(k, h)``). The only change is where a head's states
go: to the head's **TP owner** ``o = split.head_owner(h)`` on ``o``'s decode reduction tree
(MARS's ``decode_routes``: ``dst = o``, ``route_id = reduce[o]``) instead of to the token's root.
The reduction engines merge the states along that tree (:func:`owner_reduce_entries`: each
node's entry for every owner's tree, the owner's ``final``) and the owner's decode lander
normalises the final state into its OBUF row ``(l mod 2)·H_q + h`` — where the O projection of
the post half reads it. Each node then waits for ``RESULTS_LANDED ≥ (its heads)·(l + 1)``.

**Bits.** The merge of two states is commutative bit for bit, so at N = 2 the owner's chain
(own state, then the other node's) gives the token root's chain's bits (replicated decode's,
:func:`mcf.golden.node_tp.owner_merged` checks this against
:func:`mcf.golden.node_decode.golden_decode`). At N ≥ 3 a single-pass merge is not associative,
so the bits would follow each owner's chain; the two-phase split's merge is an exact sum, but its
MAX all-reduce on the owners' trees is not built: :func:`attend_records` refuses both in one
line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..abi.attend import (
    ATT_ENTRY_BYTES,
    AttendArg,
    AttendHeader,
    AttendMode,
    AttendSoftmax,
    attend_list_bytes,
)
from ..abi.csrmap import node_regmap
from ..abi.decode_land import SUM_SLOT_BYTES, obuf_row_bytes, tag_head
from ..abi.emit import kv_pair_bytes
from ..abi.jobs import ENTRY_BYTES, JOB_ARG, template_image
from ..abi.meta import Meta, Op
from ..abi.node import Cmd, Queue, RecordClass
from ..abi.regs import RegisterMap
from ..abi.sequencer import SeqCounter
from ..golden.tp_decode import TPError, TPSplit, vocab_split
from ..mars.metadata import ReduceEntry
from .decode import (
    COUNTER_CLEAR,
    DecodeImage,
    DecodeProgram,
    _decode_tokens,
    _groups,
    _list_blocks,
    _states,
    decode_slot,
    decode_writes,
    owned_blocks,
    query_payloads,
)
from .layer import _Alloc, act_bytes
from .layout import REGION_ALIGN
from .program import Write
from .tp import sum_payloads
from .tp_layer import TPPostImage
from .tp_pre import TPPreImage

__all__ = ["owner_reduce_entries", "owner_reduce_writes", "owner_state_metas",
           "attend_records", "TPDecodeImage"]


def _owners(split: TPSplit) -> list[int]:
    return sorted({split.head_owner(h) for h0, h1 in split.heads for h in range(h0, h1)})


def owner_reduce_entries(plan, split: TPSplit) -> list[ReduceEntry]:
    """Every node's reduction-engine entry for every head owner's decode reduction tree
    (:meth:`mcf.mars.plan.Plan.decode_reduce_configs`'s rule with the owner as the root:
    ``1 + children`` contributions, the owner's entry ``final`` with its static unicast route
    as ``result_route``)."""
    _, reduce_, _ = plan.decode_routes()
    routes = plan.scheduler.routes
    out = []
    for o in _owners(split):
        children = routes.children(o)
        home = routes.unicast(o)
        out += [ReduceEntry(n, reduce_[o], 1 + children[n], n == o, home if n == o else 0)
                for n in range(plan.cluster.nodes)]
    return out


def owner_reduce_writes(plan, k: int, node: int, split: TPSplit,
                        regmap: RegisterMap | None = None) -> list[Write]:
    """``node``'s ``REDUCE_CFG_WR`` writes for the owners' trees other than token ``k``'s
    root's (:func:`mcf.node.decode.decode_writes` writes the root's)."""
    rm = regmap or node_regmap()
    _, reduce_, _ = plan.decode_routes()
    root = plan.decode_owner(k)
    reg = rm.register("REDUCE_CFG_WR")
    return [Write("REDUCE_CFG_WR", reg.pack(route_id=e.route_id, config=e.entry()))
            for e in owner_reduce_entries(plan, split)
            if e.node == node and e.route_id != reduce_[root]]


def owner_state_metas(plan, k: int, node: int, split: TPSplit) -> list[Meta]:
    """``node``'s ``PARTIAL_STATE`` Metas of token ``k`` (MARS's decode records), each sent to
    its query head's TP owner on the owner's reduction tree."""
    _, reduce_, _ = plan.decode_routes()
    tag0 = plan.encoder.decode_tag(k, 0)
    out = []
    for r in plan.decode_records(k):
        if r.node == node and r.meta.op == Op.PARTIAL_STATE:
            o = split.head_owner(tag_head(r.meta.kv_id, tag0))
            out.append(replace(r.meta, dst=o, route_id=reduce_[o]))
    return out


def attend_records(plan, k: int, node: int, image: DecodeImage, split: TPSplit,
                   layers=None, query_at=None, query_waits: bool = True) -> DecodeProgram:
    """``node``'s attention records of decode token ``k`` for ``layers`` (default: all), after
    its query records are in place: per layer and KV head ``[WAIT QUERIES_LANDED]`` (not at the
    root; ``query_waits``: replicated decode's thresholds, for queries the root multicasts),
    ATTEND, the states to their owners; then ``WAIT RESULTS_LANDED ≥ (node's heads)·(l + 1)``.
    ``query_at(layer, g)``: the address of the query record the node's ATTEND reads (None: the
    root's record in ``image``, elsewhere the QBUF slot). ``ddr``: the ATTEND lists;
    ``writes``: :func:`owner_reduce_writes` (the caller adds
    :func:`mcf.node.decode.decode_writes`). Refuses (:class:`TPError`) a two-phase image and
    N ≥ 3 (the owner's chain would change the bits)."""
    if image.softmax != "single":
        raise TPError("TP decode attention runs the single-pass softmax only (the two-phase "
                      "MAX all-reduce on the head owners' trees is not built)")
    if plan.cluster.nodes > 2:
        raise TPError(f"TP decode attention over {plan.cluster.nodes} nodes: each owner's "
                      f"merge chain would change the single-pass bits (N = 2 only)")
    cfg = image.cfg
    rep = cfg.heads // cfg.kv_heads
    root, _ = decode_slot(plan, k)
    prog = DecodeProgram(root, plan.num_chunks * plan.chunk + k,
                         writes=owner_reduce_writes(plan, k, node, split))
    through = {}
    for i, (_, meta, h0) in enumerate(query_payloads(plan, k, rep)):
        through[(meta.seq, h0 // rep)] = i + 1
    states = owner_state_metas(plan, k, node, split)
    owned = owned_blocks(plan)[node]
    mine = _decode_tokens(plan, k, node)
    tag0 = plan.encoder.decode_tag(k, 0)
    h0, h1 = split.heads[node]
    out = prog.compute
    for layer in (range(len(image.layers)) if layers is None else layers):
        for g, metas in _groups(image, tag0, states, layer).items():
            if node != root and query_waits:
                out.append(Cmd(RecordClass.WAIT, Queue.COMPUTE,
                               arg=SeqCounter.QUERIES_LANDED.value, wait=through[(layer, g)]))
            ents = _list_blocks(plan, image, node, layer, g, owned, mine)
            if ents:
                if query_at is not None:
                    q = query_at(layer, g)
                else:
                    q = image.query_record(layer, g) if node == root else \
                        image.qbuf_slot(layer, g)
                idx = image.list_index(layer, g)
                prog.ddr[image.lists + idx * ATT_ENTRY_BYTES] = \
                    attend_list_bytes(AttendHeader(q, image.mbuf_slot(layer, g)), ents)
                out.append(Cmd(RecordClass.ATTEND, Queue.COMPUTE, arg=AttendArg(
                    idx, len(ents), AttendMode.DECODE.value, rep, AttendSoftmax.SINGLE).pack()))
            _states(prog, image, metas, bool(ents))
        out.append(Cmd(RecordClass.WAIT, Queue.COMPUTE, arg=SeqCounter.RESULTS_LANDED.value,
                       wait=(h1 - h0) * (layer + 1)))
    return prog


# ---- a whole TP decode token: every layer's pre half, attention and post half ------------------


@dataclass
class TPDecodeImage:
    """Node ``node``'s image of tensor-parallel decode for every layer of ``dec`` (the node's
    :class:`~mcf.node.decode.DecodeImage`: the prefill's model, the decode layout, the ATTEND
    lists and OBUF this module's attention uses), placed from ``base`` (above ``dec``):

    * one K/V row region: layer ``l``'s ACT K/V row is EMIT row ``l`` (``EMIT_KV_BASE`` = row
      0, ``EMIT_ROW_STRIDE`` = the node's KV heads' pairs);
    * one SUM window of ``2S`` slots, shared by every layer (a layer's SUM result cannot land on
      a node before that node has sent its own contribution, after its previous layer's
      ``acc_in`` read the window);
    * per layer a :class:`~mcf.node.tp_pre.TPPreImage` (input row ``x_l``) and a
      :class:`~mcf.node.tp_layer.TPPostImage` (residual ``x_l``, MBUF parity ``l mod 2``, the O
      step's padded input row read in place from the node's OBUF rows of the layer's parity:
      the image zeroes both parities' rows and the node's heads are the only rows its lander
      writes there, so the others stay zero), whose output row is ``x_{l+1}``;
    * one template table: layer ``l``'s pre template at ``10·l``, its post templates from
      ``10·l + 1``; on a :class:`~mcf.node.head.HeadImage` then the node's slice of the LM
      head on the last layer's output row (:attr:`head_template`, every node's JOB before its
      MARK): the final RMSNorm and REQUANT of that row (every node holds it after the last
      down all-reduce) and the head GEMM over the node's rows :attr:`vocab` ``= (v0, v1)``
      (:func:`mcf.golden.tp_decode.vocab_split`: whole ``gemm_rows`` tiles, as even as
      possible) from the node's own stripe images of those rows, placed here, writing logits
      ``v0 .. v1 − 1`` at their places in the node image's logits
      (:meth:`mcf.node.head.HeadImage.read_logits` with ``rows = vocab``).

    ``layers``: the per-layer ``(pre, post)`` images; ``x0``: the first layer's input row (the
    host's write); ``y``: the last layer's output row (every node's)."""
    dec: DecodeImage
    split: TPSplit
    node: int
    base: int
    image: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self):
        dec, sp, i = self.dec, self.split, self.node
        cfg, c, lay = dec.cfg, dec.config, dec.layout
        if sp.nodes != 2:
            raise TPError(f"TP decode tokens run on 2 nodes (not {sp.nodes})")
        r = self.reduce_root()
        if r is None:
            raise TPError("TP decode needs a node owning neither query head 0 nor 1 (the "
                          "post half's MAX tags)")
        hd, h, L = cfg.head_dim, cfg.hidden, len(dec.layers)
        alloc = _Alloc(self.base)
        kv_heads = sp.kv_rows[i][1] // hd - sp.kv_rows[i][0] // hd
        self.row_stride = kv_heads * kv_pair_bytes(hd)
        kv0 = alloc(L * self.row_stride, REGION_ALIGN)
        hidden_sum = len(sum_payloads(h, 0, 0, 0, 0))
        self.window = alloc(2 * hidden_sum * SUM_SLOT_BYTES, REGION_ALIGN)
        self.x0 = alloc(h * 4)
        self.image[self.x0] = bytes(h * 4)
        x = self.x0
        self.layers = []
        for li, ql in enumerate(dec.layers):
            pre = TPPreImage(ql, cfg, sp, i, c, alloc(0, REGION_ALIGN), layer=li, x_at=x,
                             kv_at=kv0 + li * self.row_stride)
            k0 = sp.groups(sp.q_rows(i))[0] * sp.group
            post = TPPostImage(ql, cfg, sp, i, c, -(-pre.end // REGION_ALIGN) * REGION_ALIGN,
                               lay.mbuf_base, lay.q_heads, parity=li & 1, x_at=x,
                               window_at=self.window, o_x_at=dec.obuf_rows(li) + k0 * 4)
            for part in (pre, post):
                self.image.update(part.image)
                del self.image[part.table]
            alloc = _Alloc(post.end)
            self.layers.append((pre, post))
            x = post.buf.y
        self.y = x
        rows = cfg.heads * obuf_row_bytes(hd)
        for li in range(min(L, 2)):          # the OBUF rows of both parities start zero
            self.image[dec.obuf_rows(li)] = bytes(rows)
        self.per_layer = 1 + len(self.layers[0][1].templates)
        self.templates = [t for pre, post in self.layers for t in (*pre.templates,
                                                                     *post.templates)]
        self.head_template = self.vocab = None
        if hasattr(dec, "head_rows"):        # a HeadImage: the node's slice of the LM head on y
            self.vocab = vocab_split(dec.vocab, sp.nodes, c.gemm_rows)[i]
            jobs = dec.head_rows(*self.vocab, alloc, self.image)
            self.head_template = len(self.templates)
            self.templates.append(dec._head_template(self.y, self.vocab, jobs))
        self.table = alloc(ENTRY_BYTES * (len(self.templates)
                                          + sum(len(t) for t in self.templates)), REGION_ALIGN)
        raw, self.table_len = template_image(self.templates, self.table)
        self.image[self.table] = raw
        self.end = alloc.at
        if self.layers[0][0].buf.qrec < lay.qbuf_base:
            raise ValueError("the image must lie above QBUF (SEND src=QBUF offsets)")

    def reduce_root(self) -> int | None:
        """The root of the post half's MAX and SUM all-reduces: the first node owning neither
        query head 0 nor 1, so that the maxima's tags ``TAG_BASE + 0/1`` on its reduction tree
        are never a state's (those heads' states reduce on their owners' trees)."""
        sp = self.split
        bad = {sp.head_owner(0), sp.head_owner(1)}
        return next((n for n in range(sp.nodes) if n not in bad), None)

    def registers(self) -> dict[str, int]:
        """The registers a TP token needs on top of the decode layout's: the template table,
        the EMIT K/V rows, the SUM window (``2S`` slots)."""
        post = self.layers[0][1]
        return {"JOBS_TABLE_LO": self.table & 0xFFFF_FFFF, "JOBS_TABLE_HI": self.table >> 32,
                "JOBS_TABLE_LEN": self.table_len,
                "EMIT_KV_BASE_LO": self.layers[0][0].buf.kv & 0xFFFF_FFFF,
                "EMIT_KV_BASE_HI": self.layers[0][0].buf.kv >> 32,
                "EMIT_ROW_STRIDE": self.row_stride, **post.sum_registers()}

    def query_at(self, layer: int, g: int) -> int:
        """The query record of KV head ``g`` the node's ATTEND reads: its own (its pre half's)
        or the other node's, landed in QBUF."""
        pre = self.layers[layer][0]
        if pre.kv_heads[0] <= g < pre.kv_heads[1]:
            return pre.query_record(g)
        return self.dec.qbuf_slot(layer, g)

    def program(self, plan, k: int, x=None) -> DecodeProgram:
        """The node's records of decode token ``k``: per layer ``l`` the pre half
        (template ``10·l``; the other node's queries counted cumulatively), the attention
        (:func:`attend_records`, its query WAITs left to the pre half), the post half (templates
        from ``10·l + 1``; its all-reduces rooted at :meth:`reduce_root`, cumulative thresholds).
        ``writes``: MARS's decode registers, the owners' engine entries and :meth:`registers`;
        ``ddr``: the ATTEND lists, every layer's RoPE words and query headers and (``x``) the
        first layer's input row. On a head image every node's COMPUTE ring then runs its slice
        of the LM head (:attr:`head_template`). The COMPUTE ring ends with the token's clearing
        MARK
        (:data:`~mcf.node.decode.COUNTER_CLEAR`), the NET ring with a MARK."""
        dec, sp, i = self.dec, self.split, self.node
        lay, cfg = dec.layout, dec.cfg
        position = plan.num_chunks * plan.chunk + k
        att = attend_records(plan, k, i, dec, sp, query_at=self.query_at, query_waits=False)
        prog = DecodeProgram(att.root, position, ddr=dict(att.ddr))
        prog.writes = decode_writes(plan, k, i) + att.writes + [
            Write(n, v) for n, v in self.registers().items()]
        bcast, reduce_, _ = plan.decode_routes()
        r = self.reduce_root()
        tag0 = plan.encoder.decode_tag(k, 0)
        # the attention records, split per layer at each RESULTS WAIT
        per_layer, cur = [], []
        for cmd in att.compute:
            cur.append(cmd)
            if cmd.cls is RecordClass.WAIT and cmd.arg == SeqCounter.RESULTS_LANDED.value:
                per_layer.append(cur)
                cur = []
        others_q = cfg.kv_heads - (self.layers[0][0].kv_heads[1] - self.layers[0][0].kv_heads[0])
        for li, (pre, post) in enumerate(self.layers):
            prog.compute += pre.records(plan, k, lay.qbuf_base, queries_landed=li * others_q,
                                        template=self.per_layer * li, emit_row=li)
            prog.compute += per_layer[li]
            prog.compute += post.records(r, reduce_[r], bcast[r], lay.qbuf_base, tag0,
                                         first=self.per_layer * li + 1, maxes_landed=2 * li,
                                         sums_landed=2 * post.sum_step * li)
            prog.ddr.update(pre.pre_writes(position))
        if x is not None:
            prog.ddr[self.x0] = act_bytes(np.asarray(x, dtype=np.int64).reshape(1, -1))
        if self.head_template is not None:
            prog.compute.append(Cmd(RecordClass.JOB, Queue.COMPUTE, arg=JOB_ARG.const(
                {"template": self.head_template}).as_bits()))
        prog.compute.append(Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True, arg=COUNTER_CLEAR))
        prog.net.append(Cmd(RecordClass.MARK, Queue.NET))
        return prog

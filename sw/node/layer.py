"""The layer program of a prefill step (docs/node.md §3 "Who goes where", issue #11 §1.2): one
node's slice of a chunk runs every layer of the model on the node's own engines, driven by the
COMPUTE ring only — the PS writes the model, the templates, the step's query headers and ATTEND
lists, never a tensor on the way.

Per layer ``l`` the node's COMPUTE records are:

1. ``JOB 2l`` — RMSNorm, requantise, Q/K/V projections (Q and K rows in RoPE pair order), RoPE on
   Q; RoPE on K per KV head straight into the ACT K/V pair rows the emitter reads (V copied
   there by the vector unit); Q requantised per query head into the step's query records
   (:func:`mcf.abi.attend.prefill_query_address`; the driver wrote their headers).
2. ``EMIT`` per fragment of the node's own block (always landed locally; ``replicate`` when
   MARS's store phase sends the fragment, followed by ``SEND src=EMIT`` with MARS's Meta).
3. A **block barrier** (NOP with a landed wait) per KV block the attention reads.
4. ``ATTEND`` (PREFILL; EXACT in a ``two_phase`` run) per slice token and KV head over the
   blocks at or before the token, in ``(block, slice)`` order; ``o/l`` rows land in the layer's
   attention buffer. On a node with the tiled path (``ModelImage.tile_chunk`` > 0, a
   ``single`` run: :func:`prefill_tile_chunk`) one PREFILL_TILE record per chunk of at most
   ``tile_chunk`` slice tokens and KV head instead, over the blocks at or before the chunk's
   last token; its rows land where the per-token records put them.
5. ``JOB 2l+1`` — requantise, O projection, residual, RMSNorm, gate/up, SiLU·mul, down,
   residual: the layer output, the next layer's input.

The same numbers on the host: :func:`mcf.golden.node_prefill.golden_prefill` (the engines'
golden models chained in the same order and block partition; ``tiled=True`` for a program of
PREFILL_TILE records, whose P8 attention differs from PREFILL's), against which the RTL is
compared bit for bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..abi.attend import (
    ATT_ENTRY_BYTES,
    PREFILL_SOFTMAX,
    RUN_SOFTMAX,
    AttendArg,
    AttendBlock,
    AttendHeader,
    AttendMode,
    attend_list_bytes,
    prefill_out_bytes,
    prefill_query_address,
)
from ..abi.compute import STRIPE_ALIGN, StripeJob
from ..abi.decode_land import query_slot_bytes
from ..abi.emit import EmitArg, EmitConfig, kv_pair_bytes
from ..abi.jobs import ENTRY_BYTES, JOB_ARG, TemplateBuilder, template_image
from ..abi.kv import kv_token_bytes
from ..abi.kv_reader import block_address
from ..abi.meta import Collective, Meta, Op, Stage
from ..abi.node import Cmd, PayloadSource, Queue, RecordClass
from ..abi.node_config import AXI_WIDTH, NodeConfig
from ..abi.quant import (
    VectorOp,
    norm_eps_code,
    rope_pair_order,
    rope_words,
)
from ..abi.query import QUERY_HEADER, QUERY_HEADER_BYTES, query_head_bytes
from ..golden.qwen_layer import LayerConfig, QuantLayer
from ..quant import QuantWeight, gemm_stripe_image
from .layout import REGION_ALIGN, NodeLayout

__all__ = ["ModelImage", "LayerBuffers", "layer_records", "act_bytes", "read_act",
           "slice_positions", "read_set", "max_read_set", "row_ranges", "prefill_tile_chunk"]

ZERO_ROW = 0


def act_bytes(a) -> bytes:
    """ACT codes → little-endian 32-bit words."""
    return (np.asarray(a, dtype=np.int64) & 0xFFFF_FFFF).astype("<u4").tobytes()


def read_act(raw: bytes, rows: int, cols: int) -> np.ndarray:
    return np.frombuffer(raw[:rows * cols * 4], dtype="<i4").astype(np.int64).reshape(rows, cols)


def prefill_tile_chunk(config: NodeConfig, softmax: str) -> int:
    """Query tokens per PREFILL_TILE record of a run's layer program: the node's
    ``tile_max_chunk`` on a node with the tiled path (``NodeConfig.tiled``; the board's
    ``CAPS.tile_chunk_log2``) in a ``single`` run, else 0 — per-token PREFILL records (a
    ``two_phase`` run keeps PREFILL EXACT, whose rows do not depend on N; P8 is SINGLE only)."""
    return config.tile_max_chunk if config.tiled and softmax == "single" else 0


def row_ranges(m: int, m_max: int) -> list[tuple[int, int]]:
    """``(first row, rows)`` of the GEMM jobs that cover ``m`` token rows when one job takes at
    most ``m_max``: full jobs of ``m_max`` rows, then the rest. A job's rows are independent
    (each output row depends only on its own input row), so the bits equal one job's."""
    if m_max < 1:
        raise ValueError("m_max must be at least 1")
    return [(r0, min(m_max, m - r0)) for r0 in range(0, m, m_max)]


class _Alloc:
    def __init__(self, base: int):
        self.at = base

    def __call__(self, n: int, align: int = 64) -> int:
        a = -(-self.at // align) * align
        self.at = a + n
        return a


def _permuted(qw: QuantWeight, perm) -> QuantWeight:
    return QuantWeight(qw.q[perm], qw.m[perm], qw.e, qw.group)


def pair_ordered(ql: QuantLayer, cfg: LayerConfig) -> dict[str, tuple[QuantWeight, object]]:
    """The seven projections as the node stores them: Q and K rows (and biases) in RoPE pair
    order (:func:`mcf.abi.quant.rope_pair_order`), the others as quantised."""
    pq = rope_pair_order(cfg.heads * cfg.head_dim, cfg.head_dim)
    pk = rope_pair_order(cfg.kv_heads * cfg.head_dim, cfg.head_dim)
    return {"q": (_permuted(ql.qw["q"], pq), ql.bias["q"][pq]),
            "k": (_permuted(ql.qw["k"], pk), ql.bias["k"][pk]),
            "v": (ql.qw["v"], ql.bias["v"]), "o": (ql.qw["o"], None),
            "gate": (ql.qw["gate"], None), "up": (ql.qw["up"], None),
            "down": (ql.qw["down"], None)}


@dataclass
class LayerBuffers:
    """Addresses of one layer's weights and activation buffers in a node's DDR: ``blobs`` the
    stripe job of each projection (its stripe image, :func:`mcf.quant.gemm_stripe_image`, at
    the job's ``addr``)."""
    blobs: dict[str, StripeJob]
    g1: int
    g2: int
    x: int                      # input rows (layer 0: the host's; layer l: layer l-1's ``y``)
    buf: dict[str, int]
    xq: dict[int, list[int]]    # per K: one requantised buffer per GEMM row range
    kv: int                     # ACT K/V pair rows (EMIT_KV_BASE of this layer)
    qrec: int                   # query records, one per (token, KV head)
    templates: tuple[int, int] = (0, 0)


@dataclass
class ModelImage:
    """One node's copy of the model and its per-slice buffers: everything the layer program
    reads and writes, laid out after the node's :class:`NodeLayout` regions.

    ``tokens``: the slice's token count (every step's slice has it); a slice of more tokens
    than the GEMM's ``gemm_m_max`` runs each projection as several GEMM jobs over row ranges
    (:func:`row_ranges`, each range requantised into its own buffer: the same bits);
    ``positions`` are written per step (:meth:`step_writes`); ``softmax``: the run's attention
    softmax (:data:`mcf.abi.attend.RUN_SOFTMAX`); ``tile_chunk``: query tokens per
    PREFILL_TILE record (1..``config.tile_max_chunk``, ``single`` only; 0: per-token PREFILL
    records; a run takes :func:`prefill_tile_chunk`)."""
    cfg: LayerConfig
    layers: list[QuantLayer]
    config: NodeConfig
    layout: NodeLayout
    tokens: int
    max_blocks: int = 8           # KV blocks one ATTEND list may name (list region size)
    softmax: str = "single"
    tile_chunk: int = 0
    image: dict[int, bytes] = field(default_factory=dict)
    bufs: list[LayerBuffers] = field(default_factory=list)

    def __post_init__(self):
        if self.softmax not in RUN_SOFTMAX:
            raise ValueError(f"softmax {self.softmax!r}: one of {', '.join(RUN_SOFTMAX)}")
        if self.tile_chunk and not (self.softmax == "single" and self.config.tiled
                                    and 1 <= self.tile_chunk <= self.config.tile_max_chunk):
            raise ValueError(f"tile_chunk {self.tile_chunk}: PREFILL_TILE records need a "
                             f"single run on a node with the tiled path, chunks of 1.."
                             f"{self.config.tile_max_chunk} tokens ({self.config.name})")
        cfg, m = self.cfg, self.tokens
        hd, h, inter = cfg.head_dim, cfg.hidden, cfg.intermediate
        nq, nkv = cfg.heads * hd, cfg.kv_heads * hd
        rep = cfg.heads // cfg.kv_heads
        if rep > self.config.attn_heads or hd != self.config.attn_head_dim:
            raise ValueError(f"the {self.config.name} attention engine does not fit this model")
        if m > self.config.attn_block:
            raise ValueError(f"a slice of {m} tokens; the {self.config.name} attention engine "
                             f"reads KV blocks of at most {self.config.attn_block} tokens")
        self.ranges = row_ranges(m, self.config.gemm_m_max)
        alloc = self.alloc = _Alloc(self.layout.base + self.layout.size)

        def put(raw: bytes) -> int:
            a = alloc(len(raw))
            self.image[a] = raw
            return a

        self.zero = put(bytes(hd * 4))
        self.rq = alloc(m * nq * 4)
        self.rk = alloc(m * hd * 4)
        self.row_stride = cfg.kv_heads * kv_pair_bytes(hd)
        self.q_slot = query_slot_bytes(rep, hd)
        x = alloc(m * h * 4)
        self.x0 = x
        self.kv = alloc(len(self.layers) * m * self.row_stride, REGION_ALIGN)
        for ql in self.layers:
            blobs = {}
            for name, (qw, b) in pair_ordered(ql, cfg).items():
                raw, job = gemm_stripe_image(qw, self.config.gemm_rows, self.config.gemm_lanes,
                                             b, ports=self.config.hp_ports,
                                             beat_bytes=AXI_WIDTH // 8)
                at = alloc(len(raw), STRIPE_ALIGN)
                self.image[at] = raw
                blobs[name] = dataclasses.replace(job, addr=at)
            g1 = put(act_bytes(ql.gamma["g1"] & 0xFFFF))
            g2 = put(act_bytes(ql.gamma["g2"] & 0xFFFF))
            buf = {name: alloc(m * n * 4) for name, n in (
                ("n1", h), ("q", nq), ("k", nkv), ("v", nkv), ("qr", nq), ("att", nq),
                ("o", h), ("h", h), ("n2", h), ("g", inter), ("u", inter), ("s", inter),
                ("d", h), ("y", h))}
            xq = {n: [alloc(mr * n + 64) for _, mr in self.ranges] for n in (h, nq, inter)}
            kv = self.kv + len(self.bufs) * m * self.row_stride
            qrec = alloc(m * cfg.kv_heads * self.q_slot)
            self.bufs.append(LayerBuffers(blobs, g1, g2, x, buf, xq, kv, qrec))
            x = buf["y"]
        templates = []
        for lb in self.bufs:
            templates += self._templates(lb)
        self.table = alloc(ENTRY_BYTES * (len(templates) + sum(len(t) for t in templates)),
                           REGION_ALIGN)     # the table's rows, then every entry
        raw, self.table_len = template_image(templates, self.table)
        self.image[self.table] = raw
        blocks = self.max_blocks
        self.lists = alloc(len(self.layers) * m * cfg.kv_heads * (1 + blocks) * ATT_ENTRY_BYTES,
                           REGION_ALIGN)
        self.size = self.alloc.at - self.layout.base

    # ---- templates ----------------------------------------------------------------------------
    def _templates(self, lb: LayerBuffers):
        cfg, m, c = self.cfg, self.tokens, self.config
        hd, h, inter = cfg.head_dim, cfg.hidden, cfg.intermediate
        nq, nkv = cfg.heads * hd, cfg.kv_heads * hd
        rep = cfg.heads // cfg.kv_heads
        pair = kv_pair_bytes(hd)
        mats = pair_ordered(self.layers[self.bufs.index(lb)], cfg)
        buf, xq = lb.buf, lb.xq

        def requant(t, k, a):
            """``a``'s rows requantised, one buffer per GEMM row range."""
            for (r0, mr), at in zip(self.ranges, xq[k], strict=True):
                t.requant(k, mr, a + r0 * k * 4, at)

        def mm(names, k):
            """The projections ``names`` over every row range: one GEMM job per range."""
            return [(at, mr, k, lb.blobs[n], mats[n][0], buf[s] + r0 * mats[n][0].q.shape[0] * 4)
                    for n, s in names for (r0, mr), at in zip(self.ranges, xq[k], strict=True)]

        t0 = TemplateBuilder(norm_eps_code(cfg.eps), c.gemm_rows, c.gemm_lanes, c.vec_lanes)
        t0.vector(VectorOp.RMSNORM, h, m, lb.x, lb.g1, buf["n1"])
        requant(t0, h, buf["n1"])
        t0.gemms(mm((("q", "q"), ("k", "k"), ("v", "v")), h))
        t0.vector(VectorOp.ROPE, nq, m, buf["q"], self.rq, buf["qr"], b_stride=nq * 4)
        for g in range(cfg.kv_heads):
            t0.vector(VectorOp.ROPE, hd, m, buf["k"] + g * hd * 4, self.rk,
                      lb.kv + g * pair, a_stride=nkv * 4, b_stride=hd * 4,
                      out_stride=self.row_stride)
            t0.vector(VectorOp.ADD, hd, m, buf["v"] + g * hd * 4, self.zero,
                      lb.kv + g * pair + hd * 4, a_stride=nkv * 4, b_stride=0,
                      out_stride=self.row_stride)
        hb = query_head_bytes(hd)
        for hq in range(cfg.heads):
            g, i = divmod(hq, rep)
            wr = []
            for t in range(m):
                head = self.query_address(lb, t, g) + QUERY_HEADER_BYTES + i * hb
                wr += [(head + 4, hd, 0, 1), (head, 4, 0, 1)]
            t0.requant_to(hd, m, buf["qr"] + hq * hd * 4, nq * 4, wr)

        t1 = TemplateBuilder(norm_eps_code(cfg.eps), c.gemm_rows, c.gemm_lanes, c.vec_lanes)
        requant(t1, nq, buf["att"])
        t1.gemms(mm((("o", "o"),), nq))
        t1.vector(VectorOp.ADD, h, m, lb.x, buf["o"], buf["h"], b_stride=h * 4)
        t1.vector(VectorOp.RMSNORM, h, m, buf["h"], lb.g2, buf["n2"])
        requant(t1, h, buf["n2"])
        t1.gemms(mm((("gate", "g"), ("up", "u")), h))
        t1.vector(VectorOp.SILU_MUL, inter, m, buf["g"], buf["u"], buf["s"],
                  b_stride=inter * 4)
        requant(t1, inter, buf["s"])
        t1.gemms(mm((("down", "d"),), inter))
        t1.vector(VectorOp.ADD, h, m, buf["h"], buf["d"], buf["y"], b_stride=h * 4)
        return [t0.entries, t1.entries]

    def query_address(self, lb: LayerBuffers, token: int, kv_head: int) -> int:
        """Query record of slice token ``token`` for the query heads of ``kv_head``."""
        return prefill_query_address(lb.qrec + kv_head * self.tokens * self.q_slot, token,
                                     self.cfg.heads // self.cfg.kv_heads, self.cfg.head_dim)

    def emit_config(self) -> EmitConfig:
        """``EMIT_KV_BASE``/``EMIT_ROW_STRIDE``: one buffer, row ``layer · tokens + t``."""
        return EmitConfig(self.kv, self.row_stride)

    # ---- per step ------------------------------------------------------------------------------
    def step_writes(self, positions, x0=None) -> dict[int, bytes]:
        """DDR writes before a step: RoPE words of the slice's positions, the query headers,
        and (``x0``, ACT rows) the first layer's input."""
        cfg, pos = self.cfg, np.asarray(positions)
        rep = cfg.heads // cfg.kv_heads
        out = {self.rq: act_bytes(rope_words(pos, cfg.heads * cfg.head_dim, cfg.head_dim,
                                             cfg.theta)),
               self.rk: act_bytes(rope_words(pos, cfg.head_dim, cfg.head_dim, cfg.theta))}
        for layer, lb in enumerate(self.bufs):
            for t, p in enumerate(pos):
                for g in range(cfg.kv_heads):
                    hdr = QUERY_HEADER.const({"pos": int(p), "layer": layer, "head0": g * rep,
                                              "heads": rep}).as_bits()
                    out[self.query_address(lb, t, g)] = hdr.to_bytes(QUERY_HEADER_BYTES,
                                                                     "little")
        if x0 is not None:
            out[self.x0] = act_bytes(x0)
        return out


def slice_positions(plan, block: int, slice_: int) -> tuple[int, int]:
    """First position and token count of slice ``slice_`` of chunk ``block`` (1-based)."""
    per = -(-plan.chunk // plan.cluster.nodes)
    p0 = (block - 1) * plan.chunk + slice_ * per
    return p0, max(0, min(per, plan.chunk - slice_ * per))


def read_set(plan, block: int, node: int) -> list[tuple[int, int]]:
    """The ``(block, slice)`` KV blocks node ``node``'s queries of chunk ``block`` attend to,
    in list order: every slice that starts at or before the node's last query."""
    p0, n = slice_positions(plan, block, node)
    last = p0 + n - 1
    out = []
    for b in range(1, block + 1):
        for s in range(plan.cluster.nodes):
            q0, qn = slice_positions(plan, b, s)
            if qn and q0 <= last:
                out.append((b, s))
    return out


def max_read_set(plan) -> int:
    """The longest ATTEND list of the plan's prefill (a :class:`ModelImage`'s ``max_blocks``)."""
    return max(len(read_set(plan, b, v)) for b in range(1, plan.num_chunks + 1)
               for v in range(plan.cluster.nodes))


def _fragment_meta(plan, node: int, kv_id: int, seq: int, length: int) -> Meta:
    return Meta(stage=Stage.PREFILL, op=Op.KV_REPLICA, collective=Collective.P2P, src=node,
                dst=node, route_id=0, kv_id=kv_id, length=length, seq=seq)


def layer_records(plan, index: int, node: int, model: ModelImage, store: list[Meta],
                  send) -> tuple[list[Cmd], dict[int, bytes]]:
    """COMPUTE records of the layer program of chunk ``index`` on ``node`` (module docstring)
    and the ATTEND lists to write (``{address: bytes}``, list table at ``model.lists``).
    ``store``: the node's MARS store-phase Metas; per layer, the first send of each own
    fragment rides the EMIT tee, every other one becomes ``send(meta)`` (a SEND from DDR with
    the relay wait, or a header-only request) after the layer's EMITs."""
    enc, cfg, lay = plan.encoder, model.cfg, model.layout
    list_base = model.lists
    hd, rep = cfg.head_dim, cfg.heads // cfg.kv_heads
    p0, m = slice_positions(plan, index, node)
    if m != model.tokens:
        raise ValueError(f"slice of {m} tokens; the model image was built for {model.tokens}")
    frags = enc.fragments(m)
    rec_bytes = kv_token_bytes(hd)
    blocks = read_set(plan, index, node)
    if len(blocks) > model.max_blocks:
        raise ValueError(f"{len(blocks)} KV blocks per ATTEND; the image holds "
                         f"{model.max_blocks}")
    cmds: list[Cmd] = []
    lists: dict[int, bytes] = {}
    teed: set[int] = set()
    per_list = 1 + len(blocks)
    n_list = 0
    for layer in range(plan.model.layers):
        cmds.append(Cmd(RecordClass.JOB, Queue.COMPUTE,
                        arg=JOB_ARG.const({"template": 2 * layer}).as_bits()))
        kv_id = enc.kv_id(layer, index, node)
        for seq, length in enumerate(frags):
            head, t0 = enc.fragment_tokens(seq)
            first = next((i for i, s in enumerate(store) if s.op == Op.KV_REPLICA
                          and s.kv_id == kv_id and s.seq == seq), None)
            meta = store[first] if first is not None else \
                _fragment_meta(plan, node, kv_id, seq, length)
            arg = EmitArg(row=layer * m + t0, head=head, tokens=length // rec_bytes)
            cmds.append(Cmd(RecordClass.EMIT, Queue.COMPUTE, meta=meta.pack(), arg=arg.pack(),
                            replicate=first is not None))
            if first is not None:
                cmds.append(Cmd(RecordClass.SEND, Queue.COMPUTE, meta=meta.pack(),
                                src=PayloadSource.EMIT))
                teed.add(first)
        cmds += [send(s) for i, s in enumerate(store)
                 if i not in teed and enc.kv_key(s.kv_id)[0] == layer]
        for b, s in blocks:
            kid = enc.kv_id(layer, b, s)
            cmds.append(Cmd(RecordClass.NOP, Queue.COMPUTE,
                            meta=_fragment_meta(plan, node, kid, 0, 0).pack(),
                            wait=len(enc.fragments(slice_positions(plan, b, s)[1]))))
        lb = model.bufs[layer]
        step = model.tile_chunk or 1      # query tokens per record
        mode = AttendMode.PREFILL_TILE if model.tile_chunk else AttendMode.PREFILL
        stride = cfg.heads * prefill_out_bytes(1, hd)     # one token's row of all query heads
        for t in range(0, m, step):
            n = min(step, m - t)
            for g in range(cfg.kv_heads):
                ents = []
                for b, s in blocks:
                    q0, qn = slice_positions(plan, b, s)
                    if q0 > p0 + t + n - 1:
                        continue
                    ents.append(AttendBlock(block_address(lay.kv, enc.kv_id(layer, b, s), g,
                                                          lay.kv_layout), qn, q0))
                out = lb.buf["att"] + t * stride + g * prefill_out_bytes(rep, hd)
                hdr = (AttendHeader(model.query_address(lb, t, g), out, n, stride)
                       if model.tile_chunk else AttendHeader(model.query_address(lb, t, g), out))
                lists[list_base + n_list * ATT_ENTRY_BYTES] = attend_list_bytes(hdr, ents)
                cmds.append(Cmd(RecordClass.ATTEND, Queue.COMPUTE,
                                arg=AttendArg(n_list, len(ents), mode, rep,
                                              PREFILL_SOFTMAX[model.softmax]).pack()))
                n_list += per_list
        cmds.append(Cmd(RecordClass.JOB, Queue.COMPUTE,
                        arg=JOB_ARG.const({"template": 2 * layer + 1}).as_bits()))
    return cmds, lists

"""The row-parallel step of tensor-parallel decode on the node (issue #34 item 3, docs/cluster.md
"Tensor-parallel decode": the O and down projections): one projection ``Y = X · Wᵀ`` whose
K range is split over the N nodes (:func:`mcf.golden.tp_decode.tp_split`'s ranges), every node
ending with the whole K's output row.

Per node ``i`` (K range ``[k0, k1)``), the data this module lays out in the node's DDR
(:class:`RowParallelImage`):

* the **weight shard**: the matrix's columns ``[k0, k1)`` over the whole groups they touch,
  codes outside the range zero (:func:`shard_weight`), as a stripe image
  (:func:`mcf.quant.gemm_stripe_image`);
* the **bias stripes**: the matrix's bias only (:func:`mcf.abi.compute.gemm_bias_stream`, split
  with :func:`mcf.abi.compute.gemm_w_stripes`), read by the ``acc_in`` job's STRIPE entry;
* the **ACT input**: a row of the padded K (``kp`` words), the node's shard at offset
  ``k0 − j0·group``, zeros elsewhere (zeros change neither the absmax nor the accumulator);
* the buffers between the steps (:class:`RowParallelBuffers`).

and its three templates (:meth:`RowParallelImage.templates`):

1. ``ABSMAX`` of the ACT row → one beat whose lanes 0 and 1 are the node's
   :func:`mcf.abi.tp.absmax_lanes` (the MAX all-reduce's contribution, :data:`MAX_BYTES`);
2. ``REQUANT_EXT`` of the ACT row with the MAX-reduced lanes (one beat from the node's MBUF
   slot) → the whole row's INT8 codes and scale word; then a GEMM ``acc_out`` job over the
   shard → each output element's exact accumulator as two SUM lanes
   (:func:`mcf.abi.tp.acc_lanes`);
3. a GEMM ``acc_in`` job: the scale word and the SUM-reduced lanes on ``x_in``, the bias
   stripes on ``w_in`` → the epilogue once: the output row.

Between 1 and 2 the MAX all-reduce (:func:`max_records`: the two lanes to the root's
``ReduceOp.MAX`` reduction, landed by the decode lander in an MBUF slot; the root multicasts its
slot to the other nodes, as two-phase decode does); between 2 and 3 the SUM all-reduce of the
``2·N`` lanes in payloads of whole lane pairs (:func:`sum_payloads`, :func:`sum_records`): each
payload to the root's ``ReduceOp.SUM`` reduction tagged in the decode lander's SUM window
(:func:`mcf.abi.decode_land.sum_tag`), so the results land as one contiguous lane vector at
the image's ``summed`` buffer (the node's ``SUM_BASE``, :meth:`RowParallelImage.sum_registers`);
WAIT ``SUMS_LANDED``; the root multicasts its SUM slots; the ``acc_in`` JOB.

:func:`mcf.golden.node_tp.golden_step` chains the engines' golden models (:mod:`mcf.golden.vector`,
:mod:`mcf.golden.gemm`, the NIC's :func:`mcf.golden.tp_decode.nic_all_reduce`) over exactly
the buffers the templates read and write; its output equals
:func:`mcf.golden.tp_decode.row_parallel` and the single-node GEMM of the whole K.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..abi.compute import (
    STRIPE_ALIGN,
    DmaDesc,
    GemmJob,
    StripeJob,
    gemm_bias_stream,
    gemm_w_stripes,
)
from ..abi.decode_land import (
    DEC_ADDR_BITS,
    M_SLOT_BYTES,
    SUM_SLOT_BYTES,
    SUM_SLOTS_BITS,
    TAG_BITS,
    mbuf_slot,
    sum_tag,
)
from ..abi.framing import MAX_PAYLOAD
from ..abi.jobs import ENTRY_BYTES, JOB_ARG, STRIPE_KIND, Entry, EntryKind, template_image
from ..abi.meta import Collective, Meta, Op, ReduceOp, Stage
from ..abi.nic import LANE_BYTES
from ..abi.node import Cmd, PayloadSource, Queue, RecordClass
from ..abi.node_config import AXI_WIDTH, NodeConfig
from ..abi.quant import ReadDest, VectorOp, WriteSrc
from ..abi.sequencer import SeqCounter
from ..abi.tp import ABSMAX_LANES, ACC_LANES
from ..golden.tp_decode import Range
from ..quant import QuantWeight, gemm_stripe_image, gemm_tile_blob
from .layer import _Alloc, act_bytes

__all__ = ["MAX_BYTES", "ShardWeight", "shard_weight", "RowParallelBuffers",
           "RowParallelImage", "SumPayload", "sum_payloads", "max_records", "sum_records"]

MAX_BYTES = ABSMAX_LANES * LANE_BYTES
"""Bytes of a node's MAX all-reduce contribution (:data:`mcf.abi.tp.ABSMAX_LANES` lanes): the
SEND's ``length``, the ABSMAX beat's low lanes."""
if MAX_BYTES > M_SLOT_BYTES:  # pragma: no cover - the MAX result lands in one MBUF slot
    raise AssertionError("the absmax lanes do not fit an MBUF slot")
if SUM_SLOT_BYTES != MAX_PAYLOAD or MAX_PAYLOAD % (ACC_LANES * LANE_BYTES):  # pragma: no cover
    raise AssertionError("SUM payloads cut at MAX_PAYLOAD must fill whole SUM slots")


@dataclass(frozen=True)
class ShardWeight:
    """Node's K range ``k`` of a weight matrix as its GEMM runs it: ``qw`` = the columns of the
    whole groups ``groups`` touches (``kp = (j1 − j0)·group`` columns), codes outside ``k``
    zero; ``lo``/``hi``: ``k`` relative to the first padded column."""
    k: Range
    groups: Range
    qw: QuantWeight

    @property
    def kp(self) -> int:
        return self.qw.q.shape[1]

    @property
    def lo(self) -> int:
        return self.k[0] - self.groups[0] * self.qw.group

    @property
    def hi(self) -> int:
        return self.k[1] - self.groups[0] * self.qw.group


def shard_weight(qw: QuantWeight, k: Range) -> ShardWeight:
    """The shard of ``qw`` a node holds for its K range ``k`` (class docstring)."""
    g = qw.group
    if not 0 <= k[0] < k[1] <= qw.q.shape[1]:
        raise ValueError(f"K range {k} of a {qw.q.shape[1]}-column matrix")
    j0, j1 = k[0] // g, -(-k[1] // g)
    q = np.zeros((qw.q.shape[0], (j1 - j0) * g), dtype=np.int64)
    lo = k[0] - j0 * g
    q[:, lo:lo + k[1] - k[0]] = qw.q[:, k[0]:k[1]]
    return ShardWeight(k, (j0, j1), QuantWeight(q, qw.m[:, j0:j1], qw.e, g))


@dataclass(frozen=True)
class RowParallelBuffers:
    """Byte addresses of one node's row-parallel step: ``x`` the ACT row (``kp`` words),
    ``mx`` the ABSMAX beat (its first :data:`MAX_BYTES` are sent), ``mslot`` the MBUF slot the
    MAX result lands in (REQUANT_EXT's ``b``), ``xq`` the codes (``kp`` bytes) then the scale
    word, ``lanes`` the ``acc_out`` lanes (``2·N`` words), ``summed`` the SUM-reduced lanes
    (the decode lander's ``SUM_BASE``: its SUM slots, whole ``MAX_PAYLOAD`` slots),
    ``y`` the output row (``N`` ACT words); ``w`` / ``bias`` the stripe jobs."""
    x: int
    mx: int
    mslot: int
    xq: int
    lanes: int
    summed: int
    y: int
    w: StripeJob
    bias: StripeJob


def _bias_stripes(qw: QuantWeight, bias, config: NodeConfig) -> tuple[bytes, StripeJob]:
    """The bias-only weight stream of an ``acc_in`` job, as a stripe image (the layout of
    :func:`mcf.quant.gemm_stripe_image`: stripe ``p`` at ``p · pitch``)."""
    rows, beat = config.gemm_rows, AXI_WIDTH // 8
    n = qw.q.shape[0]
    stream = gemm_bias_stream(gemm_tile_blob(qw, rows, config.gemm_lanes, bias), n // rows,
                              rows, config.hp_ports * beat)
    stripes = gemm_w_stripes(stream, config.hp_ports, beat)
    length = len(stripes[0])
    pitch = -(-length // STRIPE_ALIGN) * STRIPE_ALIGN
    raw = b"".join(s + bytes(pitch - length) for s in stripes)
    return raw, StripeJob(0, length, pitch)


@dataclass
class RowParallelImage:
    """One node's DDR image of the row-parallel step for a matrix ``qw`` (``N × K``, ``bias``
    or None) and its K range ``k``, from byte address ``base`` (module docstring); MBUF at
    ``mbuf_base`` with ``q_heads`` slots per parity (the node's decode layout), the MAX result
    in the slot of ``(parity, head0)``. The SUM result lands in the decode lander's SUM slots
    ``sum_slot0 …`` of a window at ``sum_base`` (None: a window of its own, allocated here; a
    layer running two steps gives both one window and disjoint slots). ``x_at``: where the
    padded input row already is (None: a zeroed row of its own, written by :meth:`x_writes`;
    tensor-parallel decode's O step reads its node's OBUF rows in place). ``image``:
    ``{address: bytes}``; ``templates``: the three entry lists; ``table`` / ``table_len``: the
    template table (its own, at :attr:`table`, for a node that runs only this step)."""
    qw: QuantWeight
    k: Range
    config: NodeConfig
    base: int
    mbuf_base: int
    q_heads: int
    eps_code: int = 0
    bias: np.ndarray | None = None
    parity: int = 0
    head0: int = 0
    sum_base: int | None = None
    sum_slot0: int = 0
    x_at: int | None = None
    image: dict[int, bytes] = field(default_factory=dict)

    def __post_init__(self):
        c = self.config
        n = self.qw.q.shape[0]
        self.sum_slots = len(sum_payloads(n, 0, 0, 0, 0))
        if self.sum_slot0 + self.sum_slots >= 1 << SUM_SLOTS_BITS:
            raise ValueError(f"N = {n} needs SUM slots {self.sum_slot0}.."
                             f"{self.sum_slot0 + self.sum_slots - 1}")
        self.shard = shard_weight(self.qw, self.k)
        kp = self.shard.kp
        if n % c.gemm_rows or kp % c.vec_lanes:
            raise ValueError(f"N = {n} is not whole {c.gemm_rows}-row tiles or K = {kp} whole "
                             f"{c.vec_lanes}-lane beats")
        if not c.gemm_limits.accepts(1, kp // c.gemm_lanes, n // c.gemm_rows):
            raise ValueError(f"the {c.name} GEMM refuses a shard of K = {kp}")
        alloc = _Alloc(self.base)
        beat = AXI_WIDTH // 8
        raw, wjob = gemm_stripe_image(self.shard.qw, c.gemm_rows, c.gemm_lanes,
                                      ports=c.hp_ports, beat_bytes=beat)
        at = alloc(len(raw), STRIPE_ALIGN)
        self.image[at] = raw
        wjob = dataclasses.replace(wjob, addr=at)
        raw, bjob = _bias_stripes(self.qw, self.bias, c)
        at = alloc(len(raw), STRIPE_ALIGN)
        self.image[at] = raw
        bjob = dataclasses.replace(bjob, addr=at)
        if self.x_at is None:
            x = alloc(kp * 4)
            self.image[x] = bytes(kp * 4)
        else:
            x = self.x_at
        self.buf = RowParallelBuffers(
            x=x, mx=alloc(beat), mslot=mbuf_slot(self.mbuf_base, self.q_heads, self.parity,
                                                 self.head0),
            xq=alloc(kp + beat), lanes=alloc(ACC_LANES * n * 4),
            summed=(alloc(self.sum_slots * SUM_SLOT_BYTES) if self.sum_base is None
                    else self.sum_base + self.sum_slot0 * SUM_SLOT_BYTES),
            y=alloc(n * 4), w=wjob, bias=bjob)
        self.templates = [self._absmax(), self._requant_acc_out(), self._acc_in()]
        self.table = alloc(ENTRY_BYTES * (len(self.templates)
                                          + sum(len(t) for t in self.templates)), STRIPE_ALIGN)
        raw, self.table_len = template_image(self.templates, self.table)
        self.image[self.table] = raw
        self.end = alloc.at

    # ---- templates -----------------------------------------------------------------------------
    def _vec(self, op: VectorOp) -> Entry:
        return Entry(EntryKind.VEC, {"op": op, "n_beats": self.shard.kp // self.config.vec_lanes,
                                     "eps": self.eps_code}, True)

    @staticmethod
    def _route(d0, d1, src) -> Entry:
        return Entry(EntryKind.ROUTE, {"rd_dest0": d0, "rd_dest1": d1, "wr_src": src}, True)

    @staticmethod
    def _desc(kind: EntryKind, addr: int, length: int) -> Entry:
        return Entry(kind, DmaDesc(addr, length))

    def _absmax(self) -> list[Entry]:
        b, kp = self.buf, self.shard.kp
        return [self._vec(VectorOp.ABSMAX),
                self._route(ReadDest.VEC_A, ReadDest.VEC_B, WriteSrc.VECTOR),
                self._desc(EntryKind.RD0, b.x, kp * 4),
                self._desc(EntryKind.WR, b.mx, AXI_WIDTH // 8)]

    def _job(self, **flags) -> GemmJob:
        c = self.config
        return GemmJob(1, self.shard.kp // c.gemm_lanes, self.qw.q.shape[0] // c.gemm_rows,
                       self.qw.e, **flags)

    def _requant_acc_out(self) -> list[Entry]:
        b, kp, rows = self.buf, self.shard.kp, self.config.gemm_rows
        job = self._job(acc_out=1)
        tile = rows * ACC_LANES * 4
        return [self._vec(VectorOp.REQUANT_EXT),
                self._route(ReadDest.VEC_A, ReadDest.VEC_B, WriteSrc.VECTOR),
                self._desc(EntryKind.RD0, b.x, kp * 4),
                self._desc(EntryKind.RD1, b.mslot, AXI_WIDTH // 8),
                self._desc(EntryKind.WR, b.xq, kp),
                self._desc(EntryKind.WR, b.xq + kp, 4),
                self._route(ReadDest.GEMM_X, ReadDest.GEMM_W, WriteSrc.GEMM),
                Entry(EntryKind.GEMM, job),
                *(Entry(EntryKind.RD0, d) for d in job.x_descriptors(b.xq, self.config.gemm_lanes)),
                Entry(STRIPE_KIND, b.w),
                *(self._desc(EntryKind.WR, b.lanes + t * tile, tile)
                  for t in range(job.n_tiles))]

    def _acc_in(self) -> list[Entry]:
        b, kp, rows = self.buf, self.shard.kp, self.config.gemm_rows
        job = self._job(acc_in=1)
        n = self.qw.q.shape[0]
        return [self._route(ReadDest.GEMM_X, ReadDest.GEMM_W, WriteSrc.GEMM),
                Entry(EntryKind.GEMM, job),
                self._desc(EntryKind.RD0, b.xq + kp, 4),
                self._desc(EntryKind.RD0, b.summed, ACC_LANES * n * 4),
                Entry(STRIPE_KIND, b.bias),
                *(self._desc(EntryKind.WR, b.y + t * rows * 4, rows * 4)
                  for t in range(job.n_tiles))]

    # ---- host writes ---------------------------------------------------------------------------
    def sum_registers(self) -> dict[str, int]:
        """The decode lander's SUM window up to this step: ``SUM_BASE`` = the window (the
        ``summed`` buffer less ``sum_slot0`` slots), ``DEC_SUM_SLOTS`` = ``sum_slot0`` + the
        payloads of the row (:func:`sum_payloads`)."""
        base = (self.buf.summed - self.sum_slot0 * SUM_SLOT_BYTES) % (1 << DEC_ADDR_BITS)
        return {"SUM_BASE_LO": base & 0xFFFF_FFFF, "SUM_BASE_HI": base >> 32,
                "DEC_SUM_SLOTS": self.sum_slot0 + self.sum_slots}

    def x_writes(self, shard) -> dict[int, bytes]:
        """The node's ACT input shard (``k1 − k0`` codes) into its padded row."""
        shard = np.asarray(shard, dtype=np.int64).ravel()
        if shard.size != self.k[1] - self.k[0]:
            raise ValueError(f"a shard of {shard.size} codes for K range {self.k}")
        row = np.zeros(self.shard.kp, dtype=np.int64)
        row[self.shard.lo:self.shard.hi] = shard
        return {self.buf.x: act_bytes(row)}

    def job(self, template: int, first: int = 0) -> Cmd:
        """The COMPUTE JOB record of template ``template`` (0 ABSMAX, 1 REQUANT_EXT + acc_out,
        2 acc_in) of a table whose first template of this step is ``first``."""
        if not 0 <= template < len(self.templates):
            raise ValueError(f"template {template} of {len(self.templates)}")
        return Cmd(RecordClass.JOB, Queue.COMPUTE,
                   arg=JOB_ARG.const({"template": first + template}).as_bits())


# ---- the all-reduces -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SumPayload:
    """One SUM all-reduce payload: lanes ``[w0, w0 + words)`` of the ``acc_out`` lanes (whole
    :data:`~mcf.abi.tp.ACC_LANES` pairs) and its Meta."""
    w0: int
    words: int
    meta: Meta


def sum_payloads(n: int, node: int, root: int, route_id: int, tag0: int, seq: int = 0,
                 max_payload: int = MAX_PAYLOAD) -> list[SumPayload]:
    """The SUM all-reduce of an ``N = n`` row's lanes from ``node``: ``2·n`` lanes cut into
    payloads of at most ``max_payload`` bytes of whole lane pairs (the cut of
    :func:`mcf.golden.tp_decode.nic_all_reduce`), tags ``tag0, tag0 + 1, …`` (mod 2^16). Cut at
    ``MAX_PAYLOAD`` (the default), payload ``i`` is the decode lander's SUM slot ``i``."""
    per = max_payload // LANE_BYTES // ACC_LANES * ACC_LANES
    if per == 0:
        raise ValueError(f"a {max_payload}-byte payload holds no lane pair")
    words = ACC_LANES * n
    return [SumPayload(w0, min(per, words - w0),
                       Meta(stage=Stage.DECODE, op=Op.REDUCTION, collective=Collective.ALL_REDUCE,
                            reduce_op=ReduceOp.SUM, src=node, dst=root, route_id=route_id,
                            kv_id=(tag0 + i) % (1 << TAG_BITS),
                            length=min(per, words - w0) * LANE_BYTES, seq=seq))
            for i, w0 in enumerate(range(0, words, per))]


def max_records(image: RowParallelImage, node: int, root: int, nodes: int, reduce_route: int,
                bcast_route: int, qbuf_base: int, tag_base: int, first: int = 0,
                landed: int = 0) -> list[Cmd]:
    """``node``'s COMPUTE records of the step up to the ``acc_out`` JOB: ABSMAX JOB; the
    :data:`MAX_BYTES` lanes to ``root``'s ``ReduceOp.MAX`` reduction on ``reduce_route``
    (``kv_id = tag_base + head0`` and ``seq = parity``: the decode lander's MBUF slot of the
    image); WAIT ``MAXES_LANDED ≥ landed + 1``; the root multicasts its slot on
    ``bcast_route``; the REQUANT_EXT + ``acc_out`` JOB. ``qbuf_base``: the node's QBUF (SEND
    ``src=QBUF`` offsets); ``MAXES_LANDED`` counts from the last MARK that cleared it, ``landed``
    of them from earlier steps."""
    b = image.buf
    if b.mx < qbuf_base:
        raise ValueError("the image must lie above QBUF (SEND src=QBUF offsets)")
    tag = tag_base + image.head0
    meta = Meta(stage=Stage.DECODE, op=Op.REDUCTION, collective=Collective.ALL_REDUCE,
                reduce_op=ReduceOp.MAX, src=node, dst=root, route_id=reduce_route, kv_id=tag,
                length=MAX_BYTES, seq=image.parity)
    out = [image.job(0, first),
           Cmd(RecordClass.SEND, Queue.COMPUTE, meta=meta.pack(), src=PayloadSource.QBUF,
               arg=b.mx - qbuf_base),
           Cmd(RecordClass.WAIT, Queue.COMPUTE, arg=SeqCounter.MAXES_LANDED.value,
               wait=landed + 1)]
    others = [d for d in range(nodes) if d != root]
    if node == root and others:
        cast = Meta(stage=Stage.DECODE, op=Op.REDUCTION, collective=Collective.MULTICAST,
                    src=root, dst=others[0], route_id=bcast_route, kv_id=tag, length=MAX_BYTES,
                    seq=image.parity)
        out.append(Cmd(RecordClass.SEND, Queue.COMPUTE, meta=cast.pack(), src=PayloadSource.QBUF,
                       arg=b.mslot - qbuf_base))
    out.append(image.job(1, first))
    return out


def sum_records(image: RowParallelImage, node: int, root: int, nodes: int, reduce_route: int,
                bcast_route: int, qbuf_base: int, tag_base: int, first: int = 0,
                landed: int = 0) -> list[Cmd]:
    """``node``'s COMPUTE records of the step after the ``acc_out`` JOB: the ``acc_out`` lanes
    as :func:`sum_payloads` (``2·N`` lanes, ``MAX_PAYLOAD`` cut) to ``root``'s ``ReduceOp.SUM``
    reduction on ``reduce_route``, payload ``i`` tagged :func:`~mcf.abi.decode_land.sum_tag`
    ``(tag_base, q_heads, sum_slot0 + i)`` (the decode lander's SUM slot ``sum_slot0 + i`` of
    the image's window, :meth:`RowParallelImage.sum_registers`); WAIT ``SUMS_LANDED ≥ landed +``
    the payload count; the root multicasts its SUM slots on ``bcast_route``; the ``acc_in``
    JOB. ``SUMS_LANDED`` counts from the last MARK that cleared it, ``landed`` of them from
    earlier steps."""
    b = image.buf
    if b.lanes < qbuf_base or b.summed < qbuf_base:
        raise ValueError("the image must lie above QBUF (SEND src=QBUF offsets)")
    n = image.qw.q.shape[0]
    pays = sum_payloads(n, node, root, reduce_route,
                        sum_tag(tag_base, image.q_heads, image.sum_slot0), seq=image.parity)
    out = [Cmd(RecordClass.SEND, Queue.COMPUTE, meta=p.meta.pack(), src=PayloadSource.QBUF,
               arg=b.lanes + p.w0 * LANE_BYTES - qbuf_base) for p in pays]
    out.append(Cmd(RecordClass.WAIT, Queue.COMPUTE, arg=SeqCounter.SUMS_LANDED.value,
                   wait=landed + len(pays)))
    others = [d for d in range(nodes) if d != root]
    if node == root and others:
        for p in pays:
            cast = dataclasses.replace(p.meta, collective=Collective.MULTICAST,
                                       reduce_op=ReduceOp.NONE, dst=others[0],
                                       route_id=bcast_route)
            out.append(Cmd(RecordClass.SEND, Queue.COMPUTE, meta=cast.pack(),
                           src=PayloadSource.QBUF,
                           arg=b.summed + p.w0 * LANE_BYTES - qbuf_base))
    out.append(image.job(2, first))
    return out

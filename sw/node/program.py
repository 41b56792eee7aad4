"""MARS's per-node records → the node's configuration writes and command rings (docs/node.md §3
"Who goes where", §6 "Records"). The driver's rule, written once: the PYNQ driver and the
simulation benches apply its output through their own buses.

A prefill chunk step of node ``n`` becomes two record lists:

* **NET** (ring 0): MARS's ``plan`` phase in MARS's order — DRAIN notices and FETCH_REQUESTs as
  header-only SENDs, history sends as KV SENDs from the ``kv_id``'s slot with the **relay wait**
  (the node holds the whole block: ``landed(kv_id) ≥ packets``) — then a MARK.
* **COMPUTE** (ring 1): the ``store`` phase layer-major (the chunk's own blocks, just emitted:
  KV SENDs with the same wait; FETCH_REQUESTs), MARS's ``free`` phase as directory FREEs behind a
  WAIT for the NET records before them (a FREE must not overtake a send of the same copy), the
  FREEs of the step's fetched copies (each waits for its copy to land: the step's data-driven
  end), then a MARK.

With a model image (:mod:`mcf.node.layer`) the COMPUTE ring carries the layer program instead of
the store phase's sends: per layer JOB → EMIT (tee: the first store-phase send of each fragment
rides it) → the layer's other store records → block barriers → ATTEND → JOB. Without one, a
step's own blocks are the ones the PS placed in DDR and declared with ``DIR_LAND``
(:func:`owner_declarations`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..abi.csrmap import node_regmap
from ..abi.directory import DirOp
from ..abi.landing import land_off_entry
from ..abi.link_map import link_map_for
from ..abi.meta import Collective, Meta, Op, Stage
from ..abi.node import Cmd, PayloadSource, Queue, RecordClass
from ..abi.regs import RegisterMap
from ..abi.sequencer import SeqCounter
from .layout import NodeLayout

__all__ = ["Write", "StepProgram", "configure", "route_writes", "step_program",
           "owner_declarations", "block_tokens", "packets_per_kv"]


@dataclass(frozen=True)
class Write:
    """One AXI-Lite register write: register name and the whole 32-bit word."""
    reg: str
    value: int


def _w(regmap: RegisterMap, reg: str, **fields: int) -> Write:
    return Write(reg, regmap.register(reg).pack(**fields))


def _split40(regmap, stem: str, addr: int) -> list[Write]:
    return [_w(regmap, f"{stem}_LO", **{f"{stem}_LO": addr & 0xFFFF_FFFF}),
            _w(regmap, f"{stem}_HI", **{f"{stem}_HI": addr >> 32})]


def configure(plan, layout: NodeLayout, node: int, *, topology: str = "ring",
              seq_timeout: int = 0, regmap: RegisterMap | None = None,
              model=None) -> list[Write]:
    """The writes that prepare ``node`` for ``plan`` (before any doorbell): identity, link map,
    unicast routes, the KV rule and its ``LAND_OFF`` table, QBUF/OBUF, the rings, the
    watchdog, every interrupt cause enabled, both queues running; with ``model`` (a
    :class:`mcf.node.layer.ModelImage`) also the template table, the ACT K/V rows and the
    ATTEND list table."""
    rm = regmap or node_regmap()
    n = plan.cluster.nodes
    out = [_w(rm, "NODE", local_id=node, num_nodes=n)]
    links = link_map_for(node, n, topology)
    out.append(_w(rm, "LINK_MAP", **{f"port{p}_link": ln for p, ln in enumerate(links)}))
    out += route_writes(plan.static_routes(), node, rm)
    out += _split40(rm, "KV_BASE", layout.kv.kv_base)
    out += [_w(rm, "KV_SLOT", KV_SLOT=layout.kv.kv_slot),
            _w(rm, "KV_COUNT", KV_COUNT=layout.kv.kv_count)]
    for seq, off in enumerate(layout.kv_layout.land_off):
        if off is None:
            continue
        entry = land_off_entry(off)
        fields = rm.register("LAND_OFF_DATA").unpack(entry)
        out += [_w(rm, "LAND_OFF_DATA", **fields), _w(rm, "LAND_OFF_WR", seq=seq)]
    out += _split40(rm, "QBUF_BASE", layout.qbuf_base)
    out += _split40(rm, "OBUF_BASE", layout.obuf_base)
    out += _split40(rm, "MBUF_BASE", layout.mbuf_base)
    out += [_w(rm, "QBUF_SLOT", QBUF_SLOT=layout.qbuf_slot),
            _w(rm, "DEC_Q_HEADS", DEC_Q_HEADS=layout.q_heads)]
    for q in Queue:
        out += _split40(rm, f"CMD{q.value}_BASE", layout.cmd_base[q.value])
        out.append(_w(rm, f"CMD{q.value}_SIZE", **{f"CMD{q.value}_SIZE": layout.cmd_log2}))
    if model is not None:
        out += _split40(rm, "JOBS_TABLE", model.table)
        out.append(_w(rm, "JOBS_TABLE_LEN", JOBS_TABLE_LEN=model.table_len))
        emit = model.emit_config()
        out += _split40(rm, "EMIT_KV_BASE", emit.kv_base)
        out.append(_w(rm, "EMIT_ROW_STRIDE", EMIT_ROW_STRIDE=emit.row_stride))
        out += _split40(rm, "ATT_LIST_BASE", model.lists)
    out.append(_w(rm, "SEQ_TIMEOUT", SEQ_TIMEOUT=seq_timeout))
    irq = rm.register("IRQ_ENABLE")
    out.append(Write("IRQ_ENABLE", irq.pack(**{f.name: 1 for f in irq.fields})))
    for q in Queue:
        out.append(_w(rm, f"SEQ{q.value}_CTRL", run=1))
    return out


def route_writes(entries, node: int, regmap: RegisterMap | None = None) -> list[Write]:
    """``ROUTE_WR`` writes of the entries ``(node, route_id, entry)`` that belong to ``node``."""
    rm = regmap or node_regmap()
    return [_w(rm, "ROUTE_WR", route_id=rid, entry=entry)
            for n, rid, entry in entries if n == node]


def block_tokens(plan) -> dict[tuple[int, int], int]:
    """Tokens of every slice ``(block, slice)`` the plan moves."""
    out: dict[tuple[int, int], int] = {}
    for step in plan.steps:
        for t in step.transfers:
            out[(t.block, t.slice)] = t.tokens
    return out


def packets_per_kv(plan, block: int, slice_: int, tokens: dict | None = None) -> int:
    """KV packets of one ``kv_id`` (one layer of one slice): what a full copy lands."""
    tokens = block_tokens(plan) if tokens is None else tokens
    return len(plan.encoder.fragments(tokens[(block, slice_)]))


@dataclass
class StepProgram:
    """One node's records for one step, and what they should leave behind."""
    net: list[Cmd] = field(default_factory=list)
    compute: list[Cmd] = field(default_factory=list)
    kv_sends: list = field(default_factory=list)       # the KV_REPLICA Metas this node sends
    lists: dict = field(default_factory=dict)          # ATTEND lists: {address: bytes}


def _send(meta, packets: int, queue: Queue) -> Cmd:
    if meta.op == Op.KV_REPLICA:
        return Cmd(RecordClass.SEND, queue, meta=meta.pack(), src=PayloadSource.KV,
                   wait=packets)
    return Cmd(RecordClass.SEND, queue, meta=meta.pack(), src=PayloadSource.HDR)


def step_program(plan, index: int, node: int, net_retired_before: int = 0,
                 model=None) -> StepProgram:
    """``node``'s records of prefill step ``index`` (docs/node.md §3). ``net_retired_before``:
    NET records the node retired before this step (the COMPUTE queue's WAIT before MARS's FREEs
    counts NET records since reset). ``model``: a :class:`mcf.node.layer.ModelImage` — the
    step then computes its own KV with the layer program (:func:`mcf.node.layer.layer_records`,
    whose EMITs tee the store phase's first send of every fragment; its ATTEND lists go to
    ``prog.lists``); without it, the owners' KV is the PS's (:func:`owner_declarations`)."""
    enc = plan.encoder
    tokens = block_tokens(plan)
    step = plan.steps[index - 1]
    prog = StepProgram()

    def send(meta, queue=Queue.COMPUTE) -> Cmd:
        _, block, slice_ = enc.kv_key(meta.kv_id)
        packets = packets_per_kv(plan, block, slice_, tokens) if meta.op == Op.KV_REPLICA \
            else 0
        return _send(meta, packets, queue)

    store = []
    for rec in plan.step_records(index):
        if rec.node != node or rec.phase == "free":
            continue                    # the free phase: below, after the store phase
        if rec.phase == "plan":
            prog.net.append(send(rec.meta, Queue.NET))
        elif model is None:
            prog.compute.append(send(rec.meta))
        else:
            store.append(rec.meta)
        if rec.meta.op == Op.KV_REPLICA:
            prog.kv_sends.append(rec.meta)
    if model is not None:
        from .layer import layer_records
        prog.compute, prog.lists = layer_records(plan, index, node, model, store, send)
    frees = [r.meta for r in plan.step_records(index)
             if r.node == node and r.phase == "free" and r.meta.op == Op.INVALIDATE]
    if frees:
        prog.compute.append(Cmd(RecordClass.WAIT, Queue.COMPUTE,
                                arg=SeqCounter.OTHER_RETIRED.value,
                                wait=net_retired_before + len(prog.net)))
    for meta in frees:
        _, block, slice_ = enc.kv_key(meta.kv_id)
        prog.compute.append(Cmd(RecordClass.DIR, Queue.COMPUTE, meta=meta.pack(),
                                wait=packets_per_kv(plan, block, slice_, tokens),
                                arg=DirOp.FREE.value))
    for t in step.transfers:            # fetched copies: released once landed (and used)
        if t.kind != "access" or node not in t.dests:
            continue
        for layer in range(plan.model.layers):
            kv_id = enc.kv_id(layer, t.block, t.slice)
            meta = _dir_meta(plan, node, kv_id)
            prog.compute.append(Cmd(RecordClass.DIR, Queue.COMPUTE, meta=meta,
                                    wait=len(enc.fragments(t.tokens)), arg=DirOp.FREE.value))
    prog.net.append(Cmd(RecordClass.MARK, Queue.NET, irq=True))
    prog.compute.append(Cmd(RecordClass.MARK, Queue.COMPUTE, irq=True))
    return prog


def _dir_meta(plan, node: int, kv_id: int) -> int:
    return Meta(stage=Stage.PREFILL, op=Op.INVALIDATE, collective=Collective.P2P, src=node,
                dst=node, route_id=0, kv_id=kv_id, length=0).pack()


def owner_declarations(plan, index: int, node: int,
                       regmap: RegisterMap | None = None) -> list[Write]:
    """``DIR_LAND`` writes declaring ``node``'s own blocks of chunk ``index`` (every layer, every
    fragment) present — what the K/V emitter's local copies do once the compute half is joined."""
    rm = regmap or node_regmap()
    enc, tokens = plan.encoder, block_tokens(plan)
    if (index, node) not in tokens:
        return []
    out = []
    for layer in range(plan.model.layers):
        kv_id = enc.kv_id(layer, index, node)
        for _ in range(packets_per_kv(plan, index, node, tokens)):
            out.append(_w(rm, "DIR_LAND", kv_id=kv_id, owner=1))
    return out

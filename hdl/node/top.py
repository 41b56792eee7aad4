"""The node top: one KR260's programmable logic behind flat Xilinx ports (docs/node.md, issue #11;
paper §5, Fig. 2: the PS pushes metadata, the PL moves and lands every tensor).

Command rings → two in-order sequencers (NET, COMPUTE). The COMPUTE queue's JOB, EMIT and
ATTEND records drive the compute half (:class:`~mcf.hdl.node.compute.NodeCompute`: template
walker + matrix engine, K/V emitter, ATTEND executor + KV reader + attention engine); SEND
records of both queues → send unit → packetizer → parser 0 → router; three links (through the
``LINK_MAP`` crossbar) → LinkRx → parsers 1..3; every local output (and EMIT's local fragments)
merged packet by packet into the local sink → landing engine (KV slots), decode lander
(QBUF/OBUF), directory (DRAIN) and the barrier counter.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import NODE_LINKS, PARSER_PORTS, node_regmap
from mcf.abi.directory import DIR_OP, LAND_EVENT
from mcf.abi.framing import beat_layout, parsed_layout
from mcf.abi.meta import Port
from mcf.abi.node import IRQ_CAUSES, Queue
from mcf.abi.node_config import (
    AXI_WIDTH,
    PACKET_WIDTH,
    SIM,
    TOP_ADDR_BITS,
    TOP_ID_BITS,
    NodeConfig,
)
from mcf.abi.sequencer import DEFAULT_DIR_SETTLE, SeqCounter

from ..csr.axil import AxiLiteSignature
from ..csr.bank import CsrBank
from ..mem.axi import AXI4Signature
from ..mem.axi_mux import AxiPortMux
from ..nic.top import NicTop
from ..packet.packetizer import Packetizer
from ..packet.parser import Parser, port_member_name
from ..stream.register_slice import RegisterSlice
from .arbiter import PacketArbiter
from .compute import COMPUTE_BUSES, NodeCompute
from .decode_land import DecodeLander
from .directory import Directory
from .ingress import CmdRingReader
from .landing import LandingEngine
from .link_map import LinkMap
from .local_sink import LocalSink
from .send import SendUnit
from .sequencer import QueueSequencer

__all__ = ["NodeTop", "node_axis_names", "HP_CLIENTS", "dir_op_path", "DIR_OP_DELAY", "DIR_SETTLE"]

HP_CLIENTS: dict[int, tuple[str, ...]] = {
    0: ("ring0", "ring1", "walker", "mat0", "w0"),
    1: ("mat1", "kvr", "w1"),
    2: ("land", "dec", "att_wr", "w2"),
    3: ("send", "emit", "att_rd", "w3"),
}
"""The AXI4 masters on each HP port, in client (AXI ID) order (docs/node.md §4): weight stripe
``p`` (``w<p>``, the GEMM's stripe readers) on HP port ``p`` beside that port's other clients."""


def node_axis_names(links: int = NODE_LINKS) -> dict[str, str]:
    """FlatTop prefixes of the link streams (the members already carry them)."""
    return {n: n for lk in range(links) for n in (f"m_axis_link{lk}", f"s_axis_link{lk}")}


def _one_beat(layout) -> data.StructLayout:
    """A single-beat record as a 'packet' (for :class:`PacketArbiter`)."""
    return data.StructLayout({"rec": layout, "last": 1})


DIR_OP_DELAY = 6
"""Cycles from a sequencer's DIR transfer to ``Directory.op`` accepting the op, at most
(``tests/test_node_top_dir_path.py`` reaches it; :func:`dir_op_path`): the transfer ends in a
ready slice (``dir_slice``) when the op arbiter does not take the op at once, and the arbiter
feeds ``Directory.op`` through a full slice (``dirop_slice``), which the directory serves
alternately with ``land`` events (its read ports never hold an op back), so it takes an op at
least every second cycle while ops wait.
Ahead of the op are at most three: the two the full slice holds and one DRAIN the round-robin
arbiter grants before it; 2 cycles each."""

DIR_SETTLE = max(DEFAULT_DIR_SETTLE, 1 + DIR_OP_DELAY)
"""The sequencers' ``dir_settle`` in this top: the directory shows an op to reads presented
the cycle after it accepts it (:class:`~mcf.hdl.node.sequencer.QueueSequencer`)."""


class NodeTop(wiring.Component):
    """One node: CSR bank, rings, sequencers, send path, NIC, links, local sinks, AXI ports.

    Parameters
    ----------
    config : :class:`mcf.abi.node_config.NodeConfig` (``SIM`` or ``KR260``).

    Members (the flat names of docs/node.md §10 under :class:`mcf.hdl.flat.FlatTop`)
    -------------------------------------------------------------------------------------
    s_axi_ctrl : In(AxiLiteSignature(addr 12, data 32)) — :func:`mcf.abi.csrmap.node_regmap`.
    m_axi_hp{0..3} : Out(AXI4Signature(49, 128, id 6)) — the clients of :data:`HP_CLIENTS`
        behind one :class:`~mcf.hdl.mem.axi_mux.AxiPortMux` per port; the ID's top bits are
        the client index.
    m_axis_link{l} / s_axis_link{l} : wire-format frames (``beat_layout(64)``) to / from the
        MAC wrapper of physical link ``l`` (0 SFP+, 1 and 2 RGMII).
    irq : Out(1) — OR of ``IRQ_STATUS & IRQ_ENABLE``.

    Latency: the blocks' own (each block's docstring); the register paths add the bank's. The
    parsers run with ``out_register`` (a full slice on every output, +1 cycle: the router's
    FORWARD inputs and the local, control, reduction and all-to-all arbiters take registers).
    The top adds one cycle (a full :class:`~mcf.hdl.stream.register_slice.RegisterSlice`) in
    front of the router's other inputs (the reduction results, the all-to-all parts), between
    the local packet arbiter and the local sink, between the sink's DRAINs and the
    directory-op arbiter, and between that arbiter and ``Directory.op``; a ready slice (no
    latency while empty; a record the next stage does not take at once waits in its skid
    register) sits between the COMPUTE sequencer's ``dir`` and that arbiter
    (:func:`dir_op_path`) and between each sequencer's ``send`` and the send unit. A
    sequencer's FREE reaches the directory up to :data:`DIR_OP_DELAY` cycles after its
    transfer, so the sequencers run with ``dir_settle`` = :data:`DIR_SETTLE`.
    """

    def __init__(self, config: NodeConfig = SIM):
        self.config = config
        self.regmap = node_regmap()
        self.bank = CsrBank(self.regmap)
        axi = AXI4Signature(TOP_ADDR_BITS, AXI_WIDTH, TOP_ID_BITS)
        wire = stream.Signature(beat_layout(PACKET_WIDTH))
        members = {"s_axi_ctrl": In(AxiLiteSignature(self.bank.addr_width, 32))}
        for p in range(config.hp_ports):
            members[f"m_axi_hp{p}"] = Out(axi)
        for lk in range(config.links):
            members[f"m_axis_link{lk}"] = Out(wire)
            members[f"s_axis_link{lk}"] = In(wire)
        members["irq"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.bank = bank = self.bank
        wiring.connect(m, wiring.flipped(self.s_axi_ctrl), bank.s_axi_ctrl)
        regs = bank.regs
        local_id, num_nodes = regs.NODE.local_id, regs.NODE.num_nodes

        def status(prefix: str, value) -> None:
            for name, _ in value.shape():
                m.d.comb += bank.port(f"{prefix}_{name}").eq(value[name])

        # ---- configuration word ----------------------------------------------------------------
        caps = cfg.caps()
        for fld, off in self.regmap.register("CAPS").offsets():
            m.d.comb += getattr(regs.CAPS, fld.name).eq((caps >> off) & ((1 << fld.width) - 1))

        # ---- command rings and sequencers ------------------------------------------------------
        rings, seqs = [], []
        for q in Queue:
            ring = CmdRingReader(q, fifo_depth=cfg.ring_fifo, max_burst=min(16, cfg.ring_fifo))
            seq = QueueSequencer(q, dir_settle=DIR_SETTLE)
            m.submodules[f"ring{q.value}"] = ring
            m.submodules[f"seq{q.value}"] = seq
            rings.append(ring)
            seqs.append(seq)
            r = f"CMD{q.value}"
            m.d.comb += [
                ring.base.eq(Cat(bank.port(f"{r}_BASE_LO"), bank.port(f"{r}_BASE_HI"))),
                ring.size.eq(bank.port(f"{r}_SIZE")),
                ring.doorbell.payload.eq(bank.port(f"{r}_PROD").value),
                ring.doorbell.valid.eq(bank.port(f"{r}_PROD").stb),
                bank.port(f"{r}_HEAD").eq(ring.prod),
                bank.port(f"{r}_CONS").eq(ring.cons),
            ]
            status(f"cmd{q.value}", ring.status)
            wiring.connect(m, ring.o, seq.rec)
            ctrl = getattr(regs, f"SEQ{q.value}_CTRL")
            m.d.comb += [seq.timeout.eq(bank.port("SEQ_TIMEOUT")),
                         seq.skip.eq(_pulse(ctrl.skip)), seq.abort.eq(_pulse(ctrl.abort))]
            status(f"seq{q.value}", seq.status)

        # ---- directory -------------------------------------------------------------------------
        m.submodules.directory = dirx = Directory(cfg.kv_count, n_read=len(seqs) + 1)
        peek = getattr(dirx, f"read{len(seqs)}")          # the PS's read-back port
        m.d.comb += [dirx.clear.eq(_pulse(regs.DIR_CTRL.clear)),
                     regs.DIR_READY.ready.eq(dirx.ready),
                     peek.kv_id.eq(regs.DIR_PEEK.kv_id),
                     regs.DIR_ENTRY.state.eq(peek.state),
                     regs.DIR_ENTRY.landed.eq(peek.landed),
                     regs.DIR_ENTRY.fresh.eq(peek.fresh)]
        status("dir", dirx.status)
        for q, seq in enumerate(seqs):
            port = getattr(dirx, f"read{q}")
            m.d.comb += [port.kv_id.eq(seq.dir_kv_id), seq.dir_landed.eq(port.landed),
                         seq.dir_fresh.eq(port.fresh),
                         seq.enable.eq(dirx.ready & getattr(regs, f"SEQ{q}_CTRL").run)]

        # ---- send path: sequencers → send unit → packetizer → parser 0 -------------------------
        m.submodules.send = send = SendUnit()
        m.submodules.pkt = pkt = Packetizer(PACKET_WIDTH)
        # a ready slice per queue (no latency while empty): the send unit's arbitration
        # (req ready) no longer reaches a sequencer's transfer and directory lookup
        for q, seq in enumerate(seqs):
            m.submodules[f"send_slice{q}"] = sl = RegisterSlice(seq.send.payload.shape(),
                                                                forward=False)
            wiring.connect(m, seq.send, sl.i)
            wiring.connect(m, sl.o, getattr(send, f"req{q}"))
        wiring.connect(m, send.o_meta, pkt.i_meta)
        wiring.connect(m, send.o_payload, pkt.i_payload)
        status("send", send.status)
        status("pkt", pkt.status)

        # ---- compute half: JOB, EMIT, ATTEND ---------------------------------------------------
        m.submodules.compute = comp = NodeCompute(cfg)
        cseq = seqs[Queue.COMPUTE.value]
        for name in ("job", "emit", "attend"):
            wiring.connect(m, getattr(cseq, name), getattr(comp, name))
            m.d.comb += getattr(cseq, f"{name}_done").eq(getattr(comp, f"{name}_done"))

        def addr(reg: str):
            return Cat(bank.port(f"{reg}_LO"), bank.port(f"{reg}_HI"))

        m.d.comb += [
            comp.jobs_table.eq(addr("JOBS_TABLE")),
            comp.jobs_table_len.eq(bank.port("JOBS_TABLE_LEN")),
            comp.emit_cfg.kv_base.eq(addr("EMIT_KV_BASE")),
            comp.emit_cfg.row_stride.eq(bank.port("EMIT_ROW_STRIDE")),
            comp.att_list_base.eq(addr("ATT_LIST_BASE")),
            comp.local_id.eq(local_id),
        ]
        wiring.connect(m, comp.staged_emit, send.staged_emit)
        wiring.connect(m, comp.staged_attn, send.staged_attn)
        for prefix in ("jobs", "emit", "att", "kvr", "dma0", "dma1", "gemm", "vector", "attn",
                       "cmp", "stripe"):
            status(prefix, getattr(comp, f"{prefix}_status"))

        # out_register: every parser output (FORWARD to the router, LOCAL / CONTROL /
        # REDUCTION / ALL_TO_ALL to the arbiters) starts from flip-flops (+1 cycle)
        parsers = [Parser(PACKET_WIDTH, max_payload=cfg.max_payload, out_register=True)
                   for _ in range(PARSER_PORTS)]
        for i, prs in enumerate(parsers):
            m.submodules[f"parser{i}"] = prs
            m.d.comb += [prs.local_id.eq(local_id), prs.num_nodes.eq(num_nodes)]
            status(f"parser{i}", prs.status)
        wiring.connect(m, pkt.o_packet, parsers[0].i_packet)

        # ---- NIC and links ---------------------------------------------------------------------
        m.submodules.nic = nic = NicTop(data_width=PACKET_WIDTH, n_links=cfg.links,
                                        n_inject=3, max_payload=cfg.max_payload,
                                        reduce_slots=cfg.reduce_slots)
        for reg in nic.regs.signature.members:      # NODE + the NIC registers, by name
            wiring.connect(m, getattr(bank.regs, reg), getattr(nic.regs, reg))
        m.submodules.link_map = lmap = LinkMap(cfg.links, beat_layout(PACKET_WIDTH))
        m.d.comb += lmap.map.eq(Cat(*(getattr(regs.LINK_MAP, f"port{p}_link")
                                      for p in range(cfg.links))))
        status("link_map", lmap.status)
        for p in range(cfg.links):
            wiring.connect(m, getattr(nic, f"mac_tx{p}"), getattr(lmap, f"mac_tx{p}"))
            wiring.connect(m, getattr(lmap, f"mac_rx{p}"), getattr(nic, f"mac_rx{p}"))
            wiring.connect(m, getattr(lmap, f"link_tx{p}"),
                           wiring.flipped(getattr(self, f"m_axis_link{p}")))
            wiring.connect(m, wiring.flipped(getattr(self, f"s_axis_link{p}")),
                           getattr(lmap, f"link_rx{p}"))
            wiring.connect(m, getattr(nic, f"link_rx{p}"), parsers[1 + p].i_packet)
        # the router's inputs from registers: the parsers' full output slices (net_in*,
        # inject0) and full slices (+1 cycle each) on the engines' results (inject1, inject2):
        # its allocation starts from registers and its grants do not reach the parsers' or the
        # engines' output logic
        for p in range(cfg.links):
            wiring.connect(m, getattr(parsers[1 + p], port_member_name(Port.FORWARD)),
                           getattr(nic, f"net_in{p}"))
        wiring.connect(m, getattr(parsers[0], port_member_name(Port.FORWARD)), nic.inject0)
        for name, src in (("inject1", nic.reduce_out), ("inject2", nic.a2a_net)):
            m.submodules[f"{name}_slice"] = sl = RegisterSlice(src.payload.shape())
            wiring.connect(m, src, sl.i)
            wiring.connect(m, sl.o, getattr(nic, name))
        m.d.comb += nic.a2a_scatter.valid.eq(0)   # scatter source: the compute half (not yet)

        parsed = parsed_layout(PACKET_WIDTH)
        n_par = len(parsers)
        m.submodules.arb_reduce = arb_red = PacketArbiter(n_par, parsed)
        m.submodules.arb_a2a = arb_a2a = PacketArbiter(n_par, parsed)
        local_srcs = ([getattr(prs, port_member_name(Port.LOCAL)) for prs in parsers] +
                      [getattr(prs, port_member_name(Port.CONTROL)) for prs in parsers] +
                      [nic.deliver, nic.a2a_out, comp.local])
        m.submodules.arb_local = arb_loc = PacketArbiter(len(local_srcs), parsed)
        for i, prs in enumerate(parsers):
            wiring.connect(m, getattr(prs, port_member_name(Port.REDUCTION)),
                           getattr(arb_red, f"i{i}"))
            wiring.connect(m, getattr(prs, port_member_name(Port.ALL_TO_ALL)),
                           getattr(arb_a2a, f"i{i}"))
        for i, src in enumerate(local_srcs):
            wiring.connect(m, src, getattr(arb_loc, f"i{i}"))
        wiring.connect(m, arb_red.o, nic.reduce_in)
        wiring.connect(m, arb_a2a.o, nic.a2a_in)

        # ---- local sinks -----------------------------------------------------------------------
        m.submodules.lsink = lsink = LocalSink()
        m.submodules.landing = land = LandingEngine(kv_count=cfg.kv_count)
        m.submodules.decode = dec = DecodeLander(cfg.attn_head_dim)
        # a full slice (+1 cycle) cuts the parsers' outputs → arb_local → the sink's route
        # chain (docs/depth.md) on every local packet; the sink's DRAINs meet the sequencer's
        # FREEs through more slices (dir_op_path, within the sequencers' dir_settle)
        m.submodules.lsink_in = lsink_in = RegisterSlice(parsed)
        wiring.connect(m, arb_loc.o, lsink_in.i)
        wiring.connect(m, lsink_in.o, lsink.i)
        wiring.connect(m, lsink.kv, land.i)
        wiring.connect(m, lsink.decode, dec.i)
        status("lsink", lsink.status)
        status("land", land.status)
        status("dec", dec.status)
        kv_cfg = [
            land.cfg.kv_base.eq(Cat(bank.port("KV_BASE_LO"), bank.port("KV_BASE_HI"))),
            land.cfg.kv_slot.eq(bank.port("KV_SLOT")),
            # a KV_COUNT beyond the directory (the driver refuses it) counts as the directory's
            # size: a kv_id past it is unmapped at the landing and the send unit alike
            land.cfg.kv_count.eq(Mux(bank.port("KV_COUNT") > cfg.kv_count, cfg.kv_count,
                                     bank.port("KV_COUNT"))),
        ]
        m.d.comb += kv_cfg
        m.d.comb += send.cfg.eq(land.cfg)
        for unit in (land, send):
            m.d.comb += [
                unit.land_off_we.eq(regs.LAND_OFF_WR.seq.stb),
                unit.land_off_seq.eq(regs.LAND_OFF_WR.seq.value),
                unit.land_off_data.eq(Cat(regs.LAND_OFF_DATA.offset, regs.LAND_OFF_DATA.valid)),
            ]
        m.d.comb += land.local_id.eq(local_id)
        qbuf_base = Cat(bank.port("QBUF_BASE_LO"), bank.port("QBUF_BASE_HI"))
        m.d.comb += [
            dec.cfg.qbuf_base.eq(qbuf_base),
            dec.cfg.obuf_base.eq(Cat(bank.port("OBUF_BASE_LO"), bank.port("OBUF_BASE_HI"))),
            dec.cfg.mbuf_base.eq(Cat(bank.port("MBUF_BASE_LO"), bank.port("MBUF_BASE_HI"))),
            dec.cfg.q_slot.eq(bank.port("QBUF_SLOT")),
            dec.cfg.q_heads.eq(bank.port("DEC_Q_HEADS")),
            dec.cfg.tag_base.eq(bank.port("DEC_TAG_BASE")),
            dec.cfg.sum_base.eq(Cat(bank.port("SUM_BASE_LO"), bank.port("SUM_BASE_HI"))),
            dec.cfg.sum_slots.eq(bank.port("DEC_SUM_SLOTS")),
            send.qbuf_base.eq(qbuf_base),
        ]

        # directory inputs: land events (landing engine, DIR_LAND), ops (FREE, DRAIN)
        m.submodules.arb_land = arb_land = PacketArbiter(2, _one_beat(LAND_EVENT))
        _feed(m, land.landed, arb_land.i0)
        ps_land = _strobe_source(m, LAND_EVENT, regs.DIR_LAND.kv_id.stb | regs.DIR_LAND.owner.stb,
                                 Cat(regs.DIR_LAND.kv_id.value, regs.DIR_LAND.owner.value))
        _feed(m, ps_land, arb_land.i1)
        _drain(m, arb_land.o, dirx.land)
        dir_op_path(m, seqs[Queue.COMPUTE.value].dir, lsink.dir_op, dirx.op)

        # counters the sequencers' WAITs test
        for q, seq in enumerate(seqs):
            other = seqs[1 - q]
            m.d.comb += [
                seq.counters[SeqCounter.RESULTS_LANDED.value].eq(dec.status.results_landed),
                seq.counters[SeqCounter.QUERIES_LANDED.value].eq(dec.status.queries_landed),
                seq.counters[SeqCounter.CONTROL.value].eq(lsink.control),
                seq.counters[SeqCounter.OTHER_RETIRED.value].eq(other.retired),
                seq.counters[SeqCounter.MAXES_LANDED.value].eq(dec.status.maxes_landed),
                seq.counters[SeqCounter.SUMS_LANDED.value].eq(dec.status.sums_landed),
            ]

        # ---- AXI: HP-port multiplexers ---------------------------------------------------------
        buses = {"ring0": rings[0].bus, "ring1": rings[1].bus, "land": land.m_axi,
                 "dec": dec.bus, "send": send.bus,
                 **{b: getattr(comp, f"m_axi_{b}") for b in COMPUTE_BUSES}}
        for p in range(cfg.hp_ports):
            _hp_port(m, f"hp{p}", [buses[b] for b in HP_CLIENTS[p]],
                     getattr(self, f"m_axi_hp{p}"))

        # ---- interrupts ------------------------------------------------------------------------
        causes = _irq_causes(m, seqs, rings, comp, land, dec, lsink, send, nic, cfg.links)
        pending = []
        for name, _ in IRQ_CAUSES:
            m.d.comb += getattr(regs.IRQ_STATUS, name).set.eq(causes[name])
            pending.append(getattr(regs.IRQ_STATUS, name).value &
                           getattr(regs.IRQ_ENABLE, name))
        m.d.comb += self.irq.eq(Cat(*pending).any())
        return m


def _irq_causes(m: Module, seqs, rings, comp, land, dec, lsink, send, nic, links: int) -> dict:
    """``IRQ_STATUS``'s causes (:data:`mcf.abi.node.IRQ_CAUSES`) by name, each high for one
    cycle per event: a sequencer's MARK, a sequencer halting (the rise of ``halted``), and the
    first cycle any of the parts' counters behind ``bad_record``, ``overrun``, ``bus_error``,
    ``drop`` and ``link_error`` shows a new value."""
    return {
        "mark0": seqs[0].irq_mark, "mark1": seqs[1].irq_mark,
        "halt0": _rose(m, seqs[0].halted), "halt1": _rose(m, seqs[1].halted),
        "bad_record": _bumped(m, [*(r.status.bad_records for r in rings),
                                  comp.jobs_status.bad_index, comp.jobs_status.bad_entries,
                                  comp.jobs_status.bad_gemm,
                                  comp.emit_status.bad_record, comp.att_status.bad_record,
                                  comp.att_status.bad_list, comp.kvr_status.rejects]),
        "overrun": _bumped(m, [r.status.overruns for r in rings]),
        "bus_error": _bumped(m, [*(r.status.read_errors for r in rings),
                                 land.status.write_errors, dec.status.write_errors,
                                 send.status.read_errors, comp.jobs_status.read_errors,
                                 comp.emit_status.read_errors, comp.att_status.write_errors,
                                 comp.kvr_status.bus_errors, comp.stripe_status.errors,
                                 *(getattr(comp, f"dma{i}_status")[f"{d}_errors"]
                                   for i in (0, 1) for d in ("rd", "wr"))]),
        "drop": _bumped(m, [land.status.drop_unmapped, land.status.drop_bad_seq,
                            land.status.drop_op, lsink.status.drop_op,
                            lsink.status.drop_invalidate,
                            dec.status.drop_op, dec.status.drop_reduce_op,
                            dec.status.drop_length, dec.status.drop_slot,
                            send.status.drop_unmapped, send.status.drop_bad_seq,
                            send.status.drop_bad_record]),
        "link_error": _stepped(m, [_nic_counter(nic, f"link{p}_rx_{c}")
                                   for p in range(links) for c in LINK_FAULTS]),
    }


def _pulse(field) -> Signal:
    """A one-bit ``W`` field as a command: a write of 1 (the bank strobes on any write of the
    register's byte, so ``run`` can be written without aborting)."""
    return field.stb & field.value


def dir_op_path(m: Module, seq_dir: stream.Interface, drain: stream.Interface,
                op: stream.Interface) -> None:
    """The directory's op input as the top wires it (``tests/test_node_top_dir_path.py`` builds
    it alone): the COMPUTE sequencer's DIR ops (FREE) through a ready slice (``dir_slice``: the
    arbiter's grant does not reach the sequencer's transfer and directory lookup) and the local
    sink's DRAINs through a full slice (``drain_slice``) into a round-robin arbiter
    (``arb_dirop``), then a full slice (``dirop_slice``) into ``op`` (``Directory.op``). An op
    reaches ``op`` at most :data:`DIR_OP_DELAY` cycles after its transfer."""
    one_op = _one_beat(DIR_OP)
    m.submodules.dir_slice = dir_slice = RegisterSlice(DIR_OP, forward=False)
    m.submodules.drain_slice = drain_slice = RegisterSlice(DIR_OP)
    m.submodules.arb_dirop = arb_op = PacketArbiter(2, one_op)
    m.submodules.dirop_slice = dirop_slice = RegisterSlice(one_op)
    for src, sl in ((seq_dir, dir_slice), (drain, drain_slice)):
        m.d.comb += [sl.i.valid.eq(src.valid), sl.i.payload.eq(src.payload),
                     src.ready.eq(sl.i.ready)]
    _feed(m, dir_slice.o, arb_op.i0)
    _feed(m, drain_slice.o, arb_op.i1)
    wiring.connect(m, arb_op.o, dirop_slice.i)
    _drain(m, dirop_slice.o, op)


def _feed(m: Module, src: stream.Interface, dst: stream.Interface) -> None:
    """A single-beat record stream into a :func:`_one_beat` arbiter input."""
    m.d.comb += [dst.valid.eq(src.valid), dst.payload.rec.eq(src.payload), dst.payload.last.eq(1),
                 src.ready.eq(dst.ready)]


def _drain(m: Module, src: stream.Interface, dst: stream.Interface) -> None:
    m.d.comb += [dst.valid.eq(src.valid), dst.payload.eq(src.payload.rec),
                 src.ready.eq(dst.ready)]


def _strobe_source(m: Module, layout, stb, value) -> stream.Interface:
    """A register write strobe as a one-entry stream (held until taken; a strobe while one is
    held replaces nothing — AXI-Lite writes are several cycles apart and the arbiter grants
    within two)."""
    out = stream.Signature(layout).create()
    with m.If(stb & ~out.valid):
        m.d.sync += [out.valid.eq(1), out.payload.eq(value)]
    with m.Elif(out.ready):
        m.d.sync += out.valid.eq(0)
    return out


def _rose(m: Module, sig) -> Signal:
    prev = Signal()
    m.d.sync += prev.eq(sig)
    return sig & ~prev


def _bumped(m: Module, counters) -> Signal:
    """1 in the cycle after any of ``counters`` changed (an event counted)."""
    bumps = []
    for c in counters:
        prev = Signal.like(c)
        m.d.sync += prev.eq(c)
        bumps.append(prev != c)
    hit = Signal()
    m.d.comb += hit.eq(Cat(*bumps).any())
    return hit


LINK_FAULTS = ("crc_errors", "drop_bad_header", "drop_oversize", "drop_stale", "seq_gaps")
"""The link receiver counters a ``link_error`` interrupt watches (each steps by one per frame;
``lost_frames`` grows with ``seq_gaps``)."""


def _nic_counter(nic, name: str) -> Value:
    """The NIC's status counter register ``name``."""
    return getattr(getattr(nic.regs, name), name)


def _stepped(m: Module, counters) -> Signal:
    """1 in the cycle after any of ``counters`` stepped — counters that only ever step by one,
    so their low bit toggles on every event (cheaper than :func:`_bumped`'s full compare)."""
    lows = Cat(*(c[0] for c in counters))
    prev = Signal.like(lows)
    m.d.sync += prev.eq(lows)
    hit = Signal()
    m.d.comb += hit.eq((prev ^ lows).any())
    return hit


def _hp_port(m: Module, name: str, clients, port) -> None:
    """Join ``clients`` (AXI4 masters, 40-bit) onto the top's HP port (49-bit, 6-bit IDs)."""
    if not clients:
        for sig in ("arvalid", "awvalid", "wvalid"):
            m.d.comb += getattr(port, sig).eq(0)
        m.d.comb += [port.rready.eq(1), port.bready.eq(1)]
        return
    mux = AxiPortMux(len(clients), addr_width=clients[0].signature.addr_width,
                     data_width=AXI_WIDTH)
    m.submodules[f"{name}_mux"] = mux
    for i, c in enumerate(clients):
        wiring.connect(m, c, getattr(mux, f"s{i}"))
    mm = mux.m
    for member, desc in AXI4Signature(TOP_ADDR_BITS, AXI_WIDTH, TOP_ID_BITS).members.items():
        inner, outer = getattr(mm, member), getattr(port, member)
        if desc.flow == Out:
            m.d.comb += outer.eq(inner)     # zero-extends addresses and IDs
        else:
            m.d.comb += inner.eq(outer)     # truncates returned IDs to the mux's width

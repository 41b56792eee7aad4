"""The NIC engines of one node behind their control/status registers (paper §5, Figure 2:
"MARS … delivers control to the PL through AXI-Lite"; the NIC is metadata-driven).

:class:`NicTop` instantiates the router, the reduction engine, the all-to-all engine and one
link framer / deframer pair per inter-board link, and connects every table write port,
watchdog and status counter to the NIC registers of :func:`mcf.abi.csrmap.nic_registers` — the
same registers the node map contains, so the node top connects them to its bank register by
register. :class:`NicCsrTop` adds an AXI-Lite
:class:`~mcf.hdl.csr.bank.CsrBank` of :func:`mcf.abi.csrmap.nic_regmap`: the NIC as a block a
PS can drive on its own (and the cocotb bench's top).
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.csrmap import NODE_LINKS, nic_registers, nic_regmap, node_register
from mcf.abi.framing import MAX_PAYLOAD, beat_layout, parsed_layout
from mcf.abi.nic import Topology
from mcf.abi.node_config import SIM

from ..csr.bank import CsrBank, register_signature
from ..stream import RegisterSlice
from .all_to_all import AllToAll
from .link import LinkRx, LinkTx
from .reduce import ReduceEngine
from .router import Router

__all__ = ["NicTop", "NicCsrTop", "nic_axis_names"]


def _regs_signature(n_links: int) -> wiring.Signature:
    """The NIC registers as seen from the bank (``CsrBank.regs`` members of the same names)."""
    return wiring.Signature({reg.name: Out(register_signature(reg))
                             for reg in [node_register(), *nic_registers(n_links)]})


class NicTop(wiring.Component):
    """Router + reduction + all-to-all + link TX/RX ×``n_links``, with their registers.

    Parameters: ``data_width``; ``n_links`` (network ports = links, ≤ ``NODE_LINKS`` on a
    KR260); ``topology`` (router bubble rule); ``n_inject`` (router local inputs);
    ``max_payload`` (router, link RX, reduction; default :data:`mcf.abi.framing.MAX_PAYLOAD`);
    ``reduce_slots`` (required: the configuration's ``mcf.abi.node_config.NodeConfig``
    ``reduce_slots`` — kr260 12 = H_q of Qwen2.5-1.5B, sim 4; docs/node.md §7);
    ``a2a_max_nodes``, ``a2a_part_max`` (default: the all-to-all engine's,
    ``MAX_PAYLOAD // a2a_max_nodes``), ``a2a_slots``.

    Members (streams are ``parsed_layout`` unless marked wire = ``beat_layout``)
    -----------------------------------------------------------------------------
    ``net_in{p}``: In — packets that arrived on link ``p`` and passed that link's parser
        (its FORWARD output): router network input ``p``.
    ``inject{j}``: In — router local inputs (packetizer, reduction results, all-to-all parts).
    ``deliver``: Out — the router's local copies.
    ``mac_tx{p}``: Out, wire — frames of router output ``p`` (``LinkTx``) towards MAC ``p``.
    ``mac_rx{p}``: In, wire — frames from MAC ``p``; ``link_rx{p}``: Out, wire — the packets
        ``LinkRx`` accepted, towards link ``p``'s parser.
    ``reduce_in`` / ``reduce_out``: the reduction engine's contributions / results.
    ``a2a_scatter`` / ``a2a_net`` / ``a2a_in`` / ``a2a_out``: the all-to-all engine's scatter
        requests / outgoing parts / arriving parts / gathered tensors.
    ``regs``: ``In(signature)`` — one interface per register of ``NODE`` +
        :func:`~mcf.abi.csrmap.nic_registers` (the flip of ``CsrBank.regs`` for those names).

    Register wiring: ``ROUTE_WR`` / ``REDUCE_CFG_WR`` — a write strobes the table write port
    with the written route id and entry (one table write per bus write); ``reduce_timeout``,
    ``a2a_timeout`` — watchdogs; ``NODE`` — ``local_id`` / ``num_nodes`` of the engines; every
    ``nic_router_*``, ``nic_reduce_*``, ``nic_a2a_*``, ``link{p}_tx_*``, ``link{p}_rx_*``
    register reads the engine's status field of that name (links ≥ ``n_links`` read 0).

    What stays outside (the node top's choice): the per-link parsers between ``link_rx{p}``
    and ``net_in{p}`` (each link needs its own, see the router's deadlock argument) and where
    parser outputs, reduction results and all-to-all parts go. Latency: the engines' own plus
    one cycle on each of ``deliver``, ``reduce_in``, ``a2a_in`` and ``a2a_out``: a full
    :class:`~mcf.hdl.stream.RegisterSlice` each (full rate; cuts the node's arbiter → engine
    paths, docs/depth.md); the register paths add none beyond the bank's.
    """

    def __init__(self, *, data_width: int = 64, n_links: int = NODE_LINKS,
                 topology: Topology = Topology.RING, n_inject: int = 3,
                 max_payload: int = MAX_PAYLOAD, reduce_slots: int,
                 a2a_max_nodes: int = 8, a2a_part_max: int | None = None,
                 a2a_slots: int = 2):
        if not 1 <= n_links <= NODE_LINKS:
            raise ValueError(f"n_links must lie in 1..{NODE_LINKS}")
        self._n_links, self._n_inject = n_links, n_inject
        self.router = Router(data_width=data_width, n_ports=n_links, n_local_in=n_inject,
                             topology=topology, max_payload=max_payload)
        self.reduce = ReduceEngine(data_width=data_width, n_slots=reduce_slots,
                                   max_payload=max_payload)
        self.a2a = AllToAll(data_width=data_width, max_nodes=a2a_max_nodes,
                            part_max=a2a_part_max, n_slots=a2a_slots)
        self.link_tx = [LinkTx(data_width=data_width) for _ in range(n_links)]
        self.link_rx = [LinkRx(data_width=data_width, max_payload=max_payload)
                        for _ in range(n_links)]
        parsed = stream.Signature(parsed_layout(data_width))
        wire = stream.Signature(beat_layout(data_width))
        members = {}
        for p in range(n_links):
            members[f"net_in{p}"] = In(parsed)
            members[f"mac_tx{p}"] = Out(wire)
            members[f"mac_rx{p}"] = In(wire)
            members[f"link_rx{p}"] = Out(wire)
        for j in range(n_inject):
            members[f"inject{j}"] = In(parsed)
        members.update({
            "deliver": Out(parsed),
            "reduce_in": In(parsed), "reduce_out": Out(parsed),
            "a2a_scatter": In(parsed), "a2a_net": Out(parsed),
            "a2a_in": In(parsed), "a2a_out": Out(parsed),
            "regs": In(_regs_signature(n_links)),
        })
        super().__init__(members)

    @property
    def n_links(self) -> int:
        return self._n_links

    @property
    def n_inject(self) -> int:
        return self._n_inject

    def elaborate(self, platform):
        m = Module()
        r, red, a2a = self.router, self.reduce, self.a2a
        m.submodules.router = r
        m.submodules.reduce = red
        m.submodules.a2a = a2a
        regs = self.regs
        flip = wiring.flipped

        # ---- streams ----------------------------------------------------------------------------
        for p in range(self._n_links):
            tx, rx = self.link_tx[p], self.link_rx[p]
            m.submodules[f"link_tx{p}"] = tx
            m.submodules[f"link_rx{p}"] = rx
            wiring.connect(m, flip(getattr(self, f"net_in{p}")), r.inputs()[p])
            wiring.connect(m, r.outputs()[p], tx.i)
            wiring.connect(m, tx.o, flip(getattr(self, f"mac_tx{p}")))
            wiring.connect(m, flip(getattr(self, f"mac_rx{p}")), rx.i)
            wiring.connect(m, rx.o, flip(getattr(self, f"link_rx{p}")))
        for j in range(self._n_inject):
            wiring.connect(m, flip(getattr(self, f"inject{j}")),
                           r.inputs()[self._n_links + j])
        # register slices where the node's arbiters meet the engines (docs/depth.md): each
        # engine's input decision starts from a register, and the node's local sink's ready
        # does not reach into the router's or the all-to-all's output logic
        slices = {name: RegisterSlice(self.reduce_in.payload.shape())
                  for name in ("deliver", "reduce_in", "a2a_in", "a2a_out")}
        for name, sl in slices.items():
            m.submodules[f"slice_{name}"] = sl
        wiring.connect(m, r.local, slices["deliver"].i)
        wiring.connect(m, slices["deliver"].o, flip(self.deliver))
        wiring.connect(m, flip(self.reduce_in), slices["reduce_in"].i)
        wiring.connect(m, slices["reduce_in"].o, red.i)
        wiring.connect(m, red.o, flip(self.reduce_out))
        wiring.connect(m, flip(self.a2a_scatter), a2a.scatter)
        wiring.connect(m, a2a.net, flip(self.a2a_net))
        wiring.connect(m, flip(self.a2a_in), slices["a2a_in"].i)
        wiring.connect(m, slices["a2a_in"].o, a2a.i)
        wiring.connect(m, a2a.o, slices["a2a_out"].i)
        wiring.connect(m, slices["a2a_out"].o, flip(self.a2a_out))

        # ---- control registers ------------------------------------------------------------------
        m.d.comb += [
            r.route_wr.addr.eq(regs.ROUTE_WR.route_id.value),
            r.route_wr.data.eq(regs.ROUTE_WR.entry.value),
            r.route_wr.en.eq(regs.ROUTE_WR.entry.stb),
            red.cfg_wr.addr.eq(regs.REDUCE_CFG_WR.route_id.value),
            red.cfg_wr.data.eq(regs.REDUCE_CFG_WR.config.value),
            red.cfg_wr.en.eq(regs.REDUCE_CFG_WR.config.stb),
            red.timeout.eq(regs.reduce_timeout.reduce_timeout),
            a2a.timeout.eq(regs.a2a_timeout.a2a_timeout),
            red.local_id.eq(regs.NODE.local_id),
            a2a.local_id.eq(regs.NODE.local_id),
            a2a.num_nodes.eq(regs.NODE.num_nodes),
        ]

        # ---- status registers: every field of every engine's status, by name -------------------
        self._drive_status(m, "nic_router", r.status)
        self._drive_status(m, "nic_reduce", red.status)
        self._drive_status(m, "nic_a2a", a2a.status)
        for p in range(self._n_links):
            self._drive_status(m, f"link{p}_tx", self.link_tx[p].status)
            self._drive_status(m, f"link{p}_rx", self.link_rx[p].status)
        return m

    def _drive_status(self, m, prefix, status):
        for name, _ in status.shape():
            reg = f"{prefix}_{name}"
            m.d.comb += getattr(getattr(self.regs, reg), reg).eq(status[name])


def nic_axis_names(n_links: int, n_inject: int) -> dict[str, str]:
    """FlatTop stream prefixes: ``s_axis_<name>`` for inputs, ``m_axis_<name>`` for outputs."""
    names = {}
    for p in range(n_links):
        names.update({f"net_in{p}": f"s_axis_net_in{p}", f"mac_tx{p}": f"m_axis_mac_tx{p}",
                      f"mac_rx{p}": f"s_axis_mac_rx{p}", f"link_rx{p}": f"m_axis_link_rx{p}"})
    for j in range(n_inject):
        names[f"inject{j}"] = f"s_axis_inject{j}"
    for name in ("deliver", "reduce_out", "a2a_net", "a2a_out"):
        names[name] = f"m_axis_{name}"
    for name in ("reduce_in", "a2a_scatter", "a2a_in"):
        names[name] = f"s_axis_{name}"
    return names


class NicCsrTop(wiring.Component):
    """:class:`NicTop` behind an AXI-Lite :class:`CsrBank` of :func:`nic_regmap`.

    Members: ``s_axi_ctrl`` (``Out(AxiLiteSignature.flip())`` — the bank's bus) and every
    stream member of the wrapped :class:`NicTop` under the same name (default: a NicTop with
    the ``sim`` configuration's reduction slots). Latency: the bank's and the engines'.
    """

    def __init__(self, nic: NicTop | None = None):
        self.nic = nic if nic is not None else NicTop(reduce_slots=SIM.reduce_slots)
        self.bank = CsrBank(nic_regmap(self.nic.n_links))
        members = {"s_axi_ctrl": Out(self.bank.s_axi_ctrl.signature)}
        for name, member in self.nic.signature.members.items():
            if name != "regs":
                members[name] = member
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        m.submodules.nic = nic = self.nic
        m.submodules.bank = bank = self.bank
        wiring.connect(m, wiring.flipped(self.s_axi_ctrl), bank.s_axi_ctrl)
        wiring.connect(m, bank.regs, nic.regs)
        for name, member in self.signature.members.items():
            if name == "s_axi_ctrl":
                continue
            if member.flow == In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(nic, name))
            else:
                wiring.connect(m, getattr(nic, name), wiring.flipped(getattr(self, name)))
        return m

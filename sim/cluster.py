"""N node tops cabled as a KR260 ring, in one simulation (docs/node.md §9, §13; issue #11 tests,
the cluster issue's single-process back end).

Each cable is two :class:`mcf.hdl.nic.link_model.LinkModel` (one per direction) between the
physical links :func:`mcf.abi.link_map.link_map_for` assigns: board ``a``'s "next" link to board
``a+1``'s "prev" link. A cable is SFP+ (10G) when it joins link 0 to link 0, else RGMII (1G); its
rate in bytes per ``aclk`` cycle and its latency in cycles follow the MARS link parameters at the
assumed clock (:data:`CLOCK_HZ`, no fmax claimed). A physical link no cable uses is left
unplugged: its TX frames are taken and lost, its RX is idle.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from fractions import Fraction

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.link_map import LINK_SFP, link_map_for
from mcf.abi.node_config import NODE_CONFIGS, SIM, NodeConfig
from mcf.abi.platform import ACLK_HZ
from mcf.hdl.flat import FlatInstance, FlatTop
from mcf.hdl.nic.link_model import LinkModel
from mcf.hdl.node.top import NodeTop
from mcf.mars.cluster import RGMII_1G, SFP_10G, LinkParams
from mcf.sim.wire import (
    MacRxBuffer,
    WindowTimer,
    WireCapture,
    WireDelay,
    WireReplay,
    lookahead,
    window_for,
    wire_entry,
)

__all__ = ["ClusterTop", "RankTop", "build_rank", "tx_params", "check_tx_params", "Cable",
           "ring_cables", "directed_links", "link_index",
           "build_cluster", "node_module", "CLOCK_HZ", "BENCH_LATENCY_CYCLES", "NODE_PORTS",
           "expose_node_ports", "HOST_KEYS", "simulated"]

CLOCK_HZ = ACLK_HZ
"""The ``aclk`` every cycle figure assumes (:data:`mcf.abi.platform.ACLK_HZ`, no fmax claimed)."""

BENCH_LATENCY_CYCLES = 64
"""Link latency of the benches' and ``mcf run``'s ring, in cycles (213 ns at :data:`CLOCK_HZ`;
the MARS link latency, 2 µs, would be 600): one Verilator build per ring size serves them all.
The link *rates* are the cables' own."""

HOST_KEYS = ("wall_seconds", "node_cycles_per_second", "mpi_ranks")
"""The only keys of a run's record (``mcf.sim.benches.cluster_run``) in which one simulation and
one simulation per MPI rank may differ: the host's wall time and the number of ranks."""


def simulated(record: dict) -> dict:
    """``record`` without :data:`HOST_KEYS`: what must be the same however the run was split."""
    return {k: v for k, v in record.items() if k not in HOST_KEYS}


@dataclass(frozen=True)
class Cable:
    """A full-duplex cable: ``(node, link)`` ↔ ``(node, link)``."""
    a: tuple[int, int]
    b: tuple[int, int]

    @property
    def params(self) -> LinkParams:
        return SFP_10G if self.a[1] == LINK_SFP and self.b[1] == LINK_SFP else RGMII_1G


def ring_cables(n: int) -> list[Cable]:
    """The KR260 ring of ``n`` boards (``n`` = 2: two cables between the same pair)."""
    if n < 2:
        return []
    maps = [link_map_for(v, n, "ring") for v in range(n)]
    cables = []
    for a in range(n if n > 2 else 2):
        src, dst = (a, (a + 1) % n) if n > 2 else ((0, 1) if a == 0 else (1, 0))
        cables.append(Cable((src, maps[src][0]), (dst, maps[dst][1])))
    return cables


def directed_links(n: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """``(source (node, link), destination (node, link))`` of each link model of the ring of
    ``n``, in :class:`ClusterTop`'s order (``link{k}_inject`` is entry ``k``)."""
    return [d for c in ring_cables(n) for d in ((c.a, c.b), (c.b, c.a))]


def link_index(n: int, node: int, link: int) -> int:
    """The link model ``k`` that carries what ``node`` transmits on its physical ``link``."""
    for k, (src, _) in enumerate(directed_links(n)):
        if src == (node, link):
            return k
    raise ValueError(f"node {node} link {link} is not cabled in the ring of {n}")


def link_rate(params: LinkParams, clock_hz: float = CLOCK_HZ) -> tuple[int, int]:
    """Bytes per cycle as ``(num, den)``."""
    r = Fraction(params.rate_bps / 8 / clock_hz).limit_denominator(64)
    return r.numerator, r.denominator


NODE_PORTS = ("s_axi_ctrl", "m_axi_hp", "irq")
"""The node ports a cluster top exposes per node ``i`` as ``n{i}_<name>``."""


def expose_node_ports(m: Module, top: wiring.Component, nodes) -> None:
    """Add ``nodes`` to ``m`` as ``node{i}`` and connect each node's :data:`NODE_PORTS` to the
    cluster top's ``n{i}_<name>`` members."""
    for i, node in enumerate(nodes):
        m.submodules[f"node{i}"] = node
        for name, member in node.signature.members.items():
            if not name.startswith(NODE_PORTS):
                continue
            outer = getattr(top, f"n{i}_{name}")
            if name == "irq":
                m.d.comb += outer.eq(node.irq)
            elif member.flow == In:
                wiring.connect(m, wiring.flipped(outer), getattr(node, name))
            else:
                wiring.connect(m, getattr(node, name), wiring.flipped(outer))


def tx_params(link: int) -> LinkParams:
    """The cable a node's physical ``link`` transmits on: SFP+ for the SFP cage, else RGMII.
    (:func:`ring_cables` joins the SFP cage only to an SFP cage; :func:`check_tx_params`.)"""
    return SFP_10G if link == LINK_SFP else RGMII_1G


def check_tx_params(n: int) -> None:
    """Every cable of the ring of ``n`` is what :func:`tx_params` says of its sending link (so
    one :class:`RankTop` build serves every node)."""
    for c in ring_cables(n):
        for src, _ in ((c.a, c.b), (c.b, c.a)):
            if tx_params(src[1]) != c.params:
                raise ValueError(f"ring of {n}: node {src[0]} link {src[1]} sends on "
                                 f"{c.params}, not {tx_params(src[1])}")


def _sender(lat: int, params: LinkParams, window: int, clock_hz: float) -> LinkModel:
    """The sender's part of a cable direction: the link model less the wire's lookahead."""
    return LinkModel(latency=lat - lookahead(window), rate=link_rate(params, clock_hz),
                     depth=lat + 64)


class ClusterTop(wiring.Component):
    """``n`` :class:`NodeTop` (configuration ``config``) and the ring's cables, in one
    simulation.

    Members: per node ``i`` its ``s_axi_ctrl``, ``m_axi_hp{p}`` and ``irq`` as ``n{i}_<name>``
    (so :class:`mcf.hdl.flat.FlatTop` yields ``n0_s_axi_ctrl_awaddr`` …); per cable direction
    ``k`` (:attr:`links`, :func:`directed_links`' order) ``link{k}_inject``: a one-cycle pulse
    flips one bit of the next frame on that link (:class:`LinkModel`'s ``inject``: a link
    fault at a moment the bench chooses, which the receiver's CRC check must catch) and
    ``link{k}_dropped``: frames the receiver's MAC buffer had no room for; ``win`` and
    ``cycles``: :class:`~mcf.sim.wire.WindowTimer`'s. A cable direction is
    :class:`LinkModel` → :class:`~mcf.sim.wire.WireDelay` (the lookahead) →
    :class:`~mcf.sim.wire.MacRxBuffer` (:mod:`mcf.sim.wire`): the receiver never stalls the
    wire, so :class:`RankTop` splits it across simulations with the same cycles. Link latency
    in cycles is ``latency_cycles`` when given (benches shorten it), else the MARS link latency
    at :data:`CLOCK_HZ`. A link no cable uses transmits into a link model whose output is lost
    (as :class:`RankTop`'s do), its RX is idle."""

    def __init__(self, n: int, config: NodeConfig = SIM, *, latency_cycles: int | None = None,
                 clock_hz: float = CLOCK_HZ, node_module: str | None = None,
                 node_signature: wiring.Signature | None = None):
        self.n, self.config, self.clock_hz = n, config, clock_hz
        if node_module is None:
            self.nodes = [NodeTop(config) for _ in range(n)]
        else:
            self.nodes = [FlatInstance(node_signature, node_module) for _ in range(n)]
        self.cables = ring_cables(n)
        lats = [latency_cycles if latency_cycles is not None
                else round(c.params.latency_s * clock_hz) for c in self.cables]
        self._latency = min(lats, default=latency_cycles or BENCH_LATENCY_CYCLES)
        self.window = window_for(self._latency)
        self.links = []
        for c, lat in zip(self.cables, lats, strict=True):
            for src, dst in ((c.a, c.b), (c.b, c.a)):
                self.links.append((src, dst, _sender(lat, c.params, self.window, clock_hz)))
        members = {}
        for i, node in enumerate(self.nodes):
            for name, member in node.signature.members.items():
                if name.startswith(NODE_PORTS):
                    members[f"n{i}_{name}"] = member
        for k in range(len(self.links)):
            members[f"link{k}_inject"] = In(1)
            members[f"link{k}_dropped"] = Out(32)
        members.update(win=Out(1), cycles=Out(64))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        used_tx, used_rx = set(), set()
        expose_node_ports(m, self, self.nodes)
        m.submodules.timer = timer = WindowTimer(self.window)
        m.d.comb += [self.win.eq(timer.win), self.cycles.eq(timer.cycles)]
        assert [(s, d) for s, d, _ in self.links] == directed_links(self.n)
        for k, ((sn, sl), (dn, dl), model) in enumerate(self.links):
            name = f"link{k}_{sn}_{sl}_to_{dn}_{dl}"
            m.submodules[name] = model
            m.submodules[f"{name}_wire"] = wire = WireDelay(lookahead(self.window))
            m.submodules[f"{name}_rx"] = rx = MacRxBuffer()
            wiring.connect(m, getattr(self.nodes[sn], f"m_axis_link{sl}"), model.i)
            wiring.connect(m, model.o, wire.i)
            wiring.connect(m, wire.o, rx.i)
            wiring.connect(m, rx.o, getattr(self.nodes[dn], f"s_axis_link{dl}"))
            m.d.comb += [model.inject.eq(getattr(self, f"link{k}_inject")),
                         getattr(self, f"link{k}_dropped").eq(rx.dropped)]
            used_tx.add((sn, sl))
            used_rx.add((dn, dl))
        for i, node in enumerate(self.nodes):
            for ln in range(self.config.links):
                if (i, ln) not in used_tx:
                    m.submodules[f"unplugged{i}_{ln}"] = lost = _sender(
                        self._latency, tx_params(ln), self.window, self.clock_hz)
                    wiring.connect(m, getattr(node, f"m_axis_link{ln}"), lost.i)
                    m.d.comb += lost.o.ready.eq(1)
                if (i, ln) not in used_rx:
                    m.d.comb += getattr(node, f"s_axis_link{ln}").valid.eq(0)
        return m


class RankTop(wiring.Component):
    """One node of a ring as its own simulation (one MPI rank; issue #14 item 3): a
    :class:`NodeTop` and, per physical link ``l``, the sending half of its cable —
    :class:`LinkModel` (:func:`tx_params`) → :class:`~mcf.sim.wire.WireCapture` — and the
    receiving half — :class:`~mcf.sim.wire.WireReplay` → :class:`~mcf.sim.wire.MacRxBuffer`.
    One build serves every node of every ring :func:`check_tx_params` accepts.

    Members: the node's ``s_axi_ctrl``, ``m_axi_hp{p}`` and ``irq`` as ``n0_<name>`` (whatever
    node it is); per link ``l``: ``link{l}_tx_window`` (``Out``) and ``link{l}_rx_window``
    (``In``), the wire's windows (:mod:`mcf.sim.wire`), ``link{l}_inject`` (``In(1)``, as
    :class:`ClusterTop`'s) and ``link{l}_dropped`` (``Out(32)``); ``win`` and ``cycles``."""

    def __init__(self, config: NodeConfig = SIM, *, latency_cycles: int = BENCH_LATENCY_CYCLES,
                 clock_hz: float = CLOCK_HZ, node_module: str | None = None,
                 node_signature: wiring.Signature | None = None):
        self.config, self.latency, self.clock_hz = config, latency_cycles, clock_hz
        self.node = NodeTop(config) if node_module is None else \
            FlatInstance(node_signature, node_module)
        self.window = window_for(latency_cycles)
        size = self.window * wire_entry().size
        members = {f"n0_{name}": member for name, member in self.node.signature.members.items()
                   if name.startswith(NODE_PORTS)}
        for ln in range(config.links):
            members.update({f"link{ln}_tx_window": Out(size), f"link{ln}_rx_window": In(size),
                            f"link{ln}_inject": In(1), f"link{ln}_dropped": Out(32)})
        members.update(win=Out(1), cycles=Out(64))
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        expose_node_ports(m, self, [self.node])
        m.submodules.timer = timer = WindowTimer(self.window)
        m.d.comb += [self.win.eq(timer.win), self.cycles.eq(timer.cycles)]
        for ln in range(self.config.links):
            m.submodules[f"link{ln}_tx"] = model = _sender(
                self.latency, tx_params(ln), self.window, self.clock_hz)
            m.submodules[f"link{ln}_capture"] = cap = WireCapture(self.window)
            m.submodules[f"link{ln}_replay"] = rep = WireReplay(self.window)
            m.submodules[f"link{ln}_rx"] = rx = MacRxBuffer()
            wiring.connect(m, getattr(self.node, f"m_axis_link{ln}"), model.i)
            wiring.connect(m, model.o, cap.i)
            wiring.connect(m, rep.o, rx.i)
            wiring.connect(m, rx.o, getattr(self.node, f"s_axis_link{ln}"))
            m.d.comb += [cap.tick.eq(timer.tick), rep.tick.eq(timer.tick),
                         getattr(self, f"link{ln}_tx_window").eq(cap.window),
                         rep.window.eq(getattr(self, f"link{ln}_rx_window")),
                         model.inject.eq(getattr(self, f"link{ln}_inject")),
                         getattr(self, f"link{ln}_dropped").eq(rx.dropped)]
        return m


def node_module(config: NodeConfig = SIM) -> tuple[str, str, wiring.Signature]:
    """The node top of ``config`` as its own Verilog module, which the cluster and rank builds
    instantiate and Verilator keeps (``no_inline``): ``(module name, Verilog, its ports)``.
    Verilator then compiles one node whatever the ring size, and the node's conversion is
    shared: for the ``sim`` configuration the module is ``mcf verilog``'s own ``mcf_node_sim``
    (the same design, :data:`mcf.hdl.tops.TOPS`; its cache entry, which the install step
    writes); for another, ``cluster_node_<name>``.

    Against the two nodes inlined in the cluster's own module (measured 2026-12-08, builds
    alone): the two-node and rank builds convert no node of their own (the two-node one was
    100 s of conversion, the rank's 45 s), Verilator's pass on the pair takes 49 s instead of
    85 s; the C++ is a little larger (44 MB instead of 40: the compile, ~175 s, is the same),
    the simulation as fast (the node bench's small layer run 43 s, was 46 s)."""
    from mcf.hdl.convert import verilog_text

    if config == SIM:
        from mcf.commands.verilog import top_description
        from mcf.hdl.tops import TOPS

        name = "mcf_node_sim"
        return name, verilog_text(name, TOPS[name], top_description(name)), _ports(config)
    name = f"cluster_node_{config.name}"
    return name, verilog_text(name, lambda: FlatTop(NodeTop(config), clock="aclk",
                                                    resetn="aresetn"),
                              f"NodeTop({config!r})"), _ports(config)


@functools.cache
def _ports(config: NodeConfig) -> wiring.Signature:
    """:class:`NodeTop`'s signature (a node built for its ports only, never elaborated: its
    unused-elaboratable warnings are silenced)."""
    node = NodeTop(config)
    for obj in (node, node.bank):
        obj._MustUse__silence = True
    return node.signature


def _suffix(latency_cycles: int, config: NodeConfig) -> str:
    """A build name's suffix: none for the benches' latency and ``sim`` configuration."""
    return "" if (latency_cycles, config) == (BENCH_LATENCY_CYCLES, SIM) else \
        f"_{config.name}_l{latency_cycles}"


def _kept(module: str, text: str) -> dict[str, str]:
    """The extra sources of a build that instantiates the node module ``module``."""
    keep = f'`verilator_config\nno_inline -module "{module}"\n'   # else Verilator inlines it
    return {f"{module}.v": text, f"{module}.vlt": keep}


@functools.cache
def build_cluster(n: int, latency_cycles: int = BENCH_LATENCY_CYCLES, config: NodeConfig = SIM):
    """The Verilator build of ``n`` node tops in a ring (cached in ``build/sim``: one per ring
    size, latency and configuration, shared by the tests, the benches and ``mcf run``; and per
    process): :func:`node_module` instantiated ``n`` times."""
    from mcf.sim.toolchain import build

    suffix = _suffix(latency_cycles, config)
    name = f"node_cluster{n}{suffix}"
    module, text, signature = node_module(config)
    top = FlatTop(ClusterTop(n, config, latency_cycles=latency_cycles, node_module=module,
                             node_signature=signature), clock="aclk", resetn="aresetn")
    return build(top, name, sources=_kept(module, text),
                 describe=f"ClusterTop({n}, {config!r}, latency_cycles={latency_cycles}), "
                          f"node module {module}")


@functools.cache
def simulated_config(name: str) -> NodeConfig:
    """The node configuration ``name`` as Verilator builds it: the GEMM's ``DSP48E2``
    primitives (``gemm_dsp="primitive"``, kr260) as the slice model in logic (``"model"``: the
    same cycles and bits; Verilator has no ``DSP48E2``)."""
    config = NODE_CONFIGS[name]
    return replace(config, gemm_dsp="model") if config.gemm_dsp == "primitive" else config


def build_rank(latency_cycles: int = BENCH_LATENCY_CYCLES, config: NodeConfig = SIM):
    """The Verilator build of :class:`RankTop` (cached in ``build/sim`` as ``node_rank``, the
    node as :func:`node_module`): every MPI rank of every ring size runs it."""
    from mcf.sim.toolchain import build

    suffix = _suffix(latency_cycles, config)
    module, text, signature = node_module(config)
    top = FlatTop(RankTop(config, latency_cycles=latency_cycles, node_module=module,
                          node_signature=signature), clock="aclk", resetn="aresetn")
    return build(top, f"node_rank{suffix}", sources=_kept(module, text),
                 describe=f"RankTop({config!r}, latency_cycles={latency_cycles}), "
                          f"node module {module}")

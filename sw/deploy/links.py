"""``mcf deploy --check-links``: every cable of the ring checked on the loaded nodes (issue #36
item 3; docs/deploy.md "Check the links").

What is checked, per board, after the overlay is loaded:

1. **Status registers.** The node's link counters (``link<p>_tx_frames``, ``link<p>_rx_*`` of
   :func:`mcf.abi.csrmap.node_regmap`, per router port ``p``) and, when the overlay has the MAC
   wrapper (``ol.eth``, :class:`mcf.driver.EthDriver`), every physical link's status
   (``ETH_LINK`` up, SFP+ block lock and BER, RGMII receive clock, FCS errors and drops). With
   the MAC wrapper the two RGMII PHYs are set up first (:meth:`mcf.driver.EthDriver.phy_setup`
   over MDIO, after the MACs are configured): what each PHY read back goes into the result and
   the RGMII cables' lines; a PHY that does not answer, is not a DP83867 or does not keep its
   delays ends that board's check with the driver's one line.
2. **A ping over every cable, both ways: the ring's round in each direction.** Each node sends
   one header-only ``Op.FETCH_REQUEST`` packet to each neighbour (two ``SEND`` records of 16
   bytes, no payload, no DDR read, then a ``MARK``): its parser hands a point-to-point packet for
   another node to the router, whose entry for the packet's ``route_id`` (:func:`ping_routes`:
   route ``v`` = port NEXT, route ``N + v`` = port PREV at node ``v``) puts it on the link; at
   the neighbour the parser sees ``dst`` = its own id and delivers it to the local sink, which
   consumes it and counts it in ``lsink_fetch_requests``. That is the cheapest packet the node
   already has that crosses a link and is counted at the receiver: no payload, no route at the
   receiver, no directory, KV or decode-buffer set-up, no side effect (MARS plans the holder's
   answer to a FETCH_REQUEST as its own record). The 2N pings are the ring walked once in each
   direction, one hop at a time, so a lost frame names its cable.

   Why not one token relayed round the ring: a relay needs the receiver to *wait* on what it
   received, and the counters a ``WAIT`` tests count ``CONTROL`` packets — which never leave
   their node (the parser's first dispatch rule sends every ``Op.CONTROL`` packet to the local
   control sink, ``mcf.abi.meta.DISPATCH_RULES``) — or landed decode payloads, which need the
   decode buffers of a run configured.

The verdict (:func:`cable_verdicts`) is one line per cable: both directions' frames sent and
received (the counters' deltas), receive errors, and the MACs' view; :func:`missing` names the
nodes that did not count both pings.

The node-side part (:class:`NodePing`) runs wherever a host reaches a node through the PYNQ
driver: on a board inside :func:`board_session` (started over SSH by
:func:`mcf.deploy.ssh.check_links`), on simulated KR260s in ``tests/test_deploy_links.py``. It
needs a freshly loaded node (``lsink_control`` 0: a PL reset clears it).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

from ..abi.link_map import LINK_SFP, link_map_for
from ..abi.meta import Collective, Meta, Op
from ..abi.node import Cmd, PayloadSource, Queue, RecordClass
from ..abi.route import RingPort, route_entry

__all__ = ["RING_LOG2", "BUFFER_BYTES", "PINGS_PER_NODE", "ping_routes", "ping_records",
           "ring_hops", "NodePing", "NodeResult", "CableVerdict", "cable_verdicts", "missing",
           "board_session", "LINK_PROBE", "READY", "STARTED", "DONE", "FAILED", "link_name"]

RING_LOG2 = 2
"""The NET ring of the check: 4 entries (three records)."""
BUFFER_BYTES = 4096
"""The host buffer that holds the ring (one page)."""
READY, STARTED, DONE, FAILED = ("MCF-LINKS-READY ", "MCF-LINKS-STARTED", "MCF-LINKS-DONE ",
                                "MCF-LINKS-FAILED ")
"""Line prefixes of :func:`board_session`'s output (``STARTED``: the pings are out; the
launcher sends the next board its ``GO`` only then)."""


def link_name(link: int) -> str:
    return "SFP+" if link == LINK_SFP else "RGMII"


def ping_routes(node: int, n: int) -> list[tuple[int, int, int]]:
    """``(node, route_id, entry)`` of node ``node``'s two pings: route ``node`` leaves on router
    port NEXT, route ``n + node`` on PREV. The receiver needs none (a packet for its own id is
    delivered locally by its parser)."""
    if n < 2:
        raise ValueError(f"a ring needs at least 2 nodes, not {n}")
    return [(node, node, route_entry({RingPort.NEXT})),
            (node, n + node, route_entry({RingPort.PREV}))]


def ping_records(node: int, n: int) -> list[Cmd]:
    """The NET ring of node ``node``: a ping to the next node, one to the previous, a MARK."""
    def send(dst: int, route: int) -> Cmd:
        meta = Meta(op=Op.FETCH_REQUEST, collective=Collective.P2P, src=node, dst=dst,
                    route_id=route, length=0)
        return Cmd(RecordClass.SEND, Queue.NET, meta=meta.pack(), src=PayloadSource.HDR)

    return [send((node + 1) % n, node), send((node - 1) % n, n + node),
            Cmd(RecordClass.MARK, Queue.NET)]


PINGS_PER_NODE = 2
"""Pings each node counts: one from each neighbour (both from the other node when N = 2)."""


def ring_hops(n: int) -> list[tuple[str, int, int]]:
    """The pings: ``(direction, from node, to node)``."""
    return ([("next", v, (v + 1) % n) for v in range(n)]
            + [("prev", v, (v - 1) % n) for v in range(n)])


def _counter_names(regmap) -> list[str]:
    return [reg.name for _, reg in regmap
            if reg.name.startswith("link") and reg.name[4:5].isdigit()]


@dataclass
class NodeResult:
    """What one node's host read: the link map (router port → physical link), the link
    counters before and after the pings, the pings it counted (``lsink_fetch_requests``) and
    its MARKs retired, the MACs' status per physical link (``None``: no MAC wrapper in the
    overlay), the RGMII PHYs' set-up (``phys``: one :class:`mcf.driver.eth.PhySetup` as a dict
    per PHY, what it read back; ``None`` without the MAC wrapper), and ``error`` if the host
    failed (a node not freshly loaded, a PHY refused, a timeout)."""
    node: int
    links: tuple[int, ...]
    before: dict[str, int] = field(default_factory=dict)
    after: dict[str, int] = field(default_factory=dict)
    pings: int = 0
    marks: int = 0
    eth: list[dict] | None = None
    phys: list[dict] | None = None
    error: str = ""
    state: dict[str, int] = field(default_factory=dict)
    """The NET queue's ring and sequencer registers, the local sink's and parsers' counters
    that are not zero after the pings (what to read when a ping was lost)."""

    def delta(self, name: str) -> int:
        return (self.after.get(name, 0) - self.before.get(name, 0)) % (1 << 32)

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> NodeResult:
        d = json.loads(text)
        d["links"] = tuple(d["links"])
        return cls(**d)


class NodePing:
    """Node ``node`` of a ring of ``n`` for the check, through ``driver`` (a
    :class:`mcf.driver.NodeDriver`: ``read_reg``, ``write_reg``, ``write_fields``, ``regmap``,
    ``clock``) with ``buffer`` (a ``pynq.allocate`` buffer of at least :data:`BUFFER_BYTES`)
    for its NET ring, and ``eth`` (an :class:`mcf.driver.EthDriver`, or None)."""

    def __init__(self, driver, node: int, n: int, buffer, eth=None, *, topology: str = "ring"):
        if not 0 <= node < n:
            raise ValueError(f"node {node} outside 0..{n - 1}")
        self.driver, self.node, self.n, self.buffer, self.eth = driver, node, n, buffer, eth
        self.links = tuple(link_map_for(node, n, topology))
        self.names = _counter_names(driver.regmap)
        self.result = NodeResult(node, self.links)

    def _counters(self) -> dict[str, int]:
        return {name: self.driver.read_reg(name) for name in self.names}

    def _eth(self) -> list[dict] | None:
        if self.eth is None:
            return None
        from dataclasses import asdict
        return [asdict(s) for s in self.eth.link_status()]

    def prepare(self, ready_timeout: float = 1e-3) -> NodeResult:
        """Check the node is fresh; with the MAC wrapper, configure the MACs and set up the
        RGMII PHYs (:meth:`mcf.driver.EthDriver.phy_setup`; its
        :class:`~mcf.driver.eth.PhySetupError` propagates: the board's check ends with its
        line); write identity, link map, the hop routes and the NET ring's place
        (``CMD0_BASE``/``CMD0_SIZE``), start the NET queue, read the counters."""
        from ..driver.node_map import CommandRing
        drv = self.driver
        if drv.read_reg("lsink_fetch_requests"):
            raise RuntimeError(f"node {self.node}: lsink_fetch_requests is "
                               f"{drv.read_reg('lsink_fetch_requests')}, not 0: load the overlay "
                               "again (a PL reset) before the check")
        drv.wait_counter("DIR_READY", 1, timeout=ready_timeout)
        if self.eth is not None:
            from dataclasses import asdict
            self.eth.configure(self.node, self.n)
            self.result.phys = [asdict(p) for p in self.eth.phy_setup()]
        drv.write_fields("NODE", local_id=self.node, num_nodes=self.n)
        drv.write_fields("LINK_MAP", **{f"port{p}_link": ln for p, ln in enumerate(self.links)})
        for _, rid, entry in ping_routes(self.node, self.n):
            drv.write_fields("ROUTE_WR", route_id=rid, entry=entry)
        base = int(self.buffer.device_address)
        drv.write_fields("CMD0_BASE_LO", CMD0_BASE_LO=base & 0xFFFF_FFFF)
        drv.write_fields("CMD0_BASE_HI", CMD0_BASE_HI=base >> 32)
        drv.write_fields("CMD0_SIZE", CMD0_SIZE=RING_LOG2)
        self.ring = CommandRing(Queue.NET, 0, RING_LOG2, drv.read_reg("CMD0_HEAD"))
        drv.write_fields("SEQ0_CTRL", run=1)
        self.marks0 = drv.read_reg("seq0_marks")
        self.result.before = self._counters()
        self.result.eth = self._eth()
        return self.result

    def start(self) -> None:
        """The three records into the ring, then the doorbell (``CMD0_PROD``)."""
        mem = memoryview(self.buffer).cast("B")
        self.ring.put(mem, ping_records(self.node, self.n), self.driver.read_reg("CMD0_CONS"))
        flush = getattr(self.buffer, "flush", None)
        if flush is not None:
            flush()
        self.driver.write_fields("CMD0_PROD", CMD0_PROD=self.ring.prod)

    def done(self) -> bool:
        """Both pings sent (the MARK retired) and both neighbours' pings counted."""
        return (self.driver.read_reg("seq0_marks") > self.marks0
                and self.driver.read_reg("lsink_fetch_requests") >= PINGS_PER_NODE)

    def finish(self) -> NodeResult:
        """The counters, ``lsink_fetch_requests`` and ``seq0_marks`` now (done or not)."""
        self.result.after = self._counters()
        self.result.pings = self.driver.read_reg("lsink_fetch_requests")
        self.result.marks = self.driver.read_reg("seq0_marks") - self.marks0
        names = [reg.name for _, reg in self.driver.regmap
                 if reg.name.startswith(("CMD0_", "cmd0_", "seq0_", "lsink_", "parser"))
                 and reg.name.split("_")[-1] not in ("PROD", "LO", "HI", "SIZE")]
        state = {name: self.driver.read_reg(name) for name in names + ["IRQ_STATUS"]}
        self.result.state = {k: v for k, v in state.items() if v}
        eth = self._eth()
        if eth is not None:
            self.result.eth = eth
        return self.result

    def wait(self, timeout: float, poll: float = 1e-5) -> NodeResult:
        """Poll :meth:`done` for ``timeout`` seconds of the driver's clock, then
        :meth:`finish`."""
        clock = self.driver.clock
        deadline = clock.now() + timeout
        while not self.done() and clock.now() < deadline:
            clock.sleep(poll)
        return self.finish()


@dataclass(frozen=True)
class CableVerdict:
    """One cable of the ring: ``a`` = (node, physical link) whose NEXT port it is, ``b`` = the
    other end (its PREV port); ``ok`` and the one line :meth:`line` prints."""
    a: tuple[int, int]
    b: tuple[int, int]
    ok: bool
    detail: str

    def line(self) -> str:
        (na, la), (nb, lb) = self.a, self.b
        return (f"node {na} link {la} ({link_name(la)}) <-> node {nb} link {lb} "
                f"({link_name(lb)}): {'ok' if self.ok else 'FAILED'} — {self.detail}")


_RX_ERRORS = ("crc_errors", "drop_bad_header", "drop_oversize", "drop_stale", "seq_gaps",
              "lost_frames")


def _direction(src: NodeResult, dst: NodeResult, sport: int, dport: int) -> tuple[bool, str]:
    sent = src.delta(f"link{sport}_tx_frames")
    got = dst.delta(f"link{dport}_rx_frames_ok")
    errs = {e: dst.delta(f"link{dport}_rx_{e}") for e in _RX_ERRORS}
    errs = {k: v for k, v in errs.items() if v}
    ok = sent >= 1 and got >= 1 and not errs
    text = f"{src.node}→{dst.node} sent {sent} received {got}"
    if errs:
        text += " (" + ", ".join(f"{k} {v}" for k, v in errs.items()) + ")"
    return ok, text


def _phy(r: NodeResult, link: int) -> tuple[bool, str]:
    """What node ``r``'s PHY set-up says of RGMII link ``link``: not ok when no set-up is
    recorded for the link or its delays read back are not :data:`mcf.abi.mdio.RGMII_TX_DELAY_NS`
    / ``RGMII_RX_DELAY_NS``; the text names the PHY's MDIO address and the delays. ``(True,
    "")`` for the SFP+ link or without PHY results."""
    from ..abi.eth import ETH_LINK_RGMII
    from ..abi.mdio import RGMII_DELAY_MODE, RGMII_RX_DELAY_NS, RGMII_TX_DELAY_NS
    if r.phys is None or link not in ETH_LINK_RGMII:
        return True, ""
    p = next((x for x in r.phys if x["link"] == link), None)
    if p is None:
        return False, ", PHY not set up"
    got = (p["tx_delay_ns"], p["rx_delay_ns"])
    text = f", PHY {p['phy']} {RGMII_DELAY_MODE} tx {got[0]:g} ns rx {got[1]:g} ns"
    if got != (RGMII_TX_DELAY_NS, RGMII_RX_DELAY_NS):
        return False, (f"{text} (not {RGMII_TX_DELAY_NS:g}/{RGMII_RX_DELAY_NS:g})")
    return True, text


def _mac(r: NodeResult, link: int, peer: int) -> tuple[bool, str]:
    """The MAC's view of ``link`` at node ``r``, whose cable leads to node ``peer``, and the
    link's PHY set-up (:func:`_phy`) (``(True, "")`` without a MAC wrapper)."""
    if r.eth is None:
        return True, ""
    s = next(x for x in r.eth if x["link"] == link)
    bad = []
    if not s["link_up"]:
        bad.append("down")
    if s["peer_id"] != peer:
        bad.append(f"peer_id {s['peer_id']} (not {peer})")
    for name in ("fcs_errors", "drops", "foreign_drops", "tx_underruns"):
        if s.get(name):
            bad.append(f"{name} {s[name]}")
    if s.get("hi_ber"):
        bad.append("hi_ber")
    if s.get("block_lock") == 0:
        bad.append("no block lock")
    extra = ""
    if s.get("rx_clk_hz") is not None:
        extra = f", rx_clk {s['rx_clk_hz'] / 1e6:.1f} MHz"
    phy_ok, phy = _phy(r, link)
    return not bad and phy_ok, f"node {r.node} MAC {', '.join(bad) or 'up'}{extra}{phy}"


def cable_verdicts(results: list[NodeResult]) -> list[CableVerdict]:
    """One verdict per cable of the ring of ``len(results)`` nodes (``results`` by node)."""
    n = len(results)
    out = []
    for v in range(n if n > 2 else 2):
        a, b = (v, (v + 1) % n) if n > 2 else ((0, 1) if v == 0 else (1, 0))
        ra, rb = results[a], results[b]
        la, lb = ra.links[RingPort.NEXT], rb.links[RingPort.PREV]
        ok1, fwd = _direction(ra, rb, RingPort.NEXT, RingPort.PREV)
        ok2, back = _direction(rb, ra, RingPort.PREV, RingPort.NEXT)
        ok3, mac_a = _mac(ra, la, b)
        ok4, mac_b = _mac(rb, lb, a)
        detail = "; ".join(t for t in (fwd, back, mac_a, mac_b) if t)
        for r in (ra, rb):
            if r.error:
                detail += f"; node {r.node}: {r.error}"
        out.append(CableVerdict((a, la), (b, lb), ok1 and ok2 and ok3 and ok4
                                and not ra.error and not rb.error, detail))
    return out


def missing(results: list[NodeResult]) -> str | None:
    """The nodes that did not count both pings (or retire their MARK), as one phrase; None
    when every node did."""
    short = [f"node {r.node} counted {r.pings} of {PINGS_PER_NODE} pings"
             + ("" if r.marks >= 1 else ", its pings not all sent")
             for r in results if r.pings < PINGS_PER_NODE or r.marks < 1]
    return "; ".join(short) or None


def board_session(bit: str, node: int, n: int, timeout: float, *, stdin=None,
                  stdout=None) -> int:
    """The board side of :func:`mcf.deploy.ssh.check_links`, run as ``python3 -c`` on a board
    over SSH: load the overlay (a fresh PL), :meth:`NodePing.prepare`, print
    ``MCF-LINKS-READY <json>``, wait for the line ``GO`` on stdin, start, print
    ``MCF-LINKS-STARTED``, wait up to ``timeout`` seconds, print ``MCF-LINKS-DONE <json>``
    (a :class:`NodeResult`). Any failure prints ``MCF-LINKS-FAILED <message>`` and returns 1."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout

    def say(prefix: str, text: str) -> None:
        stdout.write(prefix + text + "\n")
        stdout.flush()

    try:
        import numpy as np
        from pynq import Overlay, allocate

        import mcf.driver  # noqa: F401 - registers NodeDriver and EthDriver with PYNQ
        ol = Overlay(bit)
        drv = getattr(ol, "node", None)
        if drv is None or not hasattr(drv, "regmap"):
            raise RuntimeError("the overlay has no MCF node (ol.node)")
        eth = getattr(ol, "eth", None) if "eth" in ol.ip_dict else None
        buf = allocate((BUFFER_BYTES,), dtype=np.uint8)
        ping = NodePing(drv, node, n, buf, eth)
        say(READY, ping.prepare().to_json())
        line = stdin.readline().strip()
        if line != "GO":
            raise RuntimeError(f"expected GO from the launcher, got {line!r}")
        ping.start()
        say(STARTED, "")
        say(DONE, ping.wait(timeout).to_json())
        return 0
    except Exception as exc:  # noqa: BLE001 - one line for the launcher
        say(FAILED, f"{type(exc).__name__}: {exc}".splitlines()[0])
        return 1


LINK_PROBE = """\
import sys
from mcf.deploy.links import board_session
sys.exit(board_session(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
"""
"""The snippet each board runs: ``python3 -c LINK_PROBE <remote .bit> <node> <n> <timeout>``."""

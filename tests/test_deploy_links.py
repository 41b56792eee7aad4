"""``mcf deploy --check-links`` (issue #36 item 3, :mod:`mcf.deploy.links`): the ping records
and routes, the per-cable verdicts, and the check itself on two simulated KR260s in the ring
(``node_cluster2``, the build ``tests/test_node_cluster.py`` shares): every cable passes both
ways, and a cable that corrupts a frame is named with the receiver's CRC error. The board side's
PHY set-up (the simulated KR260 has no ``mcf_eth``): :func:`board_session` with the node's
register bank as the golden CSR model and an ``eth`` whose ``phy_setup`` returns or raises."""


from __future__ import annotations

import io
import json
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from mcf.abi.meta import Collective, Meta, Op, Port, dispatch_port
from mcf.abi.node import PayloadSource, Queue, RecordClass
from mcf.abi.route import RingPort, route_entry
from mcf.deploy.links import (
    DONE,
    FAILED,
    READY,
    NodeResult,
    board_session,
    cable_verdicts,
    missing,
    ping_records,
    ping_routes,
    ring_hops,
)

# ---- the records, routes and verdicts (no simulation) -------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_each_ping_leaves_on_the_port_of_its_neighbour(n):
    """A node's two route entries put its pings on the ports that lead to the neighbours the
    pings are addressed to; every direction of every cable carries one ping."""
    table = {v: {rid: e for _, rid, e in ping_routes(v, n)} for v in range(n)}
    hops = set()
    for v in range(n):
        sends = [Meta.unpack(r.meta) for r in ping_records(v, n)
                 if r.cls is RecordClass.SEND]
        for meta in sends:
            entry = table[v][meta.route_id]
            port = RingPort.NEXT if entry == route_entry({RingPort.NEXT}) else RingPort.PREV
            assert entry == route_entry({port})                 # one port, no local copy
            assert meta.dst == ((v + 1) % n if port is RingPort.NEXT else (v - 1) % n)
            hops.add(("next" if port is RingPort.NEXT else "prev", v, meta.dst))
    assert hops == set(ring_hops(n)) and len(hops) == 2 * n


@pytest.mark.parametrize("n", [2, 4])
def test_records_are_two_header_only_pings_and_a_mark(n):
    for v in range(n):
        recs = ping_records(v, n)
        assert [r.queue for r in recs] == [Queue.NET] * 3
        assert [r.cls for r in recs] == [RecordClass.SEND, RecordClass.SEND, RecordClass.MARK]
        for r in recs[:2]:
            m = Meta.unpack(r.meta)
            assert r.src is PayloadSource.HDR and m.length == 0
            assert m.op is Op.FETCH_REQUEST and m.collective is Collective.P2P and m.src == v
            # not CONTROL: the parser keeps those at the node (its first dispatch rule)
            assert dispatch_port(m, v) is Port.FORWARD
            assert dispatch_port(m, m.dst) is Port.LOCAL


def _result(node, links, sent, got, errors=None, pings=2, marks=1):
    """A node's counters: ``sent``/``got`` frames per router port (NEXT, PREV)."""
    after = {}
    for p in range(3):
        after[f"link{p}_tx_frames"] = sent[p] if p < 2 else 0
        after[f"link{p}_rx_frames_ok"] = got[p] if p < 2 else 0
        after[f"link{p}_rx_crc_errors"] = (errors or {}).get(p, 0)
    return NodeResult(node, links, {k: 0 for k in after}, after, pings, marks)


def test_verdicts_name_the_cable_that_lost_a_ping():
    good = [_result(0, (0, 1, 2), (1, 1), (1, 1)), _result(1, (1, 0, 2), (1, 1), (1, 1))]
    v = cable_verdicts(good)
    assert [x.ok for x in v] == [True, True] and missing(good) is None
    assert v[0].line().startswith("node 0 link 0 (SFP+) <-> node 1 link 0 (SFP+): ok")
    assert v[1].line().startswith("node 1 link 1 (RGMII) <-> node 0 link 1 (RGMII): ok")
    # node 1 dropped node 0's ping on the SFP+ cable (CRC); the RGMII cable is fine
    bad = [_result(0, (0, 1, 2), (1, 1), (1, 1)),
           _result(1, (1, 0, 2), (1, 1), (1, 0), errors={1: 1}, pings=1)]
    v = cable_verdicts(bad)
    assert [x.ok for x in v] == [False, True]
    assert "0→1 sent 1 received 0 (crc_errors 1)" in v[0].line() and "FAILED" in v[0].line()
    assert missing(bad) == "node 1 counted 1 of 2 pings"


def test_verdicts_read_the_macs():
    eth = [{"link": lk, "link_up": True, "peer_id": 1, "fcs_errors": 0, "drops": 0,
            "rx_clk_hz": 125e6 if lk else None} for lk in range(3)]
    a = _result(0, (0, 1, 2), (1, 1), (1, 1))
    b = _result(1, (1, 0, 2), (1, 1), (1, 1))
    a.eth = eth
    b.eth = [{**e, "peer_id": 0} for e in eth]
    assert all(x.ok for x in cable_verdicts([a, b]))
    assert "node 0 MAC up, rx_clk 125.0 MHz" in cable_verdicts([a, b])[1].line()
    b.eth[1] = {**b.eth[1], "link_up": False, "fcs_errors": 3}
    v = cable_verdicts([a, b])
    assert v[0].ok and not v[1].ok and "node 1 MAC down, fcs_errors 3" in v[1].line()


def _phys(delays=(2.0, 2.0)):
    """What ``EthDriver.phy_setup`` returns for the two PL PHYs (ID, registers read back)."""
    from mcf.abi.eth import ETH_LINK_RGMII
    from mcf.abi.mdio import PHY_ADDRS
    from mcf.driver.eth import PhySetup
    return tuple(PhySetup(link=lk, phy=addr, phy_id=0x2000A231, cfg4=0x1031, rgmiictl=0x00D3,
                          rgmiidctl=0x77, phycr=0x5048, tx_delay_ns=delays[0],
                          rx_delay_ns=delays[1])
                 for lk, addr in zip(ETH_LINK_RGMII, PHY_ADDRS))


def test_verdicts_show_the_phys():
    """The RGMII cable's line names each end's PHY (MDIO address, delay mode, delays read
    back); a PHY missing from the set-up or with other delays fails that cable, not the SFP+
    one."""
    eth = [{"link": lk, "link_up": True, "peer_id": 1, "rx_clk_hz": 125e6 if lk else None}
           for lk in range(3)]
    a = _result(0, (0, 1, 2), (1, 1), (1, 1))
    b = _result(1, (1, 0, 2), (1, 1), (1, 1))
    a.eth, b.eth = eth, [{**e, "peer_id": 0} for e in eth]
    a.phys = b.phys = [asdict(p) for p in _phys()]
    a, b = (NodeResult.from_json(r.to_json()) for r in (a, b))      # as the launcher reads them
    v = cable_verdicts([a, b])
    assert [x.ok for x in v] == [True, True]
    assert "node 1 MAC up, rx_clk 125.0 MHz, PHY 2 rgmii-id tx 2 ns rx 2 ns" in v[1].line()
    assert "PHY" not in v[0].line()                                 # the SFP+ cable
    b.phys = [asdict(p) for p in _phys((2.75, 2.25))]
    v = cable_verdicts([a, b])
    assert [x.ok for x in v] == [True, False]
    assert "node 1 MAC up, rx_clk 125.0 MHz, PHY 2 rgmii-id tx 2.75 ns rx 2.25 ns (not 2/2)" \
        in v[1].line() and "FAILED" in v[1].line()
    b.phys = [p for p in b.phys if p["link"] != 1]
    v = cable_verdicts([a, b])
    assert not v[1].ok and "node 1 MAC up, rx_clk 125.0 MHz, PHY not set up" in v[1].line()


class _NodeBank:
    """The node's register bank as :class:`mcf.golden.csr.CsrModel` of ``node_regmap`` (a
    freshly loaded node: every status 0, ``DIR_READY`` 1), with ``NodeDriver``'s register
    calls; ``log`` gets each register written."""

    def __init__(self, log):
        from mcf.abi.csrmap import node_regmap
        from mcf.golden.csr import CsrModel
        self.regmap, self.log = node_regmap(), log
        self.csr = CsrModel(self.regmap)
        self.csr.inputs[("DIR_READY", "ready")] = 1

    def read_reg(self, name):
        return self.csr.read(self.regmap.addr(name))[1]

    def write_fields(self, name, **fields):
        self.log.append(name)
        self.csr.write(self.regmap.addr(name), self.regmap.register(name).pack(**fields), 0xF)

    def wait_counter(self, name, at_least, *, timeout):
        assert self.read_reg(name) >= at_least
        return self.read_reg(name)


class _Eth:
    """``ol.eth`` for :func:`board_session`: ``phy_setup`` returns ``phys`` or raises
    ``error``; every call in ``log``."""

    def __init__(self, log, phys=(), error=None):
        self.log, self.phys, self.error = log, phys, error

    def configure(self, node, n):
        self.log.append(("configure", node, n))

    def phy_setup(self):
        self.log.append("phy_setup")
        if self.error is not None:
            raise self.error
        return self.phys

    def link_status(self):
        return []


def _session(monkeypatch, eth, log, go=""):
    """:func:`board_session` of node 1 of 2 with an overlay of :class:`_NodeBank` and ``eth``;
    returns (exit code, the lines it printed)."""
    import pynq
    node = _NodeBank(log)
    monkeypatch.setattr(pynq, "Overlay", lambda bit: SimpleNamespace(
        node=node, eth=eth, ip_dict={"node": {}, "eth": {}}))
    monkeypatch.setattr(pynq, "allocate", lambda shape, dtype: SimpleNamespace(
        device_address=0x4000_0000))
    out = io.StringIO()
    rc = board_session("x.bit", 1, 2, 1e-3, stdin=io.StringIO(go), stdout=out)
    return rc, out.getvalue().splitlines()


def test_board_session_sets_up_the_phys(monkeypatch):
    """After the MACs are configured and before the node is written, both PHYs are set up;
    what they read back is in the READY result."""
    log = []
    rc, lines = _session(monkeypatch, _Eth(log, _phys()), log)
    assert lines[0].startswith(READY) and rc == 1         # no GO: it stops after READY
    assert lines[1] == FAILED + "RuntimeError: expected GO from the launcher, got ''"
    assert log[:3] == [("configure", 1, 2), "phy_setup", "NODE"]
    res = NodeResult.from_json(lines[0][len(READY):])
    assert res.phys == [asdict(p) for p in _phys()] and res.eth == []
    assert [(p["link"], p["phy"], p["rgmiidctl"]) for p in res.phys] == [(1, 2, 0x77),
                                                                       (2, 3, 0x77)]


def test_board_session_ends_on_a_phy_refused(monkeypatch):
    """A PHY that does not answer ends the board's check with the driver's one line, before
    READY and before the node is written."""
    from mcf.driver.eth import PhySetupError
    log = []
    err = PhySetupError("link 1: no PHY answers at MDIO address 2 (read 0x02 gave 0xffff)")
    rc, lines = _session(monkeypatch, _Eth(log, error=err), log, go="GO\n")
    assert rc == 1 and lines == [FAILED + "PhySetupError: link 1: no PHY answers at MDIO "
                                 "address 2 (read 0x02 gave 0xffff)"]
    assert log == [("configure", 1, 2), "phy_setup"]
    assert not any(line.startswith((READY, DONE)) for line in lines)


# ---- on simulated KR260s ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from mcf.hdl.tops import TOPS
    from mcf.sim.board.hwh import Port, write_hwh
    from mcf.sim.cluster import build_cluster

    built = build_cluster(2)
    top = TOPS["mcf_node_sim"]()        # the node's flat ports, without a Verilog conversion
    ports = [Port("aclk", "i", 1), Port("aresetn", "i", 1)]
    ports += [Port(sig.name, "i" if is_in else "o", len(sig))
              for sig, _, is_in in top._connections]
    hwh = write_hwh(tmp_path_factory.mktemp("overlay") / "mcf_node_sim.hwh", "mcf_node_sim",
                    ports)
    return built, hwh


def test_check_links_on_simulated_boards(pair, tmp_path):
    """Two rounds in one simulation, each on freshly loaded overlays: a healthy ring, where both
    cables pass both ways; then one bit flipped in the first frame on node 0's NEXT cable
    (directed link 0): node 1's link receiver drops it on its CRC, that cable is named, the
    other passes."""
    from mcf.sim import run
    from mcf.sim.cluster import directed_links

    built, hwh = pair
    assert directed_links(2)[0] == ((0, 0), (1, 0))
    out = tmp_path / "links.json"
    run(built, "mcf.sim.benches.board_links", params={"nodes": 2, "hwh": str(hwh), "out": str(out),
                                            "rounds": [None, 0], "timeout": 5e-5})
    good, bad = json.loads(out.read_text())
    for got in (good, bad):
        print("\n".join(got["lines"]), got["stuck"], [r["state"] for r in got["results"]])

    assert good["ok"] == [True, True] and good["stuck"] is None
    assert good["cables"] == [[[0, 0], [1, 0]], [[1, 1], [0, 1]]]    # the SFP+ and RGMII cables
    for r in good["results"]:
        assert r["pings"] == 2 and r["marks"] == 1 and not r["error"], r
    assert good["lines"][0].startswith("node 0 link 0 (SFP+) <-> node 1 link 0 (SFP+): ok")
    assert "0→1 sent 1 received 1" in good["lines"][0]
    assert "1→0 sent 1 received 1" in good["lines"][1]

    assert bad["ok"] == [False, True]
    assert "0→1 sent 1 received 0 (crc_errors 1)" in bad["lines"][0]
    assert "FAILED" in bad["lines"][0]
    assert bad["stuck"] == "node 1 counted 1 of 2 pings"
    assert [r["pings"] for r in bad["results"]] == [2, 1]

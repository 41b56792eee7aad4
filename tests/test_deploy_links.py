"""``mcf deploy --check-links`` (issue #36 item 3, :mod:`mcf.deploy.links`): the ping records
and routes, the per-cable verdicts, and the check itself on two simulated KR260s in the ring
(``node_cluster2``, the build ``tests/test_node_cluster.py`` shares): every cable passes both
ways, and a cable that corrupts a frame is named with the receiver's CRC error."""

from __future__ import annotations

import json

import pytest

from mcf.abi.meta import Collective, Meta, Op, Port, dispatch_port
from mcf.abi.node import PayloadSource, Queue, RecordClass
from mcf.abi.route import RingPort, route_entry
from mcf.deploy.links import (
    NodeResult,
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

"""Two node tops (``sim`` configuration) joined MAC to MAC (issue #13 test item; ``docs/eth.md``
§9 "Two node tops over the MACs"): :class:`mcf.sim.cluster_eth.ClusterEthTop` under Verilator,
the ring's SFP+ cable as two ``TenGigLink`` whose GT user data cross (10GBASE-R serialised at
the PCS boundary), its RGMII cable as two ``RgmiiMac`` pin to pin, driven by the cocotb bench of
the link-model ring (``sim/benches/node_cluster.py``, testcase ``prefill``).

The driver's link map sends a ring of two's traffic (both ways) over the SFP+ cable; with the
bench's ``mirror`` (every node's next and prev links swapped) it all goes over the RGMII cable.
So each test runs once per cable kind:

* MARS prefill steps bit-exact (the testcase's own checks: every planned KV byte at every
  receiver, counters), and the MACs' counters show every frame went over the MACs of that
  cable: per direction the sending NIC's ``tx_frames`` = its MAC's ``tx_frames`` = the other
  end's ``rx_frames`` = the receiving NIC's ``rx_frames_ok``, bytes equal, no drop anywhere, no
  frame on the other cable; the 10G ends in block lock.
* A link fault (one bit flipped on the wire in the next frame node 0 sends, before step 1): the
  receiving MAC drops it (``rx_fcs_errors`` 1), the NIC behind it sees the sequence gap
  (``seq_gaps`` 1, ``lost_frames`` 1 → ``link_error``), the run stops naming node and link, and
  every other frame on the links is delivered.

One Verilator build, shared by the tests of this file (about 20 minutes on two shared cores):
``slow``, run with ``python -m pytest -m slow tests/test_node_cluster_eth.py``."""

from __future__ import annotations

import json

import pytest

from mcf.abi.eth import ETH_STATUS
from mcf.abi.link_map import link_map_for
from mcf.sim import run
from mcf.sim.cluster import directed_links
from mcf.sim.cluster_eth import build_cluster_eth, mac_kind

BENCH = "mcf.sim.benches.node_cluster"
pytestmark = pytest.mark.slow
DROPS = [name for name, _ in ETH_STATUS if name.startswith("rx_")
         and name not in ("rx_frames", "rx_bytes")] + ["tx_underruns"]


@pytest.fixture(scope="module")
def pair():
    return build_cluster_eth(2)


def _port(end: tuple[int, int]) -> str:
    return f"n{end[0]}_eth{end[1]}"


def _nic_port(node: int, link: int, mirror: bool) -> int:
    """The node's NIC port (its ``link{p}_*`` counters) on physical ``link``."""
    links = list(link_map_for(node, 2, "ring"))
    if mirror:
        links[0], links[1] = links[1], links[0]
    return links.index(link)


def _prefill(pair, tmp_path, cable: str, **more) -> dict:
    out = tmp_path / "prefill.json"
    run(pair, BENCH, testcase="prefill", params={
        "nodes": 2, "seq_len": 64, "chunk": 32, "seed": 3, "pause": 0.2, "out": str(out),
        "mirror": cable == "rgmii", **more})
    return json.loads(out.read_text())


@pytest.mark.parametrize("cable", ["10g", "rgmii"])
def test_mars_prefill_steps_over_the_macs(pair, tmp_path, cable):
    got = _prefill(pair, tmp_path, cable)
    mirror = cable == "rgmii"
    assert len(got["step_cycles"]) == 2 and all(c > 0 for c in got["step_cycles"])
    assert all(p > 0 for p in got["kv_packets_landed"])
    eth, links = got["eth"], got["links"]
    assert sorted(eth) == ["n0_eth0", "n0_eth1", "n1_eth0", "n1_eth1"]
    carried = {"10g": 0, "rgmii": 0}
    for src, dst in directed_links(2):
        tx, rx = eth[_port(src)], eth[_port(dst)]
        assert tx["tx_frames"] == rx["rx_frames"] and tx["tx_bytes"] == rx["rx_bytes"], (src, dst)
        assert all(rx[c] == 0 for c in DROPS) and tx["tx_underruns"] == 0, (src, dst, rx)
        sent = links[f"n{src[0]}"][f"link{_nic_port(*src, mirror)}_tx_frames"]
        landed = links[f"n{dst[0]}"][f"link{_nic_port(*dst, mirror)}_rx_frames_ok"]
        assert sent == tx["tx_frames"] == landed, (src, dst, sent, tx, landed)
        carried[mac_kind(src[1])] += tx["tx_frames"]
    assert carried[cable] > 0 and sum(carried.values()) == carried[cable], carried
    for end in ("n0_eth0", "n1_eth0"):
        assert eth[end]["block_lock"] == 1 and eth[end]["hi_ber"] == 0, eth[end]
    assert all(v == 0 for c in links.values() for k, v in c.items()
               if ("_rx_" in k or "unmapped" in k) and not k.endswith("frames_ok")), links


@pytest.mark.parametrize("cable", ["10g", "rgmii"])
def test_a_wire_fault_is_dropped_by_the_mac_and_stops_the_run(pair, tmp_path, cable):
    """A bit flipped on the wires leaving node 0 before step 1 (``link{k}_inject``)."""
    got = _prefill(pair, tmp_path, cable, fault={"step": 1, "node": 0})
    mirror = cable == "rgmii"
    eth, links = got["eth"], got["links"]
    hit = []
    for src, dst in directed_links(2):
        tx, rx = eth[_port(src)], eth[_port(dst)]
        bad = 1 if src[0] == 0 and tx["tx_frames"] > 0 else 0
        assert rx["rx_fcs_errors"] == bad, (src, dst, rx)
        assert all(rx[c] == 0 for c in DROPS if c != "rx_fcs_errors"), (src, dst, rx)
        assert tx["tx_underruns"] == 0 and rx["rx_frames"] == tx["tx_frames"] - bad, (tx, rx)
        sent = links[f"n{src[0]}"][f"link{_nic_port(*src, mirror)}_tx_frames"]
        assert sent == tx["tx_frames"], (src, sent, tx)
        pre = f"link{_nic_port(*dst, mirror)}_rx_"
        node_rx = links[f"n{dst[0]}"]
        assert node_rx[pre + "frames_ok"] == rx["rx_frames"], (dst, node_rx)
        assert node_rx[pre + "seq_gaps"] == node_rx[pre + "lost_frames"] == bad, (dst, node_rx)
        assert node_rx[pre + "crc_errors"] == 0, (dst, node_rx)
        if bad:
            hit.append((dst, mac_kind(src[1])))
    assert [k for _, k in hit] == [cable], hit
    (dst, _), = hit
    assert eth[_port(dst)]["rx_frames"] > 0       # frames after the lost one were delivered
    assert got["stopped"] == (f"link fault at node 1: link {_nic_port(*dst, mirror)}: "
                              "seq_gaps 1, lost_frames 1")

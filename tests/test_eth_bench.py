"""The MAC bench (sim/benches/eth_mac.py) and the Ethernet benchmark (mcf.sim.perf.eth, ``mcf
bench eth``), one Verilator build per MAC (:func:`mcf.sim.perf.eth.built`) for all: the bench's
``lengths`` and ``bad`` for each MAC against cocotbext-eth's PHY models (RGMII: ``RgmiiPhy``;
10G: ``XgmiiSource``/``XgmiiSink``); a small benchmark run of both reports rates that are
physically possible — never above the theoretical payload rate of the line, at least 99 % of it
for 1,500-byte payloads — and a MAC configured with the wrong node id makes the benchmark refuse
(~1.5 min once the two Verilator builds exist)."""

from __future__ import annotations

import pytest

from mcf.abi.eth import FCS_BYTES, HEADER_BYTES, IFG_BYTES, LINK_OVERHEAD, PREAMBLE
from mcf.sim.benches.eth_common import LOCAL
from mcf.sim.perf import BenchRefused, eth


@pytest.mark.parametrize("mac", sorted(eth.MACS))
def test_mac_bench(mac):
    from mcf.sim import run
    xml = run(eth.built(mac), eth.BENCH,
              params={"mac": mac, "seed": 1, "tests": ["lengths", "bad"]})
    assert _cases(xml) == {"lengths": "passed", "bad": "passed", "rate": "skipped"}


def _cases(xml) -> dict[str, str]:
    """Each cocotb test of a ``results.xml``: ``passed``, ``skipped`` or ``failed``."""
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        tags = {c.tag for c in case}
        out[case.get("name")] = "failed" if tags & {"failure", "error"} else \
            "skipped" if "skipped" in tags else "passed"
    return out


@pytest.fixture(scope="module")
def small():
    return eth.collect(small=True, synth=False)


def _theory_gbps(line_gbps: float, link_len: int) -> tuple[int, float]:
    """(frame bytes, payload Gb/s) of a link payload of ``link_len`` bytes at line rate."""
    payload = max(46, LINK_OVERHEAD + link_len)
    frame = HEADER_BYTES + payload + FCS_BYTES
    return frame, line_gbps * payload / (len(PREAMBLE) + 1 + frame + IFG_BYTES)


def test_small_run_is_at_line_rate(small):
    for mac, line_gbps, clock in (("rgmii", 1.0, 125.0), ("xgmii", 10.0, 156.25)):
        r = small[mac]
        assert r["clock_mhz"] == clock and r["line_gbps"] == line_gbps
        assert set(r["sizes"]) == {"64B", "1500B"}
        for label, link_len in eth.SIZES.items():
            s = r["sizes"][label]
            frame, theory = _theory_gbps(line_gbps, link_len)
            assert s["frame_bytes"] == frame
            assert s["theoretical_payload_gbps"] == pytest.approx(theory, abs=1e-4)
            for side in ("tx", "rx"):
                got = s[side]
                assert got["window_frames"] > 0
                assert 0 < got["line_rate_fraction"] <= 1.0, (mac, label, side)
                assert got["payload_gbps"] <= theory + 1e-4, (mac, label, side)
                assert got["payload_gbps"] == pytest.approx(
                    theory * got["line_rate_fraction"], rel=1e-3)
            # TX timing is the MAC's own (frame starts on its clock): exactly line rate
            assert s["tx"]["line_rate_fraction"] == 1.0, (mac, label)
            assert r[f"payload_gbps_at_{label}"] == min(s["tx"]["payload_gbps"],
                                                        s["rx"]["payload_gbps"])
        assert r["line_rate_fraction_1500B"] >= 0.99
        assert r["payload_gbps_at_1500B"] >= 0.99 * _theory_gbps(line_gbps, 1480)[1]
    assert small["xgmii"]["sizes"]["64B"]["tx"]["start_lanes"] == [0, 4]
    assert "resources" not in small
    text = eth.render(small)
    assert "xgmii" in text and "156.25 MHz" in text and "1500B" in text


def test_wrong_node_id_is_refused():
    """The MAC configured with another node id drops every frame its peer sends (foreign
    destination) and sends from the wrong source address: no figure."""
    with pytest.raises(BenchRefused, match="rx_foreign_dst"):
        eth.measure("rgmii", 6, sizes={"64B": 0}, local_id=LOCAL ^ 1)

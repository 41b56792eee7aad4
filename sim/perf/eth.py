"""Ethernet MAC bench (``mcf bench eth``; issue #13, ``docs/eth.md`` §6): the payload rate of
the 1G RGMII MAC and of the 10G XGMII MAC, measured in cocotb + Verilator against
cocotbext-eth's PHY models, as a fraction of the theoretical payload rate of the line.

For each MAC and frame size, :func:`mcf.sim.benches.eth_common.line_rate` runs ``n`` frames
each way at once (full duplex): back-to-back link frames on ``s_axis`` leave through the MAC's
TX towards ``RgmiiPhy``'s sink / ``XgmiiSink``, while ``RgmiiPhy``'s source / ``XgmiiSource``
sends Ethernet frames at line rate into RX, delivered whole on ``m_axis``. Every TX frame is
compared byte for byte with preamble + SFD + :func:`mcf.abi.eth.encap`, every RX beat with
:func:`mcf.abi.eth.link_beats`, and every ``ETH_STATUS`` counter's change with the run's plan
(``n`` frames and ``n × frame`` bytes each way, no drop, no underrun). A mismatch, a missing
frame or any other counter change raises :class:`~mcf.sim.perf.BenchRefused`.

Sizes: ``64B`` — minimum frames (a 20-byte link frame padded to 46 payload bytes, 64 bytes
dst..FCS); ``1500B`` — 1,500-byte Ethernet payloads (a 1,480-byte link payload, 1,518-byte
frames). A frame occupies ``8 + frame + 12`` bytes of the line (preamble + SFD, inter-frame
gap; on XGMII 12 on average under the deficit idle count), so the theoretical payload rate is
``line × payload / (frame + 20)``: 0.5476 / 0.9753 Gb/s at 1 Gb/s, ten times that at 10 Gb/s.

Clocks (simulated, exact): RGMII 125 MHz (one byte per cycle, 8 ns; DDR pins), XGMII
156.25 MHz (8 bytes per 6.4 ns), aclk 200 MHz (unrelated). Rates are steady-state windows of
a whole number of phase cycles (``eth_common``): TX from the frame start times at the PHY
model, RX from the times the frames' last beats leave ``m_axis``. ``line_rate_fraction`` is the
measured payload rate over the theoretical one; the top-level figures per MAC are the lower of
TX and RX.

Resources: :func:`mcf.sim.synth.resources` of ``RgmiiMac`` (simulation I/O: no
``IDDRE1``/``ODDRE1`` without a platform), ``TenGigMac`` (XGMII) and ``TenGigLink`` (MAC +
10GBASE-R PCS, 64-bit GT interface).

    mcf bench eth [--small] [--no-synth] [--json]
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mcf.abi.eth import FCS_BYTES, HEADER_BYTES, LINK_OVERHEAD
from mcf.sim.perf import BenchRefused, refuse_unplanned, resource_table

__all__ = ["collect", "render", "measure", "built", "SIZES", "MACS", "BENCH"]

SIZES = {"64B": 0, "1500B": 1500 - LINK_OVERHEAD}
"""Size label → link frame payload bytes (``Meta.length``)."""
assert SIZES["1500B"] + LINK_OVERHEAD + HEADER_BYTES + FCS_BYTES == 1518

BENCH = "mcf.sim.benches.eth_mac"
"""The cocotb bench of both MACs (its ``mac`` parameter, a key of :data:`MACS`, says which)."""

MACS = {
    # name: (flat top, line Gb/s, clock MHz, frames each way: small, full)
    "rgmii": ("eth_rgmii", 1.0, 125.0, (17, 65)),
    "xgmii": ("eth_10g", 10.0, 156.25, (203, 403)),
}


def built(mac: str):
    """The Verilator build of ``mac``'s flat top (the same one ``tests/test_eth_*.py`` use)."""
    from mcf.hdl.flat import FlatTop
    from mcf.sim import build
    if mac == "rgmii":
        from mcf.hdl.eth.rgmii import RgmiiMac
        top = RgmiiMac()
    else:
        from mcf.hdl.eth.tengig import TenGigMac
        top = TenGigMac()
    return build(FlatTop(top, {"s_axis": "s_axis", "m_axis": "m_axis"}), MACS[mac][0])


def _check(what: str, raw: dict) -> None:
    """Refuse unless every frame went through bit-exact and the counters moved as planned."""
    n, size = raw["frames"], raw["frame_bytes"]
    planned = {"tx_frames": n, "tx_bytes": n * size, "rx_frames": n, "rx_bytes": n * size}
    refuse_unplanned(what, raw["counters"], planned)
    tx, rx = raw["tx"], raw["rx"]
    if tx["frames_seen"] != n or tx["frames_exact"] != n:
        raise BenchRefused(f"{what}: TX {tx['frames_seen']} of {n} frames on the line, "
                           f"{tx['frames_exact']} bit-exact")
    if rx["frames_delivered"] != n or not rx["beats_exact"]:
        raise BenchRefused(f"{what}: RX {rx['frames_delivered']} of {n} frames delivered, "
                           f"beats {'' if rx['beats_exact'] else 'not '}bit-exact")
    for side in ("tx", "rx"):
        if raw[side]["window_frames"] <= 0:
            raise BenchRefused(f"{what}: {n} frames leave no steady {side.upper()} window")


def _rates(raw: dict, side: str) -> dict:
    w = raw[side]
    k, ns = w["window_frames"], w["window_ns"]
    return {"payload_gbps": round(k * raw["payload_bytes"] * 8 / ns, 4),
            "line_rate_fraction": round(k * raw["frame_period_ns"] / ns, 6),
            "window_frames": k}


def measure(mac: str, n: int, *, sizes: dict[str, int] | None = None, seed: int = 3,
            local_id: int | None = None) -> dict:
    """Run ``mac`` (``"rgmii"`` or ``"xgmii"``) at every size of ``sizes`` (default
    :data:`SIZES`) with ``n`` frames each way; return the checked figures per size label.
    ``local_id`` configures the MAC with another node id than its peer addresses (a
    misconfiguration: it drops every received frame, and the bench refuses)."""
    from mcf.sim import run
    sizes = SIZES if sizes is None else sizes
    params = {"mac": mac, "tests": ["rate"], "seed": seed, "rate_n": n,
              "sizes": list(sizes.values())}
    if local_id is not None:
        params["local_id"] = local_id
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rate.json"
        try:
            run(built(mac), BENCH, testcase="rate", params={**params, "out": str(out)})
        except AssertionError as exc:
            raise BenchRefused(f"eth {mac}: {str(exc).splitlines()[0]}") from None
        raw = json.loads(out.read_text())
    result = {}
    for label, link_len in sizes.items():
        r = raw[str(link_len)]
        _check(f"eth {mac} {label}", r)
        result[label] = {
            "frame_bytes": r["frame_bytes"], "payload_bytes": r["payload_bytes"],
            "wire_bytes": r["wire_bytes"], "frames": r["frames"],
            "theoretical_payload_gbps": round(r["theoretical_payload_gbps"], 4),
            "tx": {**_rates(r, "tx"), "start_lanes": r["tx"]["start_lanes"]},
            "rx": _rates(r, "rx"),
        }
    return result


def _summary(mac: str, per_size: dict) -> dict:
    _, line_gbps, clock_mhz, _ = MACS[mac]
    out = {"clock_mhz": clock_mhz, "line_gbps": line_gbps}
    for label, r in per_size.items():
        out[f"payload_gbps_at_{label}"] = min(r["tx"]["payload_gbps"], r["rx"]["payload_gbps"])
        out[f"line_rate_fraction_{label}"] = min(r["tx"]["line_rate_fraction"],
                                                 r["rx"]["line_rate_fraction"])
        out[f"theoretical_payload_gbps_at_{label}"] = r["theoretical_payload_gbps"]
    out["sizes"] = per_size
    return out


def _resource_tops() -> dict:
    from mcf.hdl.eth.rgmii import RgmiiMac
    from mcf.hdl.eth.tengig import TenGigLink, TenGigMac
    return {"RgmiiMac": (RgmiiMac(), "eth_rgmii_mac"),
            "TenGigMac": (TenGigMac(), "eth_tengig_mac"),
            "TenGigLink": (TenGigLink(64), "eth_tengig_link")}


def collect(small: bool = False, synth: bool = True) -> dict:
    """Both MACs at both sizes (see the module docstring); ``small`` runs fewer frames (the
    fewest that still give a whole phase-cycle window); ``resources`` unless ``synth`` is
    False."""
    result = {}
    for mac, (_, _, _, counts) in MACS.items():
        result[mac] = _summary(mac, measure(mac, counts[0] if small else counts[1]))
    result["aclk_mhz"] = 200.0
    if synth:
        from mcf.sim.synth import resources
        result["resources"] = {name: resources(top, key)
                               for name, (top, key) in _resource_tops().items()}
    return result


def render(result: dict) -> str:
    lines = ["Ethernet MACs, full duplex against cocotbext-eth (cocotb + Verilator), every frame "
             "bit-exact, no drop",
             f"{'MAC':<7}{'clock':>11}{'size':>7}{'frame':>7}{'payload':>9}{'theory Gb/s':>13}"
             f"{'TX Gb/s':>9}{'RX Gb/s':>9}{'TX frac':>10}{'RX frac':>10}{'frames':>8}"]
    for mac in MACS:
        r = result[mac]
        for label, s in r["sizes"].items():
            lines.append(f"{mac:<7}{r['clock_mhz']:>7.2f} MHz{label:>7}{s['frame_bytes']:>7}"
                         f"{s['payload_bytes']:>9}{s['theoretical_payload_gbps']:>13.4f}"
                         f"{s['tx']['payload_gbps']:>9.4f}{s['rx']['payload_gbps']:>9.4f}"
                         f"{s['tx']['line_rate_fraction']:>10.6f}"
                         f"{s['rx']['line_rate_fraction']:>10.6f}{s['frames']:>8}")
    lines.append(f"payload = Ethernet payload (frame - 18 B); theory = line x payload / (frame + "
                 f"20 B of preamble, SFD and gap); steady-state windows: TX frame starts at the "
                 f"PHY model, RX last beats on m_axis (aclk {result['aclk_mhz']:g} MHz)")
    if result.get("resources"):
        lines += ["", *resource_table(result["resources"], "resources")]
    return "\n".join(lines)

"""Shared pieces of the Ethernet cocotb benches (:mod:`.eth_mac`, the MAC bench — RGMII against
cocotbext-eth's ``RgmiiPhy`` at 1000 Mb/s, XGMII against ``XgmiiSource``/``XgmiiSink`` — and
:mod:`.eth_10g_pcs`): random link frames, the status word, and :func:`line_rate` — the
full-duplex throughput measurement behind the MAC bench's ``rate`` test and ``mcf bench eth``
(:mod:`mcf.sim.perf.eth`).

:func:`line_rate` offers ``n`` back-to-back link frames of one size on ``s_axis`` while the
PHY model sends ``n`` Ethernet frames of the same size into the RX pins at its line rate
(12-byte gap; the XGMII source with its deficit idle count), and records:

* TX — every frame the PHY model received, compared byte for byte with preamble + SFD +
  :func:`mcf.abi.eth.encap`; its start time (``sim_time_start``, lane included on XGMII).
* RX — every beat on ``m_axis`` (compared with :func:`mcf.abi.eth.link_beats` of the frames
  sent) and the time of each frame's last beat.
* the change of every ``ETH_STATUS`` counter over the run.

Rates are steady-state: the first ``SKIP`` frames each way are left out (the TX gate filling,
the RX pipeline's first frame), and a window spans a whole number of *phase cycles* — the
frames after which the pattern repeats exactly: the deficit idle count (``dic_cycle``: 8
frames cover every XGMII start-lane/deficit sequence, 1 on RGMII), and on RX also the phase
of the unrelated aclk against the frame period (the deliveries are sampled on aclk edges, so
the window is a multiple of ``aclk / gcd(aclk, frame period)`` frames). Over such a window
the measured period is exact, not a sampling artefact.

Nothing here asserts on the MAC's behaviour: a mismatch, a missing frame or a counter the run
did not plan is written into the result for the caller to refuse (the bench) or assert on
(the tests).
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import dataclass

import cocotb
from cocotb.triggers import ClockCycles, RisingEdge, SimTimeoutError, with_timeout
from cocotb.utils import get_sim_time

from mcf.abi.eth import ETH_STATUS, PREAMBLE, SFD, encap, link_beats
from mcf.abi.meta import META
from mcf.abi.nic import crc32

__all__ = ["LOCAL", "PEER", "SKIP", "Line", "Collector", "link_frame", "with_fcs", "status",
           "line_rate"]

LOCAL, PEER = 3, 9
SKIP = 2


@dataclass(frozen=True)
class Line:
    """A MAC's line: the byte time (ps) of its clock and the frames after which its gap
    pattern repeats."""
    name: str
    clock_hz: float
    bytes_per_cycle: int
    dic_cycle: int

    @property
    def byte_ps(self) -> int:
        return round(1e12 / self.clock_hz / self.bytes_per_cycle)


def link_frame(rng: random.Random, length: int) -> bytes:
    """A link frame (header, Meta with ``length``, random payload, CRC-32) of random content."""
    meta = rng.getrandbits(META.size) & ~(((1 << META["length"].width) - 1)
                                          << META["length"].offset)
    meta |= length << META["length"].offset
    body = rng.randbytes(8) + meta.to_bytes(8, "little") + rng.randbytes(length)
    return body + crc32(body).to_bytes(4, "little")


def with_fcs(body: bytes) -> bytes:
    return body + crc32(body).to_bytes(4, "little")


def status(dut) -> dict[str, int]:
    raw = int(dut.status.value)
    return {name: (raw >> f.offset) & ((1 << f.width) - 1) for name, f in ETH_STATUS}


def _exact(frame, link: bytes) -> bool:
    """``frame`` (a ``GmiiFrame`` or ``XgmiiFrame``) is preamble + SFD + the encapsulated
    ``link``, with no ``tx_er`` / control character inside."""
    flags = [*(getattr(frame, "error", None) or []), *(getattr(frame, "ctrl", None) or [])]
    return bytes(frame.data) == PREAMBLE + bytes([SFD]) + encap(link, LOCAL, PEER) \
        and not any(flags)


def _window(times: list[int], unit: int) -> tuple[int, int]:
    """(frames, ps) of the longest steady window of ``times`` (frame times) spanning a multiple
    of ``unit`` frames; (0, 0) when there are too few."""
    k = (len(times) - 1 - SKIP) // unit * unit
    if k <= 0:
        return 0, 0
    return k, times[SKIP + k] - times[SKIP]


async def line_rate(tb, line: Line, link_len: int, n: int, rng: random.Random, *,
                    aclk_ps: int) -> dict:
    """Full-duplex run of ``n`` frames each way (see the module docstring). ``tb`` is the
    bench's TB (``send_links``, ``tx_recv``, ``rx_send``, ``out``, ``last_ps``). Frames go
    from ``LOCAL`` to ``PEER`` and back: a MAC configured with another id drops what it
    receives and sends the wrong source address."""
    dut = tb.dut
    tx_links = [link_frame(rng, link_len) for _ in range(n)]
    rx_links = [link_frame(rng, link_len) for _ in range(n)]
    size = len(encap(tx_links[0], LOCAL, PEER))
    wire = len(PREAMBLE) + 1 + size + 12               # bytes per frame at line rate (average)
    period_ps = wire * line.byte_ps
    out0, last0 = len(tb.out), len(tb.last_ps)
    st0 = status(dut)

    async def feed_rx():
        for lk in rx_links:
            await tb.rx_send(encap(lk, PEER, LOCAL))

    cocotb.start_soon(tb.send_links(tx_links))
    cocotb.start_soon(feed_rx())
    tx = []

    async def take_tx():
        for _ in range(n):
            tx.append(await tb.tx_recv())

    limit_us = 3 * n * period_ps // 1_000_000 + 50
    with contextlib.suppress(SimTimeoutError):
        await with_timeout(take_tx(), limit_us, "us")
    want_beats = [b for lk in rx_links for b in link_beats(lk)]
    rx_events = [k for k in st0 if k.startswith("rx_") and k != "rx_bytes"]

    async def take_rx():                # every RX frame decided (delivered or dropped), then
        while sum(status(dut)[k] - st0[k] for k in rx_events) < n:        # its beats out
            await ClockCycles(dut.clk, 16)
        while len(tb.out) - out0 < len(want_beats) and status(dut)["rx_frames"] - st0[
                "rx_frames"] == n:
            await RisingEdge(dut.clk)

    with contextlib.suppress(SimTimeoutError):
        await with_timeout(take_rx(), limit_us, "us")
    await ClockCycles(dut.clk, 200)
    st1 = status(dut)
    tx_ok = sum(_exact(f, lk) for f, lk in zip(tx, tx_links))
    got_beats = tb.out[out0:]
    rx_times = tb.last_ps[last0:]

    payload = size - 18
    res = {"link_bytes": len(tx_links[0]), "frame_bytes": size, "payload_bytes": payload,
           "wire_bytes": wire, "frame_period_ns": period_ps / 1000, "frames": n,
           "theoretical_payload_gbps": payload * 8 / (period_ps / 1000),
           "counters": {k: st1[k] - st0[k] for k in st1}}
    t_k, t_span = _window([f.sim_time_start for f in tx], line.dic_cycle)
    res["tx"] = {"frames_seen": len(tx), "frames_exact": tx_ok, "window_frames": t_k,
                 "window_ns": t_span / 1000,
                 "start_lanes": sorted({getattr(f, "start_lane", 0) or 0 for f in tx})}
    rx_unit = line.dic_cycle * aclk_ps // math.gcd(aclk_ps, line.dic_cycle * period_ps)
    r_k, r_span = _window(rx_times, rx_unit)
    res["rx"] = {"frames_delivered": len(rx_times), "beats_exact": got_beats == want_beats,
                 "window_frames": r_k, "window_ns": r_span / 1000}
    return res


class Collector:
    """The aclk-side ``m_axis`` monitor of the MAC bench's TB: ``out`` (data, keep, last) of
    every beat and ``last_ps`` the sim time of every ``last`` beat."""

    def __init__(self, dut):
        self.dut = dut
        self.out: list[tuple[int, int, int]] = []
        self.last_ps: list[int] = []

    async def run(self):
        d = self.dut
        while True:
            await RisingEdge(d.clk)
            if d.m_axis_tvalid.value and d.m_axis_tready.value:
                last = int(d.m_axis_tlast.value)
                self.out.append((int(d.m_axis_tdata.value), int(d.m_axis_tkeep.value), last))
                if last:
                    self.last_ps.append(get_sim_time())


async def drive_link(dut, link: bytes) -> None:
    """Drive one link packet into ``s_axis`` beat by beat (:func:`mcf.abi.eth.link_beats`),
    each beat held until ``tready``; ``tvalid`` stays high (the caller drops it)."""
    for data, keep, last in link_beats(link):
        dut.s_axis_tdata.value = data
        dut.s_axis_tkeep.value = keep
        dut.s_axis_tlast.value = last
        dut.s_axis_tvalid.value = 1
        while True:
            await RisingEdge(dut.clk)
            if dut.s_axis_tready.value:
                break

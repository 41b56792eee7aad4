"""The packet bench (mcf.sim.perf.packet): both widths in one result, every output checked
against the golden models, and refusal of a packet the parser drops (amaranth.sim, ~10 s)."""

from __future__ import annotations

import pytest

from mcf.abi.framing import MAX_PAYLOAD
from mcf.sim.perf import BenchRefused, packet


def test_small_run_reports_both_widths_at_line_rate():
    r = packet.collect(small=True, synth=False)
    assert set(r["widths"]) == {"64", "128"}
    assert r["max_payload"] == MAX_PAYLOAD
    for w, row in r["widths"].items():
        top = str(MAX_PAYLOAD // (int(w) // 8))
        assert set(row["beats_per_cycle"]) == {"0", "1", "2", "4", "8", "16", "64", top}
        assert all(v == 1.0 for v in row["beats_per_cycle"].values())
        assert row["latency"]["8"] == 12 and row["latency"][top] == int(top) + 4
    assert "resources" not in r
    assert "128-bit" in packet.render(r)


@pytest.mark.parametrize("width", [64, 128])
def test_oversize_packet_is_refused(width):
    bpb = width // 8
    with pytest.raises(BenchRefused, match="drop_oversize"):
        packet.measure(width, 4, 8, max_payload=2 * bpb)


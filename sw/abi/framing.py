"""Stream beat layouts and the packet wire format (paper §5: ``Packet = {Meta, Payload}``).

``amaranth.lib.stream`` carries no framing, so framing lives in the payload layout:

* :func:`beat_layout` — one beat of a packet on the wire (``data``, ``keep``, ``last``). A packet
  is one header beat holding :data:`~mcf.abi.meta.META` in its low bits (the rest zero), then
  ``ceil(length / bytes_per_beat)`` payload beats, bytes packed from byte 0. ``keep`` marks the
  valid bytes of the final beat; every other beat is full. A packet with ``length == 0`` is the
  header beat alone, with ``last`` set.
* :func:`parsed_layout` — one beat after the parser: the metadata rides beside every beat of its
  payload. A zero-length packet becomes a single beat with ``keep == 0``.

:func:`encode_packet` is the host/golden-model version of the same format, written against the
layouts so that the benches build expected packets independently of the DUT.
"""

from __future__ import annotations

from amaranth.hdl import unsigned
from amaranth.lib import data

from .meta import META, Meta

__all__ = [
    "MAX_PAYLOAD", "FRAME_OVERHEAD_BEATS", "max_frame_beats", "beat_layout", "parsed_layout",
    "payload_beats", "keep_mask",
    "encode_packet", "header_bytes",
]


MAX_PAYLOAD = 2048
"""Largest packet payload in bytes, for every engine that buffers or checks a payload (parser,
router, link RX, reduction, all-to-all) and for MARS, which fragments every payload it plans to
it. Sized for the largest single record of Qwen2.5-1.5B: the decode query (12 heads x 128 INT8
values plus their scales); a KV block is cut at token boundaries. ``Meta.length`` must be able
to name it (checked by the ABI tests)."""


def _check_width(data_width: int, meta_layout: data.StructLayout) -> None:
    if data_width % 8 or data_width < 32:
        raise ValueError(f"data width {data_width} must be a multiple of 8 and >= 32")
    if meta_layout.size > data_width:
        raise ValueError(f"metadata ({meta_layout.size} bits) must fit in one "
                         f"{data_width}-bit header beat")


def beat_layout(data_width: int, meta_layout: data.StructLayout = META) -> data.StructLayout:
    _check_width(data_width, meta_layout)
    return data.StructLayout({
        "data": unsigned(data_width),
        "keep": unsigned(data_width // 8),
        "last": unsigned(1),
    })


def parsed_layout(data_width: int, meta_layout: data.StructLayout = META) -> data.StructLayout:
    _check_width(data_width, meta_layout)
    return data.StructLayout({
        "meta": meta_layout,
        "data": unsigned(data_width),
        "keep": unsigned(data_width // 8),
        "last": unsigned(1),
    })


FRAME_OVERHEAD_BEATS = 3
"""Beats a link frame adds to its packet's payload beats: the link header, the Meta beat and the
CRC-32 beat (``mcf.hdl.nic.link.LinkTx``)."""


def max_frame_beats(data_width: int, max_payload: int = MAX_PAYLOAD) -> int:
    """Beats of the longest link frame: :data:`FRAME_OVERHEAD_BEATS` and ``max_payload``'s."""
    return FRAME_OVERHEAD_BEATS + payload_beats(max_payload, data_width)


def payload_beats(length: int, data_width: int) -> int:
    """Payload beats of a packet with ``length`` bytes (0 for a header-only packet)."""
    bpb = data_width // 8
    return (length + bpb - 1) // bpb


def keep_mask(length: int, data_width: int) -> int:
    """``keep`` of the final payload beat."""
    bpb = data_width // 8
    rem = length % bpb
    return (1 << (rem or bpb)) - 1


def header_bytes(meta: Meta, data_width: int, meta_layout: data.StructLayout = META) -> bytes:
    """The header beat as bytes (little-endian, zero-padded to the beat)."""
    _check_width(data_width, meta_layout)
    return meta.pack(meta_layout).to_bytes(data_width // 8, "little")


def encode_packet(meta: Meta, payload: bytes, data_width: int,
                  meta_layout: data.StructLayout = META) -> bytes:
    """A whole packet as the byte stream an AXI-Stream source sends (header beat + payload)."""
    if meta.length != len(payload):
        raise ValueError(f"meta.length={meta.length} but payload has {len(payload)} bytes")
    return header_bytes(meta, data_width, meta_layout) + bytes(payload)

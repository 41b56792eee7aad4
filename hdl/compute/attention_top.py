"""Top-level wrapper of the attention engine with packed stream payloads (paper §5).

The engine's input streams carry ``data.StructLayout`` payloads; at a top level each input is
presented as one plain vector (``tdata`` = the layout's bits, LSB-first as
``layout.const(...).as_bits()`` packs them), so a host, a DMA engine or cocotbext-axi drive it
with ordinary AXI-Stream ``tdata`` and no per-field sidebands. The output keeps the wire beat
layout (``tdata``/``tkeep``/``tlast``) for the packetizer.
"""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import beat_layout
from mcf.abi.kv import (
    attn_job_layout,
    attn_status_layout,
    kv_beat_layout,
    kv_header_layout,
    q_beat_layout,
)

from .attention import AttentionEngine

__all__ = ["AttentionTop", "AXIS_NAMES"]

AXIS_NAMES = {"job": "s_axis_job", "q": "s_axis_q", "k": "s_axis_k", "v": "s_axis_v",
              "kh": "s_axis_kh", "o": "m_axis"}


class AttentionTop(wiring.Component):
    """:class:`AttentionEngine` with packed-vector input payloads.

    Members
    -------
    job, q, k, v : In(stream.Signature(unsigned(layout.size)))
        Packed :func:`mcf.abi.kv.attn_job_layout`, :func:`q_beat_layout`, and
        :func:`kv_beat_layout` for the K and the V stream (see :class:`AttentionEngine`).
    kh : In(stream.Signature(unsigned(kv_header_layout(lanes).size)))
        Only with ``kv_format=PER_CHANNEL_K``: the K blocks' group headers.
    o : Out(stream.Signature(beat_layout(data_width)))
    status : Out(attn_status_layout())

    Latency and stream rules are the engine's (pure wiring, no registers).
    """

    def __init__(self, **params):
        self.engine = AttentionEngine(**params)
        e = self.engine
        super().__init__({
            "job": In(stream.Signature(attn_job_layout(e.max_heads).size)),
            "q": In(stream.Signature(q_beat_layout(e.lanes).size)),
            "k": In(stream.Signature(kv_beat_layout(e.lanes).size)),
            "v": In(stream.Signature(kv_beat_layout(e.lanes).size)),
            **({"kh": In(stream.Signature(kv_header_layout(e.lanes).size))}
               if "kh" in e.signature.members else {}),
            "o": Out(stream.Signature(beat_layout(e.data_width))),
            "status": Out(attn_status_layout()),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.engine = e = self.engine
        for name in ("job", "q", "k", "v", "kh")[:4 + ("kh" in e.signature.members)]:
            outer, inner = getattr(self, name), getattr(e, name)
            m.d.comb += [inner.valid.eq(outer.valid), outer.ready.eq(inner.ready),
                         inner.payload.as_value().eq(outer.payload)]
        wiring.connect(m, e.o, wiring.flipped(self.o))
        m.d.comb += self.status.eq(e.status)
        return m

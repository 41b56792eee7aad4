"""The clock crossings both MACs (:class:`~mcf.hdl.eth.rgmii.RgmiiMac`,
:class:`~mcf.hdl.eth.tengig.TenGigMac`) make between aclk (``sync``) and their line domains:
a stream through an ``AsyncFIFO``, and the encapsulator's and decapsulator's event records
into :class:`~mcf.hdl.eth.encap.EthCounters` (in aclk). Functions that add the FIFO to the
caller's module and wire it (no component of their own: the FIFO is the only logic). Latency:
the ``AsyncFIFO``'s (a few cycles of both clocks); throughput one word per cycle each side."""

from __future__ import annotations

from amaranth.lib.fifo import AsyncFIFO

from mcf.abi.eth import ETH_EVENT

__all__ = ["async_fifo", "stream_cdc", "events_to_aclk"]

EVENT_FIFO_DEPTH = 4
"""Event records in flight per direction (one per frame)."""


def async_fifo(m, name: str, width: int, depth: int, w_domain: str, r_domain: str) -> AsyncFIFO:
    """An ``AsyncFIFO`` of ``depth`` × ``width`` bits from ``w_domain`` to ``r_domain``, added
    to ``m`` as submodule ``name``."""
    m.submodules[name] = fifo = AsyncFIFO(width=width, depth=depth, w_domain=w_domain,
                                          r_domain=r_domain)
    return fifo


def stream_cdc(m, name: str, src, dst, width: int, depth: int, w_domain: str,
               r_domain: str) -> AsyncFIFO:
    """Stream ``src`` (in ``w_domain``) into stream ``dst`` (in ``r_domain``) through an
    :func:`async_fifo` of ``depth`` × ``width`` bits."""
    f = async_fifo(m, name, width, depth, w_domain, r_domain)
    m.d.comb += [f.w_data.eq(src.payload), f.w_en.eq(src.valid), src.ready.eq(f.w_rdy),
                 dst.payload.eq(f.r_data), dst.valid.eq(f.r_rdy), f.r_en.eq(dst.ready)]
    return f


def events_to_aclk(m, name: str, payload, valid, counter_port, w_domain: str) -> AsyncFIFO:
    """Event records (``payload`` when ``valid``, in ``w_domain``; always taken) into
    ``counter_port`` (an :class:`~mcf.hdl.eth.encap.EthCounters` input, in aclk)."""
    f = async_fifo(m, name, ETH_EVENT.size, EVENT_FIFO_DEPTH, w_domain, "sync")
    m.d.comb += [f.w_data.eq(payload), f.w_en.eq(valid),
                 counter_port.payload.eq(f.r_data), counter_port.valid.eq(f.r_rdy),
                 f.r_en.eq(counter_port.ready)]
    return f

"""The 10G SFP+ link (issue #13 items 3–5; ``docs/eth.md`` §5): :class:`TenGigMac` (the XGMII
MAC between the node's 64-bit link streams and an XGMII port) and :class:`TenGigLink` (the MAC
plus the 10GBASE-R PCS, facing the GTH transceiver's user data).

Clock domains: ``sync`` is the node clock (aclk); ``xg_tx`` is clocked by ``tx_clk`` (the GT's
TX user clock, 10.3125 GHz / ``width``: 161.13 MHz at 64 bits, or any XGMII clock for the MAC
alone), ``xg_rx`` by ``rx_clk`` (the GT's recovered RX user clock). Each domain's reset is the
aclk reset through a :class:`~amaranth.lib.cdc.ResetSynchronizer`; frames, events and status
cross through :class:`~amaranth.lib.fifo.AsyncFIFO` s; ``local_id``/``peer_id`` are
quasi-static (set before traffic) and cross through ``FFSynchronizer`` s.
"""

from amaranth import ClockDomain, ClockSignal, Module, ResetSignal, Signal
from amaranth.hdl import DomainRenamer, EnableInserter
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer, ResetSynchronizer
from amaranth.lib.wiring import In, Out

from mcf.abi.eth import ETH_STATUS, NODE_BITS, PCS_STATUS, XGMII_DATA_BITS, XGMII_LANES
from mcf.abi.framing import beat_layout

from .cdc import async_fifo, events_to_aclk, stream_cdc
from .encap import EthCounters
from .pcs10g import (
    BerMonitor,
    BlockLock,
    Decoder,
    Descrambler,
    Encoder,
    GearboxRx,
    GearboxTx,
    Scrambler,
)
from .rgmii import FrameGate
from .xgmii import EthEncap64, XgmiiDecap, XgmiiRx, XgmiiTx

__all__ = ["TenGigMac", "TenGigLink"]


def _domains(m, tx_clk, rx_clk):
    """``xg_tx``/``xg_rx`` clocked by ``tx_clk``/``rx_clk``, resets from aclk's."""
    m.domains.xg_tx = ClockDomain("xg_tx", async_reset=True)
    m.domains.xg_rx = ClockDomain("xg_rx", async_reset=True)
    m.d.comb += [ClockSignal("xg_tx").eq(tx_clk), ClockSignal("xg_rx").eq(rx_clk)]
    m.submodules.rst_tx = ResetSynchronizer(ResetSignal("sync"), domain="xg_tx")
    m.submodules.rst_rx = ResetSynchronizer(ResetSignal("sync"), domain="xg_rx")


class TenGigMac(wiring.Component):
    """Link frames ↔ XGMII (64 bits).

    TX: ``s_axis`` → :class:`~mcf.hdl.eth.xgmii.EthEncap64` (aclk) → ``AsyncFIFO(16)`` →
    :class:`~mcf.hdl.eth.rgmii.FrameGate` (whole frames, so the transmitter never runs dry)
    → :class:`~mcf.hdl.eth.xgmii.XgmiiTx` (advancing only while ``tx_ce``) → ``xgmii_txd``/
    ``xgmii_txc``. RX: ``xgmii_rxd``/``xgmii_rxc`` (words with ``xgmii_rx_valid``) →
    :class:`~mcf.hdl.eth.xgmii.XgmiiRx` → :class:`~mcf.hdl.eth.xgmii.XgmiiDecap` (4 KiB) →
    ``AsyncFIFO(16)`` → ``m_axis``. One :data:`~mcf.abi.eth.ETH_EVENT` per frame and
    direction crosses to aclk for :class:`~mcf.hdl.eth.encap.EthCounters` (``status``).

    Members (aclk unless named): ``s_axis``/``m_axis`` — link frames (``beat_layout(64)``,
    the node top's ``s_axis_link``/``m_axis_link``); ``local_id``/``peer_id`` —
    ``In(NODE_BITS)``; ``status`` — ``Out(ETH_STATUS)``; ``tx_clk``/``rx_clk`` — ``In(1)``
    the ``xg_tx``/``xg_rx`` clocks; ``tx_ce`` — ``In(1)`` (``xg_tx``) the transmitter
    advances (1 without a gearbox); ``xgmii_txd``/``xgmii_txc`` — ``Out`` (``xg_tx``);
    ``xgmii_rxd``/``xgmii_rxc``/``xgmii_rx_valid`` — ``In`` (``xg_rx``). With
    ``own_domains=False`` (inside :class:`TenGigLink`) there are no clock ports: the parent
    defines ``xg_tx``/``xg_rx``.

    Throughput: line rate both ways (a frame of n bytes every 8 + n + 12 bytes on average)
    while aclk carries 8 bytes per beat at ≥ 156.25 MHz (plus one cycle per frame).
    """

    def __init__(self, *, own_domains: bool = True):
        self._own = own_domains
        clocks = {"tx_clk": In(1), "rx_clk": In(1)} if own_domains else {}
        super().__init__({
            "s_axis": In(stream.Signature(beat_layout(64))),
            "m_axis": Out(stream.Signature(beat_layout(64))),
            "local_id": In(NODE_BITS), "peer_id": In(NODE_BITS),
            "status": Out(ETH_STATUS),
            **clocks, "tx_ce": In(1),
            "xgmii_txd": Out(XGMII_DATA_BITS), "xgmii_txc": Out(XGMII_LANES),
            "xgmii_rxd": In(XGMII_DATA_BITS), "xgmii_rxc": In(XGMII_LANES),
            "xgmii_rx_valid": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        if self._own:
            _domains(m, self.tx_clk, self.rx_clk)
        beat = beat_layout(64)
        ce = self.tx_ce

        # ---- TX ------------------------------------------------------------------------------
        m.submodules.encap = enc = EthEncap64()
        wiring.connect(m, wiring.flipped(self.s_axis), enc.i)
        m.d.comb += [enc.local_id.eq(self.local_id), enc.peer_id.eq(self.peer_id)]
        gate = FrameGate()
        stream_cdc(m, "tx_fifo", enc.o, gate.i, beat.size, 16, "sync", "xg_tx")
        m.submodules.gate = DomainRenamer("xg_tx")(gate)
        xtx = XgmiiTx()
        m.submodules.xgmii_tx = DomainRenamer("xg_tx")(EnableInserter(ce)(xtx))
        m.d.comb += [xtx.i.payload.eq(gate.o.payload), xtx.i.valid.eq(gate.o.valid),
                     gate.o.ready.eq(xtx.i.ready & ce),
                     self.xgmii_txd.eq(xtx.txd), self.xgmii_txc.eq(xtx.txc)]

        # ---- RX ------------------------------------------------------------------------------
        xrx, dec = XgmiiRx(), XgmiiDecap()
        m.submodules.xgmii_rx = DomainRenamer("xg_rx")(xrx)
        m.submodules.decap = DomainRenamer("xg_rx")(dec)
        m.d.comb += [xrx.rxd.eq(self.xgmii_rxd), xrx.rxc.eq(self.xgmii_rxc),
                     xrx.valid.eq(self.xgmii_rx_valid), xrx.o.ready.eq(1),
                     dec.i.payload.eq(xrx.o.payload), dec.i.valid.eq(xrx.o.valid)]
        m.submodules.local_rx = FFSynchronizer(self.local_id, dec.local_id, o_domain="xg_rx")
        stream_cdc(m, "rx_fifo", dec.o, self.m_axis, beat.size, 16, "xg_rx", "sync")

        # ---- counters --------------------------------------------------------------------------
        m.submodules.counters = cnt = EthCounters()
        events_to_aclk(m, "tx_events", xtx.event.payload, xtx.event.valid & ce, cnt.tx_event,
                       "xg_tx")
        events_to_aclk(m, "rx_events", dec.event.payload, dec.event.valid, cnt.rx_event,
                       "xg_rx")
        m.d.comb += self.status.eq(cnt.status)
        return m


class TenGigLink(wiring.Component):
    """The SFP+ link: :class:`TenGigMac` + the 10GBASE-R PCS on a GTH in raw mode.

    TX (``xg_tx``): MAC → :class:`~mcf.hdl.eth.pcs10g.Encoder` →
    :class:`~mcf.hdl.eth.pcs10g.Scrambler` → :class:`~mcf.hdl.eth.pcs10g.GearboxTx` →
    ``gt_txdata``; everything before the gearbox advances on its ``ready``. RX (``xg_rx``):
    ``gt_rxdata`` → :class:`~mcf.hdl.eth.pcs10g.GearboxRx` (slipped by
    :class:`~mcf.hdl.eth.pcs10g.BlockLock`) → :class:`~mcf.hdl.eth.pcs10g.Descrambler` →
    :class:`~mcf.hdl.eth.pcs10g.Decoder` (all /E/ while not locked or ``hi_ber``) → MAC;
    :class:`~mcf.hdl.eth.pcs10g.BerMonitor` on the sync headers.

    Members: as :class:`TenGigMac` for ``s_axis``/``m_axis``/``local_id``/``peer_id``/
    ``status``/``tx_clk``/``rx_clk``; ``pcs_status`` — ``Out(PCS_STATUS)`` (aclk; counted in
    ``xg_rx``, copied across by an ``AsyncFIFO`` of snapshots, a few cycles behind);
    ``gt_txdata`` — ``Out(width)`` (``xg_tx``); ``gt_rxdata`` — ``In(width)`` (``xg_rx``).
    ``width``: the GTH user data width, 32 or 64.
    """

    def __init__(self, width: int = 64, *, ber_window: int | None = None):
        self._width = width
        self._ber_window = ber_window
        super().__init__({
            "s_axis": In(stream.Signature(beat_layout(64))),
            "m_axis": Out(stream.Signature(beat_layout(64))),
            "local_id": In(NODE_BITS), "peer_id": In(NODE_BITS),
            "status": Out(ETH_STATUS), "pcs_status": Out(PCS_STATUS),
            "tx_clk": In(1), "rx_clk": In(1),
            "gt_txdata": Out(width), "gt_rxdata": In(width),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._width
        _domains(m, self.tx_clk, self.rx_clk)
        m.submodules.mac = mac = TenGigMac(own_domains=False)
        wiring.connect(m, wiring.flipped(self.s_axis), mac.s_axis)
        wiring.connect(m, mac.m_axis, wiring.flipped(self.m_axis))
        m.d.comb += [mac.local_id.eq(self.local_id), mac.peer_id.eq(self.peer_id),
                     self.status.eq(mac.status)]

        # ---- TX ------------------------------------------------------------------------------
        gbx = GearboxTx(w)
        m.submodules.gearbox_tx = DomainRenamer("xg_tx")(gbx)
        enc, scr = Encoder(), Scrambler()
        m.submodules.encoder = DomainRenamer("xg_tx")(EnableInserter(gbx.ready)(enc))
        m.submodules.scrambler = DomainRenamer("xg_tx")(EnableInserter(gbx.ready)(scr))
        m.d.comb += [mac.tx_ce.eq(gbx.ready),
                     enc.i.data.eq(mac.xgmii_txd), enc.i.ctrl.eq(mac.xgmii_txc),
                     self.gt_txdata.eq(gbx.data)]
        wiring.connect(m, enc.o, scr.i)
        wiring.connect(m, scr.o, gbx.i)

        # ---- RX ------------------------------------------------------------------------------
        grx, lock, des, dec = GearboxRx(w), BlockLock(), Descrambler(), Decoder()
        ber = BerMonitor() if self._ber_window is None else BerMonitor(self._ber_window)
        for name, c in (("gearbox_rx", grx), ("block_lock", lock), ("descrambler", des),
                        ("decoder", dec), ("ber", ber)):
            m.submodules[name] = DomainRenamer("xg_rx")(c)
        wiring.connect(m, grx.o, lock.i, ber.i, des.i)     # one driver, three receivers
        wiring.connect(m, des.o, dec.i)
        m.d.comb += [grx.data.eq(self.gt_rxdata), grx.slip.eq(lock.slip),
                     ber.block_lock.eq(lock.block_lock),
                     dec.force_error.eq(~lock.block_lock | ber.hi_ber),
                     mac.xgmii_rxd.eq(dec.o.data), mac.xgmii_rxc.eq(dec.o.ctrl),
                     mac.xgmii_rx_valid.eq(dec.o.valid)]

        # ---- PCS status: counted in xg_rx, snapshots to aclk ------------------------------------
        errored = Signal(32)
        losses = Signal(32)
        with m.If(dec.error & ~errored.all()):
            m.d.xg_rx += errored.eq(errored + 1)
        with m.If(lock.lost & ~losses.all()):
            m.d.xg_rx += losses.eq(losses + 1)
        st = Signal(PCS_STATUS)
        m.d.comb += [st.block_lock.eq(lock.block_lock), st.hi_ber.eq(ber.hi_ber),
                     st.ber_count.eq(ber.ber_count), st.errored_blocks.eq(errored),
                     st.lock_losses.eq(losses)]
        snap = async_fifo(m, "pcs_status_fifo", PCS_STATUS.size, 4, "xg_rx", "sync")
        m.d.comb += [snap.w_data.eq(st), snap.w_en.eq(1), snap.r_en.eq(1)]
        with m.If(snap.r_rdy):
            m.d.sync += self.pcs_status.eq(snap.r_data)
        return m

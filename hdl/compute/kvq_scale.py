"""Scale arithmetic of the KV emitter (:mod:`.attention_kvq`, paper §5 prefill path): an
absmax → its KV_SCALE code and the quantiser's reciprocal (:func:`mcf.abi.kv.quantize_kv_rows`
and :func:`mcf.abi.kv.quantize_k_channels` bit for bit), and the PER_CHANNEL_K pipeline that
turns one channel per cycle into its per-lane quantisation parameters.
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.kv import KV_ELEM, KV_SCALE, KVQ_SCALE_SHIFT, kvq_scale_mult
from mcf.abi.kv_channel import PRESCALE_SHIFT_BASE
from mcf.abi.quant import ACT
from mcf.abi.softmax import RECIP_FRAC, RECIP_IN_BITS

from .recip import Recip

__all__ = ["HALF", "KVQ_LANES", "PAR_RMUL_BITS", "PAR_SHIFT_BITS", "KvqChannelParams",
           "KvqScaleUnit", "kvq_par_layout"]

KVQ_LANES = 4
"""ACT elements per input beat; 4 INT4 codes make one 16-bit unit of the payload."""
HALF = 16
"""Bits of one payload unit (a scale code, or four INT4 codes)."""
PAR_RMUL_BITS = RECIP_IN_BITS + 4
"""Quantiser multiplier of a parameter set: 7 · r (closed) or r (open-group prescale)."""
PAR_SHIFT_BITS = 6
"""Rounding shift of a parameter set."""


class KvqScaleUnit(wiring.Component):
    """Absmax → scale code and reciprocal, through one shared :class:`~.recip.Recip`.

    Members
    -------
    a : In(ACT.width)
        The absmax of a row or channel (or a header scale code, for its reciprocal).
    lead : Out(range(ACT.width + 1))
        Bit length of ``a``.
    sc, over, zero : Out
        The KV_SCALE code ``clamp(round(a · mult), 1, max)``, whether it saturated, ``a == 0``.
    r : Out(PAR_RMUL_BITS); rmul : Out(PAR_RMUL_BITS)
        The reciprocal of ``a`` normalised to ``RECIP_IN_BITS`` bits, and ``7 · r``.

    Latency: ``lead``, ``sc``, ``over``, ``zero`` combinational; ``r``, ``rmul`` for the ``a``
    of ``LATENCY`` (:class:`~.recip.Recip`'s, 3) cycles earlier; fully pipelined.
    """

    LATENCY = Recip.LATENCY

    def __init__(self):
        super().__init__({
            "a": In(ACT.width), "lead": Out(range(ACT.width + 1)),
            "sc": Out(KV_SCALE.width), "over": Out(1), "zero": Out(1),
            "r": Out(PAR_RMUL_BITS), "rmul": Out(PAR_RMUL_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        a, lead = self.a, self.lead
        m.submodules.recip = recip = Recip()
        for b in range(ACT.width):
            with m.If(a[b]):
                m.d.comb += lead.eq(b + 1)            # bit length
        norm = ((a << RECIP_IN_BITS) >> lead)[:RECIP_IN_BITS]    # normalisation
        m.d.comb += recip.x.eq(Mux(a == 0, 1 << (RECIP_IN_BITS - 1), norm))
        s_full = Signal(ACT.width + 20)
        m.d.comb += s_full.eq((a * kvq_scale_mult() + (1 << (KVQ_SCALE_SHIFT - 1)))
                              >> KVQ_SCALE_SHIFT)
        over = s_full > KV_SCALE.max_int
        m.d.comb += [self.over.eq(over), self.zero.eq(a == 0),
                     self.sc.eq(Mux(over, KV_SCALE.max_int, Mux(s_full < 1, 1, s_full))),
                     self.r.eq(recip.r), self.rmul.eq(recip.r * KV_ELEM.max_int)]
        return m


def kvq_par_layout() -> data.StructLayout:
    """One lane's quantisation parameters (the ``cpar`` memory's lane word)."""
    return data.StructLayout({"rmul": PAR_RMUL_BITS, "rsh": PAR_SHIFT_BITS, "zero": 1})


class KvqChannelParams(wiring.Component):
    """PER_CHANNEL_K channel pipeline: one channel per cycle through :class:`KvqScaleUnit`.

    Members
    -------
    issue, chan : In
        Channel ``chan`` is presented to the scale unit this cycle.
    lead, sc, over, zero, r, rmul : In
        The scale unit's outputs (``lead`` … ``zero`` for this cycle's channel, ``r`` /
        ``rmul`` for the channel issued ``LATENCY`` cycles earlier).
    opened : In(1)
        The group is open: the parameters are the header's prescale (``r``, shift
        ``PRESCALE_SHIFT_BASE + lead``) and no scale code is written; else the quantiser's
        (``7 · r``, ``RECIP_FRAC − RECIP_IN_BITS + lead``, zero flag) and the channel's scale.
    par_addr, par_data, par_en : Out
        Write of the channel's parameters (``kvq_par_layout``, replicated over the
        ``KVQ_LANES`` lanes, lane-enable ``par_en``) into the per-channel parameter memory.
    sc_we, sc_addr, sc_data, sc_en : Out
        Write of the channel's scale code into the header memory (``sc_we``: closed groups).
    sat : Out(1)
        A written scale saturated.
    busy : Out(1)
        A channel is in the pipeline.

    Latency: a channel's writes are presented ``KvqScaleUnit.LATENCY`` cycles after its
    ``issue``; one channel per cycle.
    """

    def __init__(self, head_dim: int):
        self.head_dim = head_dim
        NL, D = KVQ_LANES, head_dim
        PW = kvq_par_layout().size
        super().__init__({
            "issue": In(1), "chan": In(range(D + 1)), "lead": In(range(ACT.width + 1)),
            "sc": In(KV_SCALE.width), "over": In(1), "zero": In(1),
            "r": In(PAR_RMUL_BITS), "rmul": In(PAR_RMUL_BITS), "opened": In(1),
            "par_addr": Out(range(D // NL)), "par_data": Out(NL * PW), "par_en": Out(NL),
            "sc_we": Out(1), "sc_addr": Out(range(D // NL)), "sc_data": Out(NL * HALF),
            "sc_en": Out(NL), "sat": Out(1), "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        D, NL, LAT = self.head_dim, KVQ_LANES, KvqScaleUnit.LATENCY
        LB = (NL - 1).bit_length()
        stage = data.StructLayout({"v": 1, "c": range(D), "lead": range(ACT.width + 1),
                                   "sc": KV_SCALE.width, "over": 1, "zero": 1})
        d = [Signal(stage, name=f"cp{i}") for i in range(LAT)]
        m.d.sync += [d[0].v.eq(self.issue), d[0].c.eq(self.chan), d[0].lead.eq(self.lead),
                     d[0].sc.eq(self.sc), d[0].over.eq(self.over), d[0].zero.eq(self.zero)]
        m.d.sync += [d[i].eq(d[i - 1]) for i in range(1, LAT)]
        out = d[-1]
        par_closed = Cat(self.rmul, (RECIP_FRAC - RECIP_IN_BITS + out.lead)[:PAR_SHIFT_BITS],
                         out.zero)
        par_open = Cat(self.r, (PRESCALE_SHIFT_BASE + out.lead)[:PAR_SHIFT_BITS], Const(0, 1))
        par = Mux(self.opened, par_open, par_closed)
        m.d.comb += [self.par_addr.eq(out.c >> LB), self.par_data.eq(Cat(*[par] * NL)),
                     self.sc_addr.eq(out.c >> LB), self.sc_data.eq(Cat(*[out.sc] * NL)),
                     self.busy.eq(Cat(*[s.v for s in d]).any())]
        with m.If(out.v):
            m.d.comb += self.par_en.eq(Const(1, NL) << out.c[:LB])
            with m.If(~self.opened):
                m.d.comb += [self.sc_we.eq(1), self.sc_en.eq(Const(1, NL) << out.c[:LB]),
                             self.sat.eq(out.over)]
        return m

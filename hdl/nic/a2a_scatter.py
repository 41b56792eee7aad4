"""Scatter side of the all-to-all engine (paper §5 compute-NIC, :mod:`.all_to_all`): one local
tensor packet of ``num_nodes × part`` bytes re-framed into ``num_nodes`` part packets, part ``j``
addressed to node ``j`` (``dst = seq = j``, ``route_id + j``).
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.framing import parsed_layout
from mcf.abi.nic import A2A_STATUS

__all__ = ["A2AScatter", "DIV_STEPS", "SCATTER_COUNTERS", "scatter_div_steps",
           "scatter_stage_layout"]

DIV_STEPS = 3
"""Quotient bits of the scatter's ``length // num_nodes`` computed per pipeline stage."""

SCATTER_COUNTERS = ("scatter_ops", "scatter_drops", "parts_sent")
"""The fields of :data:`mcf.abi.nic.A2A_STATUS` the scatter side counts."""


def scatter_div_steps(length_width: int) -> list[int]:
    """Division steps (quotient bits) per scatter stage for a ``length`` of ``length_width``
    bits: :data:`DIV_STEPS`, the first stage ``DIV_STEPS - 1`` (it also forms the divisor from
    ``num_nodes``), the rest last."""
    left = length_width - (DIV_STEPS - 1)
    return [DIV_STEPS - 1] + [min(DIV_STEPS, left - k) for k in range(0, left, DIV_STEPS)]


def scatter_stage_layout(beat: data.StructLayout, max_nodes: int) -> data.StructLayout:
    """One stage of the scatter pipeline: the beat (``valid``, ``beat``), whether
    ``num_nodes`` is out of range (``n_bad``), the divisor ``den`` and the restoring division's
    remainder ``rem`` and quotient ``q`` of the beat's ``length`` so far."""
    nw = max_nodes.bit_length()
    return data.StructLayout({"valid": 1, "beat": beat, "n_bad": 1, "den": nw, "rem": nw,
                              "q": beat["meta"].shape["length"].shape})


class A2AScatter(wiring.Component):
    """Scatter re-framing of the all-to-all engine.

    Members
    -------
    scatter : In(stream.Signature(parsed_layout(data_width, meta_layout)))
        Local tensors to scatter.
    net : Out(stream.Signature(parsed_layout(data_width, meta_layout)))
        The parts: ``dst = seq = j``, ``src = local_id``, ``route_id + j``,
        ``length = length // num_nodes``, ``last`` on each part's last beat.
    local_id : In(node); num_nodes : In(node + 1)
        Node identity.
    status : Out(StructLayout of the ``A2A_STATUS`` fields in :data:`SCATTER_COUNTERS`)
        ``scatter_ops`` (scatters framed), ``scatter_drops`` (scatters whose length is not
        ``num_nodes`` whole-beat parts of at most ``part_max`` bytes, or ``num_nodes`` outside
        ``1..max_nodes``: dropped whole), ``parts_sent``.

    Latency: :attr:`latency` cycles from a beat's acceptance to its part beat on ``net`` (the
    division's stages — ``length // num_nodes`` by restoring division, at most
    :data:`DIV_STEPS` quotient bits per stage, the head's quotient is the one used — plus the
    stage registering the head's drop decision); 1 beat/cycle, ``scatter.ready`` depends
    combinationally on ``net.ready`` (one common pipeline advance).
    """

    def __init__(self, *, data_width: int, max_nodes: int, part_max: int,
                 meta_layout: data.StructLayout):
        self._bpb, self._max_nodes, self._part_max = data_width // 8, max_nodes, part_max
        self._meta_layout = meta_layout
        beat = parsed_layout(data_width, meta_layout)
        node = meta_layout["src"].width
        super().__init__({
            "scatter": In(stream.Signature(beat)), "net": Out(stream.Signature(beat)),
            "local_id": In(node), "num_nodes": In(node + 1),
            "status": Out(data.StructLayout({n: A2A_STATUS[n].shape
                                             for n in SCATTER_COUNTERS})),
        })

    @property
    def latency(self) -> int:
        """Cycles from a scatter beat's acceptance to its part beat on ``net`` (``net``
        ready): the division's stages plus the drop decision's."""
        return len(scatter_div_steps(self._meta_layout["length"].width)) + 1

    def elaborate(self, platform):
        m = Module()
        st = self.status
        N = self._max_nodes
        lw = self._meta_layout["length"].width
        log_bpb = (self._bpb - 1).bit_length()
        # The scatter stream first passes the pipeline (one common advance, so 1 beat/cycle)
        # along which every beat's length // num_nodes is computed; the last stage registers
        # the head's drop decision.
        nw = N.bit_length()             # the divisor: num_nodes when in 1..N (else 1: dropped)
        steps = scatter_div_steps(lw)
        layout = scatter_stage_layout(self.scatter.payload.shape(), N)
        stage = [Signal(layout, name=f"sp{k}") for k in range(len(steps) + 1)]
        sc_in, sc, net = self.scatter, stage[-1], self.net
        s_adv = Signal()
        m.d.comb += sc_in.ready.eq(s_adv)
        n_in = self.num_nodes
        # stage 0 takes whether num_nodes is out of range and the divisor (num_nodes, else 1:
        # such a scatter is dropped, its parts' length is never valid on ``net``)
        n_bad = (n_in == 0) | (n_in > N)
        prev = Signal(layout, name="sp_in")
        m.d.comb += [prev.valid.eq(sc_in.valid), prev.beat.eq(sc_in.payload),
                     prev.n_bad.eq(n_bad), prev.den.eq(Mux(n_bad, 1, n_in)[:nw])]
        for k, st_k in enumerate(stage):
            length = prev.beat.meta.length
            rem, q = prev.rem, prev.q
            if k < len(steps):
                done = sum(steps[:k])
                for t in range(done, done + steps[k]):
                    r2 = Cat(length[lw - 1 - t], rem)
                    ge = r2 >= prev.den
                    rem = Mux(ge, r2 - prev.den, r2)[:nw]
                    q = Cat(ge, q[:-1])
            with m.If(s_adv):
                m.d.sync += [st_k.valid.eq(prev.valid), st_k.beat.eq(prev.beat),
                             st_k.n_bad.eq(prev.n_bad), st_k.den.eq(prev.den),
                             st_k.rem.eq(rem), st_k.q.eq(q)]
            prev = st_k
        # the last stage holds length // num_nodes (q) and the remainder of the stage before it
        pre = stage[-2]
        bad = Signal()
        plen = sc.q
        with m.If(s_adv):
            m.d.sync += bad.eq(pre.n_bad | (pre.q == 0) | (pre.rem != 0)
                               | (pre.q[:log_bpb] != 0) | (pre.q > self._part_max)
                               | (pre.beat.keep == 0))
        # the part being framed: inside a tensor (s_in) its registers, on the head beat the
        # head's decision
        s_in = Signal()
        s_drop = Signal()
        s_j = Signal(range(N + 1))
        s_pb = Signal(lw)
        s_pbeats = Signal(lw)
        s_plen = Signal(lw)
        cur_drop = Mux(s_in, s_drop, bad)
        cur_j = Mux(s_in, s_j, 0)
        cur_pb = Mux(s_in, s_pb, 0)
        cur_pbeats = Mux(s_in, s_pbeats, plen >> log_bpb)
        cur_plen = Mux(s_in, s_plen, plen)
        end_part = cur_pb + 1 == cur_pbeats
        m.d.comb += [
            net.valid.eq(sc.valid & ~cur_drop),
            s_adv.eq(~sc.valid | net.ready | cur_drop),
            net.payload.eq(sc.beat),
            net.payload.meta.dst.eq(cur_j), net.payload.meta.src.eq(self.local_id),
            net.payload.meta.route_id.eq(sc.beat.meta.route_id + cur_j),
            net.payload.meta.length.eq(cur_plen), net.payload.meta.seq.eq(cur_j),
            net.payload.last.eq(end_part),
        ]
        s_fire = sc.valid & (net.ready | cur_drop)
        with m.If(s_fire):
            m.d.sync += [s_in.eq(~sc.beat.last), s_drop.eq(cur_drop), s_pbeats.eq(cur_pbeats),
                         s_plen.eq(cur_plen)]
            with m.If(end_part):
                m.d.sync += [s_pb.eq(0), s_j.eq(cur_j + 1)]
            with m.Else():
                m.d.sync += [s_pb.eq(cur_pb + 1), s_j.eq(cur_j)]
            with m.If(~s_in):
                with m.If(bad):
                    m.d.sync += st.scatter_drops.eq(st.scatter_drops + 1)
                with m.Else():
                    m.d.sync += st.scatter_ops.eq(st.scatter_ops + 1)
        with m.If(net.valid & net.ready & end_part):
            m.d.sync += st.parts_sent.eq(st.parts_sent + 1)
        return m

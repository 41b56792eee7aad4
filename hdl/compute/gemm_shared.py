"""The GEMM on arrays it shares (issue #33; docs/attention.md "The arrays' attention products"):
:class:`~.gemm.GemmEngine` (``shared=True``) as client 0 of an :class:`~.array_share.ArrayShare`
whose other clients are prefill attention's S and P·V (:class:`~.array_score.ArrayScore`,
:class:`~.array_pv.ArrayPV`) — the form the GEMM takes in :class:`~.gemm_top.MatrixEngine` when
the node's tiled prefill runs on the GEMM's arrays."""

from __future__ import annotations

from amaranth import Module
from amaranth.lib import wiring

from .array_share import ArrayShare
from .gemm import GemmEngine

__all__ = ["SharedGemm"]


class SharedGemm(wiring.Component):
    """A :class:`~.gemm.GemmEngine` on its arrays behind an :class:`~.array_share.ArrayShare` of
    ``clients`` ports, port 0 the engine's.

    Parameters: ``clients`` and :class:`~.gemm.GemmEngine`'s (``shared`` implied; ``chain``,
    ``dsp`` build the share's arrays).

    Members
    -------
    job, x_in, w_in, o, busy, status : the engine's (:class:`~.gemm.GemmEngine`).
    c{n}_st, c{n}_res, 1 ≤ n < ``clients`` : the share's other client ports
        (:class:`~.array_share.ArrayShare`: whole dot products of whole groups in, each
        client's results back in its step order; results must be taken).

    Latency: the engine's, with the share's arrays (a switch between clients costs no cycle);
    the engine's dot products wait while another client's dot product is issued.
    """

    def __init__(self, clients: int = 1, **kw):
        self.engine = e = GemmEngine(shared=True, **kw)
        self.beat, self.w_width = e.beat, e.w_width
        self.rows, self.lanes, self.group, self.n_arrays = e.rows, e.lanes, e.group, e.n_arrays
        self.share = ArrayShare(clients, e.n_arrays, e.rows, e.lanes, e.group,
                                kw.get("chain", 1), kw.get("dsp", "fabric"))
        members = {k: v for k, v in e.signature.members.items() if k not in ("st", "res")}
        for n in range(1, clients):
            for part in ("st", "res"):
                members[f"c{n}_{part}"] = self.share.signature.members[f"c{n}_{part}"]
        self.clients = clients
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        e, sh = self.engine, self.share
        m.submodules.engine, m.submodules.share = e, sh
        wiring.connect(m, e.st, sh.c0_st)
        wiring.connect(m, sh.c0_res, e.res)
        for name in ("job", "x_in", "w_in"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(e, name))
        wiring.connect(m, e.o, wiring.flipped(self.o))
        m.d.comb += [self.busy.eq(e.busy), self.status.eq(e.status)]
        for n in range(1, self.clients):
            wiring.connect(m, wiring.flipped(getattr(self, f"c{n}_st")), getattr(sh, f"c{n}_st"))
            wiring.connect(m, getattr(sh, f"c{n}_res"),
                           wiring.flipped(getattr(self, f"c{n}_res")))
        return m

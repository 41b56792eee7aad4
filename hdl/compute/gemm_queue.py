"""The GEMM engine's job queue: a ring of accepted job descriptors read by the engine's four
walkers in job order — activation loader, tile loader, issuer, epilogue (paper §5 compute
engine; descriptor :data:`mcf.abi.compute.GEMM_JOB`, limits :class:`mcf.abi.compute.GemmLimits`).
"""

from __future__ import annotations

from amaranth import Array, Module, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from mcf.abi.compute import GEMM_JOB, GemmLimits
from mcf.abi.quant import SCALE_EXP_BITS

__all__ = ["WALKERS", "GemmJobQueue", "queued_job_layout"]

WALKERS = ("x", "l", "i", "e")
"""The queue's readers: activation loader, tile loader, issuer, epilogue."""


def queued_job_layout(m_max: int, ks_max: int) -> data.StructLayout:
    """A queued job: :data:`mcf.abi.compute.GEMM_JOB`'s fields, as wide as an accepted job
    needs."""
    return data.StructLayout({
        "m_count": range(m_max + 1),
        "k_steps": range(ks_max + 1),
        "n_tiles": GEMM_JOB["n_tiles"].shape,
        "w_exp": signed(SCALE_EXP_BITS),
        "acc_in": 1,
        "acc_out": 1,
    })


class GemmJobQueue(wiring.Component):
    """``jobs`` slots (a power of 2) with a wrap bit on every pointer. A job the ``limits``
    refuse is taken and dropped (``rejected``).

    Members
    -------
    job : In(stream.Signature(:data:`mcf.abi.compute.GEMM_JOB`))
        Descriptors; ``ready`` while a slot is free (the epilogue's pointer frees it).
    x_ptr, l_ptr, i_ptr, e_ptr : In(range(2 · jobs))
        Each walker's pointer (the walker advances it when done with a job).
    tail : Out(range(2 · jobs))
        The next slot written: a walker whose pointer equals it has no job.
    x_job, l_job, i_job, e_job : Out(:func:`queued_job_layout`)
        The job at each walker's pointer (combinational).
    busy : Out(1)
        A job is queued or in flight (``tail`` ≠ ``e_ptr``).
    accepted, rejected : Out(1)
        A descriptor was queued / dropped this cycle.

    Latency: a descriptor is readable the cycle after it is taken.
    """

    def __init__(self, limits: GemmLimits, jobs: int):
        if jobs < 2 or jobs & (jobs - 1):
            raise ValueError("the job queue depth must be a power of 2, at least 2")
        self.limits, self.jobs = limits, jobs
        self.layout = queued_job_layout(limits.m_max, limits.k_max // limits.lanes)
        ptr = range(2 * jobs)
        members = {"job": In(stream.Signature(GEMM_JOB)), "tail": Out(ptr), "busy": Out(1),
                   "accepted": Out(1), "rejected": Out(1)}
        for w in WALKERS:
            members[f"{w}_ptr"] = In(ptr)
            members[f"{w}_job"] = Out(self.layout)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        J = self.jobs
        pbits = J.bit_length()                      # one wrap bit
        fields = {f: Array(Signal(self.layout[f].shape, name=f"job{i}_{f}") for i in range(J))
                  for f in self.layout.members}
        wp, ep = self.tail, self.e_ptr
        jp = self.job.payload
        ok = Signal()
        m.d.comb += [
            ok.eq(self.limits.accepts(jp.m_count, jp.k_steps, jp.n_tiles)),
            self.job.ready.eq((wp - ep)[:pbits] != J),
            self.busy.eq(wp != ep),
            self.accepted.eq(self.job.valid & self.job.ready & ok),
            self.rejected.eq(self.job.valid & self.job.ready & ~ok),
        ]
        for w in WALKERS:
            slot = getattr(self, f"{w}_ptr")[:pbits - 1]
            view = getattr(self, f"{w}_job")
            m.d.comb += [getattr(view, f).eq(arr[slot]) for f, arr in fields.items()]
        with m.If(self.accepted):
            m.d.sync += [arr[wp[:pbits - 1]].eq(getattr(jp, f)) for f, arr in fields.items()]
            m.d.sync += wp.eq(wp + 1)
        return m

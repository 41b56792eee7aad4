"""``mcf bench``: the project's measured figures (cycles from simulation, resources from
:mod:`mcf.sim.synth`), one module per bench: :mod:`.packet`, :mod:`.nic`, :mod:`.compute`,
:mod:`.attention`, :mod:`.csr`, :mod:`.plan` (MARS cost model).

Contract of a bench module:

* ``collect(small: bool = False, synth: bool = True) -> dict`` measures and returns one
  JSON-serialisable object. ``small`` runs the reduced sizes CI uses (same code path, fewer
  packets/jobs); ``synth=False`` skips the yosys resource estimates (``resources`` is then
  absent). Every rate is computed from output checked bit-exact against the golden model; a
  mismatch, or any status counter showing a drop, reject or watchdog trip the bench did not plan,
  raises :class:`BenchRefused` — no figure is returned.
* ``render(result: dict) -> str`` formats the object as the human-readable table.

Resources come from :func:`mcf.sim.synth.resources` only (one counting rule).
"""

from __future__ import annotations

__all__ = ["BENCHES", "BenchRefused", "refuse_unplanned"]

BENCHES = ("packet", "nic", "compute", "attention", "csr", "plan")


class BenchRefused(RuntimeError):
    """A bench saw an unplanned drop or a mismatch and refuses to report a figure."""


def refuse_unplanned(what: str, counters: dict[str, int], planned: dict[str, int] | None = None):
    """Raise :class:`BenchRefused` unless every counter in ``counters`` equals its planned value
    (``planned``; a counter not named there must be 0)."""
    planned = planned or {}
    bad = {k: v for k, v in counters.items() if v != planned.get(k, 0)}
    if bad:
        want = {k: planned.get(k, 0) for k in bad}
        raise BenchRefused(f"{what}: unplanned counter values {bad} (planned {want})")

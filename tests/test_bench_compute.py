"""The compute bench refuses to report figures from a run it cannot vouch for: a job checked
against the wrong weights (mismatch) and a job descriptor the engine rejects (unplanned
``bad_jobs``) each make ``collect`` raise BenchRefused (sim/perf/compute.py)."""

import pytest

from mcf.sim.perf import BenchRefused, compute


def test_sequences_cover_qwen_projections():
    for small in (False, True):
        prefill, decode, *alone = compute.sequences(small)
        assert [a["name"] for a in alone] == ([] if small else ["q_alone", "down_alone"])
        want = ["q", "k", "v", "gate", "up"] + ([] if small else ["down"])
        assert [j["proj"] for j in prefill["jobs"]] == want
        assert [j["proj"] for j in decode["jobs"]][-1] == "down"
        assert {j["m"] for j in decode["jobs"]} == {1}
        assert decode["jobs"][-1]["k"] == 8960 and prefill["jobs"][0]["k"] == 1536


@pytest.mark.parametrize("kind", ["weights", "bad_job"])
def test_sabotaged_run_refused(kind):
    with pytest.raises(BenchRefused) as exc:
        compute.collect(small=True, synth=False,
                        sabotage=[{"sequence": 1, "job": 2, "kind": kind}])
    assert ("jobs [2]" if kind == "weights" else "bad_jobs") in str(exc.value)

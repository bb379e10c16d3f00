"""Per-job/per-node isolation around the engine: a record that makes the policy code raise costs only that record.

The real ``decide`` runs; the fault is a wrapper that raises for a marked record the way a parser or rule bug
would (the real parser no longer raises on the comments we know; the isolator must hold for the next bug too).
"""

from __future__ import annotations

from dataclasses import replace

from nuro.slurm.models import ClusterSnapshot
from nuro.slurm_plugins.controller.cycle import ControllerState
from nuro.slurm_plugins.controller.engine import decide
from nuro.slurm_plugins.controller.isolation import Isolator
from tests.unit.test_engine_builders import NOW, a_cluster, a_job, a_policy

POLICY = a_policy(32).team("a", quota=16, borrow=8, lend=8).team("b", quota=16, borrow=8, lend=8).build()
MARK = "boom"


def faulty(snap: ClusterSnapshot, needs_context: bool = False):
    """``decide``, raising for a job named ``MARK``; with ``needs_context`` only while a pending job of team b is
    also there (like a victim's comment that is parsed only when someone needs room)."""
    names = {j.name for j in snap.jobs}
    if any(MARK in n for n in names) and (not needs_context or "wanting" in names):
        raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
    if any(n.name == "n03" and n.gres == "gpu:bad" for n in snap.nodes):
        raise KeyError("gpu:bad")
    return decide(snap, POLICY, ControllerState(), NOW)


def _snapshot(bad_name: str = f"job3-{MARK}"):
    snap = (
        a_cluster()
        .nodes(4)
        .jobs(a_job(1).running_on("n01"), a_job(2).running_on("n02"), a_job(3).running_on("n03"),
              a_job(10).over_quota(), a_job(11).team("b").pending())
        .build()
    )  # fmt: skip
    jobs = tuple(replace(j, name=bad_name) if j.job_id == 3 else j for j in snap.jobs)
    jobs = tuple(replace(j, name="wanting") if j.job_id == 11 else j for j in jobs)
    return replace(snap, jobs=jobs)


def test_only_the_bad_job_is_skipped_and_the_others_still_get_decisions() -> None:
    iso = Isolator()
    snap = _snapshot()
    result, new, released, error = iso.run(snap, faulty)
    assert error == "" and [s.job_id for s in new] == [3] and released == []
    assert "RecursionError" in new[0].error and "job=3 skipped" in new[0].describe()
    assert result is not None and all(d.job_id != 3 for d in iso.filter(result))
    clean = decide(replace(snap, jobs=tuple(j for j in snap.jobs if j.job_id != 3)), POLICY, ControllerState(), NOW)
    assert list(iso.filter(result)) == list(clean) and len(clean) > 0  # as if job 3 were not there


def test_the_culprit_is_found_when_it_raises_only_next_to_another_job() -> None:
    iso = Isolator()
    result, new, _, _ = iso.run(_snapshot(), lambda s: faulty(s, needs_context=True))
    assert [s.job_id for s in new] == [3] and result is not None


def test_a_quarantined_job_is_not_searched_again_nor_logged_again_until_its_record_changes() -> None:
    iso = Isolator()
    snap = _snapshot()
    iso.run(snap, faulty)
    calls = []

    def counting(s):
        calls.append(1)
        return faulty(s)

    result, new, released, _ = iso.run(snap, counting)
    assert result is not None and new == [] and released == [] and len(calls) == 1  # one decide, no search
    fixed = replace(snap, jobs=tuple(replace(j, name="job3") if j.job_id == 3 else j for j in snap.jobs))
    result, new, released, _ = iso.run(fixed, faulty)
    assert [s.job_id for s in released] == [3] and new == [] and 3 not in iso.jobs


def test_a_bad_node_record_costs_only_that_node() -> None:
    iso = Isolator()
    snap = _snapshot(bad_name="job3")
    snap = replace(snap, nodes=tuple(replace(n, gres="gpu:bad") if n.name == "n03" else n for n in snap.nodes))
    result, new, _, error = iso.run(snap, faulty)
    assert error == "" and [s.node for s in new] == ["n03"] and result is not None


def test_a_failure_no_single_record_explains_skips_the_cycle_with_the_error() -> None:
    def always(_snap):
        raise ValueError("policy bug")

    result, new, _, error = Isolator().run(_snapshot(bad_name="job3"), always)
    assert result is None and new == [] and "policy bug" in error

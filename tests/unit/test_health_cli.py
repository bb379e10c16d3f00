"""nuro-healthcheck's pure parts: settings from the node env, the drain/resume plan, disk and agent-age readers."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from nuro.healthcheck.act import plan_node_action
from nuro.healthcheck.checks import Problem
from nuro.healthcheck.run import HealthSettings, Outcome, agent_age_s, disk_free_bytes
from nuro.healthcheck.statusfile import write_status
from nuro.slurm import DrainNode, ResumeNode

GIB = 1 << 30


def test_settings_defaults() -> None:
    s = HealthSettings.from_env({})
    assert (s.expected_gpus, s.probe, s.staging_root, s.agent_status_dir) == (
        None,
        "auto",
        "/var/tmp/nuro-staging",
        None,
    )
    assert s.staging_min_free_bytes == 20 * GIB
    assert s.limits.max_temperature_c == 90


def test_settings_from_env() -> None:
    s = HealthSettings.from_env(
        {
            "NURO_EXPECT_GPUS": "8",
            "NURO_HEALTH_PROBE": "none",
            "NURO_STAGING_ROOT": "/nvme/stage",
            "NURO_STAGING_MIN_FREE_GB": "0.5",
            "NURO_AGENT_STATUS_DIR": "/run/nuro-agent",
            "NURO_HEALTH_MAX_TEMPERATURE_C": "85",
            "NURO_AGENT_SILENT_S": "4",
        }
    )
    assert s.expected_gpus == 8 and s.probe == "none" and s.staging_root == "/nvme/stage"
    assert s.staging_min_free_bytes == GIB // 2 and s.agent_status_dir == "/run/nuro-agent"
    assert s.limits.max_temperature_c == 85 and s.limits.agent_silent_s == 4.0


@pytest.mark.parametrize("name,value", [("NURO_EXPECT_GPUS", "eight"), ("NURO_STAGING_MIN_FREE_GB", "-1")])
def test_bad_settings_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        HealthSettings.from_env({name: value})


def _outcome(*messages: str) -> Outcome:
    return Outcome("gpu003", "periodic", tuple(Problem("x", m) for m in messages), None, None, None)


HOT = "gpu1: temperature 93 C ≥ 90 C"
PLANS = {
    "unhealthy, not drained -> drain": (
        _outcome(HOT),
        False,
        None,
        "drained",
        DrainNode("gpu003", f"nuro-health: {HOT}"),
    ),
    "unhealthy, our other reason -> update": (
        _outcome(HOT),
        True,
        "nuro-health: gpu count 7, expected 8",
        "drained",
        DrainNode("gpu003", f"nuro-health: {HOT}"),
    ),
    "unhealthy, our same reason -> nothing": (_outcome(HOT), True, f"nuro-health: {HOT}", "none", None),
    "unhealthy, admin drain -> keep": (_outcome(HOT), True, "fan replaced, testing", "kept-admin-drain", None),
    "healthy, our drain -> resume": (_outcome(), True, f"nuro-health: {HOT}", "resumed", ResumeNode("gpu003")),
    "healthy, admin drain -> keep": (_outcome(), True, "maintenance", "none", None),
    "healthy, not drained -> nothing": (_outcome(), False, None, "none", None),
}


@pytest.mark.parametrize("outcome,drained,reason,want_name,want_action", PLANS.values(), ids=PLANS.keys())
def test_plan_node_action(outcome, drained, reason, want_name, want_action) -> None:  # noqa: ANN001
    name, action, _detail = plan_node_action(outcome, drained, reason)
    assert (name, action) == (want_name, want_action)


def test_disk_free_of_a_dir_not_created_yet(tmp_path: Path) -> None:
    free = disk_free_bytes(str(tmp_path / "not" / "yet"))
    st = os.statvfs(tmp_path)
    assert abs(free - st.f_bavail * st.f_frsize) < 64 * 1024 * 1024


def test_agent_age_from_status_file(tmp_path: Path) -> None:
    assert agent_age_s(str(tmp_path), "gpu001", 1000.0) == math.inf
    write_status(tmp_path, "gpu001", {"last_beat": 990.0})
    assert agent_age_s(str(tmp_path), "gpu001", 1000.0) == 10.0
    (tmp_path / "gpu001.json").write_text("{torn")
    assert agent_age_s(str(tmp_path), "gpu001", 1000.0) == math.inf


def test_agent_xids_join_the_one_shot_report(tmp_path: Path) -> None:
    from nuro.healthcheck.probes import FakeProbe
    from nuro.healthcheck.run import with_agent_xids

    agent_report = FakeProbe.healthy(2).with_gpu(1, xid_errors=(79,)).read()
    write_status(tmp_path, "gpu001", {"last_beat": 1.0, "gpu_report": agent_report.to_dict()})
    own = FakeProbe.healthy(2).with_gpu(1, xid_errors=(79, 48)).read()
    merged = with_agent_xids(own, str(tmp_path), "gpu001")
    assert [g.xid_errors for g in merged.gpus] == [(), (79, 48)]
    assert with_agent_xids(own, str(tmp_path), "other") == own


# --- who holds the staging disk (nuro.healthcheck.diskuse), measured without following a path ------------------


def _record(root: Path, job_id: int) -> None:
    from nuro.protocol import jobrecord

    jobrecord.write(root, jobrecord.JobRecord(job_id, 0, 0, "root", "perception", None, None, 0, "gpu001", None))


def _write(path: Path, n_bytes: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"x" * n_bytes)
        os.fsync(fh.fileno())


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="job records are root-owned (the prolog writes them as root)")


@needs_root
def test_running_job_usage_counts_running_jobs_dirs_only_and_never_follows_a_link(tmp_path: Path) -> None:
    from nuro.healthcheck.diskuse import running_job_usage

    root, outside = tmp_path / "staging", tmp_path / "outside"
    _write(outside / "big", 8 << 20)
    _write(root / "11" / "ckpt" / "a", 3 << 20)
    _write(root / "12" / "b", 1 << 20)
    _write(root / "99" / "done", 5 << 20)  # no record: not running here, not counted
    (root / "12" / "link-to-outside").symlink_to(outside, target_is_directory=True)
    (root / "12" / "link-to-file").symlink_to(outside / "big")
    os.link(root / "12" / "b", root / "12" / "b-again")  # a hard link holds no more space
    (root / "13").symlink_to(outside)  # the job dir itself swapped for a symlink: only the link counts
    for job in (11, 12, 13):
        _record(root, job)
    usage = running_job_usage(root)
    assert [u.job_id for u in usage] == [11, 12, 13]
    by_job = {u.job_id: u.bytes for u in usage}
    assert (3 << 20) <= by_job[11] < (4 << 20)
    assert (1 << 20) <= by_job[12] < (2 << 20)  # neither the linked 8 MiB dir nor the linked file
    assert by_job[13] < (1 << 20) and all(u.complete for u in usage)
    assert running_job_usage(tmp_path / "missing") == []
    # a job whose epilog handed its uploads to the agent has ended: its dir is in transit, no job is failed for it
    (root / ".handoff").mkdir()
    (root / ".handoff" / "11").write_bytes(b"")
    assert [u.job_id for u in running_job_usage(root)] == [12, 13]


@needs_root
def test_running_job_usage_is_bounded_in_entries_depth_and_time(tmp_path: Path) -> None:
    from nuro.healthcheck import diskuse

    root = tmp_path / "staging"
    many = root / "21"
    many.mkdir(parents=True)
    for i in range(50):
        (many / f"f{i}").write_bytes(b"")
    deep = root / "22"
    here = deep
    for _ in range(diskuse.MAX_OPEN_DIRS + 5):
        here = here / "d"
    _write(here / "leaf", 1 << 20)
    for job in (21, 22):
        _record(root, job)
    (u21,) = [u for u in diskuse.running_job_usage(root, max_entries=10) if u.job_id == 21]
    assert not u21.complete  # the entry cap stopped it in job 21's dir: the space it could not see is its bound
    (u22,) = [u for u in diskuse.running_job_usage(root) if u.job_id == 22]
    assert not u22.complete and u22.upper_bound and u22.bytes >= (1 << 20)  # too deep: the unseen leaf is its
    ticks = iter(range(1000))
    timed = diskuse.running_job_usage(root, time_budget_s=3, clock=lambda: next(ticks))
    assert not any(u.complete for u in timed if u.job_id == 21)


@needs_root
def test_disk_state_attributes_a_low_disk_to_the_job_that_holds_it(tmp_path: Path) -> None:
    """The measuring and the rule together, with the free-space reading fixed (the real disk here is shared)."""
    from dataclasses import replace

    from nuro.healthcheck.act import disk_full_reason
    from nuro.healthcheck.checks import disk_verdict, evaluate
    from nuro.healthcheck.run import disk_state

    root = tmp_path / "staging"
    _write(root / "31" / "fill", 4 << 20)
    _record(root, 31)
    free = 10 << 30
    settings = replace(
        HealthSettings(probe="none"), staging_root=str(root), staging_min_free_bytes=free + (1 << 20),
        min_blame_bytes=1 << 20,  # the default (1/20 of the floor) would want half a GiB
    )  # fmt: skip
    got_free, usage = disk_state(settings, "gpu001", free, reader=lambda _p: free)
    assert got_free == free and usage is not None and [u.job_id for u in usage] == [31]
    verdict = disk_verdict(got_free, settings.staging_min_free_bytes, usage, settings.min_blame_bytes)
    assert [u.job_id for u in verdict.jobs_to_fail] == [31]
    assert evaluate(None, None, got_free, settings.staging_min_free_bytes, None, job_disk_use=usage,
                    min_job_bytes=settings.min_blame_bytes) == []  # fmt: skip
    out = Outcome("gpu001", "periodic", (), None, got_free, None, jobs_to_fail=verdict.jobs_to_fail,
                  min_free_bytes=settings.staging_min_free_bytes, staging_root=str(root))  # fmt: skip
    why = disk_full_reason(out, out.jobs_to_fail[0])
    assert why.startswith("nuro-health: cancelled: the staging disk of gpu001")
    assert f"{root}/31 and what its user wrote" in why
    # A shortfall far beyond what any job holds: the node's problem (drained), no job failed.
    big = replace(settings, staging_min_free_bytes=free + (1 << 40))
    got_free, usage = disk_state(big, "gpu001", free, reader=lambda _p: free)
    assert disk_verdict(got_free, big.staging_min_free_bytes, usage, big.min_blame_bytes).node_problem
    # Space given back during the confirmation pause (an epilog's unlink returning) is nobody's problem.
    readings = iter([free, free + (2 << 40)])
    got_free, usage = disk_state(big, "gpu001", free, reader=lambda _p: next(readings))
    assert got_free > big.staging_min_free_bytes and usage is None


def test_a_low_reading_that_is_still_rising_is_re_read_until_it_settles() -> None:
    """An epilog unlinking a big file gives its blocks back over a while: judge the settled value, not the first."""
    from nuro.healthcheck.run import settled_free_bytes

    readings = iter([5, 8, 12, 12, 99])
    assert settled_free_bytes("/x", 20, 3, poll_s=0, reader=lambda _p: next(readings)) == 12  # steady at 12: low
    readings = iter([15, 25])
    assert settled_free_bytes("/x", 20, 10, poll_s=0, reader=lambda _p: next(readings)) == 25  # crossed the floor
    assert settled_free_bytes("/x", 20, 30, poll_s=0, reader=lambda _p: 0) == 30  # not low: not re-read
    forever = iter(range(10, 10**6))
    assert settled_free_bytes("/x", 10**9, 1, budget_s=0.05, poll_s=0.001, reader=lambda _p: next(forever)) < 10**9


def test_the_disk_measured_is_the_nodes_own_staging_root() -> None:
    """A root naming {node} (one per emulated node on a shared disk) is resolved before anything is measured: the
    unresolved path does not exist, and measured at its parent it read the shared disk, never the node's."""
    s = HealthSettings(staging_root="/var/stage/{node}")
    assert s.for_node("gpu003").staging_root == "/var/stage/gpu003"
    assert HealthSettings(staging_root="/var/stage").for_node("gpu003").staging_root == "/var/stage"

"""The dataset prefetch ends with its job (issue 30; ``nuro.prolog_epilog.prefetchguard``).

Real processes, started the way the prolog starts the prefetch (``prolog.start_prefetch``: the job's user, a session
of its own, no terminal), stand in for a prefetch that is still fetching when the job ends; the epilog's ``stop``
must end it and its session, and never signal a process that merely got its pid. The cgroup join runs against a
directory laid out like Slurm's cgroup v1 tree (``cgroup.procs`` as plain files: what is written is what the kernel
would be asked).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nuro.datasets.prefetch import join_job_cgroups
from nuro.prolog_epilog import prefetchguard, prolog
from nuro.protocol.jobrecord import JobRecord

#: a "prefetch" that keeps fetching, with a child in its session (as a fetch thread's helper might be)
_LONG = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); " \
        "time.sleep(300)"  # fmt: skip


def _alive(pid: int) -> bool:
    return prefetchguard.proc_identity(pid) is not None


def _session(sid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid and _alive(int(entry)):
                    out.append(int(entry))
            except OSError:
                pass
    return out


@pytest.fixture
def rec() -> JobRecord:
    return JobRecord(4711, os.getuid(), os.getgid(), "root", "perception", "perception", None, 0, "gpu001", None)


def test_the_epilog_ends_a_prefetch_that_outlives_its_job(tmp_path: Path, rec: JobRecord) -> None:
    pid = prolog.start_prefetch(rec, [sys.executable, "-c", _LONG])
    try:
        prefetchguard.record(tmp_path, rec.job_id, pid)
        record = tmp_path / prefetchguard.DIR / "4711.json"
        assert (record.stat().st_mode & 0o777, (tmp_path / prefetchguard.DIR).stat().st_mode & 0o777) == (0o600, 0o700)
        assert json.loads(record.read_text())["pid"] == pid
        time.sleep(0.5)  # its child is up
        assert len(_session(pid)) == 2
        outcome = prefetchguard.stop(tmp_path, "4711", grace_s=5)
        assert outcome.startswith(("stopped", "killed")), outcome
        deadline = time.monotonic() + 5
        while _session(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _session(pid) == []  # the prefetch and everything in its session are gone
        assert not record.exists()
        assert prefetchguard.stop(tmp_path, "4711") == "none"  # a second epilog run finds nothing to do
    finally:
        for p in _session(pid):
            os.kill(p, 9)


def test_a_recycled_pid_is_never_signalled(tmp_path: Path, rec: JobRecord) -> None:
    """The record names the pid and its start time: a process that has the pid now but started at another time
    (the prefetch ended and the pid was reused) is left alone."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        prefetchguard.record(tmp_path, rec.job_id, other.pid)
        path = tmp_path / prefetchguard.DIR / "4711.json"
        forged = json.loads(path.read_text())
        forged["start"] -= 1  # as if recorded for an earlier process with this pid
        path.write_text(json.dumps(forged))
        assert "another process" in prefetchguard.stop(tmp_path, rec.job_id)
        assert other.poll() is None  # untouched
    finally:
        other.kill()
        other.wait()


def test_a_prefetch_that_ended_by_itself_needs_nothing(tmp_path: Path, rec: JobRecord) -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    prefetchguard.record(tmp_path, rec.job_id, done.pid)  # gone before the prolog recorded it: nothing recorded
    assert prefetchguard.stop(tmp_path, rec.job_id) == "none"


def test_the_prefetch_joins_the_jobs_first_step_cgroup_when_it_appears(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    for controller in ("freezer", "memory", "cpuacct"):
        (mount / controller / "slurm_gpu001").mkdir(parents=True)
    dirs = prefetchguard.job_cgroups(mount, "gpu001", 1001, 77)
    assert dirs == [str(mount / c / "slurm_gpu001" / "uid_1001" / "job_77") for c in ("freezer", "memory", "cpuacct")]
    for d in dirs[:2]:  # slurmstepd made the batch step in two controllers; the third never gets one
        (Path(d) / "step_batch").mkdir(parents=True)
        (Path(d) / "step_batch" / "cgroup.procs").write_text("")
    joined = join_job_cgroups(dirs, until=time.monotonic() + 0.3, pid=4242)
    assert joined == [str(Path(d) / "step_batch" / "cgroup.procs") for d in dirs[:2]]
    assert [(Path(d) / "step_batch" / "cgroup.procs").read_text() for d in dirs[:2]] == ["4242\n", "4242\n"]


def test_the_prolog_passes_the_jobs_cgroups_to_the_prefetch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "cg" / "freezer" / "slurm_gpu001").mkdir(parents=True)
    monkeypatch.setenv("NURO_DATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NURO_STAGING_ROOT", str(tmp_path / "staging"))
    monkeypatch.setenv(prefetchguard.ENV_CGROUP_MOUNTPOINT, str(tmp_path / "cg"))
    from nuro.protocol import jobcomment

    comment = jobcomment.merge(None, nuro={"v": 1, "dataset": {"name": "imagenet", "digest": "sha256:" + "b" * 64}})
    rec = JobRecord(81, 1001, 1001, "alice", "perception", "perception", None, 0, "gpu001", None)
    cmd = prolog.prefetch_plan(rec, comment, python="py")
    assert cmd is not None
    assert cmd[cmd.index("--cgroup") + 1] == str(tmp_path / "cg" / "freezer" / "slurm_gpu001" / "uid_1001" / "job_81")

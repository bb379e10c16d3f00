"""Backend's default reads: wait_for_job (squeue first, accounting when squeue forgot the job, a timeout that
says what it saw) and job_restarts."""

from __future__ import annotations

import pytest

from nuro.slurm import Backend, InvalidJobId, JobInfo, JobPhase, JobWaitTimeout


class _Scripted(Backend):
    """A backend whose reads replay a script of (squeue jobs, sacct jobs) per poll: pure logic under test."""

    def __init__(self, polls: list[tuple[list[JobInfo], list[JobInfo]]]) -> None:
        self.polls = polls
        self.i = -1

    def jobs(self) -> list[JobInfo]:
        self.i = min(self.i + 1, len(self.polls) - 1)
        return self.polls[self.i][0]

    def finished_jobs(self, job_ids):
        return self.polls[self.i][1]

    def read_snapshot(self):
        raise NotImplementedError

    def apply(self, action):
        raise NotImplementedError

    def version(self):
        raise NotImplementedError


def _job(state: str) -> JobInfo:
    from nuro.slurm import to_phase

    return JobInfo(job_id=7, name="j", user="u", state=state, phase=to_phase(state))


def test_returns_when_squeue_shows_a_terminal_phase() -> None:
    backend = _Scripted([([_job("PENDING")], []), ([_job("RUNNING")], []), ([_job("COMPLETED")], [])])
    assert backend.wait_for_job(7, poll_s=0).phase is JobPhase.COMPLETED


def test_falls_back_to_accounting_when_squeue_forgot_the_job() -> None:
    backend = _Scripted([([_job("RUNNING")], []), ([], [_job("FAILED")])])
    assert backend.wait_for_job(7, poll_s=0).phase is JobPhase.FAILED


def test_waits_for_the_requested_phases_only() -> None:
    backend = _Scripted([([_job("PENDING")], []), ([_job("RUNNING")], [])])
    assert backend.wait_for_job(7, {JobPhase.RUNNING}, poll_s=0).phase is JobPhase.RUNNING


def test_timeout_names_the_job_and_the_last_state_seen() -> None:
    backend = _Scripted([([_job("PENDING")], [])])
    with pytest.raises(JobWaitTimeout, match=r"job 7 did not reach \['RUNNING'\] within 0 s \(last seen: PENDING"):
        backend.wait_for_job(7, {JobPhase.RUNNING}, timeout_s=0, poll_s=0)


def test_job_restarts_reads_the_count_and_state_every_backend_offers() -> None:
    """The detector asks any ``Backend`` whether Slurm requeued a job yet; the default reads the job record."""
    requeued = JobInfo(job_id=7, name="j", user="u", state="PENDING", phase=JobPhase.PENDING, restart_count=1)
    assert _Scripted([([requeued], [])]).job_restarts(7) == (1, "PENDING")
    with pytest.raises(InvalidJobId):
        _Scripted([([], [])]).job_restarts("7")

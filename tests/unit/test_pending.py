"""Why a run waits (nuro.runs.pending): the controller's reasons file, the queue position, the status lines."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from nuro.login.runs_cli import waiting_lines
from nuro.runs.pending import pending_view, queue_position, read_waits, write_waits
from nuro.slurm import JobInfo, JobPhase
from nuro.slurm_plugins.controller.decisions import Wait
from nuro.tracking import mirror


def _job(job_id: int, prio: int, phase: JobPhase = JobPhase.PENDING, part: str = "gpu", sub: int = 0) -> JobInfo:
    return JobInfo(job_id=job_id, name="j", user="u", state=phase.name, phase=phase, partition=part, priority=prio,
                   reason="QOSGrpGRES", submit_time=datetime.fromtimestamp(1_700_000_000 + sub, UTC))  # fmt: skip


def test_the_queue_is_slurms_priority_order_within_the_partition() -> None:
    jobs = [_job(1, 10), _job(2, 30), _job(3, 30, sub=-5), _job(4, 99, part="cpu"), _job(5, 99, JobPhase.RUNNING)]
    assert [queue_position(j, jobs) for j in jobs] == [(3, 3), (2, 3), (1, 3), (1, 1), None]


def test_the_waits_file_round_trips_and_stale_or_broken_files_say_nothing(tmp_path: Path) -> None:
    path = tmp_path / "waits.json"
    write_waits(path, 1000.0, [Wait(7, "team perception holds 16/16 borrowed GPUs (its borrow limit)",
                                    "wait_borrow_limit")])  # fmt: skip
    assert read_waits(path, 1010.0) == {
        7: {"code": "wait_borrow_limit", "reason": "team perception holds 16/16 borrowed GPUs (its borrow limit)"}
    }
    assert read_waits(path, 2000.0) == {}  # the controller stopped writing: not shown
    for bad in ("{", "[]", json.dumps({"format": "other", "at": 1000.0, "jobs": {}}),
                json.dumps({"format": "nuro.controller-waits/v1", "at": "x", "jobs": {}})):  # fmt: skip
        path.write_text(bad)
        assert read_waits(path, 1000.0) == {}
    assert read_waits(None, 0.0) == {} and read_waits(tmp_path / "missing", 0.0) == {}
    assert not list(tmp_path.glob(".waits-*"))  # no temp file left behind


def test_the_view_joins_slurm_the_controller_and_the_queue() -> None:
    jobs = [_job(1, 10), _job(2, 30)]
    view = pending_view(jobs[0], jobs, {1: {"code": "wait_lend_pool", "reason": "lenders at their limits"}})
    assert view == {"slurm_reason": "QOSGrpGRES", "queue_position": 2, "queue_length": 2,
                    "controller": {"code": "wait_lend_pool", "reason": "lenders at their limits"}}  # fmt: skip
    assert waiting_lines(view) == ["Slurm: QOSGrpGRES", "nuro-controller: lenders at their limits (wait_lend_pool)",
                                   "queue position 2 of 2 (by Slurm priority)"]  # fmt: skip
    assert mirror.pending_tags(view) == {mirror.TAG_QUEUE: "2 of 2",
                                         mirror.TAG_WAIT: "lenders at their limits (wait_lend_pool)"}  # fmt: skip
    assert pending_view(_job(3, 1, JobPhase.RUNNING), jobs, {}) == {}


def test_the_controller_rewrites_the_file_only_on_change_or_to_stay_fresh(tmp_path: Path) -> None:
    from nuro.runs.pending import STALE_S, WaitsFile

    f = WaitsFile(tmp_path / "waits.json")
    same = [Wait(7, "lenders at their limits", "wait_lend_pool")]
    assert f.publish(1000.0, same) and not f.publish(1000.5, same)  # an unchanged cycle writes nothing
    assert f.publish(1001.0, [])  # the reasons changed
    assert not f.publish(1001.5, []) and f.publish(1001.0 + STALE_S / 3, [])  # refreshed before it goes stale
    assert read_waits(tmp_path / "waits.json", 1001.0 + STALE_S / 3) == {}

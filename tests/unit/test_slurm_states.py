"""The job-state table: every Slurm spelling maps, PREEMPTED/REQUEUED never become FAILED, unknowns warn once."""

from __future__ import annotations

import logging

import pytest

from nuro.slurm.states import SLURM_STATES, JobPhase, _reset_warnings_for_tests, to_phase


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("PENDING", JobPhase.PENDING),
        ("RUNNING", JobPhase.RUNNING),
        ("COMPLETING", JobPhase.COMPLETING),
        ("COMPLETED", JobPhase.COMPLETED),
        ("FAILED", JobPhase.FAILED),
        ("CANCELLED by 0", JobPhase.CANCELLED),  # sacct text form
        ("TIMEOUT", JobPhase.TIMEOUT),
        ("NODE_FAIL", JobPhase.NODE_FAIL),
        ("PREEMPTED", JobPhase.PREEMPTED),
        ("REQUEUED", JobPhase.REQUEUED),
        ("REQUEUE_HOLD", JobPhase.REQUEUED),
        ("SPECIAL_EXIT", JobPhase.REQUEUED),
        ("OUT_OF_MEMORY", JobPhase.OUT_OF_MEMORY),
        ("BOOT_FAIL", JobPhase.BOOT_FAIL),
        ("DEADLINE", JobPhase.DEADLINE),
        ("CONFIGURING", JobPhase.RUNNING),
        ("running", JobPhase.RUNNING),
        ("PD", JobPhase.PENDING),
        ("CG", JobPhase.COMPLETING),
        ("PR", JobPhase.PREEMPTED),
        # 24.11+ JSON lists: the base state, except that the COMPLETING flag wins, as 22.05's job_state_string()
        # prints it (a job releasing its nodes still holds them; captured in tests/fixtures/slurm/v24.11)
        ("PENDING+REQUEUED", JobPhase.PENDING),
        ("PENDING+COMPLETING", JobPhase.COMPLETING),
        ("CANCELLED+COMPLETING", JobPhase.COMPLETING),
        ("RUNNING+COMPLETING", JobPhase.COMPLETING),
    ],
)
def test_to_phase(raw: str, want: JobPhase) -> None:
    assert to_phase(raw) is want


def test_preempted_and_requeued_never_fail() -> None:
    failed_keys = {k for k, v in SLURM_STATES.items() if v is JobPhase.FAILED}
    assert not failed_keys & {
        "PREEMPTED",
        "PR",
        "REQUEUED",
        "RQ",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "SPECIAL_EXIT",
    }
    assert not JobPhase.PREEMPTED.is_terminal
    assert not JobPhase.REQUEUED.is_terminal


def test_unknown_state_is_unknown_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    _reset_warnings_for_tests()
    with caplog.at_level(logging.WARNING, logger="nuro.slurm.states"):
        assert to_phase("FROBNICATED") is JobPhase.UNKNOWN
        assert to_phase("FROBNICATED") is JobPhase.UNKNOWN
        assert to_phase("") is JobPhase.UNKNOWN
    warnings = [r.getMessage() for r in caplog.records]
    assert sum("FROBNICATED" in m for m in warnings) == 1
    assert len(warnings) == 2  # one for FROBNICATED, one for the empty state


def test_every_phase_but_unknown_is_reachable() -> None:
    assert set(SLURM_STATES.values()) == set(JobPhase) - {JobPhase.UNKNOWN}


def test_holds_resources() -> None:
    assert JobPhase.RUNNING.holds_resources and JobPhase.COMPLETING.holds_resources
    assert not JobPhase.PENDING.holds_resources and not JobPhase.COMPLETED.holds_resources

"""Retention is a pure choice over the run's steps: keep the last K committed plus tagged ones, delete only what a
newer committed checkpoint supersedes, never an in-flight newer step."""

from __future__ import annotations

import pytest

from nuro.checkpoint.retention import StepState, choose_deletions, default_keep, effective_keep


def _steps(spec: str) -> list[StepState]:
    """'1c 2c 3t 4c 5t': step numbers with c = committed, t = torn/in flight (no manifest)."""
    return [StepState(int(s[:-1]), s[-1] == "c") for s in spec.split()]


@pytest.mark.parametrize(
    ("spec", "keep", "tagged", "want"),
    [
        ("1c 2c 3c 4c", 2, (), [1, 2]),
        ("1c 2c 3c 4c", 2, (1,), [2]),
        ("1c 2c", 5, (), []),
        ("1t 2t 3t", 1, (), []),  # nothing committed: nothing may go
        ("1c 2t 3c 4t 5t", 1, (), [1, 2]),  # newer uncommitted (in flight) steps stay
        ("1c 2t 3c 4c", 2, (), [1, 2]),  # a torn step older than the kept ones goes too
        ("3c 1c 2c", 1, (), [1, 2]),  # order of input does not matter
        ("0t 1c 2c", 3, (), []),  # an older step still uploading while newer ones committed: kept (3 would fit)
        ("0t 1c 2c 3c", 3, (), [0]),  # ... but not once `keep` newer steps are committed
        ("0t 1c 2t 3c", 2, (), [0]),
    ],
    ids=[
        "last-k",
        "tagged-kept",
        "fewer-than-k",
        "none-committed",
        "in-flight",
        "torn-old",
        "unsorted",
        "older-in-flight-fits",
        "older-superseded",
        "older-superseded-gaps",
    ],  # fmt: skip
)
def test_choose_deletions(spec: str, keep: int, tagged: tuple[int, ...], want: list[int]) -> None:
    assert choose_deletions(_steps(spec), keep, tagged) == want


def test_keep_must_be_positive() -> None:
    with pytest.raises(ValueError, match="NURO_CKPT_KEEP"):
        choose_deletions(_steps("1c"), 0)


def test_keep_of_a_job_is_its_records_else_the_job_spec_default() -> None:
    from nuro.jobspec.spec import JobSpec

    assert default_keep() == 3 == JobSpec.__dataclass_fields__["ckpt_keep"].default
    assert effective_keep(None) == 3 and effective_keep(7) == 7
    with pytest.raises(ValueError, match="at least 1"):
        effective_keep(0)

"""The epilog → node agent hand-off's pure parts: when the epilog must still wait, and the settings."""

from __future__ import annotations

import pytest

from nuro.checkpoint import handoff


@pytest.mark.parametrize(
    ("at_start", "now", "state", "want"),
    [
        (0, 0, "COMPLETING", False),  # finished (or failed, cancelled): nobody restores from it soon, hand off
        (2, 2, "COMPLETED", False),
        (0, 1, "COMPLETING", True),  # Slurm counted a requeue: the next attempt restores from S3, commit first
        (0, 0, "REQUEUED", True),
        (1, 1, "PENDING", True),  # requeued and already pending again
        (0, 0, "REQUEUE_HOLD", True),
        (0, None, None, True),  # Slurm did not answer: waiting is slow, a lost newest checkpoint is worse
        (0, 0, None, True),
    ],
)
def test_only_a_job_that_is_not_requeued_is_handed_off(at_start, now, state, want) -> None:
    assert handoff.wants_flush(at_start, now, state) is want


@pytest.mark.parametrize(("raw", "want"), [("", 3600.0), ("90", 90.0), ("0", 3600.0), ("-5", 3600.0), ("x", 3600.0)])
def test_timeout_comes_from_the_node_env(raw: str, want: float) -> None:
    assert handoff.timeout_s({"NURO_HANDOFF_TIMEOUT_S": raw}) == want


def test_hand_off_is_on_only_when_the_node_env_says_so() -> None:
    assert handoff.enabled({"NURO_EPILOG_HANDOFF": "1"})
    assert not handoff.enabled({}) and not handoff.enabled({"NURO_EPILOG_HANDOFF": "yes"})


def test_markers_are_roots_and_only_job_ids_count(tmp_path) -> None:
    root = tmp_path / "staging"
    handoff.hand_off(root, "42")
    handoff.hand_off(root, "7")
    (root / handoff.HANDOFF_DIR / "notajob").write_text("")
    (root / handoff.HANDOFF_DIR / "99").mkdir()
    got = handoff.handoffs(root)
    assert sorted(h.job_id for h in got) == ["42", "7"]
    marker = root / handoff.HANDOFF_DIR / "42"
    assert marker.stat().st_mode & 0o777 == 0o600 and (root / handoff.HANDOFF_DIR).stat().st_mode & 0o777 == 0o700
    with pytest.raises(ValueError):
        handoff.hand_off(root, "../x")

"""A run's timeline from its records: attempts from real sacct -D output, controller and run events around them."""

from __future__ import annotations

from pathlib import Path

from nuro.lifecycle.run_events import RunEvent
from nuro.lifecycle.timeline import CommittedCheckpoint, build
from nuro.slurm.parse import merge_resized, parse_sacct_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def attempts():
    # job 1 ran on gpu001, was requeued, and ran again (captured on the dev cluster)
    return parse_sacct_json((FIXTURES / "sacct_requeued_attempts.json").read_text())


def test_a_node_loss_is_measured_from_the_last_heartbeat_to_the_first_step_after_resume() -> None:
    first, second = attempts()
    t_end = first.end_time.timestamp()
    t_restart = second.start_time.timestamp()
    controller = [
        {"ts": t_end - 0.5, "kind": "node_lost", "node": "gpu001", "last_beat": t_end - 3.6, "silent_s": 3.1},
        {"ts": t_end - 0.4, "kind": "node_down", "node": "gpu001", "reason": "nuro: no heartbeat for 3.1 s"},
        {"ts": t_end - 0.3, "kind": "jobs_requeued", "node": "gpu001", "jobs": [1]},
        {"ts": t_end - 0.3, "kind": "node_down", "node": "gpu007", "reason": "another node, another job"},
    ]
    run = [
        RunEvent(t_end - 1.5, "progress", 1, 0, "gpu001", {"step": 47}),
        RunEvent(t_restart + 4.0, "restored", 1, 1, "gpu002", {"step": 40, "source": "s3"}),
        RunEvent(t_restart + 4.5, "first_step", 1, 1, "gpu002", {"step": 41}),
        RunEvent(t_restart + 4.5, "first_step", 99, 0, "gpu002", {"step": 0}),  # another job of the run
    ]
    ckpts = [CommittedCheckpoint(step=40, at=t_end - 2.0, job_id=1, restart=0)]
    tl = build(1, attempts(), controller, run, ckpts)

    kinds = [e.kind for e in tl.entries]
    assert kinds[0] == "submitted" and "restarted" in kinds and "node_down" in kinds
    assert kinds.index("checkpoint_committed") < kinds.index("node_lost") < kinds.index("requeued")
    assert kinds.index("restarted") < kinds.index("resumed") < kinds.index("first_step")
    assert not any("gpu007" in e.detail for e in tl.entries), "another node's events are not this run's"
    assert sum(e.kind == "first_step" for e in tl.entries) == 1

    (rec,) = tl.recoveries
    summary = rec.to_json()
    assert summary["node"] == "gpu001"
    assert summary["detect_s"] == 3.1
    assert summary["resumed_step"] == 41 and summary["last_committed_before"] == 40
    assert summary["steps_lost"] == 7  # steps 41..47 were done twice
    assert summary["resume_s"] is not None and summary["resume_s"] > summary["restart_s"] > summary["detect_s"]


def test_the_requeue_is_timed_by_the_controller_not_by_accountings_whole_seconds() -> None:
    """sacct keeps whole seconds: an attempt requeued 0.5 s into a second reads as ended at its start, before the
    loss was even detected (the demo showed ``requeued -0.1 s`` after ``detected 0.7 s``). The controller's own
    ``jobs_requeued`` event, written once Slurm had requeued the job, times it; without one, accounting's time."""
    first, _ = attempts()
    t_end = first.end_time.timestamp()  # the whole second sacct kept
    lost = {"ts": t_end + 0.4, "kind": "node_lost", "node": "gpu001", "last_beat": t_end - 0.3, "silent_s": 0.7}
    requeued = {"ts": t_end + 0.5, "kind": "jobs_requeued", "node": "gpu001", "jobs": [1]}
    other = {"ts": t_end + 0.45, "kind": "jobs_requeued", "node": "gpu001", "jobs": [2]}  # another job's requeue

    (rec,) = build(1, attempts(), [lost, other, requeued], [], []).recoveries
    assert rec.to_json()["detect_s"] == 0.7 and rec.to_json()["requeue_s"] == 0.8
    (rec,) = build(1, attempts(), [lost], [], []).recoveries
    assert rec.to_json()["requeue_s"] == 0.3  # accounting's time: the best there is


def test_without_controller_or_run_records_the_slurm_part_still_shows() -> None:
    tl = build(1, attempts())
    assert [e.kind for e in tl.entries] == ["submitted", "started", "requeued", "eligible", "restarted"]
    (rec,) = tl.recoveries
    assert rec.detected is None and rec.to_json()["steps_lost"] is None
    assert tl.to_json()["events"][0]["kind"] == "submitted"


def test_a_restore_that_skipped_steps_shows_which_and_why() -> None:
    first, second = attempts()
    t = second.start_time.timestamp() + 5
    hostile = {"steps": [{"step": 9, "reason": "sha256 mismatch in __0_0.distcp"}, {"step": "x"}, "junk",
                         {"step": True, "reason": "not a step"}], "restored": 8}  # fmt: skip
    tl = build(1, attempts(), run_events=[RunEvent(t, "checkpoint_skipped", 1, 1, "gpu002", hostile)])
    (entry,) = [e for e in tl.entries if e.kind == "checkpoint_skipped"]
    assert entry.detail == "restore skipped step 9: sha256 mismatch in __0_0.distcp"
    assert entry.attempt == 1


def test_a_node_loss_absorbed_by_a_spare_is_a_recovery_without_a_requeue() -> None:
    # job 4 (captured): gpu[005-007], trained on 005-006 with 007 spare; gpu006 was killed and left the job
    (attempt,) = merge_resized(parse_sacct_json((FIXTURES / "sacct_resized_spare_swap.json").read_text()))
    t_kill = attempt.start_time.timestamp() + 10
    controller = [
        {"ts": t_kill + 0.7, "kind": "node_lost", "node": "gpu006", "last_beat": t_kill + 0.05, "silent_s": 0.65},
        {"ts": t_kill + 0.85, "kind": "jobs_requeued", "node": "gpu006", "jobs": [4]},
    ]
    run = [
        RunEvent(t_kill - 0.5, "progress", 4, 0, "gpu005", {"step": 44}),
        RunEvent(t_kill + 1.8, "spare_swap", 4, 0, "gpu005", {"lost": ["gpu006"], "spares": ["gpu007"]}),
        RunEvent(t_kill + 3.7, "restored", 4, 0, "gpu005", {"step": 32}),
        RunEvent(t_kill + 3.8, "first_step", 4, 0, "gpu005", {"step": 33}),
    ]
    tl = build(4, [attempt], controller, run, [CommittedCheckpoint(step=32, at=t_kill - 3, job_id=4, restart=0)])
    kinds = [e.kind for e in tl.entries]
    assert "restarted" not in kinds and "requeued" not in kinds and "jobs_requeued" not in kinds
    assert kinds.index("node_lost") < kinds.index("node_left_job") < kinds.index("spare_swap")
    (rec,) = tl.recoveries
    summary = rec.to_json()
    assert summary["via"] == "spare" and summary["node"] == "gpu006" and summary["requeue_s"] is None
    assert summary["resume_s"] == 3.75 and summary["resumed_step"] == 33 and summary["steps_lost"] == 12


def test_a_promoted_in_memory_snapshot_says_so_in_the_timeline() -> None:
    ckpts = [CommittedCheckpoint(step=7, at=100.0, job_id=1, restart=0),
             CommittedCheckpoint(step=9, at=130.0, job_id=1, restart=0, tier="memory")]  # fmt: skip
    details = [e.detail for e in build(1, [], (), (), ckpts).entries if e.kind == "checkpoint_committed"]
    assert details == ["step 7 committed", "step 9 committed (in-memory snapshot, promoted after the node loss)"]

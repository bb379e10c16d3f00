"""Which requeued jobs the detector starts early (``nuro.slurm_plugins.controller.expedite.decide``): only once the
requeue has finished (PENDING, one more restart), at least 2 s after the kill, while the lost node stays out."""

from __future__ import annotations

from nuro.slurm_plugins.controller.expedite import MIN_AFTER_KILL_S, WATCH_S, Watched, decide

W = Watched(job_id=7, restarts=0, node="gpu002", killed_at=100.0)


def test_a_requeued_pending_job_is_started_once_2_s_passed_since_the_kill() -> None:
    d = decide([W], {7: (1, "PENDING")}, {"gpu002"}, 100.0 + MIN_AFTER_KILL_S)
    assert d.expedite == (W,) and not d.keep and not d.dropped
    early = decide([W], {7: (1, "PENDING")}, {"gpu002"}, 100.5)
    assert early.keep == (W,) and not early.expedite  # a credential of the kill's second would be refused


def test_a_requeue_still_finishing_is_waited_for_never_overwritten() -> None:
    for seen in ((0, "RUNNING"), (0, "COMPLETING"), (1, "COMPLETING"), (1, "REQUEUED")):
        d = decide([W], {7: seen}, {"gpu002"}, 103.0)
        assert d.keep == (W,) and not d.expedite, seen
    assert decide([W], {}, {"gpu002"}, 103.0).keep == (W,)  # not read this tick


def test_anything_else_leaves_slurms_own_delay() -> None:
    cases = {
        "gone": ({7: None}, {"gpu002"}, 103.0),
        "gpu002 is back in service": ({7: (1, "PENDING")}, set(), 103.0),  # its teardown is not awaited by Slurm
        "running already": ({7: (1, "RUNNING")}, {"gpu002"}, 103.0),
        "not requeued": ({7: (0, "RUNNING")}, {"gpu002"}, 100.0 + WATCH_S),
    }
    for why, (observed, out, now) in cases.items():
        d = decide([W], observed, out, now)
        assert d.dropped == ((W, why),) and not d.expedite and not d.keep, why

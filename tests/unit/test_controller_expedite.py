"""Which requeued jobs the detector starts early (``nuro.slurm_plugins.controller.expedite.decide``): only once the
requeue has finished (PENDING, one more restart), while the lost node stays out, and once the survivors run the new
attempt's prolog: from the second after the first PENDING sighting on 23.02+, cred_expire + 2 s after the kill on
22.05; and ``scontrol show config``'s cred_expire, read by the backend."""

from __future__ import annotations

from dataclasses import replace

from nuro.slurm.parse_text import parse_cred_expire
from nuro.slurm_plugins.controller.expedite import FIRST_READ_S, MARGIN_S, WATCH_S, Watched, decide, earliest_start_s

W = Watched(job_id=7, restarts=0, node="gpu002", killed_at=100.0)


def test_a_requeued_pending_job_is_started_once_the_survivors_forgot_the_old_attempt() -> None:
    d = decide([W], {7: (1, "PENDING")}, {"gpu002"}, 100.0 + 5 + MARGIN_S, cred_expire_s=5)
    assert d.expedite == (W,) and not d.keep and not d.dropped
    # within cred_expire of the kill a survivor still remembers job 7 and would run no prolog for it
    early = decide([W], {7: (1, "PENDING")}, {"gpu002"}, 103.7, cred_expire_s=5)
    assert early.keep == (W,) and not early.expedite
    unknown = decide([W], {7: (1, "PENDING")}, {"gpu002"}, 110.0)  # cred_expire unknown: Slurm's default, 120
    assert unknown.keep == (W,) and not unknown.expedite


def test_cred_expire_comes_from_authinfo_else_slurms_default() -> None:
    config = "AuthAltTypes = (null)\nAuthInfo = socket=/run/munge.sock,cred_expire=5\nAuthType = auth/munge\n"
    assert parse_cred_expire(config) == 5
    assert parse_cred_expire("AuthInfo = (null)\n") == 120 and parse_cred_expire("") == 120


def test_a_requeue_still_finishing_is_waited_for_never_overwritten() -> None:
    for seen in ((0, "RUNNING"), (0, "COMPLETING"), (1, "COMPLETING"), (1, "REQUEUED")):
        d = decide([W], {7: seen}, {"gpu002"}, 108.0, cred_expire_s=5)
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
        d = decide([W], observed, out, now, cred_expire_s=5)
        assert d.dropped == ((W, why),) and not d.expedite and not d.keep, why


def test_a_purging_slurmd_lets_the_start_come_the_second_after_the_requeue() -> None:
    """23.02+: the survivors' revokes came before the first tick that saw the job PENDING (their epilogs were done);
    a credential created from the next whole second on is newer than every revoke, so slurmd drops the old entry and
    runs the prolog."""
    first = decide([W], {7: (1, "PENDING")}, {"gpu002"}, 102.3, cred_expire_s=5, reissue_purges=True)
    assert first.keep == (replace(W, pending_at=102.3),) and not first.expedite
    seen = first.keep[0]
    same_second = decide([seen], {7: (1, "PENDING")}, {"gpu002"}, 102.9, cred_expire_s=5, reissue_purges=True)
    assert same_second.keep == (seen,) and not same_second.expedite  # pending_at is kept, not moved on
    d = decide([seen], {7: (1, "PENDING")}, {"gpu002"}, 103.0, cred_expire_s=5, reissue_purges=True)
    assert d.expedite == (seen,) and not d.keep
    # still finishing, or the node back: as before
    assert decide([W], {7: (1, "COMPLETING")}, {"gpu002"}, 102.0, reissue_purges=True).keep == (W,)
    assert decide([seen], {7: (1, "PENDING")}, set(), 104.0, reissue_purges=True).dropped[0][1] == (
        "gpu002 is back in service"
    )
    # the detector reads a watched job from FIRST_READ_S on (23.02+), from cred_expire + 2 s on 22.05
    assert earliest_start_s(5, True) == FIRST_READ_S and earliest_start_s(5, False) == 5 + MARGIN_S
    assert decide([W], {7: (1, "PENDING")}, {"gpu002"}, 100.5, reissue_purges=True).keep == (W,)  # too early to see

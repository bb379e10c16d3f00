"""Move away from a straggler only when it pays: the ski-rental rule over the job's own costs (pure)."""

from __future__ import annotations

import pytest

from nuro.policy.straggler_move import decide_move


def test_a_long_job_with_a_clear_slowdown_moves() -> None:
    d = decide_move(1.3, remaining_s=3600, checkpoint_s=10, restart_s=5)
    assert d.move and d.stay_loss_s == pytest.approx(3600 * (1 - 1 / 1.3)) and d.move_cost_s == 15
    assert d.fields()["move"] is True and "staying loses 831 s" in d.why


def test_a_job_near_its_end_stays() -> None:
    d = decide_move(1.3, remaining_s=40, checkpoint_s=10, restart_s=5)
    assert not d.move and d.why.startswith("not worth moving") and d.stay_loss_s == pytest.approx(9.23, abs=0.01)


def test_the_margin_keeps_a_barely_winning_move_from_happening() -> None:
    # stay 20 s vs move 18 s: moving wins by 11 %, under the 25 % margin
    assert not decide_move(2.0, remaining_s=40, checkpoint_s=8, restart_s=10).move
    assert decide_move(2.0, remaining_s=40, checkpoint_s=8, restart_s=10, margin=1.0).move


@pytest.mark.parametrize(("slowdown", "remaining"), [(1.0, 3600), (0.9, 3600), (float("nan"), 3600), (2.0, 0)])
def test_no_slowdown_or_nothing_left_never_moves(slowdown: float, remaining: float) -> None:
    d = decide_move(slowdown, remaining_s=remaining, checkpoint_s=1, restart_s=1)
    assert not d.move and d.stay_loss_s == 0

"""Move a job away from a straggler, or leave it: a decision by cost (issue 16 item 2), pure.

A synchronous job runs at the speed of its slowest rank. With one rank ``slowdown`` times slower than the rest, the
job's remaining ``remaining_s`` seconds (at today's speed) would take ``remaining_s / slowdown`` on healthy
hardware: staying costs ``remaining_s * (1 - 1/slowdown)``. Moving costs what the job measured of itself: the
checkpoint at the stop (its own save time), the restart (a hot spare swap, or the requeue path: both measured by
bench/bench_spares.py), and the steps redone (none: the stop checkpoints at the step it stops at). Move only when
staying costs more than moving by ``margin`` (estimates are rough; a move that barely wins is not worth its risk).

This is the break-even rule of ski rental, as Alibaba's Greyhound applies it to slow nodes: a job near its end
stays (little left to lose), a long job with a clear slowdown moves.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Restart costs when the job has no measure of its own: the p50 "kill → first step" of bench/bench_spares.py on the
#: dev cluster (docs/benchmarks.md), rounded up. A job with a measure (an earlier swap or requeue) passes its own.
DEFAULT_SWAP_S = 5.0
DEFAULT_REQUEUE_S = 20.0
DEFAULT_MARGIN = 1.25


@dataclass(frozen=True)
class MoveDecision:
    move: bool
    slowdown: float
    remaining_s: float
    stay_loss_s: float
    move_cost_s: float
    why: str

    def fields(self) -> dict[str, object]:
        """The ``straggler_decision`` run event's fields."""
        return {"move": self.move, "slowdown": round(self.slowdown, 3), "remaining_s": round(self.remaining_s, 1),
                "stay_loss_s": round(self.stay_loss_s, 1), "move_cost_s": round(self.move_cost_s, 1),
                "why": self.why}  # fmt: skip


def decide_move(
    slowdown: float,
    remaining_s: float,
    checkpoint_s: float,
    restart_s: float,
    margin: float = DEFAULT_MARGIN,
) -> MoveDecision:
    """Whether a job with a straggler ``slowdown`` times slower should move (see the module docstring).

    Args:
        slowdown: the straggler's busy time over the fastest rank's (> 1 slows the job).
        remaining_s: the job's remaining wall time at today's speed (its remaining steps × today's step time, or
            what is left of its time limit, whichever is less).
        checkpoint_s: the job's own checkpoint save time (the stop saves once more).
        restart_s: the restart the move takes (a spare swap, else the requeue path).
        margin: staying must cost this many times the move.
    """
    stay = remaining_s * (1 - 1 / slowdown) if slowdown > 1 and remaining_s > 0 else 0.0
    cost = max(0.0, checkpoint_s) + max(0.0, restart_s)
    move = stay > cost * margin
    if move:
        why = f"staying loses {stay:.0f} s of {remaining_s:.0f} s left at {slowdown:.2f}x; moving costs {cost:.0f} s"
    elif remaining_s <= 0:
        why = "nothing left to run: not worth moving"
    else:
        why = (f"not worth moving: staying loses {stay:.0f} s of {remaining_s:.0f} s left at {slowdown:.2f}x, moving "
               f"costs {cost:.0f} s (x{margin:g} margin)")  # fmt: skip
    return MoveDecision(move, slowdown, remaining_s, stay, cost, why)


__all__ = ["DEFAULT_MARGIN", "DEFAULT_REQUEUE_S", "DEFAULT_SWAP_S", "MoveDecision", "decide_move"]

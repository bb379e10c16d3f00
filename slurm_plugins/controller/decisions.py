"""What one controller cycle decided: frozen values, each with a human ``reason`` and a machine ``code``.

The engine only computes these; the daemon applies them (``apply.py``) in the order ``decide`` returns them:

| decision | apply does | why this order |
|---|---|---|
| ``Requeue`` | ``scontrol requeue`` a victim (acked, or grace over); a borrower to ``g-<team>`` | frees GPUs first |
| ``Preempt`` | (ledger first) a note to the owner, send the victim the preemption signal | starts the grace clock |
| ``Return`` | ``scontrol update qos=g-<team>`` on a pending borrowed job | quota first, before new borrowing |
| ``Borrow`` | ``scontrol update qos=b-<team>`` on a pending guaranteed job | uses the idle GPUs that are left |
| ``SetSiteFactor`` | ``scontrol update sitefactor=<value>`` on a pending job | priority only, never capacity |

``Wait`` is not applied: it says why a pending job the engine looked at got no decision ("team perception holds
16/16 borrowed GPUs (its borrow limit)"), for the log and for the admin-comment note that ``nuro-train status`` shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the engine imports this module; only type hints point back
    from nuro.slurm_plugins.controller.engine import ControllerState


class Code(StrEnum):
    """Machine reasons: one value per distinct outcome, stable across releases (metrics are keyed by them)."""

    REQUEUE_ACKED = "requeue_acked"
    REQUEUE_GRACE_OVER = "requeue_grace_over"
    PREEMPT_RECLAIM = "preempt_reclaim"
    PREEMPT_TIER = "preempt_tier"
    BORROW = "borrow"
    RETURN = "return"
    SITE_FACTOR = "site_factor"
    # outcomes without an action (Wait)
    WAIT_ACK = "wait_ack"  # an in-flight victim has not acknowledged yet, grace not over
    WAIT_FITS_NOW = "wait_fits_now"  # Slurm can start it on idle GPUs: nothing to do
    WAIT_IN_FLIGHT = "wait_in_flight"  # GPUs it needs are being freed by earlier preemptions
    WAIT_NO_VICTIMS = "wait_no_victims"  # preemptible jobs cannot free a placeable block
    WAIT_MIN_RUN = "wait_min_run"  # only jobs inside their minimum run time could make room
    WAIT_DRAIN = "wait_drain"  # its nodes are being drained (drain.py): whole once their other jobs end
    WAIT_OWN_BORROWED = "wait_own_borrowed"  # the team holds its quota with its own borrowed jobs: they end first
    WAIT_OVER_QUOTA = "wait_over_quota"  # a guaranteed job beyond its team's quota (borrowing handles it)
    WAIT_CAPACITY = "wait_capacity"  # borrow refused: no placeable block on idle GPUs
    WAIT_BORROW_LIMIT = "wait_borrow_limit"  # borrow refused: the team's borrowing limit
    WAIT_LEND_POOL = "wait_lend_pool"  # borrow refused: lenders' lending limits / unassigned GPUs used up
    WAIT_RECLAIMED = "wait_reclaimed"  # borrow refused: the team's borrowed jobs are being reclaimed
    WAIT_FITS_QUOTA = "wait_fits_quota"  # borrow skipped: the job fits the team's quota, Slurm starts it as is


@dataclass(frozen=True)
class Borrow:
    """Move a pending ``g-<team>`` job blocked on QOSGrpGRES to ``b-<team>`` (preemptible borrowing)."""

    job_id: int
    team: str
    to_qos: str
    gpus: int
    reason: str
    code: str = Code.BORROW


@dataclass(frozen=True)
class Return:
    """Move a pending ``b-<team>`` job back to ``g-<team>``: it now fits the team's quota, so it need not be
    preemptible."""

    job_id: int
    team: str
    to_qos: str
    gpus: int
    reason: str
    code: str = Code.RETURN


@dataclass(frozen=True)
class Preempt:
    """Start checkpoint-confirmed preemption of a victim (signal it; ``Requeue`` follows on ack or at grace end).

    ``work_lost_gpu_s`` is the estimate the choice was made on: GPUs × seconds since its last committed checkpoint.
    """

    job_id: int
    team: str | None
    gpus: int
    work_lost_gpu_s: float
    for_job_id: int
    reason: str
    code: str = Code.PREEMPT_RECLAIM


@dataclass(frozen=True)
class Requeue:
    """Finish a preemption: requeue the victim, at once when it acknowledged its checkpoint, else at grace end.

    ``to_qos``: a borrowed victim goes back to its team's guaranteed QOS as it is requeued, so it borrows again only
    when the borrow phase lends it GPUs afresh (not first in line, not the cheapest victim again at once).
    """

    job_id: int
    acked: bool
    reason: str
    code: str = Code.REQUEUE_ACKED
    to_qos: str | None = None


@dataclass(frozen=True)
class SetSiteFactor:
    """Hand a team's fair share to Slurm's priority: ``scontrol update jobid=<id> sitefactor=<value>``."""

    job_id: int
    value: int
    reason: str
    code: str = Code.SITE_FACTOR


@dataclass(frozen=True)
class Wait:
    """No action for this pending job (or in-flight victim) this cycle, and why. Never applied; logged."""

    job_id: int
    reason: str
    code: str


Decision = Requeue | Preempt | Return | Borrow | SetSiteFactor

#: apply order of the decision kinds (see the module table)
APPLY_ORDER: tuple[type, ...] = (Requeue, Preempt, Return, Borrow, SetSiteFactor)


@dataclass(frozen=True)
class CycleStats:
    """Per-phase durations (seconds, in pipeline order) and counts, for one ``cycle=… phase=… duration_s=…`` line
    each."""

    phase_s: tuple[tuple[str, float], ...] = ()
    counts: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def total_s(self) -> float:
        return sum(s for _, s in self.phase_s)

    def log_fields(self) -> str:
        """``phase.classify_s=0.0012 … n.borrow=3`` in one line, stable order."""
        parts = [f"phase.{name}_s={s:.4f}" for name, s in self.phase_s]
        parts += [f"n.{k}={v}" for k, v in sorted(self.counts.items())]
        return " ".join(parts)


class Decisions(tuple):
    """The decisions of one cycle in apply order (a tuple), plus what the daemon logs and keeps.

    Attributes:
        cycle_stats: per-phase durations and counts.
        waiting: one ``Wait`` per pending job (or in-flight victim) that was considered and got no action.
        next_state: the controller state after these decisions are applied (new victims signalled at ``now``,
            ended victims and no-longer-pending site factors forgotten). The daemon may keep it, or rebuild its own.

    Equality is the tuple's: two cycles with the same decisions compare equal whatever their timings.
    """

    cycle_stats: CycleStats
    waiting: tuple[Wait, ...]
    next_state: ControllerState

    def __new__(
        cls,
        items: Iterable[Decision],
        *,
        cycle_stats: CycleStats,
        waiting: tuple[Wait, ...],
        next_state: ControllerState,
    ) -> Decisions:
        self = super().__new__(cls, items)
        self.cycle_stats = cycle_stats
        self.waiting = waiting
        self.next_state = next_state
        return self

    def of(self, kind: type) -> tuple:
        """The decisions of one kind, e.g. ``d.of(Borrow)``."""
        return tuple(d for d in self if type(d) is kind)


__all__ = [
    "APPLY_ORDER",
    "Borrow",
    "Code",
    "CycleStats",
    "Decision",
    "Decisions",
    "Preempt",
    "Requeue",
    "Return",
    "SetSiteFactor",
    "Wait",
]

"""Carry out the engine's decisions through the Slurm adapter, idempotently, one outcome per decision.

The engine (``engine.decide``) only computes; this module is the only place the controller changes Slurm. Every
decision was taken on a snapshot that may be a second old, so Slurm refusing one (the job started, ended, or was
already moved) is an expected, logged outcome, never a crash; the next cycle decides again from fresh state.

| decision | Slurm calls |
|---|---|
| Borrow / Return | ``scontrol update jobid=J qos=<b-team / g-team>`` (pending jobs only) |
| Preempt | (in the controller's ledger already: ``ledger.py``) ``scontrol update jobid=J admincomment=<note>``
  (the owner's note, best effort: ``protocol.adminnote``), then ``scancel -s USR1 --full J`` |
| Requeue | ``scontrol requeue J``; a borrowed victim then ``scontrol update jobid=J qos=g-<team>`` (it borrows again
  only when lent GPUs afresh) |
| SetSiteFactor | ``scontrol update jobid=J sitefactor=V`` |

Batches (``groups``): Borrow and Return decisions with the same target QOS, and SetSiteFactor decisions with the same
value, go to Slurm as one ``scontrol update jobid=J1,J2,… qos=Q | sitefactor=V`` of at most ``BATCH_MAX`` jobs
(``apply_group``), so a burst of submissions costs a few commands, not one per job; Slurm refuses the jobs the update
no longer fits one by one and updates the rest, and each decision still gets its own ``Outcome``. Preempt and
Requeue stay one job at a time: each is its own job's, and there are few. Nothing here writes a job's comment: its
1,024 bytes are the job's own, and a preemption must never depend on room in them (issue 30).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from nuro.protocol import adminnote
from nuro.protocol.contract import NOTE_PREEMPT, PREEMPT_SIGNAL
from nuro.slurm import Backend, SlurmError, SlurmTimeout, SlurmUnavailable
from nuro.slurm.cli_runner import CALL_TIMEOUT_MIN_S
from nuro.slurm_plugins.controller.decisions import Borrow, Decision, Preempt, Requeue, Return, SetSiteFactor
from nuro.slurm_plugins.controller.ratelog import RateLog, once

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    decision: Decision
    applied: bool
    message: str
    duration_s: float


def apply_decision(backend: Backend, decision: Decision, now: float, dry_run: bool = False) -> Outcome:
    """Apply one decision. Raises only ``SlurmUnavailable`` (the controller then skips the rest of the cycle)."""
    t0 = time.monotonic()
    job_id = int(decision.job_id)
    if dry_run:
        return Outcome(decision, False, "dry run", 0.0)
    try:
        match decision:
            case Borrow(to_qos=qos) | Return(to_qos=qos):
                backend.update_qos(job_id, qos)
                msg = f"qos -> {qos}"
            case Preempt():
                # the ledger holds it already (the daemon saves before applying); the note is for the owner only
                noted = _note_preempt(backend, decision, now)
                backend.signal(job_id, PREEMPT_SIGNAL, full=True)
                msg = f"signalled {PREEMPT_SIGNAL}{noted}; waiting for its checkpoint ack"
            case Requeue(acked=acked, to_qos=back):
                backend.requeue(job_id)
                msg = "requeued after ack" if acked else "requeued at grace end without ack"
                if back is not None:
                    msg += _back_to(backend, job_id, back)
            case SetSiteFactor(value=value):
                backend.update_site_factor(job_id, value)
                msg = f"sitefactor -> {value}"
            case _:
                raise TypeError(f"apply_decision: unknown decision {decision!r}")
    except SlurmUnavailable:
        raise
    except SlurmError as exc:
        # Expected when the snapshot is stale (job started, ended, moved): next cycle re-decides.
        log.warning("decision=%s job=%d not applied: %s", type(decision).__name__, job_id, exc)
        return Outcome(decision, False, str(exc), time.monotonic() - t0)
    return Outcome(decision, True, msg, time.monotonic() - t0)


#: Slurm refusals of the owner's note, logged once per message (a full or odd admin comment must not flood the log).
_NOTE_REFUSALS = once()


def _note_preempt(backend: Backend, decision: Preempt, now: float) -> str:
    """Tell the victim's owner why, in the job's admin comment (``nuro.protocol.adminnote``: only root and SlurmUser
    may write it, so no tenant can fill it). Best effort: a refusal never stops the signal; it is logged once per
    message and said in the outcome."""
    try:
        note = adminnote.render(NOTE_PREEMPT, decision.reason, at=round(now), **{"for": decision.for_job_id})
        backend.update_admin_comment(decision.job_id, note)
    except SlurmUnavailable:
        raise
    except (SlurmError, ValueError) as exc:
        text = str(exc)[:200]
        if _NOTE_REFUSALS.allow(text)[0]:
            log.warning("job=%s preemption note not written to its admin comment (signalled anyway; logged once): "
                        "%s", decision.job_id, text)  # fmt: skip
        return " (owner's note not written)"
    return ""


def _back_to(backend: Backend, job_id: int, qos: str) -> str:
    """Move a requeued borrower back to its guaranteed QOS. The requeue stands when this fails (the job stays in
    ``b-``; the return phase moves it once it fits the quota), so a refusal is part of the message, not an error."""
    try:
        backend.update_qos(job_id, qos)
    except SlurmUnavailable:
        raise
    except SlurmError as exc:
        log.warning("job=%d requeued but not moved back to %s: %s", job_id, qos, exc)
        return f"; still in its borrow QOS ({exc})"
    return f"; qos -> {qos}"


#: The most jobs in one list update: ~1 ms per id on 22.05, so a batch stays well inside a cycle and a timeout.
BATCH_MAX = 500

Group = tuple[Decision, ...]


def groups(decisions: Sequence[Decision]) -> list[Group]:
    """The decisions in apply order, as the units ``apply_group`` carries out: runs of Borrow/Return with one target
    QOS and of SetSiteFactor with one value become one group each (at most ``BATCH_MAX``), the rest one group per
    decision. Batching never reorders across kinds: a group holds one kind, in the order ``decide`` returned."""
    out: list[Group] = []
    for _, run in itertools.groupby(decisions, key=type):  # decide returns the kinds in apply order
        batches: dict[tuple | None, list[Decision]] = {}  # insertion order: first occurrence of each key
        for d in run:
            key = _batch_key(d)
            if key is None:
                out.append((d,))
            else:
                batches.setdefault(key, []).append(d)
        for batch in batches.values():
            out.extend(tuple(batch[i : i + BATCH_MAX]) for i in range(0, len(batch), BATCH_MAX))
    return out


def _batch_key(d: Decision) -> tuple | None:
    match d:
        case Borrow(to_qos=qos) | Return(to_qos=qos):
            return ("qos", type(d).__name__, qos)
        case SetSiteFactor(value=value):
            return ("sitefactor", value)
    return None


def apply_group(backend: Backend, group: Group, now: float, dry_run: bool = False) -> list[Outcome]:
    """Apply one group (``groups``): one decision alone through ``apply_decision``, a batch in one Slurm command.
    Raises only ``SlurmError``s that leave a batch's outcome unknown (unavailable, timed out): the controller then
    skips the rest of the cycle and decides again from a fresh snapshot."""
    if len(group) == 1:
        return [apply_decision(backend, group[0], now, dry_run)]
    if dry_run:
        return [Outcome(d, False, "dry run", 0.0) for d in group]
    t0 = time.monotonic()
    first = group[0]
    if isinstance(first, SetSiteFactor):
        refused = backend.update_jobs([d.job_id for d in group], site_factor=first.value)
        done = f"sitefactor -> {first.value}"
    else:
        qos = first.to_qos  # type: ignore[union-attr]  # Borrow / Return: groups() keys them by to_qos
        refused = backend.update_jobs([d.job_id for d in group], qos=qos)
        done = f"qos -> {qos}"
    each = (time.monotonic() - t0) / len(group)
    out = []
    for d in group:
        why = refused.get(int(d.job_id))
        if why is not None:
            log.warning("decision=%s job=%d not applied: %s", type(d).__name__, d.job_id, why)
        out.append(Outcome(d, why is None, done if why is None else why, each))
    return out


#: What cutting a budgeted call costs beyond its limit (killing and reaping ``scontrol`` on a loaded host: 5–75 ms
#: measured during a submission burst on 2 cores): a call's limit leaves it out of what is left of the budget.
CALL_CUT_S = 0.1
#: A budgeted call starts only when its limit would be at least this long (``ApplyBudget.allows``): the backend's
#: shortest call limit, below which a call would be cut before even an idle slurmctld could answer it.
CALL_MIN_S = CALL_TIMEOUT_MIN_S
#: The least share of the budget a cycle's apply gets when its snapshot took more (``ApplyBudget.for_cycle``; and
#: never less than one call's worth, ``CALL_MIN_S + CALL_CUT_S``).
APPLY_SHARE_MIN = 0.25


class ApplyBudget:
    """How many Slurm calls a cycle may still spend, and how big the next batch may be to stay inside that.

    Why: during a burst of submissions slurmctld answers each update RPC slowly (it takes the job write lock between
    hundreds of submissions, prologs and epilogs; ~0.5 s per job was measured with 300 jobs in a few seconds on the
    dev cluster), so a cycle that sends every decision stretches to tens of seconds and everything after it in the
    cycle, and the next cycle, comes late. With a budget the cycle stops sending QOS moves and SiteFactors once the
    budget is spent; the engine decides them again from the next snapshot (nothing is lost: they are not in the
    state). Requeue and Preempt are never deferred: a victim's grace and a reclaim's latency depend on them.

    The budget is the whole cycle's (``for_cycle``): what the snapshot took is spent already, so a cycle's Slurm
    calls stay within it, except that the apply always keeps ``APPLY_SHARE_MIN`` of it (a snapshot that alone takes
    the whole budget, 26.05's JSON at 500 nodes, must not starve every QOS move).

    The batch size adapts: ``per_id_s`` is a moving estimate of one job's update time (the daemon keeps it across
    cycles, so only the first batch of a burst can overrun), and a batch gets as many jobs as the remaining budget
    pays for (at least one, at most ``BATCH_MAX``).
    """

    ALWAYS = (Requeue, Preempt)

    def __init__(self, budget_s: float | None, per_id_s: float = 0.002) -> None:
        self.budget_s = budget_s
        self.per_id_s = per_id_s
        self.spent_s = 0.0

    @classmethod
    def for_cycle(cls, budget_s: float | None, snapshot_s: float, per_id_s: float) -> ApplyBudget:
        """The apply's share of a cycle budget ``budget_s`` whose snapshot took ``snapshot_s``."""
        if budget_s is None:
            return cls(None, per_id_s)
        # never less than one call's worth: a small budget must not starve every QOS move behind a slow snapshot
        floor = max(APPLY_SHARE_MIN * budget_s, CALL_MIN_S + CALL_CUT_S)
        return cls(max(floor, budget_s - snapshot_s), per_id_s)

    def _call_left_s(self) -> float:
        """How long the next budgeted call may take: what is left, less what cutting it would cost."""
        return self.budget_s - self.spent_s - CALL_CUT_S  # type: ignore[operator]  # only asked with a budget

    def has_room(self) -> bool:
        """Whether a deferrable call (a QOS move, a SiteFactor, a node weight) may still go this cycle."""
        return self.budget_s is None or self._call_left_s() >= CALL_MIN_S

    def allows(self, group: Group) -> bool:
        return isinstance(group[0], self.ALWAYS) or self.has_room()

    def deferrable_limit_s(self) -> float | None:
        """How long a deferrable call may take: what is left of the budget (None: no budget)."""
        return None if self.budget_s is None else max(CALL_MIN_S, self._call_left_s())

    def call_limit_s(self, group: Group) -> float | None:
        """How long the Slurm call for ``group`` may take: what is left of the budget for QOS moves and
        SiteFactors; None (the backend's own limit) for requeues and signals, and without a budget. One update RPC
        took 5–10 s on the dev cluster during a burst of submissions: without a limit on the call itself a single
        SiteFactor stretched the cycle that far past its budget."""
        return None if isinstance(group[0], self.ALWAYS) else self.deferrable_limit_s()

    def chunk(self, group: Group) -> list[Group]:
        """``group`` cut to what the remaining budget pays for first, then the rest in chunks of that size."""
        if self.budget_s is None or len(group) == 1 or isinstance(group[0], self.ALWAYS):
            return [group]
        left = max(0.0, self.budget_s - self.spent_s)
        size = max(1, min(BATCH_MAX, int(left / max(self.per_id_s, 1e-4))))
        return [group[i : i + size] for i in range(0, len(group), size)]

    def spend(self, seconds: float, jobs: int) -> None:
        self.spent_s += seconds
        if jobs > 0:
            self.per_id_s = 0.5 * self.per_id_s + 0.5 * (seconds / jobs)


@dataclass
class Applied:
    """What one cycle's apply did: an outcome per decision sent, the jobs whose decision did not take effect (refused,
    failed or deferred: the state forgets them and they are decided again), how many were deferred by the budget, and
    the error that stopped the rest (Slurm gone mid-cycle), if any."""

    outcomes: list[Outcome] = field(default_factory=list)
    failed: set[int] = field(default_factory=set)
    deferred: int = 0
    error: str = ""


def apply_within_budget(
    backend: Backend,
    decisions: Sequence[Decision],
    budget: ApplyBudget,
    now: float,
    *,
    dry_run: bool = False,
    cycle: int = 0,
    after_always: Callable[[], None] = lambda: None,
    errors: RateLog | None = None,
) -> Applied:
    """Send ``decisions`` in apply order (``groups``: requeues and signals first, SiteFactors last) within
    ``budget``: a group the budget cannot hold is deferred, one slurmctld does not answer within the budget's call
    limit is deferred with everything after it (requeues and signals still go), Slurm gone stops the rest, and a bug
    applying one group costs only its jobs. ``after_always`` runs once, after the requeues and signals (the packing
    weights go there: a few calls that steer every start, worth more than any QOS move when the budget is short).
    ``errors``: the controller's once-limiter (``ratelog.once``), so a job's apply error is logged when it first
    appears or changes, across cycles."""
    done = Applied()
    errors = errors or once()
    pending = groups(decisions)
    always_done = False
    while pending:
        if not always_done and not isinstance(pending[0][0], ApplyBudget.ALWAYS):
            after_always()
            always_done = True
        group = pending.pop(0)
        if not budget.allows(group):
            done.deferred += len(group)
            done.failed.update(d.job_id for d in group)
            continue
        group, *rest = budget.chunk(group)
        pending[:0] = rest
        t_group = time.monotonic()
        limit = budget.call_limit_s(group)
        try:
            with contextlib.nullcontext() if limit is None else backend.call_timeout(limit):
                outcomes = apply_group(backend, group, now, dry_run)
        except SlurmError as exc:
            if limit is not None and isinstance(exc, SlurmTimeout):
                # the budget is spent waiting on slurmctld: this group and the rest are decided again next cycle
                budget.spend(time.monotonic() - t_group, len(group))
                later = [d for g in [group, *pending] for d in g if not isinstance(d, ApplyBudget.ALWAYS)]
                done.deferred += len(later)
                done.failed.update(d.job_id for d in later)
                pending = [g for g in pending if isinstance(g[0], ApplyBudget.ALWAYS)]
                log.info("cycle=%d slurmctld did not answer an update within %.1f s: %d decisions to the next "
                         "cycle", cycle, limit, len(later))  # fmt: skip
                continue
            done.error = f"Slurm unavailable mid-cycle, rest skipped: {exc}"
            log.warning("cycle=%d %s", cycle, done.error)
            done.failed.update(d.job_id for g in [group, *pending] for d in g)
            break
        except Exception as exc:  # noqa: BLE001 - a bug applying one job's decision costs only that job
            done.failed.update(d.job_id for d in group)
            text = f"{type(exc).__name__}: {exc}"[:300]
            for decision in group:
                if errors.allow((decision.job_id, type(decision).__name__, text))[0]:
                    log.error("cycle=%d decision=%s job=%d not applied (logged once): %s", cycle,
                              type(decision).__name__, decision.job_id, text)  # fmt: skip
            continue
        budget.spend(time.monotonic() - t_group, len(group))
        for outcome in outcomes:
            decision = outcome.decision
            done.outcomes.append(outcome)
            log.info(
                "cycle=%d decision=%s job=%d applied=%s code=%s reason=%r result=%r",
                cycle, type(decision).__name__, decision.job_id, outcome.applied, decision.code,
                decision.reason, outcome.message,
            )  # fmt: skip
            if not outcome.applied:
                done.failed.add(decision.job_id)
    if not always_done and not done.error:
        after_always()
    return done


__all__ = [
    "APPLY_SHARE_MIN",
    "BATCH_MAX",
    "CALL_CUT_S",
    "CALL_MIN_S",
    "Applied",
    "ApplyBudget",
    "Outcome",
    "apply_decision",
    "apply_group",
    "apply_within_budget",
    "groups",
]

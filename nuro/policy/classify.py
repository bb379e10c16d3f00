"""Who each job belongs to, what kind of job it is, and what every team holds (controller phase 1; quota views).

Classification is by QOS first, account second, because the QOS is what Slurm's hard limit counts (``GrpTRES`` on
``g-<team>`` / ``b-<team>``), and nuro-admin only gives an account access to its own team's QOS, so the two agree in
practice:

| job QOS | kind | team |
|---|---|---|
| ``g-<team>`` | ``guaranteed`` | ``<team>`` |
| ``b-<team>`` | ``borrowed`` | ``<team>`` |
| a tier name (``urgent``) | ``tier:<name>`` | the account when it is a team, else None |
| anything else | ``unmanaged`` | the account when it is a team, else None; never a victim, its GPUs still count |
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from nuro.policy.model import Policy
from nuro.slurm.models import JobInfo
from nuro.slurm.states import JobPhase

#: Slurm reasons of a pending job that is eligible and only waits for GPUs. Held, dependent, begin-time or
#: otherwise limited jobs are left alone: preempting for a job that cannot start anyway only loses work.
WAITING_REASONS = frozenset({"Resources", "Priority", "None", ""})
#: Reasons under which Slurm will not start a pending job whatever GPUs open up: held by its user or an admin
#: (``--hold``, ``scontrol hold``), a begin time not reached (also the seconds after a requeue), a dependency not met
#: (or never to be). Such a job is no team's queue head: a SiteFactor on it would spend the head's place on a job
#: that waits anyway.
HELD_BACK_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "BeginTime", "Dependency", "DependencyNeverSatisfied"})
#: The reason slurmctld 22.05 gives a job held back by its QOS ``GrpTRES=gres/gpu=N`` (its team is at quota).
QUOTA_REASON = "QOSGrpGRES"


class Kind(StrEnum):
    GUARANTEED = "guaranteed"
    BORROWED = "borrowed"
    TIER = "tier"
    UNMANAGED = "unmanaged"


@dataclass(frozen=True)
class JobClass:
    """Team and kind of one job. ``kind`` is "guaranteed", "borrowed", "tier:<name>" or "unmanaged"."""

    team: str | None
    kind: str
    tier_priority: int = 0
    preempts_guaranteed: bool = False
    min_run_s: int = 0  # a run younger than this is never a victim (Policy.min_run_of)

    @property
    def base(self) -> Kind:
        return Kind.TIER if self.kind.startswith("tier:") else Kind(self.kind)

    @property
    def is_guaranteed(self) -> bool:
        return self.kind == Kind.GUARANTEED

    @property
    def is_borrowed(self) -> bool:
        return self.kind == Kind.BORROWED

    @property
    def is_tier(self) -> bool:
        return self.kind.startswith("tier:")

    @property
    def tier(self) -> str | None:
        return self.kind[5:] if self.is_tier else None


UNMANAGED = JobClass(None, Kind.UNMANAGED)


class PolicyIndex:
    """O(1) lookups of a policy (QOS → class, team → Team), built once per policy value."""

    _last: tuple[Policy, PolicyIndex] | None = None

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.teams = {t.name: t for t in policy.teams}
        self.by_qos: dict[str, JobClass] = {}
        for t in policy.teams:
            min_run = policy.min_run_of(team=t.name)
            self.by_qos[t.guaranteed_qos] = JobClass(t.name, Kind.GUARANTEED, min_run_s=min_run)
            self.by_qos[t.borrow_qos] = JobClass(t.name, Kind.BORROWED, min_run_s=min_run)
        self.tiers = {t.name: t for t in policy.tiers}
        self.unassigned_gpus = max(0, policy.cluster_gpus - sum(t.quota_gpus for t in policy.teams))

    @classmethod
    def of(cls, policy: Policy) -> PolicyIndex:
        """The index of ``policy``; the last one is reused (the daemon decides on one policy for many cycles)."""
        last = cls._last
        if last is not None and last[0] is policy:
            return last[1]
        index = cls(policy)
        cls._last = (policy, index)
        return index

    def classify(self, job: JobInfo) -> JobClass:
        known = self.by_qos.get(job.qos)
        if known is not None:
            return known
        team = job.account if job.account in self.teams else None
        tier = self.tiers.get(job.qos)
        if tier is not None:
            min_run = self.policy.min_run_of(team, tier.name)
            return JobClass(team, f"tier:{tier.name}", tier.priority, tier.preempts_guaranteed, min_run)
        return JobClass(team, Kind.UNMANAGED) if team else UNMANAGED


def classify(job: JobInfo, policy: Policy) -> JobClass:
    """Team and kind of ``job`` under ``policy`` (see the module table)."""
    return PolicyIndex.of(policy).classify(job)


def job_gpus(job: JobInfo) -> int:
    """GPUs the job holds (running) or asks for (pending)."""
    if job.gpus_total > 0:
        return job.gpus_total
    return max(1, job.node_count) * max(0, job.gpus_per_node)


def timestamp(dt: datetime | None, default: float = math.inf) -> float:
    """Unix seconds of a snapshot time; ``default`` when Slurm did not report it."""
    return dt.timestamp() if dt is not None else default


@dataclass
class TeamUsage:
    """GPUs of one team by kind, from the snapshot, then updated as the cycle decides (scratch, never the snapshot).

    ``g_waiting`` counts pending guaranteed jobs that wait for resources within the quota (not QOS-blocked): the
    team's own near-term demand on its quota, which it does not lend out.
    """

    g_running: int = 0
    b_running: int = 0
    b_pending: int = 0
    g_waiting: int = 0
    held: int = 0

    @property
    def borrowed(self) -> int:
        """What counts against the borrow limit and the lending pool: running and pending ``b-<team>`` jobs
        (pending ones too, so one cycle cannot move more jobs to ``b-`` than the limit could ever run)."""
        return self.b_running + self.b_pending


@dataclass
class CycleView:
    """The snapshot's jobs classified and indexed once per cycle (jobs in job-id order, so input order never
    matters)."""

    index: PolicyIndex
    classes: dict[int, JobClass] = field(default_factory=dict)
    running: list[JobInfo] = field(default_factory=list)  # holds GPUs (RUNNING, SUSPENDED, COMPLETING)
    pending: list[JobInfo] = field(default_factory=list)
    usage: dict[str, TeamUsage] = field(default_factory=dict)
    _pending_by: dict[Kind, list[JobInfo]] = field(default_factory=dict)

    def cls(self, job: JobInfo) -> JobClass:
        return self.classes[job.job_id]

    def pending_of(self, kind: Kind) -> list[JobInfo]:
        """Pending jobs of one kind (guaranteed, borrowed, tier, unmanaged), in job-id order."""
        return self._pending_by.get(kind, [])


def build_view(jobs: tuple[JobInfo, ...], policy: Policy) -> CycleView:
    """Classify every job and sum each team's GPUs by kind."""
    index = PolicyIndex.of(policy)
    view = CycleView(index=index, usage={name: TeamUsage() for name in index.teams})
    classify_one = index.classify
    classes = view.classes
    usage = view.usage
    for job in sorted(jobs, key=_job_id):
        c = classify_one(job)
        classes[job.job_id] = c
        phase = job.phase
        if phase.holds_resources:
            view.running.append(job)
            if c.team is None:
                continue
            u = usage[c.team]
            g = job_gpus(job)
            u.held += g
            if c.kind == Kind.GUARANTEED:
                u.g_running += g
            elif c.kind == Kind.BORROWED:
                u.b_running += g
        elif phase == JobPhase.PENDING:
            view.pending.append(job)
            view._pending_by.setdefault(c.base, []).append(job)
            if c.team is None:
                continue
            if c.kind == Kind.BORROWED:
                usage[c.team].b_pending += job_gpus(job)
            elif c.kind == Kind.GUARANTEED and job.reason in WAITING_REASONS:
                usage[c.team].g_waiting += job_gpus(job)
    return view


def _job_id(job: JobInfo) -> int:
    return job.job_id


__all__ = [
    "QUOTA_REASON",
    "WAITING_REASONS",
    "CycleView",
    "JobClass",
    "Kind",
    "PolicyIndex",
    "TeamUsage",
    "build_view",
    "classify",
    "job_gpus",
    "timestamp",
]

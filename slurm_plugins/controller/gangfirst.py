"""Gang first: a team's quota kept for its gang that waits on it (per team, ``gang_first: true`` in teams.yaml).

Why: slurmctld reserves nothing for a job that a QOS limit holds back. A multi-node job of a team whose own
single-node jobs fill its guaranteed QOS (``g-<team>``, ``GrpTRES`` = the quota) waits with reason ``QOSGrpGRES``;
whenever a few of the team's GPUs free up, Slurm starts the team's next small job (it fits the limit, the gang does
not), so the gang starts only if the team's small work stops arriving. In the trace replay that is most of what no
scheduler gets of the bound (docs/trace-replay.md "Where the headroom is"): the bound runs 0.16–0.18 of the
cluster as gangs at balanced seeds 7–8, hard quotas, Slurm's scavenger QOS and nuro 0.05–0.07.
(``SchedulerParameters=assoc_limit_stop`` stops the whole partition behind such a job: every other team would
wait for one team's gang.)

What it does: while such a gang waits, the team's guaranteed QOS gets ``MinTRESPerJob=gres/gpu=<the gang's GPUs>``
(``sacctmgr modify qos``). Running jobs are untouched; the team's smaller pending and newly submitted jobs wait with
reason ``QOSMinGRES`` (Slurm accepts them; measured on 22.05) and the borrow phase lends them idle GPUs of other
teams as it lends any over-quota job (``borrowing.borrow``), so the quota the team's jobs free goes to the gang. Once
the gang runs (or is gone) the floor is cleared and they start in their quota again. Only the team that opted in
waits for its own gang; other teams never do. A controller that stops leaves the floor until it starts again and
clears it (``plan`` from no known floors: every opted-in team's floor is cleared or set afresh).

Pure: ``holds`` maps the pending jobs to the floors wanted, ``plan`` to the updates; the daemon applies them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from nuro.policy.classify import QUOTA_REASON, WAITING_REASONS, job_gpus, timestamp
from nuro.policy.model import Policy
from nuro.slurm.actions import UpdateQosMinGpus
from nuro.slurm.models import JobInfo

#: Slurm's reason for a job held below its QOS's ``MinTRESPerJob`` GPUs (the floor this module sets).
MIN_REASON = "QOSMinGRES"


def _order(job: JobInfo) -> tuple[int, float, int]:
    """Slurm's queue order within a QOS: priority, then submit time, then job id."""
    return (-job.priority, timestamp(job.submit_time), job.job_id)


#: The reasons of a gang that still waits to start (on the quota, on nodes, or not yet judged): Slurm rewrites a
#: pending job's reason on every pass (``QOSGrpGRES`` in one, ``Priority`` or ``Resources`` in the next), so the
#: floor follows the gang being pending, not one reason string (a floor cleared on a passing reason let the team's
#: next small job take the quota: seen live).
WAITING = frozenset({QUOTA_REASON, MIN_REASON, *WAITING_REASONS})


def blocked_gangs(policy: Policy, pending: Iterable[JobInfo]) -> dict[str, JobInfo]:
    """Per ``gang_first`` team, the first (Slurm's order) pending multi-node job in its guaranteed QOS that waits
    to start (``WAITING``) and fits the quota at all."""
    teams = {t.guaranteed_qos: t for t in policy.teams if t.gang_first}
    out: dict[str, JobInfo] = {}
    for job in pending:
        team = teams.get(job.qos)
        if team is None or job.reason not in WAITING or max(1, job.node_count) <= 1:
            continue
        if job_gpus(job) > team.quota_gpus:
            continue
        if team.name not in out or _order(job) < _order(out[team.name]):
            out[team.name] = job
    return out


def drain_s(team_quota: int, gang_gpus: int, running: Iterable[JobInfo], now: float) -> float:
    """Seconds until the team's running guaranteed jobs (expected ends: their time limits) leave ``gang_gpus`` of
    its quota free; inf when they never do."""
    ends = sorted((timestamp(j.end_time, math.inf), job_gpus(j)) for j in running)
    free = team_quota - sum(g for _, g in ends)
    if free >= gang_gpus:
        return 0.0
    for end, gpus in ends:
        free += gpus
        if free >= gang_gpus:
            return max(0.0, end - now)
    return math.inf


def holds(
    policy: Policy, pending: Iterable[JobInfo], running: Iterable[JobInfo] = (), now: float = 0.0
) -> dict[str, int]:
    """The floor each ``gang_first`` team's guaranteed QOS should have now: its blocked gang's GPUs, when its
    running guaranteed jobs free that much of the quota within ``drain_horizon_s`` (the quota idles meanwhile);
    teams without one are left out (no floor)."""
    by_team = {t.name: t for t in policy.teams}
    mine: dict[str, list[JobInfo]] = {}
    for j in running:
        for t in policy.teams:
            if j.qos == t.guaranteed_qos:
                mine.setdefault(t.name, []).append(j)
    out = {}
    for name, job in blocked_gangs(policy, pending).items():
        team = by_team[name]
        if drain_s(team.quota_gpus, job_gpus(job), mine.get(name, ()), now) <= policy.drain_horizon_s:
            out[team.guaranteed_qos] = job_gpus(job)
    return out


@dataclass(frozen=True)
class Plan:
    updates: tuple[UpdateQosMinGpus, ...]
    floors: dict[str, int]  # what the QOS floors are once the updates are applied


def plan(policy: Policy, wanted: Mapping[str, int], current: Mapping[str, int] | None) -> Plan:
    """Updates that take the floors from ``current`` (None: unknown, e.g. a controller that just started: every
    opted-in team's floor is set or cleared) to ``wanted``."""
    opted = [t.guaranteed_qos for t in policy.teams if t.gang_first]
    updates = []
    for qos in opted:
        want = wanted.get(qos)
        if current is None or current.get(qos) != want:
            updates.append(UpdateQosMinGpus(qos, want))
    return Plan(tuple(updates), {q: g for q, g in wanted.items() if q in opted})


__all__ = ["MIN_REASON", "Plan", "blocked_gangs", "holds", "plan"]

"""Phase 5: move pending jobs between a team's guaranteed and borrow QOS.

* **Return** (5a): a pending ``b-<team>`` job goes back to ``g-<team>`` when the team's guaranteed demand (running
  plus pending guaranteed jobs that wait for resources) leaves room for it in the quota: it should not run
  preemptible when its own quota can hold it.
* **Borrow** (5b): a pending ``g-<team>`` job that Slurm holds back on ``QOSGrpGRES`` (team at quota), or on
  ``QOSMinGRES`` (the quota kept for the team's waiting gang: ``gangfirst``), moves to ``b-<team>`` only when all
  of these hold, checked in this order (the first that fails is the job's ``Wait``):

  1. the team has no borrowed job being preempted (borrowing back what is being reclaimed would thrash);
  2. it really is over quota: guaranteed GPUs running + the job > quota (Slurm's reason can be a cycle stale), or
     held by the gang-first floor;
  3. borrow limit: the team's borrowed GPUs (running and pending ``b-`` jobs) + the job ≤ ``borrow_limit_gpus``;
  4. lending pool: all teams' borrowed GPUs + the job ≤ ``lendable(team)`` (below);
  5. capacity: the gang is placeable on idle GPUs now, after the room reserved in phases 3–4 (GPUs being freed
     for others are never lent).

``lendable(b) = (cluster_gpus − Σ quotas) + Σ_{t ≠ b} min(lend_limit_t, idle_t)`` with
``idle_t = max(0, quota_t − peak_t − lend_buffer_t)`` and ``peak_t`` the lender's guaranteed demand (running plus
waiting guaranteed GPUs) at its recent peak (``demand_peaks``: the peak decays with half-life ``lend_hysteresis_s``):
a lender lends at most its lending limit, never the part of its quota its own pending jobs are about to use, not the
GPUs it used a few minutes ago either (hysteresis: those are the ones a reclaim would take back soon), and never its
buffer (``lend_buffer_gpus``, default 0: GPUs kept idle so its next jobs start without waiting for a reclaim).
The pool is aggregate (borrowers do not borrow from a named lender), so the check is on the total borrowed; it is
conservative because a borrower's own idle quota is left out. When lenders take their GPUs back, borrowed jobs above
the pool are not preempted for that alone: reclaim (phase 4) preempts them as soon as a lender's job cannot start.

Order among borrowers: fair-share load, lowest first (``fairshare.load``: decayed and current GPUs against the
entitlement, so a team that borrowed heavily in the last hours borrows last), then job priority, submit time and
job id; the load is recomputed after each accepted borrow, so one team's long queue cannot take every idle GPU in one
cycle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from nuro.policy.classify import QUOTA_REASON, WAITING_REASONS, Kind, TeamUsage, job_gpus, timestamp
from nuro.slurm.models import JobInfo
from nuro.slurm_plugins.controller import gangfirst
from nuro.slurm_plugins.controller.capacity import job_shape
from nuro.slurm_plugins.controller.cycle import Cycle
from nuro.slurm_plugins.controller.decisions import Borrow, Code, Return
from nuro.slurm_plugins.controller.fairshare import entitlements, kept_fraction, load

_RETURNABLE = WAITING_REASONS | {QUOTA_REASON}


def lendable_gpus(cy: Cycle, borrower: str) -> int:
    """The lending pool as seen by ``borrower`` (module docstring)."""
    total = cy.index.unassigned_gpus
    for name, team in cy.index.teams.items():
        if name == borrower:
            continue
        u = cy.view.usage[name]
        demand = max(u.g_running + u.g_waiting, cy.demand_peak.get(name, 0.0))
        idle = max(0, team.quota_gpus - math.ceil(demand) - team.lend_buffer_gpus)
        total += min(team.lend_limit_gpus, idle)
    return total


def demand_peaks(
    previous: Mapping[str, float], since: float | None, usage: Mapping[str, TeamUsage], half_life_s: float, now: float
) -> dict[str, float]:
    """Each team's decaying peak of guaranteed demand (running + waiting guaranteed GPUs): the larger of now's
    demand and the previous peak halved every ``half_life_s`` (0: no memory, the demand of this cycle)."""
    keep = kept_fraction(since, now, half_life_s)
    return {name: max(float(u.g_running + u.g_waiting), previous.get(name, 0.0) * keep) for name, u in usage.items()}


def return_to_quota(cy: Cycle) -> None:
    """Phase 5a: pending borrowed jobs that now fit their team's quota go back to the guaranteed QOS (not while the
    team's quota is kept for its gang: ``gangfirst``)."""
    jobs = [j for j in cy.view.pending_of(Kind.BORROWED) if j.reason in _RETURNABLE and job_gpus(j) > 0]
    jobs.sort(key=_queue_key)
    kept = gangfirst.blocked_gangs(cy.policy, cy.view.pending_of(Kind.GUARANTEED))
    for job in jobs:
        team_name = cy.view.cls(job).team
        if team_name is None or team_name in kept:
            continue
        team, u, gpus = cy.index.teams[team_name], cy.view.usage[team_name], job_gpus(job)
        demand = u.g_running + u.g_waiting
        if demand + gpus > team.quota_gpus:
            continue
        cy.returns.append(
            Return(
                job.job_id,
                team_name,
                team.guaranteed_qos,
                gpus,
                reason=f"team {team_name}'s guaranteed demand is {demand}/{team.quota_gpus} GPUs; this job's "
                f"{gpus} fit the quota, so it need not run preemptible",
            )
        )
        u.b_pending -= gpus
        u.g_waiting += gpus


def borrow(cy: Cycle) -> None:
    """Phase 5b: move QOS-blocked guaranteed jobs to their borrow QOS, fair share first (module docstring)."""
    queues: dict[str, list[JobInfo]] = {}
    for j in cy.view.pending_of(Kind.GUARANTEED):
        team = cy.view.cls(j).team
        if j.reason in (QUOTA_REASON, gangfirst.MIN_REASON) and team is not None and job_gpus(j) > 0:
            queues.setdefault(team, []).append(j)
    if not queues:
        return
    for q in queues.values():
        q.sort(key=_queue_key, reverse=True)  # pop() from the end = best first
    pool = {name: lendable_gpus(cy, name) for name in queues}
    borrowed_total = sum(u.borrowed for u in cy.view.usage.values())
    teams, usage = cy.index.teams, cy.view.usage
    no_room: set[tuple[int, int]] = set()  # shapes that did not fit: capacity only shrinks in this phase

    entitled = entitlements(cy.policy)

    def share(name: str) -> tuple[float, str]:
        return (load(cy.usage.get(name, 0.0), usage[name], entitled[name]), name)

    while queues:
        name = min(queues, key=share)
        job = queues[name].pop()
        if not queues[name]:
            del queues[name]
        team, u, gpus = teams[name], usage[name], job_gpus(job)
        if name in cy.reclaimed_teams:
            why = f"team {name}'s borrowed jobs are being preempted; no new borrowing until that ends"
            cy.wait(job.job_id, Code.WAIT_RECLAIMED, why)
            continue
        if u.g_running + gpus <= team.quota_gpus and job.reason != gangfirst.MIN_REASON:
            cy.wait(
                job.job_id,
                Code.WAIT_FITS_QUOTA,
                f"team {name} runs {u.g_running}/{team.quota_gpus} guaranteed GPUs; its {gpus} fit, Slurm starts it",
            )
            continue
        if u.borrowed + gpus > team.borrow_limit_gpus:
            cy.wait(
                job.job_id,
                Code.WAIT_BORROW_LIMIT,
                f"waiting: team {name} uses {u.g_running}/{team.quota_gpus} guaranteed GPUs and its borrowed "
                f"{u.borrowed} + {gpus} would pass its borrow limit ({team.borrow_limit_gpus})",
            )
            continue
        if borrowed_total + gpus > pool[name]:
            cy.wait(
                job.job_id,
                Code.WAIT_LEND_POOL,
                f"waiting: teams borrow {borrowed_total} GPUs; {gpus} more would pass the {pool[name]} that lending "
                "limits and unassigned GPUs allow",
            )
            continue
        shape = job_shape(job)
        known_full = any(g <= shape.gpus_per_node and k <= shape.nodes for g, k in no_room)
        if known_full or cy.cap.take_free(shape) is None:
            no_room.add((shape.gpus_per_node, shape.nodes))
            cy.wait(
                job.job_id,
                Code.WAIT_CAPACITY,
                f"waiting: no {shape.nodes} node(s) with {shape.gpus_per_node} idle GPUs each to borrow",
            )
            continue
        fair = share(name)[0]
        cy.borrows.append(
            Borrow(
                job.job_id,
                name,
                team.borrow_qos,
                gpus,
                reason=f"team {name} is at its quota ({u.g_running}/{team.quota_gpus}); borrowing {gpus} idle GPUs "
                f"(team borrowed {u.borrowed + gpus}/{team.borrow_limit_gpus}, all teams "
                f"{borrowed_total + gpus}/{pool[name]} lendable; fair-share load {fair:.2f} is the lowest waiting)",
            )
        )
        u.b_pending += gpus
        borrowed_total += gpus


def _queue_key(job: JobInfo) -> tuple[int, float, int]:
    return (-job.priority, timestamp(job.submit_time), job.job_id)


__all__ = ["borrow", "demand_peaks", "lendable_gpus", "return_to_quota"]

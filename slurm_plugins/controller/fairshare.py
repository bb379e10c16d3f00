"""Fair share over time: each team's decayed usage, its load against its entitlement, and the SiteFactor that hands
it to Slurm.

Why decayed usage: the current picture alone (GPUs held now) lets a team that borrowed heavily for hours look as
light as any other the moment its jobs end, and borrow first again. nuro keeps, per team, the mean GPUs it held
over about one half-life (an exponentially weighted mean, ``usage_half_life_s`` in teams.yaml, the same idea as
Slurm's PriorityDecayHalfLife and Kueue's admission fair sharing):

    avg_t ← avg_t · 2^(−Δt / half_life) + held_t · (1 − 2^(−Δt / half_life))

and a team's **load** is what it holds and has held, against what it is entitled to:

    entitlement_t = cluster_gpus × shares_t / Σ shares
    load_t        = (avg_t + held_t + pending borrowed_t) / (2 × entitlement_t)

Load orders the borrowers (lowest load borrows first, ``borrowing.py``) and the victims (the team with the highest
load yields first, ``victims.victim_key``), and becomes each pending job's SiteFactor so Slurm's own scheduler and
backfill follow the same order:

    value_t = round(SITE_FACTOR_MAX / (1 + load_t)), in steps of SITE_FACTOR_STEP

A team holding nothing gets 10000, one at its entitlement 5000, one at three times it 2500: monotone, bounded, never
negative. Only the head of each team's queue gets a value (``queue_heads``: what the team could start next); a job
keeps the value it has while it is within one step of its team's, so steady state costs no ``scontrol`` calls; and
the values set in one cycle are few (about one per team), which the daemon sets in one ``scontrol update
jobid=<list>`` per value (``apply.py``): a burst of submissions costs a handful of commands, not one per job.
"""

from __future__ import annotations

from collections.abc import Mapping

from nuro.policy.classify import HELD_BACK_REASONS, TeamUsage, job_gpus, timestamp
from nuro.policy.model import Policy
from nuro.slurm_plugins.controller.cycle import Cycle
from nuro.slurm_plugins.controller.decisions import SetSiteFactor

SITE_FACTOR_MAX = 10_000
SITE_FACTOR_STEP = 100  # 1 % of the range: smaller moves are not worth a scontrol call
#: The SiteFactor of a job whose nodes are being drained (``drain.py``): above every fair-share value, so Slurm's
#: scheduler plans it first and its backfill keeps the drained nodes for it (tiers still come first: QOS priority).
DRAIN_SITE_FACTOR = 2 * SITE_FACTOR_MAX


def kept_fraction(since: float | None, now: float, half_life_s: float) -> float:
    """How much of a value decaying with ``half_life_s`` is left from ``since`` to ``now`` (1 without a ``since``,
    0 for a half-life of 0: no memory)."""
    if half_life_s <= 0:
        return 0.0
    return 0.5 ** ((0.0 if since is None else max(0.0, now - since)) / half_life_s)


def decayed_usage(
    previous: Mapping[str, float], since: float | None, usage: Mapping[str, TeamUsage], half_life_s: float, now: float
) -> dict[str, float]:
    """Each team's decayed mean GPUs held, brought up to ``now`` (module docstring). Without history (first cycle,
    a restart, a new team) a team starts at what it holds now."""
    keep = kept_fraction(since, now, half_life_s)
    out = {}
    for name, u in usage.items():
        before = previous.get(name)
        out[name] = float(u.held) if before is None else before * keep + u.held * (1.0 - keep)
    return out


def entitlements(policy: Policy) -> dict[str, float]:
    """GPUs each team is entitled to when every team wants more than it holds: the cluster split by shares."""
    total = sum(t.shares for t in policy.teams) or 1
    return {t.name: policy.cluster_gpus * t.shares / total for t in policy.teams}


def load(avg: float, u: TeamUsage, entitled: float) -> float:
    """A team's fair-share load (module docstring): 1.0 = it holds and has held its entitlement."""
    if entitled <= 0:
        return float("inf")
    return (avg + u.held + u.b_pending) / (2.0 * entitled)


def team_loads(cy: Cycle) -> dict[str, int]:
    """Load per team in tenths, for the victim comparator (coarse on purpose: near-equal loads fall through to the
    victims' cost)."""
    ent = entitlements(cy.policy)
    return {
        name: min(10_000, round(10 * load(cy.usage.get(name, 0.0), u, ent[name]))) for name, u in cy.view.usage.items()
    }


def site_factor_values(cy: Cycle) -> dict[str, int]:
    """The SiteFactor per team (module docstring), in steps of ``SITE_FACTOR_STEP``."""
    ent = entitlements(cy.policy)
    out = {}
    for name, u in cy.view.usage.items():
        x = load(cy.usage.get(name, 0.0), u, ent[name])
        value = 0 if x == float("inf") else SITE_FACTOR_MAX / (1.0 + x)
        out[name] = int(round(value / SITE_FACTOR_STEP) * SITE_FACTOR_STEP)
    return out


def opening_gpus(cy: Cycle) -> int:
    """GPUs a pending job could get before the next cycle: idle now, or held by jobs being freed (victims in flight
    or chosen this cycle, jobs about to end: ``preemption.count_ending_soon``)."""
    idle = sum(n.gpus_free for n in cy.snapshot.nodes if n.is_schedulable)
    freeing = sum(job_gpus(j) for j in cy.view.running if j.job_id in cy.taken)
    return idle + freeing


def queue_heads(cy: Cycle) -> dict[str, list]:
    """Each team's pending jobs that Slurm may start next (held, begin-time and dependent jobs cannot): in its queue
    order (priority, submit time, job id), as many as add up to what the team may still add (quota + borrow limit − GPUs
    it holds) and to the GPUs that open up before the next cycle (``opening_gpus``), at least one. Only these get a
    SiteFactor: the value is the same for every job of a team, so it orders teams, never a team's own jobs, and a job
    deeper in its team's queue cannot start before the head of that queue anyway; a job that cannot start before the
    next cycle gets its value then, if it is still at the head. This is what keeps the first cycle after a start (or a
    burst of thousands of submissions) to a few updates on a busy cluster."""
    queues: dict[str, list] = {}
    for job in cy.view.pending:
        team = cy.view.cls(job).team
        if team is not None and job.reason not in HELD_BACK_REASONS:
            queues.setdefault(team, []).append(job)
    heads = {}
    opening = opening_gpus(cy)
    for team, jobs in queues.items():
        jobs.sort(key=lambda j: (-j.priority, timestamp(j.submit_time), j.job_id))
        t = cy.index.teams[team]
        room, taken = min(opening, t.quota_gpus + t.borrow_limit_gpus - cy.view.usage[team].held), 0
        head = []
        for job in jobs:
            if head and taken + job_gpus(job) > room:
                break
            head.append(job)
            taken += job_gpus(job)
        heads[team] = head
    return heads


def set_site_factors(cy: Cycle) -> dict[int, int]:
    """Phase 6: ``SetSiteFactor`` for the jobs at the head of each team's queue (``queue_heads``) whose value is more
    than one step from their team's; returns job id → value now in force (set this cycle or kept from before,
    head or not) for the next state."""
    values = site_factor_values(cy)
    previous = cy.state.site_factors
    in_force: dict[int, int] = {job.job_id: previous[job.job_id] for job in cy.view.pending if job.job_id in previous}
    heads = queue_heads(cy)
    for job in cy.view.pending:  # jobs drained for get the boost, and lose it once they are not drained for any more
        team = cy.view.cls(job).team
        boosted = in_force.get(job.job_id) == DRAIN_SITE_FACTOR
        if team is not None and (job.job_id in cy.draining) != boosted and job not in heads.get(team, ()):
            heads.setdefault(team, []).append(job)
    for team, head in heads.items():
        for job in head:
            value = DRAIN_SITE_FACTOR if job.job_id in cy.draining else values[team]
            prev = previous.get(job.job_id)
            if prev is not None and abs(value - prev) <= SITE_FACTOR_STEP:  # the drain value is far from all others
                continue
            in_force[job.job_id] = value
            why = (
                f"nodes {cy.draining[job.job_id]} are drained for it: first in Slurm's queue so backfill keeps them"
                if job.job_id in cy.draining
                else f"team {team} holds {cy.view.usage[team].held} GPUs (decayed mean {cy.usage.get(team, 0):.0f}) "
                "against its fair-share entitlement"
            )
            cy.site_factors.append(
                SetSiteFactor(
                    job.job_id, value, reason=f"{why}; site factor {prev if prev is not None else 'unset'} → {value}"
                )
            )
    return in_force


__all__ = [
    "DRAIN_SITE_FACTOR",
    "SITE_FACTOR_MAX",
    "SITE_FACTOR_STEP",
    "decayed_usage",
    "entitlements",
    "kept_fraction",
    "load",
    "queue_heads",
    "set_site_factors",
    "site_factor_values",
    "team_loads",
]

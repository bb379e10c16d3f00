"""The controller's pure decision engine: ``decide(snapshot, policy, state, now) -> Decisions``.

No I/O, no clock, no randomness: the same inputs give the same decisions (the order of jobs and nodes in the
snapshot does not matter either). The daemon reads a snapshot, calls ``decide`` and applies the result.

The cycle is a numbered pipeline; each phase is one small function and is timed:

1. **classify** jobs by QOS and account (``classify.py``); sum each team's GPUs by kind; bring each team's decayed
   usage up to now and derive its fair-share load (``fairshare.py``).
2. **finish** in-flight preemptions: requeue on ack, or at grace end without one (``preemption.py``); jobs that end
   by their time limit sooner than preempting them pays off (``grace_s + restart_cost_s + their seconds since their
   checkpoint``, at most ``ending_soon_s``) count as being freed too.
3. **tiers**: pending tier jobs (``urgent``) get room from borrowers, then lower classes.
4. **reclaim**: pending guaranteed jobs within quota get room from borrowers.
5. **borrow**: return pending borrowed jobs that fit the quota again; move QOS-blocked guaranteed jobs to the
   borrow QOS within the borrow limit, the lending pool and idle capacity, fair share first (``borrowing.py``).
6. **fair share** → SiteFactor of pending jobs (``fairshare.py``).

No run younger than its minimum run time (``min_run_s``) is ever chosen as a victim, and a preempted borrower is
requeued into its team's guaranteed QOS: it borrows again only when the borrow phase lends it GPUs afresh, in
fair-share order, instead of restarting first and being the cheapest victim again.

Tiers come before reclaim (the brief listed them the other way round) because capacity freed in one cycle should go
where Slurm's priority sends it: a tier QOS outranks every team's guaranteed QOS.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType

from nuro.policy.classify import JobClass, PolicyIndex, build_view, classify, timestamp
from nuro.policy.model import Policy
from nuro.slurm.models import ClusterSnapshot
from nuro.slurm_plugins.controller.borrowing import borrow, demand_peaks, lendable_gpus, return_to_quota
from nuro.slurm_plugins.controller.capacity import Capacity, settled
from nuro.slurm_plugins.controller.cycle import ControllerState, Cycle
from nuro.slurm_plugins.controller.decisions import (
    Borrow,
    Code,
    CycleStats,
    Decision,
    Decisions,
    Preempt,
    Requeue,
    Return,
    SetSiteFactor,
    Wait,
)
from nuro.slurm_plugins.controller.fairshare import decayed_usage, set_site_factors, team_loads
from nuro.slurm_plugins.controller.preemption import count_ending_soon, finish_in_flight, make_room_for_tiers, reclaim
from nuro.slurm_plugins.controller.progress import EMPTY as NO_PROGRESS
from nuro.slurm_plugins.controller.progress import Progress
from nuro.slurm_plugins.controller.victims import victim_key

#: Test hook (the dev cluster sets it; never set in production): a job whose comment contains this text makes
#: ``decide`` raise, as a parser or rule bug triggered by that job's record would. It lets the isolation tests prove
#: on a live cluster that such a job costs only itself (``isolation.Isolator``), whatever the next real bug is.
FAULT_MARK = os.environ.get("NURO_CONTROLLER_TEST_FAULT_MARK", "")


class InjectedFault(RuntimeError):
    """Raised by the ``FAULT_MARK`` test hook."""


def decide(
    snapshot: ClusterSnapshot,
    policy: Policy,
    state: ControllerState,
    now: float,
    progress: Mapping[int, Progress] = NO_PROGRESS,
) -> Decisions:
    """One controller cycle: the decisions to apply, in apply order (see ``decisions.py``).

    Args:
        snapshot: what Slurm reported (frozen; never modified).
        policy: the validated teams.yaml.
        state: soft state from the previous cycle (after a restart: ``ControllerState`` with the in-flight
            preemptions of the controller's ledger).
        now: Unix seconds, the decision time (grace ends, work lost); injected so tests control the clock.
        progress: each job's newest commit and stop ack as the node agents reported them (``progress.py``).

    Returns:
        ``Decisions``: a tuple of Requeue, Preempt, Return, Borrow, SetSiteFactor (in that order), with
        ``cycle_stats``, ``waiting`` (why pending jobs got no action) and ``next_state``.
    """
    phases: list[tuple[str, float]] = []
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        t2 = time.perf_counter()
        phases.append((name, t2 - t))
        t = t2

    # 1. classify: a scratch copy of capacity and per-team usage; the snapshot stays untouched (K2), but a node's GPUs
    #    count as free when either the node read or the job read says so (``capacity.settled``)
    reported, snapshot = snapshot, settled(snapshot)
    index = PolicyIndex.of(policy)
    cy = Cycle(
        snapshot=snapshot,
        policy=policy,
        state=state,
        now=now,
        index=index,
        view=build_view(snapshot.jobs, policy),
        cap=Capacity(snapshot.nodes),
        progress=progress,
    )
    cy.usage = decayed_usage(state.usage, state.usage_at, cy.view.usage, policy.usage_half_life_s, now)
    cy.loads = team_loads(cy)
    cy.demand_peak = demand_peaks(state.demand_peak, state.usage_at, cy.view.usage, policy.lend_hysteresis_s, now)
    if FAULT_MARK:
        for job in snapshot.jobs:
            if FAULT_MARK in (job.comment or ""):
                raise InjectedFault(f"test fault hook: job {job.job_id}'s comment contains {FAULT_MARK!r}")
    lap("classify")
    # 2. finish in-flight preemptions (their GPUs count as being freed from here on)
    finish_in_flight(cy)
    count_ending_soon(cy)
    lap("finish")
    # 3. tiers, highest first
    make_room_for_tiers(cy)
    lap("tiers")
    # 4. reclaim quota from borrowers
    reclaim(cy)
    lap("reclaim")
    # 5. return, then borrow, on what is left idle
    return_to_quota(cy)
    borrow(cy)
    lap("borrow")
    # 6. fair share as SiteFactor
    site_in_force = set_site_factors(cy)
    lap("fairshare")

    items: list[Decision] = [*cy.requeues, *cy.preempts, *cy.returns, *cy.borrows, *cy.site_factors]
    preempting = dict(cy.in_flight)
    # whole seconds, as the signed mark and the job's ack are: a float kept here would win over the mark and make an
    # ack in the same second as the signal look older than the signal (requeued at grace end instead of on the ack)
    signalled_at = float(round(now))
    preempting.update((p.job_id, signalled_at) for p in cy.preempts)
    claims = {j: at for j, at in state.claims.items() if cy.claim_open(j, at)}
    claims.update((p.for_job_id, signalled_at) for p in cy.preempts)
    next_state = ControllerState(
        preempting=MappingProxyType(dict(sorted(preempting.items()))),
        site_factors=MappingProxyType(site_in_force),
        usage=MappingProxyType(cy.usage),
        usage_at=now,
        claims=MappingProxyType(dict(sorted(claims.items()))),
        demand_peak=MappingProxyType(cy.demand_peak),
    )
    counts = Counter(type(d).__name__.lower() for d in items)
    counts.update(f"wait.{w.code}" for w in cy.waits)
    counts.update(
        {"jobs.running": len(cy.view.running), "jobs.pending": len(cy.view.pending), "in_flight": len(cy.in_flight)}
    )
    if snapshot is not reported:  # nodes the two reads disagreed on (one cycle now and then; every cycle is a bug)
        counts["nodes.settled"] = sum(a is not b for a, b in zip(reported.nodes, snapshot.nodes, strict=True))
    stats = CycleStats(phase_s=tuple(phases), counts=MappingProxyType(dict(counts)))
    return Decisions(items, cycle_stats=stats, waiting=tuple(cy.waits), next_state=next_state)


def rebuild_state(snapshot: ClusterSnapshot, ledger: Mapping[int, float]) -> ControllerState:
    """The state a restarted daemon starts from: the in-flight preemptions its ledger holds (``ledger.py``) whose
    victims still hold resources in the run they were signalled in (site factors are simply set again)."""
    preempting = {}
    for job in snapshot.jobs:
        at = ledger.get(job.job_id)
        if at is not None and job.phase.holds_resources and timestamp(job.start_time, float("-inf")) <= at:
            preempting[job.job_id] = at
    return ControllerState(preempting=MappingProxyType(dict(sorted(preempting.items()))))


__all__ = [
    "Borrow",
    "Code",
    "ControllerState",
    "CycleStats",
    "Decisions",
    "JobClass",
    "Preempt",
    "Requeue",
    "Return",
    "SetSiteFactor",
    "Wait",
    "classify",
    "decide",
    "lendable_gpus",
    "rebuild_state",
    "victim_key",
]

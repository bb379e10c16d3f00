"""Phases 2–4: finish in-flight preemptions, make room for tier jobs, reclaim quota from borrowers.

Checkpoint-confirmed preemption (docs/controller.md): the controller signals a victim (``Preempt``) and records it in
its own ledger (``ledger.py``), the job commits a checkpoint and acknowledges through its node agent (``progress.py``;
a commit learnt after the signal counts as the acknowledgement too), and the controller requeues it at once on the
ack, or at grace end without one (``Requeue``). Nothing on this path is written into or read from the job's comment,
whose 1,024 bytes its user may fill. Slurm's own GraceTime stays the backstop when the controller is down.

Capacity is shared within a cycle in this order: tier jobs first (highest tier first, the order Slurm's priority
gives them), then guaranteed jobs by Slurm priority. Each pending job that gets room reserves its nodes in the
scratch capacity, so later jobs (and borrowing, phase 5) never count the same GPUs twice.
"""

from __future__ import annotations

import math

from nuro.policy.classify import WAITING_REASONS, JobClass, Kind, job_gpus, timestamp
from nuro.slurm.models import JobInfo
from nuro.slurm.states import JobPhase
from nuro.slurm_plugins.controller.capacity import Shape, gpus_on_nodes, job_shape
from nuro.slurm_plugins.controller.cycle import Cycle
from nuro.slurm_plugins.controller.decisions import Code, Preempt, Requeue
from nuro.slurm_plugins.controller.drain import Drain, plan_drain
from nuro.slurm_plugins.controller.victims import (
    RANK_BORROWED,
    RANK_GUARANTEED,
    RANK_TIER,
    Candidate,
    Eligible,
    VictimPool,
    choose_in_one_leaf,
    choose_victims,
    seconds_since_checkpoint,
    work_lost_gpu_s,
)


def finish_in_flight(cy: Cycle) -> None:
    """Phase 2: requeue victims that acknowledged or whose grace is over; keep counting the rest as being freed.

    In flight = ``state.preempting`` (the controller's own record, kept in its ledger across restarts). A victim
    that ended, or started again after the signal (it was requeued and restarted), is forgotten. Acknowledged = the
    job's agent reported an ack, or a commit, at or after the signal (``Progress.acked_since``).
    """
    signalled = dict(cy.state.preempting)
    grace_s = cy.policy.grace_s
    for job_id in sorted(signalled):
        at = float(round(signalled[job_id]))  # whole seconds, as the mark and the ack: an ack never precedes it
        job = cy.snapshot.job(job_id)
        if job is None or not job.phase.holds_resources:
            continue
        if job.phase == JobPhase.RUNNING and timestamp(job.start_time, -math.inf) > at:
            continue  # restarted after the signal: a new run, not a victim (a COMPLETING job's start time is
            # unreliable: squeue reports "now" for a requeued victim on its way out)
        cy.in_flight[job_id] = at
        cy.taken.add(job_id)
        for node, gpus in gpus_on_nodes(job):
            cy.cap.add_freeing(node, gpus)
        c = cy.view.cls(job)
        if c.is_borrowed and c.team is not None:
            cy.reclaimed_teams.add(c.team)
        if job.phase != JobPhase.RUNNING:
            continue  # completing or suspended: on its way out, nothing to requeue
        progress = cy.progress_of(job)
        back = cy.index.teams[c.team].guaranteed_qos if c.is_borrowed and c.team is not None else None
        if progress is not None and progress.acked_since(at):
            if progress.ack_at is not None and progress.ack_at >= at:  # else a commit after the signal
                what, step, when = "acknowledged its committed checkpoint", progress.ack_step, progress.ack_at
            else:
                what, step, when = "committed a checkpoint", progress.commit_step, progress.commit_at
            at_step = f" at step {step}" if step is not None else ""
            cy.requeues.append(
                Requeue(
                    job_id,
                    acked=True,
                    reason=f"job {job_id} {what}{at_step} {(when or at) - at:.0f} s after the signal; "
                    "requeue now rather than at grace end",
                    code=Code.REQUEUE_ACKED,
                    to_qos=back,
                )
            )
        elif cy.now >= at + grace_s:
            cy.requeues.append(
                Requeue(
                    job_id,
                    acked=False,
                    reason=f"job {job_id} did not acknowledge a checkpoint within the {grace_s} s grace after the "
                    "signal; requeue without it (it resumes from its last committed checkpoint)",
                    code=Code.REQUEUE_GRACE_OVER,
                    to_qos=back,
                )
            )
        else:
            cy.wait(
                job_id,
                Code.WAIT_ACK,
                f"signalled {cy.now - at:.0f} s ago; waiting for its checkpoint ack (grace {grace_s} s)",
            )


def count_ending_soon(cy: Cycle) -> None:
    """Phase 2b: running jobs that will end by themselves (start + time limit) sooner than preempting them pays off
    count as being freed: a pending job that needs their GPUs waits for them (``WAIT_IN_FLIGHT``) and they are never
    lent to a borrower meanwhile.

    The rule is the cost of each choice: preempting gives the GPUs back after up to ``grace_s`` and costs the victim
    ``restart_cost_s`` of staging plus the training since its last committed checkpoint; waiting costs the claimant
    only the time until the job ends. So a job is waited for when it ends within ``grace_s + restart_cost_s + its
    seconds since its checkpoint``, and never when it ends later than ``ending_soon_s`` (default 600 s; the most a
    claimant waits instead of reclaiming; 0: no waiting). In the trace replay this cut reclaims of long 1-GPU
    borrowers 2–12× at the same utilisation (docs/trace-replay.md)."""
    limit = cy.now + cy.policy.ending_soon_s
    base = cy.now + cy.policy.grace_s + cy.policy.restart_cost_s
    for job in cy.view.running:
        if job.job_id in cy.taken or job.phase != JobPhase.RUNNING:
            continue
        end = timestamp(job.end_time, math.inf)
        if end > limit:
            continue
        if end <= base or end <= base + seconds_since_checkpoint(job, _checkpoint_at(cy, job), cy.now):
            cy.taken.add(job.job_id)
            for node, gpus in gpus_on_nodes(job):
                cy.cap.add_freeing(node, gpus)


def make_room_for_tiers(cy: Cycle) -> None:
    """Phase 3: pending tier jobs, highest tier first, get room from borrowers first, then (when the tier
    preempts guaranteed jobs) from other teams' guaranteed jobs and lower tiers."""
    jobs = [j for j in cy.view.pending_of(Kind.TIER) if j.reason in WAITING_REASONS]
    jobs.sort(key=lambda j: (-cy.view.cls(j).tier_priority, *_queue_key(j)))
    for job in jobs:
        c = cy.view.cls(job)
        if c.preempts_guaranteed:
            pool, eligible = _pool_all(cy), _tier_eligible(c)
        else:
            pool, eligible = _pool_borrowed(cy), _any
        _make_room(cy, job, pool, eligible, Code.PREEMPT_TIER, f"{c.kind} job")


def reclaim(cy: Cycle) -> None:
    """Phase 4: a pending guaranteed job within its team's quota that cannot start on idle GPUs gets room from
    borrowed jobs (of any team). Jobs of a team are counted against its quota in priority order within the cycle,
    so two jobs cannot both claim the same last GPUs of a quota.

    A team that holds its quota counting its own borrowed jobs is not short of its guarantee: its guaranteed job
    waits for them to end (``WAIT_OWN_BORROWED``) instead of preempting another team's borrower, which would only
    swap whose borrowed work runs and cost a preemption."""
    jobs = [j for j in cy.view.pending_of(Kind.GUARANTEED) if j.reason in WAITING_REASONS and job_gpus(j) > 0]
    jobs.sort(key=_queue_key)
    committed = {name: u.g_running for name, u in cy.view.usage.items()}
    for job in jobs:
        team = cy.view.cls(job).team
        if team is None:  # classify gives every guaranteed job its team; kept for type narrowing
            continue
        quota = cy.index.teams[team].quota_gpus
        gpus = job_gpus(job)
        own_borrowed = cy.view.usage[team].b_running
        if committed[team] + gpus <= quota < committed[team] + own_borrowed + gpus:
            cy.wait(
                job.job_id,
                Code.WAIT_OWN_BORROWED,
                f"team {team} holds {committed[team]} guaranteed + {own_borrowed} borrowed GPUs of its {quota} quota; "
                "its own borrowed jobs give the GPUs back as they end, no other team's job is preempted for this one",
            )
            continue
        if committed[team] + gpus > quota:
            cy.wait(
                job.job_id,
                Code.WAIT_OVER_QUOTA,
                f"team {team} has {committed[team]}/{quota} guaranteed GPUs running or being made room for; "
                f"this job's {gpus} would exceed the quota (it may borrow once Slurm reports QOSGrpGRES)",
            )
            continue
        if _make_room(cy, job, _pool_borrowed(cy), _any, Code.PREEMPT_RECLAIM, f"{team}'s guaranteed job"):
            committed[team] += gpus


def _make_room(cy: Cycle, job: JobInfo, pool: VictimPool, eligible: Eligible, code: Code, what: str) -> bool:
    """Reserve room for ``job``: on idle GPUs, else on GPUs being freed, else by choosing new victims.

    Victims still inside their minimum run time are not taken; when only they could make room, the job waits
    (``WAIT_MIN_RUN``) and nothing is preempted this cycle. A gang with the one-leaf hint gets its room inside one
    leaf when any leaf can give it (``capacity.py``).

    Returns whether the job has room now or once its victims are gone (its GPUs are then reserved)."""
    shape = job_shape(job)
    if shape.gpus_per_node <= 0:
        return False
    if cy.cap.take_free(shape) is not None:
        cy.wait(job.job_id, Code.WAIT_FITS_NOW, f"fits on idle GPUs ({_shape(shape)}); Slurm starts it")
        return True
    now = cy.now

    def grown(c: Candidate) -> bool:
        return c.exempt_until <= now and eligible(c)

    found = _find_victims(cy, shape, pool, grown)
    if found is None:
        later = _find_victims(cy, shape, pool, eligible)
        if later is not None:
            young = [c for c in later[0] if c.exempt_until > now]
            soonest = max((c.exempt_until for c in young), default=now)
            cy.wait(
                job.job_id,
                Code.WAIT_MIN_RUN,
                f"needs {_shape(shape)}; the jobs that could make room are inside their minimum run time "
                f"(job {young[0].job_id if young else '?'} for {soonest - now:.0f} s more); no preemption before",
            )
            return False
        drain = plan_drain(cy, shape, pool, grown)
        if drain is None:
            cy.wait(
                job.job_id,
                Code.WAIT_NO_VICTIMS,
                f"needs {_shape(shape)}; idle GPUs, GPUs being freed and the jobs it may preempt cannot free such a "
                f"block, and no nodes will be whole within {cy.policy.drain_horizon_s} s",
            )
            return False
        return _drain(cy, job, shape, drain, code, what)
    victims, within = found
    if _claim_settling(cy, job, shape, victims):
        return False
    if not victims:
        cy.wait(job.job_id, Code.WAIT_IN_FLIGHT, f"needs {_shape(shape)}; GPUs being freed by earlier preemptions")
    _signal(cy, job, victims, code, f"{what} {job.job_id} needs {_shape(shape)}")
    usable = cy.cap.nodes_avail_at_least(shape.gpus_per_node, within)
    cy.cap.reserve(cy.cap.pick_for(shape, usable), shape.gpus_per_node)
    return True


def _drain(cy: Cycle, job: JobInfo, shape: Shape, drain: Drain, code: Code, what: str) -> bool:
    """Carry out a drain plan (``drain.py``): preempt the borrowers on the nodes, reserve the nodes for ``job``."""
    names = ",".join(cy.cap.names[n] for n in drain.nodes)
    in_s = max(0.0, drain.ready_at - cy.now)
    cy.draining[job.job_id] = names
    if _claim_settling(cy, job, shape, list(drain.victims)):
        cy.cap.reserve(drain.nodes, shape.gpus_per_node)  # their idle GPUs are not lent while the victims go
        return True
    if not drain.victims:
        cy.wait(job.job_id, Code.WAIT_DRAIN, f"needs {_shape(shape)}; nodes {names} are whole in {in_s:.0f} s")
    _signal(cy, job, list(drain.victims), code,
            f"{what} {job.job_id} needs {_shape(shape)}, whole nodes that no victim set frees now; draining {names} "
            f"(whole in {in_s:.0f} s)")  # fmt: skip
    cy.cap.reserve(drain.nodes, shape.gpus_per_node)
    return True


def _claim_settling(cy: Cycle, job: JobInfo, shape: Shape, victims: list[Candidate]) -> bool:
    """Whether ``job`` would get new victims while those it got last are still giving their GPUs back."""
    if not victims or not cy.claim_open(job.job_id):
        return False
    claimed = cy.state.claims[job.job_id]
    cy.wait(
        job.job_id,
        Code.WAIT_IN_FLIGHT,
        f"needs {_shape(shape)}; its victims signalled {cy.now - claimed:.0f} s ago are still giving their GPUs back",
    )
    return True


def _signal(cy: Cycle, job: JobInfo, victims: list[Candidate], code: Code, why: str) -> None:
    """Preempt ``victims`` for ``job``: their GPUs count as being freed, and they are never chosen twice."""
    now = cy.now
    for v in victims:
        cy.taken.add(v.job_id)
        for n, gpus in v.on_nodes:
            cy.cap.add_freeing(cy.cap.names[n], gpus)
        if v.rank == RANK_BORROWED and v.team is not None:
            cy.reclaimed_teams.add(v.team)
        cy.preempts.append(
            Preempt(
                v.job_id,
                v.team,
                v.gpus,
                round(v.work_lost_gpu_s, 1),
                job.job_id,
                reason=f"{why}; {_victim_text(v, now)}",
                code=code,
            )
        )


def _find_victims(
    cy: Cycle, shape: Shape, pool: VictimPool, eligible: Eligible
) -> tuple[list[Candidate], set[int] | None] | None:
    """Victims for ``shape`` and the nodes they free it on: inside one leaf for a hinted gang when a leaf can hold
    it, else anywhere (Slurm places a hinted gang across leaves once its switch wait is over)."""
    if cy.cap.one_leaf(shape):
        in_leaf = choose_in_one_leaf(cy.cap, shape, pool, eligible)
        if in_leaf is not None:
            return in_leaf
    victims = choose_victims(cy.cap, shape, pool, eligible)
    return None if victims is None else (victims, None)


def _victim_text(v: Candidate, now: float) -> str:
    kind = {RANK_BORROWED: "borrowed", RANK_GUARANTEED: "guaranteed"}.get(v.rank, "lower-tier")
    ckpt = f"checkpoint {now - v.last_checkpoint_at:.0f} s old" if v.last_checkpoint_at is not None else "no checkpoint"
    return (
        f"preempting {kind} job {v.job_id} of {v.team or 'no team'} ({v.gpus} GPUs, {ckpt}) "
        f"loses {v.work_lost_gpu_s:.0f} GPU·s + {v.restart_gpu_s:.0f} GPU·s restart, the least among victims "
        "that free a placeable block"
    )


def _shape(shape: Shape) -> str:
    return f"{shape.nodes} node(s) × {shape.gpus_per_node} GPUs"


def _queue_key(job: JobInfo) -> tuple[int, float, int]:
    """Slurm's order among pending jobs: higher priority, then older submission, then job id."""
    return (-job.priority, timestamp(job.submit_time), job.job_id)


def _any(_: Candidate) -> bool:
    return True


def _tier_eligible(c: JobClass) -> Eligible:
    """Borrowers of any team; guaranteed jobs of other teams; tier jobs of a strictly lower tier."""

    def eligible(v: Candidate) -> bool:
        if v.rank == RANK_BORROWED:
            return True
        if v.rank == RANK_GUARANTEED:
            return c.team is None or v.team != c.team
        return v.tier_priority < c.tier_priority

    return eligible


def _candidate(cy: Cycle, job: JobInfo, c: JobClass, rank: int) -> Candidate | None:
    """The victim view of a running job, built once per cycle."""
    if job.job_id in cy.candidates:
        return cy.candidates[job.job_id]
    cand = cy.candidates[job.job_id] = _new_candidate(cy, job, c, rank)
    return cand


def _new_candidate(cy: Cycle, job: JobInfo, c: JobClass, rank: int) -> Candidate | None:
    on_nodes = tuple(
        (cy.cap.number[node], gpus)
        for node, gpus in gpus_on_nodes(job)
        if node in cy.cap.number and cy.cap.schedulable[cy.cap.number[node]] and gpus > 0
    )
    if not on_nodes:
        return None  # frees nothing a pending job could use
    lost, ckpt_at = work_lost_gpu_s(job, _checkpoint_at(cy, job), cy.now)
    started = timestamp(job.start_time, cy.now)
    return Candidate(
        job.job_id,
        c.team,
        rank,
        c.tier_priority if rank == RANK_TIER else 0,
        job_gpus(job),
        lost,
        started,
        on_nodes,
        ckpt_at,
        restart_gpu_s=float(job_gpus(job) * cy.policy.restart_cost_s),
        exempt_until=started + c.min_run_s,
        team_load=cy.loads.get(c.team, 0) if c.team is not None else 0,
    )


def _checkpoint_at(cy: Cycle, job: JobInfo) -> float | None:
    """When the job's newest commit was reported by its agents (None: none known)."""
    p = cy.progress_of(job)
    return p.commit_at if p is not None else None


def _build_pool(cy: Cycle, ranks: dict[str, int]) -> VictimPool:
    pool = VictimPool(taken=cy.taken)
    cands = []
    for job in cy.view.running:
        if job.phase != JobPhase.RUNNING:
            continue
        c = cy.view.cls(job)
        rank = ranks.get(c.base)
        if rank is None:
            continue
        cand = _candidate(cy, job, c, rank)
        if cand is not None:
            cands.append(cand)
    pool.add(cands)
    return pool


def _pool_borrowed(cy: Cycle) -> VictimPool:
    """Running borrowed jobs, built on first use (only when someone needs room)."""
    return cy.pool("borrowed") or cy.set_pool("borrowed", _build_pool(cy, {Kind.BORROWED: RANK_BORROWED}))


def _pool_all(cy: Cycle) -> VictimPool:
    """Running borrowed, guaranteed and tier jobs (for tiers that may preempt guaranteed jobs)."""
    ranks = {Kind.BORROWED: RANK_BORROWED, Kind.GUARANTEED: RANK_GUARANTEED, Kind.TIER: RANK_TIER}
    return cy.pool("all") or cy.set_pool("all", _build_pool(cy, ranks))


__all__ = ["count_ending_soon", "finish_in_flight", "make_room_for_tiers", "reclaim"]

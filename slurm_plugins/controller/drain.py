"""Draining whole nodes for a gang that victims alone cannot place (phases 3–4, after the victim search fails).

A pending job within its quota that needs whole nodes (a multi-node gang, or 8 GPUs on an 8-GPU node) can wait for
ever behind borrowed jobs: borrowed 1-GPU jobs land on the nodes whose guaranteed jobs are ending, so no node ever
becomes whole, and preempting borrowers cannot help while every node also holds a job that may not be preempted.
Measured in the trace replay (docs/trace-replay.md): 2-node gangs that Slurm alone started at once never started
under the engine of issue 13's first pass (WAIT_NO_VICTIMS for 8–10 hours of replay time).

The plan: for every node, the time it would hold the gang's GPUs per node if the preemptible jobs on it were
preempted now and every other job ran to its time limit; take the nodes that are ready soonest (inside one leaf for
a gang with the one-leaf hint, when a leaf can hold it). When they are ready within ``drain_horizon_s``, preempt the
borrowers on them now and reserve the nodes in the cycle's capacity, so nuro lends none of their GPUs meanwhile.
With the borrowers gone, Slurm's backfill reservation for the gang ends at the remaining jobs' time limits, so only
jobs that end before it start there and the nodes are whole when the gang's reservation comes.

Preempting early costs the borrowers their work since their last checkpoint and a restart, and the nodes' GPUs may
idle until the reservation (Slurm backfills short jobs into them); the horizon bounds that cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nuro.policy.classify import timestamp
from nuro.slurm.states import JobPhase
from nuro.slurm_plugins.controller.capacity import Shape, gpus_on_nodes
from nuro.slurm_plugins.controller.cycle import Cycle
from nuro.slurm_plugins.controller.victims import Candidate, Eligible, VictimPool, gpus_on_node, set_cost, victim_key


@dataclass(frozen=True)
class Drain:
    """The nodes to drain for a gang, the victims to preempt on them now, and when the nodes will be whole."""

    nodes: tuple[int, ...]
    victims: tuple[Candidate, ...]
    ready_at: float


def plan_drain(cy: Cycle, shape: Shape, pool: VictimPool, eligible: Eligible) -> Drain | None:
    """The drain for ``shape`` (module docstring), or None when no set of nodes is whole within the horizon."""
    horizon = cy.policy.drain_horizon_s
    if horizon <= 0 or shape.gpus_per_node <= 0 or (shape.nodes < 2 and shape.gpus_per_node < cy.cap.max_gpus):
        return None  # only gangs and whole-node jobs: a smaller job gets GPUs as any job on its node ends
    g, k, now = shape.gpus_per_node, shape.nodes, cy.now
    # a shape at least as big as one that found no nodes this cycle is not planned again this cycle (victims chosen
    # meanwhile could make one possible: the next cycle looks again), so a long queue costs a plan per shape
    if any(g >= mg and k >= mk for mg, mk in cy.drain_misses):
        return None
    others = _other_releases(cy, pool, eligible)
    per_node: dict[int, tuple[float, list[Candidate]]] = {}
    for n in range(len(cy.cap.names)):
        if not cy.cap.schedulable[n]:
            continue
        plan = _node_plan(n, cy.cap.avail(n), g, now, pool, eligible, others.get(n, ()))
        if plan is not None and plan[0] <= now + horizon:
            per_node[n] = plan
    groups = [set(per_node)]
    if cy.cap.one_leaf(shape):
        leaves = [leaf & set(per_node) for leaf in cy.cap.leaf_groups()]
        if any(len(leaf) >= k for leaf in leaves):
            groups = [leaf for leaf in leaves if len(leaf) >= k]
    best: Drain | None = None
    for group in groups:
        if len(group) < k:
            continue
        chosen = sorted(group, key=lambda n: (per_node[n][0], set_cost(per_node[n][1]), n))[:k]
        victims = {c.job_id: c for n in chosen for c in per_node[n][1]}
        ready = max(per_node[n][0] for n in chosen)
        drain = Drain(tuple(chosen), tuple(sorted(victims.values(), key=victim_key)), ready)
        if best is None or _rank(drain) < _rank(best):
            best = drain
    if best is None:
        cy.drain_misses.add((g, k))
    return best


def _rank(drain: Drain) -> tuple:
    """Plans compared: the soonest whole, then the victim set that is least bad (``victims.set_cost``)."""
    return (drain.ready_at, set_cost(list(drain.victims)))


def _node_plan(
    n: int,
    have: int,
    g: int,
    now: float,
    pool: VictimPool,
    eligible: Eligible,
    releases: tuple[tuple[float, int], ...] | list[tuple[float, int]],
) -> tuple[float, list[Candidate]] | None:
    """(when node ``n`` holds ``g`` GPUs, the victims to preempt on it now); None when it never does.

    The victims are the cheapest eligible preemptible jobs on the node, as many as the node needs beyond what the
    other jobs give back by then: each extra release in time order may make a victim unnecessary."""
    victims = [c for c in pool.by_node.get(n, ()) if c.job_id not in pool.taken and eligible(c)]
    freed_by_victims = sum(gpus_on_node(c, n) for c in victims)
    if have + freed_by_victims + sum(gpus for _, gpus in releases) < g:
        return None
    ready, got = now, have + freed_by_victims
    for at, gpus in sorted(releases):
        if got >= g:
            break
        ready, got = max(now, at), got + gpus
    if got < g:
        return None
    back_by_then = have + sum(gpus for at, gpus in releases if at <= ready)
    picked: list[Candidate] = []
    for c in victims:  # already in victim_key order: the cheapest first
        if back_by_then >= g:
            break
        picked.append(c)
        back_by_then += gpus_on_node(c, n)
    return ready, picked


def _other_releases(cy: Cycle, pool: VictimPool, eligible: Eligible) -> dict[int, list[tuple[float, int]]]:
    """Per node, (time limit end, GPUs) of every running job that is neither being freed nor a possible victim."""
    victims = {c.job_id for cands in pool.by_node.values() for c in cands if eligible(c)}
    out: dict[int, list[tuple[float, int]]] = {}
    for job in cy.view.running:
        if job.job_id in cy.taken or job.job_id in victims or not job.phase.holds_resources:
            continue
        end = timestamp(job.end_time, math.inf) if job.phase == JobPhase.RUNNING else cy.now
        for node, gpus in gpus_on_nodes(job):
            n = cy.cap.number.get(node)
            if n is not None and gpus > 0:
                out.setdefault(n, []).append((end, gpus))
    return out


__all__ = ["Drain", "plan_drain"]

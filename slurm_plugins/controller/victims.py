"""Victim choice: the one comparator and the search for a small, cheap set of victims that frees a
placeable block for a pending gang.

The search is node-first because placement is per node: a 2-node × 8-GPU job needs two nodes with 8 GPUs each, and
16 GPUs scattered over eight nodes do not help. It is a greedy approximation of a set-cover problem:

1. nodes that already have room (idle + being-freed GPUs) count as they are;
2. for every other node, take its eligible victims in comparator order until the node has room, then drop the
   ones that turned out redundant on that node; the node's cost is (worst class used, work lost, the victims'
   comparator keys, node number);
3. take the cheapest nodes until the gang fits;
4. prune the union: try to drop each victim, most expensive first, and keep the drop when the gang still fits
   (a victim spanning several chosen nodes often makes others redundant).

The result is minimal (no victim can be dropped) but not always the cheapest possible set: step 2 is greedy per
node and step 3 adds up node costs without knowing that one multi-node victim helps several nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from nuro.policy.classify import job_gpus, timestamp
from nuro.slurm.models import JobInfo
from nuro.slurm_plugins.controller.capacity import Capacity, Shape

#: Victim classes, in the order they are given up (criterion 1 of ``victim_key``).
RANK_BORROWED = 0
RANK_GUARANTEED = 1
RANK_TIER = 2


@dataclass(frozen=True)
class Candidate:
    """A running job that may be preempted, with what the comparator needs.

    Attributes:
        rank: RANK_BORROWED, RANK_GUARANTEED or RANK_TIER.
        tier_priority: the tier's priority for RANK_TIER, else 0.
        work_lost_gpu_s: GPUs × seconds since its last committed checkpoint (or its start when it has none).
        started_at: Unix seconds of its current start.
        on_nodes: (node number, GPUs) on schedulable nodes, what preempting it frees.
        restart_gpu_s: GPUs × the policy's restart cost (staging and start-up before it trains again).
        exempt_until: Unix seconds its minimum run time ends; it is no victim before.
        team_load: its team's decayed fair-share load over its entitlement (``fairshare.team_loads``), in tenths:
            the team that used the most over its share yields first.
    """

    job_id: int
    team: str | None
    rank: int
    tier_priority: int
    gpus: int
    work_lost_gpu_s: float
    started_at: float
    on_nodes: tuple[tuple[int, int], ...]
    last_checkpoint_at: float | None = None
    restart_gpu_s: float = 0.0
    exempt_until: float = float("-inf")
    team_load: int = 0

    @property
    def cost_gpu_s(self) -> float:
        """What preempting it costs: the work since its last checkpoint plus the restart it will pay."""
        return self.work_lost_gpu_s + self.restart_gpu_s


def victim_key(c: Candidate) -> tuple[int, int, int, float, float, int]:
    """Sort key of victims, the cheapest to preempt first.

    1. Class: borrowed jobs before guaranteed jobs before tier jobs. Borrowing is preemptible by contract;
       guarantees are broken only for a tier that may do so (and only for another team's jobs).
    2. Among tier jobs, the lower tier first (equal or higher tiers are never candidates at all).
    3. The team most over its fair share (decayed usage, ``fairshare.team_loads``) first: a team that borrowed
       heavily yields before one that borrowed a little.
    4. Least cost: GPUs × seconds since the last committed checkpoint (the point of checkpoint-confirmed
       preemption) plus GPUs × the restart cost (staging, start-up), so a small job is cheaper than a large one
       with the same fresh checkpoint.
    5. Most recently started first: its current run has cost the least (Kueue's "most recently admitted").
    6. Job id, ascending: the deterministic last tie-break.
    """
    return (c.rank, c.tier_priority, -c.team_load, c.cost_gpu_s, -c.started_at, c.job_id)


def seconds_since_checkpoint(job: JobInfo, checkpoint_at: float | None, now: float) -> float:
    """Seconds of training a job would lose if preempted now, given when its newest commit was reported
    (``progress.Progress.commit_at``; None: none). A checkpoint older than the current start (written by an earlier
    run) only bounds the loss by the start. A running job without a start time (Slurm did not report one) is
    treated as just started."""
    start = timestamp(job.start_time, default=now)
    return max(0.0, now - (max(checkpoint_at, start) if checkpoint_at is not None else start))


def work_lost_gpu_s(job: JobInfo, checkpoint_at: float | None, now: float) -> tuple[float, float | None]:
    """(work lost if preempted now in GPU·s, last checkpoint time): ``seconds_since_checkpoint`` × GPUs."""
    return seconds_since_checkpoint(job, checkpoint_at, now) * job_gpus(job), checkpoint_at


@dataclass
class VictimPool:
    """Candidates indexed by node, each list in ``victim_key`` order; ``taken`` holds job ids already being
    preempted (in flight or chosen this cycle), which are never chosen twice."""

    by_node: dict[int, list[Candidate]] = field(default_factory=dict)
    taken: set[int] = field(default_factory=set)

    def add(self, candidates: Iterable[Candidate]) -> None:
        touched = set()
        for c in candidates:
            for n, _ in c.on_nodes:
                self.by_node.setdefault(n, []).append(c)
                touched.add(n)
        for n in touched:
            self.by_node[n].sort(key=victim_key)


Eligible = Callable[[Candidate], bool]


def choose_victims(
    cap: Capacity, shape: Shape, pool: VictimPool, eligible: Eligible, within: set[int] | None = None
) -> list[Candidate] | None:
    """The victims that make ``shape`` placeable on idle + being-freed GPUs, in ``victim_key`` order; only nodes
    of ``within`` count when it is given (one leaf, for a gang with the one-leaf hint).

    Returns [] when it already fits and None when the eligible candidates cannot free a placeable block.
    """
    g, k = shape.gpus_per_node, shape.nodes
    ok = cap.nodes_avail_at_least(g, within)
    if len(ok) >= k:
        return []
    options: list[tuple[tuple, list[Candidate]]] = []
    for n, cands in pool.by_node.items():
        if n in ok or (within is not None and n not in within):
            continue
        picked = _fill_node(n, cap.avail(n), g, cands, pool.taken, eligible)
        if picked is not None:
            keys = tuple(victim_key(c) for c in picked)  # ties between nodes fall back to the comparator
            options.append(((*set_cost(picked), keys, n), picked))
    need = k - len(ok)
    if len(options) < need:
        return None
    options.sort(key=lambda o: o[0])
    union: dict[int, Candidate] = {}
    for _, picked in options[:need]:
        for c in picked:
            union[c.job_id] = c
    chosen = sorted(union.values(), key=victim_key)
    return _prune(cap, ok, g, k, chosen)


def _fill_node(
    n: int, have: int, g: int, cands: list[Candidate], taken: set[int], eligible: Eligible
) -> list[Candidate] | None:
    """Victims on node n, cheapest first, until it has ``g`` GPUs; redundant ones dropped (costliest first)."""
    picked: list[Candidate] = []
    for c in cands:
        if c.job_id in taken or not eligible(c):
            continue
        picked.append(c)
        have += gpus_on_node(c, n)
        if have >= g:
            break
    else:
        return None
    for c in sorted(picked, key=victim_key, reverse=True):
        if have - gpus_on_node(c, n) >= g:
            picked.remove(c)
            have -= gpus_on_node(c, n)
    return picked


def set_cost(victims: list[Candidate]) -> tuple[int, int, float]:
    """How bad a victim set is, to compare the sets of different leaves: worst class, least team load, total cost."""
    if not victims:
        return (-1, 0, 0.0)
    return (max(c.rank for c in victims), -min(c.team_load for c in victims), sum(c.cost_gpu_s for c in victims))


def choose_in_one_leaf(
    cap: Capacity, shape: Shape, pool: VictimPool, eligible: Eligible
) -> tuple[list[Candidate], set[int]] | None:
    """The cheapest victim set that frees room for ``shape`` inside one leaf, with that leaf's nodes; None when no
    leaf can hold it. Ties go to the leaf with the fewest room already (best fit), then leaf order."""
    best: tuple[tuple, list[Candidate], set[int]] | None = None
    for i, leaf in enumerate(cap.leaf_groups()):
        if len(leaf) < shape.nodes:
            continue
        victims = choose_victims(cap, shape, pool, eligible, within=leaf)
        if victims is None:
            continue
        key = (set_cost(victims), len(cap.nodes_avail_at_least(shape.gpus_per_node, leaf)), i)
        if best is None or key < best[0]:
            best = (key, victims, leaf)
    return None if best is None else (best[1], best[2])


def gpus_on_node(c: Candidate, n: int) -> int:
    """GPUs preempting ``c`` frees on node number ``n``."""
    return next((gpus for node, gpus in c.on_nodes if node == n), 0)


def _prune(cap: Capacity, ok: set[int], g: int, k: int, chosen: list[Candidate]) -> list[Candidate]:
    """Drop every victim the gang does not need, the most expensive first."""
    freed: dict[int, int] = {}
    for c in chosen:
        for n, gpus in c.on_nodes:
            freed[n] = freed.get(n, 0) + gpus

    def fits() -> bool:
        extra = sum(1 for n, x in freed.items() if n not in ok and cap.avail(n) + x >= g)
        return len(ok) + extra >= k

    kept = list(chosen)
    for c in sorted(chosen, key=victim_key, reverse=True):
        for n, gpus in c.on_nodes:
            freed[n] -= gpus
        if fits():
            kept.remove(c)
        else:
            for n, gpus in c.on_nodes:
                freed[n] += gpus
    return kept


__all__ = [
    "RANK_BORROWED",
    "RANK_GUARANTEED",
    "RANK_TIER",
    "Candidate",
    "VictimPool",
    "choose_in_one_leaf",
    "choose_victims",
    "gpus_on_node",
    "seconds_since_checkpoint",
    "set_cost",
    "victim_key",
    "work_lost_gpu_s",
]

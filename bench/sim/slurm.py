"""A small Slurm-like scheduler: the part of slurmctld the replay needs, nothing more.

Why write one: the replay runs months of trace in seconds, so the real slurmctld (which schedules in wall-clock
time) cannot be used; what matters for the comparison is that both variants see the *same* scheduler, and that it
keeps Slurm's rules that nuro relies on:

* **gang, whole GPUs**: a job gets ``node_count`` nodes with ``gpus_per_node`` free GPUs each, all at once, or waits;
* **placement as slurmctld does it** (``placement``; Slurm's source, docs/trace-replay.md "Placement"): nodes
  in natural name order, each with a ``Weight`` (slurm.conf's 1, or what nuro's controller sets); the nodes of the
  lowest weight that can make up the job come first, and free GPUs only decide whether a node can host the job,
  never which one is taken:

  - ``tree`` (topology/tree, 22.05 to 25.11): one node → of the lowest weight's usable nodes, the leaf with the
    fewest (first in topology order), its first node; several → lower weight groups forced in, then the smallest
    leaf with room for the rest, else the leaf with the most (taken whole) and again;
  - ``tree-26.05``: as ``tree`` for several nodes; one node → the first usable node by (weight, name), any leaf;
  - ``block`` (26.05 with topology/block): one node → the first usable node by (weight, name), any leaf; several →
    the smallest aligned block of leaves that can hold the job, lowest weight then fewest usable nodes (ties to the
    last), never across blocks;
  - ``bestfit``: the replay's earlier idealisation (one node: fewest GPUs left over), kept for comparison only;

  a gang of 2 to leaf-size nodes carries job_submit.lua's ``--switches=1`` hint and waits up to ``switch_wait_s``
  (from its first try in this pending spell) for one leaf before it is placed across leaves, as cons_tres does with
  ``wait4switch``;
* **hard QOS limits**: a job starts only if its QOS's GPUs in use + its GPUs ≤ ``GrpTRES`` (``g-<team>`` = quota,
  ``b-<team>`` = borrow limit); otherwise it waits with reason ``QOSGrpGRES`` and does not block others;
* **priority** (priority/multifactor, simplified): QOS priority (the tier's) + SiteFactor + 10,000 × fair share
  2^(−usage/shares) (usage = the team's GPU·s with a ``fs_half_life_s`` decay, both normalised) + 1,000 × age
  (capped at ``max_age_s``); ties by submit time, then job id;
* **backfill-lite** (EASY): the first job in priority order that cannot start for resources gets a reservation
  (the earliest time and nodes, computed from running jobs' ends); lower jobs start only if they do not touch the
  reserved nodes or end before that time. Time limits equal the true remaining run time (perfect estimates).

* **Slurm's own preemption** only in the scavenger variant (``QosPreemption``): preempt/qos, REQUEUE, GraceTime and
  PreemptExemptTime; nuro's policy sets no ``Preempt=`` lists (docs/controller.md).

Not modelled: CPUs/memory, partitions, node failures, job arrays, scheduling latency (a pass runs at every event).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bench.sim.synth import JobSpec
from bench.sim.trace import NodeSpec

PENDING, RUNNING, DONE = "PENDING", "RUNNING", "DONE"
PLACEMENTS = ("tree", "tree-26.05", "block", "bestfit")
#: From this Slurm version a one-node job takes the first usable node by (weight, node order), whatever the topology
#: plugin (cons_tres ``_get_one_res``, commit 295100b5f6).
FIRST_FIT_ONE_NODE_SINCE = (26, 5)


def placement_for(version: tuple[int, int], topology: str) -> str:
    """The replay's placement rule for a Slurm ``version`` (major, minor) and topology plugin ("tree" or "block");
    block before 26.05 is not modelled."""
    if topology == "block":
        if version < FIRST_FIT_ONE_NODE_SINCE:
            raise ValueError(f"topology/block on Slurm {version[0]}.{version[1]:02d} is not modelled (26.05 is)")
        return "block"
    return "tree-26.05" if version >= FIRST_FIT_ONE_NODE_SINCE else "tree"


def _natural_key(name: str) -> list:
    """strnatcmp's order: digit runs compare as numbers (node2 before node10)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _started_at(job: SimJob, now: float) -> float:
    return now if job.run_start_s is None else job.run_start_s


def _fits_better(cnt_i: int, cnt_j: int, need: int) -> bool:
    """22.05's leaf comparison for a flat tree: a leaf that fits what is left beats one that does not; of two that
    fit the smaller wins; of two that do not the larger; equal ones keep the earlier leaf."""
    fi, fj = cnt_i >= need, cnt_j >= need
    if fi and fj:
        return cnt_i < cnt_j
    if fi != fj:
        return fi
    return cnt_i > cnt_j


@dataclass(frozen=True)
class SchedParams:
    """Priority weights and timings of the simulated slurmctld (printed with the results)."""

    weight_fairshare: int = 10_000
    weight_age: int = 1_000
    max_age_s: float = 7 * 86400.0
    fs_half_life_s: float = 86400.0
    requeue_delay_s: float = 11.0  # EligibleTime = requeue + cred_expire (10 s, as the dev cluster sets it) + 1 s
    switch_wait_s: float = 60.0  # the bridge's wait4switch for the one-leaf hint (luatable.DEFAULT_SWITCH_WAIT_S)
    placement: str = "tree"  # one of PLACEMENTS (module docstring); placement_for(version, topology) picks it


DEFAULT_SCHED = SchedParams()


@dataclass(eq=False)
class SimJob:
    """A job's mutable state in the replay. ``work_done_s`` is retained progress: finished or checkpointed work."""

    spec: JobSpec
    qos: str
    state: str = PENDING
    reason: str = "None"
    eligible_s: float = 0.0
    work_done_s: float = 0.0
    run_start_s: float | None = None
    train_start_s: float | None = None
    stop_train_s: float | None = None  # an acking victim stops training at the signal
    signalled_s: float | None = None
    ack_gain_s: float | None = None  # progress of this run its acknowledged checkpoint holds
    nodes: tuple[int, ...] = ()
    site_factor: int = 0
    priority: int = 0
    first_start_s: float | None = None
    end_s: float | None = None
    restarts: int = 0
    token: int = 0  # bumped at every start/stop so stale END/ACK events are ignored
    comment: dict = field(default_factory=dict)
    comment_text: str = ""  # the comment as Slurm stores it (compact JSON), kept in step with ``comment``
    pending_since_s: float = 0.0
    switch_wait_from_s: float | None = None  # first try of this pending spell for a hinted gang

    @property
    def job_id(self) -> int:
        return self.spec.job_id

    @property
    def gpus(self) -> int:
        return self.spec.gpus

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.spec.runtime_s - self.work_done_s)

    def expected_end_s(self, grace_s: float) -> float:
        """When Slurm expects the GPUs back: the run's end, or the grace end of a signalled victim."""
        end = (self.train_start_s or 0.0) + self.remaining_s
        if self.signalled_s is not None:
            end = min(end, self.signalled_s + grace_s)
        return end


@dataclass
class QosPreemption:
    """Slurm's own soft sharing (``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``): jobs of a QOS for which
    ``may_preempt`` is true take GPUs from running jobs of a QOS for which ``preemptable`` is true once those ran
    ``exempt_s`` (``PreemptExemptTime``); ``signal`` is the replay's hand-off (GraceTime, the requeue)."""

    may_preempt: Callable[[str], bool]
    preemptable: Callable[[str], bool]
    exempt_s: float
    signal: Callable[[SimJob], None]


class SlurmSim:
    """Nodes, the queue and QOS usage; ``schedule(now)`` is one scheduling pass (module docstring).

    The replay owns time and job lifecycles; this class owns resources: ``start``/``release`` are the only places
    GPUs change hands, and they check the QOS limit again (a breach would be a simulator bug, counted by the replay).
    """

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        qos_limits: Mapping[str, int | None],
        qos_priority: Mapping[str, int],
        team_shares: Mapping[str, int],
        params: SchedParams = DEFAULT_SCHED,
        grace_s: float = 60.0,
    ) -> None:
        if params.placement not in PLACEMENTS:
            raise ValueError(f"placement {params.placement!r}: one of {', '.join(PLACEMENTS)}")
        self.names = [n.name for n in nodes]
        self._index = {name: i for i, name in enumerate(self.names)}
        #: slurmctld's node order: natural sort of the names (read_config.c sorts the node table so)
        order = sorted(range(len(nodes)), key=lambda i: _natural_key(self.names[i]))
        self.rank = [0] * len(nodes)
        for r, i in enumerate(order):
            self.rank[i] = r
        #: each node's scheduling Weight: slurm.conf's default, or what nuro's controller set (``UpdateNodeWeight``)
        self.weight = [1] * len(nodes)
        self.total = [n.gpus for n in nodes]
        self.free = list(self.total)
        leaf_index: dict[str, int] = {}
        self.leaf_of = [leaf_index.setdefault(n.leaf, len(leaf_index)) for n in nodes]
        self.leaves: list[list[int]] = [[] for _ in leaf_index]
        for i, leaf in enumerate(self.leaf_of):
            self.leaves[leaf].append(i)
        self.leaf_names = list(leaf_index)
        self.qos_limits = dict(qos_limits)
        self.qos_priority = dict(qos_priority)
        self.qos_used: dict[str, int] = {q: 0 for q in qos_limits}
        #: ``MinTRESPerJob`` GPUs per QOS (nuro's gang-first floor, ``UpdateQosMinGpus``): a smaller job waits
        self.qos_min: dict[str, int] = {}
        self.shares = dict(team_shares)
        self.params = params
        self.grace_s = grace_s
        self.pending: dict[int, SimJob] = {}
        self.running: dict[int, SimJob] = {}
        self.team_alloc: dict[str, int] = {t: 0 for t in team_shares}
        self.usage: dict[str, float] = {t: 0.0 for t in team_shares}
        self._usage_at = 0.0
        self.limit_breaches = 0
        #: Slurm's own preemption (the scavenger variant); None: nuro's controller or nobody preempts
        self.preemption: QosPreemption | None = None

    @property
    def capacity(self) -> int:
        return sum(self.total)

    @property
    def allocated(self) -> int:
        return self.capacity - sum(self.free)

    # -- queue ---------------------------------------------------------------------------------------------------
    def submit(self, job: SimJob, now: float) -> None:
        job.state, job.reason, job.pending_since_s = PENDING, "None", now
        job.switch_wait_from_s = None
        self.pending[job.job_id] = job

    def _account(self, now: float) -> None:
        """Decay fair-share usage to ``now`` and add the GPU·s held since the last call."""
        dt = now - self._usage_at
        if dt <= 0:
            return
        decay = 0.5 ** (dt / self.params.fs_half_life_s)
        for t in self.usage:
            self.usage[t] = self.usage[t] * decay + self.team_alloc[t] * dt
        self._usage_at = now

    def fairshare_factors(self) -> dict[str, float]:
        """Slurm's classic factor 2^(−U/S): U = the team's share of decayed usage, S = its share of the shares."""
        total_u = sum(self.usage.values()) or 1.0
        total_s = sum(self.shares.values()) or 1
        return {t: 2.0 ** (-(self.usage[t] / total_u) / (self.shares[t] / total_s)) for t in self.usage}

    def update_priorities(self, now: float) -> None:
        """Recompute every pending job's priority (as slurmctld's PriorityCalcPeriod would)."""
        self._account(now)
        fs = self.fairshare_factors()
        p = self.params
        for job in self.pending.values():
            age = min(1.0, max(0.0, now - job.spec.submit_s) / p.max_age_s)
            job.priority = int(
                self.qos_priority.get(job.qos, 0)
                + job.site_factor
                + p.weight_fairshare * fs.get(job.spec.team, 0.0)
                + p.weight_age * age
            )

    # -- placement -----------------------------------------------------------------------------------------------
    def index_of(self, name: str) -> int:
        return self._index[name]

    def place(
        self,
        gpus_per_node: int,
        count: int,
        free: Sequence[int],
        exclude: frozenset[int] = frozenset(),
        one_leaf: bool = False,
    ) -> tuple[int, ...] | None:
        """Nodes for a gang, or None: the ``placement`` rule (module docstring) over the nodes with ``gpus_per_node``
        GPUs free, less ``exclude``; with ``one_leaf`` a result across leaves is None."""
        usable = [i for i, f in enumerate(free) if f >= gpus_per_node and i not in exclude]
        if len(usable) < count:
            return None
        rule = self.params.placement
        if rule == "bestfit":
            return self._place_bestfit(gpus_per_node, count, free, usable, one_leaf)
        if count == 1:
            if rule != "tree":  # 26.05's one-node path (_get_one_res): first fit by (weight, node order)
                return (min(usable, key=lambda i: (self.weight[i], self.rank[i])),)
            return self._place_tree(usable, 1)
        nodes = self._place_block(usable, count) if rule == "block" else self._place_tree(usable, count)
        if nodes is None or (one_leaf and self.leaves_spanned(nodes) > 1):
            return None
        return nodes

    def _by_weight(self, usable: list[int], count: int) -> tuple[list[int], set[int]]:
        """cons_tres's weight groups: the usable nodes of the lowest weights until they make up ``count``; every
        group but the last is forced into the allocation. Returns (candidates, forced)."""
        w = self.weight
        cand: list[int] = []
        forced: set[int] = set()
        for weight in sorted({w[i] for i in usable}):
            if cand:
                forced.update(cand)
            cand.extend(i for i in usable if w[i] == weight)
            if len(cand) >= count:
                break
        return cand, forced

    def _forced_first(
        self, cand: list[int], forced: set[int], count: int
    ) -> tuple[dict[int, list[int]], set[int], int]:
        """Shared by tree and block: the candidates by leaf in slurmctld's node order, with the forced nodes taken
        and their leaves filled first (those leaves then leave the choice). Returns (the other leaves' candidates,
        the nodes chosen, how many are still needed)."""
        by_leaf: dict[int, list[int]] = {}
        for i in sorted(cand, key=self.rank.__getitem__):
            by_leaf.setdefault(self.leaf_of[i], []).append(i)
        chosen = set(forced)
        need = count - len(chosen)
        for leaf in sorted({self.leaf_of[i] for i in forced}):
            for i in by_leaf.pop(leaf, []):
                if need > 0 and i not in chosen:
                    chosen.add(i)
                    need -= 1
        return by_leaf, chosen, need

    def _place_tree(self, usable: list[int], count: int) -> tuple[int, ...] | None:
        """topology/tree's ``_eval_nodes_topo`` for a two-level tree (one root over the leaves): forced nodes, then
        their leaves, then leaves by fit: the smallest with room for what is left, else the largest, taken whole;
        ties to the first leaf; nodes in slurmctld's order."""
        by_leaf, chosen, need = self._forced_first(*self._by_weight(usable, count), count)
        while need > 0 and by_leaf:
            best = min(by_leaf)
            for leaf in sorted(by_leaf):
                if _fits_better(len(by_leaf[leaf]), len(by_leaf[best]), need):
                    best = leaf
            taken = by_leaf.pop(best)[:need]
            chosen.update(taken)
            need -= len(taken)
        return tuple(sorted(chosen)) if need <= 0 else None

    def _place_block(self, usable: list[int], count: int) -> tuple[int, ...] | None:
        """topology/block's ``eval_nodes_block`` (26.05), leaves as base blocks: the smallest aligned group of
        2^level leaves that can hold the job; among those with enough usable nodes the lowest weight, then the
        fewest usable nodes, ties to the last; inside it base blocks by fit (ties to the later one). Never across
        blocks."""
        base = max(len(leaf) for leaf in self.leaves)
        level = max(0, math.ceil(math.log2(math.ceil(count / base))))
        per_block = 2**level
        usable_set = set(usable)
        best: tuple[int, int, int] | None = None  # (lowest weight, usable count, first leaf)
        for first in range(0, len(self.leaves), per_block):
            members = [i for leaf in self.leaves[first : first + per_block] for i in leaf if i in usable_set]
            if len(members) < count:
                continue
            key = (min(self.weight[i] for i in members), len(members))
            if best is None or key <= best[:2]:
                best = (*key, first)
        if best is None:
            return None
        first = best[2]
        inside = [i for leaf in self.leaves[first : first + per_block] for i in leaf if i in usable_set]
        by_leaf, chosen, need = self._forced_first(*self._by_weight(inside, count), count)
        while need > 0 and by_leaf:
            fit = [leaf for leaf, nodes in by_leaf.items() if len(nodes) >= need]
            pick = (max(fit, key=lambda leaf: (-len(by_leaf[leaf]), leaf)) if fit
                    else max(by_leaf, key=lambda leaf: (len(by_leaf[leaf]), leaf)))  # fmt: skip
            taken = by_leaf.pop(pick)[:need]
            chosen.update(taken)
            need -= len(taken)
        return tuple(sorted(chosen)) if need <= 0 else None

    def _place_bestfit(
        self, g: int, count: int, free: Sequence[int], usable: list[int], one_leaf: bool
    ) -> tuple[int, ...] | None:
        """The earlier idealisation: one node: best fit (least left over, then lowest index). Several: the one
        leaf with room and the fewest qualifying nodes, best fit inside it; else (unless ``one_leaf``) the fewest
        leaves, fullest first."""
        if count == 1:
            return (min(usable, key=lambda i: (free[i] - g, i)),)
        usable_set = set(usable)
        per_leaf = [ok for leaf in self.leaves if (ok := [i for i in leaf if i in usable_set])]
        one = [ok for ok in per_leaf if len(ok) >= count]
        if one:
            ok = min(one, key=len)
            return tuple(sorted(sorted(ok, key=lambda i: (free[i] - g, i))[:count]))
        if one_leaf:
            return None
        chosen: list[int] = []
        for ok in sorted(per_leaf, key=lambda ok: -len(ok)):
            chosen.extend(ok[: count - len(chosen)])
            if len(chosen) == count:
                break
        return tuple(sorted(chosen))

    def leaves_spanned(self, nodes: Iterable[int]) -> int:
        return len({self.leaf_of[i] for i in nodes})

    def _reservation(self, job: SimJob, now: float) -> tuple[float, frozenset[int]]:
        """EASY backfill's shadow: the earliest time ``job`` could start, and the nodes it would get then."""
        g, k = job.spec.gpus_per_node, job.spec.node_count
        free = list(self.free)
        qualifying = sum(1 for f in free if f >= g)
        for r in sorted(self.running.values(), key=lambda r: (r.expected_end_s(self.grace_s), r.job_id)):
            for i in r.nodes:
                before = free[i]
                free[i] += r.spec.gpus_per_node
                if before < g <= free[i]:
                    qualifying += 1
            if qualifying >= k:
                nodes = self.place(g, k, free)
                if nodes is not None:
                    return max(now, r.expected_end_s(self.grace_s)), frozenset(nodes)
        return math.inf, frozenset()

    # -- the pass ------------------------------------------------------------------------------------------------
    def queue_order(self) -> list[SimJob]:
        return sorted(self.pending.values(), key=lambda j: (-j.priority, j.spec.submit_s, j.job_id))

    def schedule(self, now: float) -> list[SimJob]:
        """One pass: start what may start, set every pending job's reason. Returns the jobs started."""
        self.update_priorities(now)
        started: list[SimJob] = []
        max_free = max(self.free, default=0)
        blocked: SimJob | None = None
        shadow: tuple[float, frozenset[int]] | None = None
        for job in self.queue_order():
            if job.eligible_s > now:
                job.reason = "BeginTime"
                continue
            limit = self.qos_limits.get(job.qos)
            if limit is not None and self.qos_used[job.qos] + job.gpus > limit:
                job.reason = "QOSGrpGRES"
                continue
            if job.gpus < self.qos_min.get(job.qos, 0):
                job.reason = "QOSMinGRES"
                continue
            nodes = None
            if job.spec.gpus_per_node <= max_free:
                exclude: frozenset[int] = frozenset()
                if blocked is not None:
                    if shadow is None:
                        shadow = self._reservation(blocked, now)
                    if now + job.remaining_s + job.spec.restart_overhead_s * (job.restarts > 0) > shadow[0]:
                        exclude = shadow[1]
                nodes = self.place(
                    job.spec.gpus_per_node, job.spec.node_count, self.free, exclude, self._waits_for_leaf(job, now)
                )
            if nodes is None:
                job.reason = "Priority" if blocked is not None else "Resources"
                blocked = blocked or job
                if self.preemption is not None and self.preemption.may_preempt(job.qos):
                    for victim in self._victims(job, now):
                        if victim.signalled_s is None:
                            self.preemption.signal(victim)
                continue
            self.start(job, nodes, now)
            started.append(job)
            max_free = max(self.free, default=0)
        return started

    def _victims(self, job: SimJob, now: float) -> list[SimJob]:
        """preempt/qos's choice for ``job``: preemptable runs past ``PreemptExemptTime``, in Slurm's order (those
        already signalled first, then lowest priority, youngest), removed one by one until the job can be placed;
        the victims are the removed runs on the nodes it would get. Blind to checkpoints, lending and progress."""
        rule = self.preemption
        assert rule is not None
        cands = [
            r for r in self.running.values()
            if rule.preemptable(r.qos) and (r.signalled_s is not None or now - _started_at(r, now) >= rule.exempt_s)
        ]  # fmt: skip
        cands.sort(key=lambda r: (r.signalled_s is None, r.priority, -_started_at(r, now), r.job_id))
        free = list(self.free)
        removed: list[SimJob] = []
        for r in cands:
            for i in r.nodes:
                free[i] += r.spec.gpus_per_node
            removed.append(r)
            nodes = self.place(job.spec.gpus_per_node, job.spec.node_count, free)
            if nodes is not None:
                chosen = set(nodes)
                return [v for v in removed if chosen.intersection(v.nodes)]
        return []

    def _waits_for_leaf(self, job: SimJob, now: float) -> bool:
        """A hinted gang (2 to leaf-size nodes) inside its switch wait takes one leaf or nothing."""
        k = job.spec.node_count
        if not 2 <= k <= max((len(leaf) for leaf in self.leaves), default=0) or len(self.leaves) < 2:
            return False
        if job.switch_wait_from_s is None:
            job.switch_wait_from_s = now
        return now - job.switch_wait_from_s < self.params.switch_wait_s

    def start(self, job: SimJob, nodes: tuple[int, ...], now: float) -> None:
        self._account(now)
        limit = self.qos_limits.get(job.qos)
        if limit is not None and self.qos_used[job.qos] + job.gpus > limit:
            self.limit_breaches += 1
        for i in nodes:
            if self.free[i] < job.spec.gpus_per_node:
                raise RuntimeError(f"job {job.job_id} placed on {self.names[i]} without room: simulator bug")
            self.free[i] -= job.spec.gpus_per_node
        self.qos_used[job.qos] = self.qos_used.get(job.qos, 0) + job.gpus
        self.team_alloc[job.spec.team] += job.gpus
        del self.pending[job.job_id]
        self.running[job.job_id] = job
        job.state, job.reason, job.nodes = RUNNING, "None", nodes
        job.run_start_s = now
        job.train_start_s = now + (job.spec.restart_overhead_s if job.restarts else 0.0)
        job.stop_train_s = job.signalled_s = None
        job.token += 1
        if job.first_start_s is None:
            job.first_start_s = now

    def release(self, job: SimJob, now: float) -> None:
        """Give a running job's GPUs back (it finished, was requeued, or the replay ended)."""
        self._account(now)
        for i in job.nodes:
            self.free[i] += job.spec.gpus_per_node
        self.qos_used[job.qos] -= job.gpus
        self.team_alloc[job.spec.team] -= job.gpus
        del self.running[job.job_id]
        job.nodes = ()
        job.token += 1

    def qos_over_limit(self) -> list[str]:
        """QOS whose GPUs in use exceed their GrpTRES right now (must always be empty)."""
        return [q for q, lim in self.qos_limits.items() if lim is not None and self.qos_used.get(q, 0) > lim]


__all__ = [
    "DEFAULT_SCHED",
    "DONE",
    "PENDING",
    "PLACEMENTS",
    "RUNNING",
    "QosPreemption",
    "placement_for",
    "SchedParams",
    "SimJob",
    "SlurmSim",
]

"""The most goodput any scheduler could get out of a replay's workload in the measurement window: a true upper bound.

Why: the old estimate ("baseline + the capacity idle while work waited") is not a bound: another job order changes
what ends inside the window, and it was off by about ±0.1 of the ratio per seed. This one relaxes every rule a real
scheduler must keep, so no scheduler can beat it:

* preemption is free and instant, and a job may run any share of its width at any moment (gangs are divisible);
* a job still runs no wider than it asked and no longer than its run time, and never before it arrived;
* GPUs are placed by node size only: work that needs ``g`` GPUs per node can use only nodes with at least ``g``
  (each hosting ``floor(G / g)`` such parts), so a whole-node gang never counts the GPUs of small nodes;
* quotas, lending limits and fairness are ignored.

``policy_bound`` is the same relaxation with the sharing policy's limits kept at every moment instead of the node
sizes: no policy-respecting scheduler can beat it either, and ``min`` of the two is the bound for such a scheduler.
It asks how much of the headroom is the policy's to give: where the limits forbid most of the idle capacity (the
replay finds 95–100 % of nuro's idle-while-waiting is borrow and lending limits), no controller can reach the bound
that ignores them.

Written as a linear programme it is a transportation problem, so it is solved as a max-flow (exact, and seconds for
6,000 jobs × 300 time slots where a general LP solver needs minutes): source → job (capacity: the job's work that can
fall in the window) → (slot, node-size layer) (capacity: its width × the slot's seconds after its arrival) → the
layers of smaller sizes → sink (capacity: the GPUs of nodes of at least that size × the slot). The nested layers
enforce, for every size ``g``, Σ (work of jobs needing ≥ g per node) ≤ the GPUs that can host them, per slot.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from bench.sim.synth import JobSpec
from bench.sim.trace import NodeSpec

#: Slot length of the bound's time grid (the idle-while-waiting bins' width). A finer grid tightens the bound a
#: little (work cannot start before its arrival inside a slot either way: the first slot is cut at the arrival).
SLOT_S = 300.0


@dataclass(frozen=True)
class Bound:
    """``gpu_s``: the most GPU·s of kept progress in ``[t0, t1]``; ``fraction``: that over the cluster's GPU·s."""

    gpu_s: float
    fraction: float
    slots: int
    jobs: int
    edges: int
    #: of ``fraction``, the multi-node jobs' share: where the bound and a real scheduler part (gangs are divisible here)
    gang_fraction: float = 0.0


def _host_capacity(nodes: Sequence[NodeSpec], per_node: int) -> int:
    """GPUs that work needing ``per_node`` GPUs on each node can use: ``floor(G / per_node) × per_node`` per node."""
    return sum((n.gpus // per_node) * per_node for n in nodes if n.gpus >= per_node)


@dataclass(frozen=True)
class TeamLimits:
    """A team's sharing limits as the bound keeps them: its guaranteed work runs at most ``quota`` GPUs of its own
    and ``borrow`` more; others borrow at most ``lend`` of its quota, and only what its own work leaves idle."""

    quota: int
    borrow: int
    lend: int


class _Graph:
    """A max-flow graph built edge by edge: capacities in whole GPU·s (``maximum_flow`` takes integers; rounding
    down keeps it a bound of the rounded work)."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.data: list[int] = []

    def edge(self, u: int, v: int, cap: float) -> None:
        c = int(cap)
        if c > 0:
            self.rows.append(u)
            self.cols.append(v)
            self.data.append(c)

    def max_flow(self, n: int, source: int, sink: int) -> tuple[float, dict[int, float]]:
        """The flow's value and what leaves ``source`` on each edge, by head node."""
        import numpy as np  # the bench's own dependencies: the replay itself needs neither
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import maximum_flow

        graph = csr_matrix((np.array(self.data, dtype=np.int64), (self.rows, self.cols)), shape=(n, n))
        if graph.data.size and graph.data.max() >= 2**31:
            raise ValueError("bound: an edge capacity exceeds int32 GPU·s; shorten the window or the slots")
        res = maximum_flow(graph.astype(np.int32), source, sink)
        out = res.flow.tocsr().getrow(source)
        return float(res.flow_value), {int(v): float(f) for v, f in zip(out.indices, out.data, strict=True) if f > 0}


def _job_slots(job: JobSpec, t0: float, t1: float, slot_s: float, n_slots: int):  # noqa: ANN202 (a generator)
    """The job's work that can fall in the window, then (slot, GPU·s it can run in that slot) after its arrival."""
    start = max(job.submit_s, t0)
    yield -1, job.gpus * min(job.runtime_s, t1 - start)
    for slot in range(int((start - t0) // slot_s), n_slots):
        lo, hi = t0 + slot * slot_s, min(t1, t0 + (slot + 1) * slot_s)
        yield slot, job.gpus * (hi - max(lo, start))


def _slot_width(slot: int, t0: float, t1: float, slot_s: float) -> float:
    return min(t1, t0 + (slot + 1) * slot_s) - (t0 + slot * slot_s)


def goodput_bound(jobs: Sequence[JobSpec], nodes: Sequence[NodeSpec], t0: float, t1: float,
                  slot_s: float = SLOT_S) -> Bound:  # fmt: skip
    """The max-flow bound (module docstring) for ``jobs`` on ``nodes`` over the window ``[t0, t1]``."""
    span = t1 - t0
    if span <= 0 or not nodes:
        return Bound(0.0, 0.0, 0, 0, 0)
    n_slots = max(1, math.ceil(span / slot_s))
    sizes = sorted({j.gpus_per_node for j in jobs if j.gpus_per_node <= max(n.gpus for n in nodes)}, reverse=True)
    layer_of = {g: i for i, g in enumerate(sizes)}
    caps = [_host_capacity(nodes, g) for g in sizes]
    usable = [j for j in jobs if j.submit_s < t1 and j.gpus_per_node in layer_of and j.runtime_s > 0]
    source, sink = 0, 1
    first_job = 2
    first_layer = first_job + len(usable)

    def layer_node(slot: int, layer: int) -> int:
        return first_layer + slot * len(sizes) + layer

    g = _Graph()
    for k, job in enumerate(usable):
        node, layer = first_job + k, layer_of[job.gpus_per_node]
        for slot, cap in _job_slots(job, t0, t1, slot_s, n_slots):
            if slot < 0:
                g.edge(source, node, cap)
            else:
                g.edge(node, layer_node(slot, layer), cap)
    for slot in range(n_slots):
        width = _slot_width(slot, t0, t1, slot_s)
        for layer in range(len(sizes)):
            nxt = layer_node(slot, layer + 1) if layer + 1 < len(sizes) else sink
            g.edge(layer_node(slot, layer), nxt, caps[layer] * width)
    flow, per_job = g.max_flow(first_layer + n_slots * len(sizes), source, sink)
    total = sum(n.gpus for n in nodes) * span
    gangs = sum(f for v, f in per_job.items() if usable[v - first_job].node_count > 1)
    return Bound(flow, flow / total, n_slots, len(usable), len(g.data), gangs / total)


def policy_bound(jobs: Sequence[JobSpec], nodes: Sequence[NodeSpec], teams: Mapping[str, TeamLimits],
                 tiers: Collection[str], t0: float, t1: float, slot_s: float = SLOT_S) -> Bound:  # fmt: skip
    """The bound with the policy's limits kept at every moment and node sizes pooled (module docstring). Per slot:

    job → its team's demand (width × seconds) → its own quota (≤ ``quota``) or its borrowing (≤ ``borrow``); all
    borrowing → the pool → unassigned GPUs (the cluster less every quota), or a lender (≤ its ``lend``) whose
    quota node also carries its own work (≤ ``quota``: it lends only what its work leaves idle) → the cluster (≤ all
    GPUs) → sink. A tier's jobs run outside every quota (straight to the cluster), as the tier QOS does."""
    span = t1 - t0
    if span <= 0 or not nodes:
        return Bound(0.0, 0.0, 0, 0, 0)
    n_slots = max(1, math.ceil(span / slot_s))
    cluster = sum(n.gpus for n in nodes)
    unassigned = max(0, cluster - sum(t.quota for t in teams.values()))
    names = sorted(teams)
    usable = [j for j in jobs if j.submit_s < t1 and j.runtime_s > 0 and (j.tier in tiers or j.team in teams)]
    source, sink, first_job = 0, 1, 2
    first_slot = first_job + len(usable)
    per_slot = 2 + 4 * len(names)  # pool, cluster; per team: demand, borrowing, lent, quota

    def at(slot: int, what: int, team: int = 0) -> int:
        return first_slot + slot * per_slot + (what if what < 2 else 2 + 4 * team + (what - 2))

    POOL, CLUSTER, DEMAND, BORROW, LENT, QUOTA = range(6)
    g = _Graph()
    for k, job in enumerate(usable):
        node = first_job + k
        for slot, cap in _job_slots(job, t0, t1, slot_s, n_slots):
            if slot < 0:
                g.edge(source, node, cap)
            elif job.tier in tiers:
                g.edge(node, at(slot, CLUSTER), cap)
            else:
                g.edge(node, at(slot, DEMAND, names.index(job.team)), cap)
    for slot in range(n_slots):
        width = _slot_width(slot, t0, t1, slot_s)
        g.edge(at(slot, POOL), at(slot, CLUSTER), unassigned * width)
        g.edge(at(slot, CLUSTER), sink, cluster * width)
        for i, name in enumerate(names):
            lim = teams[name]
            g.edge(at(slot, DEMAND, i), at(slot, QUOTA, i), lim.quota * width)
            g.edge(at(slot, DEMAND, i), at(slot, BORROW, i), lim.borrow * width)
            g.edge(at(slot, BORROW, i), at(slot, POOL), lim.borrow * width)
            g.edge(at(slot, POOL), at(slot, LENT, i), lim.lend * width)
            g.edge(at(slot, LENT, i), at(slot, QUOTA, i), lim.lend * width)
            g.edge(at(slot, QUOTA, i), at(slot, CLUSTER), lim.quota * width)
    flow, per_job = g.max_flow(first_slot + n_slots * per_slot, source, sink)
    gangs = sum(f for v, f in per_job.items() if usable[v - first_job].node_count > 1)
    return Bound(flow, flow / (cluster * span), n_slots, len(usable), len(g.data), gangs / (cluster * span))


__all__ = ["SLOT_S", "Bound", "TeamLimits", "goodput_bound", "policy_bound"]

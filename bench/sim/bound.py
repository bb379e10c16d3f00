"""The most goodput any scheduler could get out of a replay's workload in the measurement window: a true upper bound.

Why: the old estimate ("baseline + the capacity idle while work waited") is not a bound: another job order changes
what ends inside the window, and it was off by about ±0.1 of the ratio per seed. This one relaxes every rule a real
scheduler must keep, so no scheduler can beat it:

* preemption is free and instant, and a job may run any share of its width at any moment (gangs are divisible);
* a job still runs no wider than it asked and no longer than its run time, and never before it arrived;
* GPUs are placed by node size only: work that needs ``g`` GPUs per node can use only nodes with at least ``g``
  (each hosting ``floor(G / g)`` such parts), so a whole-node gang never counts the GPUs of small nodes;
* quotas, lending limits and fairness are ignored.

Written as a linear programme it is a transportation problem, so it is solved as a max-flow (exact, and seconds for
6,000 jobs × 300 time slots where a general LP solver needs minutes): source → job (capacity: the job's work that can
fall in the window) → (slot, node-size layer) (capacity: its width × the slot's seconds after its arrival) → the
layers of smaller sizes → sink (capacity: the GPUs of nodes of at least that size × the slot). The nested layers
enforce, for every size ``g``, Σ (work of jobs needing ≥ g per node) ≤ the GPUs that can host them, per slot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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


def _host_capacity(nodes: Sequence[NodeSpec], per_node: int) -> int:
    """GPUs that work needing ``per_node`` GPUs on each node can use: ``floor(G / per_node) × per_node`` per node."""
    return sum((n.gpus // per_node) * per_node for n in nodes if n.gpus >= per_node)


def goodput_bound(jobs: Sequence[JobSpec], nodes: Sequence[NodeSpec], t0: float, t1: float,
                  slot_s: float = SLOT_S) -> Bound:  # fmt: skip
    """The max-flow bound (module docstring) for ``jobs`` on ``nodes`` over the window ``[t0, t1]``."""
    import numpy as np  # the bench's own dependencies: the replay itself needs neither
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

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

    rows: list[int] = []
    cols: list[int] = []
    data: list[int] = []

    def edge(u: int, v: int, cap: float) -> None:
        c = int(cap)  # whole GPU·s: maximum_flow takes integers; rounding down keeps it a bound of the rounded work
        if c > 0:
            rows.append(u)
            cols.append(v)
            data.append(c)

    for k, job in enumerate(usable):
        node = first_job + k
        start = max(job.submit_s, t0)
        edge(source, node, job.gpus * min(job.runtime_s, t1 - start))
        layer = layer_of[job.gpus_per_node]
        for slot in range(int((start - t0) // slot_s), n_slots):
            lo, hi = t0 + slot * slot_s, min(t1, t0 + (slot + 1) * slot_s)
            edge(node, layer_node(slot, layer), job.gpus * (hi - max(lo, start)))
    for slot in range(n_slots):
        width = min(t1, t0 + (slot + 1) * slot_s) - (t0 + slot * slot_s)
        for layer in range(len(sizes)):
            nxt = layer_node(slot, layer + 1) if layer + 1 < len(sizes) else sink
            edge(layer_node(slot, layer), nxt, caps[layer] * width)
    n = first_layer + n_slots * len(sizes)
    graph = csr_matrix((np.array(data, dtype=np.int64), (rows, cols)), shape=(n, n))
    if graph.data.size and graph.data.max() >= 2**31:
        raise ValueError("bound: an edge capacity exceeds int32 GPU·s; shorten the window or the slots")
    flow = maximum_flow(graph.astype(np.int32), source, sink).flow_value
    total = sum(n.gpus for n in nodes) * span
    return Bound(float(flow), flow / total, n_slots, len(usable), len(data))


__all__ = ["SLOT_S", "Bound", "goodput_bound"]

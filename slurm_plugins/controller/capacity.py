"""Where a gang could start: per-node free and being-freed GPUs, as a scratch copy for one cycle.

Placement is Slurm's all-or-nothing gang rule for a GPU job: ``node_count`` schedulable nodes, each with at least
``gpus_per_node`` free GPUs. Topology (leaf switches, ``NodeInfo.switch``): job_submit.lua gives every gang of 2 to
leaf-size nodes the ``--switches=1`` hint, so Slurm first waits (``switch_wait_s``) for one leaf to hold the whole
gang and only then places it across leaves. The engine follows the hint (``one_leaf``): it lends and frees room for
such a gang inside one leaf when any leaf can hold it, and falls back to any nodes only when none can. Partitions
are not modelled: nuro's clusters run one GPU partition.

Why buckets: a pending job asks "are there k nodes with ≥ g free GPUs?" thousands of times per cycle; nodes are kept
in one set per free-GPU count, so the answer costs O(GPUs per node), not O(nodes), and best-fit picks are cheap.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo


@dataclass(frozen=True)
class Shape:
    """A gang request: ``nodes`` nodes with ``gpus_per_node`` GPUs each."""

    nodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def job_shape(job: JobInfo) -> Shape:
    """The gang a pending job asks for. ``--gpus=N`` without a per-node count is spread evenly (rounded up)."""
    nodes = max(1, job.node_count)
    per_node = job.gpus_per_node
    if per_node <= 0 and job.gpus_total > 0:
        per_node = -(-job.gpus_total // nodes)
    return Shape(nodes, max(0, per_node))


def gpus_on_nodes(job: JobInfo) -> tuple[tuple[str, int], ...]:
    """(node, GPUs) a running job holds on each of its nodes; without a per-node count the total is split evenly."""
    if not job.nodes:
        return ()
    if job.gpus_per_node > 0:
        return tuple((n, job.gpus_per_node) for n in job.nodes)
    base, extra = divmod(max(0, job.gpus_total), len(job.nodes))
    return tuple((n, base + (1 if i < extra else 0)) for i, n in enumerate(job.nodes))


def settled(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """The snapshot with each node's allocated GPUs no more than its jobs hold, as the jobs read saw them.

    Why: the node read (``sinfo``) and the job read (``squeue``) are taken side by side, so a job Slurm starts between
    them can show as allocated on its node and still pending in the job list (and a job that ends can still show on
    its node after it left the job list). Taken as is, that pending job looks unplaceable while its own GPUs block it,
    and the engine preempts a borrower for a job that is already running (seen on the real cluster: a reclaim seconds
    after four jobs were submitted onto four idle nodes). Counting a node's GPUs as free when either read says so
    means nothing is preempted on the strength of one read alone; the cost of the other direction (a GPU lent that
    is not yet free) is a borrower that waits in Slurm's queue until the next cycle sees it right.
    """
    held: dict[str, int] = {}
    for job in snapshot.jobs:
        if job.phase.holds_resources:
            for node, gpus in gpus_on_nodes(job):
                held[node] = held.get(node, 0) + gpus
    nodes = tuple(replace(n, gpus_alloc=h) if n.gpus_alloc > (h := held.get(n.name, 0)) else n for n in snapshot.nodes)
    unchanged = all(a is b for a, b in zip(nodes, snapshot.nodes, strict=True))
    return snapshot if unchanged else replace(snapshot, nodes=nodes)


class Capacity:
    """Free and being-freed GPUs per schedulable node, indexed by node number (nodes sorted by name).

    ``free[n]``: idle GPUs now. ``freeing[n]``: GPUs that preemption victims (in flight or chosen this cycle) will
    release on node n. Reservations made for a pending job take from ``free`` first, then from ``freeing``.
    """

    def __init__(self, nodes: Sequence[NodeInfo]) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        self.names: list[str] = [n.name for n in ordered]
        self.number: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.schedulable: list[bool] = [n.is_schedulable for n in ordered]
        self.free: list[int] = [n.gpus_free for n in ordered]
        self.freeing: list[int] = [0] * len(ordered)
        self.max_gpus: int = max((n.gpus_total for n in ordered), default=0)
        self.max_gpus = max(self.max_gpus, max(self.free, default=0))
        self._buckets: list[set[int]] = [set() for _ in range(self.max_gpus + 1)]
        for i, f in enumerate(self.free):
            self._buckets[f].add(i)
        self._freeing_nodes: set[int] = set()
        leaf_names = {n.switch for n in ordered if n.switch}
        index = {name: i for i, name in enumerate(sorted(leaf_names))}
        self.leaves: list[list[int]] = [[] for _ in index]
        for i, n in enumerate(ordered):
            if n.switch:
                self.leaves[index[n.switch]].append(i)
        self.leaf_size: int = max((len(nodes) for nodes in self.leaves), default=0)

    # -- topology ------------------------------------------------------------------------------------------------
    def one_leaf(self, shape: Shape) -> bool:
        """The gang carries the one-leaf hint (2 to leaf-size nodes, topology known), as job_submit.lua gives it."""
        return 2 <= shape.nodes <= self.leaf_size and len(self.leaves) > 1

    def leaf_groups(self) -> list[set[int]]:
        """The schedulable nodes of each leaf, in leaf order."""
        return [{n for n in nodes if self.schedulable[n]} for nodes in self.leaves]

    # -- queries -------------------------------------------------------------------------------------------------
    def count_free_at_least(self, gpus: int) -> int:
        """Nodes with ≥ ``gpus`` idle GPUs now (being-freed GPUs not counted)."""
        if gpus > self.max_gpus:
            return 0
        return sum(len(b) for b in self._buckets[max(gpus, 0) :])

    def fits_free(self, shape: Shape) -> bool:
        """The gang could start on idle GPUs now."""
        return self.count_free_at_least(shape.gpus_per_node) >= shape.nodes

    def avail(self, n: int) -> int:
        return self.free[n] + self.freeing[n]

    def nodes_avail_at_least(self, gpus: int, within: set[int] | None = None) -> set[int]:
        """Nodes with ≥ ``gpus`` idle or being-freed GPUs (among ``within`` when given)."""
        if within is not None:
            return {n for n in within if self.schedulable[n] and self.avail(n) >= gpus}
        out: set[int] = set()
        if gpus <= self.max_gpus:
            for b in self._buckets[max(gpus, 0) :]:
                out |= b
        for n in self._freeing_nodes:
            if self.free[n] + self.freeing[n] >= gpus:
                out.add(n)
        return out

    # -- scratch updates -----------------------------------------------------------------------------------------
    def _set_free(self, n: int, value: int) -> None:
        self._buckets[self.free[n]].discard(n)
        self.free[n] = value
        self._buckets[value].add(n)

    def take_free(self, shape: Shape) -> list[int] | None:
        """Reserve a gang on idle GPUs, best fit (fullest nodes first, then node order); None when it does not fit.

        Best fit mirrors Slurm's select/cons_tres preference for the least free node that fits, and keeps whole
        nodes free for multi-node gangs. A gang with the one-leaf hint goes to the leaf with the fewest nodes that
        fit (best fit again: big leaves stay whole for bigger gangs), and across leaves only when no leaf can hold it.
        """
        if not self.fits_free(shape):
            return None
        if self.one_leaf(shape):
            g = shape.gpus_per_node
            fitting = [ok for ok in ({n for n in leaf if self.free[n] >= g} for leaf in self.leaf_groups())
                       if len(ok) >= shape.nodes]  # fmt: skip
            if fitting:
                best = min(fitting, key=lambda ok: (len(ok), min(ok)))
                chosen = sorted(best, key=lambda n: (self.free[n] - g, n))[: shape.nodes]
                for n in chosen:
                    self._set_free(n, self.free[n] - g)
                return chosen
        g, chosen = shape.gpus_per_node, []
        for f in range(max(g, 0), self.max_gpus + 1):
            bucket = self._buckets[f]
            while bucket and len(chosen) < shape.nodes:
                n = min(bucket)
                chosen.append(n)
                self._set_free(n, f - g)
            if len(chosen) == shape.nodes:
                break
        return chosen

    def reserve(self, nodes: Iterable[int], gpus_per_node: int) -> None:
        """Hold ``gpus_per_node`` on each node for a pending job: idle GPUs first, then being-freed ones."""
        for n in nodes:
            from_free = min(self.free[n], gpus_per_node)
            self._set_free(n, self.free[n] - from_free)
            rest = gpus_per_node - from_free
            if rest:
                self.freeing[n] = max(0, self.freeing[n] - rest)

    def add_freeing(self, node: str, gpus: int) -> None:
        """A victim will release ``gpus`` on ``node`` (ignored when the node cannot take jobs)."""
        n = self.number.get(node)
        if n is None or not self.schedulable[n] or gpus <= 0:
            return
        self.freeing[n] += gpus
        self._freeing_nodes.add(n)

    def pick_for(self, shape: Shape, usable: set[int]) -> list[int]:
        """The nodes a job will take among ``usable`` (each has room): idle-only nodes first, then the least
        leftover, then node order; deterministic."""
        g = shape.gpus_per_node

        def key(n: int) -> tuple[int, int, int]:
            return (0 if self.free[n] >= g else 1, self.avail(n) - g, n)

        return sorted(usable, key=key)[: shape.nodes]


__all__ = ["Capacity", "Shape", "gpus_on_nodes", "job_shape"]

"""Packing node weights: each GPU node's Slurm ``Weight`` follows its free GPUs, so a job goes to the busiest node
that can host it and whole nodes stay whole for gangs.

Why: slurmctld picks among the nodes of the lowest ``Weight`` that satisfy a request, and among those by topology
and node order, never by leftover GPUs (``_eval_nodes_topo``, ``eval_nodes.c``; docs/controller.md "Packing node
weights"). A 1-GPU job therefore lands on the first idle node of the tightest leaf as readily as on a node with one
GPU free, and a gang then waits for nodes that small jobs broke. With ``Weight = 1 + free GPUs`` the lowest weight
that fits is the best fit: the replay's mean ratio over hard quotas on the example policy is 1.069 with Slurm's own
choice and 1.093 with these weights (docs/trace-replay.md).

What it costs Slurm: one ``scontrol update nodename=<hostlist> weight=<n>`` per distinct value that changed (at most
one per possible free-GPU count, usually one or two a cycle). ``scontrol reconfigure`` and a slurmctld restart put
slurm.conf's weights back; the next cycle reads them (``NodeInfo.weight``) and sets them again, so nothing needs to
notice a restart. While this runs, slurm.conf's ``Weight`` of GPU nodes has no effect (``node_weights: false`` in the
controller config keeps it); a cleanly stopped controller sets them to Slurm's default 1 (``neutral_weight``), and
``scontrol reconfigure`` brings slurm.conf's back. Pure: ``plan`` maps nodes to updates, the daemon applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nuro.slurm import hostlist
from nuro.slurm.actions import UpdateNodeWeight
from nuro.slurm.models import NodeInfo

#: The weight of a GPU node with no GPU free; one more per free GPU.
PACK_WEIGHT_BASE = 1
#: Slurm's default node weight: what a cleanly stopped controller leaves on every GPU node (``neutral_weight``).
DEFAULT_WEIGHT = 1


def packing_weight(node: NodeInfo) -> int | None:
    """The weight ``node`` should have now; None for a node whose weight this leaves alone (no GPUs, or not
    schedulable: nothing starts there, and a node coming back gets its weight on the next cycle)."""
    if node.gpus_total <= 0 or not node.is_schedulable:
        return None
    return PACK_WEIGHT_BASE + max(0, node.gpus_total - node.gpus_alloc)


def neutral_weight(node: NodeInfo) -> int | None:
    """What a stopping controller leaves on a GPU node: Slurm's default, so no steering outlives the controller
    (stale packing weights would keep preferring nodes that were busy when it stopped)."""
    return DEFAULT_WEIGHT if node.gpus_total > 0 else None


@dataclass(frozen=True)
class WeightPlan:
    """The updates one cycle sends, lowest weight first (each one ``scontrol`` call)."""

    updates: tuple[UpdateNodeWeight, ...]

    @property
    def nodes(self) -> int:
        return sum(len(hostlist.expand(u.node)) for u in self.updates)


def plan(nodes: Iterable[NodeInfo], target: Callable[[NodeInfo], int | None] = packing_weight) -> WeightPlan:
    """One update per distinct ``target`` weight (packing by default), for the nodes whose weight differs from it
    (an unknown weight counts as different)."""
    by_weight: dict[int, list[str]] = {}
    for node in nodes:
        want = target(node)
        if want is not None and node.weight != want:
            by_weight.setdefault(want, []).append(node.name)
    return WeightPlan(
        tuple(UpdateNodeWeight(hostlist.compress(sorted(names)), w) for w, names in sorted(by_weight.items()))
    )


__all__ = ["DEFAULT_WEIGHT", "PACK_WEIGHT_BASE", "WeightPlan", "neutral_weight", "packing_weight", "plan"]

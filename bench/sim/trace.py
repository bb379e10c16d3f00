"""The Alibaba GPU trace as the replay reads it, and the cluster and policy shaped from it.

Why a module of its own: the trace is the one input that is real (arrival times, run times, GPU counts, node sizes);
everything the replay invents lives in ``synth.py``, so what is measured and what is made up never mix.

Trace facts that shape the choices here (from the trace's own README, beside its files): 8,152 pods, 1,088 without GPUs,
861 never scheduled (``pod_phase=Pending``: no run time exists), ``gpu_milli`` < 1000 on about 45 % of GPU pods
(GPU sharing, which Slurm's whole-GPU gres cannot express), ``num_gpu`` 1–8 on one node each. The node list has
1,213 nodes / 6,212 GPUs in 12 (GPUs, model) classes; ``gpu_spec`` is empty for every pod, so GPU models are ignored.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nuro.policy.model import Policy, load_policy, parse_policy, policy_to_yaml_dict

TRACES = Path("/work/shared/traces")
POD_CSV = TRACES / "openb_pod_list_default.csv"
NODE_CSV = TRACES / "openb_node_list_gpu_node.csv"


@dataclass(frozen=True)
class TraceTask:
    """One pod of the trace. Times are seconds from the trace start; ``scheduled_s``/``deletion_s`` None when
    absent."""

    name: str
    num_gpu: int
    gpu_milli: int
    qos: str
    phase: str
    creation_s: int
    deletion_s: int | None
    scheduled_s: int | None

    @property
    def runtime_s(self) -> int | None:
        """Observed run time (deletion − scheduled); None for a pod that never ran."""
        if self.scheduled_s is None or self.deletion_s is None:
            return None
        return max(1, self.deletion_s - self.scheduled_s)

    @property
    def is_censored(self) -> bool:
        """Still running when the trace was cut: its run time is only a lower bound."""
        return self.phase == "Running"


@dataclass(frozen=True)
class TraceNode:
    name: str
    gpus: int
    model: str


@dataclass(frozen=True)
class NodeSpec:
    """A node of the replayed cluster: ``leaf`` is its topology leaf switch (``leaf_size`` nodes per leaf)."""

    name: str
    gpus: int
    leaf: str
    model: str = ""


def _int_or_none(text: str) -> int | None:
    text = text.strip()
    return int(text) if text else None


def load_tasks(path: Path = POD_CSV) -> list[TraceTask]:
    """Every pod of the trace, in file order."""
    with path.open(newline="") as f:
        return [
            TraceTask(
                name=row["name"],
                num_gpu=int(row["num_gpu"]),
                gpu_milli=int(row["gpu_milli"] or 0),
                qos=row["qos"],
                phase=row["pod_phase"],
                creation_s=int(row["creation_time"]),
                deletion_s=_int_or_none(row["deletion_time"]),
                scheduled_s=_int_or_none(row["scheduled_time"]),
            )
            for row in csv.DictReader(f)
        ]


def load_nodes(path: Path = NODE_CSV) -> list[TraceNode]:
    """Every GPU node of the trace, in file order."""
    with path.open(newline="") as f:
        return [TraceNode(row["sn"], int(row["gpu"]), row["model"]) for row in csv.DictReader(f)]


def shape_cluster(nodes: Sequence[TraceNode], scale: float, leaf_size: int = 4) -> list[NodeSpec]:
    """A stratified ``scale`` fraction of the trace's nodes, in leaves of ``leaf_size`` nodes.

    Every (GPUs, model) class keeps ``scale`` of its nodes (largest remainder, so the total is ``round(n × scale)``
    and the node mix stays the trace's); the first nodes of each class in file order are kept, so no seed is
    involved. Leaves are cut within a class (a rack holds one kind of server), the last leaf of a class may be short.
    """
    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    classes: dict[tuple[int, str], list[TraceNode]] = {}
    for n in nodes:
        classes.setdefault((n.gpus, n.model), []).append(n)
    target = max(1, round(len(nodes) * scale))
    exact = {k: len(v) * scale for k, v in classes.items()}
    keep = {k: int(x) for k, x in exact.items()}
    by_remainder = sorted(classes, key=lambda k: (-(exact[k] - keep[k]), -k[0], k[1]))
    for k in by_remainder[: max(0, target - sum(keep.values()))]:
        keep[k] += 1
    out: list[NodeSpec] = []
    leaf_no = 0
    for k in sorted(classes, key=lambda k: (-k[0], k[1])):  # big nodes first: gangs find them at low indices
        members = classes[k][: keep[k]]
        for i in range(0, len(members), leaf_size):
            for n in members[i : i + leaf_size]:
                out.append(NodeSpec(n.name, n.gpus, f"leaf{leaf_no:03d}", n.model))
            leaf_no += 1
    return out


def scale_policy(example: Path, cluster_gpus: int) -> Policy:
    """The example ``teams.yaml`` scaled to ``cluster_gpus``: quotas proportional and summing to the cluster
    (largest remainder), borrow and lend limits and lend buffers scaled by the same factor; members, tiers and grace
    unchanged."""
    base = load_policy(example)
    data = policy_to_yaml_dict(base)
    factor = cluster_gpus / sum(t.quota_gpus for t in base.teams)
    exact = {t.name: t.quota_gpus * factor for t in base.teams}
    quotas = {n: int(x) for n, x in exact.items()}
    for n in sorted(exact, key=lambda n: -(exact[n] - quotas[n]))[: cluster_gpus - sum(quotas.values())]:
        quotas[n] += 1
    for name, body in data["teams"].items():
        q = quotas[name]
        body["quota_gpus"] = q
        body["borrow_limit_gpus"] = min(cluster_gpus - q, round(body.get("borrow_limit_gpus", 0) * factor))
        body["lend_limit_gpus"] = min(q, round(body.get("lend_limit_gpus", 0) * factor))
        if body.get("lend_buffer_gpus"):
            body["lend_buffer_gpus"] = min(q, round(body["lend_buffer_gpus"] * factor))
        if "fairshare" in body:
            body["fairshare"] = max(1, q)
    data["cluster_gpus"] = cluster_gpus
    return parse_policy(data, f"{example} scaled to {cluster_gpus} GPUs")


__all__ = [
    "NODE_CSV",
    "POD_CSV",
    "NodeSpec",
    "TraceNode",
    "TraceTask",
    "load_nodes",
    "load_tasks",
    "scale_policy",
    "shape_cluster",
]

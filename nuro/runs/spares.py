"""A run's hot spares for ``nuro-train status``: how many, which swaps used them, and what the idle ones cost.

A spare is allocated like any node (the quota counts its GPUs, Slurm's accounting bills them), so its idle time is
the job's allocation overhead: each spare from the job's start until a swap put it to work (or until now / the end).
Pure: the caller reads the job (Slurm) and its ``spare_swap`` run events (S3).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nuro.lifecycle.run_events import RunEvent, node_names


def spare_summary(
    spares: int, alloc_nodes: int, gpus_per_node: int, start: float | None, end: float, swaps: Iterable[RunEvent]
) -> dict[str, Any]:
    """``spares`` allocated, the swaps (oldest first) and the spares' idle GPU time.

    Args:
        spares: the run record's spare count (``--spare-nodes``).
        alloc_nodes: the nodes the job was allocated (training nodes + spares, before any loss).
        gpus_per_node: the job's GPUs per node (0 on CPU jobs: the overhead is then in node-hours only).
        start: when the job started (None while pending: nothing idle yet).
        end: now for a running job, else its end.
        swaps: the job's ``spare_swap`` run events.
    """
    events = sorted((e for e in swaps if e.kind == "spare_swap"), key=lambda e: e.ts)
    rows = []
    used_at: list[float] = []
    for e in events:
        lost, taken = node_names(e.fields.get("lost")), node_names(e.fields.get("spares"))
        rows.append({"at": round(e.ts, 3), "lost": lost, "spares": taken})
        used_at += [e.ts] * len(taken)
    used_at = used_at[:spares]
    idle_s = 0.0
    if start is not None:
        ends = used_at + [end] * (spares - len(used_at))
        idle_s = sum(max(0.0, t - start) for t in ends)
    total_s = max(0.0, end - start) if start is not None else 0.0
    return {
        "spares": spares,
        "spares_left": spares - len(used_at),
        "swaps": rows,
        "idle_node_hours": round(idle_s / 3600, 4),
        "idle_gpu_hours": round(idle_s * gpus_per_node / 3600, 4),
        # of the whole allocation's node time (training nodes + spares): what the spares' insurance costs
        "overhead_pct": round(100 * idle_s / (total_s * alloc_nodes), 1) if total_s > 0 and alloc_nodes else 0.0,
    }


def spare_lines(summary: dict[str, Any]) -> list[str]:
    """Human lines for ``nuro-train status``."""
    lines = [
        f"{summary['spares']} allocated, {summary['spares_left']} left; idle {summary['idle_gpu_hours']:g} GPU-h "
        f"({summary['idle_node_hours']:g} node-h, {summary['overhead_pct']:g} % of the allocation)"
    ]
    for i, s in enumerate(summary["swaps"], 1):
        lines.append(f"swap {i}: {','.join(s['lost']) or '?'} lost -> {','.join(s['spares']) or '?'}")
    return lines


__all__ = ["spare_lines", "spare_summary"]

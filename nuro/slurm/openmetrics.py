"""slurmctld's OpenMetrics endpoints (25.11+, ``MetricsType=metrics/openmetrics``) read into one metrics point.

Why: from 25.11 slurmctld itself serves the cluster's counts (jobs by state, GPUs allocated, node states) and its
scheduler statistics (sdiag's numbers) as OpenMetrics text on its own port, ``GET /metrics/<endpoint>``. nuro stores
a chosen set of them as one ``slurmctld`` point per scrape (:data:`nuro.metrics.model.SLURMCTLD`), so the cluster
dashboard shows the queue and the scheduler without nuro polling squeue/sdiag for those numbers.

The text is parsed by ``prometheus_client``'s parser (the reference implementation of the format), in this one
place. The field names and units are fixed here (:data:`FIELDS`); captured output of 26.05 is the test fixture
(``tests/fixtures/slurm/v26.05/openmetrics_*.txt``). Units as slurmctld gives them: cycle times in microseconds
(sdiag's), memory in megabytes although the series is named ``_bytes`` (captured: 64000 for a 62.5 GiB node).
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

#: The endpoints read per scrape (``/metrics/<name>``); ``partitions`` and ``jobs-users-accts`` are not needed.
ENDPOINTS = ("jobs", "nodes", "scheduler")

#: Unlabelled OpenMetrics series → field of the ``slurmctld`` point.
FIELDS: dict[str, str] = {
    # /metrics/jobs: jobs by state, what running jobs hold
    "slurm_jobs": "jobs",
    "slurm_jobs_pending": "jobs_pending",
    "slurm_jobs_running": "jobs_running",
    "slurm_jobs_hold": "jobs_held",
    "slurm_jobs_requeued": "jobs_requeued",
    "slurm_jobs_preempted": "jobs_preempted",
    "slurm_jobs_node_failed": "jobs_node_failed",
    "slurm_jobs_gpus_alloc": "gpus_alloc",
    "slurm_jobs_nodes_alloc": "nodes_alloc",
    # /metrics/nodes: node states (counts; a node may be in several, e.g. mixed and drain)
    "slurm_nodes": "nodes",
    "slurm_nodes_idle": "nodes_idle",
    "slurm_nodes_mixed": "nodes_mixed",
    "slurm_nodes_alloc": "nodes_allocated",
    "slurm_nodes_drain": "nodes_drain",
    "slurm_nodes_down": "nodes_down",
    "slurm_nodes_noresp": "nodes_not_responding",
    # /metrics/scheduler: sdiag's statistics, microseconds for cycles
    "slurm_schedule_cycle_last": "sched_cycle_last_us",
    "slurm_schedule_cycle_max": "sched_cycle_max_us",
    "slurm_sched_mean_cycle": "sched_cycle_mean_us",
    "slurm_schedule_queue_len": "sched_queue_len",
    "slurm_bf_cycle_last": "bf_cycle_last_us",
    "slurm_bf_queue_len": "bf_queue_len",
    "slurm_agent_queue_size": "agent_queue_size",
    "slurm_slurmdbd_queue_size": "dbd_queue_size",
}
#: Per-node series summed over the nodes into one field.
SUMS: dict[str, str] = {"slurm_node_gpus": "gpus_total"}


class OpenMetricsError(RuntimeError):
    """An endpoint could not be read or its text not parsed; the message names the URL."""


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(series name, labels, value)`` of every sample. Raises :class:`OpenMetricsError` on malformed text."""
    try:
        return [
            (s.name, dict(s.labels), float(s.value)) for f in text_string_to_metric_families(text) for s in f.samples
        ]
    except ValueError as exc:
        raise OpenMetricsError(f"not OpenMetrics text: {exc}") from exc


def cluster_fields(texts: Mapping[str, str]) -> dict[str, float | int]:
    """The ``slurmctld`` point's fields from the endpoints' texts (``{"jobs": text, ...}``); series the version
    does not serve are simply absent. Counts come back as ints."""
    out: dict[str, float] = {}
    for text in texts.values():
        for name, labels, value in parse(text):
            if not labels and name in FIELDS:
                out[FIELDS[name]] = value
            elif name in SUMS:
                out[SUMS[name]] = out.get(SUMS[name], 0.0) + value
    return {k: int(v) if float(v).is_integer() else v for k, v in out.items()}


def fetch(base_url: str, endpoint: str, timeout_s: float = 5.0) -> str:
    """``GET <base_url>/metrics/<endpoint>``: slurmctld's own HTTP answer on its port (no auth for metrics)."""
    url = f"{base_url.rstrip('/')}/metrics/{endpoint}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 (the admin's URL, http only)
            return resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, http.client.HTTPException, OSError, TimeoutError) as exc:  # not HTTP at all too
        raise OpenMetricsError(f"{url}: {getattr(exc, 'reason', exc)}") from exc


def scrape(base_url: str, timeout_s: float = 5.0) -> dict[str, float | int]:
    """Every endpoint of :data:`ENDPOINTS` read and reduced to the point's fields."""
    return cluster_fields({e: fetch(base_url, e, timeout_s) for e in ENDPOINTS})

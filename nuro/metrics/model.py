"""The metric schema and the one query shape every sink answers. Pure: no I/O here.

Why a fixed schema: the CLI (`nuro-train metrics`), the Grafana dashboards and the bench all read what the SDK and
the node agent write; one table of measurements, tags and fields keeps them from drifting. Tags are the indexed,
low-cardinality identifiers; fields are the values.

- ``train`` (SDK ``MetricsLogger``, every rank): tags team, run, job, restart, rank; fields step (int), loss,
  step_time_s, samples_per_s, and custom scalars (float).
- ``gpu`` (node agent, 1 Hz): tags node, gpu (index), uuid, model, and job, team, run while a job holds the GPU
  (``nuro.protocol.gpujobs``); fields util_pct, mem_used_bytes, mem_total_bytes, temp_c, sm_clock_mhz, power_w.
- ``slurmctld`` (nuro-controller, every ``slurm_metrics_interval_s``, Slurm 25.11+): tag controller
  (slurmctld's host:port); fields from slurmctld's OpenMetrics (``nuro.slurm.openmetrics.FIELDS``):
  jobs_pending, jobs_running, gpus_alloc, gpus_total, nodes_drain, sched_cycle_last_us, bf_cycle_last_us, …
- ``nuro_metrics`` (every buffered writer, on each flush): tags source (``rank<N>`` or ``agent``), node, and team,
  run, job when a run's; fields written, dropped, buffered, errors (cumulative ints).

Timestamps are integer nanoseconds since the Unix epoch (InfluxDB's native precision).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from nuro import names

TRAIN = "train"
GPU = "gpu"
SELF = "nuro_metrics"
SLURMCTLD = "slurmctld"

TRAIN_TAGS = ("team", "run", "job", "restart", "rank")
GPU_TAGS = ("node", "gpu", "uuid", "model", "job", "team", "run")
SELF_TAGS = ("source", "node", "team", "run", "job")
SLURMCTLD_TAGS = ("controller",)

FieldValue = float | int | bool | str
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")


class InvalidPoint(ValueError):
    """A point that no sink should store: bad name, no fields, a NaN/inf value; the message names it."""


@dataclass(frozen=True)
class Point:
    measurement: str
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]
    ts_ns: int

    def __post_init__(self) -> None:
        for what, name in [("measurement", self.measurement), *(("tag", k) for k in self.tags),
                           *(("field", k) for k in self.fields)]:  # fmt: skip
            if not _NAME.fullmatch(name):
                raise InvalidPoint(f"{what} name {name!r}: use letters, digits, '_' or '.', starting with a letter")
        if not self.fields:
            raise InvalidPoint(f"{self.measurement}: a point needs at least one field")
        for k, v in self.fields.items():
            if isinstance(v, float) and not math.isfinite(v):
                raise InvalidPoint(f"{self.measurement}.{k} = {v}: not a finite number")
        for k, v in self.tags.items():
            if not isinstance(v, str) or not v or "\n" in v:
                raise InvalidPoint(f"{self.measurement}: tag {k} must be a non-empty one-line string, got {v!r}")


@dataclass(frozen=True)
class Query:
    """Points of one measurement whose tags equal ``where``, in ``[since_ns, until_ns)``, oldest first.

    ``fields`` empty = all fields. ``limit`` keeps the newest ``limit`` rows (still returned oldest first).
    """

    measurement: str
    where: Mapping[str, str] = field(default_factory=dict)
    fields: tuple[str, ...] = ()
    since_ns: int | None = None
    until_ns: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class Row:
    ts_ns: int
    tags: Mapping[str, str]
    fields: Mapping[str, FieldValue]

    def tag_index(self, key: str, default: int) -> int:
        """Tag ``key`` as a non-negative index (a rank, a GPU), ``default`` when absent or not ASCII digits. The
        job wrote it: ``"²"`` passes ``str.isdigit`` and then fails ``int``, so a plain isdigit check is not enough."""
        tag = str(self.tags.get(key, ""))
        return int(tag) if names.is_decimal(tag) else default

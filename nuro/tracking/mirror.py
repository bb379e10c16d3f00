"""What a nuro run looks like in MLflow: pure functions from nuro's records to an MLflow run's content (issue 18).

One nuro run (a Slurm job with a ``nuro`` record, all its attempts) is one MLflow run, in the experiment of its team
(``nuro/<team>``: MLflow's unit of permissions, so a team's runs can be guarded as a whole). Found again by its tag
``nuro.job_id``; a run continued with ``--resume-from`` is the child of the earlier job's run
(``mlflow.parentRunId``), so the resume chain shows as nested runs.

Names (MLflow's conventions where it has one):

- params: the job spec as submitted (``team``, ``tier``, ``nodes``, ``gpus_per_node``, ``launcher``, ``script``,
  ``args``, ``deepspeed_config``, ``ckpt_interval_s``, ``ckpt_keep``, ``max_requeues``, ``data_seed``,
  ``spare_nodes``, ``dataset``, ``code_commit``): params never change, so only what the record fixed at submit;
- tags: ``mlflow.user`` (the Slurm user), ``mlflow.source.name``/``mlflow.source.git.commit`` (the pinned code),
  ``nuro.job_id``, ``nuro.state`` (Slurm's), ``nuro.attempts``, ``nuro.nodes``, ``nuro.reason`` (why it waits),
  ``nuro.code_diff`` (a dirty run's patch digest);
- metrics: every ``train`` point of ``MetricsLogger``: rank 0's under the field's own name (``loss``,
  ``samples_per_s``, ``step_time_s``, custom scalars), every other rank's as ``rank<r>/<field>``, at the point's
  step and wall time; the dataset as an MLflow dataset input (name + snapshot digest, source ``s3://…``).

Slurm states map to MLflow's run statuses: pending/requeued → SCHEDULED, running → RUNNING, completed → FINISHED,
cancelled → KILLED, every other end → FAILED.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nuro.metrics.model import Row
from nuro.tracking.mlflow import Metric

EXPERIMENT_PREFIX = "nuro/"
TAG_JOB = "nuro.job_id"
TAG_PARENT = "mlflow.parentRunId"
TAG_REASON = "nuro.reason"
TAG_WAIT = "nuro.controller.wait"
TAG_QUEUE = "nuro.queue_position"
#: tags that exist only while the job waits (removed from the run once it starts)
PENDING_TAGS = (TAG_REASON, TAG_WAIT, TAG_QUEUE)
#: the fields of a train point that are not metrics
_NOT_METRICS = frozenset({"step"})


def mirrored_team(record: Mapping[str, Any], account: str) -> str | None:
    """The team whose experiment mirrors a job: its run record's team when that is the job's own Slurm account, else
    None (a plain sbatch job, or a record naming another team's experiment: never mirrored)."""
    team = str(record.get("team") or "")
    return team if team and team == account else None


def experiment_name(team: str) -> str:
    return f"{EXPERIMENT_PREFIX}{team}"


#: MLflow 3's experiment-kind tag: the UI opens an experiment of kind ``custom_model_development`` in its
#: model-training view (runs, metrics charts); untagged ones may open in the GenAI view (traces, judges, prompts).
TAG_EXPERIMENT_KIND = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


def experiment_tags(team: str) -> dict[str, str]:
    """The tags of a team's experiment: whose it is, and that it holds training runs (``TAG_EXPERIMENT_KIND``)."""
    return {"nuro.team": team, TAG_EXPERIMENT_KIND: EXPERIMENT_KIND}


def mlflow_status(phase: str) -> str:
    """Slurm's job phase (``JobPhase`` name) → MLflow's run status."""
    return {
        "PENDING": "SCHEDULED", "REQUEUED": "SCHEDULED", "RUNNING": "RUNNING", "COMPLETING": "RUNNING",
        "SUSPENDED": "RUNNING", "COMPLETED": "FINISHED", "CANCELLED": "KILLED",
    }.get(phase, "FAILED")  # fmt: skip


def params_of(meta: Mapping[str, Any], nodes: int, gpus_per_node: int) -> dict[str, str]:
    """The run's params from its record and its allocation request (what was submitted; they never change)."""
    entry = meta.get("entry") or {}
    dataset = meta.get("dataset") or {}
    code = meta.get("code") or {}
    ckpt = meta.get("ckpt_policy") or {}
    out: dict[str, Any] = {
        "team": meta.get("team"),
        "tier": meta.get("tier") or f"g-{meta.get('team')}",
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "launcher": entry.get("launcher"),
        "script": entry.get("script"),
        "args": " ".join(map(str, entry.get("args") or [])) or None,
        "deepspeed_config": entry.get("deepspeed_config"),
        "ckpt_interval_s": ckpt.get("interval_s"),
        "ckpt_keep": ckpt.get("keep"),
        "max_requeues": (meta.get("requeue") or {}).get("max"),
        "data_seed": (meta.get("data") or {}).get("seed", 0),
        "spare_nodes": (meta.get("spares") or {}).get("nodes", 0),
        "dataset": f"{dataset.get('name')}@{dataset.get('digest')}" if dataset else None,
        "code_commit": code.get("commit"),
        "resume_from": meta.get("resume_from"),
        "submitted_via": meta.get("via", "nuro-train"),
    }
    return {k: str(v) for k, v in out.items() if v is not None}


@dataclass(frozen=True)
class JobView:
    """What the mirror needs of a Slurm job (from ``nuro.slurm.JobInfo``)."""

    job_id: int
    user: str
    phase: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    restart_count: int
    start_ms: int | None
    end_ms: int | None


def tags_of(meta: Mapping[str, Any], job: JobView, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The run's tags now (they change with the job: state, attempts, nodes, why it waits)."""
    code = meta.get("code") or {}
    out: dict[str, str] = {
        TAG_JOB: str(job.job_id),
        "mlflow.user": job.user,
        "mlflow.source.type": "JOB",
        "nuro.team": str(meta.get("team", "")),
        "nuro.state": job.state,
        "nuro.attempts": str(job.restart_count + 1),
        "nuro.nodes": ",".join(job.nodes),
    }
    if job.phase == "PENDING" and job.reason and job.reason != "None":  # why it waits (removed once it runs)
        out[TAG_REASON] = job.reason
    if code.get("repo"):
        out["mlflow.source.name"] = str(code["repo"])
    if code.get("commit"):
        out["mlflow.source.git.commit"] = str(code["commit"])
    if code.get("diff"):
        out["nuro.code_diff"] = str(code["diff"])
    if code.get("diff_uri"):  # where the shipped patch itself is kept (the job checks it against the digest)
        out["nuro.code_diff_uri"] = str(code["diff_uri"])
    out.update(extra or {})
    return out


def wait_of_tag(value: str | None) -> dict[str, str] | None:
    """The controller's reason back from a ``nuro.controller.wait`` tag (``pending_tags`` wrote it as
    ``<reason> (<code>)``); None for anything else."""
    if not value or not value.endswith(")") or " (" not in value:
        return None
    reason, code = value[:-1].rsplit(" (", 1)
    if not reason or not code or not code.replace("_", "").isalnum():
        return None
    return {"code": code, "reason": reason}


def pending_tags(view: Mapping[str, Any]) -> dict[str, str]:
    """The scheduler's view of a waiting job (``nuro.runs.pending.pending_view``) as tags."""
    out = {}
    if "queue_position" in view:
        out[TAG_QUEUE] = f"{view['queue_position']} of {view['queue_length']}"
    if "controller" in view:
        out[TAG_WAIT] = f"{view['controller']['reason']} ({view['controller']['code']})"
    return out


#: timeline event kinds counted as the run's tags (failures, preemptions, restarts at a glance)
EVENT_TAGS = {"node_lost": "nuro.events.node_lost", "requeued": "nuro.events.requeued",
              "job_preempt_signalled": "nuro.events.preempted", "spare_swap": "nuro.events.spare_swap",
              "node_fail": "nuro.events.node_fail", "failed": "nuro.events.failed",
              "resumed": "nuro.events.resumed", "checkpoint_skipped": "nuro.events.checkpoint_skipped"}  # fmt: skip


def event_tags(timeline: Mapping[str, Any]) -> dict[str, str]:
    """Counts of the timeline's failure, preemption and restart events (``nuro-train events --json``) as tags."""
    counts: dict[str, int] = {}
    for e in timeline.get("events", []):
        tag = EVENT_TAGS.get(str(e.get("kind")))
        if tag:
            counts[tag] = counts.get(tag, 0) + 1
    return {k: str(v) for k, v in counts.items()}


def metric_key(field: str, rank: int) -> str:
    return field if rank == 0 else f"rank{rank}/{field}"


def metrics_of(rows: Iterable[Row]) -> list[Metric]:
    """MLflow metrics of ``train`` rows (every rank, every restart), oldest first."""
    out: list[Metric] = []
    for row in sorted(rows, key=lambda r: r.ts_ns):
        rank = row.tag_index("rank", 0)
        step = row.fields.get("step")
        step_i = int(step) if isinstance(step, int | float) else 0
        ms = row.ts_ns // 1_000_000
        for name, value in row.fields.items():
            if name in _NOT_METRICS or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            out.append(Metric(metric_key(name, rank), float(value), ms, step_i))
    return out


#: the agents' ``gpu`` fields → MLflow's system-metric names (its own GPU monitor's), with a unit conversion
_SYSTEM = (("util_pct", "utilization_percentage", 1.0), ("mem_used_bytes", "memory_usage_megabytes", 1 / 2**20),
           ("temp_c", "temperature_celsius", 1.0), ("power_w", "power_usage_watts", 1.0))  # fmt: skip


def system_metrics_of(rows: Iterable[Row]) -> list[Metric]:
    """MLflow system metrics (``system/<node>/gpu_<i>_<name>``, the UI's System metrics tab) of the node agents'
    ``gpu`` points for the job's GPUs, oldest first."""
    out: list[Metric] = []
    for row in sorted(rows, key=lambda r: r.ts_ns):
        node, gpu = row.tags.get("node", "?"), row.tags.get("gpu", "?")
        for field, name, scale in _SYSTEM:
            value = row.fields.get(field)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.append(Metric(f"system/{node}/gpu_{gpu}_{name}", float(value) * scale, row.ts_ns // 1_000_000))
    return out


def checkpoint_uri(meta: Mapping[str, Any], step: int, bucket: str) -> str | None:
    """Where the manifest of the run's committed ``step`` is (the checkpoint itself stays in S3: no copy)."""
    from nuro.checkpoint.layout import manifest_key  # lazy: the checkpoint package only for this one key

    team, run = meta.get("team"), meta.get("name")
    try:
        return f"s3://{bucket}/{manifest_key(str(team), str(run), step)}" if team and run else None
    except ValueError:  # a record naming what no checkpoint can be stored under (the comment is the user's)
        return None


def dataset_input(meta: Mapping[str, Any], bucket: str) -> dict[str, str] | None:
    """The dataset snapshot as an MLflow dataset input (name, digest, source), or None without one."""
    ds = meta.get("dataset") or {}
    if not ds.get("name") or not ds.get("digest"):
        return None
    digest = str(ds["digest"])
    return {"name": str(ds["name"]), "digest": digest.removeprefix("sha256:")[:36],
            "source": f"s3://{bucket}/datasets/{ds['name']}/{digest}", "source_type": "s3"}  # fmt: skip


__all__ = [
    "EXPERIMENT_PREFIX",
    "TAG_JOB",
    "TAG_PARENT",
    "TAG_REASON",
    "TAG_WAIT",
    "TAG_QUEUE",
    "PENDING_TAGS",
    "pending_tags",
    "EVENT_TAGS",
    "event_tags",
    "JobView",
    "dataset_input",
    "experiment_name",
    "metric_key",
    "metrics_of",
    "mlflow_status",
    "params_of",
    "system_metrics_of",
    "checkpoint_uri",
    "tags_of",
]

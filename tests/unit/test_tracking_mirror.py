"""What a nuro run looks like in MLflow (nuro.tracking.mirror) and how the adapter splits a batch
(nuro.tracking.mlflow.batches): pure code."""

from __future__ import annotations

import pytest

from nuro.metrics.model import Row
from nuro.tracking import mirror
from nuro.tracking.mlflow import MAX_ENTITIES, MAX_METRICS, MAX_PARAMS, Metric, batches, filter_value, run_url

META = {
    "v": 1, "name": "traj", "team": "prediction", "dataset": {"name": "tracks", "digest": "sha256:" + "ab" * 32},
    "code": {"repo": "/shared/pred", "commit": "c" * 40, "diff": "sha256:" + "d" * 64, "diff_uri": "s3://nuro/p"},
    "entry": {"launcher": "deepspeed", "script": "train.py", "args": ["--steps", "9"], "deepspeed_config": "ds.json"},
    "ckpt_policy": {"interval_s": 600, "keep": 3}, "requeue": {"max": 3}, "resume_from": "41",
}  # fmt: skip
JOB = mirror.JobView(job_id=42, user="priya", phase="PENDING", state="PENDING", reason="QOSGrpGRES", nodes=(),
                     restart_count=0, start_ms=None, end_ms=None)  # fmt: skip


def test_params_are_the_spec_as_submitted() -> None:
    p = mirror.params_of(META, nodes=2, gpus_per_node=8)
    assert p == {"team": "prediction", "tier": "g-prediction", "nodes": "2", "gpus_per_node": "8",
                 "launcher": "deepspeed", "script": "train.py", "args": "--steps 9", "deepspeed_config": "ds.json",
                 "ckpt_interval_s": "600", "ckpt_keep": "3", "max_requeues": "3", "data_seed": "0",
                 "spare_nodes": "0", "dataset": "tracks@sha256:" + "ab" * 32, "code_commit": "c" * 40,
                 "resume_from": "41", "submitted_via": "nuro-train"}  # fmt: skip


def test_tags_follow_the_job_and_the_reason_only_while_it_waits() -> None:
    t = mirror.tags_of(META, JOB)
    assert t[mirror.TAG_JOB] == "42" and t["mlflow.user"] == "priya" and t["mlflow.source.git.commit"] == "c" * 40
    assert t["nuro.reason"] == "QOSGrpGRES" and t["nuro.code_diff"].startswith("sha256:")
    assert t["nuro.code_diff_uri"] == "s3://nuro/p"
    running = mirror.JobView(**{**JOB.__dict__, "phase": "RUNNING", "state": "RUNNING", "nodes": ("gpu001",)})
    assert (
        "nuro.reason" not in mirror.tags_of(META, running) and mirror.tags_of(META, running)["nuro.nodes"] == "gpu001"
    )


@pytest.mark.parametrize(("phase", "status"), [("PENDING", "SCHEDULED"), ("REQUEUED", "SCHEDULED"),
                         ("RUNNING", "RUNNING"), ("COMPLETED", "FINISHED"), ("CANCELLED", "KILLED"),
                         ("FAILED", "FAILED"), ("TIMEOUT", "FAILED"), ("NODE_FAIL", "FAILED")])  # fmt: skip
def test_slurm_phases_map_to_mlflow_statuses(phase: str, status: str) -> None:
    assert mirror.mlflow_status(phase) == status


def test_metrics_per_rank_with_step_and_time() -> None:
    rows = [Row(2_000_000, {"rank": "1"}, {"step": 3, "loss": 0.5, "samples_per_s": 100.0}),
            Row(1_000_000, {"rank": "0"}, {"step": 3, "loss": 0.25, "flag": True})]  # fmt: skip
    assert mirror.metrics_of(rows) == [Metric("loss", 0.25, 1, 3), Metric("rank1/loss", 0.5, 2, 3),
                                       Metric("rank1/samples_per_s", 100.0, 2, 3)]  # fmt: skip
    # a rank tag the job wrote oddly is rank 0's, never an error that stalls the run's mirror ("²" passes isdigit)
    odd = [Row(1_000_000, {"rank": r}, {"step": 1, "loss": 1.0}) for r in ("²", "-1", "x", "")]
    assert [m.key for m in mirror.metrics_of(odd)] == ["loss"] * 4


def test_the_dataset_input_names_the_snapshot() -> None:
    ds = mirror.dataset_input(META, "nuro")
    assert ds == {"name": "tracks", "digest": ("ab" * 32)[:36], "source_type": "s3",
                  "source": "s3://nuro/datasets/tracks/sha256:" + "ab" * 32}  # fmt: skip
    assert mirror.dataset_input({"team": "x"}, "nuro") is None


def test_batches_stay_within_the_api_limits() -> None:
    metrics = [Metric("m", float(i), i, i) for i in range(2500)]
    params = {f"p{i}": "v" for i in range(150)}
    calls = batches(metrics, params, {"t": "x"})
    assert sum(len(c["metrics"]) for c in calls) == 2500 and sum(len(c["params"]) for c in calls) == 150
    for c in calls:
        assert len(c["params"]) <= MAX_PARAMS and len(c["metrics"]) <= MAX_METRICS
        assert len(c["params"]) + len(c["tags"]) + len(c["metrics"]) <= MAX_ENTITIES
    assert batches([], {}, {}) == [{"params": [], "tags": [], "metrics": []}]


def test_filter_values_and_urls() -> None:
    assert filter_value("42") == "'42'"
    with pytest.raises(ValueError):
        filter_value("x' OR '1'='1")
    assert (
        run_url("http://h:5000/", "3", "abc") == "http://h:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
    assert run_url("http://h:5000", "3", "abc", "model-metrics") == (
        "http://h:5000/#/experiments/3/runs/abc/model-metrics?workflowType=machine_learning"
    )


def test_gpu_telemetry_becomes_mlflow_system_metrics() -> None:
    rows = [
        Row(
            5_000_000,
            {"node": "gpu001", "gpu": "3", "job": "42"},
            {"util_pct": 87.0, "mem_used_bytes": 2.0 * 2**30, "temp_c": 61.0, "power_w": 250.0, "sm_clock_mhz": 1.0},
        )
    ]
    got = {m.key: m.value for m in mirror.system_metrics_of(rows)}
    assert got == {
        "system/gpu001/gpu_3_utilization_percentage": 87.0,
        "system/gpu001/gpu_3_memory_usage_megabytes": 2048.0,
        "system/gpu001/gpu_3_temperature_celsius": 61.0,
        "system/gpu001/gpu_3_power_usage_watts": 250.0,
    }
    assert (
        mirror.checkpoint_uri({"team": "t", "name": "r"}, 7, "b")
        == "s3://b/checkpoints/t/r/step-000000000007/manifest.json"
    )


def test_failures_preemptions_and_restarts_are_counted_as_tags() -> None:
    timeline = {"events": [{"kind": "node_lost"}, {"kind": "requeued"}, {"kind": "resumed"}, {"kind": "requeued"},
                           {"kind": "progress"}, {"kind": "job_preempt_signalled"}]}  # fmt: skip
    assert mirror.event_tags(timeline) == {"nuro.events.node_lost": "1", "nuro.events.requeued": "2",
                                           "nuro.events.resumed": "1", "nuro.events.preempted": "1"}  # fmt: skip


def test_a_hostile_run_name_gives_no_checkpoint_uri() -> None:
    assert mirror.checkpoint_uri({"team": "t", "name": "../../other-team/run"}, 7, "b") is None


def test_the_wait_tag_reads_back_what_pending_tags_wrote() -> None:
    view = {"controller": {"code": "wait_lend_pool", "reason": "waiting: teams borrow 40 GPUs (of 48)"}}
    tag = mirror.pending_tags(view)[mirror.TAG_WAIT]
    assert mirror.wait_of_tag(tag) == view["controller"]
    for bad in (None, "", "no code", "reason ()", " (code)", "reason (a b)"):
        assert mirror.wait_of_tag(bad) is None, bad


def test_only_a_record_of_the_jobs_own_account_is_mirrored() -> None:
    """The bridge's rule, and ``nuro-train open``'s: a plain job, or a record naming another team, has no run."""
    assert mirror.mirrored_team({"team": "vision"}, "vision") == "vision"
    assert mirror.mirrored_team({"team": "vision"}, "perception") is None
    assert mirror.mirrored_team({}, "vision") is None

"""The pure parts of nuro-train metrics / artifacts / compare / lineage, from fixed rows and records."""

from __future__ import annotations

from rich.console import Console

from nuro.metrics.model import TRAIN, Row
from nuro.runs import report as M
from nuro.runs.checkpoints import checkpoint_lines
from nuro.slurm import JobInfo, JobPhase

S = 1_000_000_000
META = {
    "v": 1, "name": "resnet", "team": "vision",
    "dataset": {"name": "imgs", "digest": "sha256:" + "a" * 64},
    "code": {"repo": "/srv/repo", "commit": "c" * 40},
    "entry": {"launcher": "torchrun", "script": "train.py", "args": ["--steps", "100"]},
}  # fmt: skip


def job(job_id: int = 42, **kw: object) -> JobInfo:
    base = dict(job_id=job_id, name="resnet", user="alice", state="RUNNING", phase=JobPhase.RUNNING,
                nodes=("n1", "n2"), node_count=2, gpus_total=16)  # fmt: skip
    return JobInfo(**{**base, **kw})  # type: ignore[arg-type]


def ref(job_id: int = 42, meta: dict | None = None, **kw: object) -> M.RunRef:
    m = META if meta is None else meta
    return M.RunRef(job_id, m.get("team"), m.get("name"), m, job(job_id, **kw))


def train(ts: int, rank: int, restart: int = 0, **fields: float) -> Row:
    tags = {"team": "vision", "run": "resnet", "job": "42", "restart": str(restart), "rank": str(rank)}
    return Row(ts_ns=ts * S, tags=tags, fields=fields)


def gpu(ts: int, node: str, idx: int, util: float) -> Row:
    tags = {"node": node, "gpu": str(idx), "uuid": f"GPU-{node}-{idx}", "model": "H100"}
    fields = {"util_pct": util, "mem_used_bytes": 40.0 * 2**30, "mem_total_bytes": 80.0 * 2**30, "temp_c": 60.0,
              "sm_clock_mhz": 1980.0, "power_w": 500.0}  # fmt: skip
    return Row(ts_ns=ts * S, tags=tags, fields=fields)


ROWS = [
    train(1, 0, step=0, loss=2.0),
    train(1, 1, step=0, loss=2.2),
    train(2, 0, step=1, loss=1.5, step_time_s=0.5, samples_per_s=128.0),
    train(2, 1, step=1, loss=1.6, step_time_s=0.5, samples_per_s=120.0),
    train(3, 0, step=2, loss=1.0, step_time_s=0.25, samples_per_s=256.0),
    train(4, 0, restart=1, step=2, loss=0.9),  # done again after a requeue: no step time yet
]


def test_latest_per_rank_keeps_the_last_known_value_of_each_field() -> None:
    r0, r1 = M.latest_per_rank(ROWS)
    assert r0 == {"rank": 0, "step": 2, "loss": 0.9, "step_time_s": 0.25, "samples_per_s": 256.0, "restart": 1,
                  "ts_ns": 4 * S}  # fmt: skip
    assert r1["rank"] == 1 and r1["step"] == 1 and r1["restart"] == 0


def test_gpu_latest_is_one_row_per_node_and_index() -> None:
    rows = [gpu(1, "n2", 0, 10.0), gpu(1, "n1", 1, 20.0), gpu(2, "n1", 1, 99.0), gpu(1, "n1", 0, 30.0)]
    got = [(g["node"], g["gpu"], g["util_pct"]) for g in M.gpu_latest(rows)]
    assert got == [("n1", 0, 30.0), ("n1", 1, 99.0), ("n2", 0, 10.0)]


def test_summary_json_is_what_the_run_logged() -> None:
    s = M.summarize(ref(), ROWS, [gpu(5, "n1", 0, 97.0)])
    assert s["job_id"] == 42 and (s["team"], s["run"]) == ("vision", "resnet") and s["nodes"] == ["n1", "n2"]
    assert [(h["rank"], h["step"], h["loss"]) for h in s["history"]] == [
        (0, 0, 2.0), (1, 0, 2.2), (0, 1, 1.5), (1, 1, 1.6), (0, 2, 1.0), (0, 2, 0.9)]  # fmt: skip
    assert s["gpus"][0]["util_pct"] == 97.0


def test_train_query_names_the_job_and_its_run() -> None:
    q = M.train_query(ref(), limit=10)
    assert q.measurement == TRAIN and dict(q.where) == {"job": "42", "team": "vision", "run": "resnet"}
    assert dict(M.train_query(ref(meta={})).where) == {"job": "42"}  # a plain Slurm job: by job id only


def _text(renderable: object, width: int = 140) -> str:
    console = Console(record=True, width=width, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_metrics_table_shows_ranks_and_gpus() -> None:
    text = _text(M.render_metrics(M.summarize(ref(), ROWS, [gpu(5, "n1", 0, 97.0)])))
    assert "job 42 vision/resnet (RUNNING): latest per rank" in text
    assert "0.9000" in text and "256.0" in text and "0.250 s" in text
    assert "97 %" in text and "40.0 / 80 GiB" in text and "1980 MHz" in text


def test_metrics_view_without_rows_says_so() -> None:
    text = _text(M.render_metrics(M.summarize(ref(), [], [])))
    assert "no training metrics yet" in text and "no GPU telemetry from n1, n2" in text
    ended = _text(M.render_metrics(M.summarize(ref(state="COMPLETED", phase=JobPhase.COMPLETED), [], [])))
    assert "job 42 (COMPLETED) recorded no training metrics" in ended and "yet" not in ended
    assert "telemetry" not in ended  # the nodes of an ended job are not its own any more


def test_plot_series_loss_of_lowest_rank_and_summed_throughput() -> None:
    s = M.plot_series(ROWS)
    assert s["loss_steps"] == [0, 1, 2] and s["loss"] == [2.0, 1.5, 0.9]  # step 2 redone: newest wins
    assert s["throughput_steps"] == [1, 2] and s["samples_per_s"] == [248.0, 256.0]
    text = M.plot_text(s, width=80, height=20)
    assert "loss (lowest rank)" in text and "samples/s (all ranks) over steps" in text and "⠉" in text


def test_final_metrics() -> None:
    f = M.final_metrics(ROWS)
    # rank 0 mean (128 + 256) / 2 = 192, rank 1 mean 120: the job did 312 samples/s on average
    assert f == {"last_loss": 0.9, "mean_samples_per_s": 312.0, "last_step": 2, "ranks": 2}
    assert M.final_metrics([]) == {"last_loss": None, "mean_samples_per_s": None, "last_step": None, "ranks": 0}


def test_compare_highlights_what_differs() -> None:
    other = {**META, "code": {"repo": "/srv/repo", "commit": "d" * 40, "diff": "sha256:" + "e" * 64},
             "entry": {**META["entry"], "args": ["--steps", "200"]}}  # fmt: skip
    a = M.run_summary(ref(42), ROWS, 3)
    b = M.run_summary(ref(43, meta=other, state="COMPLETED", phase=JobPhase.COMPLETED), ROWS[:2], 1)
    rows = M.compare_rows(a, b)
    diff = {(r["section"], r["key"]) for r in rows if not r["same"]}
    assert diff == {("run", "state"), ("params", "args"), ("code", "commit"), ("code", "diff"),
                    ("metrics", "last_loss"), ("metrics", "mean_samples_per_s"), ("metrics", "last_step"),
                    ("checkpoints", "committed")}  # fmt: skip
    same = {(r["section"], r["key"]) for r in rows if r["same"]}
    assert {("data", "digest"), ("params", "script"), ("params", "gpus")} <= same
    text = _text(M.render_compare(a, b, rows))
    assert "--steps 100" in text and "--steps 200" in text and "job 42 vs job 43" in text
    assert text.count("≠") == len(diff) and "e" * 40 in text.replace("\n", "").replace("│", "").replace(" ", "")


def test_artifact_kinds() -> None:
    assert M.artifact_kind("runs/v/r/events/42/0001700000000000-r0-started.json") == "run event started"
    assert M.artifact_kind("runs/v/r/events/42/0001700000000000-r1-first_step.json") == "run event first_step"
    assert M.artifact_kind("checkpoints/v/r/tags/best") == "checkpoint tag"


def test_artifacts_table() -> None:
    a = {
        "job_id": 42, "team": "vision", "run": "resnet",
        "checkpoints": [{"step": 10, "job_id": 42, "restart": 0, "parent": None, "committed_at": "2026-01-01T00:00:00Z",
                         "bytes": 3 * 2**20, "world_size": 2}],
        "uncommitted": [{"step": 20, "status": "torn", "bytes": 1024}],
        "objects": [{"key": "runs/vision/resnet/events/42/1-r0-started.json", "bytes": 100, "modified": None,
                     "kind": "run event started"}],
        "notes": [],
    }  # fmt: skip
    text = _text(M.render_artifacts(a))
    assert "3.0 MiB" in text and "2026-01-01T00:00:00Z" in text
    assert "step 20: not committed (torn), 1.0 KiB stored" in text and "run event started" in text


def test_artifacts_show_a_committed_step_torn_since_or_skipped_at_restore() -> None:
    base = {"job_id": 42, "restart": 1, "parent": None, "committed_at": "T", "bytes": 10, "world_size": 2}
    a = {
        "job_id": 42, "team": "vision", "run": "resnet", "uncommitted": [], "objects": [], "notes": [],
        "checkpoints": [
            {**base, "step": 10, "damaged": [], "skipped_by": []},
            {**base, "step": 20, "damaged": ["__0_0.distcp (4 bytes, manifest says 70000)"],
             "skipped_by": [{"job_id": 43, "reason": "sha256 mismatch in __0_0.distcp"}]},
        ],
    }  # fmt: skip
    assert M.checkpoint_status(a["checkpoints"][0]) == "committed"
    status = M.checkpoint_status(a["checkpoints"][1])
    assert status == ("torn: __0_0.distcp (4 bytes, manifest says 70000); skipped at restore by job 43: sha256 "
                      "mismatch in __0_0.distcp")  # fmt: skip
    text = _text(M.render_artifacts(a))
    assert "torn: __0_0.distcp" in text and "committed" in text


def test_lineage_checkpoint_lines() -> None:
    lines = checkpoint_lines([
        {"step": 4, "job_id": 7, "restart": 0, "parent": None, "committed_at": "T1"},
        {"step": 8, "job_id": 7, "restart": 1, "parent": 4, "committed_at": "T2"},
    ])  # fmt: skip
    assert lines[0] == "checkpoints in S3 (2 committed):"
    assert "step      8  parent step 4" in lines[2] and "job 7.1" in lines[2]
    assert checkpoint_lines(None)[0].startswith("checkpoints in S3: not known")
    assert checkpoint_lines([]) == ["checkpoints in S3: none committed by this job"]


def test_a_record_without_a_run_name_is_said_so_not_called_missing() -> None:
    """nuro-train status shows a nuro-sbatch job's record; events and artifacts must not then say it has none."""
    sbatch_meta = {"v": 1, "via": "nuro-sbatch", "team": "vision", "dataset": META["dataset"], "code": META["code"]}
    got = M.gather_artifacts(ref(7, sbatch_meta), store=None)
    assert got["notes"] == [
        "job 7's nuro run record names no run (written by nuro-sbatch, which records no run name): it has no run "
        "prefixes in S3"
    ]
    assert M.no_run_note(8, {}) == "job 8 carries no nuro run record"

"""The MLflow bridge: mirrors every nuro run into MLflow, out of band (issue 18).

Why a bridge and not MLflow calls in the training processes: training never waits on, or breaks because of, the
tracking server (the SDK's ``MetricsLogger`` already writes every point, buffered, to the metrics sink); one writer
holds the server's credential (no per-rank, per-user tokens); and everything MLflow shows comes from the records
nuro already keeps, so MLflow and ``nuro-train metrics/lineage`` can never disagree. The cost is latency: a point
shows in MLflow one pass (``--interval-s``, default 5 s) after it reached the sink.

One pass (``sync_once``): the jobs Slurm lists with a ``nuro`` record, plus those seen before that have left the
queue (their final state from accounting); for each, its MLflow run (found by the tag ``nuro.job_id`` in the team's
experiment ``nuro/<team>``, created with its params, dataset input and parent run when missing), its tags and status
now, and its ``train`` points newer than the run's cursor (tag ``nuro.synced_to_ns``, written after each batch: a
restarted bridge neither loses nor repeats points). Identity comes from Slurm's own fields (account, user, job id)
and the record; the job's name or comment text never names another team's experiment.

Failures: the server down or slow → the pass stops at the first ``MlflowUnavailable``, nothing is lost (the points
stay in the sink; the cursor did not move), and the next pass retries; the failures are counted (``stats``).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nuro.metrics.identities import platform_view
from nuro.metrics.model import GPU, TRAIN, Query, Row
from nuro.metrics.sink import SinkError
from nuro.protocol import jobcomment
from nuro.runs.pending import ENV_WAITS, pending_view, read_waits
from nuro.slurm import JobInfo
from nuro.tracking import mirror
from nuro.tracking.mlflow import MlflowClient, MlflowError, MlflowRejected, MlflowUnavailable, run_tags

log = logging.getLogger(__name__)

TAG_CURSOR = "nuro.synced_to_ns"
TAG_GPU_CURSOR = "nuro.synced_gpu_to_ns"
#: points read from the sink per job and pass (the rest next pass)
MAX_POINTS_PER_PASS = 20_000
#: how late a rank's point may reach the sink after a newer point of another rank and still be mirrored (each rank
#: writes through its own buffered writer, flushing about every second; a writer held up longer, e.g. by a sink
#: outage, delivers its points later than this: they are in the sink, not in MLflow)
SETTLE_NS = 30_000_000_000


def _ms(t: Any) -> int | None:
    return int(t.timestamp() * 1000) if t is not None else None


def job_view(job: JobInfo) -> mirror.JobView:
    return mirror.JobView(
        job_id=job.job_id, user=job.user, phase=job.phase.name, state=job.state, reason=job.reason,
        nodes=tuple(job.nodes), restart_count=job.restart_count, start_ms=_ms(job.start_time),
        end_ms=_ms(job.end_time) if job.is_finished else None,
    )  # fmt: skip


@dataclass
class RunState:
    """What the bridge knows of one job's MLflow run."""

    run_id: str
    experiment_id: str
    cursor_ns: int = 0
    tags: dict[str, str] = field(default_factory=dict)
    status: str = ""
    done: bool = False
    #: the newest point pushed per series (rank, restart)
    series: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class Stats:
    passes: int = 0
    runs_created: int = 0
    points: int = 0
    failures: int = 0
    skipped: int = 0  # jobs a pass could not mirror (a record MLflow or nuro's checks refuse)
    last_error: str = ""


@dataclass(frozen=True)
class JobMarks:
    """What the platform knows of a job's progress, as the controller heard it from the node agents (never from the
    job's comment, which carries only the run record): its newest committed checkpoint, when the controller
    signalled it for a preemption in flight, the step it acknowledged."""

    checkpoint_step: int | None = None
    preempted_at: float | None = None
    ack_step: int | None = None


class Bridge:
    """Mirrors nuro's runs into one MLflow server.

    Args:
        client: the MLflow adapter.
        jobs: Slurm's live jobs (``backend.jobs``); finished: accounting records of job ids (``finished_jobs``).
        train_rows: a job's ``train`` points newer than a time (``(team, job_id, since_ns) -> rows``).
        bucket: the S3 bucket datasets and checkpoints live in (the dataset input's source, the manifests' URIs).
        gpu_rows: the node agents' ``gpu`` points of the job's GPUs newer than a time (same shape), for MLflow's
            system metrics; None: none mirrored.
        checkpoints: a run's committed checkpoints (``(team, run) -> records``, ``nuro.runs.checkpoints``), written
            as the run's artifact ``checkpoints.json`` (pointers to the manifests, no copy) when a new one commits.
        timeline: a job's timeline as ``nuro-train events --json`` shows it (``job_id -> dict``), written as the
            artifact ``events.json`` with its failures, preemptions and restarts counted as tags, whenever the
            job's state or attempts change.
        marks: a job's ``JobMarks`` (``(job_id, its nodes) -> JobMarks``; the controller's state,
            ``slurm_plugins/mlflow_bridge.controller_marks``); None: no progress tags.
    """

    def __init__(
        self,
        client: MlflowClient,
        jobs: Callable[[], list[JobInfo]],
        finished: Callable[[Iterable[int]], list[JobInfo]],
        train_rows: Callable[[str, int, int], list[Row]],
        bucket: str = "nuro",
        gpu_rows: Callable[[str, int, int], list[Row]] | None = None,
        checkpoints: Callable[[str, str], list[dict[str, Any]]] | None = None,
        timeline: Callable[[int], dict[str, Any]] | None = None,
        marks: Callable[[int, tuple[str, ...]], JobMarks] | None = None,
    ) -> None:
        self._job_marks = marks
        self.client, self._jobs, self._finished, self._train_rows = client, jobs, finished, train_rows
        self._gpu_rows = gpu_rows
        self._checkpoints = checkpoints
        self._timeline = timeline
        self.bucket = bucket
        self.runs: dict[int, RunState] = {}
        #: the controller's reasons for pending jobs (``nuro.runs.pending``); None: Slurm's reason only
        self.waits_file: str | None = os.environ.get(ENV_WAITS)
        self._queue: list[JobInfo] = []
        self._waits: dict[int, dict[str, str]] = {}
        self._experiments: dict[str, str] = {}
        self.stats = Stats()

    # -- one pass ------------------------------------------------------------------------------------------------
    def sync_once(self) -> Stats:
        """Mirror every nuro job once; stops at the first unavailability (the next pass goes on from there)."""
        self.stats.passes += 1
        everything = self._jobs()
        self._queue = everything
        self._waits = read_waits(self.waits_file, time.time())
        comments = {j.job_id: jobcomment.parse(j.comment) for j in everything}  # once per job and pass
        live = [j for j in everything if comments[j.job_id].record.get("team")]
        seen = {j.job_id for j in live}
        gone = [jid for jid, st in self.runs.items() if jid not in seen and not st.done]
        finished = self._finished(gone) if gone else []
        comments.update((j.job_id, jobcomment.parse(j.comment)) for j in finished)
        try:
            for job in sorted(live + finished, key=lambda j: j.job_id):  # parents (older ids) before their children
                try:
                    self.sync_job(job, comments[job.job_id])
                except MlflowUnavailable:
                    raise
                except Exception as exc:  # noqa: BLE001 - one job's hostile or broken record costs only that job
                    self.stats.skipped += 1
                    log.warning("job %d not mirrored this pass: %s: %s", job.job_id, type(exc).__name__, exc)
        except MlflowUnavailable as exc:
            self.stats.failures += 1
            self.stats.last_error = str(exc)
            log.warning("MLflow unavailable, the pass stops here (nothing is lost): %s", exc)
        return self.stats

    def sync_job(self, job: JobInfo, comment: jobcomment.JobComment | None = None) -> RunState | None:
        """Mirror one job (``comment``: its comment parsed, when the caller has it)."""
        comment = comment if comment is not None else jobcomment.parse(job.comment)
        meta = comment.record
        team = mirror.mirrored_team(meta, job.account)
        if team is None:
            return None
        view = job_view(job)
        st = self.runs.get(job.job_id) or self._find_or_create(job, view, meta, team)
        self.runs[job.job_id] = st
        extra = {**self._marks(job, meta), **mirror.pending_tags(pending_view(job, self._queue, self._waits))}
        tags = mirror.tags_of(meta, view, extra)
        changed = {k: v for k, v in tags.items() if st.tags.get(k) != v}
        status = mirror.mlflow_status(view.phase)
        self._push_points(st, team, job.job_id)
        self._push_system(st, team, job.job_id)
        if "nuro.checkpoint.step" in changed:
            self._write_checkpoints(st, meta)
        if {"nuro.state", "nuro.attempts"} & changed.keys():
            changed.update(self._write_timeline(st, job.job_id))
        if changed:
            self.client.log_batch(st.run_id, tags=changed)
            st.tags.update(changed)
        for key in mirror.PENDING_TAGS:  # it no longer waits
            if key in st.tags and key not in tags:
                self.client.delete_tag(st.run_id, key)
                del st.tags[key]
        if status != st.status:
            end = view.end_ms if job.is_finished else None
            self.client.update_run(st.run_id, status=status, end_ms=end)
            st.status = status
        st.done = job.is_finished
        return st

    # -- pieces --------------------------------------------------------------------------------------------------
    def _experiment(self, team: str) -> str:
        if team not in self._experiments:
            exp = self.client.experiment_id(mirror.experiment_name(team), tags=mirror.experiment_tags(team))
            assert exp is not None
            self._experiments[team] = exp
        return self._experiments[team]

    def find_run(self, team: str, job_id: int) -> dict[str, Any] | None:
        return self.client.find_run(self._experiment(team), mirror.TAG_JOB, str(job_id))

    def _find_or_create(self, job: JobInfo, view: mirror.JobView, meta: Mapping[str, Any], team: str) -> RunState:
        exp = self._experiment(team)
        found = self.find_run(team, job.job_id)
        if found is not None:
            tags = run_tags(found)
            cursor = int(tags.get(TAG_CURSOR, "0") or 0)
            return RunState(found["info"]["run_id"], exp, cursor, tags, found["info"].get("status", ""))
        tags = mirror.tags_of(meta, view)
        parent = meta.get("resume_from")
        if parent and str(parent).isdigit() and int(parent) != job.job_id:
            parent_id = self.parent_run_id(team, exp, int(parent))
            if parent_id is not None:
                tags[mirror.TAG_PARENT] = parent_id
            else:
                log.info("job %d (%s) names job %s as its parent: no run of that job in %s's experiment, so none "
                         "linked", job.job_id, team, parent, team)  # fmt: skip
        name = str(meta.get("name") or job.name)
        run_id = self.client.create_run(exp, name, start_ms=view.start_ms, tags=tags)
        self.stats.runs_created += 1
        self.client.log_batch(run_id, params=mirror.params_of(meta, job.node_count, job.gpus_per_node))
        ds = mirror.dataset_input(meta, self.bucket)
        if ds is not None:
            self.client.log_dataset(run_id, **ds)
        log.info("mlflow run %s for job %d (%s/%s)", run_id, job.job_id, team, name)
        return RunState(run_id, exp, 0, tags, "")

    def parent_run_id(self, team: str, experiment_id: str, parent_job: int) -> str | None:
        """The MLflow run of ``parent_job`` in ``team``'s own experiment, or None.

        ``resume_from`` is the job's own text (its owner writes the record), so it may name any job id, another
        team's among them. The parent is looked up only among the team's runs: the bridge's memory of runs (every
        team's) is used only for a run of this experiment, and a run found by search must belong to it too and
        carry this team's tag. A team therefore can neither hang its run under another team's nor have another
        team's run listed as its parent (nor learn that run's id)."""
        known = self.runs.get(parent_job)
        if known is not None:
            return known.run_id if known.experiment_id == experiment_id else None
        found = self.find_run(team, parent_job)
        if found is None:
            return None
        info = found.get("info") or {}
        if str(info.get("experiment_id", "")) != experiment_id or run_tags(found).get("nuro.team") != team:
            log.warning("MLflow answered a search in %s's experiment with run %s of another one: not linked", team,
                        info.get("run_id"))  # fmt: skip
            return None
        return str(info["run_id"])

    def _marks(self, job: JobInfo, meta: Mapping[str, Any]) -> dict[str, str]:
        """The job's progress as tags: the newest committed checkpoint (its step and its manifest in S3), a
        preemption in flight and its ack."""
        if self._job_marks is None:
            return {}
        m = self._job_marks(job.job_id, tuple(job.nodes))
        out = {}
        if m.checkpoint_step is not None:
            out["nuro.checkpoint.step"] = str(m.checkpoint_step)
            uri = mirror.checkpoint_uri(meta, m.checkpoint_step, self.bucket)
            if uri:
                out["nuro.checkpoint.manifest"] = uri
        if m.preempted_at is not None:
            out["nuro.preempted_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(m.preempted_at))
        if m.ack_step is not None:
            out["nuro.ack_step"] = str(m.ack_step)
        return out

    def _push_points(self, st: RunState, team: str, job_id: int) -> None:
        """The job's points MLflow lacks. Every rank writes through its own buffered writer, so a point can reach the
        sink after a newer point of another rank: each pass reads back ``SETTLE_NS`` before the newest point pushed,
        and a per-series cursor (rank, restart: each series arrives in order) keeps what was pushed from going again.
        After a bridge restart the window is pushed again; MLflow ignores exact duplicates."""
        since = max(0, st.cursor_ns - SETTLE_NS) if st.cursor_ns else 0
        try:
            rows = self._train_rows(team, job_id, since)
        except SinkError as exc:
            log.warning("metrics of job %d not readable now: %s", job_id, exc)
            return

        def series(r: Row) -> tuple[str, str]:
            return (r.tags.get("rank", "0"), r.tags.get("restart", "0"))

        fresh = sorted((r for r in rows if r.ts_ns > st.series.get(series(r), since)), key=lambda r: r.ts_ns)
        fresh = fresh[:MAX_POINTS_PER_PASS]
        if not fresh:
            return
        metrics = mirror.metrics_of(fresh)
        cursor = str(max(st.cursor_ns, fresh[-1].ts_ns))
        try:
            self.client.log_batch(st.run_id, metrics, tags={TAG_CURSOR: cursor})
        except MlflowRejected as exc:  # e.g. a value MLflow refuses: skip these points rather than stall forever
            log.warning("MLflow refused job %d's points up to %s: %s", job_id, cursor, exc)
            self.client.log_batch(st.run_id, tags={TAG_CURSOR: cursor})
        for r in fresh:
            key = series(r)
            st.series[key] = max(st.series.get(key, 0), r.ts_ns)
        st.cursor_ns = int(cursor)
        st.tags[TAG_CURSOR] = cursor
        self.stats.points += len(metrics)

    def _write_checkpoints(self, st: RunState, meta: Mapping[str, Any]) -> None:
        if self._checkpoints is None or not meta.get("name"):
            return
        team, run = str(meta["team"]), str(meta["name"])
        try:
            records = self._checkpoints(team, run)
        except Exception as exc:  # noqa: BLE001 - the store's errors: the list waits for the next commit
            log.warning("checkpoints of %s/%s not listed now: %s", team, run, exc)
            return
        listing = [{**r, "manifest": mirror.checkpoint_uri(meta, int(r["step"]), self.bucket)} for r in records]
        body = json.dumps({"team": team, "run": run, "checkpoints": listing}, indent=1).encode()
        self.client.put_artifact(st.experiment_id, st.run_id, "checkpoints.json", body)

    def _write_timeline(self, st: RunState, job_id: int) -> dict[str, str]:
        if self._timeline is None:
            return {}
        try:
            tl = self._timeline(job_id)
        except Exception as exc:  # noqa: BLE001 - Slurm/S3 errors: the next change writes it
            log.warning("timeline of job %d not read now: %s", job_id, exc)
            return {}
        self.client.put_artifact(st.experiment_id, st.run_id, "events.json", json.dumps(tl, indent=1).encode())
        return {k: v for k, v in mirror.event_tags(tl).items() if st.tags.get(k) != v}

    def _push_system(self, st: RunState, team: str, job_id: int) -> None:
        if self._gpu_rows is None:
            return
        since = int(st.tags.get(TAG_GPU_CURSOR, "0") or 0)
        try:
            rows = sorted((r for r in self._gpu_rows(team, job_id, since) if r.ts_ns > since), key=lambda r: r.ts_ns)
        except SinkError as exc:
            log.warning("GPU telemetry of job %d not readable now: %s", job_id, exc)
            return
        if rows:
            cursor = str(rows[-1].ts_ns)
            self.client.log_batch(st.run_id, mirror.system_metrics_of(rows), tags={TAG_GPU_CURSOR: cursor})
            st.tags[TAG_GPU_CURSOR] = cursor


def _job_points(sink: Any, measurement: str, job_id: int, since_ns: int) -> list[Row]:
    """One job's ``measurement`` points newer than ``since_ns`` (all of them for 0)."""
    since = since_ns + 1 if since_ns else None
    return list(sink.query(Query(measurement, where={"job": str(job_id)}, since_ns=since)))


def sink_rows(open_sink: Callable[[str], Any]) -> Callable[[str, int, int], list[Row]]:
    """``train_rows`` for ``Bridge`` from a sink factory (``team -> sink``): the job's points newer than a time."""

    def rows(team: str, job_id: int, since_ns: int) -> list[Row]:
        sink = open_sink(team)
        try:
            return _job_points(sink, TRAIN, job_id, since_ns)
        finally:
            sink.close()

    return rows


def store_checkpoints(store: Any) -> Callable[[str, str], list[dict[str, Any]]]:
    """``checkpoints`` for ``Bridge``: the run's committed checkpoints from its S3 manifests (as ``lineage`` shows)."""
    from nuro.runs.checkpoints import run_checkpoints  # lazy: the S3 side only where a store is given

    def records(team: str, run: str) -> list[dict[str, Any]]:
        return run_checkpoints(store, team, run)[0]

    return records


def job_timeline(backend: Any, event_log: str | None, store: Any) -> Callable[[int], dict[str, Any]]:
    """``timeline`` for ``Bridge``: what ``nuro-train events JOB --json`` shows (``nuro.runs.timeline_report``)."""
    from nuro.runs import timeline_report  # lazy: Slurm accounting and S3 reads, only on a job's change

    def timeline(job_id: int) -> dict[str, Any]:
        tl, notes = timeline_report.gather(job_id, backend, Path(event_log) if event_log else None, store)
        return {**tl.to_json(), "notes": list(notes)}

    return timeline


def sink_gpu_rows(open_sink: Callable[[str], Any]) -> Callable[[str, int, int], list[Row]]:
    """``gpu_rows`` for ``Bridge``: the agents' points tagged with the job (the platform database)."""

    def rows(team: str, job_id: int, since_ns: int) -> list[Row]:
        sink = open_sink(team)
        gpu_sink: Any = platform_view(sink)
        try:
            return _job_points(gpu_sink, GPU, job_id, since_ns)
        finally:
            if gpu_sink is not sink:
                gpu_sink.close()
            sink.close()

    return rows


__all__ = [
    "MAX_POINTS_PER_PASS", "SETTLE_NS", "TAG_CURSOR", "TAG_GPU_CURSOR", "Bridge", "RunState", "Stats", "job_view",
    "job_timeline", "sink_gpu_rows", "sink_rows", "store_checkpoints",
]  # fmt: skip
_ = MlflowError  # re-exported for callers catching every MLflow failure

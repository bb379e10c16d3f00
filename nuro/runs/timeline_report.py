"""A run's lifecycle, as ``nuro-train events`` shows it (and the demo, the e2e test and the resume bench read it):
every source gathered into one ``nuro.lifecycle.timeline.Timeline``, and its tables.

The sources are the systems of record: Slurm accounting (every attempt, ``sacct -D``), the controller's event log,
and the run's own records in S3 (run events and checkpoint manifests). A source that cannot be read becomes a note
and the rest is still shown, because a half-told story of a failure is still worth reading.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from rich.console import Console, Group
from rich.table import Table

from nuro.console import stdout_console
from nuro.lifecycle import run_events, timeline
from nuro.lifecycle.platform_events import read_events
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.protocol import jobcomment
from nuro.runs.checkpoints import run_checkpoints
from nuro.runs.report import no_run_note
from nuro.slurm import CliBackend

#: Where the report prints: never wrapped, and 160 columns when piped (rich's default 80 would fold the tables).
out = stdout_console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def committed_checkpoints(store: ObjectStore, team: str, run: str, job_id: int) -> list[timeline.CommittedCheckpoint]:
    """This job's committed checkpoints, from the same manifest listing ``nuro-train lineage/artifacts`` use."""
    committed, _uncommitted = run_checkpoints(store, team, run)
    return [
        timeline.CommittedCheckpoint(
            step=c["step"],
            at=datetime.fromisoformat(str(c["committed_at"]).replace("Z", "+00:00")).timestamp(),
            job_id=job_id,
            restart=c["restart"],
            tier=c.get("tier", "persistent"),
        )
        for c in committed
        if str(c["job_id"]) == str(job_id)
    ]


def gather(job_id: int, backend: CliBackend, event_log: Path | None, store: ObjectStore | None) -> tuple:
    """Read every source; returns (timeline, notes). Raises SlurmError, LookupError (no such job)."""
    attempts = backend.attempts(job_id)
    if not attempts:
        raise LookupError(f"job {job_id} is not in Slurm's accounting (wrong id, or purged)")
    notes: list[str] = []
    meta = {}
    for a in reversed(attempts):
        meta = jobcomment.parse(a.comment).record
        if meta:
            break
    if not meta:
        live = backend.find_job(job_id)
        meta = jobcomment.parse(live.comment).record if live else {}
    controller: list[dict] = []
    if event_log is None:
        notes.append("controller events not shown: set NURO_EVENT_LOG or pass --event-log")
    else:
        since = attempts[0].submit_time.timestamp() - 60 if attempts[0].submit_time else None
        controller = list(read_events(event_log, since=since))
    own_events: list[run_events.RunEvent] = []
    ckpts: list[timeline.CommittedCheckpoint] = []
    team, run = meta.get("team"), meta.get("name")
    if not team or not run:
        notes.append(f"{no_run_note(job_id, meta)}: only Slurm and controller events are shown")
    else:
        try:
            store = store or ObjectStore.from_env()
            own_events = run_events.read(store, str(team), str(run), job_id)
            ckpts = committed_checkpoints(store, str(team), str(run), job_id)
        except (ObjectStoreError, ValueError) as exc:
            notes.append(f"run events and checkpoints not shown: {exc}")
    return timeline.build(job_id, attempts, controller, own_events, ckpts), notes


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-4]


def _secs(v: float | None) -> str:
    return f"{v:.1f} s" if v is not None else "—"


def render_timeline(tl: timeline.Timeline) -> Group:
    """The lifecycle table, then (when the run recovered from anything) the recoveries table."""
    t0 = tl.entries[0].ts if tl.entries else 0.0
    table = Table(title=f"job {tl.job_id}: lifecycle", title_justify="left")
    for col in ("time", "+s", "attempt", "source", "event", "detail"):
        table.add_column(col, justify="right" if col in {"+s", "attempt"} else "left")
    for e in tl.entries:
        style = "red" if e.kind in {"node_lost", "node_down", "failed", "node_fail"} else None
        table.add_row(
            _clock(e.ts), f"{e.ts - t0:.1f}", "" if e.attempt is None else str(e.attempt), e.source, e.kind,
            e.detail, style=style,
        )  # fmt: skip
    parts: list[Table] = [table]
    if tl.recoveries:
        title = "recoveries (seconds from the failure: the lost node's last heartbeat, else the requeue)"
        rec = Table(title=title, title_justify="left")
        for col in ("attempt", "node", "detected", "requeued", "restarted", "first step", "resumed at", "steps lost"):
            rec.add_column(col)
        for r in tl.recoveries:
            j = r.to_json()
            rec.add_row(
                str(r.attempt), r.node or "—", _secs(j["detect_s"]), _secs(j["requeue_s"]), _secs(j["restart_s"]),
                _secs(j["resume_s"]), "—" if r.resumed_step is None else f"step {r.resumed_step}",
                "—" if j["steps_lost"] is None else str(j["steps_lost"]),
            )  # fmt: skip
        parts.append(rec)
    return Group(*parts)


def show(tl: timeline.Timeline, notes: list[str]) -> None:
    """Print the tables on stdout and each note on stderr, as ``nuro-train events`` does."""
    out.print(render_timeline(tl))
    for note in notes:
        err.print(f"[yellow]note:[/] {note}", highlight=False)


__all__ = ["committed_checkpoints", "gather", "render_timeline", "show"]

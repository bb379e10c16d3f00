"""``nuro-train events JOB_ID``: a run's lifecycle with timestamps, assembled from the systems of record.

submitted, started, checkpoint committed at step N, node lost, detected, drained, requeued, restarted, resumed at
step N, first step, preempted, finished — from Slurm accounting (every attempt, ``sacct -D``), the controller's event
log (``$NURO_EVENT_LOG`` or ``--event-log``), and the run's own records in S3 (run events and checkpoint manifests).
A source that cannot be read is named in a note and the rest is still shown. Each recovery is summarised: seconds
from the lost node's last heartbeat to detection, requeue, restart and the first step after resume, and the steps
that had to be done again.

Exit codes: 0 ok, 1 Slurm unreachable, 4 no such job.
"""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from nuro.lifecycle import run_events, timeline
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.protocol import jobcomment
from nuro.slurm import CliBackend, SlurmError

EXIT_SLURM = 1
EXIT_NOT_FOUND = 4

out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, soft_wrap=True)


def _checkpoints(store: ObjectStore, team: str, run: str, job_id: int) -> list[timeline.CommittedCheckpoint]:
    """This job's committed checkpoints, from the same manifest listing ``nuro-train lineage/artifacts`` use."""
    from nuro.login.runs_cli import run_checkpoints

    committed, _uncommitted = run_checkpoints(store, team, run)
    return [
        timeline.CommittedCheckpoint(
            step=c["step"],
            at=datetime.fromisoformat(str(c["committed_at"]).replace("Z", "+00:00")).timestamp(),
            job_id=job_id,
            restart=c["restart"],
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
        meta = jobcomment.parse(a.comment).raw.get("nuro") or {}
        if meta:
            break
    if not meta:
        live = backend.find_job(job_id)
        meta = (jobcomment.parse(live.comment).raw.get("nuro") or {}) if live else {}
    controller: list[dict] = []
    if event_log is None:
        notes.append("controller events not shown: set NURO_EVENT_LOG or pass --event-log")
    else:
        from nuro.lifecycle.platform_events import read_events

        since = attempts[0].submit_time.timestamp() - 60 if attempts[0].submit_time else None
        controller = list(read_events(event_log, since=since))
    run_events: list[run_events.RunEvent] = []
    ckpts: list[timeline.CommittedCheckpoint] = []
    team, run = meta.get("team"), meta.get("name")
    if not team or not run:
        notes.append(f"job {job_id} carries no nuro run record: only Slurm and controller events are shown")
    else:
        try:
            store = store or ObjectStore.from_env()
            run_events = run_events.read(store, str(team), str(run), job_id)
            ckpts = _checkpoints(store, str(team), str(run), job_id)
        except (ObjectStoreError, ValueError) as exc:
            notes.append(f"run events and checkpoints not shown: {exc}")
    return timeline.build(job_id, attempts, controller, run_events, ckpts), notes


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-4]


def _secs(v: float | None) -> str:
    return f"{v:.1f} s" if v is not None else "—"


def render(tl: timeline.Timeline, notes: list[str]) -> None:
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
    out.print(table)
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
        out.print(rec)
    for note in notes:
        err.print(f"[yellow]note:[/] {note}", highlight=False)


@click.command("events")
@click.argument("job_id", type=int)
@click.option(
    "--event-log",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="NURO_EVENT_LOG",
    help="The controller's event log (JSONL) [default: $NURO_EVENT_LOG].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def events(job_id: int, event_log: Path | None, as_json: bool) -> None:
    """Show run JOB_ID's lifecycle: failures, detection, requeue, restart, resume, checkpoints."""
    try:
        tl, notes = gather(job_id, CliBackend(timeout_s=30), event_log, None)
    except LookupError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(EXIT_NOT_FOUND)
    except SlurmError as exc:
        err.print(f"[bold red]error:[/] Slurm: {exc}", highlight=False)
        sys.exit(EXIT_SLURM)
    if as_json:
        import json

        click.echo(json.dumps({**tl.to_json(), "notes": notes}, indent=2))
        return
    render(tl, notes)

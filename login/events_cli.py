"""``nuro-train events JOB_ID``: a run's lifecycle with timestamps, assembled from the systems of record.

submitted, started, checkpoint committed at step N, node lost, detected, drained, requeued, restarted, resumed at
step N, first step, preempted, finished — from Slurm accounting (every attempt, ``sacct -D``), the controller's event
log (``$NURO_EVENT_LOG`` or ``--event-log``), and the run's own records in S3 (run events and checkpoint manifests).
A source that cannot be read is named in a note and the rest is still shown. Each recovery is summarised: seconds
from the lost node's last heartbeat to detection, requeue, restart and the first step after resume, and the steps
that had to be done again. Gathering and rendering are ``nuro.runs.timeline_report``'s (the demo shows the same).

Exit codes: 0 ok, 1 Slurm unreachable, 4 no such job.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from nuro.console import ExitCode, fail
from nuro.protocol.envnames import NURO_EVENT_LOG
from nuro.runs.timeline_report import gather, show
from nuro.slurm import CliBackend, SlurmError


@click.command("events")
@click.argument("job_id", type=int)
@click.option(
    "--event-log",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar=NURO_EVENT_LOG,
    help="The controller's event log (JSONL) [default: $NURO_EVENT_LOG].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
def events(job_id: int, event_log: Path | None, as_json: bool) -> None:
    """Show run JOB_ID's lifecycle: failures, detection, requeue, restart, resume, checkpoints."""
    try:
        tl, notes = gather(job_id, CliBackend(timeout_s=30), event_log, None)
    except LookupError as exc:
        fail(ExitCode.NOT_FOUND, str(exc))
    except SlurmError as exc:
        fail(ExitCode.FAILED, f"Slurm: {exc}")
    if as_json:
        click.echo(json.dumps({**tl.to_json(), "notes": notes}, indent=2))
        return
    show(tl, notes)

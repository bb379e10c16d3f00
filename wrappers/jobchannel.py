"""The job's side of the controller channel: record a committed checkpoint, acknowledge a preemption.

Runs inside a job (rank 0 only), as the job's user, with the job's environment (``SLURM_JOB_ID``, ``SLURM_CONF``).
Each call reads the job's current comment, merges one key (keeping what the controller or submit wrote) and writes
it back with ``scontrol update`` (a job owner may update their own job's comment). See ``nuro.protocol.jobcomment``.

    nuro-job ckpt --step 1200     # after a checkpoint's manifest is committed
    nuro-job ack --step 1200      # after the checkpoint a preemption asked for is committed: "requeue me now"
    nuro-job show                 # the record as JSON
"""

from __future__ import annotations

import json
import os
import sys
import time

import click

from nuro.protocol import jobcomment
from nuro.protocol.contract import COMMENT_ACK, COMMENT_CHECKPOINT
from nuro.slurm import CliBackend, SlurmError


class JobChannelError(RuntimeError):
    """Not inside a Slurm job, or Slurm refused the update; the message says which."""


def _job_id(job_id: int | None) -> int:
    if job_id is not None:
        return job_id
    raw = os.environ.get("SLURM_JOB_ID")
    if not raw or not raw.isdigit():
        raise JobChannelError(
            "SLURM_JOB_ID is not set: run this inside a Slurm job (rank 0), or pass --job-id for a job you own"
        )
    return int(raw)


def _update(key: str, value: dict, job_id: int | None, backend: CliBackend | None) -> str:
    jid = _job_id(job_id)
    be = backend or CliBackend(timeout_s=15)
    try:
        new = be.merge_comment(jid, **{key: value})  # serialised per process (backend._COMMENT_WRITE_LOCK)
    except SlurmError as exc:
        raise JobChannelError(f"could not record {key} for job {jid}: {exc}") from exc
    return new


def record_checkpoint(step: int, job_id: int | None = None, backend: CliBackend | None = None) -> str:
    """Tell the controller the newest committed checkpoint (it prefers preempting jobs that lose the least)."""
    return _update(COMMENT_CHECKPOINT, {"step": step, "at": round(time.time())}, job_id, backend)


def acknowledge_preemption(
    step: int, job_id: int | None = None, backend: CliBackend | None = None, why: str | None = None
) -> str:
    """Tell the controller the checkpoint it asked for is committed: it requeues the job at once.

    ``why`` (``preempted`` or ``time_limit``) says which stop signal the job answered; readers that predate it
    (``nuro.protocol.jobcomment.Mark``) read only step and time."""
    ack: dict = {"step": step, "at": round(time.time())}
    if why:
        ack["why"] = why
    return _update(COMMENT_ACK, ack, job_id, backend)


@click.group()
def main() -> None:
    """Talk to the nuro controller from inside a job (through the job's Slurm comment)."""


def _run(fn, step: int, job_id: int | None) -> None:
    try:
        fn(step, job_id)
    except JobChannelError as exc:
        click.echo(f"nuro-job: {exc}", err=True)
        sys.exit(1)


@main.command()
@click.option("--step", type=click.IntRange(min=0), required=True, help="Training step of the committed checkpoint.")
@click.option("--job-id", type=int, default=None, help="Default: $SLURM_JOB_ID.")
def ckpt(step: int, job_id: int | None) -> None:
    """Record a committed checkpoint."""
    _run(record_checkpoint, step, job_id)


@main.command()
@click.option("--step", type=click.IntRange(min=0), required=True, help="Step of the checkpoint just committed.")
@click.option("--job-id", type=int, default=None, help="Default: $SLURM_JOB_ID.")
def ack(step: int, job_id: int | None) -> None:
    """Acknowledge a preemption: the checkpoint is committed, requeue me now."""
    _run(acknowledge_preemption, step, job_id)


@main.command()
@click.option("--job-id", type=int, default=None, help="Default: $SLURM_JOB_ID.")
def show(job_id: int | None) -> None:
    """Print the job's nuro record as JSON."""
    try:
        jid = _job_id(job_id)
        click.echo(json.dumps(jobcomment.parse(CliBackend(timeout_s=15).job_comment(jid)).raw, sort_keys=True))
    except (JobChannelError, SlurmError) as exc:
        click.echo(f"nuro-job: {exc}", err=True)
        sys.exit(1)

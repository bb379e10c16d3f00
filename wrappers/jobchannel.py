"""The job's side of the controller channel: report a committed checkpoint, acknowledge a stop.

Runs inside a job (rank 0 only), as the job's user, with the job's environment (``SLURM_JOB_ID``,
``SLURMD_NODENAME``). Each call sends one datagram to this node's agent (``nuro.protocol.peerloss`` progress
report, on the agent's socket: ``$NURO_AGENT_SOCKET_DIR``/``<node>.report.sock``); the agent takes the sender's uid
from the kernel, checks it against the job's root-written record, and carries the report to the controller in its
heartbeats. Nothing is written into the job comment any more: its 1,024 bytes are the job's own (issue 30), and the
controller's reclaim must not depend on room in them. The node agent's upload worker also reports every commit it
makes by itself, so a lost ``ckpt`` report costs nothing; a lost ``ack`` costs the job its requeue at grace end
instead of at once (and a commit after the signal counts as the ack anyway).

    nuro-job ckpt --step 1200     # after a checkpoint's manifest is committed
    nuro-job ack --step 1200      # after the checkpoint a stop asked for is committed: "requeue me now"
    nuro-job show                 # the run record and root's note (preempted for …, refused because …) as JSON
"""

from __future__ import annotations

import json
import os
import sys

import click

from nuro.protocol import adminnote, jobcomment, peerloss
from nuro.slurm import CliBackend, SlurmError


class JobChannelError(RuntimeError):
    """Not inside a Slurm job, or the report could not reach the node agent; the message says which."""


def _job_id(job_id: int | None) -> int:
    if job_id is not None:
        return job_id
    raw = os.environ.get("SLURM_JOB_ID")
    if not raw or not raw.isdigit():
        raise JobChannelError(
            "SLURM_JOB_ID is not set: run this inside a Slurm job (rank 0), or pass --job-id for a job you own"
        )
    return int(raw)


def _node(job_id: int) -> str:
    """This job's node: ``SLURMD_NODENAME`` inside the job, else (an operator's ``--job-id`` from outside) the
    job's first node, where its rank 0 and its batch script run, as Slurm lists it."""
    node = os.environ.get("SLURMD_NODENAME")
    if node:
        return node
    try:
        nodes = CliBackend(timeout_s=15).job_nodes(job_id)
    except SlurmError as exc:
        raise JobChannelError(f"job {job_id}'s node unknown (not inside it; Slurm did not say): {exc}") from None
    if not nodes:
        raise JobChannelError(f"job {job_id} runs on no node now: nothing to report to")
    return nodes[0]


def _send(kind: str, step: int, job_id: int | None, why: str = "", taken_at: int | None = None) -> None:
    jid = _job_id(job_id)
    node = _node(jid)
    try:
        path = peerloss.socket_path(peerloss.socket_dir(os.environ), node)
    except ValueError as exc:
        raise JobChannelError(f"could not report {kind} for job {jid}: {exc}") from None
    if not peerloss.send_progress(path, kind, jid, step, why, taken_at):
        raise JobChannelError(
            f"could not report {kind} step {step} for job {jid}: no node agent answers at {path} "
            "(the controller then learns of the commit from the agent's upload worker, or requeues at grace end)"
        )


def record_checkpoint(step: int, job_id: int | None = None, taken_at: int | None = None) -> None:
    """Tell the controller the newest committed checkpoint (it prefers preempting jobs that lose the least).
    ``taken_at``: when its state was taken (Unix s; default: now, as the agent receives it)."""
    _send(peerloss.KIND_CKPT, step, job_id, taken_at=taken_at)


def acknowledge_preemption(step: int, job_id: int | None = None, why: str | None = None) -> None:
    """Tell the controller the checkpoint a stop asked for is committed: it requeues the job at once.

    ``why`` (``preempted`` or ``time_limit``) says which stop signal the job answered."""
    _send(peerloss.KIND_ACK, step, job_id, why or "")


@click.group()
def main() -> None:
    """Talk to the nuro controller from inside a job (through this node's agent)."""


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
    """Report a committed checkpoint."""
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
    """Print the job's run record and root's note as JSON: {"nuro": ..., "note": ...}."""
    try:
        jid = _job_id(job_id)
        backend = CliBackend(timeout_s=15)
        record = jobcomment.parse(backend.job_comment(jid)).record
        note = adminnote.parse(backend.job_admin_comment(jid))
        click.echo(json.dumps({"nuro": record, "note": note}, sort_keys=True))
    except (JobChannelError, SlurmError) as exc:
        click.echo(f"nuro-job: {exc}", err=True)
        sys.exit(1)

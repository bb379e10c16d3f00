"""``nuro-train resume RUN``: a new run that continues RUN from its latest valid checkpoint, on the same pins.

The parent's run record (its job comment, kept in accounting too) says what it ran: team, tier, dataset digest,
code repo and commit, entry point, checkpoint policy, requeue budget. The new run gets exactly those, plus
``resume_from=RUN``; nodes and GPUs per node come from the parent's allocation. What the record does not hold
(interpreter, run root, time limit) comes from flags or the defaults. A parent that ran uncommitted changes cannot be
resumed this way: its patch is not in the record as code, so resubmit its spec with ``--allow-dirty``.

Exit codes: 0 ok, 1 Slurm refused, 2 usage, 3 the parent cannot be resumed (no or invalid run record), 4 no such run.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import click

from nuro.console import ExitCode, fail
from nuro.jobspec import SpecError
from nuro.jobspec.submission import InvalidSubmission, apply_submission, plan_submission, spec_from
from nuro.protocol import jobcomment
from nuro.slurm import CliBackend, InvalidJobId, JobInfo, SlurmError, SubmissionRejected

#: How this command fails: ``nuro-train resume: <message>`` on stderr, or with ``--json`` one line
#: ``{"error": ..., "exit_code": ...}`` (the shape scripts already read).
stop = functools.partial(fail, prog="nuro-train resume", keys=("error", "exit_code"), indent=None)


def resume_flags(job: JobInfo, run_root: str | None, python: str | None, time_limit: str | None) -> dict[str, Any]:
    """The spec (as option-name → value) of a run continuing ``job``. Pure. Raises ValueError when impossible."""
    meta = jobcomment.parse(job.comment).raw.get("nuro")
    if not isinstance(meta, dict):
        raise ValueError(f"job {job.job_id} has no nuro run record: it was not submitted with nuro-train/nuro-sbatch")
    ds, code, entry = meta.get("dataset") or {}, meta.get("code") or {}, meta.get("entry") or {}
    if code.get("diff"):
        raise ValueError(
            f"job {job.job_id} ran uncommitted changes (diff {code['diff']}); commit them, or resubmit its spec "
            f"with --allow-dirty and --resume-from {job.job_id}"
        )
    flags: dict[str, Any] = {
        "name": meta.get("name") or job.name,
        "team": meta.get("team") or job.account,
        "nodes": job.node_count,
        "gpus_per_node": job.gpus_per_node,
        "dataset": f"{ds.get('name')}@{ds.get('digest')}",
        "code.repo": code.get("repo"),
        "code.commit": code.get("commit"),
        "entrypoint.script": entry.get("script"),
        "entrypoint.args": list(entry.get("args") or []),
        "resume_from": str(job.job_id),
    }
    optional = {
        "tier": meta.get("tier"),
        "entrypoint.deepspeed_config": entry.get("deepspeed_config"),
        "entrypoint.launcher": entry.get("launcher"),
        "checkpoint.interval_s": (meta.get("ckpt_policy") or {}).get("interval_s"),
        "checkpoint.keep": (meta.get("ckpt_policy") or {}).get("keep"),
        "max_requeues": (meta.get("requeue") or {}).get("max"),
        "run_root": run_root,
        "entrypoint.python": python,
        "time_limit": time_limit,
    }
    flags.update({k: v for k, v in optional.items() if v is not None})
    return flags


@click.command()
@click.argument("run", type=int)
@click.option("--run-root", type=click.Path(file_okay=False), help="Where the new run writes (default ~/nuro-runs).")
@click.option("--python", "python", help="Interpreter on the nodes (not in the run record; default python3).")
@click.option(
    "--time",
    "--time-limit",
    "time_limit",
    metavar="TIME",
    help="Wall-clock limit per attempt, as submit's and sbatch's --time (90, 4:00:00, 2-12:00:00).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be submitted; submit nothing.")
@click.option("--hold", is_flag=True, help="Submit held (release with scontrol release).")
@click.option("--json", "as_json", is_flag=True)
def resume(
    run: int, run_root: str | None, python: str | None, time_limit: str | None, dry_run: bool, hold: bool, as_json: bool
) -> None:
    """Start a new run continuing RUN from its latest valid checkpoint, pinned to the same dataset and commit."""
    backend = CliBackend(timeout_s=30)
    try:
        parent = backend.find_job(run)
    except (InvalidJobId, SlurmError) as exc:
        stop(ExitCode.FAILED, f"could not look up job {run}: {exc}", as_json=as_json)
    if parent is None:
        stop(ExitCode.NOT_FOUND, f"no job {run} in the queue or in accounting", as_json=as_json)
    try:
        flags = resume_flags(parent, run_root, python, time_limit)  # type: ignore[arg-type]
        planned = plan_submission(spec_from(None, flags, home_run_root=run_root))
    except ValueError as exc:
        stop(ExitCode.INVALID, str(exc), as_json=as_json)
    except (SpecError, InvalidSubmission) as exc:
        stop(ExitCode.INVALID, "; ".join(getattr(exc, "problems", [str(exc)])), as_json=as_json)
    if dry_run:
        payload = {"dry_run": True, "resume_from": run, "argv": list(planned.request.argv),
                   "comment": planned.request.comment}  # fmt: skip
        click.echo(json.dumps(payload, indent=2) if as_json else planned.request.script)
        return
    try:
        job_id, request = apply_submission(planned, backend, ["--hold"] if hold else [])
    except InvalidSubmission as exc:
        stop(ExitCode.INVALID, "; ".join(exc.problems), as_json=as_json)
    except SubmissionRejected as exc:
        stop(ExitCode.FAILED, f"Slurm refused the job: {exc.slurm_message or exc}", as_json=as_json)
    except SlurmError as exc:
        stop(ExitCode.FAILED, str(exc), as_json=as_json)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "resume_from": run, "comment": request.comment}))
    else:
        click.echo(f"submitted job {job_id} resuming run {run}")

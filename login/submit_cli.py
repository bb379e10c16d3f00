"""``nuro-train submit [SPEC.yaml] [flag overrides] [--dry-run] [--json]``: plan, preview, then submit a run.

The shape is plan → apply (``nuro.jobspec.submission``): ``plan_submission`` checks the spec, resolves the
dataset to a digest, pins the code and renders the ``SbatchRequest`` (nothing is written anywhere);
``apply_submission`` creates the output directory, stores the code patch when a store is configured and submits the
request unchanged through the Slurm adapter. ``--dry-run`` stops after the plan and prints the script, the sbatch
argv, the run record and the decision the job_submit bridge will take (``nuro.jobspec.preview``).

Exit codes: 0 submitted (dry run: the preview accepts, or no policy to preview with); 1 Slurm refused the job
(Slurm's message is printed) or Slurm is unreachable (dry run: the preview rejects); 2 usage; 3 invalid spec (bad
value, dirty tree, unknown dataset tag, ...).
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shlex
import sys
from typing import Any

import click

from nuro.console import ExitCode, fail
from nuro.jobspec import SpecError, click_options, flag_values
from nuro.jobspec.preview import PreviewError, admission_dict, describe, load_policy_source
from nuro.jobspec.submission import InvalidSubmission, apply_submission, plan_submission, preview, spec_from
from nuro.slurm import CliBackend, SlurmError, SubmissionRejected

#: How this command fails: ``nuro-train submit: <line>`` on stderr, or with ``--json`` one object carrying
#: ``exit_code`` and ``errors`` (the shape scripts already read).
stop = functools.partial(fail, prog="nuro-train submit", keys=("exit_code", "errors"))


@click.command("submit")
@click.argument("spec_file", required=False, type=click.Path(dir_okay=False))
@click_options()
@click.option("--dry-run", is_flag=True, help="Print the script, argv, run record and bridge decision; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
@click.option("--policy", "policy_path", type=click.Path(dir_okay=False), default=None,
              help="teams.yaml for the bridge preview [default: $NURO_POLICY].")  # fmt: skip
@click.option("--hold", is_flag=True, help="Submit the job held (release it with scontrol release).")
def submit(
    spec_file: str | None, dry_run: bool, as_json: bool, policy_path: str | None, hold: bool, **kwargs: Any
) -> None:
    """Submit a training run from SPEC_FILE (YAML) and/or flags; flags override the file."""
    try:
        spec = spec_from(spec_file, flag_values(kwargs))
        source = load_policy_source(policy_path)
        planned = plan_submission(spec, source)
    except SpecError as exc:
        stop(ExitCode.INVALID, *[f"{exc.source}: {p}" for p in exc.problems], as_json=as_json)
    except InvalidSubmission as exc:
        stop(ExitCode.INVALID, *exc.problems, as_json=as_json)
    except PreviewError as exc:
        stop(ExitCode.USAGE, str(exc), as_json=as_json)
    request = planned.request
    for note in planned.notes:
        click.echo(f"nuro-train submit: note: {note}", err=True)
    if dry_run:
        user = pwd.getpwuid(os.getuid()).pw_name  # who Slurm will see, whatever $USER says
        admission = preview(request, source, user) if source is not None else None
        code = int(ExitCode.OK if admission is None or admission.accepted else ExitCode.FAILED)
        if as_json:
            payload = {"dry_run": True, "argv": list(request.argv), "comment": request.comment,
                       "script": request.script, "bridge": admission_dict(admission) if admission else None,
                       "notes": list(planned.notes), "exit_code": code}  # fmt: skip
            click.echo(json.dumps(payload, indent=2))
        else:
            click.echo(request.script, nl=False)
            click.echo(f"\n# sbatch argv (the script above on stdin): {shlex.join(request.argv)}")
            click.echo("# run record (job comment):\n" + json.dumps(request.meta, indent=2, sort_keys=True))
            lines = describe(admission, source, user) if admission is not None and source is not None else [
                "bridge preview: no policy (give --policy PATH or set NURO_POLICY to a teams.yaml)"
            ]  # fmt: skip
            click.echo("\n".join(lines))
        sys.exit(code)
    try:
        job_id, request = apply_submission(planned, CliBackend(), ["--hold"] if hold else [])
    except InvalidSubmission as exc:
        stop(ExitCode.INVALID, *exc.problems, as_json=as_json)
    except SubmissionRejected as exc:
        stop(ExitCode.FAILED, f"Slurm refused the job: {exc.slurm_message or exc}", as_json=as_json)
    except SlurmError as exc:
        stop(ExitCode.FAILED, str(exc), as_json=as_json)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "comment": request.comment}))
    else:
        pins = planned.pins
        click.echo(
            f"submitted job {job_id}: run {spec.name}, team {spec.team}, commit {pins.code.commit[:12]}"
            f"{' + uncommitted changes' if pins.code.dirty else ''}, dataset {pins.dataset.name}@{pins.dataset.digest}"
        )


__all__ = ["submit"]

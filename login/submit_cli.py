"""``nuro-train submit [SPEC.yaml] [flag overrides] [--dry-run] [--json]``: plan, preview, then submit a run.

The shape is plan → apply (STYLE T1): ``plan_submission`` checks the spec, resolves the dataset to a digest, pins the
code and renders the ``SbatchRequest`` (nothing is written anywhere); ``apply_submission`` creates the output
directory, stores the code patch when a store is configured and submits the request unchanged through the Slurm
adapter. ``--dry-run`` stops after the plan and prints the script, the sbatch argv, the run record and the decision
the job_submit bridge will take (``nuro.jobspec.preview``).

Exit codes: 0 submitted (dry run: the preview accepts, or no policy to preview with); 1 Slurm refused the job
(Slurm's message is printed) or Slurm is unreachable (dry run: the preview rejects); 2 usage; 3 invalid spec (bad
value, dirty tree, unknown dataset tag, ...).
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NoReturn

import click

from nuro.jobspec import JobSpec, SpecError, build_spec, click_options, flag_values, load_spec_file, split_code_flag
from nuro.jobspec.codepin import CodePinError, pin_code
from nuro.jobspec.pins import PinError, resolve_dataset, store_diff, with_planned_diff_uri
from nuro.jobspec.preview import PolicySource, PreviewError, admission_dict, decide_words, describe, load_policy_source
from nuro.jobspec.render import ClusterFacts, Pins, RenderError, SbatchRequest, render_submission
from nuro.jobspec.sbatch_args import parse_options, script_directives
from nuro.slurm import CliBackend, SlurmError, SubmissionRejected

EXIT_OK, EXIT_SLURM, EXIT_USAGE, EXIT_INVALID = 0, 1, 2, 3
DEFAULT_RUN_ROOT = "~/nuro-runs"


class InvalidSubmission(Exception):
    """Exit 3: the spec, the dataset reference or the code cannot be pinned; ``problems`` says why."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class PlannedSubmission:
    """Everything submit will do, as values: the checked spec, the pins and the exact request."""

    spec: JobSpec
    pins: Pins
    request: SbatchRequest


def spec_from(
    spec_file: str | None, flags: Mapping[str, Any], cwd: str | None = None, home_run_root: str | None = None
) -> JobSpec:
    """The JobSpec from a spec file and flag overrides (flags win; ``--code`` may be REPO[@COMMIT]).

    Raises:
        SpecError: every problem at once.
    """
    layers: list[Mapping[str, Any]] = [{"run_root": home_run_root or os.path.expanduser(DEFAULT_RUN_ROOT)}]
    if spec_file:
        layers.append(load_spec_file(spec_file))
    overrides = dict(flags)
    if isinstance(overrides.get("code.repo"), str):
        code = split_code_flag(overrides.pop("code.repo"), cwd)
        if "code.commit" in code and "code.commit" in overrides and code["code.commit"] != overrides["code.commit"]:
            raise SpecError(["code.commit: --commit conflicts with the commit in --code REPO@COMMIT"])
        overrides = {**code, **overrides}
    layers.append(overrides)
    return build_spec(*layers, source=spec_file or "job spec")


def plan_submission(
    spec: JobSpec, source: PolicySource | None = None, env: Mapping[str, str] | None = None
) -> PlannedSubmission:
    """Resolve the dataset, pin the code, render: what would be submitted. Writes nothing.

    Raises:
        InvalidSubmission: the dataset reference or the code cannot be pinned.
    """
    required = [spec.script] + ([spec.deepspeed_config] if spec.deepspeed_config else [])
    problems: list[str] = []
    # Pinning waits on git processes and resolving on an S3 round trip: overlap them (about 4 ms instead of 6).
    with ThreadPoolExecutor(max_workers=1) as pool:
        pinning = pool.submit(
            pin_code, spec.code_repo, spec.code_commit, allow_dirty=spec.allow_dirty, require_paths=required
        )
        try:
            dataset = resolve_dataset(spec.dataset, env)
        except PinError as exc:
            problems.append(f"dataset: {exc}")
        try:
            code = with_planned_diff_uri(pinning.result(), spec.team, env)
        except CodePinError as exc:
            problems.append(f"code: {exc}")
    if problems:
        raise InvalidSubmission(problems)
    facts = ClusterFacts.from_policy_table(source.table) if source is not None else ClusterFacts()
    pins = Pins(code=code, dataset=dataset)
    try:
        return PlannedSubmission(spec, pins, render_submission(spec, pins, facts))
    except RenderError as exc:
        raise InvalidSubmission([str(exc)]) from exc


def apply_submission(
    planned: PlannedSubmission,
    backend: CliBackend,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> tuple[int, SbatchRequest]:
    """Store the code patch (when the plan names a store URI), create the output directory, submit the planned
    request unchanged; returns the job id and the request.

    Raises:
        InvalidSubmission: the output directory cannot be created or the patch cannot be stored.
        SubmissionRejected / SlurmError: from the adapter.
    """
    request = planned.request
    if planned.pins.code.diff_uri is not None:
        try:
            store_diff(planned.pins.code, planned.spec.team, env)
        except PinError as exc:
            raise InvalidSubmission([str(exc)]) from exc
    try:
        os.makedirs(request.output_dir, exist_ok=True)
    except OSError as exc:
        raise InvalidSubmission([f"run_root: cannot create {request.output_dir}: {exc.strerror}"]) from exc
    return backend.submit(request.script, *request.args, *extra_args), request


def preview(request: SbatchRequest, source: PolicySource, user: str) -> Any:
    """The bridge's decision for this request (its #SBATCH lines, then its command-line options)."""
    words = parse_options(script_directives(request.script)) + parse_options(list(request.args))
    return decide_words(words, user, source)


def _die(code: int, lines: list[str], as_json: bool, payload: dict[str, Any] | None = None) -> NoReturn:
    if as_json:
        click.echo(json.dumps({**(payload or {}), "exit_code": code, "errors": lines}, indent=2))
    else:
        for line in lines:
            click.echo(f"nuro-train submit: {line}", err=True)
    sys.exit(code)


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
        _die(EXIT_INVALID, [f"{exc.source}: {p}" for p in exc.problems], as_json)
    except InvalidSubmission as exc:
        _die(EXIT_INVALID, exc.problems, as_json)
    except PreviewError as exc:
        _die(EXIT_USAGE, [str(exc)], as_json)
    request = planned.request
    if dry_run:
        user = pwd.getpwuid(os.getuid()).pw_name  # who Slurm will see, whatever $USER says
        admission = preview(request, source, user) if source is not None else None
        code = EXIT_OK if admission is None or admission.accepted else EXIT_SLURM
        if as_json:
            payload = {"dry_run": True, "argv": list(request.argv), "comment": request.comment,
                       "script": request.script, "bridge": admission_dict(admission) if admission else None,
                       "exit_code": code}  # fmt: skip
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
        _die(EXIT_INVALID, exc.problems, as_json)
    except SubmissionRejected as exc:
        _die(EXIT_SLURM, [f"Slurm refused the job: {exc.slurm_message or exc}"], as_json)
    except SlurmError as exc:
        _die(EXIT_SLURM, [str(exc)], as_json)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "comment": request.comment}))
    else:
        pins = planned.pins
        click.echo(
            f"submitted job {job_id}: run {spec.name}, team {spec.team}, commit {pins.code.commit[:12]}"
            f"{' + uncommitted changes' if pins.code.dirty else ''}, dataset {pins.dataset.name}@{pins.dataset.digest}"
        )


__all__ = ["InvalidSubmission", "PlannedSubmission", "apply_submission", "plan_submission", "spec_from", "submit"]

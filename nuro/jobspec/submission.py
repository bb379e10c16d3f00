"""A ``nuro-train`` submission as plan → apply: the steps ``submit`` and ``resume`` share.

``plan_submission`` checks the spec, resolves the dataset to a digest, pins the code and renders the ``SbatchRequest``
(nothing is written anywhere); ``apply_submission`` creates the output directory, stores the code patch when a store
is configured and submits the request unchanged through the Slurm adapter; ``preview`` is the job_submit bridge's
decision on the request (``nuro.jobspec.preview``). The CLIs only parse flags and print (``nuro.login.submit_cli``,
``nuro.login.resume_cli``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from nuro.jobspec.codepin import CodePin, CodePinError, pin_code, read_pinned
from nuro.jobspec.dsconfig import MAX_CONFIG_BYTES, check_config
from nuro.jobspec.pins import PinError, resolve_dataset, store_diff, with_planned_diff_uri
from nuro.jobspec.preview import PolicySource, decide_words
from nuro.jobspec.render import ClusterFacts, Pins, RenderError, SbatchRequest, render_submission
from nuro.jobspec.sbatch_args import parse_options, script_directives
from nuro.jobspec.spec import JobSpec, SpecError, build_spec, load_spec_file, split_code_flag
from nuro.slurm import Backend
from nuro.slurm.models import EXPEDITED_REQUEUE_SINCE

#: Where runs write when neither the spec nor a flag says (``run_root``).
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
    #: things worth saying that do not stop the submit (e.g. a DeepSpeed config key DeepSpeed ignores)
    notes: tuple[str, ...] = ()


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
    notes = deepspeed_notes(spec.deepspeed_config, code, spec.world_size) if spec.deepspeed_config else []
    facts = ClusterFacts.from_policy_table(source.table) if source is not None else ClusterFacts()
    pins = Pins(code=code, dataset=dataset)
    try:
        return PlannedSubmission(spec, pins, render_submission(spec, pins, facts), tuple(notes))
    except RenderError as exc:
        raise InvalidSubmission([str(exc)]) from exc


def deepspeed_notes(path: str, code: CodePin, world: int) -> list[str]:
    """Check the DeepSpeed config ``path`` as the job will read it (``nuro.jobspec.dsconfig``) for ``world`` ranks;
    the notes to print. Shared by nuro-train and nuro-sbatch.

    Raises:
        InvalidSubmission: what DeepSpeed would refuse when the engine starts, each line saying what to change.
    """
    field = f"entrypoint.deepspeed_config ({path})"
    try:
        check = check_config(read_pinned(code, path, max_bytes=MAX_CONFIG_BYTES), world=world)
    except CodePinError as exc:
        raise InvalidSubmission([f"{field}: {exc}"]) from None
    if check.problems:
        raise InvalidSubmission([f"{field}: {p}" for p in check.problems])
    return [f"{field}: {n}" for n in check.notes]


def requeue_args(backend: Backend) -> list[str]:
    """``["--requeue=expedite"]`` where the cluster's Slurm has it (``EXPEDITED_REQUEUE_SINCE``; slurm.conf's
    ``enable_expedited_requeue``, which the renderer writes for those releases; a command-line flag overrides the
    script's ``#SBATCH --requeue``), else nothing: older releases refuse the flag."""
    return ["--requeue=expedite"] if backend.version().major_minor >= EXPEDITED_REQUEUE_SINCE else []


def apply_submission(
    planned: PlannedSubmission,
    backend: Backend,
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
    args = (*request.args, *requeue_args(backend), *extra_args)
    return backend.submit(request.script, *args), request


def preview(request: SbatchRequest, source: PolicySource, user: str) -> Any:
    """The bridge's decision for this request (its #SBATCH lines, then its command-line options)."""
    words = parse_options(script_directives(request.script)) + parse_options(list(request.args))
    return decide_words(words, user, source)


__all__ = [
    "DEFAULT_RUN_ROOT",
    "InvalidSubmission",
    "PlannedSubmission",
    "apply_submission",
    "deepspeed_notes",
    "plan_submission",
    "preview",
    "spec_from",
]

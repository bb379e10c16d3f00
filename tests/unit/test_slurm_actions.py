"""render_argv: the exact argv per action (the contract with Slurm is the argv, so the argv is tested)."""

from __future__ import annotations

import pytest

from nuro.slurm.actions import (
    ActionResult,
    Cancel,
    DrainNode,
    Hold,
    Release,
    Requeue,
    ResumeNode,
    Signal,
    Submit,
    UpdateNodeWeight,
    UpdateQos,
    UpdateSiteFactor,
    render_argv,
    render_stdin,
)
from nuro.slurm.errors import InvalidJobId

SCRIPT = "#!/bin/bash\nsrun hostname\n"


@pytest.mark.parametrize(
    ("action", "argv"),
    [
        (Submit(SCRIPT), ["sbatch", "--parsable"]),
        (
            Submit(SCRIPT, ("-N2", "--gres=gpu:8", '--comment={"run": "x"}'), cwd="/work/run1"),
            ["sbatch", "--parsable", "--chdir=/work/run1", "-N2", "--gres=gpu:8", '--comment={"run": "x"}'],
        ),
        (Cancel(42), ["scancel", "42"]),
        (Cancel("42_3", signal="term"), ["scancel", "--signal=TERM", "42_3"]),
        (Signal(42, "USR1"), ["scancel", "--signal=USR1", "42"]),
        (Signal(42, "SIGUSR2", batch_only=True), ["scancel", "--signal=SIGUSR2", "--batch", "42"]),
        (Signal(42, "TERM", full=True), ["scancel", "--signal=TERM", "--full", "42"]),
        (Requeue(42), ["scontrol", "requeue", "42"]),
        (Requeue(42, hold=True), ["scontrol", "requeuehold", "42"]),
        (Hold(42), ["scontrol", "hold", "42"]),
        (Release(42), ["scontrol", "release", "42"]),
        (UpdateQos(42, "b-vision"), ["scontrol", "update", "jobid=42", "qos=b-vision"]),
        (UpdateSiteFactor(42, 5000), ["scontrol", "update", "jobid=42", "sitefactor=5000"]),
        (
            DrainNode("gpu008", "nuro: heartbeat lost for 3 s"),
            ["scontrol", "update", "nodename=gpu008", "state=drain", "reason=nuro: heartbeat lost for 3 s"],
        ),
        (ResumeNode("gpu[007-008]"), ["scontrol", "update", "nodename=gpu[007-008]", "state=resume"]),
        (UpdateNodeWeight("gpu[001-003]", 4), ["scontrol", "update", "nodename=gpu[001-003]", "weight=4"]),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, list) else "",
)
def test_render_argv(action: object, argv: list[str]) -> None:
    assert render_argv(action) == argv  # type: ignore[arg-type]


def test_render_is_pure_and_repeatable() -> None:
    action = Submit(SCRIPT, ("-N1",))
    first, second = render_argv(action), render_argv(action)
    first.append("--oops")
    assert second == ["sbatch", "--parsable", "-N1"] and render_argv(action) == second


def test_stdin_only_for_submit() -> None:
    assert render_stdin(Submit(SCRIPT)) == SCRIPT
    assert render_stdin(Cancel(1)) is None


@pytest.mark.parametrize(
    "bad",
    [
        lambda: render_argv(Cancel("42; rm -rf /")),
        lambda: render_argv(Cancel("")),
        lambda: render_argv(Signal(1, "USR1 -u root")),
        lambda: render_argv(UpdateQos(1, "a b")),
        lambda: render_argv(ResumeNode("gpu001 gpu002")),
        lambda: DrainNode("gpu001", "  "),
        lambda: UpdateNodeWeight("gpu001", -1),
        lambda: render_argv(UpdateNodeWeight("gpu001 weight=0", 1)),
        lambda: Signal(1, "USR1", batch_only=True, full=True),
        lambda: Submit("srun hostname"),
    ],
)
def test_invalid_actions_fail_before_anything_runs(bad) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        bad()


def test_render_rejects_non_actions() -> None:
    with pytest.raises(TypeError):
        render_argv("scancel 1")  # type: ignore[arg-type]


def test_action_result_raise_for_error() -> None:
    ok = ActionResult(Hold(1), ok=True)
    assert ok.raise_for_error() is ok
    failed = ActionResult(Hold(1), ok=False, error=InvalidJobId("Invalid job id specified"))
    with pytest.raises(InvalidJobId):
        failed.raise_for_error()

"""Error classification on Slurm's own messages, recorded from the real dev cluster (slurm_errors.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nuro.slurm.errors import (
    InvalidJobId,
    InvalidNodeName,
    InvalidState,
    PermissionDenied,
    SlurmError,
    SlurmUnavailable,
    SubmissionRejected,
    classify_error,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
CASES = {c["name"]: c for c in json.loads((FIXTURES / "slurm_errors.json").read_text())}

EXPECTED: dict[str, type[SlurmError]] = {
    "update_bad_job": InvalidJobId,
    "hold_bad_job": InvalidJobId,
    "squeue_bad_job": InvalidJobId,
    "update_bad_qos": SlurmError,
    "sbatch_bad_qos": SubmissionRejected,
    "sbatch_bad_partition": SubmissionRejected,
    "sbatch_empty_script": SubmissionRejected,
    "sbatch_other_user": SubmissionRejected,
    "resume_not_drained": InvalidState,
    "requeue_pending": InvalidState,
    "drain_bad_node": InvalidNodeName,
    "scancel_other_user": PermissionDenied,
    "update_node_other_user": PermissionDenied,
    "down_squeue": SlurmUnavailable,
    "down_update_node": SlurmUnavailable,
    "down_sbatch": SlurmUnavailable,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_classify_recorded_errors(name: str) -> None:
    case = CASES[name]
    assert case["rc"] != 0, f"{name} was expected to fail on the real cluster"
    exc = classify_error(case["argv"], case["rc"], case["stderr"])
    assert type(exc) is EXPECTED[name]
    # Slurm's own text is in the message, verbatim, and the argv is kept.
    first_line = case["stderr"].strip().splitlines()[0]
    assert first_line in str(exc) and exc.slurm_message.startswith(first_line)
    assert exc.argv == tuple(case["argv"]) and exc.returncode == case["rc"]


def test_recorded_quirks_of_22_05() -> None:
    # scancel of an unknown job exits 0 (silently without -v): cancelling is idempotent.
    assert CASES["scancel_bad_job_verbose"]["rc"] == 0
    # squeue/sinfo --json exit 0 even with the controller down (the error is inside the JSON).
    assert CASES["down_squeue_json"]["rc"] == 0 and CASES["down_sinfo_json"]["rc"] == 0


def test_message_without_stderr_and_hints() -> None:
    exc = classify_error(["scontrol", "hold", "1"], 1, "")
    assert type(exc) is SlurmError and "rc=1" in str(exc) and "scontrol" in str(exc)
    down = classify_error(["squeue"], 1, "squeue: error: Socket timed out on send/recv operation\n")
    assert isinstance(down, SlurmUnavailable) and "slurmctld" in str(down)
    assert isinstance(down, SlurmError)

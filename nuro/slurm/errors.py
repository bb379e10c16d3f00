"""Exceptions for Slurm calls, and the one classifier that picks them from Slurm's own stderr.

Why: callers must react differently to "the controller is unreachable" (keep the last snapshot, retry later),
"that job no longer exists" (treat as gone) and "sbatch refused the job" (show the user Slurm's reason). Every
exception keeps the argv, the return code and Slurm's own message, and ``str()`` shows Slurm's text verbatim.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Sequence

log = logging.getLogger(__name__)


class SlurmError(Exception):
    """A Slurm command failed.

    Attributes:
        argv: the exact command that ran (empty when not applicable, e.g. a parse error).
        returncode: its exit status, or None when it never exited (not found, timed out).
        slurm_message: Slurm's own error text (stderr, stripped); this is what users should see.
    """

    hint = ""

    def __init__(
        self, message: str, argv: Sequence[str] = (), returncode: int | None = None, slurm_message: str = ""
    ) -> None:
        self.argv = tuple(argv)
        self.returncode = returncode
        self.slurm_message = slurm_message
        self.message = message
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.message]
        if self.argv:
            parts.append(f"(command: {shlex.join(self.argv)}, rc={self.returncode})")
        if self.hint:
            parts.append(self.hint)
        return " ".join(parts)


class SlurmCommandNotFound(SlurmError):
    """The Slurm client binary is not installed or not on PATH / bin_dir."""

    hint = "Install the Slurm client (slurm-client) or pass bin_dir= to the backend."


class SlurmTimeout(SlurmError):
    """The command did not finish within the backend's timeout_s; the process was killed."""


class SlurmConfigMissing(SlurmError):
    """``SLURM_CONF`` names a file that does not exist. Checked before running anything: Slurm's clients retry a
    missing slurm.conf for 60 s before giving up, which would look like a hung controller."""

    hint = "Point SLURM_CONF at the cluster's slurm.conf (or unset it to use the default path or configless mode)."


class JobWaitTimeout(TimeoutError):
    """A job did not reach the awaited state in time (Slurm answered; the job is just not there yet)."""


class SlurmUnavailable(SlurmError):
    """slurmctld (or slurmdbd for sacct) could not be reached; the cluster state is unknown, not empty."""

    hint = "Check that slurmctld is running and SLURM_CONF points at the right cluster."


class InvalidJobId(SlurmError):
    """The job id does not exist (never did, or has been purged from slurmctld after MinJobAge)."""


class SubmissionRejected(SlurmError):
    """sbatch refused the job (limits, bad options, job_submit.lua); slurm_message says why."""


class PermissionDenied(SlurmError):
    """The calling user may not do this (e.g. SiteFactor needs an operator/admin)."""


class InvalidNodeName(SlurmError):
    """The node name is not in slurm.conf."""


class InvalidState(SlurmError):
    """The transition is refused in the current state (e.g. resume of a node that is not drained/down)."""


class SlurmParseError(SlurmError):
    """Slurm's output did not have the shape this adapter was written for (a Slurm version change?)."""


# Ordered: the first matching pattern wins. Patterns are Slurm's own messages (slurm_strerror() texts in
# src/common/slurm_errno.c, 22.05) or the client's prefixes ("sbatch: error: Batch job submission failed").
_RULES: tuple[tuple[re.Pattern[str], type[SlurmError]], ...] = (
    (
        re.compile(
            r"Unable to contact slurm controller|Socket timed out on send/recv|Zero Bytes were transmitted"
            r"|Connection refused|Unable to establish control machine|Could not establish a configuration source"
            r"|Slurm backup controller in standby mode|Unable to connect to database"
            r"|Problem talking to the database|slurmdbd: Connection refused",
            re.IGNORECASE,
        ),
        SlurmUnavailable,
    ),
    (
        # "Invalid user id" is what 22.05 says when a non-operator updates a node or someone else's job.
        re.compile(r"Access/permission denied|Permission denied|Only admin|not authorized|Invalid user id", re.I),
        PermissionDenied,
    ),
    (re.compile(r"Invalid job id|Invalid job_id|Invalid job array", re.I), InvalidJobId),
    (re.compile(r"Invalid node name", re.I), InvalidNodeName),
    (
        re.compile(
            r"Invalid node state|Job/step already completing or completed|Job is no longer pending"
            r"|Requested operation is presently disabled|Job is pending execution|Job is not running",
            re.I,
        ),
        InvalidState,
    ),
    (re.compile(r"Batch job submission failed|sbatch: error:", re.I), SubmissionRejected),
)


def _clean_message(stderr: str) -> str:
    """Slurm's message without trailing blank lines; multi-line messages are kept whole."""
    return "\n".join(line.rstrip() for line in stderr.strip().splitlines() if line.strip())


def classify_error(argv: Sequence[str], returncode: int | None, stderr: str) -> SlurmError:
    """Pick the exception class for a failed Slurm command from its stderr.

    Returns (does not raise) the exception so the caller decides; the message always contains Slurm's own text.
    An unrecognised message gives a plain ``SlurmError``. Every ``sbatch`` failure other than an unreachable
    controller is a ``SubmissionRejected``, whatever Slurm's reason (the reason is in ``slurm_message``).
    """
    message = _clean_message(stderr)
    cls: type[SlurmError] = SlurmError
    for pattern, candidate in _RULES:
        if pattern.search(message):
            cls = candidate
            break
    prog = argv[0].rsplit("/", 1)[-1] if argv else ""
    if prog == "sbatch" and cls not in (SlurmUnavailable, SlurmTimeout):
        # Any refusal by sbatch (limits, account, job_submit.lua, permission) is a rejected submission.
        cls = SubmissionRejected
    text = message or f"{prog or 'slurm command'} failed with rc={returncode} and no message on stderr"
    return cls(text, argv=argv, returncode=returncode, slurm_message=message)

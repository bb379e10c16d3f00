"""The CLI backend's writes: a platform action rendered and run once, and a user's own sbatch line run as given.

Nothing here retries: a retried sbatch would submit twice. Rendering is ``nuro.slurm.actions``' (pure); this room
only runs what it renders and reports the result.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time

from nuro.slurm.actions import Action, ActionResult, Submit, SubmitCommand, render_argv, render_stdin
from nuro.slurm.cli_runner import CliRunner
from nuro.slurm.errors import SlurmCommandNotFound, SlurmError
from nuro.slurm.parse import parse_sbatch_parsable

log = logging.getLogger(__name__)


def _target(action: Action, new_job: int | None) -> str:
    """What an action acted on, for its log line: ``job_id=`` the job it names or a Submit's new one, ``node=``,
    ``qos=``, ``job_ids=``; the log said ``job_id=None`` for every action but a Submit (a requeue of job 43 too)."""
    ids = getattr(action, "job_ids", None)
    if ids:  # a burst moves hundreds in one call: the first ten and the count
        more = f",... ({len(ids)})" if len(ids) > 10 else ""
        return "job_ids=" + ",".join(map(str, ids[:10])) + more
    for attr in ("job_id", "node", "qos"):
        value = getattr(action, attr, None)
        if value is not None:
            return f"{attr}={value}"
    return f"job_id={new_job}" if isinstance(action, Submit) else "target=-"


class CliWrites(CliRunner):
    """``apply`` (a platform action) and ``submit_command`` (a user's sbatch line) over ``CliRunner.run``."""

    def apply(self, action: Action) -> ActionResult:
        """Render ``action``, run it once, return the result (``ok=False`` with ``error`` on Slurm failure).

        Raises:
            ValueError / TypeError: the action is malformed (nothing ran).
        """
        argv = render_argv(action)
        cwd = action.cwd if isinstance(action, Submit) else None
        start = time.monotonic()
        kind = type(action).__name__
        try:
            proc = self.run(argv, stdin=render_stdin(action), cwd=cwd)
        except SlurmError as exc:
            duration_s = time.monotonic() - start
            # info, not warning: the caller owns the failure (it gets it in the result and says it in its own terms);
            # at warning every CLI printed Slurm's refusal twice, once as this log line and once as its error
            log.info(
                "slurm action failed action=%s %s error=%s message=%s",
                kind,
                _target(action, None),
                type(exc).__name__,
                exc.slurm_message or exc.message,
            )
            return ActionResult(
                action,
                ok=False,
                message=exc.slurm_message or exc.message,
                duration_s=duration_s,
                error=exc,
                argv=tuple(exc.argv or self._resolve(argv)),
            )
        duration_s = time.monotonic() - start
        job_id = None
        if isinstance(action, Submit):
            try:
                job_id = parse_sbatch_parsable(proc.stdout)
            except SlurmError as exc:  # submitted, but the id is unreadable: report it, do not resubmit
                log.error("sbatch succeeded but its job id is unreadable error=%s", exc)
        message = "\n".join(s for s in (proc.stdout.strip(), proc.stderr.strip()) if s)
        log.info("slurm action applied action=%s %s duration_s=%.3f", kind, _target(action, job_id), duration_s)
        return ActionResult(
            action,
            ok=True,
            job_id=job_id,
            message=message,
            duration_s=duration_s,
            argv=tuple(self._resolve(argv)),
        )

    def submit_command(self, command: SubmitCommand) -> int:
        """Run a user's own sbatch command line as given (see ``SubmitCommand``); returns sbatch's exit status.

        sbatch's stdout and stderr stay this process's (the user's terminal): nothing is captured or re-printed, so
        its messages, their format and their order are sbatch's own, and a refusal is its exit status, not an
        exception. No timeout: ``sbatch --wait`` blocks until the job ends. The ``env`` overrides apply as for every
        command; the SLURM_CONF check does not (sbatch reports a missing configuration itself, as the user expects).

        Raises:
            SlurmCommandNotFound: sbatch is not on PATH (or in ``bin_dir``).
        """
        full = self._resolve(render_argv(command))
        self._calls += 1
        log.debug("slurm call n=%d argv=%s", self._calls, shlex.join(full))
        try:
            proc = subprocess.run(full, input=command.stdin, env={**os.environ, **self._env_overrides}, check=False)
        except FileNotFoundError as exc:
            raise SlurmCommandNotFound(f"{full[0]!r} not found", argv=full) from exc
        log.debug("slurm call n=%d rc=%d", self._calls, proc.returncode)
        return proc.returncode

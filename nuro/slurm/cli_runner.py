"""Running Slurm's client commands: argument lists (never a shell), an explicit timeout, typed errors.

Why a room of its own: every read and every write of the CLI backend goes through ``CliRunner.run``, and so do the
admin paths that drive ``sacctmgr`` (``nuro.policy.sacctmgr``); they need the runner, not the reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import TypeVar

from nuro import names
from nuro.slurm.errors import (
    InvalidJobId,
    SlurmCommandNotFound,
    SlurmConfigMissing,
    SlurmError,
    SlurmTimeout,
    classify_error,
)

log = logging.getLogger(__name__)

#: The shortest limit ``call_timeout`` sets: starting a Slurm command and getting its munge credential take tens of
#: milliseconds before slurmctld is even asked, so a shorter limit would cut calls an idle slurmctld answers.
CALL_TIMEOUT_MIN_S = 0.1


def plain_job_id(job_id: int | str) -> int:
    """A plain job id as an int; anything else (a name, "123_4", "1;rm") is refused before Slurm sees it."""
    text = str(job_id).strip()
    if not names.is_decimal(text):
        raise InvalidJobId(f"not a plain Slurm job id: {str(job_id)[:40]!r}", argv=())
    return int(text)


def is_unknown_option(exc: SlurmError, option: str) -> bool:
    """Whether a Slurm client refused ``option`` as one it does not know (an older Slurm)."""
    text = exc.slurm_message.lower()
    return option in text and ("unrecognized option" in text or "invalid option" in text or "unknown option" in text)


T = TypeVar("T")


def in_daemon_thread(fn: Callable[..., T], *args: object) -> Future[T]:
    """``fn(*args)`` in a daemon thread, its result as a future. Not a thread pool: the interpreter joins a pool's
    workers at exit, so a stopping daemon would wait out a slow Slurm call (up to ``timeout_s``)."""
    future: Future[T] = Future()

    def call() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the result
            future.set_exception(exc)

    threading.Thread(target=call, name=getattr(fn, "__name__", "call"), daemon=True).start()
    return future


class CliRunner:
    """Runs Slurm's client commands with argument lists (never a shell) and an explicit timeout.

    Args:
        env: variables added to ``os.environ`` for every command (e.g. {"SLURM_CONF": ...}); never logged.
        timeout_s: wall-clock limit per command, in seconds; a hung command raises ``SlurmTimeout``.
        bin_dir: directory holding squeue/sinfo/...; None means look them up on PATH.
    """

    def __init__(
        self, env: Mapping[str, str] | None = None, timeout_s: float = 30.0, bin_dir: str | None = None
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"CliBackend timeout_s must be > 0, got {timeout_s}")
        self._env_overrides = dict(env or {})
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir
        self._calls = 0
        self._local = threading.local()  # call_timeout's limit, per thread: other threads keep timeout_s

    # -- running -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def call_timeout(self, seconds: float) -> Iterator[None]:
        before = getattr(self._local, "timeout_s", None)
        self._local.timeout_s = min(self.timeout_s, max(CALL_TIMEOUT_MIN_S, seconds), before or self.timeout_s)
        try:
            yield
        finally:
            self._local.timeout_s = before

    def _resolve(self, argv: Sequence[str]) -> list[str]:
        full = list(argv)
        if self.bin_dir:
            full[0] = os.path.join(self.bin_dir, full[0])
        return full

    def run(
        self, argv: Sequence[str], stdin: str | None = None, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; return the completed process on rc 0, raise the classified error otherwise."""
        full = self._resolve(argv)
        self._calls += 1
        log.debug("slurm call n=%d argv=%s", self._calls, shlex.join(full))
        env = {**os.environ, **self._env_overrides}
        conf = env.get("SLURM_CONF")
        if conf and not os.path.exists(conf):
            raise SlurmConfigMissing(f"SLURM_CONF={conf} does not exist", argv=full)
        start = time.monotonic()
        timeout_s = getattr(self._local, "timeout_s", None) or self.timeout_s
        try:
            proc = subprocess.run(
                full,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                cwd=cwd,
                timeout=timeout_s,
                check=False,
            )
        except FileNotFoundError as exc:
            if cwd is not None and not os.path.isdir(cwd):
                raise SlurmError(f"working directory {cwd!r} does not exist", argv=full) from exc
            raise SlurmCommandNotFound(f"{full[0]!r} not found", argv=full) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmTimeout(f"no answer within timeout_s={timeout_s}", argv=full) from exc
        duration_s = time.monotonic() - start
        log.debug("slurm call n=%d rc=%d duration_s=%.3f", self._calls, proc.returncode, duration_s)
        if proc.returncode != 0:
            raise classify_error(full, proc.returncode, proc.stderr or proc.stdout)
        return proc

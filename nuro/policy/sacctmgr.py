"""Apply a policy ``Plan``: run its sacctmgr commands one by one, verify, and install the job_submit policy table.

The edge of the pure planner: ``nuro.policy.plan.build_plan`` decides, this module executes. Commands run
through ``CliRunner.run`` (argument lists, never a shell, an explicit timeout, typed errors) and in plan order; the
first failure stops the run, because later commands depend on earlier ones (an association names a QOS added before
it). Nothing is retried: a half-applied plan is safe to re-plan, since the next ``build_plan`` starts from what
slurmdbd then holds.

sacctmgr 22.05 quirks handled here:

* Some refusals exit 0: ``modify user ... set QOS=<list without the DefaultQOS>`` prints "These associations don't
  have access to their default qos" on stderr, returns 0 and changes nothing. So a command that prints anything on
  stderr counts as failed, and after the last command ``verify`` re-reads the state and re-plans: a non-empty plan
  means Slurm did not do what it said.
* Descriptions and organizations come back lower-cased (handled when reading, ``nuro.policy.slurm_state``).
"""

from __future__ import annotations

import logging
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from nuro.policy.model import Policy
from nuro.policy.plan import Change, Plan, build_plan
from nuro.policy.slurm_state import read_state
from nuro.safeio import atomic
from nuro.slurm import CliReads, CliRunner
from nuro.slurm.errors import SlurmError

log = logging.getLogger(__name__)

#: File name of the generated job_submit policy table; job_submit.lua (beside slurm.conf) reads it with dofile().
LUA_TABLE_NAME = "nuro_policy.lua"
#: Slurm's compiled-in default when SLURM_CONF is unset (Debian's packages).
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"


@dataclass(frozen=True)
class ApplyResult:
    """What ran. ``failed``/``error`` are set when a command failed; ``applied`` are the ones that succeeded before."""

    applied: tuple[Change, ...]
    failed: Change | None = None
    error: SlurmError | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.failed is None

    def to_dict(self) -> dict:
        out: dict = {"ok": self.ok, "applied": [c.to_dict() for c in self.applied],
                     "duration_s": round(self.duration_s, 3)}  # fmt: skip
        if self.failed is not None:
            out["failed"] = self.failed.to_dict()
            out["error"] = self.error.slurm_message or self.error.message if self.error else ""
        return out


def apply_plan(plan: Plan, backend: CliRunner) -> ApplyResult:
    """Run the plan's commands in order; stop at the first failure (see the module docstring for what counts).

    Each command gets the backend's ``timeout_s``. Never raises for a Slurm failure: the result carries it.
    """
    applied: list[Change] = []
    start = time.monotonic()
    for n, change in enumerate(plan.changes, start=1):
        log.info("policy apply step=%d/%d argv=%s", n, len(plan.changes), shlex.join(change.argv))
        try:
            proc = backend.run(change.argv)
        except SlurmError as exc:
            log.info("policy apply failed step=%d error=%s", n, exc.slurm_message or exc.message)
            return ApplyResult(tuple(applied), change, exc, time.monotonic() - start)
        stderr = proc.stderr.strip()
        if stderr:
            exc = SlurmError(stderr, argv=change.argv, returncode=proc.returncode, slurm_message=stderr)
            log.info("policy apply refused with rc=0 step=%d stderr=%s", n, stderr)
            return ApplyResult(tuple(applied), change, exc, time.monotonic() - start)
        applied.append(change)
    return ApplyResult(tuple(applied), duration_s=time.monotonic() - start)


def verify(policy: Policy, backend: CliReads, prune: bool) -> Plan:
    """Re-read slurmdbd and re-plan: the returned plan is empty when Slurm now matches the policy."""
    return build_plan(policy, read_state(backend), prune=prune)


def lua_table_path(slurm_conf: str | None = None) -> Path:
    """``nuro_policy.lua`` in the directory of ``slurm_conf`` (default: $SLURM_CONF, else Slurm's default path),
    which is where job_submit.lua lives."""
    conf = slurm_conf or os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF
    return Path(conf).resolve().parent / LUA_TABLE_NAME


def read_text_or_none(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never a partial one.

    slurmctld dofile()s the table on every submission; a temp file in the same directory, fsynced, then
    ``os.replace`` (atomic on one filesystem) and an fsync of the directory (so the rename survives a crash).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_atomic(path, text, mode)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


__all__ = [
    "LUA_TABLE_NAME",
    "ApplyResult",
    "apply_plan",
    "lua_table_path",
    "read_text_or_none",
    "verify",
    "write_atomic",
]

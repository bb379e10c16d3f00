"""Clear slurmd's job-state cache left from before a host crash, so a job that comes back to the host gets its prolog.

Why: slurmd runs the prolog for a job only the first time it sees the job id (``first_job_run =
!cred_jobid_cached(job_id)``, ``src/slurmd/slurmd/req.c`` in 22.05 through 26.05). An entry is forgotten only
``cred_expire`` seconds after the job's terminate message reaches the node. A host that crashed while running a job
never gets that message, and slurmd saves its cache to ``<SlurmdSpoolDir>/cred_state`` and reloads it at start
with no limit for such entries. So after the reboot, the host skips the prolog for every later attempt of that job
(found in the goodput soak on 22.05: the revived node ran the requeued job's new attempt with no prolog, the
root-written job record still named the old attempt, and the epilog refused its checkpoint uploads). 25.11+ key
entries by a per-attempt id, but entries read from an older file still match by job id.

What: before slurmd starts (systemd ``ExecStartPre`` of the compute role's drop-in, or the dev cluster's revive of
a crashed node), remove the spool's ``cred_state`` files written before the host booted. Such state cannot
belong to a running step (no slurmstepd survives a reboot), and its credentials are long expired (a reboot takes
longer than ``cred_expire``). A plain restart of slurmd on a running host keeps the file (it is newer than the
boot), so running jobs and Slurm's replay protection are untouched.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

log = logging.getLogger(__name__)

#: the file slurmd reloads at start, and the copies it rotates through when it saves
CRED_STATE_FILES = ("cred_state", "cred_state.old", "cred_state.new")


def boot_time(stat_path: Path = Path("/proc/stat")) -> float:
    """When this host booted (Unix seconds), from the kernel's ``btime``."""
    for line in stat_path.read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError(f"{stat_path} has no btime line")


def stale_files(spool: Path, booted_at: float) -> list[Path]:
    """The job-state files in ``spool`` last written before ``booted_at``."""
    out = []
    for name in CRED_STATE_FILES:
        path = spool / name
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if st.st_mtime < booted_at:
            out.append(path)
    return out


def clear_stale(spool: Path, booted_at: float) -> list[Path]:
    """Remove the job-state files written before ``booted_at``; returns those removed. ``unlink`` never follows a
    link, and the spool is root's (or SlurmUser's), never a job's."""
    removed = []
    for path in stale_files(spool, booted_at):
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    if removed:
        log.warning("removed slurmd job-state files from before the boot (%s): %s",
                    int(booted_at), ", ".join(p.name for p in removed))  # fmt: skip
    return removed


def main(argv: list[str] | None = None) -> int:
    """``python -m nuro.healthcheck.slurmdspool --spool DIR``: slurmd's ``ExecStartPre``. Never fails slurmd's
    start over this clean-up: a problem is logged and the exit status is 0."""
    p = argparse.ArgumentParser(prog="nuro-slurmd-prestart", description=__doc__.split("\n\n")[0])
    p.add_argument("--spool", type=Path, required=True, help="SlurmdSpoolDir of this host")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        removed = clear_stale(args.spool, boot_time())
    except (OSError, ValueError) as exc:
        log.error("could not clear slurmd's stale job state in %s: %s", args.spool, exc)
        return 0
    for path in removed:
        print(f"removed {path} (written before this boot)")
    return 0


__all__ = ["CRED_STATE_FILES", "boot_time", "clear_stale", "main", "stale_files"]

if __name__ == "__main__":
    sys.exit(main())

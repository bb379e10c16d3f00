"""The dataset prefetch's lifetime: it ends with the job on its node, never later (issue 30).

Design. The prolog (``PrologFlags=Alloc``) runs before slurmstepd creates any of the job's cgroups, so the process
it starts (``nuro.datasets.prefetch``, as the job's user, in a session of its own) cannot be born inside them, and
Slurm's proctrack cannot see it. Two things therefore bound it:

1. **It joins the job's cgroups itself** as soon as the job's first step exists on the node: the prolog passes the
   job's cgroup v1 dirs (``--cgroup``, ``<CgroupMountpoint>/<controller>/slurm_<node>/uid_<uid>/job_<id>``; the
   mountpoint from ``NURO_CGROUP_MOUNTPOINT``, default ``/sys/fs/cgroup``) and the prefetch moves itself into that
   job's step cgroup (``step_batch``, ``step_extern`` or ``step_0``: Slurm makes step dirs the job user's own, the job
   dir root's), so from then on it counts against the job's memory limit and Slurm's proctrack kills it with the
   step. Where no such dir appears (cgroup v2, another layout, a job that ends first) it stays where it is.
2. **The epilog kills it** by the pid the prolog recorded in a root-owned file (``<staging root>/.prefetch/<job>.json``,
   dir root 0700), after checking, through a pidfd, that the pid is still that process (same start time in
   ``/proc/<pid>/stat`` and same uid): a recycled pid is never signalled. Its session (= process group, it is the
   session leader) gets SIGTERM, then SIGKILL after a short grace.

Either alone suffices for the honest prefetch; together they cover a job that ends before its first step and a node
without cgroup v1. Its own ``--timeout-s`` is the third bound. Nothing here trusts a file the job's user can write:
the record is root's, and /proc is the kernel's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import stat
import time
from pathlib import Path

from nuro.safeio import safefs

log = logging.getLogger("nuro.prefetchguard")

DIR = ".prefetch"
#: SIGTERM, then this long before SIGKILL (the prefetch stops at a shard boundary on SIGTERM)
GRACE_S = 2.0
#: ``NURO_CGROUP_MOUNTPOINT``: cgroup.conf's ``CgroupMountpoint`` (the dev cluster's is under its state dir)
ENV_CGROUP_MOUNTPOINT = "NURO_CGROUP_MOUNTPOINT"
#: The v1 controllers whose job dir the prefetch joins: freezer (Slurm's proctrack), memory (the job's limit), cpuacct
CGROUP_CONTROLLERS = ("freezer", "memory", "cpuacct")


def job_cgroups(mountpoint: str | os.PathLike[str], node: str, uid: int, job_id: int) -> list[str]:
    """The job's cgroup v1 dirs on this node, as Slurm's cgroup/v1 plugin names them (multiple-slurmd builds: a
    ``slurm_<node>`` level; others: ``slurm``). Only those whose node-level dir exists now."""
    out = []
    for controller in CGROUP_CONTROLLERS:
        for top in (f"slurm_{node}", "slurm"):
            base = Path(mountpoint) / controller / top
            if base.is_dir():
                out.append(str(base / f"uid_{uid}" / f"job_{job_id}"))
                break
    return out


def proc_identity(pid: int) -> tuple[int, int] | None:
    """(start time in clock ticks since boot, real uid) of ``pid`` from /proc, or None when it is gone (a zombie
    counts as gone: it runs nothing, and its parent, not us, reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()  # after the command name, which may hold anything
        if fields[0] in (b"Z", b"X"):
            return None
        start = int(fields[19])  # field 22 of proc(5); fields[0] is field 3
        return start, os.stat(f"/proc/{pid}").st_uid
    except (OSError, IndexError, ValueError):
        return None


def _dir(root: Path, *, create: bool) -> int:
    root_fd = safefs.open_dir(root)
    try:
        if not create:
            return safefs.open_dir(DIR, dir_fd=root_fd)
        fd = safefs.mkdir_at(root_fd, DIR, 0o700)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(fd)
            raise PermissionError(f"{root / DIR} is not ours alone (uid {st.st_uid}, mode {st.st_mode:o})")
        return fd
    finally:
        os.close(root_fd)


def record(root: Path, job_id: int, pid: int) -> None:
    """Remember the prefetch ``pid`` of ``job_id`` with its identity (the epilog's ``stop`` checks it)."""
    ident = proc_identity(pid)
    if ident is None:  # it ended already (nothing to fetch, or a fast failure): nothing to stop later
        return
    body = json.dumps({"pid": pid, "start": ident[0], "uid": ident[1]}).encode()
    fd = _dir(root, create=True)
    try:
        safefs.write_atomic_at(fd, f"{int(job_id)}.json", body, 0o600)
    finally:
        os.close(fd)


def stop(root: Path, job_id: int | str, grace_s: float = GRACE_S) -> str:
    """End the job's prefetch if it still runs; returns what happened (for the epilog's log). The record goes."""
    name = f"{int(job_id)}.json"
    try:
        fd = _dir(root, create=False)
    except FileNotFoundError:
        return "none"
    try:
        try:
            rec = json.loads(safefs.read_regular(fd, name, 4096))
            pid, start, uid = int(rec["pid"]), int(rec["start"]), int(rec["uid"])
        except FileNotFoundError:
            return "none"
        except (ValueError, KeyError, TypeError) as exc:
            safefs.remove_at(fd, name)
            return f"unreadable record ({exc})"
        outcome = _kill(pid, start, uid, grace_s)
        safefs.remove_at(fd, name)
        return outcome
    finally:
        os.close(fd)


def _kill(pid: int, start: int, uid: int, grace_s: float) -> str:
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return "ended by itself"
    try:
        if proc_identity(pid) != (start, uid):  # checked after the pidfd pins the process: no race with reuse
            return f"pid {pid} is another process now: left alone"
        try:
            os.killpg(pid, signal.SIGTERM)  # its session: the prefetch leads it (start_new_session)
        except ProcessLookupError:
            signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc_identity(pid) != (start, uid):
                return "stopped (SIGTERM)"
            time.sleep(0.05)
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        return "killed (SIGKILL)"
    except ProcessLookupError:
        return "stopped (SIGTERM)"
    finally:
        os.close(pidfd)

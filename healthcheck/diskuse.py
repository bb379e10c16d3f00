"""How much of the staging disk each running job holds, measured as root without following a path.

Why: a staging disk that a job filled is that job's fault, not the node's (issue 11, deliverable 7). The health
check (``nuro-healthcheck`` and the node agent) asks this module only when free space is already below the floor,
so the cost is paid when it matters. A job can write anywhere its user may on that file system, not only in its
own staging dir (``/tmp`` on the same disk, the node cache, a file it unlinked but holds open), so the whole file
system is attributed (issue 30, item 4):

- bytes below ``<staging root>/<job id>`` of a running job are that job's (whoever owns the files); below the dir
  of a job that is not running (ended, handed off to the agent) nobody's: in transit, not a job to fail;
- everything else on the staging file system (the walk starts at the staging root, then the rest of the mount)
  is its owner's (``st_uid``), and a uid's bytes count for each running job of that uid (the root-written job
  records, ``nuro.protocol.jobrecord``; we cannot tell which of a user's jobs wrote ``/tmp/x``, and all of them
  are that user's). uid 0 is never a job's;
- files unlinked but still open (``/proc/<pid>/fd``, " (deleted)") on that file system count for their owner too;
- a walk cut short (a directory deeper than ``MAX_OPEN_DIRS``, one with more than ``MAX_DIR_ENTRIES`` entries, or
  the entry/time budget spent) is an **upper bound** for whoever made the cut: the space the walk could not see
  (used blocks of the file system minus what it saw) is added to the job or uid owning the cut directories
  (``JobDiskUse.upper_bound``). So a deep tree or an entry flood costs the job that made it, never "node problem";
  a cut the budget made (weaker evidence than a tree too deep or too wide) counts only when no tree was.

What it measures is hostile input (the job owns its dir and everything in it), so:

- directories are entered through ``O_DIRECTORY|O_NOFOLLOW`` fds relative to their parent's fd (``os.scandir(fd)``
  and ``fstatat(..., AT_SYMLINK_NOFOLLOW)``): a symlink counts as the few bytes it is, never as what it points to;
  a directory swapped for a symlink between listing and opening is skipped;
- iterative, at most ``MAX_OPEN_DIRS`` directories open at once, the current path (deeper subtrees are left out),
  at most ``MAX_DIR_ENTRIES`` entries read of one directory, ``max_entries`` entries and ``time_budget_s`` seconds
  in all: a job with millions of files or a 100 000-level tree gets an upper bound, never a hung or crashed check;
- other file systems mounted below (``/proc`` under ``/``, a mount in a job dir) are not entered;
- space is ``st_blocks * 512`` (what the file really takes: a sparse 1 TB file holds nothing), and an inode seen
  twice (hard links) is counted once.

A job counts as running on this node when its root-owned record (``nuro.protocol.jobrecord``, written by the prolog and
removed by the epilog) exists: a local, root-owned fact, no Slurm call needed every second.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from nuro.checkpoint import layout as L
from nuro.healthcheck.checks import JobDiskUse
from nuro.protocol import jobrecord

log = logging.getLogger("nuro.healthcheck.diskuse")

MAX_OPEN_DIRS = 32
MAX_DIR_ENTRIES = 20_000  # one directory with more is a flood: its owner is cut (upper bound), the walk goes on
DEFAULT_MAX_ENTRIES = 200_000
DEFAULT_TIME_BUDGET_S = 2.0
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _Budget:
    def __init__(self, max_entries: int, time_budget_s: float, clock: Callable[[], float]) -> None:
        self.left = max_entries
        self.clock = clock
        self.deadline = clock() + time_budget_s

    def spend(self) -> bool:
        self.left -= 1
        return self.left >= 0 and self.clock() < self.deadline


def _open_dir_at(parent_fd: int, name: str) -> int | None:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:  # swapped for a symlink (ELOOP/ENOTDIR), vanished, unreadable: not entered
        return None


#: Whose the bytes of a subtree are: a running job's (its id), nobody's (None: an ended job's dir), or each file's
#: owner's ("uid").
Bucket = int | None | Literal["uid"]


@dataclass
class _Tally:
    """What the walk saw: bytes by running job (own dirs) and by owner uid (everywhere else), and who made cuts."""

    dev: int
    jobs: Counter[int] = field(default_factory=Counter)
    uids: Counter[int] = field(default_factory=Counter)
    seen_bytes: int = 0
    cut_jobs: set[int] = field(default_factory=set)  # a tree too deep or too wide: strong evidence
    cut_uids: set[int] = field(default_factory=set)
    stopped_jobs: set[int] = field(default_factory=set)  # on the path when the budget ran out: weak evidence
    stopped_uids: set[int] = field(default_factory=set)
    complete: bool = True

    def add(self, bucket: Bucket, st: os.stat_result) -> None:
        n = st.st_blocks * 512
        self.seen_bytes += n
        if bucket == "uid":
            self.uids[st.st_uid] += n
        elif bucket is not None:
            self.jobs[bucket] += n

    def cut(self, bucket: Bucket, st: os.stat_result, strong: bool = True) -> None:
        self.complete = False
        if bucket == "uid":
            (self.cut_uids if strong else self.stopped_uids).add(st.st_uid)
        elif bucket is not None:
            (self.cut_jobs if strong else self.stopped_jobs).add(bucket)


@dataclass
class _Frame:
    """One open directory of the walk's current path."""

    fd: int
    st: os.stat_result
    it: Iterator[os.DirEntry[str]]
    read: int = 0


def _walk(
    parent_fd: int, name: str, bucket: Bucket, budget: _Budget, seen: set[tuple[int, int]], tally: _Tally
) -> bool:
    """Count ``name`` in ``parent_fd`` and everything below it on ``tally.dev`` into ``bucket``; False when the
    budget ran out (the caller stops walking).

    Depth first with an explicit stack of (dir fd, its stat, its scandir iterator, entries read): the open fds are
    the current path from ``name`` down, at most ``MAX_OPEN_DIRS``; a directory deeper than that, or one with more
    than ``MAX_DIR_ENTRIES`` entries, is counted itself (and what was read of it) and cut (``_Tally.cut``)."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return True
    if (st.st_dev, st.st_ino) in seen or st.st_dev != tally.dev:
        return True  # counted already (a hard link, the staging root met again), or another file system
    seen.add((st.st_dev, st.st_ino))
    tally.add(bucket, st)
    if not stat.S_ISDIR(st.st_mode):
        return True
    top = _open_dir_at(parent_fd, name)
    if top is None:
        tally.cut(bucket, st)  # a directory root cannot open (swapped for a symlink meanwhile): not seen inside
        return True
    stack: list[_Frame] = []
    try:
        stack.append(_Frame(top, st, os.scandir(top)))
    except OSError:
        os.close(top)
        tally.cut(bucket, st)
        return True
    try:
        while stack:
            frame = stack[-1]
            try:
                entry = next(frame.it, None) if frame.read < MAX_DIR_ENTRIES else None
            except OSError:
                entry = None
                tally.cut(bucket, frame.st)
            if entry is None:
                if frame.read >= MAX_DIR_ENTRIES:
                    tally.cut(bucket, frame.st)  # a flood: what was read counts, the rest is the owner's bound
                stack.pop()
                frame.it.close()  # type: ignore[attr-defined]
                os.close(frame.fd)
                continue
            frame.read += 1
            if not budget.spend():
                for f in stack:
                    tally.cut(bucket, f.st, strong=False)
                return False
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            key = (est.st_dev, est.st_ino)
            if key in seen or est.st_dev != tally.dev:
                continue
            seen.add(key)
            tally.add(bucket, est)
            if not stat.S_ISDIR(est.st_mode):
                continue
            if len(stack) >= MAX_OPEN_DIRS:
                tally.cut(bucket, est)
                continue
            sub = _open_dir_at(frame.fd, entry.name)
            if sub is None:
                tally.cut(bucket, est)
                continue
            try:
                stack.append(_Frame(sub, est, os.scandir(sub)))
            except OSError:
                os.close(sub)
                tally.cut(bucket, est)
    finally:
        for f in stack:
            f.it.close()  # type: ignore[attr-defined]
            os.close(f.fd)
    return True


def tree_usage(parent_fd: int, name: str, budget: _Budget, seen: set[tuple[int, int]]) -> tuple[int, bool]:
    """Bytes held by ``name`` in ``parent_fd`` and everything below it on its file system; (bytes, complete)."""
    try:
        dev = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_dev
    except OSError:
        return 0, True
    tally = _Tally(dev)
    _walk(parent_fd, name, 0, budget, seen, tally)
    return tally.jobs[0], tally.complete


def _handed_off(root_fd: int, name: str) -> bool:
    """The job ended and its epilog handed its uploads to the node agent (root's marker, ``nuro.checkpoint.handoff``):
    the space it holds is in transit, not a running job's to be failed for; a disk full of it is the node's."""
    try:
        os.stat(f"{L.HANDOFF_DIR}/{name}", dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def _job_name(name: str) -> bool:
    return name.isdigit() and not name.startswith("0") and len(name) <= 10


def _running_jobs(staging_root: Path, root_fd: int) -> dict[int, int]:
    """job id -> uid of every job with a valid root-written record on this node that has not been handed off.
    Found from the records (``.jobs/<id>.json``), not the job dirs: a job may write only outside its dir."""
    try:
        jobs_fd = os.open(jobrecord.DIR, DIR_FLAGS, dir_fd=root_fd)
    except OSError:
        return {}
    try:
        names = os.listdir(jobs_fd)[:DEFAULT_MAX_ENTRIES]
    finally:
        os.close(jobs_fd)
    out: dict[int, int] = {}
    for n in sorted(names):
        job = n.removesuffix(".json")
        if not n.endswith(".json") or not _job_name(job) or _handed_off(root_fd, job):
            continue  # ended: the node agent is committing what it left, no job to fail for it
        try:
            rec = jobrecord.read(staging_root, job)
        except Exception as exc:  # noqa: BLE001 - a bad record is not a running job we may cancel
            log.warning("job=%s record unreadable, it is not counted: %s", job, exc)
            continue
        if rec is not None:
            out[int(job)] = rec.uid
    return out


def _mount_root(path: Path, dev: int) -> Path:
    """The top of the file system that holds ``path`` (the admin-configured staging root, root-owned above)."""
    here = Path(os.path.realpath(path))  # the admin's path: its symlinks (``/var`` -> ...) are root's own
    while here != here.parent:
        try:
            if os.stat(here.parent, follow_symlinks=False).st_dev != dev:
                break
        except OSError:
            break
        here = here.parent
    return here


def _open_deleted(dev: int, budget: _Budget, seen: set[tuple[int, int]], tally: _Tally, proc: str) -> None:
    """Files on ``dev`` that were unlinked but are still open (the space is used, no walk can see it): each counts
    for its owner. Read through ``/proc/<pid>/fd/<n>`` (root's view of the open file, whatever its name was)."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue
        for n in fds:
            if not budget.spend():
                tally.complete = False
                return
            link = f"{proc}/{pid}/fd/{n}"
            try:
                if not os.readlink(link).endswith(" (deleted)"):
                    continue
                st = os.stat(link)  # the open file itself (a magic link: there is no path to swap)
            except OSError:
                continue
            if st.st_dev == dev and stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                tally.add("uid", st)


def running_job_usage(
    staging_root: Path,
    *,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
    proc: str = "/proc",
) -> list[JobDiskUse]:
    """Space of the staging file system each job with a record on this node holds (module docstring), largest
    first: its own dir, plus what its user owns elsewhere on that file system, plus (``upper_bound``) what the walk
    could not see when the cut was its doing.

    A missing root means no jobs; a job dir that is not a directory (a symlink a job left) holds only itself.
    """
    try:
        root_fd = os.open(staging_root, DIR_FLAGS)
    except FileNotFoundError:
        return []
    budget = _Budget(max_entries, time_budget_s, clock)
    seen: set[tuple[int, int]] = set()
    try:
        root_st = os.fstat(root_fd)
        running = _running_jobs(staging_root, root_fd)
        if not running:
            return []
        tally = _Tally(root_st.st_dev)
        seen.add((root_st.st_dev, root_st.st_ino))
        tally.add("uid", root_st)
        going = True
        for name in sorted(os.listdir(root_fd)):  # the staging root first: where jobs are meant to write
            bucket: Bucket = "uid"
            if _job_name(name):
                bucket = int(name) if int(name) in running else None
            if not (going := _walk(root_fd, name, bucket, budget, seen, tally)):
                break
        if going:  # then the rest of the file system (its /tmp, anything a job's user may write)
            try:
                top_fd = os.open(_mount_root(staging_root, root_st.st_dev), DIR_FLAGS)
            except OSError as exc:
                log.warning("staging file system above %s not walked: %s", staging_root, exc)
            else:
                try:
                    going = _walk(top_fd, ".", "uid", budget, seen, tally)
                finally:
                    os.close(top_fd)
        if going:
            _open_deleted(root_st.st_dev, budget, seen, tally, proc)
        vfs = os.fstatvfs(root_fd)
    finally:
        os.close(root_fd)
    unseen = max(0, (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize - tally.seen_bytes) if not tally.complete else 0
    cut_jobs, cut_uids = tally.cut_jobs, tally.cut_uids
    if not cut_jobs and not (cut_uids - {0}):  # no tree too deep or wide: blame whoever the budget stopped in
        cut_jobs, cut_uids = tally.stopped_jobs, tally.stopped_uids
    out: list[JobDiskUse] = []
    for job, uid in running.items():
        theirs = uid != 0
        used = tally.jobs[job] + (tally.uids[uid] if theirs else 0)
        cut = job in cut_jobs or (theirs and uid in cut_uids)
        out.append(JobDiskUse(job, used + (unseen if cut else 0), not cut, upper_bound=cut and unseen > 0))
    out.sort(key=lambda u: (-u.bytes, u.job_id))
    return out

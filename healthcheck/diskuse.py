"""How much of the staging disk each running job's staging dir holds, measured as root without following a path.

Why: a staging disk that a job filled is that job's fault, not the node's (issue 11, deliverable 7). The health
check (``nuro-healthcheck`` and the node agent) asks this module only when free space is already below the floor,
so the cost is paid when it matters. What it measures is hostile input (the job owns its dir and everything in it),
so:

- directories are entered through ``O_DIRECTORY|O_NOFOLLOW`` fds relative to their parent's fd (``os.scandir(fd)``
  and ``fstatat(..., AT_SYMLINK_NOFOLLOW)``): a symlink counts as the few bytes it is, never as what it points to;
  a directory swapped for a symlink between listing and opening is skipped;
- iterative, at most ``MAX_OPEN_DIRS`` directories open at once, the current path (deeper subtrees are left out,
  and the result is marked incomplete), at most ``max_entries`` entries and ``time_budget_s`` seconds in all: a
  job with millions of files or a 100 000-level tree gets a lower bound, never a hung or crashed health check;
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
from collections.abc import Callable, Iterator
from pathlib import Path

from nuro.checkpoint import layout as L
from nuro.healthcheck.checks import JobDiskUse
from nuro.protocol import jobrecord

log = logging.getLogger("nuro.healthcheck.diskuse")

MAX_OPEN_DIRS = 32
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


def tree_usage(parent_fd: int, name: str, budget: _Budget, seen: set[tuple[int, int]]) -> tuple[int, bool]:
    """Bytes held by ``name`` in ``parent_fd`` and everything below it; (bytes, complete).

    Depth first with an explicit stack of (dir fd, its scandir iterator): the open fds are the current path from
    ``name`` down, at most ``MAX_OPEN_DIRS``; a directory deeper than that is counted itself but not entered."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return 0, True
    total = st.st_blocks * 512
    seen.add((st.st_dev, st.st_ino))
    if not stat.S_ISDIR(st.st_mode):
        return total, True
    top = _open_dir_at(parent_fd, name)
    if top is None:
        return total, False
    complete = True
    stack: list[tuple[int, Iterator[os.DirEntry[str]]]] = []
    try:
        stack.append((top, os.scandir(top)))
    except OSError:
        os.close(top)
        return total, False
    try:
        while stack:
            fd, it = stack[-1]
            try:
                entry = next(it, None)
            except OSError:
                entry, complete = None, False
            if entry is None:
                stack.pop()
                it.close()  # type: ignore[attr-defined]
                os.close(fd)
                continue
            if not budget.spend():
                return total, False
            try:
                est = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            key = (est.st_dev, est.st_ino)
            if key in seen:
                continue
            seen.add(key)
            total += est.st_blocks * 512
            if not stat.S_ISDIR(est.st_mode):
                continue
            if len(stack) >= MAX_OPEN_DIRS:
                complete = False
                continue
            sub = _open_dir_at(fd, entry.name)
            if sub is None:
                complete = False
                continue
            try:
                stack.append((sub, os.scandir(sub)))
            except OSError:
                os.close(sub)
                complete = False
    finally:
        for fd, it in stack:
            it.close()  # type: ignore[attr-defined]
            os.close(fd)
    return total, complete


def _handed_off(root_fd: int, name: str) -> bool:
    """The job ended and its epilog handed its uploads to the node agent (root's marker, ``nuro.checkpoint.handoff``):
    the space it holds is in transit, not a running job's to be failed for; a disk full of it is the node's."""
    try:
        os.stat(f"{L.HANDOFF_DIR}/{name}", dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        return False
    return True


def running_job_usage(
    staging_root: Path,
    *,
    max_entries: int = DEFAULT_MAX_ENTRIES,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    clock: Callable[[], float] = time.monotonic,
) -> list[JobDiskUse]:
    """Space held by ``staging_root/<job id>`` of every job with a record on this node, largest first.

    A missing root means no jobs; a job dir that is not a directory (a symlink a job left) holds only itself.
    """
    try:
        root_fd = os.open(staging_root, DIR_FLAGS)
    except FileNotFoundError:
        return []
    budget = _Budget(max_entries, time_budget_s, clock)
    seen: set[tuple[int, int]] = set()
    out: list[JobDiskUse] = []
    try:
        names = sorted(n for n in os.listdir(root_fd) if n.isdigit() and not n.startswith("0") and len(n) <= 10)
        for name in names:
            if _handed_off(root_fd, name):
                continue  # ended: the node agent is committing what it left, no job to fail for it
            try:
                if jobrecord.read(staging_root, name) is None:
                    continue  # not running here (finished, or never started by our prolog)
            except Exception as exc:  # noqa: BLE001 - a bad record is not a running job we may cancel
                log.warning("job=%s record unreadable, its dir is not counted: %s", name, exc)
                continue
            used, complete = tree_usage(root_fd, name, budget, seen)
            out.append(JobDiskUse(int(name), used, complete))
    finally:
        os.close(root_fd)
    out.sort(key=lambda u: (-u.bytes, u.job_id))
    return out

"""The training's process trees, as nuro-launch handles them on both paths (under torchrun, or ``direct``).

Workers run in their own sessions, so a process-group signal misses them: signals are forwarded down the tree
(psutil). Processes that outlive their parent (reparented away, where Slurm's linuxproc tracking no longer sees them)
are remembered while the training runs (psutil keeps each one's start time, so a reused PID is never hit) and killed
once it is over.
"""

from __future__ import annotations

import contextlib
import logging
import os

import psutil

log = logging.getLogger("nuro.launch")


def descendants(pid: int) -> list[psutil.Process]:
    """Every live descendant of ``pid`` (workers run in their own session: a process-group kill misses them)."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def forward(sig: int, root: int, *, include_root: bool) -> list[int]:
    """Send ``sig`` to ``root``'s descendants (and ``root`` itself if asked); returns the PIDs signalled."""
    procs = descendants(root)
    sent = []
    if include_root:
        try:
            os.kill(root, sig)
            sent.append(root)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.send_signal(sig)
            sent.append(p.pid)
        except psutil.NoSuchProcess:
            pass
    return sent


class Leftovers:
    """The descendants seen under some roots while the training ran; ``kill`` ends those still alive after it."""

    def __init__(self) -> None:
        self.seen: dict[int, psutil.Process] = {}

    def remember(self, *roots: int) -> None:
        for root in roots:
            self.seen.update((p.pid, p) for p in descendants(root) if p.pid not in self.seen)

    def kill(self, whose: str) -> list[int]:
        """SIGKILL the remembered processes still running (left behind by ``whose``); their PIDs."""
        left = []
        for p in self.seen.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
                    left.append(p.pid)
        if left:
            log.warning("killed %d process(es) %s left behind: %s", len(left), whose, left)
        return left


__all__ = ["Leftovers", "descendants", "forward"]

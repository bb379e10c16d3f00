"""Process identity and stopping by PID: never by name or pattern.

A PID alone can be reused by an unrelated process after a reboot or a long time, so every PID we record travels
with the process's start time; we signal a PID only while both still match.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass

import psutil

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> None:
    """Adopt our descendants' orphans: slurmd double-forks slurmstepd, and PID 1 on these machines never reaps them
    (measured: zombies piled up). The dev cluster's supervisor and the fixture capture both reap and stop them by
    PID."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` (a daemon's readiness check)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def descendants(proc: psutil.Process) -> list[psutil.Process]:
    """All of ``proc``'s descendants; none once it has gone."""
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@dataclass(frozen=True)
class ProcRef:
    """A process we started: its PID plus its start time (``psutil`` create_time, seconds since epoch)."""

    name: str
    pid: int
    create_time: float

    @classmethod
    def of(cls, name: str, pid: int) -> ProcRef:
        return cls(name=name, pid=pid, create_time=psutil.Process(pid).create_time())

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ProcRef:
        return cls(name=str(data["name"]), pid=int(data["pid"]), create_time=float(data["create_time"]))

    def process(self) -> psutil.Process | None:
        """The live process if this PID is still the one we started (and not a zombie), else None."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.05:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None

    def is_alive(self) -> bool:
        return self.process() is not None


def stop_processes(procs: list[psutil.Process], term_timeout_s: float, what: str) -> list[int]:
    """SIGTERM the given processes, wait up to ``term_timeout_s``, SIGKILL the rest. Returns PIDs killed hard."""
    alive = []
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
            alive.append(proc)
        except psutil.NoSuchProcess:
            continue
    _, still = psutil.wait_procs(alive, timeout=term_timeout_s)
    for proc in still:
        log.warning("%s pid=%d ignored SIGTERM for %.0f s: sending SIGKILL", what, proc.pid, term_timeout_s)
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(still, timeout=5)
    return [p.pid for p in still]


def stop_child(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGTERM a child we started (by its Popen handle, never by pattern), SIGKILL after ``timeout_s``; reaped."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    proc.wait()


def wait_for(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll ``predicate`` until it is true or the deadline passes (monotonic clock)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)

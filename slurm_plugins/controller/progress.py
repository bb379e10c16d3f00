"""What jobs reported through the node agents: each job's newest committed checkpoint and its latest stop ack.

Why here and not in the job comment: the comment is the job's own 1,024 bytes, which its user may fill (issue 30),
so a reclaim that waited for an ack written there could be dodged with one sbatch flag. Node agents carry a job's
progress in their authenticated heartbeats (``nuro.protocol.heartbeat``: ``commits``, ``acks``), learnt as root from
their own upload worker or from the job's rank 0 over the agent's socket (sender uid from the kernel, the job's
root-written record; ``nuro.protocol.peerloss``), and timed by the agent's clock. The heartbeat receiver notes them
here (``note``); each policy cycle takes a frozen copy (``view``) into ``decide``.

Soft state: after a controller restart the agents' next beats bring every running job's newest commit back (they
repeat it while the job runs on their node) and every ack of the last ``ACK_TTL_S``. Memory is bounded: entries
not refreshed for ``FORGET_S`` go, and at most ``MAX_JOBS`` are kept.

A controller that receives the beats also writes the book to ``progress.json`` in its state dir (``ProgressFile``,
at most twice a second, only when it changed), so a policy loop in another process (the dev cluster's tests run the
detector and the policy as two daemons) reads the same progress. Production runs both loops in one process and
reads the book directly.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from nuro.safeio.safefs import write_private

log = logging.getLogger(__name__)

#: A job's entry is forgotten when no beat mentioned it for this long (its nodes' agents repeat it every beat).
FORGET_S = 600.0
MAX_JOBS = 100_000


@dataclass(frozen=True)
class Progress:
    """One job's progress as the agents reported it; times are Unix seconds (the reporting agent's clock; a commit's
    is when its checkpoint was taken, never later than the agent learnt of it).

    ``nodes``: the nodes whose agents reported it; ``by_node``: each node's own report, so that the engine believes
    only the reports of nodes the job runs on (``restricted_to``): a node's key speaks for its own jobs only, so a
    node that reports another node's job (a compromised root, a bug) changes nothing of it."""

    commit_step: int | None = None
    commit_at: float | None = None
    ack_step: int | None = None
    ack_at: float | None = None
    nodes: frozenset[str] = frozenset()
    by_node: tuple[Progress, ...] = ()

    def restricted_to(self, nodes: Iterable[str]) -> Progress | None:
        """What the job's own nodes reported (None: nothing)."""
        wanted = set(nodes)
        if not self.by_node:
            return self if self.nodes & wanted else None
        return merged([p for p in self.by_node if p.nodes & wanted])

    def acked_since(self, t: float) -> bool:
        """An explicit ack at or after ``t`` (when the controller signalled, whole seconds), or a commit of a
        checkpoint *taken* after it (``commit_at`` is when the checkpoint was made, its request's creation: a save
        already under way at the signal, committing just after it, is not the one the signal asked for, and
        requeueing on it would cut the job's own stop checkpoint half-written). Strictly later, since a checkpoint
        taken in the signal's own second may predate it."""
        return (self.ack_at is not None and self.ack_at >= t) or (self.commit_at is not None and self.commit_at > t)


EMPTY: Mapping[int, Progress] = MappingProxyType({})


def merged(reports: Iterable[Progress]) -> Progress | None:
    """One view of several nodes' reports: the newest step committed (its earliest report), the latest ack."""
    reports = list(reports)
    if not reports:
        return None
    commits = [p for p in reports if p.commit_step is not None]
    acks = [p for p in reports if p.ack_at is not None]
    c = min(commits, key=lambda p: (-p.commit_step, p.commit_at)) if commits else None  # type: ignore[operator]
    a = max(acks, key=lambda p: p.ack_at) if acks else None  # type: ignore[arg-type,return-value]
    nodes = frozenset().union(*(p.nodes for p in reports))
    return Progress(c.commit_step if c else None, c.commit_at if c else None, a.ack_step if a else None,
                    a.ack_at if a else None, nodes, tuple(reports))  # fmt: skip


class ProgressBook:
    """Thread-safe: the receiver's thread notes, the policy loop reads ``view()``."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._jobs: dict[int, tuple[dict[str, Progress], float]] = {}  # job -> (node -> its report, last mentioned)
        self.version = 0  # bumped by every change (``ProgressFile.publish`` writes only a new version)

    def note(self, node: str, commits: Iterable[tuple[int, int, int]], acks: Iterable[tuple[int, int, int]]) -> None:
        """One beat's ``commits`` and ``acks`` from ``node``'s agent (kept per node: ``Progress.restricted_to``)."""
        now = self.monotonic()
        with self._lock:
            for job, step, at in commits:
                nodes, _ = self._jobs.get(job, ({}, now))
                p = nodes.get(node, Progress(nodes=frozenset({node})))
                if p.commit_step is None or step > p.commit_step:
                    nodes[node] = Progress(step, float(at), p.ack_step, p.ack_at, p.nodes)
                    self.version += 1
                self._jobs[job] = (nodes, now)
            for job, step, at in acks:
                nodes, _ = self._jobs.get(job, ({}, now))
                p = nodes.get(node, Progress(nodes=frozenset({node})))
                if p.ack_at is None or at > p.ack_at:
                    nodes[node] = Progress(p.commit_step, p.commit_at, step, float(at), p.nodes)
                    self.version += 1
                self._jobs[job] = (nodes, now)
            if len(self._jobs) > MAX_JOBS:
                self._forget(now, keep=MAX_JOBS // 2)

    def _forget(self, now: float, keep: int | None = None) -> None:
        for job in [j for j, (_, seen) in self._jobs.items() if now - seen > FORGET_S]:
            del self._jobs[job]
        if keep is not None and len(self._jobs) > keep:
            for job in sorted(self._jobs, key=lambda j: self._jobs[j][1])[: len(self._jobs) - keep]:
                del self._jobs[job]

    def view(self) -> Mapping[int, Progress]:
        """A frozen copy for one cycle (old entries dropped first): per job, all nodes' reports merged, each
        node's own kept in ``by_node``."""
        with self._lock:
            self._forget(self.monotonic())
            return MappingProxyType({j: merged(nodes.values()) for j, (nodes, _) in self._jobs.items()})  # type: ignore[misc]


FILE_NAME = "progress.json"
FORMAT = "nuro.progress/v1"
#: What a reader takes of the file at most (~80 bytes a job).
MAX_FILE_BYTES = 16 << 20


class ProgressFile:
    """``progress.json`` in the controller's state dir: ``publish(book)`` by the process that receives beats,
    ``view()`` by a policy loop without a receiver of its own (re-read only when the file changed)."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.path = self.dir / FILE_NAME
        self._published = -1
        self._read: tuple[int, Mapping[int, Progress]] = (-1, EMPTY)

    def publish(self, book: ProgressBook) -> bool:
        """Write the book when it changed since the last call; True when written. Raises OSError."""
        version = book.version
        if version == self._published:
            return False
        view = book.view()
        body = {
            "format": FORMAT,
            "at": round(time.time()),
            "jobs": {
                str(j): [[min(r.nodes), r.commit_step, r.commit_at, r.ack_step, r.ack_at] for r in p.by_node]
                for j, p in view.items()
            },
        }
        write_private(self.dir, FILE_NAME, json.dumps(body, separators=(",", ":")).encode())
        self._published = version
        return True

    def view(self) -> Mapping[int, Progress]:
        """The published book; EMPTY when there is none, it is older than ``FORGET_S`` or it cannot be read."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return EMPTY
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if time.time() - st.st_mtime > FORGET_S:
                return EMPTY
            if st.st_mtime_ns == self._read[0]:
                return self._read[1]
            raw = fh.read(MAX_FILE_BYTES + 1)
        try:
            if len(raw) > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            obj = json.loads(raw)
            if obj.get("format") != FORMAT:
                raise ValueError(f"format is not {FORMAT}")
            jobs = {
                int(j): m
                for j, reports in obj["jobs"].items()
                if (m := merged(Progress(r[1], r[2], r[3], r[4], frozenset({str(r[0])})) for r in reports))
            }
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            log.warning("progress file %s unreadable: %s", self.path, exc)
            return EMPTY
        self._read = (st.st_mtime_ns, MappingProxyType(jobs))
        return self._read[1]


__all__ = ["EMPTY", "FILE_NAME", "FORGET_S", "MAX_JOBS", "Progress", "ProgressBook", "ProgressFile"]

"""nuro's event log: an append-only JSON Lines file of what the platform did and why (node lost, jobs requeued, …).

Why a file and not a database (architecture principle 1): Slurm stays the record of jobs; this is a journal for
humans and tools (``nuro-train events RUN``) that explains the gaps Slurm's own records leave ("why did my job
restart at 08:12?"). Losing it loses explanations, never state.

Concurrency: every record is one ``write()`` of one line to a descriptor opened with ``O_APPEND``, followed by
``fsync``. POSIX appends are atomic with respect to the file offset, and a line of a few hundred bytes is written
whole on local filesystems, so several processes (controller, agents, tools) may append to the same file without
locks and a reader never sees two records interleaved. A crash can at worst leave a final partial line, which
readers skip.

Schema (one JSON object per line, keys sorted, UTF-8):

| key | type | meaning |
|---|---|---|
| ``ts`` | float | wall-clock Unix seconds when the record was written (always present) |
| ``kind`` | str | what happened (table below; always present) |
| ``source`` | str | who wrote it, e.g. ``controller`` (always present) |
| ``node`` | str | the node concerned, when one is |
| ``jobs`` | list[int] | the jobs concerned, when any (``job`` filters match inside it) |
| other keys | | per kind, below |

Kinds, when each is written, and their extra keys:

- ``node_lost``: a node that used to beat fell silent for miss_limit intervals. ``last_beat`` (Unix s),
  ``last_seq``, ``silent_s``, ``detection_delay_s`` (silence minus one interval: from the first missed beat).
- ``node_flapping``: that loss is its n-th within the flap window. ``hold_s``, ``reason``.
- ``node_down``: scontrol set it DOWN (Slurm requeues its ``--requeue`` jobs). ``reason``, ``ok``, ``error``.
- ``node_drained``: scontrol set it DRAIN. ``reason``, ``ok``, ``error``.
- ``node_unhealthy``: its agent reported ``healthy=false``. ``problems`` (list[str]).
- ``node_straggler``: a job of the node flagged it as a straggler and its own NVML readings agreed (a slowing clock
  reason): drained (``nuro-straggler:``) until its beats show none for a while. ``reason``.
- ``straggler_unconfirmed``: a job's straggler report the controller did not act on (the node is not the job's, or
  its GPUs report no slowing clock reason). ``jobs`` ([job]), ``reason``.
- ``node_agent_stopping``: the node's agent said it is stopping on purpose (its last beat); silence is no loss for
  ``quiet_s`` (or until its next beat). ``seq``.
- ``node_resumed``: healthy again and the reason was ours: scontrol RESUME. ``reason`` (the one removed), ``ok``,
  ``error``.
- ``job_preempt_signalled``: the policy cycle signalled a preemption victim (``jobs`` = [victim]). ``for_job``,
  ``gpus``, ``reason``.
- ``job_preempt_requeued``: the victim was requeued, at once on its checkpoint ack or at grace end. ``acked``,
  ``reason``.
- ``jobs_requeued``: right after node_down, the jobs that were running there. ``jobs`` (the ``--requeue`` ones,
  which Slurm requeues), ``not_requeued`` (list[int]: jobs Slurm ends instead).

Example::

    log = EventLog("/var/log/nuro/events.jsonl", source="controller")
    log.append("node_lost", node="gpu003", last_seq=812, silent_s=3.3)
    for ev in read_events("/var/log/nuro/events.jsonl", since=time.time() - 3600, node="gpu003"):
        print(ev["ts"], ev["kind"])
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KINDS = (
    "node_lost",
    "node_flapping",
    "node_down",
    "node_drained",
    "node_unhealthy",
    "node_straggler",
    "straggler_unconfirmed",
    "node_resumed",
    "node_agent_stopping",
    "jobs_requeued",
    "job_preempt_signalled",
    "job_preempt_requeued",
)
MAX_LINE = 64 * 1024  # one record stays far below what a single write() appends whole


class EventLog:
    """Appends records to one JSONL file. Cheap to create; opens the file per append (rotation-safe).

    Args:
        path: the log file; its directory is created if missing.
        source: written into every record as ``source``.
        fsync: flush each record to disk (default); benches may turn it off.
    """

    def __init__(self, path: str | Path, source: str = "controller", fsync: bool = True) -> None:
        self.path = Path(path)
        self.source = source
        self.fsync = fsync

    def append(self, kind: str, ts: float | None = None, **fields: Any) -> dict[str, Any]:
        """Write one record (one line, one write) and return it.

        Raises:
            ValueError: the record is not JSON-serialisable or longer than ``MAX_LINE`` bytes.
            OSError: the file cannot be written (callers log it: an event log never stops the controller).
        """
        record = {"ts": round(time.time() if ts is None else ts, 3), "kind": kind, "source": self.source, **fields}
        line = (json.dumps(record, sort_keys=True, separators=(",", ":"), default=_jsonable) + "\n").encode()
        if len(line) > MAX_LINE:
            raise ValueError(f"event {kind!r} is {len(line)} bytes, over {MAX_LINE}: shorten its fields")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            if written != len(line):  # only on a full disk or a signal mid-write; the reader skips the tail
                raise OSError(f"short write to {self.path}: {written} of {len(line)} bytes")
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return json.loads(line)  # as a reader will see it (tuples become lists)


def _jsonable(value: object) -> object:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON-serialisable in an event: {value!r}")


def read_events(
    path: str | Path,
    since: float | None = None,
    until: float | None = None,
    node: str | None = None,
    job: int | None = None,
    kinds: Iterable[str] | None = None,
) -> Iterator[dict[str, Any]]:
    """Records in file order (= time order per writer), filtered; a missing file yields nothing.

    Args:
        since / until: keep ``since <= ts < until`` (Unix seconds; None = unbounded).
        node: keep records whose ``node`` equals it.
        job: keep records whose ``jobs`` or ``not_requeued`` list holds it, or whose ``job`` equals it.
        kinds: keep only these kinds.

    Lines that are not JSON objects (a torn last line after a crash) are skipped with one debug log.
    """
    wanted = set(kinds) if kinds is not None else None
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; a generator cannot use with across yields cleanly
    except FileNotFoundError:
        return
    with fh:
        for n, raw in enumerate(fh, 1):
            try:
                rec = json.loads(raw)
            except ValueError:
                log.debug("event log %s line %d is not JSON (torn write?): skipped", path, n)
                continue
            if not isinstance(rec, dict) or "ts" not in rec or "kind" not in rec:
                continue
            ts = float(rec["ts"])
            if since is not None and ts < since:
                continue
            if until is not None and ts >= until:
                continue
            if node is not None and rec.get("node") != node:
                continue
            if wanted is not None and rec["kind"] not in wanted:
                continue
            if job is not None and not _mentions_job(rec, job):
                continue
            yield rec


def _mentions_job(rec: dict[str, Any], job: int) -> bool:
    if rec.get("job") == job:
        return True
    return any(job in (rec.get(key) or ()) for key in ("jobs", "not_requeued"))

"""Why a run waits: Slurm's reason, the controller's own decision, and the job's place in the queue (issue 18).

The controller writes, after every cycle, what it decided not to do for each pending job it looked at and why
(``decisions.Wait``: "team perception holds 16/16 borrowed GPUs (its borrow limit)") to one JSON file,
``NURO_CONTROLLER_WAITS`` (atomically: a reader never sees half a file). Readers (``nuro-train status``, the MLflow
bridge) join it with Slurm's own reason. One writer, one parser (``read_waits``), here.

File (``nuro.controller-waits/v1``)::

    {"format": "nuro.controller-waits/v1", "at": 1733330000.5, "jobs": {"42": {"code": "wait_borrow_limit",
     "reason": "team perception holds 16/16 borrowed GPUs (its borrow limit)"}}}

It also carries what the controller heard of each running job's progress from the node agents (issue 30: never from
the job's comment), ``"progress": {"7": {"step": 1200, "at": 1733329990}}``: the newest committed checkpoint, which
``nuro-train status``/``ls`` show (``read_progress``).

The queue position is Slurm's: pending jobs of the same partition by priority (highest first, then the older
submission), the order the main scheduler considers them in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nuro.safeio.atomic import write_atomic
from nuro.slurm import JobInfo, JobPhase

ENV_WAITS = "NURO_CONTROLLER_WAITS"
FORMAT = "nuro.controller-waits/v1"
#: a waits file older than this is stale (the controller stopped): not shown
STALE_S = 60.0
_MAX_BYTES = 8 * 1024 * 1024


def _jobs(waits: Iterable[Any]) -> dict[str, dict[str, str]]:
    return {str(w.job_id): {"code": str(w.code), "reason": str(w.reason)[:500]} for w in waits}


def _progress(progress: Mapping[int, tuple[int | None, float | None]] | None) -> dict[str, dict[str, int]]:
    return {str(j): {"step": int(s), "at": round(a)} for j, (s, a) in (progress or {}).items() if s is not None
            and a is not None}  # fmt: skip


def write_waits(path: Path, at: float, waits: Iterable[Any]) -> None:
    """The controller's side: ``waits`` (``decisions.Wait``) as the file, written atomically (temp + rename)."""
    _write(path, at, _jobs(waits), {})


class WaitsFile:
    """The controller's waits file across cycles: rewritten when the reasons change, else only often enough to stay
    fresh (``REFRESH_S``), so a cycle with 5,000 pending jobs does not rewrite the same file twice a second."""

    REFRESH_S = STALE_S / 3

    def __init__(self, path: Path) -> None:
        self.path = path
        self._jobs: tuple[dict, dict] | None = None
        self._at = 0.0

    def publish(
        self, at: float, waits: Iterable[Any], progress: Mapping[int, tuple[int | None, float | None]] | None = None
    ) -> bool:
        """Write this cycle's reasons (and running jobs' ``progress``: job → (committed step, when)) when they
        changed or the file is getting old; whether it wrote."""
        both = (_jobs(waits), _progress(progress))
        if both == self._jobs and at - self._at < self.REFRESH_S:
            return False
        _write(self.path, at, *both)
        self._jobs, self._at = both, at
        return True


def _write(path: Path, at: float, jobs: Mapping[str, Mapping[str, str]], progress: Mapping[str, Any]) -> None:
    body = {"format": FORMAT, "at": at, "jobs": jobs, "progress": progress}
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)  # /run/nuro after a reboot
    # readable by members (reasons name teams and counts, never data); soft state rewritten every cycle: not durable
    write_atomic(path, json.dumps(body), 0o644, durable=False)


def _read(path: Path | str | None, now: float) -> dict[str, Any]:
    """The file's body when it is readable, well-formed and fresh, else {}."""
    if not path:
        return {}
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_BYTES + 1)
        data = json.loads(raw) if len(raw) <= _MAX_BYTES else None
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("jobs"), dict):
        return {}
    at = data.get("at")
    if not isinstance(at, int | float) or now - at > STALE_S:
        return {}
    return data


def read_progress(path: Path | str | None, now: float) -> dict[int, dict[str, int]]:
    """Running jobs' newest committed checkpoint as the controller heard it (``{"step", "at"}``) by job id."""
    raw = _read(path, now).get("progress")
    out: dict[int, dict[str, int]] = {}
    for key, value in (raw if isinstance(raw, dict) else {}).items():
        if str(key).isdigit() and isinstance(value, dict) and all(type(value.get(k)) is int for k in ("step", "at")):
            out[int(key)] = {"step": value["step"], "at": value["at"]}
    return out


def read_waits(path: Path | str | None, now: float) -> dict[int, dict[str, str]]:
    """The controller's reasons by job id; {} when there is no (readable, well-formed, fresh) file."""
    data = _read(path, now)
    if not data:
        return {}
    out: dict[int, dict[str, str]] = {}
    for key, value in data["jobs"].items():
        if str(key).isdigit() and isinstance(value, dict):
            out[int(key)] = {"code": str(value.get("code", ""))[:64], "reason": str(value.get("reason", ""))[:500]}
    return out


def queue_position(job: JobInfo, jobs: Iterable[JobInfo]) -> tuple[int, int] | None:
    """(position, of how many) among the pending jobs of its partition, by Slurm's priority; None unless pending."""
    if job.phase != JobPhase.PENDING:
        return None
    queue = sorted(
        (j for j in jobs if j.phase == JobPhase.PENDING and j.partition == job.partition),
        key=lambda j: (-j.priority, j.submit_time.timestamp() if j.submit_time else 0.0, j.job_id),
    )
    ids = [j.job_id for j in queue]
    return (ids.index(job.job_id) + 1, len(ids)) if job.job_id in ids else None


def pending_view(job: JobInfo, jobs: Iterable[JobInfo], waits: Mapping[int, Mapping[str, str]]) -> dict[str, Any]:
    """What ``nuro-train status`` and the MLflow tags say about a waiting job ({} when it does not wait)."""
    if job.phase != JobPhase.PENDING:
        return {}
    out: dict[str, Any] = {"slurm_reason": job.reason}
    pos = queue_position(job, jobs)
    if pos is not None:
        out["queue_position"], out["queue_length"] = pos
    if job.job_id in waits:
        out["controller"] = waits[job.job_id]
    return out


__all__ = [
    "ENV_WAITS", "FORMAT", "STALE_S", "WaitsFile", "pending_view", "queue_position", "read_progress", "read_waits",
    "write_waits",
]  # fmt: skip

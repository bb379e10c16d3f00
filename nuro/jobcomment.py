"""nuro's per-job record in the Slurm job comment: compact JSON, the one channel between jobs and the controller.

Slurm is the system of record for jobs (ARCHITECTURE principle 1), so what the controller must know about a running
job lives in the job itself, readable by one ``squeue --json`` and rebuilt from it after a controller restart:

| key | written by | meaning |
|---|---|---|
| ``nuro`` | submit (nuro-train / nuro-sbatch) | run metadata (team, dataset digest, code commit, …) |
| ``ckpt`` | the job (rank 0) after each committed checkpoint | ``{"step": N, "at": unix_s}`` |
| ``preempt`` | the controller, right before it signals a victim | ``{"at": unix_s, "for": job_id, "why": text}`` |
| ``ack`` | the job (rank 0), after the checkpoint a preemption asked for is committed | ``{"step": N, "at": unix_s}`` |

A job owner may update their own job's comment (``scontrol update jobid=$SLURM_JOB_ID comment=...``), which is how
the acknowledgement travels without any new network service. Writers read, merge and write back (``merge``) so
keys written by the other side survive. A forged ack only hurries the forger's own requeue.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_COMMENT_BYTES = 8192  # well below Slurm's limits; nuro metadata is small

#: The signal the controller sends a preemption victim (``scancel --signal=USR1 --full``: the batch shell and every
#: step). USR1 rather than TERM so a plain TERM (scancel, time limit) still means "stop", not "checkpoint".
PREEMPT_SIGNAL = "USR1"


@dataclass(frozen=True)
class Mark:
    """A step and the time it was recorded (Unix seconds)."""

    step: int | None
    at: float


@dataclass(frozen=True)
class PreemptRequest:
    at: float
    for_job: int | None
    why: str


@dataclass(frozen=True)
class JobComment:
    """The parsed comment. Unknown keys are kept in ``raw`` and written back untouched."""

    raw: dict[str, Any]

    @property
    def checkpoint(self) -> Mark | None:
        return _mark(self.raw.get("ckpt"))

    @property
    def ack(self) -> Mark | None:
        return _mark(self.raw.get("ack"))

    @property
    def preempt(self) -> PreemptRequest | None:
        p = self.raw.get("preempt")
        if not isinstance(p, dict) or not _is_num(p.get("at")):
            return None
        for_job = p.get("for")
        return PreemptRequest(
            at=float(p["at"]),
            for_job=int(for_job) if isinstance(for_job, int) else None,
            why=str(p.get("why", "")),
        )

    def acked_since(self, t: float) -> bool:
        """True when the job acknowledged at or after ``t`` (the time it was asked to checkpoint)."""
        ack = self.ack
        return ack is not None and ack.at >= t


def _is_num(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _mark(v: object) -> Mark | None:
    if not isinstance(v, dict) or not _is_num(v.get("at")):
        return None
    step = v.get("step")
    return Mark(step=step if isinstance(step, int) and not isinstance(step, bool) else None, at=float(v["at"]))


def parse(comment: str | None) -> JobComment:
    """Parse a job comment. Anything that is not a JSON object (a plain user comment) yields an empty record."""
    if not comment:
        return JobComment({})
    try:
        data = json.loads(comment)
    except ValueError:
        return JobComment({})
    return JobComment(data if isinstance(data, dict) else {})


def merge(comment: str | None, **updates: Any) -> str:
    """The comment with ``updates`` set (``None`` deletes a key), as compact JSON. Raises if it grows too big."""
    data = dict(parse(comment).raw)
    if comment and not data and comment.strip():
        data = {"user_comment": comment}  # keep a plain-text comment rather than dropping it
    for key, value in updates.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > MAX_COMMENT_BYTES:
        raise ValueError(f"job comment would be {len(text.encode())} bytes, above nuro's {MAX_COMMENT_BYTES}")
    return text

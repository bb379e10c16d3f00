"""A run's lifecycle assembled from the systems of record — pure: the caller reads, this only orders and explains.

Sources (architecture principle 1, nothing of our own to keep in sync):
- Slurm accounting: every attempt of the job (``sacct -D``): submitted, started on which nodes, ended how
  (REQUEUED, COMPLETED, FAILED, NODE_FAIL, ...);
- the controller's event log: node lost (with its last heartbeat), set down, drained, resumed, jobs requeued;
- the run's own events in S3 (``nuro.lifecycle.run_events``): started, restored at step N, first step,
  progress, preempted;
- checkpoint manifests in S3: committed at step N.

``build`` merges them into ``Entry`` rows sorted by time; ``summarize`` measures each failure the way the issue
asks: failure → detection → requeue → restart → first step after resume, and the steps lost. A failure a hot spare
absorbed (``spare_swap`` run event) is a recovery too, ``via`` "spare": no requeue, the swap is its restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from nuro.lifecycle.run_events import RunEvent, node_names, skipped_steps
from nuro.names import is_decimal
from nuro.slurm import JobInfo

_END_KIND = {
    "REQUEUED": "requeued",
    "COMPLETED": "finished",
    "FAILED": "failed",
    "NODE_FAIL": "node_fail",
    "PREEMPTED": "preempted",
    "CANCELLED": "cancelled",
    "TIMEOUT": "timeout",
    "OUT_OF_MEMORY": "failed",
}

NODE_EVENTS = (
    "node_lost",
    "node_down",
    "node_drained",
    "node_unhealthy",
    "node_flapping",
    "node_resumed",
    "node_straggler",
)


@dataclass(frozen=True)
class Entry:
    ts: float
    kind: str
    source: str  # slurm | controller | run | checkpoint
    detail: str
    attempt: int | None = None
    step: int | None = None
    node: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "ts": round(self.ts, 3),
            "kind": self.kind,
            "source": self.source,
            "detail": self.detail,
            "attempt": self.attempt,
            "step": self.step,
            "node": self.node or None,
        }


@dataclass(frozen=True)
class CommittedCheckpoint:
    step: int
    at: float
    job_id: int | None = None
    restart: int | None = None
    tier: str = "persistent"


@dataclass(frozen=True)
class Recovery:
    """One failure of the run and how it recovered; any part is None when its record is missing."""

    attempt: int  # the attempt that failed (0-based restart count)
    node: str | None
    last_beat: float | None  # the lost node's last heartbeat: the best record of when it failed
    detected: float | None
    requeued: float | None
    restarted: float | None
    first_step: float | None
    resumed_step: int | None
    last_step_before: int | None  # last step the failed attempt reported (progress events: a lower bound)
    last_committed_before: int | None
    #: "requeue" (Slurm requeued the job: a new attempt) or "spare" (the batch step went on with a hot spare in the
    #: same attempt: ``restarted`` is the swap, ``requeued`` None)
    via: str = "requeue"

    def to_json(self) -> dict[str, Any]:
        # measured from the failure: the lost node's last heartbeat, else (a requeue without a node loss) the requeue
        base = self.last_beat if self.last_beat is not None else self.requeued
        return {
            "attempt": self.attempt,
            "via": self.via,
            "node": self.node,
            "from": "last_heartbeat" if self.last_beat is not None else "requeue",
            "detect_s": _delta(base, self.detected),
            "requeue_s": _delta(base, self.requeued),
            "restart_s": _delta(base, self.restarted),
            "resume_s": _delta(base, self.first_step),
            "resumed_step": self.resumed_step,
            "last_step_before": self.last_step_before,
            "last_committed_before": self.last_committed_before,
            # steps done before the failure that had to be done again: last reported step - (resumed step - 1)
            "steps_lost": (
                max(0, self.last_step_before - self.resumed_step + 1)
                if self.last_step_before is not None and self.resumed_step is not None
                else None
            ),
        }


@dataclass(frozen=True)
class Timeline:
    job_id: int
    entries: tuple[Entry, ...]
    recoveries: tuple[Recovery, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "events": [e.to_json() for e in self.entries],
            "recoveries": [r.to_json() for r in self.recoveries],
        }


def _ts(t: datetime | None) -> float | None:
    return t.timestamp() if t is not None else None


def _delta(a: float | None, b: float | None) -> float | None:
    return round(b - a, 2) if a is not None and b is not None else None


def _slurm_entries(attempts: Sequence[JobInfo]) -> list[Entry]:
    out: list[Entry] = []
    for i, a in enumerate(attempts):
        if i == 0 and a.submit_time is not None:
            out.append(Entry(_ts(a.submit_time) or 0, "submitted", "slurm", f"job {a.job_id} submitted", i))
        eligible = _ts(a.eligible_time)
        if i > 0 and eligible is not None and a.start_time is not None:
            # after a requeue Slurm holds the job until requeue + cred_expire + 1 s (its revoked credential)
            out.append(Entry(eligible, "eligible", "slurm", f"attempt {i} may start (after the requeue delay)", i))
        start = _ts(a.start_time)
        if start is not None:
            kind = "started" if i == 0 else "restarted"
            nodes = ",".join(a.nodes) or "?"
            out.append(Entry(start, kind, "slurm", f"attempt {i} running on {nodes}", i))
        end = _ts(a.end_time)
        state = a.state.split()[0] if a.state else ""
        if end is not None and state in _END_KIND and a.phase.name != "RUNNING":
            out.append(Entry(end, _END_KIND[state], "slurm", f"attempt {i} ended {state}", i))
    return out


def _attempt_at(attempts: Sequence[JobInfo], ts: float, nodes: Iterable[str] = ()) -> int | None:
    """The attempt that was running at ``ts`` (optionally on one of ``nodes``)."""
    wanted = set(nodes)
    for i, a in enumerate(attempts):
        start, end = _ts(a.start_time), _ts(a.end_time)
        if start is None or ts < start - 1:
            continue
        if end is not None and ts > end + 60:  # a detection may come a little after the job's record ended
            continue
        if wanted and not wanted & set(a.nodes):
            continue
        return i
    return None


def _controller_entries(
    attempts: Sequence[JobInfo], events: Iterable[dict[str, Any]], job_id: int, swapped: Iterable[str] = ()
) -> list[Entry]:
    """The controller's events about this job or its nodes; ``swapped``: nodes a spare replaced (the job was not
    requeued for them, whatever the controller expected)."""
    swapped = set(swapped)
    out: list[Entry] = []
    for ev in events:
        kind, ts, node = str(ev.get("kind", "")), ev.get("ts"), str(ev.get("node", ""))
        if not isinstance(ts, int | float):
            continue
        jobs = ev.get("jobs") or ()
        mine = _names_job(ev, job_id)
        attempt = _attempt_at(attempts, float(ts), [node] if node else ())
        if not mine and (kind not in NODE_EVENTS or attempt is None):
            continue
        reason = str(ev.get("reason", "")).strip()
        detail = f"{node}: {reason}" if reason else (node or kind)
        if kind == "jobs_requeued":
            detail = f"{node}: Slurm requeues job(s) {', '.join(str(j) for j in jobs)}"
            if node in swapped:  # --no-kill: Slurm took the node out of the job instead
                kind, detail = "node_left_job", f"{node}: left job {job_id}'s allocation; the job went on with a spare"
        if kind == "node_lost" and isinstance(ev.get("silent_s"), int | float):  # the detection's own measure
            detail = f"{node}: no heartbeat for {ev['silent_s']:.1f} s"
        out.append(Entry(float(ts), kind, "controller", detail, attempt, node=node))
    return out


def _run_entries(run_events: Iterable[RunEvent]) -> list[Entry]:
    out = []
    for ev in run_events:
        bits = [f"step {ev.step}"] if ev.step is not None else []
        bits += [f"{k}={v}" for k, v in sorted(ev.fields.items()) if k != "step"]
        kind = {"started": "process_started", "restored": "resumed"}.get(ev.kind, ev.kind)
        detail = ", ".join(bits) or ev.kind
        if ev.kind == "checkpoint_skipped":
            detail = "restore skipped " + "; ".join(f"step {s['step']}: {s['reason']}" for s in skipped_steps(ev))
        out.append(Entry(ev.ts, kind, "run", detail, ev.restart, ev.step, ev.node))
    return out


def _ckpt_entries(ckpts: Iterable[CommittedCheckpoint]) -> list[Entry]:
    return [
        Entry(c.at, "checkpoint_committed", "checkpoint", f"step {c.step} committed" + _TIER_WORDS.get(c.tier, ""),
              c.restart, c.step)
        for c in ckpts
    ]  # fmt: skip


#: How a committed step that was not a periodic checkpoint reads in the timeline.
_TIER_WORDS = {"memory": " (in-memory snapshot, promoted after the node loss)"}


def build(
    job_id: int,
    attempts: Sequence[JobInfo],
    controller_events: Iterable[dict[str, Any]] = (),
    run_events: Iterable[RunEvent] = (),
    checkpoints: Iterable[CommittedCheckpoint] = (),
) -> Timeline:
    run_events = [e for e in run_events if e.job_id == job_id]
    checkpoints = list(checkpoints)
    raw = [e for e in controller_events if isinstance(e, dict)]
    swapped = {n for e in run_events if e.kind == "spare_swap" for n in node_names(e.fields.get("lost"))}
    controller = _controller_entries(attempts, raw, job_id, swapped)
    entries = sorted(
        _slurm_entries(attempts) + controller + _run_entries(run_events) + _ckpt_entries(checkpoints),
        key=lambda e: (e.ts, e.source != "slurm"),
    )
    recoveries = _recoveries(attempts, raw, run_events, checkpoints) + _swaps(raw, run_events, checkpoints)
    return Timeline(job_id, tuple(entries), tuple(sorted(recoveries, key=lambda r: r.restarted or 0)))


def _swaps(
    controller_events: list[dict[str, Any]], run_events: list[RunEvent], checkpoints: list[CommittedCheckpoint]
) -> list[Recovery]:
    """One Recovery per hot-spare swap (``spare_swap`` run event): the lost node's ``node_lost`` before it, the first
    step after it in the same attempt."""
    out = []
    for swap in (e for e in run_events if e.kind == "spare_swap"):
        lost_nodes = node_names(swap.fields.get("lost"))
        lost = max(
            (e for e in controller_events if e.get("kind") == "node_lost" and e.get("node") in lost_nodes
             and isinstance(e.get("ts"), int | float) and swap.ts - 120 <= e["ts"] <= swap.ts),
            key=lambda e: e["ts"], default=None,
        )  # fmt: skip
        same = [e for e in run_events if e.restart == swap.restart]
        out.append(
            _recovery(
                swap.restart, lost_nodes[0] if lost_nodes else None, lost,
                after=[e for e in same if e.ts >= swap.ts],
                progress=[e.step for e in same if e.ts < swap.ts and e.step is not None],
                before=[c.step for c in checkpoints if c.at <= swap.ts],
                requeued=None, restarted=swap.ts, via="spare",
            )
        )  # fmt: skip
    return out


def _recoveries(
    attempts: Sequence[JobInfo],
    controller_events: list[dict[str, Any]],
    run_events: list[RunEvent],
    checkpoints: list[CommittedCheckpoint],
) -> list[Recovery]:
    """One Recovery per attempt that ended to be run again (requeued after a node loss or a preemption)."""
    out = []
    for i, a in enumerate(attempts[:-1]):
        if not a.state.startswith(("REQUEUED", "NODE_FAIL", "PREEMPTED")):
            continue
        lost = next(
            (
                e
                for e in controller_events
                if e.get("kind") == "node_lost"
                and isinstance(e.get("ts"), int | float)
                and _attempt_at(attempts, float(e["ts"]), [str(e.get("node", ""))]) == i
            ),
            None,
        )
        out.append(
            _recovery(
                i, str(lost.get("node")) if lost else None, lost,
                after=[e for e in run_events if e.restart == i + 1],
                progress=[e.step for e in run_events if e.restart == i and e.step is not None],
                before=[c.step for c in checkpoints if c.restart is not None and c.restart <= i],
                requeued=_requeue_time(a.job_id, lost, controller_events, _ts(a.end_time)),
                restarted=_ts(attempts[i + 1].start_time),
            )
        )  # fmt: skip
    return out


def _names_job(ev: Mapping[str, Any], job_id: int) -> bool:
    """Whether a controller event's ``jobs`` list names ``job_id``."""
    return any(is_decimal(str(j)) and int(j) == job_id for j in ev.get("jobs") or ())


def _requeue_time(
    job_id: int, lost: dict[str, Any] | None, events: Iterable[dict[str, Any]], accounted: float | None
) -> float | None:
    """When the attempt was requeued: the controller's ``jobs_requeued`` event naming this job after the loss
    (written once the node-down call returned, so Slurm had requeued it), else accounting's end time. Why not always
    accounting's: it keeps whole seconds, so it read up to a second early, a requeue before the loss was detected
    (``-0.1 s`` in the demo's table)."""
    if lost is None:
        return accounted
    for ev in events:
        ts = ev.get("ts")
        if (
            ev.get("kind") == "jobs_requeued"
            and ev.get("node") == lost.get("node")
            and isinstance(ts, int | float)
            and ts >= lost["ts"]
            and _names_job(ev, job_id)
        ):
            return float(ts)
    return accounted


def _recovery(
    attempt: int,
    node: str | None,
    lost: dict[str, Any] | None,
    *,
    after: list[RunEvent],
    progress: list[int],
    before: list[int],
    requeued: float | None,
    restarted: float | None,
    via: str = "requeue",
) -> Recovery:
    """One Recovery from its records: the ``node_lost`` event (None when none), the run's events after the restart
    (its first ``first_step``/``restored``), the steps reported before it and the checkpoints committed before it."""
    first = next((e for e in after if e.kind == "first_step"), None)
    restored = next((e for e in after if e.kind == "restored"), None)
    resumed = first.step if first else (restored.step + 1 if restored and restored.step is not None else None)
    last_beat = lost.get("last_beat") if lost else None
    return Recovery(
        attempt=attempt,
        node=node,
        last_beat=float(last_beat) if isinstance(last_beat, int | float) else None,
        detected=float(lost["ts"]) if lost else None,
        requeued=requeued,
        restarted=restarted,
        first_step=first.ts if first else None,
        resumed_step=resumed,
        last_step_before=max(progress) if progress else None,
        last_committed_before=max(before) if before else None,
        via=via,
    )

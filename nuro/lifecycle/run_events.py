"""What a run itself saw, recorded next to its checkpoints in S3: started, resumed at step N, first step, progress,
preempted, finished, checkpoints a restore skipped.

Why S3 and not a new database: S3 is already the system of record for a run's checkpoints (architecture principle
1), the job has its credentials, and each event is one small immutable object written with ``If-None-Match: *`` — so
``nuro-train events`` can assemble a run's history from Slurm accounting, the controller's event log and these
objects, with nothing extra to run or back up. Only rank 0 records, a few objects per attempt (progress at most
every ``NURO_PROGRESS_EVERY_S``, default 30 s), and recording never raises into training: a store that is down
costs the event, not the step.

Key: ``runs/<team>/<run>/events/<job_id>/<ms since epoch:013d>-r<restart>-<kind>.json``; body: compact JSON with
``ts``, ``kind``, ``job_id``, ``restart``, ``node`` and the kind's fields (``step``, ``source``, ``seconds``, …).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from nuro.names import validate_run, validate_team
from nuro.objectstore import RUN_EVENT_MAX_BYTES, ObjectExists, ObjectStore, ObjectStoreError, ObjectTooLarge
from nuro.protocol.envnames import NURO_RUN_NAME, NURO_TEAM

log = logging.getLogger(__name__)

#: ``checkpoint_skipped``: a restore passed over committed steps it could not load (a shard torn in S3, a bad local
#: copy); ``steps`` = [{"step", "reason"}], ``restored`` = the step it loaded (-1: none). ``straggler`` /
#: ``straggler_cleared``: a rank held the job back for a sustained window (``rank``, ``node_of_rank``, ``slowdown``;
#: ``nuro.wrappers.sdk.stragglers``). ``spare_swap``: the batch step went on with a hot spare for a lost node, no
#: requeue (``swap``, ``lost``, ``spares``, ``spares_left``, ``nodes``, ``why``: node_lost or straggler;
#: ``nuro.wrappers.spares``). ``straggler_decision``: move away from a straggler or not, by cost (``move``,
#: ``slowdown``, ``remaining_s``, ``stay_loss_s``, ``move_cost_s``, ``why``; ``nuro.policy.straggler_move``).
#: ``snapshots``: the memory in-memory snapshots hold on rank 0's node (``held_bytes``, ``interval_s``,
#: ``max_bytes``, ``replicated_s``; recorded after the first one and when they stop at the bound).
KINDS = ("started", "restored", "first_step", "progress", "preempted", "finished", "failed", "checkpoint_skipped",
         "straggler", "straggler_cleared", "straggler_decision", "spare_swap", "snapshots")  # fmt: skip


@dataclass(frozen=True)
class RunEvent:
    ts: float
    kind: str
    job_id: int
    restart: int
    node: str = ""
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> int | None:
        step = self.fields.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None


def run_prefix(team: str, run: str) -> str:
    """Validated like checkpoint keys (the same team and run names), so nothing user-given escapes the prefix."""
    return f"runs/{validate_team(team)}/{validate_run(run)}/events/"


def event_key(team: str, run: str, event: RunEvent) -> str:
    return f"{run_prefix(team, run)}{event.job_id}/{int(event.ts * 1000):013d}-r{event.restart}-{event.kind}.json"


def encode(event: RunEvent) -> bytes:
    body = {
        **event.fields,
        "ts": round(event.ts, 3),
        "kind": event.kind,
        "job_id": event.job_id,
        "restart": event.restart,
        "node": event.node,
    }
    return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()


def decode(data: bytes) -> RunEvent | None:
    """One stored event, or None for an object that is not one (it is skipped, not fatal)."""
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict):
            return None
        fields = {k: v for k, v in raw.items() if k not in {"ts", "kind", "job_id", "restart", "node"}}
        return RunEvent(
            ts=float(raw["ts"]),
            kind=str(raw["kind"]),
            job_id=int(raw["job_id"]),
            restart=int(raw.get("restart", 0)),
            node=str(raw.get("node", "")),
            fields=fields,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def record(kind: str, *, store: ObjectStore | None = None, env: dict[str, str] | None = None, **fields: Any) -> bool:
    """Record one event of the current job (rank 0 only; other ranks and non-nuro jobs return False).

    Team, run, job id and restart come from the job's environment (``NURO_TEAM``, ``NURO_RUN_NAME``,
    ``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``). Returns whether it was stored; never raises on a store error.
    """
    env = dict(os.environ if env is None else env)
    if kind not in KINDS:
        raise ValueError(f"unknown run event kind {kind!r}; one of {', '.join(KINDS)}")
    if env.get("RANK", "0") != "0":
        return False
    team, run, job = env.get(NURO_TEAM), env.get(NURO_RUN_NAME), env.get("SLURM_JOB_ID", "")
    if not team or not run or not job.isdigit():
        return False
    event = RunEvent(
        ts=time.time(),
        kind=kind,
        job_id=int(job),
        restart=int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        node=env.get("SLURMD_NODENAME") or socket.gethostname(),
        fields=fields,
    )
    try:
        (store or ObjectStore.from_env(env)).put_if_absent(event_key(team, run, event), encode(event))
    except ObjectExists:
        return True
    except (ObjectStoreError, ValueError) as exc:
        log.warning("run event %s not recorded: %s", kind, exc)
        return False
    return True


def read(store: ObjectStore, team: str, run: str, job_id: int | None = None) -> list[RunEvent]:
    """A run's recorded events, oldest first (optionally of one job id: a resubmitted run has several)."""
    prefix = run_prefix(team, run) + (f"{job_id}/" if job_id is not None else "")
    events = []
    for info in store.list(prefix):
        data = read_event(store, info.key)
        event = decode(data) if data is not None else None
        if event is not None:
            events.append(event)
    return sorted(events, key=lambda e: (e.ts, e.kind))


def read_event(store: ObjectStore, key: str) -> bytes | None:
    """One stored event's bytes, read capped (``RUN_EVENT_MAX_BYTES``: the job writes these objects and root daemons
    read them); None, with a warning, for an object over the cap (skipped like any object that is no event)."""
    try:
        return store.get(key, max_bytes=RUN_EVENT_MAX_BYTES)[0]
    except ObjectTooLarge as exc:
        log.warning("run event skipped: %s", exc)
        return None


def skipped_steps(ev: RunEvent) -> list[dict[str, Any]]:
    """The ``steps`` of a ``checkpoint_skipped`` run event that are well-formed (``{"step": int, "reason": str}``);
    the one reader of that field (the timeline and ``nuro-train artifacts``)."""
    steps = ev.fields.get("steps") if ev.kind == "checkpoint_skipped" else None
    return [
        {"step": s["step"], "reason": str(s.get("reason", ""))}
        for s in (steps if isinstance(steps, list) else [])
        if isinstance(s, dict) and isinstance(s.get("step"), int) and not isinstance(s.get("step"), bool)
    ]


def node_names(value: object) -> list[str]:
    """A run event's list of node names (``spare_swap``'s ``lost``/``spares``), strings only: an event is the job's
    own writing, so anything else in it is dropped, never trusted. The one reader of those fields."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


#: How long a process's exit waits for the events ``record_later`` is still sending: long enough for a store that
#: answers, short against a preempted job's KillWait when it does not.
EXIT_WAIT_S = 5.0
_sending: set[threading.Thread] = set()
_sending_lock = threading.Lock()


def _forget_sending() -> None:
    global _sending_lock
    _sending_lock = threading.Lock()  # a fork (DataLoader worker) may happen while another thread holds it
    _sending.clear()  # the parent's threads are not the child's to wait for


os.register_at_fork(after_in_child=_forget_sending)


def record_later(kind: str, **fields: Any) -> None:
    """``record`` on a daemon thread: for calls inside the training loop, where a slow store must not stall a step.

    The process's normal exit waits up to ``EXIT_WAIT_S`` for such events (``atexit``): a daemon thread dies with the
    interpreter, and an event recorded just before a short run ends (its ``snapshots`` or ``progress``) was lost
    whenever sending it took longer than the rest of the process."""

    def send() -> None:
        try:
            record(kind, **fields)
        finally:
            with _sending_lock:
                _sending.discard(threading.current_thread())

    thread = threading.Thread(target=send, name=f"nuro-run-event-{kind}", daemon=True)
    with _sending_lock:
        _sending.add(thread)
    thread.start()


def wait_sent(timeout_s: float) -> int:
    """Wait up to ``timeout_s`` in all for the events ``record_later`` is still sending; returns how many are left."""
    deadline = time.monotonic() + timeout_s
    with _sending_lock:
        threads = list(_sending)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with _sending_lock:
        return len(_sending)


atexit.register(wait_sent, EXIT_WAIT_S)  # returns at once when nothing is being sent

"""The failure detector at run time: receiver → pure ``liveness.assess`` → Slurm node actions → event log.

It runs in its own loop (every ``tick_s``, 0.25 s by default), beside and independent of the policy cycle, so a slow
policy cycle (a 0.3 s snapshot at 500 nodes, a hung sacctmgr) never delays detection. Its only regular Slurm call is
one node read (``backend.nodes()``) every ``node_poll_s`` (2 s) for node states and reasons: the pure rules need to
know whether a drain reason is ours before resuming. Before it acts it reads the node list again (unless it did
this tick): a detection (1 s) is shorter than the poll, and an admin's drain set in between must be seen. When it
acts it also reads ``squeue --json`` once (which jobs ran on the lost
node, for the event log) and re-reads nodes on the next tick.

Fail operational: if Slurm cannot be reached the detector keeps the last node list (and logs a warning); if the
detector dies, Slurm's own SlurmdTimeout still takes dead nodes down, only slower.

Survives any input: each node is judged and acted on by itself (``liveness.assess`` isolates a node whose record
makes a rule raise; here an action that raises costs only that node's action), a faulty node is logged once (again
only when its error changes), and a tick that fails as a whole is logged and retried next tick. Silence is judged on
``time.monotonic`` (``monotonic``); the wall clock (``clock``) only stamps reasons and event records, so a clock
step on the controller declares nobody dead. While the receiver sees the kernel drop datagrams (a flood filled the
socket buffer), nobody is newly declared lost: a silent node may only have had its beats dropped.

In-band reports (``nuro.protocol.peerloss``): a beat naming ``suspect_jobs`` makes the detector look each job's nodes
up in Slurm (``backend.job_nodes``: one ``squeue -j`` line, at most ``REPORT_LOOKUPS_PER_TICK`` per tick, kept for
``JOB_NODES_TTL_S``), so ``liveness.assess`` judges them on the shorter silence. The ``node_lost`` record then names
the reporting node and the job (``reported_by``, ``report_job``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from nuro.lifecycle.platform_events import EventLog
from nuro.protocol.heartbeat import MAX_STOP_GRACE_S
from nuro.slurm import Backend, DownNode, DrainNode, ResumeNode
from nuro.slurm.actions import ActionResult, Requeue, UpdateStartTime
from nuro.slurm.models import EXPEDITED_REQUEUE_SINCE, REISSUE_PURGES_SINCE, JobInfo, JobPhase, NodeInfo
from nuro.slurm_plugins.controller import expedite
from nuro.slurm_plugins.controller.heartbeats import HeartbeatReceiver
from nuro.slurm_plugins.controller.liveness import (
    Cause,
    DetectorState,
    LivenessConfig,
    NodeAction,
    NodeActionKind,
    assess,
)
from nuro.slurm_plugins.controller.ratelog import RateLog

log = logging.getLogger("nuro.controller.detector")

STATS_EVERY_S = 5.0
#: Jobs an in-band report names whose nodes are looked up in one tick (an agent repeating a report costs nothing:
#: the answer is kept ``JOB_NODES_TTL_S``).
REPORT_LOOKUPS_PER_TICK = 4
JOB_NODES_TTL_S = 10.0


def _slurm_action(action: NodeAction) -> DownNode | DrainNode | ResumeNode:
    match action.kind:
        case NodeActionKind.DOWN:
            return DownNode(action.node, action.reason)
        case NodeActionKind.DRAIN:
            return DrainNode(action.node, action.reason)
    return ResumeNode(action.node)


class FailureDetector:
    """One detector: a receiver, a backend, soft state. ``tick()`` is one pass; ``run()`` loops until stopped.

    Args:
        events: where to write node_lost/node_down/… records (None: log only).
        dry_run: assess and log, change nothing in Slurm.
        node_poll_s: how often Slurm's node list is re-read when nothing happens.
        expedite_requeue: start the jobs a node loss requeued as soon as that is safe, where Slurm has no
            expedited requeue of its own (``nuro.slurm_plugins.controller.expedite``).
    """

    def __init__(
        self,
        backend: Backend,
        receiver: HeartbeatReceiver,
        cfg: LivenessConfig,
        events: EventLog | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
        node_poll_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        expedite_requeue: bool = True,
    ) -> None:
        self.backend = backend
        self.receiver = receiver
        self.cfg = cfg
        self.events = events
        self.dry_run = dry_run
        self.clock = clock
        self.monotonic = monotonic
        self.node_poll_s = node_poll_s
        self.state = DetectorState.fresh(monotonic())
        self.slurm_nodes: dict[str, NodeInfo] = {}
        self._nodes_at = float("-inf")
        self._guard_logged = RateLog(60.0, 1, clock=monotonic)
        self._straggler_logged = RateLog(60.0, 256, clock=monotonic)  # one line per (job, node) a minute
        self._faults_logged: dict[str, str] = {}
        self._drops: int | None = None
        self._drops_at = float("-inf")
        self._stats_logged: dict[str, int] = {}
        self._stats_at = float("-inf")
        self._job_nodes: dict[int, tuple[float, tuple[str, ...]]] = {}  # job -> (read at, its nodes)
        self.ticks = 0
        self.expedite_requeue = expedite_requeue
        self._watched: list[expedite.Watched] = []  # jobs a node loss requeued, to start once safe
        self._slurm_expedites: bool | None = None  # whether this Slurm requeues expedited jobs itself (25.11+)
        self._cred_expire_s = expedite.DEFAULT_CRED_EXPIRE_S  # slurm.conf's, read with the version
        self._reissue_purges = False  # slurmd forgets a requeued job's old attempt at once (23.02+)

    def _reported_jobs(self, beats: list, now: float) -> dict[int, tuple[str, ...]]:
        """The nodes of the jobs this tick's beats report (``suspect_jobs``, ``stragglers``), from Slurm, cached."""
        wanted = {j for b in beats for j in b.suspect_jobs} | {r[0] for b in beats for r in b.stragglers}
        for job in [j for j, (at, _) in self._job_nodes.items() if now - at > JOB_NODES_TTL_S]:
            del self._job_nodes[job]
        for job in sorted(wanted - self._job_nodes.keys())[:REPORT_LOOKUPS_PER_TICK]:
            try:
                self._job_nodes[job] = (now, tuple(self.backend.job_nodes(job)))
            except Exception as exc:  # noqa: BLE001 - a report is an optimisation: heartbeats still decide
                log.warning("in-band report of job %d: its nodes could not be read: %s", job, exc)
                continue
            log.info("in-band report: job %d on %s", job, ",".join(self._job_nodes[job][1]) or "-")
        return {j: self._job_nodes[j][1] for j in wanted if j in self._job_nodes}

    def _refresh_nodes(self, now: float) -> None:
        try:
            self.slurm_nodes = {n.name: n for n in self.backend.nodes()}
            self._nodes_at = now
        except Exception as exc:  # noqa: BLE001 - SlurmError, or a node list we cannot read: judge on the last one
            self._nodes_at = now  # retry at the next poll, not every tick
            log.warning("node list unavailable, judging on the previous one (%d nodes): %s", len(self.slurm_nodes), exc)

    def _kernel_dropping(self, now: float) -> bool:
        """True while the receiver's socket dropped datagrams within the last timeout (see the module docstring)."""
        drops = self.receiver.kernel_drops() if hasattr(self.receiver, "kernel_drops") else None
        if drops is not None:
            if self._drops is not None and drops > self._drops:
                if now - self._drops_at > self.cfg.timeout_s:
                    log.warning(
                        "heartbeat socket: the kernel dropped %d datagrams (buffer full: a flood?); no node is "
                        "declared lost until it stops for %.1f s", drops - self._drops, self.cfg.timeout_s,
                    )  # fmt: skip
                self._drops_at = now
            self._drops = drops
        return now - self._drops_at <= self.cfg.timeout_s

    def _log_stats(self, now: float) -> None:
        """The receiver's counters, every ``STATS_EVERY_S`` while datagrams are being rejected or dropped."""
        self._stats_at = now
        stats = self.receiver.stats() if hasattr(self.receiver, "stats") else {}
        noisy = {k: v for k, v in stats.items() if k != "accepted"}
        if noisy and noisy != {k: v for k, v in self._stats_logged.items() if k != "accepted"}:
            log.info("heartbeat receiver stats: %s", " ".join(f"{k}={v}" for k, v in stats.items()))
        self._stats_logged = stats

    def _log_faults(self, faults: Mapping[str, str]) -> None:
        for node, error in faults.items():
            if self._faults_logged.get(node) != error:
                log.error("node=%s skipped by the detector this pass (logged once): %s", node, error)
        for node in set(self._faults_logged) - set(faults):
            log.info("node=%s judged again (its earlier error is gone)", node)
        self._faults_logged = dict(faults)

    def tick(self) -> list[tuple[NodeAction, ActionResult | None]]:
        """Take the queued beats, judge, apply. Returns what was applied (result None in dry-run)."""
        self.ticks += 1
        if hasattr(self.receiver, "pump"):
            self.receiver.pump()  # beats the kernel holds count before "now" (heartbeats.py: a descheduled controller)
        now, wall = self.monotonic(), self.clock()
        beats = self.receiver.drain()
        for b in beats:
            if b.stopping_s > 0:  # an agent stopping on purpose (a restart): on record, since it changes a judgement
                self._emit("node_agent_stopping", node=b.node, quiet_s=round(min(b.stopping_s, MAX_STOP_GRACE_S), 1),
                           seq=b.seq)  # fmt: skip
        if now - self._nodes_at >= self.node_poll_s:
            self._refresh_nodes(now)
        dropping = self._kernel_dropping(now)
        jobs = self._reported_jobs(beats, now) if any(b.suspect_jobs or b.stragglers for b in beats) else None
        before = self.state
        actions, self.state = assess(before, beats, self.slurm_nodes, now, self.cfg, wall, hold_losses=dropping,
                                     job_nodes=jobs)  # fmt: skip
        if actions and self._nodes_at < now:
            # Judge again on a node list read now: the poll may be up to node_poll_s old, longer than a detection
            # (1 s), and an admin's drain set meanwhile must be seen, kept in the reason and never resumed.
            self._refresh_nodes(now)
            actions, self.state = assess(before, beats, self.slurm_nodes, now, self.cfg, wall, hold_losses=dropping,
                                         job_nodes=jobs)  # fmt: skip
        for job, node, why in self.state.unconfirmed:  # a job's straggler claim the platform could not back
            if self._straggler_logged.allow((job, node))[0]:
                log.warning("straggler report of job %d about %s not acted on: %s", job, node, why)
                self._emit("straggler_unconfirmed", node=node, jobs=[job], reason=why)
        if now - self._stats_at >= STATS_EVERY_S:
            self._log_stats(now)
        if self.state.faults or self._faults_logged:
            self._log_faults(self.state.faults)
        if self.state.suppressed and self._guard_logged.allow("guard")[0]:
            log.warning(
                "%s: %d nodes silent (%s…), none declared lost; check this controller's network (Slurm's "
                "SlurmdTimeout still downs dead nodes)", "kernel dropping heartbeats" if dropping else
                "mass-loss guard", len(self.state.suppressed), self.state.suppressed[:5],
            )  # fmt: skip
        if self._watched:
            self._expedite(wall)
        if not actions:
            return []
        done = self._apply(actions, now, wall)
        self._nodes_at = float("-inf")  # see Slurm's answer at the next tick
        return done

    def _expedite(self, wall: float) -> None:
        """Start the watched jobs ``expedite.decide`` clears (one ``squeue -j`` per watched job and tick, at most
        ``REPORT_LOOKUPS_PER_TICK``, and only once its early start may come); a job Slurm could not be asked about is
        asked again next tick."""
        observed: dict[int, tuple[int, str] | None] = {}
        # nothing starts before that: no job read before it
        ready = wall - expedite.earliest_start_s(self._cred_expire_s, self._reissue_purges)
        for w in [w for w in self._watched if w.killed_at <= ready][:REPORT_LOOKUPS_PER_TICK]:
            try:
                observed[w.job_id] = self.backend.job_restarts(w.job_id)
            except KeyError:
                observed[w.job_id] = None
            except Exception as exc:  # noqa: BLE001 - asked again next tick; WATCH_S bounds it
                log.debug("job=%d state unreadable for the expedited start: %s", w.job_id, exc)
        out = {n for n, info in self.slurm_nodes.items() if info.flags & {"DOWN", "DRAIN"}}
        decision = expedite.decide(self._watched, observed, out, wall, cred_expire_s=self._cred_expire_s,
                                   reissue_purges=self._reissue_purges)  # fmt: skip
        self._watched = list(decision.keep)
        for w, why in decision.dropped:
            log.info("job=%d not expedited after losing %s: %s", w.job_id, w.node, why)
        for w in decision.expedite:
            try:
                result = self.backend.apply(UpdateStartTime(w.job_id))
            except Exception as exc:  # noqa: BLE001 - Slurm's own delay applies then, as before
                result = ActionResult(UpdateStartTime(w.job_id), ok=False, message=f"{type(exc).__name__}: {exc}"[:300])
            log.info("job=%d requeued after losing %s: start expedited %.1f s after the kill, applied=%s %s",
                     w.job_id, w.node, wall - w.killed_at, result.ok, "" if result.ok else result.message)  # fmt: skip
            self._emit("requeue_expedited", node=w.node, jobs=[w.job_id], after_kill_s=round(wall - w.killed_at, 2),
                       ok=result.ok, error="" if result.ok else result.message)  # fmt: skip

    def _watch_requeues(self) -> bool:
        """Whether to expedite requeues here: on, and this Slurm has no expedited requeue of its own."""
        if not self.expedite_requeue or self.dry_run:
            return False
        if self._slurm_expedites is None:
            try:
                version = self.backend.version().major_minor
                self._slurm_expedites = version >= EXPEDITED_REQUEUE_SINCE
                self._reissue_purges = version >= REISSUE_PURGES_SINCE
                self._cred_expire_s = float(self.backend.cred_expire_s())
            except Exception as exc:  # noqa: BLE001 - unknown: leave Slurm's delay alone
                log.warning("Slurm version unknown (%s): requeued jobs wait Slurm's own delay", exc)
                return False
        return not self._slurm_expedites

    def _apply(
        self, actions: list[NodeAction], now: float, wall: float
    ) -> list[tuple[NodeAction, ActionResult | None]]:
        lost_nodes = {a.node for a in actions if a.kind is NodeActionKind.DOWN}
        running: dict[str, list[tuple[int, bool]]] = {}
        batch_hosts: dict[int, str] = {}  # requeueable jobs whose batch host (first node) is lost
        if lost_nodes:
            # Which jobs ran there, read before DOWN requeues them (after it, squeue no longer names the node).
            try:
                watch = self._watch_requeues()
                for job in self.backend.jobs():
                    if job.state.startswith(("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")):
                        for node in lost_nodes.intersection(job.nodes):
                            running.setdefault(node, []).append((job.job_id, job.requeue))
                            if watch and job.requeue and all(w.job_id != job.job_id for w in self._watched):
                                self._watched.append(expedite.Watched(job.job_id, job.restart_count, node, wall))
                        if job.requeue and job.nodes and job.nodes[0] in lost_nodes:
                            batch_hosts[job.job_id] = job.nodes[0]
            except Exception as exc:  # noqa: BLE001 - a bad job list must not stop the node from going down
                log.warning("could not list the jobs on %s before taking it down: %s", sorted(lost_nodes), exc)
        done: list[tuple[NodeAction, ActionResult | None]] = []
        for action in actions:
            self._note_before(action, now)
            result: ActionResult | None = None
            if not self.dry_run:
                slurm_action = _slurm_action(action)
                try:
                    result = self.backend.apply(slurm_action)
                except Exception as exc:  # noqa: BLE001 - one node's action must not cost the others theirs
                    result = ActionResult(slurm_action, ok=False, message=f"{type(exc).__name__}: {exc}"[:300])
            log.log(
                logging.WARNING if result is not None and not result.ok else logging.INFO,
                "node=%s action=%s cause=%s applied=%s reason=%r silent_s=%.2f last_seq=%d%s",
                action.node, action.kind, action.cause, result.ok if result else "dry-run", action.reason,
                action.silent_s, action.last_seq, f" error={result.message!r}" if result and not result.ok else "",
            )  # fmt: skip
            self._note_after(action, result, running.get(action.node, []), now)
            done.append((action, result))
        if batch_hosts and not self.dry_run:
            self._requeue_headless(batch_hosts)
        return done

    def _requeue_headless(self, batch_hosts: Mapping[int, str]) -> None:
        """Requeue every job that lost its batch host yet still runs: a ``--no-kill`` job (hot spares) has the lost
        node excised and keeps RUNNING, but its batch script, the one that would swap in a spare, died with the
        node; Slurm notices only when that node registers again (measured on 26.05: the job hung until then). Its
        requeue is the path it would have taken without spares."""
        try:
            jobs: dict[int, JobInfo] = {j.job_id: j for j in self.backend.jobs()}
        except Exception as exc:  # noqa: BLE001 - the next loss of the same node is not coming: say it loudly
            log.error("could not list jobs after taking nodes down (batch hosts lost: %s): %s", dict(batch_hosts), exc)
            return
        for job_id, host in sorted(batch_hosts.items()):
            job = jobs.get(job_id)
            if job is None or job.phase is not JobPhase.RUNNING or host in job.nodes:
                continue  # Slurm ended or requeued it itself (the usual case), or it has not let go of the node yet
            try:
                result = self.backend.apply(Requeue(job_id))
            except Exception as exc:  # noqa: BLE001
                result = ActionResult(Requeue(job_id), ok=False, message=f"{type(exc).__name__}: {exc}"[:300])
            log.info("job=%d lost its batch host %s and still ran: requeued=%s %s", job_id, host, result.ok,
                     result.message if not result.ok else "")  # fmt: skip
            self._emit("jobs_requeued", node=host, jobs=[job_id] if result.ok else [], not_requeued=[] if result.ok
                       else [job_id], why="batch host lost", error="" if result.ok else result.message)  # fmt: skip

    def _emit(self, kind: str, **fields: object) -> None:
        if self.events is None:
            return
        try:
            self.events.append(kind, **fields)
        except Exception as exc:  # noqa: BLE001 - the journal never stops the detector
            log.warning("event log write failed kind=%s: %s", kind, exc)

    def _note_before(self, action: NodeAction, now: float) -> None:
        if action.kind is NodeActionKind.DOWN:
            self._emit(
                "node_lost", node=action.node, last_beat=round(action.last_beat, 3), last_seq=action.last_seq,
                silent_s=round(action.silent_s, 3),
                detection_delay_s=round(max(action.silent_s - self.cfg.interval_s, 0.0), 3),
                **({"reported_by": action.reported_by, "report_job": action.report_job} if action.reported_by else {}),
            )  # fmt: skip
            if action.cause is Cause.FLAPPING:
                hold = self.state.nodes[action.node].hold_until - now if action.node in self.state.nodes else 0.0
                self._emit("node_flapping", node=action.node, hold_s=round(hold, 1), reason=action.reason)
        elif action.kind is NodeActionKind.DRAIN and action.cause is Cause.STRAGGLER:
            self._emit("node_straggler", node=action.node, reason=action.reason)
        elif action.kind is NodeActionKind.DRAIN and action.cause is Cause.UNHEALTHY:
            problems = self.state.nodes[action.node].problems if action.node in self.state.nodes else ()
            self._emit("node_unhealthy", node=action.node, problems=list(problems))

    def _note_after(
        self, action: NodeAction, result: ActionResult | None, jobs: list[tuple[int, bool]], now: float
    ) -> None:
        outcome = {"ok": result.ok if result else False, "error": "" if result is None or result.ok else result.message}
        if result is None:
            outcome["error"] = "dry run"
        kind = {NodeActionKind.DOWN: "node_down", NodeActionKind.DRAIN: "node_drained",
                NodeActionKind.RESUME: "node_resumed"}[action.kind]  # fmt: skip
        self._emit(kind, node=action.node, reason=action.reason, **outcome)
        if action.kind is NodeActionKind.DOWN and jobs:
            self._emit(
                "jobs_requeued", node=action.node, jobs=sorted(j for j, rq in jobs if rq),
                not_requeued=sorted(j for j, rq in jobs if not rq),
            )  # fmt: skip

    def run(self, tick_s: float, stop: threading.Event) -> None:
        """Loop until ``stop``; an unexpected error in one tick is logged and the loop goes on."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.tick()
            except Exception:  # a detector that dies silently is worse than one that logs and retries
                log.exception("detector tick failed; continuing")
            stop.wait(max(0.0, tick_s - (time.monotonic() - started)))

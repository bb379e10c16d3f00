"""The discrete-event replay: one workload, one simulated slurmctld, with or without nuro's controller.

Events (a heap; ties at one time in the order below): a job ARRIVEs, ENDs, ACKs a preemption (its checkpoint is
committed), becomes ELIGIBLE again after a requeue, or the controller TICKs. After each batch of same-time events the
controller runs (on a tick), then one scheduling pass (when anything changed), then the QOS limits are sampled.

The variants differ only in who shares:

* ``baseline`` — Slurm alone, hard quotas, no borrowing: jobs stay in ``g-<team>`` (or ``urgent``) for life.
* ``scavenger`` — Slurm's own soft sharing as an admin sets it up: a job that would exceed its team's quota at
  submission (running + pending in ``g-<team>``) goes to the team's scavenger QOS (limited to the borrow limit) for
  life; guaranteed and tier QOS preempt scavenger jobs (``PreemptType=preempt/qos``, ``PreemptMode=REQUEUE``,
  ``GraceTime`` = the policy's grace, ``PreemptExemptTime`` = its minimum run time). Victims are chosen by Slurm's
  order, blind to checkpoints; a victim that checkpoints on the signal (as a submitit job does) exits once committed
  and is requeued then, the others at grace end.
* ``nuro`` — every ``interval_s`` on the tick grid, the daemon's own ``Controller.cycle()`` reads a snapshot of the
  simulator, calls the engine's ``decide`` and applies the decisions through ``SimBackend`` (``bridge.py``). A tick
  is skipped when nothing is pending and no preemption is in flight: no decision could apply to such a state.

A job's life: pending → running → (preempted → requeued → pending …) → done, or censored at the horizon.
Checkpoint model (synthesised, ``synth.py``): a running job commits a checkpoint every ``ckpt_interval_s`` of
training and reports ``{"ckpt": {"step", "at"}}`` (the SDK's channel through the node agent; the sim keeps it in
the job's own record and hands it to the controller as ``progress``). On the preemption signal an acking job stops
training, commits within ``ckpt_commit_s`` and reports ``ack``; a non-acking job trains on and is
requeued at grace end. A requeued job keeps only the progress of its last committed checkpoint; everything else it
held the GPUs for in that run is lost work. A resumed run first spends ``restart_overhead_s`` loading (allocated,
not training).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from bench.sim.bridge import EPOCH, SimBackend
from bench.sim.slurm import DEFAULT_SCHED, DONE, RUNNING, QosPreemption, SchedParams, SimJob, SlurmSim
from bench.sim.synth import JobSpec
from bench.sim.trace import NodeSpec
from nuro.policy.model import Policy
from nuro.protocol import jobcomment
from nuro.protocol.contract import PREEMPT_SIGNAL

ARRIVE, END, ACK, ELIGIBLE, GRACE_END, TICK = range(6)

#: The scavenger variant's preemptable QOS per team: one QOS ``scavenger`` with ``MaxTRESPerAccount`` = the team's
#: borrow limit, modelled as one QOS per team with that GrpTRES.
SCAVENGER_PREFIX = "s-"


class Variant(StrEnum):
    BASELINE = "baseline"
    SCAVENGER = "scavenger"
    NURO = "nuro"


@dataclass(frozen=True)
class RunRecord:
    """One run of a job (start to end, requeue or horizon). ``idle_from_s``: an acking victim stopped training here.

    ``outcome`` is "done", "requeued" or "censored" (still running at the horizon); ``kept_gpu_s`` the progress of
    this run that survived it (GPUs × seconds), ``lost_gpu_s`` the training-phase time that did not."""

    job_id: int
    team: str
    qos: str
    gpus: int
    start_s: float
    end_s: float
    train_start_s: float
    idle_from_s: float | None
    outcome: str
    kept_gpu_s: float
    lost_gpu_s: float
    restart_gpu_s: float
    node_count: int
    leaves: int


@dataclass(frozen=True)
class PendRecord:
    job_id: int
    team: str
    gpus: int
    since_s: float
    until_s: float


@dataclass
class ReplayLog:
    """Everything the metrics are computed from (``metrics.py``), plus counters of the run itself."""

    variant: Variant
    horizon_s: float
    capacity: int
    jobs: list[SimJob]
    runs: list[RunRecord] = field(default_factory=list)
    pends: list[PendRecord] = field(default_factory=list)
    counters: Counter = field(default_factory=Counter)
    samples: int = 0
    g_over_quota_samples: int = 0
    b_over_limit_samples: int = 0
    decide_s: float = 0.0
    cycles: int = 0
    wall_s: float = 0.0
    #: idle GPU·s while work waited, per ``IDLE_BIN_S`` bin from 0 and per cause (``Replay._idle_causes``)
    idle_by_cause: dict[str, list[float]] = field(default_factory=dict)


#: Bin width of the idle-by-cause record (the metrics' idle-while-waiting bins)
IDLE_BIN_S = 300.0
#: Why pending work could not use idle GPUs: its QOS limit (quota, borrow limit, or no lending: the policy's
#: choice), its requeue delay, a reservation held for a higher job, placement (enough idle GPUs in all, no nodes
#: that fit: fragmentation proper), or a job wider than all the idle GPUs together
IDLE_CAUSES = ("qos_limit", "requeue_delay", "reservation", "fragmentation", "too_few_idle")


class Replay:
    """Replays ``jobs`` on ``nodes`` under ``policy``; ``run()`` returns the log. One instance runs once."""

    def __init__(
        self,
        jobs: Sequence[JobSpec],
        nodes: Sequence[NodeSpec],
        policy: Policy,
        variant: Variant,
        interval_s: float = 30.0,
        horizon_s: float | None = None,
        sched: SchedParams = DEFAULT_SCHED,
        node_weights: bool = True,
    ) -> None:
        self.policy = policy
        self.variant = Variant(variant)
        self.interval_s = interval_s
        self.params = sched
        limits: dict[str, int | None] = {}
        prio: dict[str, int] = {}
        for t in policy.teams:
            limits[t.guaranteed_qos], limits[t.borrow_qos] = t.quota_gpus, t.borrow_limit_gpus
        for tier in policy.tiers:
            limits[tier.name], prio[tier.name] = None, tier.priority
        if self.variant is Variant.SCAVENGER:
            for t in policy.teams:
                limits[SCAVENGER_PREFIX + t.name] = t.borrow_limit_gpus
        self.sim = SlurmSim(nodes, limits, prio, {t.name: t.shares for t in policy.teams}, sched, policy.grace_s)
        if self.variant is Variant.SCAVENGER:
            self.sim.preemption = QosPreemption(
                may_preempt=lambda qos: not qos.startswith(SCAVENGER_PREFIX),
                preemptable=lambda qos: qos.startswith(SCAVENGER_PREFIX),
                exempt_s=float(policy.min_run_of()),
                signal=self._slurm_preempt,
            )
        self.specs = list(jobs)
        self.horizon_s = horizon_s if horizon_s is not None else max((j.submit_s for j in jobs), default=0.0)
        self.now = 0.0
        self.dirty = False
        self.active: dict[int, SimJob] = {}
        self.in_flight: set[int] = set()
        self._heap: list[tuple[float, int, int, SimJob | None, int]] = []
        self._seq = 0
        self._tick_queued = False
        self.log = ReplayLog(self.variant, self.horizon_s, self.sim.capacity, [])
        bins = math.ceil(self.horizon_s / IDLE_BIN_S) + 1
        self.log.idle_by_cause = {c: [0.0] * bins for c in IDLE_CAUSES}
        self._idle_from = 0.0
        self._idle_now: dict[str, float] = {}
        self.controller = None
        if self.variant is Variant.NURO:
            from nuro.slurm_plugins.controller.daemon import Controller  # the engine is only needed for this variant

            self._backend = SimBackend(self)
            self.controller = Controller(self._backend, policy, clock=lambda: EPOCH + self.now,
                                         progress=self.progress, node_weights=node_weights)  # fmt: skip

    # -- events --------------------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, job: SimJob | None = None, token: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, job, token))

    def run(self, progress: Callable[[float], None] | None = None) -> ReplayLog:
        """Run to the horizon. Controller warnings (stale decisions refused) are expected here and silenced."""
        nuro_log = logging.getLogger("nuro")
        old_level = nuro_log.level
        nuro_log.setLevel(logging.ERROR)
        t0 = time.perf_counter()
        try:
            self._run(progress)
        finally:
            nuro_log.setLevel(old_level)
        self.log.wall_s = time.perf_counter() - t0
        return self.log

    def _run(self, progress: Callable[[float], None] | None) -> None:
        for spec in self.specs:
            tier = self.policy.tier(spec.tier)
            qos = tier.name if tier is not None else self.policy.team(spec.team).guaranteed_qos
            job = SimJob(spec, qos)  # the scavenger variant routes it at arrival (``_route``)
            self.log.jobs.append(job)
            self._push(spec.submit_s, ARRIVE, job)
        next_report = 0.0
        while self._heap and self._heap[0][0] <= self.horizon_s:
            t = self._heap[0][0]
            self.now = t
            tick = False
            while self._heap and self._heap[0][0] == t:
                _, kind, _, job, token = heapq.heappop(self._heap)
                if kind == TICK:
                    tick, self._tick_queued = True, False
                elif job is None:
                    continue
                elif kind == ARRIVE:
                    self.active[job.job_id] = job
                    if self.variant is Variant.SCAVENGER:
                        self._route(job)
                    self.sim.submit(job, t)
                    self.dirty = True
                elif kind == END and job.token == token and job.state == RUNNING:
                    self._finish(job, "done")
                elif kind == ACK and job.token == token and job.state == RUNNING:
                    self._ack(job)
                    if self.variant is Variant.SCAVENGER:  # committed: the job exits, Slurm requeues it
                        self.requeue(job)
                elif kind == GRACE_END and job.token == token and job.state == RUNNING:
                    self.requeue(job)
                elif kind == ELIGIBLE:
                    self.dirty = True
            if tick and self.controller is not None and (self.sim.pending or self.in_flight):
                report = self.controller.cycle()
                self.log.cycles += 1
                self.log.decide_s += report.decide_s
                for o in report.outcomes:
                    self.log.counters[type(o.decision).__name__ + ("" if o.applied else ".refused")] += 1
                    if type(o.decision).__name__ in ("Preempt", "Requeue"):
                        self.log.counters[f"{type(o.decision).__name__}.{getattr(o.decision, 'code', '')}"] += 1
            if self.dirty:
                self.dirty = False
                if self.controller is not None and self.controller.node_weights:
                    # the daemon sets weights every second: by any scheduling pass they follow the nodes' use
                    self.controller.reweigh(self._backend.builder.nodes())
                for job in self.sim.schedule(t):
                    self._started(job)
            self._sample()
            if self.controller is not None and not self._tick_queued and (self.sim.pending or self.in_flight):
                self._push((math.floor(t / self.interval_s) + 1) * self.interval_s, TICK)
                self._tick_queued = True
            if progress is not None and t >= next_report:
                progress(t)
                next_report = t + 86400.0
        self.now = self.horizon_s
        self._idle_causes(self.horizon_s)
        for job in list(self.sim.running.values()):
            self._finish(job, "censored")
        for job in self.sim.pending.values():
            self._pend_record(job, self.horizon_s)
        self.log.counters["limit_breaches_at_start"] = self.sim.limit_breaches

    def _idle_causes(self, t: float) -> None:
        """Book the idle-while-waiting of the state since the last batch up to ``t``, then take this state's: idle
        GPUs up to the pending GPUs, shared among the pending jobs' causes (``IDLE_CAUSES``) by their GPUs."""
        t0, record = self._idle_from, self.log.idle_by_cause
        while t0 < t and self._idle_now:
            b = int(t0 // IDLE_BIN_S)
            t1 = min(t, (b + 1) * IDLE_BIN_S)
            for cause, gpus in self._idle_now.items():
                record[cause][min(b, len(record[cause]) - 1)] += gpus * (t1 - t0)
            t0 = t1
        self._idle_from = t
        idle = self.sim.capacity - self.sim.allocated
        self._idle_now = {}
        if idle <= 0 or not self.sim.pending:
            return
        wanted: Counter = Counter()
        for job in self.sim.pending.values():
            if job.reason in ("QOSGrpGRES", "QOSMinGRES"):
                wanted["qos_limit"] += job.gpus
            elif job.reason == "BeginTime":
                wanted["requeue_delay"] += job.gpus
            elif job.gpus > idle:
                wanted["too_few_idle"] += job.gpus
            else:
                wanted["reservation" if job.reason == "Priority" else "fragmentation"] += job.gpus
        total = sum(wanted.values())
        if total:
            served = min(idle, total)
            self._idle_now = {cause: served * gpus / total for cause, gpus in wanted.items()}

    def _sample(self) -> None:
        self._idle_causes(self.now)
        self.log.samples += 1
        over = self.sim.qos_over_limit()
        if any(q.startswith("g-") for q in over):
            self.log.g_over_quota_samples += 1
        if any(q.startswith("b-") for q in over):
            self.log.b_over_limit_samples += 1

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def _pend_record(self, job: SimJob, until: float) -> None:
        self.log.pends.append(PendRecord(job.job_id, job.spec.team, job.gpus, job.pending_since_s, until))

    def _started(self, job: SimJob) -> None:
        self._pend_record(job, self.now)
        self.log.counters["starts"] += 1
        self._push(job.expected_end_s(math.inf), END, job, job.token)

    def _trained_s(self, job: SimJob, until: float) -> float:
        stop = until if job.stop_train_s is None else min(until, job.stop_train_s)
        return max(0.0, stop - (job.train_start_s or 0.0))

    def _periodic_gain_s(self, job: SimJob, until: float) -> float:
        """Progress of this run up to its last periodic checkpoint before ``until``."""
        interval = job.spec.ckpt_interval_s
        k = math.floor(self._trained_s(job, until) / interval)
        k = min(k, math.floor(job.remaining_s / interval))
        return max(0, k) * interval

    def refresh_checkpoint(self, job: SimJob, now: float) -> None:
        """Write the job's latest periodic checkpoint into its comment, as its rank 0 would have (the SDK writes
        ``ckpt`` after each commit; here it is written lazily, when someone reads the comment)."""
        if job.state != RUNNING or job.train_start_s is None:
            return
        gain = self._periodic_gain_s(job, now)
        if gain <= 0:
            return
        at = EPOCH + job.train_start_s + gain
        mark = job.comment.get("ckpt")
        if isinstance(mark, dict) and mark.get("at", 0) >= at:
            return
        self._set_comment(job, ckpt={"step": int(job.work_done_s + gain), "at": math.ceil(at)})  # whole s

    def progress(self) -> dict:
        """What the node agents would report (``slurm_plugins/controller/progress.py``): each running job's newest
        commit and ack, as the sim keeps them in ``job.comment`` (the simulator's own record; the engine reads no
        job comment)."""
        from nuro.slurm_plugins.controller.progress import Progress

        out = {}
        for job in self.sim.running.values():
            ckpt, ack = job.comment.get("ckpt"), job.comment.get("ack")
            if ckpt or ack:
                out[job.job_id] = Progress(
                    ckpt["step"] if ckpt else None, float(ckpt["at"]) if ckpt else None,
                    ack["step"] if ack else None, float(ack["at"]) if ack else None,
                    frozenset(self.sim.names[i] for i in job.nodes),
                )  # fmt: skip
        return out

    def _set_comment(self, job: SimJob, **updates: object) -> None:
        job.comment_text = jobcomment.merge(job.comment_text, **updates)
        job.comment = jobcomment.parse(job.comment_text).raw

    def move_qos(self, job: SimJob, qos: str) -> None:
        self.log.counters[f"qos_to_{qos.split('-', 1)[0]}"] += 1
        job.qos = qos
        self.dirty = True

    def _route(self, job: SimJob) -> None:
        """The scavenger variant's job_submit rule: over the team's quota (running and pending guaranteed work
        included) at submission, the job goes to the team's scavenger QOS for life."""
        g = job.qos
        if not g.startswith("g-"):
            return
        waiting = sum(p.gpus for p in self.sim.pending.values() if p.qos == g)
        if self.sim.qos_used.get(g, 0) + waiting + job.gpus > (self.sim.qos_limits.get(g) or 0):
            job.qos = SCAVENGER_PREFIX + job.spec.team
            self.log.counters["routed_to_scavenger"] += 1

    def _slurm_preempt(self, job: SimJob) -> None:
        """preempt/qos with REQUEUE and GraceTime: the signal now, the requeue at grace end (or at the victim's
        own commit, ``ACK``)."""
        self.signal(job, PREEMPT_SIGNAL)
        self._push(self.now + self.policy.grace_s, GRACE_END, job, job.token)

    def signal(self, job: SimJob, sig: str) -> None:
        """The preemption signal: an acking job stops training and commits a checkpoint; others ignore it."""
        if sig != PREEMPT_SIGNAL or job.signalled_s is not None:
            return
        job.signalled_s = self.now
        self.in_flight.add(job.job_id)
        self.log.counters["preemptions"] += 1
        if job.spec.acks:
            job.stop_train_s = self.now
            job.token += 1  # it will not reach its END while checkpointing
            self._push(self.now + job.spec.ckpt_commit_s, ACK, job, job.token)

    def _ack(self, job: SimJob) -> None:
        gain = self._trained_s(job, self.now)
        job.ack_gain_s = gain
        mark = {"step": int(job.work_done_s + gain), "at": round(EPOCH + self.now)}  # whole s: canonical
        self._set_comment(job, ckpt=mark, ack=mark)
        self.log.counters["acks"] += 1

    def requeue(self, job: SimJob) -> None:
        acked = job.ack_gain_s is not None
        self.log.counters["requeues_acked" if acked else "requeues_unacked"] += 1
        self._finish(job, "requeued")

    def _finish(self, job: SimJob, outcome: str) -> None:
        """End a run: record it, keep the retained progress, release the GPUs; then done, pending, or cut."""
        t = self.now
        run_start = job.run_start_s if job.run_start_s is not None else t
        train_start = job.train_start_s if job.train_start_s is not None else t
        if outcome == "done":
            gain = job.remaining_s
        elif outcome == "requeued":
            gain = job.ack_gain_s if job.ack_gain_s is not None else self._periodic_gain_s(job, t)
        else:  # censored: its progress does not matter any more
            gain = self._trained_s(job, t)
        lost = job.gpus * max(0.0, t - train_start - gain) if outcome == "requeued" else 0.0
        restart = job.gpus * min(job.spec.restart_overhead_s, t - run_start) if job.restarts else 0.0
        self.log.runs.append(
            RunRecord(
                job.job_id,
                job.spec.team,
                job.qos,
                job.gpus,
                run_start,
                t,
                train_start,
                job.stop_train_s,
                outcome,
                job.gpus * gain,
                lost,
                restart,
                job.spec.node_count,
                self.sim.leaves_spanned(job.nodes),
            )
        )
        job.work_done_s = min(job.spec.runtime_s, job.work_done_s + gain)
        self.sim.release(job, t)
        self.in_flight.discard(job.job_id)
        job.ack_gain_s = None
        self.dirty = True
        if outcome == "requeued":
            job.restarts += 1
            job.signalled_s = job.stop_train_s = None
            job.eligible_s = t + self.params.requeue_delay_s
            self.sim.submit(job, t)
            self._push(job.eligible_s, ELIGIBLE, job)
        else:
            job.state = DONE
            job.end_s = t
            self.active.pop(job.job_id, None)


def run_replay(
    jobs: Sequence[JobSpec],
    nodes: Sequence[NodeSpec],
    policy: Policy,
    variant: Variant | str,
    interval_s: float = 30.0,
    horizon_s: float | None = None,
    sched: SchedParams = DEFAULT_SCHED,
    node_weights: bool = True,
) -> ReplayLog:
    """One replay to the horizon (default: the last arrival)."""
    return Replay(jobs, nodes, policy, Variant(variant), interval_s, horizon_s, sched, node_weights).run()


__all__ = ["PendRecord", "Replay", "ReplayLog", "RunRecord", "Variant", "run_replay"]

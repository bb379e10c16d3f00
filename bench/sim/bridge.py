"""The replay seen through nuro's own Slurm interface: a ``Backend`` over the simulator.

Why a Backend rather than calling ``decide`` and interpreting its decisions here: the nuro variant then runs the
daemon's real cycle (``Controller.cycle``: snapshot → ``engine.decide`` → ``apply.apply_decision`` → soft state),
so the replay measures the code that runs on the cluster, including how decisions become Slurm calls (QOS updates,
the ``preempt`` comment, the USR1 signal, the requeue) and how the controller's state follows them. Only
``read_snapshot`` and the five actions the controller uses are implemented; anything else is refused loudly.

Times: replay second ``t`` is Unix time ``EPOCH + t`` (datetimes in UTC), the clock the controller is given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from nuro.slurm import hostlist
from nuro.slurm.actions import (
    Action,
    ActionResult,
    Requeue,
    Signal,
    UpdateAdminComment,
    UpdateComment,
    UpdateJobs,
    UpdateNodeWeight,
    UpdateQos,
    UpdateQosMinGpus,
    UpdateSiteFactor,
)
from nuro.slurm.backend import Backend
from nuro.slurm.errors import InvalidJobId, SlurmError
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo, PartitionInfo, SlurmVersion
from nuro.slurm.states import JobPhase

if TYPE_CHECKING:
    from bench.sim.replay import Replay
    from bench.sim.slurm import SimJob

EPOCH = 1_700_000_000.0
PARTITION = "gpu"


def to_dt(t: float) -> datetime:
    return datetime.fromtimestamp(EPOCH + t, UTC)


class InvalidState(SlurmError):
    """What slurmctld answers when an update does not fit the job's state (e.g. QOS of a running job)."""


def render_comment(comment: dict) -> str:
    return json.dumps(comment, separators=(",", ":"), sort_keys=True) if comment else ""


class SnapshotBuilder:
    """Builds ``ClusterSnapshot``s of the replay, reusing unchanged ``NodeInfo``/``JobInfo`` values (a snapshot
    is taken every controller interval; most jobs and nodes did not change since the last one)."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        sim = replay.sim
        self._partition = PartitionInfo(PARTITION, tuple(sim.names), "UP", total_nodes=len(sim.names), default=True)
        self._nodes: dict[int, tuple[int, NodeInfo]] = {}
        self._jobs: dict[int, tuple[tuple, JobInfo]] = {}
        self._dt: dict[float, datetime] = {}

    def _when(self, t: float | None) -> datetime | None:
        if t is None:
            return None
        dt = self._dt.get(t)
        if dt is None:
            if len(self._dt) > 200_000:
                self._dt.clear()
            dt = self._dt[t] = to_dt(t)
        return dt

    def node(self, i: int) -> NodeInfo:
        sim = self.replay.sim
        alloc = sim.total[i] - sim.free[i]
        key = (alloc, sim.weight[i])
        cached = self._nodes.get(i)
        if cached is not None and cached[0] == key:
            return cached[1]
        state = "IDLE" if alloc == 0 else ("ALLOCATED" if sim.free[i] == 0 else "MIXED")
        info = NodeInfo(
            name=sim.names[i],
            state=state,
            flags=frozenset({state}),
            gres=f"gpu:{sim.total[i]}",
            gpus_total=sim.total[i],
            gpus_alloc=alloc,
            partitions=(PARTITION,),
            switch=sim.leaf_names[sim.leaf_of[i]],
            weight=sim.weight[i],
        )
        self._nodes[i] = (key, info)
        return info

    def job(self, job: SimJob, now: float) -> JobInfo:
        self.replay.refresh_checkpoint(job, now)
        comment = job.comment_text
        key = (job.state, job.qos, job.reason, job.priority, comment, job.token, job.eligible_s, job.signalled_s)
        cached = self._jobs.get(job.job_id)
        if cached is not None and cached[0] == key:
            return cached[1]
        spec, sim = job.spec, self.replay.sim
        running = job.state == "RUNNING"
        info = JobInfo(
            job_id=job.job_id,
            name=spec.name,
            user=spec.user,
            state=job.state,
            phase=JobPhase.RUNNING if running else JobPhase.PENDING,
            reason=job.reason,
            account=spec.team,
            qos=job.qos,
            partition=PARTITION,
            priority=job.priority,
            nodes=tuple(sim.names[i] for i in job.nodes),
            node_count=spec.node_count,
            gres_per_node=f"gpu:{spec.gpus_per_node}",
            gpus_per_node=spec.gpus_per_node,
            gpus_total=spec.gpus,
            restart_count=job.restarts,
            comment=comment,
            requeue=True,
            submit_time=self._when(spec.submit_s),
            eligible_time=self._when(max(job.eligible_s, spec.submit_s)),
            start_time=self._when(job.run_start_s) if running else None,
            end_time=self._when(job.expected_end_s(self.replay.policy.grace_s)) if running else None,
        )
        self._jobs[job.job_id] = (key, info)
        return info

    def nodes(self) -> tuple[NodeInfo, ...]:
        return tuple(self.node(i) for i in range(len(self.replay.sim.names)))

    def snapshot(self, now: float) -> ClusterSnapshot:
        sim = self.replay.sim
        nodes = self.nodes()
        jobs = tuple(self.job(j, now) for j in (*sim.running.values(), *sim.pending.values()))
        return ClusterSnapshot(nodes, jobs, (self._partition,), to_dt(now), source="trace-replay")

    def forget(self, job_id: int) -> None:
        self._jobs.pop(job_id, None)


class SimBackend(Backend):
    """The controller's view of the replay: snapshots in, actions applied to the simulated slurmctld."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.builder = SnapshotBuilder(replay)

    def read_snapshot(self) -> ClusterSnapshot:
        return self.builder.snapshot(self.replay.now)

    def finished_jobs(self, job_ids: Iterable[int | str]) -> list[JobInfo]:
        return []

    def version(self) -> SlurmVersion:
        return SlurmVersion(22, 5, 8)

    def job_comment(self, job_id: int | str) -> str:
        job = self._job(job_id)
        self.replay.refresh_checkpoint(job, self.replay.now)
        return job.comment_text

    def _job(self, job_id: int | str) -> SimJob:
        job = self.replay.active.get(int(job_id))
        if job is None:
            raise InvalidJobId(f"Invalid job id specified: {job_id}")
        return job

    def apply(self, action: Action) -> ActionResult:
        try:
            message = self._apply(action)
        except SlurmError as exc:
            return ActionResult(action, ok=False, message=str(exc), error=exc)
        return ActionResult(action, ok=True, message=message)

    def _apply(self, action: Action) -> str:
        r = self.replay
        if isinstance(action, UpdateJobs):
            # as scontrol does with a job list: each job alone, one "<message> for job <id>" line per refusal
            errors = []
            for job_id in action.job_ids:
                one = (
                    UpdateQos(job_id, action.qos)
                    if action.qos is not None
                    else UpdateSiteFactor(job_id, int(action.site_factor or 0))
                )
                try:
                    self._apply(one)
                except SlurmError as exc:
                    errors.append(f"{exc} for job {job_id}")
            if errors:
                raise InvalidState("\n".join(errors))
            return ""
        if isinstance(action, UpdateQos):
            job = self._job(action.job_id)
            if job.state != "PENDING":
                raise InvalidState(f"job {job.job_id}: QOS of a {job.state} job cannot change")
            if action.qos not in r.sim.qos_limits:
                raise InvalidState(f"job {job.job_id}: invalid qos {action.qos}")
            r.move_qos(job, action.qos)
            return ""
        if isinstance(action, UpdateSiteFactor):
            job = self._job(action.job_id)
            job.site_factor = int(action.value)
            r.dirty = True
            return ""
        if isinstance(action, UpdateAdminComment):
            self._job(action.job_id)  # the owner's note: nothing in the replay reads it
            return ""
        if isinstance(action, UpdateComment):
            job = self._job(action.job_id)
            job.comment = json.loads(action.comment) if action.comment else {}
            job.comment_text = action.comment
            return ""
        if isinstance(action, Signal):
            job = self._job(action.job_id)
            if job.state != "RUNNING":
                raise InvalidState(f"job {job.job_id} is {job.state}: nothing to signal")
            r.signal(job, action.signal)
            return ""
        if isinstance(action, UpdateNodeWeight):
            for name in hostlist.expand(action.node):
                r.sim.weight[r.sim.index_of(name)] = action.weight
            r.dirty = True
            return ""
        if isinstance(action, UpdateQosMinGpus):
            if action.qos not in r.sim.qos_limits:
                raise InvalidState(f"qos {action.qos} does not exist")
            if action.gpus is None:
                r.sim.qos_min.pop(action.qos, None)
            else:
                r.sim.qos_min[action.qos] = action.gpus
            r.dirty = True
            return ""
        if isinstance(action, Requeue):
            job = self._job(action.job_id)
            if job.state != "RUNNING":
                raise InvalidState(f"job {job.job_id} is {job.state}: cannot requeue")
            r.requeue(job)
            return ""
        raise SlurmError(f"the trace replay does not simulate {type(action).__name__}")


__all__ = ["EPOCH", "InvalidState", "SimBackend", "SnapshotBuilder", "render_comment", "to_dt"]

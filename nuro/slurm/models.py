"""Frozen value types for what Slurm reports: nodes, jobs, partitions, a whole-cluster snapshot, the version.

Why frozen: the controller's decision step is a pure function of a snapshot; nothing may edit a snapshot
behind its back, and what-if views are built with ``without_jobs`` instead of mutation.

Conventions: times are timezone-aware UTC ``datetime`` or None (Slurm's 0 / "Unknown" / "None"); counts are ints;
``state`` fields keep Slurm's raw text so nothing is lost, and parsed views sit next to them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from types import MappingProxyType

from nuro.slurm.states import JobPhase

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class SlurmVersion:
    """A Slurm release such as 22.05.8; compares as a tuple (major, minor, micro)."""

    major: int
    minor: int
    micro: int = 0

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def major_minor(self) -> tuple[int, int]:
        """(22, 5) for 22.05.8: what must match between libslurm bindings and the running Slurm."""
        return (self.major, self.minor)

    @property
    def has_scontrol_json(self) -> bool:
        """``scontrol --json`` arrived in 23.02 (22.05 has ``squeue/sinfo/sacct --json`` only)."""
        return (self.major, self.minor) >= (23, 2)


#: The first Slurm that requeues a job submitted with ``--requeue=expedite`` at once when its node fails (no
#: ``cred_expire`` wait; slurm.conf's ``enable_expedited_requeue``). Older ones refuse the flag; there nuro's detector
#: starts the jobs it requeued itself once that is safe (``nuro.slurm_plugins.controller.expedite``).
EXPEDITED_REQUEUE_SINCE = (25, 11)
#: The first Slurm whose slurmd forgets a requeued job's old attempt as soon as the new attempt's credential arrives
#: (created in a later second than the old one's revoke), so a surviving node runs the new attempt's prolog at once.
#: 22.05 sets the old entry to expire but purges at most once per 2 s (``_clear_expired_job_states``), so the new
#: attempt may find it and skip the prolog until ``cred_expire`` has passed (SchedMD bug 15656, fixed in 23.02).
REISSUE_PURGES_SINCE = (23, 2)


@dataclass(frozen=True)
class NodeInfo:
    """One node as slurmctld sees it.

    Attributes:
        state: Slurm's state text with flags, e.g. "IDLE", "MIXED", "IDLE+DRAIN", "DOWN+NOT_RESPONDING".
        flags: every word of ``state`` (base state and flags), e.g. {"IDLE", "DRAIN"}.
        reason: the drain/down reason, None when there is none.
        gres: configured GRES text, e.g. "gpu:8".
        gpus_total / gpus_alloc: GPUs configured / allocated to jobs right now.
        switch: the lowest-level (leaf) topology switch holding this node; None without topology/tree.
        weight: Slurm's scheduling ``Weight`` now (the lowest that satisfies a request wins); None where the read
            did not say.
    """

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str | None = None
    gres: str = ""
    gpus_total: int = 0
    gpus_alloc: int = 0
    cpus: int = 0
    cpus_alloc: int = 0
    partitions: tuple[str, ...] = ()
    switch: str | None = None
    weight: int | None = None

    @property
    def base_state(self) -> str:
        """The state without flags: "IDLE" for "IDLE+DRAIN"."""
        return self.state.split("+", 1)[0]

    @property
    def is_drained(self) -> bool:
        """Drain requested (DRAINING while jobs finish, DRAINED once empty: both carry the DRAIN flag)."""
        return "DRAIN" in self.flags or "DRAINED" in self.flags or "DRAINING" in self.flags

    @property
    def is_down(self) -> bool:
        """Down, failed or not responding: jobs cannot run here."""
        return bool(self.flags & {"DOWN", "FAIL", "NOT_RESPONDING", "FUTURE", "INVAL", "UNKNOWN"})

    @property
    def is_schedulable(self) -> bool:
        """Slurm may start new jobs on this node (not drained, down, reserved-for-maintenance or powered off)."""
        return not (self.is_drained or self.is_down or self.flags & {"MAINTENANCE", "POWERED_DOWN", "REBOOT"})

    @property
    def gpus_free(self) -> int:
        """GPUs not allocated (0 when the node cannot take jobs)."""
        return max(self.gpus_total - self.gpus_alloc, 0) if self.is_schedulable else 0


@dataclass(frozen=True)
class JobInfo:
    """One job from squeue (live) or sacct (accounting).

    Attributes:
        state: Slurm's raw state text ("RUNNING", "PENDING", "REQUEUED", ...); ``phase`` is the mapped view.
        reason: Slurm's state reason ("None", "Resources", "QOSGrpGRES", "BeginTime", ...).
        nodes: expanded node names; empty while pending.
        gpus_per_node: GPUs requested per node (from tres_per_node / --gres / --gpus-per-node); 0 when none.
        gpus_total: GPUs allocated (running/finished) or requested (pending) for the whole job.
        comment: the job comment (nuro keeps its run metadata JSON here); sacct only has it when
            AccountingStoreFlags=job_comment is set.
        eligible_time: when the job may start (after a requeue: requeue time + cred_expire + 1 s).
        start_time: None while PENDING (22.05 reports leftovers there); the real start once started.
        end_time: None while PENDING; for a RUNNING job Slurm's expected end (start + time limit, a year for
            UNLIMITED); the real end once finished. Right after a requeue the job is briefly COMPLETING with a
            meaningless end_time.
        exit_code / exit_signal: the batch script's exit status and killing signal; None while not finished.
        requeue: whether Slurm may requeue the job (--requeue / JobRequeue); sacct does not report it (False).
    """

    job_id: int
    name: str
    user: str
    state: str
    phase: JobPhase
    reason: str = ""
    account: str = ""
    qos: str = ""
    partition: str = ""
    priority: int = 0
    nodes: tuple[str, ...] = ()
    node_count: int = 0
    gres_per_node: str = ""
    gpus_per_node: int = 0
    gpus_total: int = 0
    restart_count: int = 0
    comment: str = ""
    requeue: bool = False
    submit_time: datetime | None = None
    eligible_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None

    @property
    def is_finished(self) -> bool:
        """Terminal phase: Slurm will not run this job again by itself."""
        return self.phase.is_terminal


@dataclass(frozen=True)
class PartitionInfo:
    """One partition: its nodes, state and sizes."""

    name: str
    nodes: tuple[str, ...] = ()
    state: str = "UNKNOWN"
    total_cpus: int = 0
    total_nodes: int = 0
    default: bool = False


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything one poll saw, taken at ``taken_at`` (UTC). Immutable; lookups are O(1).

    ``jobs`` includes recently finished jobs that slurmctld still remembers (MinJobAge, 300 s by default).
    """

    nodes: tuple[NodeInfo, ...]
    jobs: tuple[JobInfo, ...]
    partitions: tuple[PartitionInfo, ...]
    taken_at: datetime
    source: str = ""
    _node_index: Mapping[str, NodeInfo] = field(init=False, repr=False, compare=False)
    _job_index: Mapping[int, JobInfo] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_node_index", MappingProxyType({n.name: n for n in self.nodes}))
        object.__setattr__(self, "_job_index", MappingProxyType({j.job_id: j for j in self.jobs}))

    def node(self, name: str) -> NodeInfo | None:
        """The node called ``name``, or None."""
        return self._node_index.get(name)

    def job(self, job_id: int | str) -> JobInfo | None:
        """The job with this id, or None (accepts "123" as well as 123)."""
        try:
            return self._job_index.get(int(job_id))
        except ValueError:
            return None

    def partition(self, name: str) -> PartitionInfo | None:
        """The partition called ``name``, or None."""
        return next((p for p in self.partitions if p.name == name), None)

    def jobs_in(self, *phases: JobPhase) -> tuple[JobInfo, ...]:
        """Jobs whose phase is one of ``phases``, in snapshot order."""
        wanted = set(phases)
        return tuple(j for j in self.jobs if j.phase in wanted)

    @cached_property
    def gpus_total(self) -> int:
        """GPUs configured on all nodes."""
        return sum(n.gpus_total for n in self.nodes)

    def without_jobs(self, job_ids: Iterable[int]) -> ClusterSnapshot:
        """A what-if copy without these jobs (node allocations are not recomputed)."""
        drop = set(job_ids)
        return replace(self, jobs=tuple(j for j in self.jobs if j.job_id not in drop))

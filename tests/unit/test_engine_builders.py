"""Fluent builders for engine tests, plus a few tests that the builders build what they say.

a_job(7).team("perception").borrowed().gpus(8).running_on("n01").ckpt_age_s(600).build()
a_cluster().nodes(4, gpus=8).jobs(j1, j2).build()        # node allocations derived from the running jobs
a_policy().team("a", quota=16, borrow=8, lend=8).tier("urgent", accounts=["a"]).build()

What a job reports and what the controller did to it travel outside Slurm's job record (issue 30: the agents'
progress reports, the controller's ledger); the builders carry them in a test-only side field, the job's comment
(which the engine never reads), and ``decide`` below hands them to the engine as the daemon does: the reported
commits and acks as ``progress``, the preemptions as the ledger's in-flight state.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime

from nuro.policy.model import Policy, Team, Tier
from nuro.protocol import jobcomment
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo
from nuro.slurm.states import JobPhase
from nuro.slurm_plugins.controller import engine
from nuro.slurm_plugins.controller.cycle import ControllerState
from nuro.slurm_plugins.controller.decisions import Decisions
from nuro.slurm_plugins.controller.progress import Progress

NOW = 1_700_000_000.0  # the injected clock of every engine test


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


class JobBuilder:
    def __init__(self, job_id: int) -> None:
        self._id = job_id
        self._team = "a"
        self._qos: str | None = None
        self._account: str | None = None
        self._state = "PENDING"
        self._reason = "Resources"
        self._nodes: tuple[str, ...] = ()
        self._node_count = 1
        self._gpn = 8
        self._priority = 1000
        self._submit = NOW - 3600 + job_id  # older ids submitted first
        self._start: float | None = None
        self._end: float | None = None
        self._comment: dict = {}

    # who
    def team(self, name: str) -> JobBuilder:
        self._team = name
        return self

    def guaranteed(self) -> JobBuilder:
        self._qos = None
        return self

    def borrowed(self) -> JobBuilder:
        self._qos = f"b-{self._team}"
        return self

    def tier(self, name: str) -> JobBuilder:
        self._qos = name
        return self

    def unmanaged(self, account: str = "other") -> JobBuilder:
        self._qos, self._account = "normal", account
        return self

    # what
    def gpus(self, per_node: int, nodes: int = 1) -> JobBuilder:
        self._gpn, self._node_count = per_node, nodes
        return self

    def priority(self, p: int) -> JobBuilder:
        self._priority = p
        return self

    def submitted(self, t: float) -> JobBuilder:
        self._submit = t
        return self

    # where it is
    def pending(self, reason: str = "Resources") -> JobBuilder:
        self._state, self._reason, self._nodes, self._start = "PENDING", reason, (), None
        return self

    def over_quota(self) -> JobBuilder:
        return self.pending("QOSGrpGRES")

    def running_on(self, *nodes: str, started_s_ago: float = 7200) -> JobBuilder:
        self._state, self._reason, self._nodes = "RUNNING", "None", tuple(nodes)
        self._node_count = len(nodes)
        self._start = NOW - started_s_ago
        return self

    def ends_in(self, s: float) -> JobBuilder:
        """Slurm's expected end (start + time limit), ``s`` seconds from NOW."""
        self._end = NOW + s
        return self

    def completing(self) -> JobBuilder:
        self._state = "COMPLETING"
        return self

    # side channels (the agents' reports, the controller's ledger): see the module docstring
    def ckpt_age_s(self, age_s: float, step: int = 100) -> JobBuilder:
        self._comment["ckpt"] = {"step": step, "at": round(NOW - age_s)}
        return self

    def signalled_s_ago(self, s: float, for_job: int = 0) -> JobBuilder:
        self._comment["preempt"] = {"at": round(NOW - s), "for": for_job}  # in the controller's ledger
        return self

    def acked_s_ago(self, s: float, step: int = 120) -> JobBuilder:
        self._comment["ack"] = {"step": step, "at": round(NOW - s)}
        return self

    def build(self) -> JobInfo:
        qos = self._qos or f"g-{self._team}"
        running = self._state != "PENDING"
        return JobInfo(
            job_id=self._id,
            name=f"job{self._id}",
            user="u",
            state=self._state,
            phase=JobPhase(self._state),
            reason=self._reason,
            account=self._account or self._team,
            qos=qos,
            priority=self._priority,
            nodes=self._nodes,
            node_count=self._node_count,
            gpus_per_node=self._gpn,
            gpus_total=self._gpn * self._node_count,
            comment=jobcomment.canonical(self._comment) if self._comment else "",
            submit_time=_dt(self._submit),
            start_time=_dt(self._start) if running and self._start is not None else None,
            end_time=_dt(self._end) if running and self._end is not None else None,
        )


def a_job(job_id: int) -> JobBuilder:
    return JobBuilder(job_id)


def channels(snapshot: ClusterSnapshot) -> tuple[dict[int, float], dict[int, Progress]]:
    """(the ledger's in-flight preemptions, the agents' progress) the builders put beside the jobs."""
    ledger: dict[int, float] = {}
    progress: dict[int, Progress] = {}
    for j in snapshot.jobs:
        side = jobcomment.record(j.comment) or {}
        if isinstance(side.get("preempt"), dict):
            ledger[j.job_id] = float(side["preempt"]["at"])
        ckpt, ack = side.get("ckpt"), side.get("ack")
        if isinstance(ckpt, dict) or isinstance(ack, dict):
            progress[j.job_id] = Progress(
                ckpt["step"] if ckpt else None, float(ckpt["at"]) if ckpt else None,
                ack["step"] if ack else None, float(ack["at"]) if ack else None, frozenset(j.nodes),
            )  # fmt: skip
    return ledger, progress


def decide(snapshot: ClusterSnapshot, policy: Policy, state: ControllerState, now: float) -> Decisions:
    """``engine.decide`` with the side channels: the ledger's preemptions join ``state`` (as a restarted daemon's
    ``rebuild_state`` does), the reported commits and acks are its ``progress``."""
    ledger, progress = channels(snapshot)
    if ledger:
        rebuilt = engine.rebuild_state(snapshot, ledger).preempting
        state = replace(state, preempting={**rebuilt, **state.preempting})
    return engine.decide(snapshot, policy, state, now, progress)


class ClusterBuilder:
    def __init__(self) -> None:
        self._nodes: list[NodeInfo] = []
        self._jobs: list[JobInfo] = []

    def nodes(self, count: int, gpus: int = 8, prefix: str = "n", leaf: int = 4, start: int = 1) -> ClusterBuilder:
        for i in range(start, start + count):
            self._nodes.append(
                NodeInfo(name=f"{prefix}{i:02d}", state="IDLE", flags=frozenset({"IDLE"}), gres=f"gpu:{gpus}",
                         gpus_total=gpus, switch=f"leaf{(i - 1) // leaf}")
            )  # fmt: skip
        return self

    def drained(self, *names: str) -> ClusterBuilder:
        self._nodes = [
            replace(n, state="IDLE+DRAIN", flags=frozenset({"IDLE", "DRAIN"})) if n.name in names else n
            for n in self._nodes
        ]
        return self

    def jobs(self, *jobs: JobInfo | JobBuilder) -> ClusterBuilder:
        self._jobs.extend(j.build() if isinstance(j, JobBuilder) else j for j in jobs)
        return self

    def build(self) -> ClusterSnapshot:
        alloc: dict[str, int] = {}
        for j in self._jobs:
            if j.phase.holds_resources:
                for n in j.nodes:
                    alloc[n] = alloc.get(n, 0) + j.gpus_per_node
        nodes = []
        for n in self._nodes:
            a = alloc.get(n.name, 0)
            if a > n.gpus_total:
                raise ValueError(f"test cluster: node {n.name} has {n.gpus_total} GPUs but jobs use {a}")
            base = "IDLE" if a == 0 else ("ALLOCATED" if a == n.gpus_total else "MIXED")
            flags = (n.flags - {"IDLE", "MIXED", "ALLOCATED"}) | {base}
            state = "+".join([base, *sorted(flags - {base})])
            nodes.append(replace(n, gpus_alloc=a, state=state, flags=frozenset(flags)))
        return ClusterSnapshot(nodes=tuple(nodes), jobs=tuple(self._jobs), partitions=(), taken_at=_dt(NOW))


def a_cluster() -> ClusterBuilder:
    return ClusterBuilder()


class PolicyBuilder:
    def __init__(self, cluster_gpus: int = 64, grace_s: int = 60) -> None:
        self._cluster, self._grace = cluster_gpus, grace_s
        self._teams: list[Team] = []
        self._tiers: list[Tier] = []

    def team(self, name: str, quota: int, borrow: int = 0, lend: int = 0, shares: int | None = None,
             buffer: int = 0, gang_first: bool = False) -> PolicyBuilder:  # fmt: skip
        self._teams.append(
            Team(
                name=name,
                quota_gpus=quota,
                borrow_limit_gpus=borrow,
                lend_limit_gpus=lend,
                fairshare=shares,
                lend_buffer_gpus=buffer,
                gang_first=gang_first,
            )
        )
        return self

    def tier(self, name: str, accounts: list[str], priority: int = 100_000, guaranteed: bool = True) -> PolicyBuilder:
        self._tiers.append(
            Tier(name=name, priority=priority, allowed_accounts=tuple(accounts), preempts_guaranteed=guaranteed)
        )
        return self

    def build(self) -> Policy:
        return Policy(
            cluster_gpus=self._cluster, grace_s=self._grace, teams=tuple(self._teams), tiers=tuple(self._tiers)
        )


def a_policy(cluster_gpus: int = 64, grace_s: int = 60) -> PolicyBuilder:
    return PolicyBuilder(cluster_gpus, grace_s)


# -- the builders themselves ---------------------------------------------------------------------------------------


def test_cluster_builder_derives_node_allocation_from_running_jobs() -> None:
    snap = (
        a_cluster()
        .nodes(2, gpus=8)
        .jobs(a_job(1).gpus(4).running_on("n01"), a_job(2).gpus(8).running_on("n02"), a_job(3).pending())
        .build()
    )
    assert [(n.name, n.gpus_alloc, n.gpus_free, n.base_state) for n in snap.nodes] == [
        ("n01", 4, 4, "MIXED"),
        ("n02", 8, 0, "ALLOCATED"),
    ]


def test_job_builder_kinds_and_comment() -> None:
    j = a_job(5).team("b").borrowed().gpus(8, nodes=2).running_on("n01", "n02").ckpt_age_s(60).build()
    assert (j.qos, j.account, j.gpus_total, j.node_count, j.phase) == ("b-b", "b", 16, 2, JobPhase.RUNNING)
    assert json.loads(j.comment)["ckpt"]["at"] == NOW - 60


def test_drained_node_has_no_free_gpus() -> None:
    snap = a_cluster().nodes(2).drained("n02").build()
    assert [n.gpus_free for n in snap.nodes] == [8, 0]

"""The controller's soft state between cycles, and the scratch of one cycle.

``ControllerState`` is all the daemon keeps between cycles: its in-flight preemptions are also in the controller's
own ledger (``ledger.py``; never in a job's comment, whose 1,024 bytes its user may fill), jobs' progress comes from
the node agents (``progress.py``), and site factors are re-derived each cycle. ``Cycle`` is
the what-if copy one ``decide`` call works on: the snapshot is frozen, everything that changes as
decisions are taken (free GPUs, team usage, chosen victims) lives here and is thrown away afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from nuro.policy.classify import CycleView, PolicyIndex
from nuro.policy.model import Policy
from nuro.slurm.models import ClusterSnapshot, JobInfo
from nuro.slurm_plugins.controller.capacity import Capacity
from nuro.slurm_plugins.controller.decisions import Borrow, Preempt, Requeue, Return, SetSiteFactor, Wait
from nuro.slurm_plugins.controller.progress import EMPTY as NO_PROGRESS
from nuro.slurm_plugins.controller.progress import Progress
from nuro.slurm_plugins.controller.victims import Candidate, VictimPool

_EMPTY: Mapping = MappingProxyType({})

#: Seconds after its victims' grace during which a job that got victims gets no new ones: a requeued victim leaves
#: squeue's running jobs before its node is free in sinfo (epilog, completing), and in that gap the job looks as if
#: it still needed room (measured live: a second borrower preempted for the same claimant).
CLAIM_SETTLE_S = 30.0


@dataclass(frozen=True)
class ControllerState:
    """Soft state the daemon keeps between cycles; losing it costs nothing that Slurm cannot give back.

    Attributes:
        preempting: victim job id → Unix time it was signalled (the daemon keeps it in its ledger too, so a restart
            loses no in-flight preemption).
        site_factors: the SiteFactor last set per pending job, so the same value is not set again every cycle.
        usage: each team's decayed GPU usage, as mean GPUs held over about one ``usage_half_life_s``
            (``fairshare.decayed_usage``); after a restart it starts from what the team holds now.
        usage_at: the Unix time ``usage`` (and ``demand_peak``) was last brought up to; None before the first cycle.
        demand_peak: each team's decaying peak of guaranteed demand (``borrowing.demand_peaks``), what lending
            keeps back for it.
        claims: pending job id → when victims were last signalled for it; for ``grace_s + CLAIM_SETTLE_S`` after
            that it gets no new victims (its victims' GPUs may still be on their way back).
    """

    preempting: Mapping[int, float] = field(default_factory=lambda: _EMPTY)
    site_factors: Mapping[int, int] = field(default_factory=lambda: _EMPTY)
    usage: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    usage_at: float | None = None
    demand_peak: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    claims: Mapping[int, float] = field(default_factory=lambda: _EMPTY)


@dataclass
class Cycle:
    """Scratch of one ``decide`` call. Phases read the frozen inputs and append decisions here."""

    snapshot: ClusterSnapshot
    policy: Policy
    state: ControllerState
    now: float
    index: PolicyIndex
    view: CycleView
    cap: Capacity
    usage: dict[str, float] = field(default_factory=dict)  # decayed mean GPUs per team, brought up to now
    loads: dict[str, int] = field(default_factory=dict)  # fair-share load per team, tenths (fairshare.team_loads)
    demand_peak: dict[str, float] = field(default_factory=dict)  # decaying peak guaranteed demand per team
    taken: set[int] = field(default_factory=set)  # victims in flight or chosen this cycle
    in_flight: dict[int, float] = field(default_factory=dict)  # victim id → signalled at, still running
    reclaimed_teams: set[str] = field(default_factory=set)  # teams whose borrowed jobs are being preempted
    draining: dict[int, str] = field(default_factory=dict)  # pending job id → the nodes drained for it (drain.py)
    drain_misses: set[tuple[int, int]] = field(default_factory=set)  # (GPUs per node, nodes) no drain plan found
    requeues: list[Requeue] = field(default_factory=list)
    preempts: list[Preempt] = field(default_factory=list)
    returns: list[Return] = field(default_factory=list)
    borrows: list[Borrow] = field(default_factory=list)
    site_factors: list[SetSiteFactor] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    progress: Mapping[int, Progress] = field(default_factory=lambda: NO_PROGRESS)  # the agents' reports (progress.py)
    _pools: dict[str, VictimPool] = field(default_factory=dict)
    candidates: dict[int, Candidate | None] = field(default_factory=dict)  # victim view per running job, lazily

    def progress_of(self, job: JobInfo) -> Progress | None:
        """What the agents reported for ``job``, believed only from a node the job runs on now (a node key speaks for
        its own node's jobs only)."""
        p = self.progress.get(job.job_id)
        return None if p is None else p.restricted_to(job.nodes)

    def pool(self, name: str) -> VictimPool | None:
        return self._pools.get(name)

    def set_pool(self, name: str, pool: VictimPool) -> VictimPool:
        self._pools[name] = pool
        return pool

    def claim_open(self, job_id: int, at: float | None = None) -> bool:
        """Whether ``job_id`` got victims within ``grace_s + CLAIM_SETTLE_S`` (``ControllerState.claims``)."""
        at = self.state.claims.get(job_id) if at is None else at
        return at is not None and self.now - at < self.policy.grace_s + CLAIM_SETTLE_S

    def wait(self, job_id: int, code: str, reason: str) -> None:
        self.waits.append(Wait(job_id, reason, code))


__all__ = ["CLAIM_SETTLE_S", "ControllerState", "Cycle"]

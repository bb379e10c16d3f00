"""No team starves: the engine runs for hundreds of cycles against a tiny model of Slurm under sustained contention.

The model (``TinySlurm``) does what matters for the engine and nothing else: jobs start in priority order (tier +
site factor + age) when their QOS limit (``g-`` quota, ``b-`` borrow limit) and a best-fit gang placement allow;
like Slurm's backfill, the first job blocked on resources holds the emptiest nodes against lower-priority jobs.
Jobs run, checkpoint every few ticks and end; a signalled victim acknowledges after a short delay (or never); a
requeued job loses the work since its last checkpoint and is held ``BeginTime`` for two ticks, as Slurm holds a
requeued job for ``cred_expire``. Every cycle's decisions are also checked against the property oracle.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nuro.policy.model import Policy, Team, Tier, load_policy
from nuro.protocol import jobcomment
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo
from nuro.slurm.states import JobPhase
from nuro.slurm_plugins.controller.engine import (
    Borrow,
    ControllerState,
    Decisions,
    Preempt,
    Requeue,
    Return,
    SetSiteFactor,
)
from tests.unit.test_engine_builders import decide
from tests.unit.test_engine_properties import World, check_invariants

TICK_S = 10.0
T0 = 1_700_000_000.0
EXAMPLE = load_policy(Path(__file__).resolve().parents[2] / "examples" / "policy" / "teams.yaml")
SHAPES = [(1, 1), (1, 2), (1, 4), (1, 4), (1, 8), (1, 8), (2, 8)]  # (nodes, GPUs per node)


def _dt(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, tz=UTC) if t is not None else None


@dataclass
class SimJob:
    job_id: int
    team: str
    qos: str
    nodes_n: int
    per_node: int
    work_s: float
    submit: float
    acks: bool
    tier_priority: int = 0
    done_s: float = 0.0
    ckpt_done_s: float = 0.0
    ckpt_at: float | None = None
    nodes: tuple[str, ...] = ()
    start: float | None = None
    eligible_at: float = 0.0
    reason: str = "None"
    site_factor: int = 0
    preempt_at: float | None = None
    ack_due: float | None = None
    ack_at: float | None = None

    @property
    def gpus(self) -> int:
        return self.nodes_n * self.per_node


class TinySlurm:
    def __init__(self, policy: Policy, n_nodes: int, rng: random.Random) -> None:
        self.policy, self.rng = policy, rng
        self.nodes = {f"n{i:02d}": 8 for i in range(1, n_nodes + 1)}  # name -> free GPUs
        self.jobs: dict[int, SimJob] = {}
        self.next_id = 1
        self.requeues = 0

    def submit(self, team: str, now: float, qos: str | None = None, tier_priority: int = 0) -> None:
        nodes_n, per_node = self.rng.choice(SHAPES)
        job = SimJob(
            self.next_id, team, qos or f"g-{team}", nodes_n, per_node, self.rng.uniform(40, 300), now,
            acks=self.rng.random() < 0.8, tier_priority=tier_priority, eligible_at=now,
        )  # fmt: skip
        self.jobs[job.job_id] = job
        self.next_id += 1

    def snapshot(self, now: float) -> ClusterSnapshot:
        nodes = tuple(
            NodeInfo(name=n, state="MIXED", flags=frozenset({"MIXED"}), gpus_total=8, gpus_alloc=8 - free)
            for n, free in self.nodes.items()
        )
        jobs = []
        for j in self.jobs.values():
            comment = {}
            if j.ckpt_at is not None:
                comment["ckpt"] = {"step": int(j.ckpt_done_s), "at": round(j.ckpt_at)}
            if j.preempt_at is not None:
                comment["preempt"] = {"at": round(j.preempt_at), "for": 0}  # the controller's ledger (test channel)
            if j.ack_at is not None:
                comment["ack"] = {"step": int(j.ckpt_done_s), "at": round(j.ack_at)}
            running = bool(j.nodes)
            jobs.append(
                JobInfo(
                    job_id=j.job_id, name="sim", user="u", state="RUNNING" if running else "PENDING",
                    phase=JobPhase.RUNNING if running else JobPhase.PENDING, reason=j.reason, account=j.team,
                    qos=j.qos, priority=self.priority(j, now), nodes=j.nodes, node_count=j.nodes_n,
                    gpus_per_node=j.per_node, gpus_total=j.gpus,
                    comment=jobcomment.canonical(comment) if comment else "",
                    submit_time=_dt(j.submit), start_time=_dt(j.start),
                )
            )  # fmt: skip
        return ClusterSnapshot(nodes=nodes, jobs=tuple(jobs), partitions=(), taken_at=_dt(now))

    def priority(self, j: SimJob, now: float) -> int:
        return j.tier_priority + j.site_factor + int(min(1000, (now - j.submit) / 60))

    def apply(self, decisions: Decisions, now: float) -> None:
        for d in decisions:
            j = self.jobs.get(d.job_id)
            if j is None:
                continue
            if isinstance(d, Borrow | Return) and not j.nodes:
                j.qos = d.to_qos
            elif isinstance(d, Preempt) and j.nodes:
                j.preempt_at = now
                j.ack_due = now + self.rng.choice([1, 2, 3]) * TICK_S if j.acks else None
            elif isinstance(d, Requeue) and j.nodes:
                self._release(j)
                j.done_s, j.preempt_at, j.ack_due = j.ckpt_done_s, None, None
                j.reason, j.eligible_at = "BeginTime", now + 2 * TICK_S
                self.requeues += 1
            elif isinstance(d, SetSiteFactor):
                j.site_factor = d.value

    def _release(self, j: SimJob) -> None:
        for n in j.nodes:
            self.nodes[n] += j.per_node
        j.nodes, j.start = (), None

    def schedule(self, now: float) -> set[str]:
        """Start what fits, in priority order; returns the teams that started a job."""
        started: set[str] = set()
        g_run: dict[str, int] = {}
        b_run: dict[str, int] = {}
        for j in self.jobs.values():
            if j.nodes:
                side = g_run if j.qos.startswith("g-") else b_run if j.qos.startswith("b-") else {}
                side[j.team] = side.get(j.team, 0) + j.gpus
        teams = {t.name: t for t in self.policy.teams}
        pending = [j for j in self.jobs.values() if not j.nodes and j.eligible_at <= now]
        pending.sort(key=lambda j: (-self.priority(j, now), j.submit, j.job_id))
        reserved: set[str] = set()  # backfill: the first job blocked on resources holds the emptiest nodes
        for j in pending:
            t = teams[j.team]
            if j.qos.startswith("g-") and g_run.get(j.team, 0) + j.gpus > t.quota_gpus:
                j.reason = "QOSGrpGRES"
                continue
            if j.qos.startswith("b-") and b_run.get(j.team, 0) + j.gpus > t.borrow_limit_gpus:
                j.reason = "QOSGrpGRES"
                continue
            fits = sorted((free, n) for n, free in self.nodes.items() if free >= j.per_node and n not in reserved)
            if len(fits) < j.nodes_n:
                j.reason = "Resources"
                if not reserved:
                    reserved = {n for _, n in sorted((-f, n) for n, f in self.nodes.items())[: j.nodes_n]}
                continue
            j.nodes, j.start, j.reason = tuple(n for _, n in fits[: j.nodes_n]), now, "None"
            for n in j.nodes:
                self.nodes[n] -= j.per_node
            side = g_run if j.qos.startswith("g-") else b_run if j.qos.startswith("b-") else {}
            side[j.team] = side.get(j.team, 0) + j.gpus
            started.add(j.team)
        return started

    def advance(self, now: float) -> None:
        """Time passes: progress, periodic checkpoints, acks, completions."""
        for j in list(self.jobs.values()):
            if not j.nodes:
                continue
            j.done_s += TICK_S
            if int(j.done_s / TICK_S) % 3 == 0:
                j.ckpt_done_s, j.ckpt_at = j.done_s, now
            if j.ack_due is not None and now >= j.ack_due and j.ack_at != j.ack_due:
                j.ckpt_done_s, j.ckpt_at, j.ack_at = j.done_s, now, now
            if j.done_s >= j.work_s:
                self._release(j)
                del self.jobs[j.job_id]


def simulate(policy: Policy, n_nodes: int, seed: int, ticks: int = 300, backlog: int = 6) -> dict:
    """Run the engine against TinySlurm; returns per-team worst waits (ticks) and counters."""
    rng = random.Random(seed)
    sim = TinySlurm(policy, n_nodes, rng)
    state = ControllerState()
    # teams join at different times (idle teams lend first), then all stay contended until the end
    joins = {t.name: rng.choice([0, 0, ticks // 4, ticks // 3]) for t in policy.teams}
    urgent = [t for t in policy.tiers]
    streak = dict.fromkeys(joins, 0)
    worst = dict.fromkeys(joins, 0)
    urgent_wait: dict[int, float] = {}
    counts = {"borrow": 0, "preempt": 0, "requeue": 0, "return": 0}
    for tick in range(ticks):
        now = T0 + tick * TICK_S
        for name, at in joins.items():
            pending = sum(1 for j in sim.jobs.values() if j.team == name and not j.nodes)
            while tick >= at and pending < backlog:
                sim.submit(name, now)
                pending += 1
        if urgent and tick % 40 == 5:
            tier = urgent[0]
            sim.submit(tier.allowed_accounts[0], now, qos=tier.name, tier_priority=tier.priority)
            urgent_wait[sim.next_id - 1] = now
        snap = sim.snapshot(now)
        d = decide(snap, policy, state, now)
        check_invariants(World(policy, snap, state), d, now)
        for x in d:
            key = type(x).__name__.lower()
            counts[key] = counts.get(key, 0) + 1
        state = d.next_state
        sim.apply(d, now)
        started = sim.schedule(now)
        for job_id, since in list(urgent_wait.items()):
            j = sim.jobs.get(job_id)
            if j is not None and j.nodes:
                waited = int((now - since) / TICK_S)
                counts["urgent_max_wait_ticks"] = max(counts.get("urgent_max_wait_ticks", 0), waited)
                del urgent_wait[job_id]
        for t in policy.teams:
            g_run = sum(j.gpus for j in sim.jobs.values() if j.nodes and j.qos == t.guaranteed_qos)
            entitled = any(
                not j.nodes and j.team == t.name and j.reason != "BeginTime" and g_run + j.gpus <= t.quota_gpus
                for j in sim.jobs.values()
            )
            streak[t.name] = 0 if (t.name in started or not entitled) else streak[t.name] + 1
            worst[t.name] = max(worst[t.name], streak[t.name])
            assert g_run <= t.quota_gpus
        sim.advance(now)
    for since in urgent_wait.values():  # still waiting at the end counts as waited so far
        waited = int((T0 + ticks * TICK_S - since) / TICK_S)
        counts["urgent_max_wait_ticks"] = max(counts.get("urgent_max_wait_ticks", 0), waited)
    return {"worst_wait_ticks": worst, **counts}


#: Ticks a team with a pending job inside its quota may go without starting anything. Derivation: it may have to
#: wait for other teams' guaranteed jobs to end (fragmentation), at most the longest job (30 ticks), plus the grace
#: (6 ticks), the ack and the requeue hold (2 ticks): ~38; doubled for margin. Measured (150 random policies ×
#: 240 ticks): worst 29, median 4.
BOUND_TICKS = 60
#: An urgent job waits for its victims' grace (6 ticks) and the requeue hold, not for jobs to end. Measured: worst 10.
#: Only when its tier may preempt guaranteed work: a tier that may not (``preempts_guaranteed=False``) takes borrowed
#: GPUs only, and when those are too few it waits for guaranteed jobs to end like any job (BOUND_TICKS; found by
#: hypothesis: a 16-GPU urgent job beside an 8-GPU borrower waited 26 ticks, which the policy asks for).
URGENT_BOUND_TICKS = 20


def urgent_bound(policy: Policy) -> int:
    """The urgent bound plus the minimum run time: a victim younger than ``min_run_s`` is waited for first."""
    base = URGENT_BOUND_TICKS if all(t.preempts_guaranteed for t in policy.tiers) else BOUND_TICKS
    return base + math.ceil(policy.min_run_s / TICK_S)


def test_example_policy_no_team_starves() -> None:
    for seed in range(3):
        out = simulate(EXAMPLE, n_nodes=8, seed=seed)
        print(seed, out)
        assert max(out["worst_wait_ticks"].values()) <= BOUND_TICKS + math.ceil(EXAMPLE.min_run_s / TICK_S), out
        assert out["borrow"] > 0 and out["preempt"] > 0, f"scenario did not exercise borrow/reclaim: {out}"
        assert out.get("urgent_max_wait_ticks", 0) <= urgent_bound(EXAMPLE), out


@st.composite
def sim_policies(draw: st.DrawFn) -> Policy:
    n = draw(st.integers(2, 4))
    quotas = draw(st.lists(st.sampled_from([8, 16, 24]), min_size=n, max_size=n).filter(lambda q: sum(q) <= 64))
    teams = tuple(
        Team(
            name=f"t{i}",
            quota_gpus=q,
            borrow_limit_gpus=draw(st.sampled_from([0, 8, 16, 32])),
            lend_limit_gpus=draw(st.integers(0, q)),
            fairshare=draw(st.none() | st.integers(1, 40)),
        )
        for i, q in enumerate(quotas)
    )
    tiers = (Tier(name="urgent", priority=100_000, allowed_accounts=("t0",), preempts_guaranteed=draw(st.booleans())),)
    min_run = draw(st.sampled_from([0, 30, 120]))
    return Policy(cluster_gpus=64, grace_s=60, teams=teams, tiers=tiers, min_run_s=min_run)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sim_policies(), st.integers(0, 10_000))
def test_random_policies_no_team_starves(policy: Policy, seed: int) -> None:
    out = simulate(policy, n_nodes=8, seed=seed, ticks=240)
    assert max(out["worst_wait_ticks"].values()) <= BOUND_TICKS + math.ceil(policy.min_run_s / TICK_S), out
    assert out.get("urgent_max_wait_ticks", 0) <= urgent_bound(policy), out

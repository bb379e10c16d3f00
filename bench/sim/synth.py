"""What the trace lacks, made up deterministically from a seed: teams, gangs, tiers, checkpoint behaviour.

Every choice is a field of ``SynthParams`` and is printed with the results (``SynthParams.describe``), so a reader
sees exactly what was invented. Per-task draws use an RNG seeded by ``(seed, task name)``, never a shared stream:
dropping or adding tasks (``--max-tasks``) does not change what the remaining tasks got.

| missing in the trace | synthesised as |
|---|---|
| team | ``sha256(seed:name)`` → uniform [0, 1) → team by cumulative ``team_weights`` |
| user | a member of that team, by the same kind of hash |
| multi-node gangs | 8-GPU tasks in creation order are cut into groups of k ∈ ``gang_sizes`` (seeded draw with
  ``gang_size_weights``); k is capped at the cluster's 8-GPU node count and at the first member's team quota / 8
  (a gang above its team's quota could never run under the hard-quota baseline: that would compare admission
  policy, not scheduling); a group becomes one k-node × 8-GPU job of that team that arrives with its first member
  and runs the members' mean run time (GPU·s preserved) |
| priority tier | ``qos=LS`` → ``urgent`` for ``urgent_share_of_ls`` of LS tasks whose team or user may use it, else the
  team's guaranteed QOS |
| checkpoints | interval per job from ``ckpt_interval_choices_s``; commit time uniform in ``ckpt_commit_s``; a share
  ``no_ack_share`` of jobs never acknowledges a preemption (requeued at grace end, losing work since its last
  periodic checkpoint) |
| restart cost | a resumed run spends ``restart_overhead_s`` (uniform) allocated but not training (staging) |
| fractional GPUs | ``gpu_milli`` < 1000 rounds up to one whole GPU (Slurm gres/gpu is whole GPUs) |
| time | arrivals divided by ``compress`` (run times unchanged) so the small replayed cluster sees a busy queue |
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from bench.sim.trace import TraceTask
from nuro.policy.model import Policy


@dataclass(frozen=True)
class SynthParams:
    """Every synthesis knob. ``team_weights`` deliberately differ from the quota shares (37.5/25/12.5/25 % in the
    example policy): teams whose demand exceeds their quota must borrow, the others lend."""

    seed: int = 7
    team_weights: tuple[tuple[str, float], ...] = (
        ("perception", 0.30),
        ("prediction", 0.30),
        ("controls", 0.17),
        ("simulation", 0.23),
    )
    gang_sizes: tuple[int, ...] = (2, 4, 8, 16)
    gang_size_weights: tuple[float, ...] = (0.4, 0.3, 0.2, 0.1)
    urgent_share_of_ls: float = 0.02
    ckpt_interval_choices_s: tuple[int, ...] = (300, 600, 1200, 1800)
    ckpt_commit_s: tuple[float, float] = (5.0, 45.0)
    no_ack_share: float = 0.10
    restart_overhead_s: tuple[float, float] = (30.0, 120.0)
    compress: float = 24.0
    fractional: str = "round_up"

    def describe(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class JobSpec:
    """One replayed job: what the workload asks for and how it behaves when preempted.

    Attributes:
        submit_s: arrival in replay seconds (trace creation time / compress).
        runtime_s: GPU work to do (seconds of training); a lower bound when ``censored``.
        censored: built from a task still running when the trace was cut.
        tier: "urgent" or "normal" (the team's guaranteed QOS).
        acks: takes part in checkpoint-confirmed preemption (commits and acks in ``ckpt_commit_s``).
        tasks: the trace pods this job was built from (one, or a gang's members).
    """

    job_id: int
    name: str
    team: str
    user: str
    tier: str
    node_count: int
    gpus_per_node: int
    submit_s: float
    runtime_s: float
    censored: bool
    ckpt_interval_s: float
    ckpt_commit_s: float
    acks: bool
    restart_overhead_s: float
    tasks: tuple[str, ...]
    used_fraction: float = 1.0  # of each allocated GPU the trace pod asked for (gpu_milli / 1000, at most 1)

    @property
    def gpus(self) -> int:
        return self.node_count * self.gpus_per_node


@dataclass(frozen=True)
class Workload:
    """The synthesised jobs plus the counts that say what was dropped or merged (printed with the results)."""

    jobs: tuple[JobSpec, ...]
    counts: dict[str, int]
    gang_sizes: dict[int, int]


def unit_hash(seed: int, key: str) -> float:
    """A stable uniform [0, 1) from (seed, key): Python's ``hash`` is salted per process, sha256 is not."""
    digest = hashlib.sha256(f"{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pick_weighted(u: float, weighted: Sequence[tuple[str, float]]) -> str:
    total = sum(w for _, w in weighted)
    acc = 0.0
    for name, w in weighted:
        acc += w / total
        if u < acc:
            return name
    return weighted[-1][0]


def _may_use(policy: Policy, tier: str, team: str, user: str) -> bool:
    t = policy.tier(tier)
    return t is not None and (team in t.allowed_accounts or user in t.allowed_users)


def select_tasks(tasks: Sequence[TraceTask], max_tasks: int | None) -> tuple[list[TraceTask], dict[str, int]]:
    """GPU tasks that ran, in creation order (ties by name), the first ``max_tasks`` of them; and what was dropped."""
    counts = {"trace_pods": len(tasks)}
    gpu = [t for t in tasks if t.num_gpu > 0]
    counts["dropped_no_gpu"] = len(tasks) - len(gpu)
    ran = [t for t in gpu if t.runtime_s is not None]
    counts["dropped_never_scheduled"] = len(gpu) - len(ran)
    ran.sort(key=lambda t: (t.creation_s, t.name))
    if max_tasks is not None and max_tasks < len(ran):
        counts["dropped_by_max_tasks"] = len(ran) - max_tasks
        ran = ran[:max_tasks]
    else:
        counts["dropped_by_max_tasks"] = 0
    counts["tasks_used"] = len(ran)
    counts["fractional_rounded_up"] = sum(1 for t in ran if t.gpu_milli < 1000)
    counts["censored_tasks"] = sum(1 for t in ran if t.is_censored)
    return ran, counts


def synthesise(
    tasks: Sequence[TraceTask], params: SynthParams, policy: Policy, max_gang_nodes: int, max_tasks: int | None = None
) -> Workload:
    """Jobs for the replay (module table). ``max_gang_nodes``: the cluster's 8-GPU node count (a gang larger than
    that could never start). Job ids are 1.. in submit order (ties by name), as Slurm would number them."""
    ran, counts = select_tasks(tasks, max_tasks)
    team_names = {t.name for t in policy.teams}
    weights = tuple((n, w) for n, w in params.team_weights if n in team_names)
    if not weights:
        raise ValueError(f"no team of team_weights is in the policy (teams: {sorted(team_names)})")
    singles = [t for t in ran if t.num_gpu < 8]
    eights = [t for t in ran if t.num_gpu >= 8]
    groups: list[list[TraceTask]] = [[t] for t in singles]
    gang_rng = random.Random(f"{params.seed}:gangs")
    gang_hist: dict[int, int] = {}
    i = 0
    while i < len(eights):
        k = gang_rng.choices(params.gang_sizes, weights=params.gang_size_weights)[0]
        team = pick_weighted(unit_hash(params.seed, eights[i].name), weights)
        k = max(1, min(k, max_gang_nodes, policy.team(team).quota_gpus // 8))
        group = eights[i : i + k]
        i += len(group)
        gang_hist[len(group)] = gang_hist.get(len(group), 0) + 1
        groups.append(group)
    counts["gang_jobs"] = sum(n for k, n in gang_hist.items() if k > 1)
    counts["eight_gpu_tasks_in_gangs"] = sum(k * n for k, n in gang_hist.items() if k > 1)
    drafts = []
    for group in groups:
        first = group[0]
        rng = random.Random(f"{params.seed}:{first.name}")
        team = pick_weighted(unit_hash(params.seed, first.name), weights)
        members = policy.team(team).members or (team,)
        user = members[int(unit_hash(params.seed, "user:" + first.name) * len(members))]
        tier = "normal"
        if (
            first.qos == "LS"
            and unit_hash(params.seed, "tier:" + first.name) < params.urgent_share_of_ls
            and _may_use(policy, "urgent", team, user)
        ):
            tier = "urgent"
        runtime = sum(t.runtime_s or 1 for t in group) / len(group)
        drafts.append(
            (
                first.creation_s / params.compress,
                first.name,
                dict(
                    name=first.name if len(group) == 1 else f"gang-{first.name}-x{len(group)}",
                    team=team,
                    user=user,
                    tier=tier,
                    node_count=len(group),
                    gpus_per_node=8 if len(group) > 1 else max(1, first.num_gpu),
                    submit_s=first.creation_s / params.compress,
                    runtime_s=float(runtime),
                    censored=any(t.is_censored for t in group),
                    ckpt_interval_s=float(rng.choice(params.ckpt_interval_choices_s)),
                    ckpt_commit_s=rng.uniform(*params.ckpt_commit_s),
                    acks=rng.random() >= params.no_ack_share,
                    restart_overhead_s=rng.uniform(*params.restart_overhead_s),
                    tasks=tuple(t.name for t in group),
                    used_fraction=sum(min(1.0, max(t.gpu_milli, 1) / 1000) for t in group) / len(group),
                ),
            )
        )
    drafts.sort(key=lambda d: (d[0], d[1]))
    jobs = tuple(JobSpec(job_id=n, **d[2]) for n, d in enumerate(drafts, start=1))
    counts["jobs"] = len(jobs)
    counts["urgent_jobs"] = sum(1 for j in jobs if j.tier == "urgent")
    counts["censored_jobs"] = sum(1 for j in jobs if j.censored)
    counts["non_acking_jobs"] = sum(1 for j in jobs if not j.acks)
    return Workload(jobs, counts, dict(sorted(gang_hist.items())))


__all__ = ["JobSpec", "SynthParams", "Workload", "pick_weighted", "select_tasks", "synthesise", "unit_hash"]

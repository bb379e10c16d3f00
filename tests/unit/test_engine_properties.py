"""Property tests of the decision engine over random clusters, policies, queues and in-flight preemptions.

Each property is checked by a small, independent oracle written here (not by calling the engine's helpers): hard
quotas, borrow limits and lending limits are never passed; victims are of the allowed kinds, never chosen twice,
and free a placeable block; requeues follow the ack/grace rule; ``decide`` is deterministic and ignores input order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nuro.policy.model import Policy, Team, Tier
from nuro.slurm.models import ClusterSnapshot, JobInfo
from nuro.slurm_plugins.controller.engine import (
    Borrow,
    ControllerState,
    Decisions,
    Preempt,
    Requeue,
    Return,
)
from tests.unit.test_engine_builders import NOW, a_cluster, a_job, decide

WAITING = {"Resources", "Priority", "None", ""}


@dataclass(frozen=True)
class World:
    policy: Policy
    snapshot: ClusterSnapshot
    state: ControllerState


@st.composite
def policies(draw: st.DrawFn, cluster_gpus: int) -> Policy:
    n_teams = draw(st.integers(1, 4))
    teams, left = [], cluster_gpus
    for i in range(n_teams):
        quota = draw(st.integers(0, left))
        left -= quota
        teams.append(
            Team(
                name=f"t{i}",
                quota_gpus=quota,
                borrow_limit_gpus=draw(st.integers(0, cluster_gpus - quota)),
                lend_limit_gpus=draw(st.integers(0, quota)),
                fairshare=draw(st.none() | st.integers(1, 50)),
            )
        )
    tiers = []
    for k in range(draw(st.integers(0, 2))):
        accounts = draw(st.lists(st.sampled_from([t.name for t in teams]), min_size=1, max_size=2, unique=True))
        tiers.append(
            Tier(
                name=f"tier{k}",
                priority=draw(st.integers(1, 3)) * 1000,
                allowed_accounts=tuple(accounts),
                preempts_guaranteed=draw(st.booleans()),
            )
        )
    return Policy(cluster_gpus=cluster_gpus, grace_s=draw(st.integers(1, 120)), teams=tuple(teams), tiers=tuple(tiers))


@st.composite
def worlds(draw: st.DrawFn, max_pending: int = 10) -> World:
    n_nodes = draw(st.integers(1, 6))
    gpn = draw(st.sampled_from([4, 8]))
    policy = draw(policies(n_nodes * gpn))
    names = [f"n{i:02d}" for i in range(1, n_nodes + 1)]
    drained = [n for n in names if draw(st.integers(0, 9)) == 0]
    free = dict.fromkeys(names, gpn)
    team_names = [t.name for t in policy.teams]
    g_run = dict.fromkeys(team_names, 0)
    b_run = dict.fromkeys(team_names, 0)
    jobs, job_id = [], 0
    kinds = st.sampled_from(["g", "g", "b", "b", "tier", "unmanaged"])
    # contended worlds first fill every team's quota with guaranteed jobs, so borrowing and reclaim have work
    contended = draw(st.booleans())
    plan = [(t, "g") for t in policy.teams for _ in range(draw(st.integers(0, 6)))] if contended else []
    plan += [(None, "b")] * draw(st.integers(0, 6)) if contended else []
    plan += [(None, None)] * draw(st.integers(0, 14))
    for team, kind in plan:
        job_id += 1
        team = team or policy.teams[draw(st.integers(0, len(policy.teams) - 1))]
        kind = kind or draw(kinds)
        per_node = draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= gpn]))
        count = draw(st.integers(1, 2))
        hosts = [n for n in names if free[n] >= per_node][:count]
        if len(hosts) < count:
            continue
        gpus = per_node * count
        b = a_job(job_id).team(team.name).gpus(per_node, count)
        if kind == "g":  # slurmctld's GrpTRES keeps guaranteed jobs within quota and borrowed within the limit
            if g_run[team.name] + gpus > team.quota_gpus:
                continue
            g_run[team.name] += gpus
        elif kind == "b":
            if b_run[team.name] + gpus > team.borrow_limit_gpus:
                continue
            b_run[team.name] += gpus
            b.borrowed()
        elif kind == "tier" and policy.tiers:
            b.tier(draw(st.sampled_from([t.name for t in policy.tiers])))
        else:
            b.unmanaged()
        for n in hosts:
            free[n] -= per_node
        b.running_on(*hosts, started_s_ago=draw(st.integers(1, 20_000)))
        if draw(st.booleans()):
            b.ckpt_age_s(draw(st.integers(0, 20_000)))
        if draw(st.integers(0, 9)) == 0:
            b.signalled_s_ago(draw(st.integers(0, 200)))
            if draw(st.booleans()):
                b.acked_s_ago(draw(st.integers(0, 200)))
        jobs.append(b.build())
    for _ in range(draw(st.integers(0, max_pending))):
        job_id += 1
        team = policy.teams[draw(st.integers(0, len(policy.teams) - 1))]
        b = a_job(job_id).team(team.name)
        b.gpus(draw(st.sampled_from([g for g in (1, 2, 4, 8) if g <= gpn])), draw(st.integers(1, 2)))
        kind = draw(kinds)
        if kind == "b":
            b.borrowed()
        elif kind == "tier" and policy.tiers:
            b.tier(draw(st.sampled_from([t.name for t in policy.tiers])))
        elif kind == "unmanaged":
            b.unmanaged()
        b.pending(draw(st.sampled_from(["Resources", "Priority", "QOSGrpGRES", "QOSGrpGRES", "Dependency"])))
        if b._qos and b._qos.startswith("tier"):
            b.pending(draw(st.sampled_from(["Resources", "Priority"])))
        b.priority(draw(st.integers(0, 3)) * 1000)
        jobs.append(b.build())
    running_ids = [j.job_id for j in jobs if j.nodes]
    preempting = {
        i: NOW - draw(st.integers(0, 200)) for i in running_ids if draw(st.integers(0, 11)) == 0
    }  # fmt: skip
    snap = a_cluster().nodes(n_nodes, gpus=gpn).drained(*drained).jobs(*jobs).build()
    return World(policy, snap, ControllerState(preempting=preempting))


# -- oracle --------------------------------------------------------------------------------------------------------


def _team(policy: Policy, qos: str) -> tuple[str, str] | None:
    for t in policy.teams:
        if qos == f"g-{t.name}":
            return t.name, "g"
        if qos == f"b-{t.name}":
            return t.name, "b"
    return None


def _in_flight(world: World) -> dict[int, float]:
    """Victims being preempted, as the brief defines them (state, or the comment record of the current run)."""
    out = {}
    for j in world.snapshot.jobs:
        if not j.phase.holds_resources:
            continue
        rec = json.loads(j.comment).get("preempt") if j.comment else None
        at = world.state.preempting.get(j.job_id, rec["at"] if rec else None)
        if at is not None and j.start_time.timestamp() <= at:
            out[j.job_id] = at
    return out


def _placeable(world: World, job: JobInfo, freed_by: list[JobInfo], within: set[str] | None = None) -> bool:
    """Whether ``job`` fits once ``freed_by`` are gone (on the nodes ``within``, if given: one leaf)."""
    free = {n.name: n.gpus_free for n in world.snapshot.nodes}
    ok = {n.name for n in world.snapshot.nodes if n.is_schedulable and (within is None or n.name in within)}
    for v in freed_by:
        for n in v.nodes:
            if n in ok:
                free[n] += v.gpus_per_node
    return sum(1 for n in ok if free[n] >= job.gpus_per_node) >= job.node_count


def _leaves(world: World) -> list[set[str]]:
    by: dict[str, set[str]] = {}
    for n in world.snapshot.nodes:
        by.setdefault(n.switch or "", set()).add(n.name)
    return list(by.values())


def _room(world: World, job: JobInfo, freed_by: list[JobInfo], one_leaf: bool) -> bool:
    """Room for ``job`` as the engine reads it: a gang with the one-leaf hint (2 to leaf-size nodes, as job_submit.lua
    gives it) has room only inside one leaf; any other job anywhere."""
    if one_leaf:
        return any(_placeable(world, job, freed_by, leaf) for leaf in _leaves(world))
    return _placeable(world, job, freed_by)


def check_invariants(world: World, d: Decisions, now: float = NOW) -> None:
    policy, snap = world.policy, world.snapshot
    teams = {t.name: t for t in policy.teams}
    g_run = dict.fromkeys(teams, 0)
    g_wait = dict.fromkeys(teams, 0)
    borrowed = dict.fromkeys(teams, 0)
    for j in snap.jobs:
        tk = _team(policy, j.qos)
        if tk is None:
            continue
        name, kind = tk
        if kind == "g" and j.phase.holds_resources:
            g_run[name] += j.gpus_total
        elif kind == "g" and j.reason in WAITING and not j.nodes:
            g_wait[name] += j.gpus_total
        elif kind == "b" and (j.phase.holds_resources or not j.nodes):
            borrowed[name] += j.gpus_total
    # Returns: a job moves into g-<team> only within the quota (running + waiting guaranteed demand)
    for r in d.of(Return):
        job = snap.job(r.job_id)
        assert job is not None and not job.nodes and job.qos == f"b-{r.team}" and r.to_qos == f"g-{r.team}"
        assert g_run[r.team] + g_wait[r.team] + r.gpus <= teams[r.team].quota_gpus, "Return above quota"
        g_wait[r.team] += r.gpus
        borrowed[r.team] -= r.gpus
    # Borrows: borrow limit and the lending pool
    unassigned = policy.cluster_gpus - sum(t.quota_gpus for t in policy.teams)
    for b in d.of(Borrow):
        job = snap.job(b.job_id)
        assert job is not None and job.reason == "QOSGrpGRES" and job.qos == f"g-{b.team}" and b.to_qos == f"b-{b.team}"
        assert g_run[b.team] + b.gpus > teams[b.team].quota_gpus, "borrowed a job that fits its quota"
        assert borrowed[b.team] + b.gpus <= teams[b.team].borrow_limit_gpus, "borrow limit passed"
        pool = unassigned + sum(
            min(t.lend_limit_gpus, max(0, t.quota_gpus - g_run[t.name] - g_wait[t.name]))
            for t in policy.teams
            if t.name != b.team
        )
        assert sum(borrowed.values()) + b.gpus <= pool, "lending pool passed"
        borrowed[b.team] += b.gpus
    # Preempts: allowed victims, never twice, never in flight, and they free a placeable block
    in_flight = _in_flight(world)
    victims = [p.job_id for p in d.of(Preempt)]
    assert len(victims) == len(set(victims)), "a victim chosen twice"
    assert not set(victims) & set(in_flight), "an in-flight victim chosen again"
    tiers = {t.name: t for t in policy.tiers}
    by_for: dict[int, list[JobInfo]] = {}
    for p in d.of(Preempt):
        v, j = snap.job(p.job_id), snap.job(p.for_job_id)
        assert v is not None and v.state == "RUNNING" and j is not None and not j.nodes
        by_for.setdefault(j.job_id, []).append(v)
        vk, jk = _team(policy, v.qos), _team(policy, j.qos)
        if jk is not None:
            assert jk[1] == "g" and vk is not None and vk[1] == "b", "reclaim preempted a non-borrowed job"
            continue
        tier = tiers[j.qos]
        if vk is not None and vk[1] == "b":
            continue
        assert tier.preempts_guaranteed, "a tier that may not preempt guaranteed jobs did"
        if vk is not None:
            assert vk[0] != j.account, "a tier preempted its own team's guaranteed job"
        else:
            assert v.qos in tiers and tiers[v.qos].priority < tier.priority, "preempted an equal/higher tier"
    # what is freed in this cycle is shared: a job may also use what is left over from another job's victims
    freeing = [snap.job(i) for i in [*in_flight, *victims]]
    for job_id in by_for:
        assert _placeable(world, snap.job(job_id), freeing), f"victims of job {job_id} do not free a placeable block"
    # Requeues: only in-flight victims, on ack or at grace end
    for r in d.of(Requeue):
        at = in_flight[r.job_id]
        side = json.loads(snap.job(r.job_id).comment or "{}")  # the agents' reports (test channel)
        ack, ckpt = side.get("ack"), side.get("ckpt")
        acked = (ack is not None and ack["at"] >= at) or (ckpt is not None and ckpt["at"] > at)
        assert r.acked == acked
        assert acked or now >= at + policy.grace_s


COMMON = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(worlds())
def test_invariants_hold_on_random_worlds(world: World) -> None:
    check_invariants(world, decide(world.snapshot, world.policy, world.state, NOW))


@COMMON
@given(worlds(), st.randoms(use_true_random=False))
def test_decide_is_deterministic_and_ignores_input_order(world: World, rnd) -> None:
    first = decide(world.snapshot, world.policy, world.state, NOW)
    again = decide(world.snapshot, world.policy, world.state, NOW)
    jobs, nodes = list(world.snapshot.jobs), list(world.snapshot.nodes)
    rnd.shuffle(jobs)
    rnd.shuffle(nodes)
    shuffled = replace(world.snapshot, jobs=tuple(jobs), nodes=tuple(nodes))
    other = decide(shuffled, world.policy, world.state, NOW)
    assert first == again == other
    assert first.waiting == again.waiting == other.waiting
    assert first.next_state == other.next_state


@COMMON
@given(worlds(max_pending=1))
def test_victims_are_minimal_for_a_single_pending_job(world: World) -> None:
    """With one pending job the oracle sees what the engine sees: no victim may be spared."""
    d = decide(world.snapshot, world.policy, world.state, NOW)
    vs = [world.snapshot.job(p.job_id) for p in d.of(Preempt)]
    if not vs:
        return
    job = world.snapshot.job(d.of(Preempt)[0].for_job_id)
    flying = [world.snapshot.job(i) for i in _in_flight(world)]
    leaves = _leaves(world)
    hinted = len(leaves) > 1 and 2 <= job.node_count <= max(len(leaf) for leaf in leaves)
    # a hinted gang's victims are chosen inside one leaf when one can hold it (then "room" means room in a leaf,
    # even where in-flight GPUs would place it across leaves), else anywhere, as Slurm places it after its wait
    one_leaf = hinted and any(_placeable(world, job, [*flying, *vs], leaf) for leaf in leaves)
    assert not _room(world, job, flying, one_leaf), "preempted although in-flight victims already make room"
    for spare in vs:
        rest = [v for v in vs if v is not spare]
        assert not _room(world, job, [*flying, *rest], one_leaf), f"victim {spare.job_id} was not needed"

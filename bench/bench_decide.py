"""Cycle time of the pure decision function on a synthetic 500-host / 4,000-GPU cluster (issue 3, "Measure").

Synthesis (deterministic, every parameter printed and saved): 500 hosts × 8 GPUs in leaves of 4, the four example
teams scaled to 4,000 GPUs, 1,000 running jobs best-fit packed (teams filled to a fraction of their quota, the rest
borrowed), 5,000 pending jobs (most held on QOSGrpGRES, some waiting for resources inside their quota, some borrowed,
some urgent, some not eligible), checkpoint marks in the comments, and a few preemptions in flight.

Baseline in the same run: classifying every job with the public ``classify`` and summing GPUs per team and kind, the
least any engine must do per cycle. ``decide`` is timed cold (no site factors known: every pending job gets one, the
first cycle after a restart) and warm (the state of the previous cycle: the steady state).

    python -m bench.bench_decide [--repeat 20] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from datetime import UTC, datetime

from bench.common import save
from nuro.policy.model import Policy, Team, Tier
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo
from nuro.slurm.states import JobPhase
from nuro.slurm_plugins.controller.apply import groups
from nuro.slurm_plugins.controller.engine import ControllerState, classify, decide

NOW = 1_800_000_000.0
PARAMS = {
    "hosts": 500,
    "gpus_per_host": 8,
    "hosts_per_leaf": 4,
    "running_jobs": 1000,
    "pending_jobs": 5000,
    # (nodes, GPUs per node): weight; running and pending jobs draw from the same mix
    "shapes": {"1x1": 35, "1x2": 25, "1x4": 22, "1x8": 15, "2x8": 2.5, "4x8": 0.5},
    # the example policy (examples/policy/teams.yaml) scaled by 4000/64
    "teams": {
        "perception": {"quota": 1500, "borrow": 1000, "lend": 500, "shares": 1500},
        "prediction": {"quota": 1000, "borrow": 1000, "lend": 500, "shares": 1000},
        "controls": {"quota": 500, "borrow": 500, "lend": 250, "shares": 500},
        "simulation": {"quota": 1000, "borrow": 1000, "lend": 1000, "shares": 1000},
    },
    "team_weight": {"perception": 45, "prediction": 28, "controls": 9, "simulation": 8},  # running jobs
    # pending jobs; simulation has only held/dependent jobs pending, so it has idle quota to lend
    "pending_team_weight": {"perception": 45, "prediction": 35, "controls": 15, "simulation": 5},
    # running guaranteed GPUs as a fraction of quota; what does not fit is borrowed (within the borrow limit)
    "quota_fill": {"perception": 1.0, "prediction": 1.0, "controls": 0.6, "simulation": 0.3},
    "running_urgent_fraction": 0.01,
    "running_with_checkpoint_fraction": 0.8,
    "checkpoint_age_s": [0, 3600],
    "run_age_s": [600, 86400],
    "in_flight_preemptions": 10,  # borrowed jobs of this team being reclaimed (it may not borrow meanwhile)
    "in_flight_team": "prediction",
    "in_flight_acked_fraction": 0.5,
    # g_pending: QOSGrpGRES when it would pass the team's quota (as slurmctld reports it), else Resources/Priority
    "pending_mix": {"g_pending": 0.948, "b_pending": 0.002, "urgent": 0.001, "ineligible": 0.049},
    "pending_priority": [1000, 5000],
    "submit_age_s": [0, 86400],
    "grace_s": 60,
}


def _dt(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def policy() -> Policy:
    teams = tuple(
        Team(
            name=n,
            quota_gpus=t["quota"],
            borrow_limit_gpus=t["borrow"],
            lend_limit_gpus=t["lend"],
            fairshare=t["shares"],
        )
        for n, t in PARAMS["teams"].items()
    )
    urgent = Tier(name="urgent", priority=100_000, allowed_accounts=("perception",))
    return Policy(cluster_gpus=4000, grace_s=PARAMS["grace_s"], teams=teams, tiers=(urgent,))


def _shape(rng: random.Random) -> tuple[int, int]:
    shapes = PARAMS["shapes"]
    n, g = rng.choices(list(shapes), weights=list(shapes.values()))[0].split("x")
    return int(n), int(g)


def synthesize(seed: int) -> tuple[ClusterSnapshot, ControllerState]:
    rng = random.Random(seed)
    pol = policy()
    hosts = [f"h{i:03d}" for i in range(PARAMS["hosts"])]
    free = dict.fromkeys(hosts, PARAMS["gpus_per_host"])
    teams = list(PARAMS["team_weight"])
    weights = list(PARAMS["team_weight"].values())
    g_run = dict.fromkeys(teams, 0)
    b_run = dict.fromkeys(teams, 0)
    jobs: list[JobInfo] = []
    job_id = 1000
    while sum(1 for j in jobs if j.nodes) < PARAMS["running_jobs"]:
        job_id += 1
        nodes_n, per_node = _shape(rng)
        fits = sorted((f, h) for h, f in free.items() if f >= per_node)
        if len(fits) < nodes_n:
            continue
        team = rng.choices(teams, weights)[0]
        t = pol.team(team)
        gpus = nodes_n * per_node
        if rng.random() < PARAMS["running_urgent_fraction"]:
            qos = "urgent"
        elif g_run[team] + gpus <= t.quota_gpus * PARAMS["quota_fill"][team]:
            qos, g_run[team] = t.guaranteed_qos, g_run[team] + gpus
        elif b_run[team] + gpus <= t.borrow_limit_gpus:
            qos, b_run[team] = t.borrow_qos, b_run[team] + gpus
        else:
            continue
        on = tuple(h for _, h in fits[:nodes_n])
        for h in on:
            free[h] -= per_node
        start = NOW - rng.uniform(*PARAMS["run_age_s"])
        comment = {}
        if rng.random() < PARAMS["running_with_checkpoint_fraction"]:
            comment["ckpt"] = {"step": rng.randint(1, 10**5), "at": NOW - rng.uniform(*PARAMS["checkpoint_age_s"])}
        jobs.append(_job(job_id, team, qos, "RUNNING", "None", nodes_n, per_node, on, start, comment, rng))
    borrowed = [j for j in jobs if j.qos == f"b-{PARAMS['in_flight_team']}"]
    preempting = {}
    for j in rng.sample(borrowed, min(PARAMS["in_flight_preemptions"], len(borrowed))):
        at = NOW - rng.uniform(0, 90)
        preempting[j.job_id] = at
        if rng.random() < PARAMS["in_flight_acked_fraction"]:
            comment = json.loads(j.comment or "{}") | {"ack": {"step": 1, "at": at + 5}}
            jobs[jobs.index(j)] = JobInfo(**{**j.__dict__, "comment": json.dumps(comment)})
    mix = PARAMS["pending_mix"]
    pending_weights = list(PARAMS["pending_team_weight"].values())
    for _ in range(PARAMS["pending_jobs"]):
        job_id += 1
        team = rng.choices(teams, pending_weights)[0]
        t = pol.team(team)
        nodes_n, per_node = _shape(rng)
        kind = "ineligible" if team == "simulation" else rng.choices(list(mix), weights=list(mix.values()))[0]
        over = g_run[team] + nodes_n * per_node > t.quota_gpus
        qos, reason = {
            "g_pending": (t.guaranteed_qos, "QOSGrpGRES" if over else rng.choice(["Resources", "Priority"])),
            "b_pending": (t.borrow_qos, "Resources"),
            "urgent": ("urgent", "Resources"),
            "ineligible": (t.guaranteed_qos, rng.choice(["Dependency", "JobHeldUser", "BeginTime"])),
        }[kind]
        if kind == "urgent":
            team = "perception"
        jobs.append(_job(job_id, team, qos, "PENDING", reason, nodes_n, per_node, (), None, {}, rng))
    nodes = tuple(
        NodeInfo(
            name=h, state="MIXED", flags=frozenset({"MIXED"}), gres="gpu:8", gpus_total=PARAMS["gpus_per_host"],
            gpus_alloc=PARAMS["gpus_per_host"] - free[h], switch=f"leaf{i // PARAMS['hosts_per_leaf']}",
        )
        for i, h in enumerate(hosts)
    )  # fmt: skip
    snap = ClusterSnapshot(nodes=nodes, jobs=tuple(jobs), partitions=(), taken_at=_dt(NOW))
    return snap, ControllerState(preempting=preempting)


def _job(job_id, team, qos, state, reason, nodes_n, per_node, on, start, comment, rng) -> JobInfo:  # noqa: ANN001
    return JobInfo(
        job_id=job_id, name=f"train{job_id}", user=team[:4], state=state, phase=JobPhase(state), reason=reason,
        account=team, qos=qos, priority=rng.randint(*PARAMS["pending_priority"]), nodes=on, node_count=nodes_n,
        gpus_per_node=per_node, gpus_total=nodes_n * per_node, comment=json.dumps(comment) if comment else "",
        submit_time=_dt(NOW - rng.uniform(*PARAMS["submit_age_s"])), start_time=_dt(start) if start else None,
    )  # fmt: skip


def baseline(snap: ClusterSnapshot, pol: Policy) -> dict:
    """Classify every job and sum GPUs per (team, kind): the floor of any per-cycle engine."""
    usage: dict[tuple, int] = {}
    for j in snap.jobs:
        c = classify(j, pol)
        key = (c.team, c.kind, j.phase.holds_resources)
        usage[key] = usage.get(key, 0) + j.gpus_total
    return usage


def _median_ms(fn, repeat: int) -> tuple[float, list[float]]:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    print(json.dumps({"seed": args.seed, "repeat": args.repeat, **PARAMS}, indent=2))
    snap, state = synthesize(args.seed)
    pol = policy()
    cold = decide(snap, pol, state, NOW)
    warm_state = cold.next_state
    warm = decide(snap, pol, warm_state, NOW)
    # interleave so a slow moment of the machine hits all three alike
    base_t, cold_t, warm_t, phases = [], [], [], []
    for _ in range(args.repeat):
        base_t.append(_median_ms(lambda: baseline(snap, pol), 1)[0])
        cold_t.append(_median_ms(lambda: decide(snap, pol, state, NOW), 1)[0])
        t0 = time.perf_counter()
        d = decide(snap, pol, warm_state, NOW)
        warm_t.append((time.perf_counter() - t0) * 1000)
        phases.append(dict(d.cycle_stats.phase_s))
    med = statistics.median
    running = sum(1 for j in snap.jobs if j.nodes)
    result = {
        "seed": args.seed,
        "repeat": args.repeat,
        "params": PARAMS,
        "snapshot": {
            "hosts": len(snap.nodes),
            "gpus": snap.gpus_total,
            "gpus_allocated": sum(n.gpus_alloc for n in snap.nodes),
            "running_jobs": running,
            "pending_jobs": len(snap.jobs) - running,
            "in_flight": len(state.preempting),
        },
        "baseline_classify_sum_ms": round(med(base_t), 2),
        "decide_cold_ms": round(med(cold_t), 2),
        "decide_warm_ms": round(med(warm_t), 2),
        "decide_warm_max_ms": round(max(warm_t), 2),
        "cold_over_baseline": round(med(cold_t) / med(base_t), 2),
        "warm_over_baseline": round(med(warm_t) / med(base_t), 2),
        "target_ms": 100,
        "target_met": med(cold_t) <= 100 and med(warm_t) <= 100,
        "warm_phase_ms": {k: round(med(p[k] for p in phases) * 1000, 2) for k in phases[0]},
        "decisions_cold": dict(sorted(cold.cycle_stats.counts.items())),
        "decisions_warm": dict(sorted(warm.cycle_stats.counts.items())),
        # what the first cycle after a start costs in Slurm commands: one per decision before batching, one per
        # group now (apply.groups); scontrol still sends one RPC per id (~1 ms each on 22.05, measured)
        "slurm_commands_cold": {
            "one_per_decision": len(cold),
            "batched": len(groups(cold)),
            "ids_in_batches": sum(len(g) for g in groups(cold) if len(g) > 1),
        },
        "slurm_commands_warm": {"one_per_decision": len(warm), "batched": len(groups(warm))},
    }
    save("decide", result)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "decide_cold_ms",
                    "decide_warm_ms",
                    "decisions_cold",
                    "slurm_commands_cold",
                    "slurm_commands_warm",
                )
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

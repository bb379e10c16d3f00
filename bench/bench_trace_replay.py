"""Trace replay: nuro's controller vs "Slurm alone, hard quotas, no borrowing" on the Alibaba GPU trace.

Both variants replay the same synthesised workload on the same simulated cluster in one process (``bench/sim``);
the nuro variant runs the daemon's real cycle (``engine.decide`` + ``apply``) every ``--interval-s`` of replay time.
Every synthesis parameter is printed and saved with the results. See docs/trace-replay.md.

    python -m bench.bench_trace_replay [--seed 7] [--scale 0.05] [--compress 24] [--max-tasks N] [--interval-s 30]
    python -m bench.bench_trace_replay --compress 32 --seeds 7,8,9,10,11 \
        --policy bench/policies/balanced.yaml --policy bench/policies/skewed.yaml --policy bench/policies/strict.yaml \
        [--gang-sizes 2,4,8,16 --gang-weights 0.4,0.3,0.2,0.1] [--team-weights perception=0.3,prediction=0.3,...]

With several policies or seeds it ends with one line per (policy, seed) and the issue-13 targets checked per policy:
utilisation ratio, Jain fairness baseline → nuro, preemptions per 1,000 jobs, victims requeued inside their minimum run
time, GPU-h lost + restart staging as % of delivered, quota and borrow-limit violations.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import time
from pathlib import Path
from statistics import mean

from bench.common import REPO, save
from bench.sim import metrics
from bench.sim.bound import TeamLimits, goodput_bound, policy_bound
from bench.sim.replay import Variant, run_replay
from bench.sim.slurm import PLACEMENTS, SchedParams
from bench.sim.synth import SynthParams, synthesise
from bench.sim.trace import NODE_CSV, POD_CSV, load_nodes, load_tasks, scale_policy, shape_cluster
from nuro.policy.model import Policy

EXAMPLE_POLICY = REPO / "examples" / "policy" / "teams.yaml"
SCHED = SchedParams()

#: rows of the side-by-side table: (label, metric key, how to show it, ratio meaningful)
ROWS = (
    ("offered load (work / capacity)", "offered_load", "f3", False),
    ("GPU utilisation", "utilisation", "pct", True),
    ("GPU capacity idle while work waited", "idle_while_waiting", "pct", False),
    ("… while single-node jobs waited", "idle_while_waiting_single_node", "pct", False),
    ("goodput (kept progress)", "goodput", "pct", True),
    ("GPU alloc-idle % (not training)", "alloc_idle_pct", "f3", False),
    ("  + fractional pods on whole GPUs %", "fractional_rounding_pct", "f2", False),
    ("borrowed share of GPU-h", "borrowed_gpu_share", "pct", False),
    ("Jain fairness (mean of windows)", "jain_mean", "f3", True),
    ("Jain fairness (p10 window)", "jain_p10", "f3", True),
    ("Jain of shortfalls (x capped at 1)", "jain_shortfall_mean", "f3", True),
    ("quota violations (g- samples)", "quota_violation_samples", "int", False),
    ("borrow-limit violations (b- samples)", "borrow_limit_violation_samples", "int", False),
    ("preemptions (signals)", "preemptions", "int", False),
    ("  requeued after ack / at grace end", "requeues", "str", False),
    ("  victims requeued < 600 s after their start", "requeued_within_600s_of_start", "int", False),
    ("GPU-h lost to preemption", "gpu_h_lost_to_preemption", "f2", False),
    ("GPU-h restart staging", "gpu_h_restart_staging", "f2", False),
    ("gang runs in one leaf", "gangs", "str", False),
)


def _fmt(value: object, how: str) -> str:
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if how == "pct":
        return f"{100 * float(value):.2f} %"  # type: ignore[arg-type]
    if how == "f3":
        return f"{float(value):.3f}"  # type: ignore[arg-type]
    if how == "f2":
        return f"{float(value):.2f}"  # type: ignore[arg-type]
    return str(value)


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.3f}" if a and not math.isnan(a) and not math.isnan(b) else "-"


def table(base: dict, nuro: dict) -> str:
    """The side-by-side table (ratio = nuro / baseline where a ratio means something)."""
    for m in (base, nuro):
        m["requeues"] = f"{m['requeues_acked']} / {m['requeues_unacked']}"
        m["gangs"] = f"{m['gang_runs_one_leaf']}/{m['gang_runs']}"
    lines = [f"{'metric':<40} {'baseline':>14} {'nuro':>14} {'nuro/base':>10}", "-" * 81]
    for label, key, how, ratio in ROWS:
        r = _ratio(base[key], nuro[key]) if ratio else ""
        lines.append(f"{label:<40} {_fmt(base[key], how):>14} {_fmt(nuro[key], how):>14} {r:>10}")
    lines.append("")
    lines.append(f"{'queue wait (first start − submit), s':<40} {'baseline mean/median/p95':>36} {'nuro':>30}")
    for team, bw in base["queue_wait"].items():
        nw = nuro["queue_wait"].get(team)
        if nw is None:
            continue
        b = f"{bw['mean_s']:.0f}/{bw['median_s']:.0f}/{bw['p95_s']:.0f} (n={bw['n']}, cens {bw['censored']})"
        n = f"{nw['mean_s']:.0f}/{nw['median_s']:.0f}/{nw['p95_s']:.0f} (cens {nw['censored']})"
        lines.append(f"  {team:<38} {b:>36} {n:>30}")
    lines.append("")
    lines.append(f"{'team: quota, mean GPUs held / mean demand':<40} {'baseline':>18} {'nuro':>18}")
    for team, bs in base["team_share_vs_entitlement"].items():
        ns = nuro["team_share_vs_entitlement"][team]
        b, n = (f"{x['mean_gpus']:.0f} / {x['mean_demand_gpus']:.0f}" for x in (bs, ns))
        lines.append(f"  {team + ': ' + str(bs['quota_gpus']):<38} {b:>18} {n:>18}")
    return "\n".join(lines)


def engine_sources() -> dict[str, str]:
    """sha256 (12 hex) of every controller source the nuro variant ran: the engine changes, results must say which
    one they came from."""
    folder = REPO / "slurm_plugins" / "controller"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:12] for p in sorted(folder.glob("*.py"))}


def synth_params(seed: int, args: argparse.Namespace) -> SynthParams:
    """The synthesis knobs of one seed, with the command line's overrides (gang sizes, team weights)."""
    over: dict = {"seed": seed, "compress": args.compress}
    if args.gang_sizes:
        over["gang_sizes"] = tuple(int(x) for x in args.gang_sizes.split(","))
        weights = args.gang_weights.split(",") if args.gang_weights else ["1"] * len(over["gang_sizes"])
        if len(weights) != len(over["gang_sizes"]):
            raise SystemExit("--gang-weights needs one weight per --gang-sizes entry")
        over["gang_size_weights"] = tuple(float(x) for x in weights)
    if args.team_weights:
        pairs = [item.split("=", 1) for item in args.team_weights.split(",")]
        if any(len(p) != 2 for p in pairs):
            raise SystemExit("--team-weights: name=weight,name=weight,...")
        over["team_weights"] = tuple((name, float(w)) for name, w in pairs)
    return dataclasses.replace(SynthParams(), **over)


def min_run_by_qos(policy: Policy) -> dict[str, float]:
    """Each QOS's minimum run time (what the metrics check victims against)."""
    out: dict[str, float] = {}
    for t in policy.teams:
        out[t.guaranteed_qos] = out[t.borrow_qos] = float(policy.min_run_of(team=t.name))
    for tier in policy.tiers:
        out[tier.name] = float(policy.min_run_of(tier=tier.name))
    return out


def replay_seed(seed: int, args: argparse.Namespace, tasks: list, nodes: list, policy: Policy) -> dict:
    """Synthesise the workload for ``seed`` and replay it under every variant; metrics, the goodput bound of the
    window (``bench/sim/bound.py``) and what was synthesised."""
    params = synth_params(seed, args)
    max_gang = sum(1 for n in nodes if n.gpus >= 8)
    workload = synthesise(tasks, params, policy, max_gang, args.max_tasks)
    jobs = workload.jobs
    warm = min(len(jobs) - 1, int(len(jobs) * args.warmup_frac))
    measure_from = jobs[warm].submit_s
    quotas = {t.name: t.quota_gpus for t in policy.teams}
    out: dict = {"params": params, "workload": workload, "measure_from": measure_from}
    sched = dataclasses.replace(SCHED, placement=args.placement)
    for variant in args.variants:
        log = run_replay(jobs, nodes, policy, variant, args.interval_s, sched=sched, node_weights=args.node_weights)
        out[variant.value] = metrics.compute(log, quotas, measure_from, args.window_s, min_run_by_qos(policy))
    if args.bound:
        horizon = max(j.submit_s for j in jobs)
        plain = goodput_bound(jobs, nodes, measure_from, horizon)
        out["bound"] = dataclasses.asdict(plain)
        limits = {t.name: TeamLimits(t.quota_gpus, t.borrow_limit_gpus, t.lend_limit_gpus) for t in policy.teams}
        kept = policy_bound(jobs, nodes, limits, {t.name for t in policy.tiers}, measure_from, horizon)
        out["policy_bound"] = dataclasses.asdict(min(plain, kept, key=lambda b: b.gpu_s))
    return out


def spread_table(rows: list[dict]) -> str:
    """One line per seed: the headline metrics of both variants, and the spread of the ratios."""
    head = (
        f"{'seed':>5} {'util base':>10} {'util nuro':>10} {'ratio':>6} {'Jain base':>10} {'Jain nuro':>10} "
        f"{'preempt':>8} {'lost GPU-h':>11} {'wait mean base/nuro s':>22}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        b, n = r["baseline"], r["nuro"]
        lines.append(
            f"{r['seed']:>5} {100 * b['utilisation']:>9.1f}% {100 * n['utilisation']:>9.1f}% "
            f"{n['utilisation'] / b['utilisation']:>6.3f} {b['jain_mean']:>10.3f} {n['jain_mean']:>10.3f} "
            f"{n['preemptions']:>8} {n['gpu_h_lost_to_preemption']:>11.2f} "
            f"{b['queue_wait']['all']['mean_s']:>11.0f}/{n['queue_wait']['all']['mean_s']:<10.0f}"
        )
    ratios = [r["nuro"]["utilisation"] / r["baseline"]["utilisation"] for r in rows]
    jr = [r["nuro"]["jain_mean"] / r["baseline"]["jain_mean"] for r in rows]
    lines.append(
        f"utilisation ratio mean {sum(ratios) / len(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
        f"Jain ratio mean {sum(jr) / len(jr):.3f} (min {min(jr):.3f}, max {max(jr):.3f})"
    )
    return "\n".join(lines)


#: issue 13's targets at --compress 32 (checked per policy over its seeds)
TARGETS = (
    "utilisation ratio ≥ 1.15 (mean)",
    "Jain ≥ baseline on every seed and ≥ 0.95 (mean)",
    "preemptions ≤ 20 per 1,000 jobs",
    "no victim requeued inside its minimum run time",
    "GPU-h lost + restart staging ≤ 1 % of delivered",
    "0 quota and borrow-limit violations",
)


def util_bound(row: dict) -> float:
    """About the most nuro's utilisation ratio can be on this workload: (baseline utilisation + the capacity that sat
    idle in the baseline while work waited) / baseline utilisation (``metrics`` "idle while waiting"). Borrowing can
    use idle GPUs only while someone waits for them; where the baseline left few idle while work waited, no policy
    reaches a high ratio."""
    base = row["baseline"]
    return min(1.0, base["utilisation"] + base["idle_while_waiting"]) / base["utilisation"]


def gain_captured(row: dict) -> float:
    """Share of that attainable gain nuro realised: (nuro − baseline) / (attainable − baseline)."""
    base = row["baseline"]["utilisation"]
    room = min(1.0, base + row["baseline"]["idle_while_waiting"]) - base
    return (row["nuro"]["utilisation"] - base) / room if room > 1e-3 else 1.0


def _at_least_base(rows: list[dict], key: str) -> str:
    """'k/n': on how many of the rows nuro's ``key`` is at least the baseline's."""
    return f"{sum(r['nuro'][key] >= r['baseline'][key] for r in rows)}/{len(rows)}"


def gang_wait(m: dict) -> str:
    """Mean queue wait of multi-node jobs in hours, and how many never started (their wait is then a lower bound)."""
    w = m["queue_wait"].get("gangs")
    return "-" if w is None else f"{w['mean_s'] / 3600:.1f} ({w['censored']})"


def load_table(rows: list[dict]) -> str:
    """The issue-13 table: one line per (policy, seed), then each policy's targets, met or not."""
    head = (
        f"{'policy':<10} {'seed':>4} {'jobs':>5} {'util b → n':>11} {'util n/b':>8} {'bound':>6} {'gain %':>6} "
        f"{'Jain base → nuro':>17} {'preempt':>7} "
        f"{'/1000':>6} {'max/job':>7} {'< min run':>9} {'lost+restart GPU-h':>19} {'% deliv':>7} {'viol':>5} "
        f"{'gang wait h b → n':>17} {'Jain≤1 b → n':>13} {'1-node idle∧wait % b → n':>24}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        b, n = r["baseline"], r["nuro"]
        viol = n["quota_violation_samples"] + n["borrow_limit_violation_samples"]
        lines.append(
            f"{r['policy']:<10} {r['seed']:>4} {n['jobs']:>5} {b['utilisation']:>5.3f}→{n['utilisation']:.3f} "
            f"{n['utilisation'] / b['utilisation']:>8.3f} {util_bound(r):>6.3f} {100 * gain_captured(r):>6.1f} "
            f"{b['jain_mean']:>8.3f} → {n['jain_mean']:.3f} {n['preemptions']:>7} "
            f"{n['preemptions_per_1000_jobs']:>6.1f} "
            f"{n['most_preemptions_of_one_job']:>7} {n['requeued_within_min_run']:>9} "
            f"{n['gpu_h_lost_to_preemption']:>9.2f} + {n['gpu_h_restart_staging']:<7.2f} "
            f"{n['lost_pct_of_delivered']:>7.3f} {viol:>5} {gang_wait(b):>8} → {gang_wait(n):<8} "
            f"{b['jain_shortfall_mean']:.3f} → {n['jain_shortfall_mean']:.3f} "
            f"{100 * b['idle_while_waiting_single_node']:>12.2f} → {100 * n['idle_while_waiting_single_node']:.2f}"
        )
    lines.append("")
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        util = [r["nuro"]["utilisation"] / r["baseline"]["utilisation"] for r in mine]
        jn = [r["nuro"]["jain_mean"] for r in mine]
        checks = (
            sum(util) / len(util) >= 1.15,
            all(r["nuro"]["jain_mean"] >= r["baseline"]["jain_mean"] for r in mine) and sum(jn) / len(jn) >= 0.95,
            max(r["nuro"]["preemptions_per_1000_jobs"] for r in mine) <= 20,
            all(r["nuro"]["requeued_within_min_run"] == 0 for r in mine),
            max(r["nuro"]["lost_pct_of_delivered"] for r in mine) <= 1.0,
            all(r["nuro"]["quota_violation_samples"] + r["nuro"]["borrow_limit_violation_samples"] == 0 for r in mine),
        )
        bound = [util_bound(r) for r in mine]
        single = sum(r["nuro"]["idle_while_waiting_single_node"] for r in mine)
        left = sum(r["nuro"]["idle_while_waiting"] for r in mine)
        lines.append(
            f"{name}: utilisation ratio mean {sum(util) / len(util):.3f} "
            f"(attainable mean {sum(bound) / len(bound):.3f}, "
            f"gain captured {100 * sum(map(gain_captured, mine)) / len(mine):.0f} %; of the capacity left idle while "
            f"work waited under nuro, {100 * (1 - single / left) if left else 0:.0f} % could serve only multi-node "
            "gangs), "
            f"Jain nuro mean {sum(jn) / len(jn):.3f} (≥ baseline on {_at_least_base(mine, 'jain_mean')} seeds; "
            f"Jain of shortfalls ≥ baseline on {_at_least_base(mine, 'jain_shortfall_mean')}); "
            + "; ".join(f"{t}: {'met' if ok else 'NOT met'}" for t, ok in zip(TARGETS, checks, strict=True))
        )
    return "\n".join(lines)


#: issue 32's targets at --compress 32 with Slurm's placement (checked per policy over its seeds)
SHARE_TARGETS = (
    "goodput ratio ≥ 50 % of the headroom to the bound (mean)",
    "example policy: goodput ratio ≥ 1.10 (mean)",
    "goodput ratio ≥ 1.00 on every seed",
    "≥ the scavenger-QOS variant on every seed",
    "GPU-h lost to preemption + restart ≤ 0.5× scavenger's",
    "sharing incentive for every team on every seed (goodput; lent wait p95 within one reclaim)",
    "≤ 20 preemptions per 1,000 jobs",
    "0 quota and borrow-limit violations",
)


def goodput_ratio(row: dict, variant: str) -> float:
    return row[variant]["goodput"] / row["baseline"]["goodput"]


def headroom_used(row: dict, bound_key: str = "bound") -> float:
    """Share of the room between the baseline's goodput and the bound that nuro took: (nuro − base) / (bound − base);
    ``bound_key`` "policy_bound": the room the policy's own limits leave (``bench/sim/bound.py`` ``policy_bound``)."""
    base, bound = row["baseline"]["goodput"], row[bound_key]["fraction"]
    return (row["nuro"]["goodput"] - base) / (bound - base) if bound - base > 1e-6 else math.nan


def lost_gpu_h(m: dict) -> float:
    """Work redone plus restart staging, GPU-h."""
    return m["gpu_h_lost_to_preemption"] + m["gpu_h_restart_staging"]


def incentive_misses(row: dict, slack_s: float, quotas: dict[str, int]) -> list[str]:
    """Where a team is worse off under nuro than under its hard quota alone (DRF's sharing incentive), give or take
    one reclaim (``slack_s`` = grace + two controller cycles): less kept progress of its guaranteed (non-tier) work
    than the baseline's less one reclaim of its quota (quota × ``slack_s`` GPU·s), whatever the cause; or its jobs
    waiting for what it lent, p95 over ``slack_s`` (lent wait, ``metrics.lent``: a p95 wait longer for another
    reason, its own gangs or borrowers, is listed by ``longer_waits``, not counted here)."""
    base, nuro = row["baseline"], row["nuro"]
    misses = []
    for team, got in base["team_guaranteed_goodput_gpu_s"].items():
        now = nuro["team_guaranteed_goodput_gpu_s"][team]
        if now < got - quotas.get(team, 0) * slack_s:
            misses.append(f"{team} goodput {now / got:.4f}x")
        wait = nuro["team_lent_wait_p95_s"].get(team, 0.0)
        if wait > slack_s:
            misses.append(f"{team} lent wait p95 {wait:.0f} s")
    return misses


def longer_waits(row: dict, slack_s: float) -> list[tuple[str, float, float, float, float]]:
    """Teams whose guaranteed jobs' p95 wait is longer under nuro than under hard quotas by more than ``slack_s``:
    (team, baseline p95 s, nuro p95 s, lent wait p95 s, lent GPU·s). Where the lent wait is within ``slack_s`` the
    longer wait is not lending's but the team's own work (its gangs that the baseline's fragmented nodes never
    started, its own borrowers) or capacity other teams hold within their quotas and tiers."""
    base, nuro = row["baseline"], row["nuro"]
    out = []
    for team in base["team_guaranteed_goodput_gpu_s"]:
        bw, nw = base["queue_wait"].get(f"guaranteed:{team}"), nuro["queue_wait"].get(f"guaranteed:{team}")
        if bw and nw and nw["p95_s"] > bw["p95_s"] + slack_s:
            lent_wait, lent_gpu_s = nuro["team_lent_wait_p95_s"].get(team, 0.0), nuro["team_lent_gpu_s"].get(team, 0.0)
            out.append((team, bw["p95_s"], nw["p95_s"], lent_wait, lent_gpu_s))
    return out


def share_table(rows: list[dict], slack_s: float, quotas: dict[str, dict[str, int]]) -> str:
    """The issue-32 table: goodput of every variant against the bound, one line per (policy, seed), then each
    policy's targets, met or not."""
    head = (
        f"{'policy':<10} {'seed':>4} {'goodput base/scav/nuro/bound':>30} {'scav/b':>7} {'nuro/b':>7} {'bound/b':>7} "
        f"{'headroom':>8} {'pol.b/b':>7} {'pol.hr':>7} {'lost GPU-h scav→nuro':>21} {'preempt/1000 s→n':>17} "
        f"{'viol':>4}  sharing incentive"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        b, sc, n = r["baseline"], r["scavenger"], r["nuro"]
        viol = n["quota_violation_samples"] + n["borrow_limit_violation_samples"]
        miss = incentive_misses(r, slack_s, quotas[r["policy"]])
        worse = [f"{t} {b:.0f}->{n:.0f} s (lent {lw:.0f} s, {lg / 3600:.1f} GPU-h)"
                 for t, b, n, lw, lg in longer_waits(r, slack_s)]  # fmt: skip
        lines.append(
            f"{r['policy']:<10} {r['seed']:>4} {b['goodput']:>7.4f}/{sc['goodput']:.4f}/{n['goodput']:.4f}/"
            f"{r['bound']['fraction']:.4f} {goodput_ratio(r, 'scavenger'):>7.3f} {goodput_ratio(r, 'nuro'):>7.3f} "
            f"{r['bound']['fraction'] / b['goodput']:>7.3f} {100 * headroom_used(r):>7.1f}% "
            f"{r['policy_bound']['fraction'] / b['goodput']:>7.3f} {100 * headroom_used(r, 'policy_bound'):>6.1f}% "
            f"{lost_gpu_h(sc):>9.2f} → {lost_gpu_h(n):<9.2f} {sc['preemptions_per_1000_jobs']:>7.1f} → "
            f"{n['preemptions_per_1000_jobs']:<7.1f} {viol:>4}  {'; '.join(miss) or 'every team'}"
            + (f" [longer p95 wait: {'; '.join(worse)}]" if worse else "")
        )
    lines.append("")
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        ratio = [goodput_ratio(r, "nuro") for r in mine]
        used = [headroom_used(r) for r in mine]
        checks = (
            sum(used) / len(used) >= 0.5,
            name != "example" or sum(ratio) / len(ratio) >= 1.10,
            min(ratio) >= 1.0,
            all(r["nuro"]["goodput"] >= r["scavenger"]["goodput"] for r in mine),
            sum(lost_gpu_h(r["nuro"]) for r in mine) <= 0.5 * sum(lost_gpu_h(r["scavenger"]) for r in mine),
            not any(incentive_misses(r, slack_s, quotas[name]) for r in mine),
            max(r["nuro"]["preemptions_per_1000_jobs"] for r in mine) <= 20,
            all(r["nuro"]["quota_violation_samples"] + r["nuro"]["borrow_limit_violation_samples"] == 0 for r in mine),
        )
        scav = [goodput_ratio(r, "scavenger") for r in mine]
        bound = [r["bound"]["fraction"] / r["baseline"]["goodput"] for r in mine]
        pbound = [r["policy_bound"]["fraction"] / r["baseline"]["goodput"] for r in mine]
        pused = [headroom_used(r, "policy_bound") for r in mine]
        longer = [w for r in mine for w in longer_waits(r, slack_s)]
        gangs = {v: mean(r[v]["goodput_gangs"] for r in mine) for v in ("baseline", "scavenger", "nuro")}
        gangs["bound"] = mean(r["bound"]["gang_fraction"] for r in mine)
        lines.append(
            f"{name}: goodput ratio mean {sum(ratio) / len(ratio):.3f} (min {min(ratio):.3f}), scavenger QOS "
            f"{sum(scav) / len(scav):.3f}, bound {sum(bound) / len(bound):.3f}, headroom used "
            f"{100 * sum(used) / len(used):.0f} % (of what the policy's limits allow: bound "
            f"{sum(pbound) / len(pbound):.3f}, headroom used {100 * sum(pused) / len(pused):.0f} %); "
            + "; ".join(f"{t}: {'met' if ok else 'NOT met'}" for t, ok in zip(SHARE_TARGETS, checks, strict=True))
            + f"; team-seeds with a longer p95 wait than under hard quotas: {len(longer)} of "
            f"{len(mine) * len(quotas[name])}, {sum(1 for w in longer if w[3] > slack_s)} of them lending's; "
            f"multi-node jobs' goodput (share of capacity, mean): bound {gangs['bound']:.3f}"
            f", hard quotas {gangs['baseline']:.3f}, scavenger QOS {gangs['scavenger']:.3f}, nuro {gangs['nuro']:.3f}"
        )
    return "\n".join(lines)


def cause_table(rows: list[dict], variants: list[Variant]) -> str:
    """Capacity idle while work waited (% of capacity), and its share per cause (``replay.IDLE_CAUSES``)."""
    causes = list(rows[0]["baseline"]["idle_while_waiting_by_cause"])
    head = f"{'policy':<10} {'seed':>4} {'variant':<10} {'idle∧wait %':>11} " + " ".join(f"{c:>14}" for c in causes)
    lines = [head, "-" * len(head)]
    for r in rows:
        for v in variants:
            m = r[v.value]
            by = m["idle_while_waiting_by_cause"]
            total = sum(by.values())
            shares = " ".join(f"{100 * by[c] / total if total else 0:>13.1f}%" for c in causes)
            lines.append(f"{r['policy']:<10} {r['seed']:>4} {v.value:<10} {100 * total:>10.2f}% {shares}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7, help="synthesis seed of the main table [7]")
    ap.add_argument("--spread-seeds", type=int, default=4, help="also replay seeds seed+1..seed+N [4]")
    ap.add_argument("--max-tasks", type=int, default=None, help="first N GPU tasks that ran, by creation [all]")
    ap.add_argument("--scale", type=float, default=0.05, help="fraction of the trace's nodes, per class [0.05]")
    ap.add_argument("--compress", type=float, default=24.0, help="arrival times divided by this [24]")
    ap.add_argument("--interval-s", type=float, default=30.0, help="controller interval, replay seconds [30]")
    ap.add_argument("--window-s", type=float, default=3600.0, help="Jain fairness window, replay seconds [3600]")
    ap.add_argument("--warmup-frac", type=float, default=0.05, help="first share of jobs not measured [0.05]")
    ap.add_argument("--policy", type=Path, action="append", help="teams.yaml to scale to the cluster; repeat for "
                    "several [examples/policy/teams.yaml]")  # fmt: skip
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (instead of --seed/--spread-seeds)")
    ap.add_argument("--gang-sizes", default=None, help="nodes per gang to draw from, e.g. 2,4,8,16 [synth default]")
    ap.add_argument("--gang-weights", default=None, help="a weight per --gang-sizes entry, e.g. 0.4,0.3,0.2,0.1")
    ap.add_argument("--team-weights", default=None, help="share of trace tasks per team, e.g. perception=0.3,...")
    ap.add_argument("--name", default="trace_replay", help="result file name under bench/results/")
    ap.add_argument(
        "--variants",
        default="baseline,scavenger,nuro",
        help="replayed side by side: baseline (hard quotas), scavenger (Slurm's preempt/qos), nuro",
    )
    ap.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="tree",
        help="slurmctld's node choice: tree (22.05-25.11), block (26.05), bestfit (the old ideal) [tree]",
    )
    ap.add_argument(
        "--node-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="nuro's controller sets packing node weights [on]",
    )
    ap.add_argument(
        "--bound",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="compute the goodput bound of each window (max-flow) [on]",
    )
    args = ap.parse_args(argv)
    args.variants = [Variant(v) for v in args.variants.split(",")]
    if Variant.BASELINE not in args.variants or Variant.NURO not in args.variants:
        raise SystemExit("--variants needs baseline and nuro (the ratios are nuro / baseline)")

    t_start = time.perf_counter()
    tasks, trace_nodes = load_tasks(POD_CSV), load_nodes(NODE_CSV)
    nodes = shape_cluster(trace_nodes, args.scale)
    cluster_gpus = sum(n.gpus for n in nodes)
    policy_paths = args.policy or [EXAMPLE_POLICY]
    seeds = (
        [int(x) for x in args.seeds.split(",")]
        if args.seeds
        else [args.seed, *range(args.seed + 1, args.seed + 1 + args.spread_seeds)]
    )
    rows: list[dict] = []
    per_policy: dict[str, dict] = {}
    for path in policy_paths:
        policy = scale_policy(path, cluster_gpus)
        name = path.stem if path.resolve() != EXAMPLE_POLICY.resolve() else "example"
        main_run = replay_seed(seeds[0], args, tasks, nodes, policy)
        setup = _setup(args, path, policy, nodes, main_run, seeds)
        if not per_policy:
            print("== trace replay setup (every synthesis parameter)")
            print(json.dumps(setup, indent=1), flush=True)
        base, nuro = main_run["baseline"], main_run["nuro"]
        print(f"== {name} seed {seeds[0]}: baseline {base['wall_s']} s, nuro {nuro['wall_s']} s", flush=True)
        kept = [v.value for v in args.variants] + (["bound", "policy_bound"] if args.bound else [])
        spread = [{"policy": name, "seed": seeds[0], **{k: main_run[k] for k in kept}}]
        for seed in seeds[1:]:
            r = replay_seed(seed, args, tasks, nodes, policy)
            spread.append({"policy": name, "seed": seed, **{k: r[k] for k in kept}})
            print(f"== {name} seed {seed}: baseline {r['baseline']['wall_s']} s, nuro {r['nuro']['wall_s']} s",
                  flush=True)  # fmt: skip
        rows.extend(spread)
        ratios = {
            key: round(nuro[key] / base[key], 4)
            for _, key, _, meaningful in ROWS
            if meaningful and base[key] and not math.isnan(base[key]) and not math.isnan(nuro[key])
        }
        keys = ("utilisation", "idle_while_waiting", "idle_while_waiting_single_node", "goodput", "goodput_gangs",
                "alloc_idle_pct",
                "jain_mean", "jain_p10", "jain_shortfall_mean",
                "preemptions",
                "preemptions_per_1000_jobs", "requeued_within_min_run", "most_preemptions_of_one_job",
                "gpu_h_lost_to_preemption", "gpu_h_restart_staging", "lost_pct_of_delivered",
                "quota_violation_samples", "borrow_limit_violation_samples")  # fmt: skip
        per_policy[name] = {
            "setup": setup, "baseline": base, "nuro": nuro, "ratios_nuro_over_baseline": ratios,
            "seed_spread": [_seed_record(r, args, keys) for r in spread],
        }  # fmt: skip
        print(f"\n== {name}, seed {seeds[0]}: baseline (Slurm alone, hard quotas) vs nuro (same decide() every "
              f"{args.interval_s:g} s)")  # fmt: skip
        print(table(base, nuro))
        if len(spread) > 1:
            print(f"\n== {name}: the same for {len(spread)} seeds (team, gang, tier and checkpoint draws change)")
            print(spread_table(spread), flush=True)
    total_s = time.perf_counter() - t_start
    first = next(iter(per_policy.values()))
    out = {**first, "policies": per_policy, "runtime_s": round(total_s, 1)}
    save(args.name, out)
    print(f"\n== sharing under load: {len(policy_paths)} policy(ies) × {len(seeds)} seed(s), --compress "
          f"{args.compress:g} (issue 13 targets)")  # fmt: skip
    print(load_table(rows))
    if Variant.SCAVENGER in args.variants and args.bound:
        slack = max(p["setup"]["policy"]["grace_s"] for p in per_policy.values()) + 2 * args.interval_s
        print(f"\n== goodput against Slurm's scavenger QOS and the bound ({args.placement} placement, node weights "
              f"{'on' if args.node_weights else 'off'}; issue 32 targets)")  # fmt: skip
        quotas = {
            name: {t: v["quota"] for t, v in p["setup"]["policy"]["teams"].items()} for name, p in per_policy.items()
        }
        print(share_table(rows, slack, quotas))
    print("\n== capacity idle while work waited, by cause (share of it)")
    print(cause_table(rows, args.variants))
    print(f"\nruntime: {total_s:.1f} s for {len(rows)} replays × {len(args.variants)} variants")
    return out


def _seed_record(row: dict, args: argparse.Namespace, keys: tuple[str, ...]) -> dict:
    """One seed's saved figures: each variant's headline metrics, its per-team guaranteed goodput and waits, the
    bound."""
    out: dict = {"seed": row["seed"]}
    for v in args.variants:
        m = row[v.value]
        out.update({f"{v.value}.{k}": m[k] for k in keys})
        out[f"{v.value}.team_guaranteed_goodput_gpu_s"] = m["team_guaranteed_goodput_gpu_s"]
        out[f"{v.value}.team_lent_wait_p95_s"] = m["team_lent_wait_p95_s"]
        out[f"{v.value}.team_lent_gpu_s"] = m["team_lent_gpu_s"]
        out[f"{v.value}.queue_wait"] = m["queue_wait"]
        out[f"{v.value}.idle_while_waiting_by_cause"] = m["idle_while_waiting_by_cause"]
    if args.bound:
        out["bound"] = row["bound"]
        out["policy_bound"] = row["policy_bound"]
    return out


def _setup(args: argparse.Namespace, path: Path, policy: Policy, nodes: list, main_run: dict, seeds: list) -> dict:
    """Every parameter of one policy's replays, printed and saved with the results."""
    workload, params = main_run["workload"], main_run["params"]
    classes: dict[str, int] = {}
    for n in nodes:
        classes[f"{n.gpus}x{n.model}"] = classes.get(f"{n.gpus}x{n.model}", 0) + 1
    return {
        "seeds": seeds,
        "trace": {"pods": str(POD_CSV), "nodes": str(NODE_CSV)},
        "cluster": {
            "scale": args.scale,
            "nodes": len(nodes),
            "gpus": sum(n.gpus for n in nodes),
            "leaves": len({n.leaf for n in nodes}),
            "leaf_size": 4,
            "node_classes": classes,
        },
        "policy": {
            "source": str(path),
            "grace_s": policy.grace_s,
            "min_run_s": policy.min_run_s,
            "restart_cost_s": policy.restart_cost_s,
            "usage_half_life_s": policy.usage_half_life_s,
            "lend_hysteresis_s": policy.lend_hysteresis_s,
            "teams": {
                t.name: {
                    "quota": t.quota_gpus,
                    "borrow_limit": t.borrow_limit_gpus,
                    "lend_limit": t.lend_limit_gpus,
                    "shares": t.shares,
                }
                for t in policy.teams
            },  # fmt: skip
            "tiers": {
                t.name: {
                    "priority": t.priority,
                    "accounts": list(t.allowed_accounts),
                    "preempts_guaranteed": t.preempts_guaranteed,
                }
                for t in policy.tiers
            },  # fmt: skip
        },
        "synthesis": params.describe(),
        "workload": {**workload.counts, "gang_size_histogram": workload.gang_sizes},
        "scheduler": dataclasses.asdict(dataclasses.replace(SCHED, placement=args.placement)),
        "node_weights": args.node_weights,
        "controller_interval_s": args.interval_s,
        "controller_sources_sha256": engine_sources(),
        "measurement": {
            "from_s": round(main_run["measure_from"], 1),
            "horizon_s": round(max(j.submit_s for j in workload.jobs), 1),
            "warmup_frac": args.warmup_frac,
            "jain_window_s": args.window_s,
            "censoring": "tasks with pod_phase=Running run their observed time (a lower bound); jobs running at the "
            "horizon (the last arrival) are cut there; jobs never started count with horizon − submit",
        },
    }


if __name__ == "__main__":
    main()

"""Metrics of one replay, computed afterwards from its run and pending records (``ReplayLog``).

Why afterwards: the event loop stays small and fast, and every metric is a plain function of the records, so a new
metric needs no re-run of the simulator logic. All time-based metrics use one measurement window
``[measure_from_s, horizon_s]`` (the warm-up before it is excluded: the trace's first months hold a handful of
pods); counts of decisions and preemptions are over the whole replay.

| metric | definition |
|---|---|
| offered load | GPU·s the jobs submitted in the window ask for, each cut at the horizon / (cluster GPUs × window) |
| utilisation | GPU·s allocated / (cluster GPUs × window) |
| idle while waiting | per 5-minute bin: min(idle GPUs, GPUs of pending jobs), summed / (cluster GPUs × window):
  capacity that sat idle while work waited (QOS limits, lending limits, placement). Baseline utilisation + this is an
  upper estimate of what a work-conserving scheduler could have used of the same load (whatever the job shapes) |
| idle while waiting, by cause | the same GPU·s, per cause of the pending work they could have served: QOS limit
  (quota, borrow limit, a lend pool kept: the policy's choice), requeue delay, a reservation held for a higher job,
  fragmentation (enough idle GPUs in all, no nodes that fit), a job wider than all idle GPUs together; shared by
  pending GPUs at each moment |
| alloc-idle % | allocated GPU·s in which the job did not train (restart staging, checkpoint-and-wait after a preemption
  signal) / allocated GPU·s |
| fractional rounding % | allocated GPU·s the trace pods did not ask for (a pod with ``gpu_milli`` 460 holds a whole
  GPU) / allocated GPU·s: idle capacity inside allocations that whole-GPU Slurm cannot avoid |
| goodput | GPU·s of progress that was kept (finished or checkpointed) / (cluster GPUs × window) |
| GPU-h lost to preemption | per requeued run: GPUs × (training-phase time − progress its last checkpoint kept), plus
  the restart staging of resumed runs |
| Jain fairness | per window of ``window_s``: x_t = allocated_t / entitled_t for teams with demand, where entitled_t is
  the quota-weighted max-min (water-filling) share of the cluster given every team's demand (running + pending
  GPUs); J = (Σx)² / (n Σx²), 1 = every team got its entitlement |
| Jain of shortfalls | the same with each x capped at 1: a team that got more than its entitlement (GPUs no other team
  could use, lent to it) counts as served, not as unfair; only teams that got less than their share lower it |
| queue wait | first start − submit, per job submitted in the window; a job never started counts with horizon − submit
  (censored, a lower bound) |
| team guaranteed goodput | per team: GPU·s of kept progress in the window of its jobs outside any tier (the work its
  quota guarantees, wherever it ran: guaranteed or borrowed QOS) |
| team guaranteed p95 wait | per team: p95 queue wait of those jobs (censored ones count as above) |
| team lent wait | per team: p95 over those jobs of the part of each job's first wait in which the job was due
  (it fits what its team's running GPUs, its own borrowed ones included, and its earlier due jobs leave of the
  quota) while another team's borrowed (or scavenger) jobs ran: the wait its lending cost it. Zero by definition
  where nobody borrows; whatever else a job waited for (its own team's work, capacity other teams hold within their
  quotas or in a tier) is not lending's |
| team lent GPU·s | per team: ∫ min(GPUs of its due jobs, other teams' borrowed GPUs) dt: the most GPU-time lending
  can have kept from it (due: the jobs that fit its unused quota, in submission order, skipping those that do not) |
| quota violations | samples (one after every event batch) where a ``g-<team>`` QOS ran above its quota |
| preemptions per 1,000 jobs | preemption signals / jobs replayed × 1000 |
| requeued within min run | requeued runs shorter than their QOS's minimum run time (must be 0) |
| lost % of delivered | (GPU-h lost to preemption + restart staging) / allocated GPU-h in the window × 100 |
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.sim.replay import IDLE_BIN_S, SCAVENGER_PREFIX, ReplayLog
from nuro.policy.model import borrow_qos


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def jain(xs: Sequence[float]) -> float:
    """Jain's index (Σx)² / (n Σx²); 1 for equal values, 1/n when one value holds everything."""
    sq = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * sq) if xs and sq > 0 else math.nan


def water_fill(capacity: float, demand: Mapping[str, float], weight: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair shares of ``capacity``: no team gets more than it demands; what a team does not need
    is shared among the others in proportion to their weights."""
    out = {t: 0.0 for t in demand}
    active = {t for t, d in demand.items() if d > 0 and weight.get(t, 0) > 0}
    left = capacity
    while active and left > 1e-9:
        total_w = sum(weight[t] for t in active)
        satisfied = {t for t in active if demand[t] <= left * weight[t] / total_w}
        if not satisfied:
            for t in active:
                out[t] = left * weight[t] / total_w
            break
        for t in satisfied:
            out[t] = demand[t]
            left -= demand[t]
        active -= satisfied
    return out


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _spread(bins: list[float], t0: float, t1: float, start: float, width: float, weight: float) -> None:
    """Add ``weight`` × the time of [t0, t1] falling into each bin of ``width`` starting at ``start``."""
    if t1 <= t0:
        return
    first = max(0, int((t0 - start) // width))
    last = min(len(bins) - 1, int((t1 - start) // width))
    for b in range(first, last + 1):
        lo = start + b * width
        bins[b] += weight * _overlap(t0, t1, lo, lo + width)


def wait_stats(waits: Sequence[float], censored: int) -> dict:
    return {
        "n": len(waits),
        "censored": censored,
        "mean_s": round(sum(waits) / len(waits), 1) if waits else math.nan,
        "median_s": round(percentile(waits, 50), 1),
        "p95_s": round(percentile(waits, 95), 1),
    }


def _idle_while_waiting(log: ReplayLog, t0: float, t1: float) -> tuple[float, float]:
    """GPU·s that sat idle while jobs waited: per ``IDLE_BIN_S`` bin, the smaller of the idle GPUs and the GPUs of
    pending jobs (whatever their shape or QOS: an upper estimate of what a work-conserving scheduler could add).

    Returned twice: for all pending jobs, and for pending single-node jobs only, the part of that headroom that idle
    GPUs could serve whatever the nodes they sit on (a multi-node gang needs whole nodes, which scattered idle GPUs
    are not)."""
    n = max(1, math.ceil((t1 - t0) / IDLE_BIN_S))
    held, wanted, wanted_single = [0.0] * n, [0.0] * n, [0.0] * n
    nodes = {j.job_id: j.spec.node_count for j in log.jobs}
    for r in log.runs:
        _spread(held, max(r.start_s, t0), min(r.end_s, t1), t0, IDLE_BIN_S, r.gpus)
    for p in log.pends:
        since, until = max(p.since_s, t0), min(p.until_s, t1)
        _spread(wanted, since, until, t0, IDLE_BIN_S, p.gpus)
        if nodes.get(p.job_id, 1) <= 1:
            _spread(wanted_single, since, until, t0, IDLE_BIN_S, p.gpus)
    total = single = 0.0
    for b in range(n):
        width = min(IDLE_BIN_S, t1 - (t0 + b * IDLE_BIN_S))
        if width > 0:
            idle = log.capacity * width - held[b]
            total += max(0.0, min(idle, wanted[b]))
            single += max(0.0, min(idle, wanted_single[b]))
    return total, single


def _borrowed(qos: str) -> bool:
    """A borrowing run: nuro's borrow QOS or the scavenger variant's."""
    return qos.startswith((borrow_qos(""), SCAVENGER_PREFIX))


@dataclass(frozen=True)
class Lent:
    """What lending cost one team (module table, "team lent wait" and "team lent GPU·s")."""

    waits: list[float]  # per guaranteed job submitted in the window, seconds due while others borrowed
    gpu_s: float  # GPU·s the team was due (short of its quota, with work waiting) while others borrowed them


def lent(log: ReplayLog, quotas: Mapping[str, int], t0: float, t1: float) -> dict[str, Lent]:
    """Per team: each of its guaranteed (non-tier) jobs' seconds of first wait in which it was due under its quota
    while other teams' borrowed jobs ran, and the GPU·s its quota was short (up to its waiting GPUs and the others'
    borrowed GPUs) meanwhile: the most that lending can have cost it.

    An exact sweep over the change points (run starts and ends, submissions, first starts). Within a team, pending
    jobs are due in submission order (the order Slurm's age factor gives one team's equal jobs), each taking what is
    left of the quota after the team's running GPUs and the due jobs before it; a job that does not fit what is left
    is skipped, not waited behind, as Slurm backfills smaller jobs past one its QOS limit holds. The short GPU·s are
    the due jobs' GPUs, up to the others' borrowed GPUs: a team's gang wider than its unused quota is its own wait."""
    out: dict[str, Lent] = {}
    for team, quota in quotas.items():
        mine = sorted((j for j in log.jobs if j.spec.team == team and j.spec.tier == "normal"),
                      key=lambda j: (j.spec.submit_s, j.job_id))  # fmt: skip
        changes: list[tuple[float, int, int]] = []  # (time, team's GPUs change, others' borrowed GPUs change)
        mine_ids = {j.job_id for j in mine}
        for r in log.runs:
            if r.job_id in mine_ids:
                changes += [(r.start_s, r.gpus, 0), (r.end_s, -r.gpus, 0)]
            elif r.team != team and _borrowed(r.qos):
                changes += [(r.start_s, 0, r.gpus), (r.end_s, 0, -r.gpus)]
        for j in mine:
            changes.append((j.spec.submit_s, 0, 0))
            if j.first_start_s is not None:
                changes.append((j.first_start_s, 0, 0))
        changes.sort(key=lambda c: c[0])
        waited = {j.job_id: 0.0 for j in mine}
        short_gpu_s = 0.0
        used = others = 0
        nxt = 0  # next of ``mine`` (by submission) not yet submitted
        pending: list = []
        i = 0
        while i < len(changes):
            t = changes[i][0]
            while i < len(changes) and changes[i][0] == t:
                used += changes[i][1]
                others += changes[i][2]
                i += 1
            while nxt < len(mine) and mine[nxt].spec.submit_s <= t:
                pending.append(mine[nxt])
                nxt += 1
            pending = [j for j in pending if j.first_start_s is None or j.first_start_s > t]
            end = changes[i][0] if i < len(changes) else t1
            lo, hi = max(t, t0), min(end, t1)
            if others <= 0 or hi <= lo or not pending:
                continue
            room = quota - used
            for j in pending:
                if room <= 0:
                    break
                if j.spec.gpus <= room:
                    room -= j.spec.gpus
                    waited[j.job_id] += hi - lo
            short_gpu_s += min(max(0, quota - used) - max(0, room), others) * (hi - lo)
        out[team] = Lent([waited[j.job_id] for j in mine if t0 <= j.spec.submit_s <= t1], short_gpu_s)
    return out


def compute(
    log: ReplayLog,
    quotas: Mapping[str, int],
    measure_from_s: float,
    window_s: float = 3600.0,
    min_run_by_qos: Mapping[str, float] | None = None,
) -> dict:
    """All metrics of one replay (module table). ``min_run_by_qos``: each QOS's minimum run time, to count the
    victims requeued inside it."""
    t0, t1 = measure_from_s, log.horizon_s
    span = max(1e-9, t1 - t0)
    cap_gpu_s = log.capacity * span
    teams = list(quotas)
    alloc = idle = good = good_gang = borrowed = 0.0
    lost = restart = 0.0
    team_alloc = {t: 0.0 for t in teams}
    team_good = {t: 0.0 for t in teams}  # kept progress of each team's non-tier jobs (sharing incentive)
    tier_job = {j.job_id for j in log.jobs if j.spec.tier != "normal"}
    n_bins = max(1, math.ceil(span / window_s))
    bin_alloc = {t: [0.0] * n_bins for t in teams}
    bin_demand = {t: [0.0] * n_bins for t in teams}
    gangs = gangs_one_leaf = 0
    rounding = 0.0
    used_fraction = {j.job_id: j.spec.used_fraction for j in log.jobs}
    for r in log.runs:
        held = _overlap(r.start_s, r.end_s, t0, t1) * r.gpus
        alloc += held
        rounding += held * (1.0 - used_fraction.get(r.job_id, 1.0))
        team_alloc[r.team] += held
        if r.qos.startswith("b-"):
            borrowed += held
        not_training = _overlap(r.start_s, r.train_start_s, t0, t1)
        if r.idle_from_s is not None:
            not_training += _overlap(r.idle_from_s, r.end_s, t0, t1)
        idle += not_training * r.gpus
        trained = max(0.0, r.end_s - r.train_start_s)
        in_window = _overlap(r.train_start_s, r.end_s, t0, t1) / trained if trained > 0 else 0.0
        good += r.kept_gpu_s * in_window  # kept progress, spread evenly over the run's training phase
        if r.node_count > 1:
            good_gang += r.kept_gpu_s * in_window
        if r.job_id not in tier_job:
            team_good[r.team] += r.kept_gpu_s * in_window
        if t0 <= r.end_s <= t1:
            lost += r.lost_gpu_s
            restart += r.restart_gpu_s
        if r.node_count > 1 and r.start_s >= t0:
            gangs += 1
            gangs_one_leaf += r.leaves == 1
        _spread(bin_alloc[r.team], max(r.start_s, t0), min(r.end_s, t1), t0, window_s, r.gpus)
        _spread(bin_demand[r.team], max(r.start_s, t0), min(r.end_s, t1), t0, window_s, r.gpus)
    for p in log.pends:
        _spread(bin_demand[p.team], max(p.since_s, t0), min(p.until_s, t1), t0, window_s, p.gpus)
    jains: list[float] = []
    shortfall_jains: list[float] = []  # x capped at 1: only what a team got less than its entitlement counts
    for b in range(n_bins):
        width = min(window_s, t1 - (t0 + b * window_s))
        if width <= 0:
            continue
        demand = {t: bin_demand[t][b] / width for t in teams}
        fair = water_fill(log.capacity, demand, quotas)
        xs = [bin_alloc[t][b] / width / fair[t] for t in teams if fair[t] > 1e-9]
        if xs:
            jains.append(jain(xs))
            shortfall_jains.append(jain([min(1.0, x) for x in xs]))
    idle_waiting, idle_waiting_single = _idle_while_waiting(log, t0, t1)
    lending = lent(log, quotas, t0, t1)
    first_bin = int(t0 // IDLE_BIN_S)
    by_cause = {c: sum(v[first_bin + 1 :]) + v[first_bin] * (1 - (t0 % IDLE_BIN_S) / IDLE_BIN_S)
                for c, v in log.idle_by_cause.items()}  # fmt: skip
    waits: dict[str, list[float]] = {
        t: [] for t in [*teams, "urgent", "all", "gangs", *(f"guaranteed:{t}" for t in teams)]
    }
    censored: dict[str, int] = {k: 0 for k in waits}
    for job in log.jobs:
        s = job.spec
        if not t0 <= s.submit_s <= t1:
            continue
        keys = [s.team, "all"] + (["urgent"] if s.tier == "urgent" else []) + (["gangs"] if s.node_count > 1 else [])
        if s.tier == "normal":
            keys.append(f"guaranteed:{s.team}")
        if job.first_start_s is not None and job.first_start_s <= t1:
            w = job.first_start_s - s.submit_s
        else:
            w = t1 - s.submit_s
            for k in keys:
                censored[k] += 1
        for k in keys:
            waits[k].append(w)
    total_quota = sum(quotas.values()) or 1
    # work that could have run inside the window: a job's run time, cut at the horizon
    offered = sum(
        j.spec.gpus * min(j.spec.runtime_s, t1 - j.spec.submit_s) for j in log.jobs if t0 <= j.spec.submit_s <= t1
    )
    demand_mean = {t: sum(bin_demand[t]) / span for t in teams}
    requeued = [r for r in log.runs if r.outcome == "requeued"]
    min_run = min_run_by_qos or {}
    too_young = sum(1 for r in requeued if r.end_s - r.start_s < min_run.get(r.qos, 0.0))
    restarts = Counter(r.job_id for r in requeued)
    n_jobs = len(log.jobs)
    return {
        "window_s": [round(t0, 1), round(t1, 1)],
        "offered_load": round(offered / cap_gpu_s, 3),
        "utilisation": round(alloc / cap_gpu_s, 4),
        "idle_while_waiting": round(idle_waiting / cap_gpu_s, 4),
        "idle_while_waiting_single_node": round(idle_waiting_single / cap_gpu_s, 4),
        "idle_while_waiting_by_cause": {c: round(v / cap_gpu_s, 5) for c, v in by_cause.items()},
        "goodput": round(good / cap_gpu_s, 4),
        "goodput_gangs": round(good_gang / cap_gpu_s, 4),  # of it, multi-node jobs' (the bound's split: bound.py)
        "alloc_idle_pct": round(100 * idle / alloc, 3) if alloc else 0.0,
        "fractional_rounding_pct": round(100 * rounding / alloc, 2) if alloc else 0.0,
        "borrowed_gpu_share": round(borrowed / alloc, 4) if alloc else 0.0,
        "jain_mean": round(sum(jains) / len(jains), 4) if jains else math.nan,
        "jain_p10": round(percentile(jains, 10), 4),
        "jain_shortfall_mean": round(sum(shortfall_jains) / len(shortfall_jains), 4) if shortfall_jains else math.nan,
        "jain_windows": len(jains),
        "team_share_vs_entitlement": {
            t: {
                "share": round(team_alloc[t] / alloc, 4) if alloc else 0.0,
                "quota_share": round(quotas[t] / total_quota, 4),
                "mean_gpus": round(team_alloc[t] / span, 1),
                "mean_demand_gpus": round(demand_mean[t], 1),
                "quota_gpus": quotas[t],
            }
            for t in teams
        },
        "team_guaranteed_goodput_gpu_s": {t: round(v, 1) for t, v in team_good.items()},
        "team_lent_wait_p95_s": {t: round(percentile(v.waits, 95), 1) if v.waits else 0.0 for t, v in lending.items()},
        "team_lent_gpu_s": {t: round(v.gpu_s, 1) for t, v in lending.items()},
        "quota_violation_samples": log.g_over_quota_samples,
        "borrow_limit_violation_samples": log.b_over_limit_samples,
        "qos_limit_breaches_at_start": log.counters.get("limit_breaches_at_start", 0),
        "samples": log.samples,
        "preemptions": log.counters.get("preemptions", 0),
        "requeues_acked": log.counters.get("requeues_acked", 0),
        "requeues_unacked": log.counters.get("requeues_unacked", 0),
        "requeued_runs": len(requeued),
        "requeued_within_600s_of_start": sum(1 for r in requeued if r.end_s - r.start_s < 600.0),
        "requeued_within_min_run": too_young,
        "jobs": n_jobs,
        "preemptions_per_1000_jobs": round(1000 * log.counters.get("preemptions", 0) / n_jobs, 2) if n_jobs else 0.0,
        "most_preemptions_of_one_job": max(restarts.values(), default=0),
        "lost_pct_of_delivered": round(100 * (lost + restart) / alloc, 3) if alloc else 0.0,
        "gpu_h_lost_to_preemption": round(lost / 3600, 2),
        "gpu_h_restart_staging": round(restart / 3600, 2),
        "gang_runs": gangs,
        "gang_runs_one_leaf": gangs_one_leaf,
        "queue_wait": {k: wait_stats(v, censored[k]) for k, v in waits.items() if v},
        "decisions": {k: v for k, v in sorted(log.counters.items()) if k[:1].isupper() or k.startswith("qos_to")},
        "controller_cycles": log.cycles,
        "decide_s_total": round(log.decide_s, 2),
        "wall_s": round(log.wall_s, 2),
    }


__all__ = ["compute", "jain", "Lent", "lent", "percentile", "wait_stats", "water_fill"]

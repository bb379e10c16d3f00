"""Controller cycles during a burst of submissions: batched apply vs one Slurm command per decision, same run.

The scenario a tester ran against issue 13: three team members submit 300 short 1-GPU jobs within ~7 s to the 8-node
dev cluster (64 GPUs, the example policy, so teams at quota borrow) while the real ``Controller.cycle()`` runs every
second. Each round submits the same burst, runs 40 s of cycles, then cancels everything; rounds alternate between

* **budget** — the daemon as shipped: Borrow/Return per target QOS and SiteFactor per value in one
  ``scontrol update jobid=<list>`` (``apply.groups``), SiteFactor only for each team's queue head, and at most 1 s
  of QOS/SiteFactor calls per cycle (``apply.ApplyBudget``; the rest is decided again next cycle);
* **batched** — the same without the budget;
* **per decision** — the same decisions, each its own ``scontrol`` process, no budget (what the daemon did before),

and reports per variant: the longest and median cycle (snapshot + decide + apply), its Slurm part (snapshot +
apply), Slurm commands, decisions, and the longest cycle's apply time. The target: every cycle ≤ 1 s of Slurm calls
during the burst.

``--hosts shared,separate`` also alternates how the one machine stands in for a cluster: ``shared`` runs everything
at the same CPU priority (the burst's sbatch processes, 8 slurmd with their prologs, steps and jobs, slurmctld and
the controller on the same 2 cores); ``separate`` runs what production runs on other hosts (login nodes' sbatch,
compute nodes' slurmd and everything under them) at nice 19 (``bench.common.nice_compute_hosts``), so slurmctld,
slurmdbd and the controller get the cores first, as on a controller host of their own.

    python -m bench.bench_cycle_burst [--jobs 300] [--rounds 2] [--hosts shared,separate] [--port-base 28800]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import yaml

from bench.common import OTHER_HOSTS_NICE, REPO, cluster, nice_compute_hosts, save
from nuro.devcluster.layout import Layout
from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.policy import parse_policy
from nuro.slurm import CliBackend
from nuro.slurm.models import ClusterSnapshot
from nuro.slurm.parse import attach_switches, parse_sinfo_json
from nuro.slurm_plugins.controller import apply as apply_mod
from nuro.slurm_plugins.controller import daemon
from nuro.slurm_plugins.controller.daemon import Controller
from nuro.slurm_plugins.controller.decisions import Borrow

USERS = {"alice": "perception", "priya": "prediction", "chen": "controls"}
#: budget: the daemon as shipped (batched, 1 s apply budget that also limits each update call, squeue and sinfo side
#: by side, partitions reused); before: the budget as it was before issue 13's second pass (the snapshot's three
#: reads one after the other every cycle, no limit on an update call); batched: no budget; per_decision: one
#: command each
VARIANTS = ("budget", "before", "batched", "per_decision")


def _submit(env: dict[str, str], user: str, i: int, nice: int) -> tuple[int, float] | None:
    """One member's sbatch: (job id, when it was accepted, monotonic); None when slurmctld refused it (a busy
    controller may time a submission out)."""
    res = subprocess.run(
        ["nice", "-n", str(nice), "runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items()),
         "sbatch", "--parsable", f"--account={USERS[user]}", "--gres=gpu:1", "--output=/dev/null",
         f"--job-name=burst{i}", "--wrap", f"sleep {20 + i % 40}"],
        check=False, capture_output=True, timeout=120,
    )  # fmt: skip
    if res.returncode != 0:
        return None
    return int(res.stdout.split(b";")[0]), time.monotonic()


class Counting(CliBackend):
    """The CLI backend, counting the Slurm commands the controller's actions run."""

    commands = 0
    serial_snapshot = False

    def call_timeout(self, seconds: float):  # noqa: ANN201 - the backend's context manager, or none ("before")
        return contextlib.nullcontext() if self.serial_snapshot else super().call_timeout(seconds)

    def read_snapshot(self) -> ClusterSnapshot:
        if not self.serial_snapshot:
            return super().read_snapshot()
        taken_at = datetime.now(UTC)  # the reads as they were: one after the other, partitions every cycle
        jobs = self.jobs()
        nodes, _ = parse_sinfo_json(self.run(["sinfo", "--json"]).stdout)
        partitions = self.partitions(nodes)
        nodes = attach_switches(nodes, self.topology())
        return ClusterSnapshot(nodes=tuple(nodes), jobs=tuple(jobs), partitions=tuple(partitions), taken_at=taken_at,
                               source=self.name)  # fmt: skip

    def apply(self, action):  # type: ignore[no-untyped-def]
        Counting.commands += 1
        return super().apply(action)


def one_round(layout: Layout, env: dict[str, str], policy_raw: dict, jobs: int, variant: str, seconds: float,
              hosts: str) -> dict:  # fmt: skip
    nice = OTHER_HOSTS_NICE if hosts == "separate" else 0
    nice_compute_hosts(layout, nice)
    backend = Counting(env=env, timeout_s=60)
    backend.serial_snapshot = variant == "before"
    budget = 1.0 if variant in ("budget", "before") else None
    controller = Controller(backend, parse_policy(policy_raw), apply_budget_s=budget)
    batched = variant != "per_decision"
    reports = []
    borrowed_at: dict[int, float] = {}
    stop = threading.Event()
    Counting.commands = 0
    original = daemon.groups
    if not batched:
        daemon.groups = lambda decisions: [(d,) for d in decisions]  # type: ignore[assignment]
    try:

        def loop() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                reports.append(controller.cycle())
                for o in reports[-1].outcomes:
                    if o.applied and isinstance(o.decision, Borrow):
                        borrowed_at.setdefault(o.decision.job_id, time.monotonic())
                stop.wait(max(0.0, 1.0 - (time.monotonic() - t0)))

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        t0 = time.monotonic()
        users = list(USERS)
        with ThreadPoolExecutor(max_workers=12) as pool:
            submitted = [s for s in pool.map(lambda i: _submit(env, users[i % len(users)], i, nice), range(jobs)) if s]
        accepted = len(submitted)
        burst_s = time.monotonic() - t0
        time.sleep(max(0.0, seconds - burst_s))
        stop.set()
        th.join(timeout=120)
    finally:
        daemon.groups = original
        for user in USERS:
            subprocess.run(["scancel", f"--user={user}"], env={**os.environ, **env}, check=False)
    total = [r.snapshot_s + r.decide_s + r.apply_s for r in reports]
    # submission → its QOS moved to b-<team> (every job the controller lent GPUs to within the round)
    lags = sorted(borrowed_at[job] - at for job, at in submitted if job in borrowed_at)
    slurm = [r.slurm_s for r in reports]
    worst = max(range(len(reports)), key=lambda i: total[i])
    return {
        "submitted_s": round(burst_s, 1),
        "submitted": accepted,
        "cycles": len(reports),
        "cycle_max_s": round(max(total), 3),
        "cycle_median_s": round(statistics.median(total), 3),
        "cycle_p90_s": round(sorted(total)[int(0.9 * (len(total) - 1))], 3),
        "cycles_over_1s": sum(1 for t in total if t > 1.0),
        "slurm_max_s": round(max(slurm), 3),
        "slurm_p90_s": round(sorted(slurm)[int(0.9 * (len(slurm) - 1))], 3),
        "cycles_slurm_over_1s": sum(1 for t in slurm if t > 1.0),
        "borrowed": len(lags),
        "borrow_lag_p50_s": round(statistics.median(lags), 2) if lags else None,
        "borrow_lag_p90_s": round(lags[int(0.9 * (len(lags) - 1))], 2) if lags else None,
        "borrow_lag_max_s": round(lags[-1], 2) if lags else None,
        "snapshot_max_s": round(max(r.snapshot_s for r in reports), 3),
        "snapshot_median_s": round(statistics.median(r.snapshot_s for r in reports), 3),
        "worst_cycle": {
            "snapshot_s": round(reports[worst].snapshot_s, 3),
            "decide_s": round(reports[worst].decide_s, 3),
            "apply_s": round(reports[worst].apply_s, 3),
            "decisions": len(reports[worst].outcomes),
        },
        "apply_max_s": round(max(r.apply_s for r in reports), 3),
        "decisions": sum(len(r.outcomes) for r in reports),
        "deferred": sum(r.deferred for r in reports),
        "slurm_commands": Counting.commands,
    }


def _median_of(rounds: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rounds if r[key] is not None]
    return round(statistics.median(vals), 2) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2, help="rounds per variant, alternating [2]")
    ap.add_argument("--seconds", type=float, default=40.0, help="cycles per round after the burst starts [40]")
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {','.join(VARIANTS)}")
    ap.add_argument("--hosts", default="shared", help="comma-separated, of shared,separate [shared]")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or any(v not in VARIANTS for v in variants):
        raise SystemExit(f"--variants: choose from {', '.join(VARIANTS)}")
    host_modes = [h for h in args.hosts.split(",") if h]
    if not host_modes or any(h not in ("shared", "separate") for h in host_modes):
        raise SystemExit("--hosts: choose from shared, separate")
    runs = [(v, h) for v in variants for h in host_modes]
    ensure_unix_users(POLICY_USERS)
    with cluster(8, args.port_base, "cycleburst") as (layout, env, _up):
        policy_raw = yaml.safe_load((REPO / "examples" / "policy" / "teams.yaml").read_text())
        path = layout.root / "teams.yaml"
        path.write_text(yaml.safe_dump(policy_raw))
        admin = Path(sys.executable).parent / "nuro-admin"
        subprocess.run([str(admin), "policy", "apply", str(path)], env={**os.environ, **env}, check=True,
                       capture_output=True)  # fmt: skip
        results: dict[str, list[dict]] = {(v if len(host_modes) == 1 else f"{v}/{h}"): [] for v, h in runs}
        for _ in range(args.rounds):
            for (variant, hosts), name in zip(runs, results, strict=True):
                r = one_round(layout, env, policy_raw, args.jobs, variant, args.seconds, hosts)
                results[name].append(r)
                print(name, r, flush=True)
                time.sleep(5)
        summary = {
            name: {
                "cycle_max_s": max(r["cycle_max_s"] for r in rs),
                "cycle_median_s": round(statistics.median(r["cycle_median_s"] for r in rs), 3),
                "apply_max_s": max(r["apply_max_s"] for r in rs),
                "slurm_commands_per_round": round(statistics.mean(r["slurm_commands"] for r in rs), 1),
                "decisions_per_round": round(statistics.mean(r["decisions"] for r in rs), 1),
                "deferred_per_round": round(statistics.mean(r["deferred"] for r in rs), 1),
                "cycle_p90_max_s": max(r["cycle_p90_s"] for r in rs),
                "cycles_over_1s_per_round": round(statistics.mean(r["cycles_over_1s"] for r in rs), 1),
                "slurm_max_s": max(r["slurm_max_s"] for r in rs),
                "slurm_p90_max_s": max(r["slurm_p90_s"] for r in rs),
                "cycles_slurm_over_1s_per_round": round(statistics.mean(r["cycles_slurm_over_1s"] for r in rs), 1),
                "borrowed_per_round": round(statistics.mean(r["borrowed"] for r in rs), 1),
                "borrow_lag_p50_s": _median_of(rs, "borrow_lag_p50_s"),
                "borrow_lag_p90_max_s": max((r["borrow_lag_p90_s"] or 0.0) for r in rs),
                "borrow_lag_max_s": max((r["borrow_lag_max_s"] or 0.0) for r in rs),
                "cycles_per_round": round(statistics.mean(r["cycles"] for r in rs), 1),
                "snapshot_max_s": max(r["snapshot_max_s"] for r in rs),
                "snapshot_median_s": round(statistics.median(r["snapshot_median_s"] for r in rs), 3),
            }
            for name, rs in results.items()
        }
        b, p = summary.get("budget"), summary.get("per_decision")
        ratios = {} if b is None or p is None else {
            "cycle_max": round(p["cycle_max_s"] / b["cycle_max_s"], 2),
            "slurm_commands": round(p["slurm_commands_per_round"] / max(1, b["slurm_commands_per_round"]), 2),
        }  # fmt: skip
        print(json.dumps(summary, indent=1))
        save("cycle_burst", {
            "jobs": args.jobs, "users": list(USERS), "rounds": args.rounds, "hosts": host_modes,
            "rounds_detail": results,
            "summary": summary,
            "ratios_per_decision_over_batched": ratios,
            "apply_module": apply_mod.__name__,
        })  # fmt: skip


if __name__ == "__main__":
    main()

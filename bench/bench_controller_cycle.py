"""The whole controller cycle (read snapshot → decide → apply) against the real dev cluster at 500 nodes.

Set-up: `devcluster up --nodes 500` (4,000 GPUs), the example policy scaled to 4,000 GPUs, 1,000+ jobs queued across
the four teams by their members (real users, real sbatch), a few hundred running. Baseline in the same run: the bare
`squeue --json` + `sinfo --json` calls a cycle cannot avoid. Reports the first cycle (it sets SiteFactor on the
queue heads), the steady state (median of the following cycles), each split into snapshot / decide / apply, and the
first cycle of a second, freshly started controller on the same queue (a restart: it reads the SiteFactors Slurm
holds with one ``sprio`` and sends only what changed). The controllers run as the daemon ships them (1 s budget of
Slurm calls per cycle, ``--budget-s``); issue 13's target is a first cycle after a start ≤ 1 s of Slurm calls at
500 nodes / 5,000 pending (``--jobs 5300``).

How the queue is built on one 2-core, 24 GiB machine: every job is submitted held (``--hold``: nothing starts while
thousands are submitted), then released (``scontrol release``, 500 ids a call). ``--queue partition-down`` (the
default) first sets the partition DOWN, so Slurm starts none of them: 5,000 eligible jobs wait (reason
``PartitionDown``) beside 500 idle nodes, the most SiteFactor work a first cycle can have (every team's queue head
up to its quota + borrow limit), and no prolog or step runs; ``--queue running`` releases them into the open
partition, Slurm starts a few hundred, and the bench waits until no job is configuring or completing (on this box
that ran out of memory: the 500 node agents alone hold ~20 GiB, and a few hundred starts add 500 prologs and steps).
What production runs on other hosts (every node's slurmd and agent, and all they start) runs at nice 19
(``bench.common.nice_compute_hosts``), as in ``bench_cycle_burst --hosts separate``.

``--slurm 26.05`` runs it on that version's cluster (the result file is then ``controller_cycle_<N>_<version>``).

``--before-ref REV`` (issue 30) adds, on the same queue right after, the controller at ``REV`` (run from a copy of
that commit, ``bench_reclaim.before_tree``) beside this checkout's, alternating segments of ``--cycles`` each
(before, after, before, after), the first cycle of each segment (a fresh controller's) left out: the steady cycle
of both, and their ratio. This checkout's controller runs as the daemon ships it: its preemption ledger and the
agents' progress file in the cluster's controller state dir.

    python -m bench.bench_controller_cycle [--nodes 500] [--jobs 1200] [--cycles 10] [--budget-s 1.0] [--slurm V]
        [--before-ref c270996]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from bench.common import OTHER_HOSTS_NICE, REPO, cluster, median_s, nice_compute_hosts, run, save
from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.policy import parse_policy
from nuro.slurm import CliBackend, render_argv
from nuro.slurm.models import NodeInfo
from nuro.slurm_plugins.controller import weights
from nuro.slurm_plugins.controller.daemon import Controller

MEMBERS = {"perception": "alice", "prediction": "priya", "controls": "chen", "simulation": "sam"}
SHARE = {"perception": 0.375, "prediction": 0.25, "controls": 0.125, "simulation": 0.25}


def scaled_policy(gpus: int) -> dict:
    raw = yaml.safe_load((REPO / "examples" / "policy" / "teams.yaml").read_text())
    raw["cluster_gpus"] = gpus
    for name, team in raw["teams"].items():
        quota = int(gpus * SHARE[name])
        team.update(quota_gpus=quota, borrow_limit_gpus=quota // 2, lend_limit_gpus=quota // 3)
        team.pop("fairshare", None)
    return raw


def apply_scaled_policy(layout, env: dict[str, str], gpus: int) -> tuple[dict, Path]:  # noqa: ANN001
    """The example policy scaled to ``gpus`` (``scaled_policy``), written beside the cluster and applied with
    ``nuro-admin policy apply``; returns it and its file."""
    raw = scaled_policy(gpus)
    path = layout.root / "teams.yaml"
    path.write_text(yaml.safe_dump(raw))
    admin = Path(sys.executable).parent / "nuro-admin"
    subprocess.run([str(admin), "policy", "apply", str(path)], env={**os.environ, **env}, check=True,
                   capture_output=True)  # fmt: skip
    return raw, path


def sbatch_as_member(team: str, env: dict[str, str], args: list[str], attempts: int = 1) -> int:
    """``sbatch --parsable --account=<team> <args>`` as the team's member; its job id. ``attempts`` > 1 retries after
    2, 4, … s: a slurmctld or munged swamped by hundreds of slurmd on 2 cores times out now and then."""
    user = MEMBERS[team]
    argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items()), "sbatch", "--parsable",
            f"--account={team}", *args]  # fmt: skip
    for attempt in range(attempts):
        res = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if res.returncode == 0:
            return int(res.stdout.strip().split(";")[0])
        if attempt + 1 < attempts:
            time.sleep(2 * (attempt + 1))
    raise RuntimeError(f"sbatch as {user} ({' '.join(args)}) failed {attempts} time(s): {res.stderr.strip()}")


def wait_settled(env: dict[str, str], timeout_s: float = 900.0) -> float:
    """Seconds until no job is configuring (its prolog running) or completing, twice in a row, 5 s apart."""
    t0 = time.monotonic()
    quiet = 0
    while quiet < 2:
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"jobs still configuring or completing after {timeout_s:.0f} s")
        busy = run(["squeue", "-h", "-t", "CONFIGURING,COMPLETING", "-o", "%i"], env).split()
        quiet = quiet + 1 if not busy else 0
        time.sleep(5)
    return time.monotonic() - t0


def shipped(backend: CliBackend, policy_raw: dict, budget_s: float, state_dir: Path) -> Controller:
    """The controller as the daemon ships it: with its ledger and the agents' progress (issue 30)."""
    from nuro.slurm_plugins.controller.ledger import Ledger
    from nuro.slurm_plugins.controller.progress import ProgressFile

    return Controller(backend, parse_policy(policy_raw), apply_budget_s=budget_s, ledger=Ledger(state_dir),
                      progress=ProgressFile(state_dir).view, node_weights=True)  # fmt: skip


def scramble_weights(env: dict[str, str], backend: CliBackend, k: int) -> int:
    """Give half the nodes (alternating by ``k``) weights off their packing value, one ``scontrol`` call per value
    (``weights.plan`` with that target, outside the timed cycle): the next cycle must set them all back, as after a
    burst of starts and ends on those nodes. Returns how many nodes were changed."""
    nodes = backend.nodes()
    index = {n.name: i for i, n in enumerate(nodes)}

    def off(node: NodeInfo) -> int | None:
        i = index[node.name]
        return 1 + (i * 7 + k) % 8 if i % 2 == k % 2 else None

    todo = weights.plan(nodes, off)
    for update in todo.updates:
        run(render_argv(update), env)
    return todo.nodes


#: One segment of the old controller's cycles, in a process of its own with the old code on its path.
_OLD_CYCLES = """
import json, sys, yaml
from nuro.policy import parse_policy
from nuro.slurm import CliBackend
from nuro.slurm_plugins.controller.daemon import Controller
c = Controller(CliBackend(timeout_s=120), parse_policy(yaml.safe_load(open(sys.argv[1]))),
               apply_budget_s=float(sys.argv[2]))
print(json.dumps([[r.snapshot_s, r.decide_s, r.apply_s] for r in (c.cycle() for _ in range(int(sys.argv[3])))]))
"""


def compare(layout, env: dict[str, str], backend: CliBackend, policy_path: Path, policy_raw: dict,  # noqa: ANN001
            args: argparse.Namespace) -> dict:  # fmt: skip
    """Steady cycles of the controller at ``args.before_ref`` vs this checkout's, alternating on the same queue."""
    import tempfile

    from bench.bench_reclaim import before_tree

    cycles: dict[str, list[list[float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="nuro-before-") as tmp:
        shim = before_tree(args.before_ref, Path(tmp))
        for _ in range(2):
            res = subprocess.run([sys.executable, "-P", "-c", _OLD_CYCLES, str(policy_path), str(args.budget_s),
                                  str(args.cycles)], env={**os.environ, **env, "PYTHONPATH": str(shim)}, cwd="/",
                                 capture_output=True, text=True, check=True, timeout=1800)  # fmt: skip
            cycles["before"] += json.loads(res.stdout.strip().splitlines()[-1])[1:]
            ctl = shipped(backend, policy_raw, args.budget_s, layout.controller_state)
            cycles["after"] += [
                [r.snapshot_s, r.decide_s, r.apply_s] for r in (ctl.cycle() for _ in range(args.cycles))
            ][1:]
    out = {}
    for name, rows in cycles.items():
        totals = sorted(sum(r) for r in rows)
        decide = statistics.median(r[1] for r in rows)
        out[name] = {"cycles": len(rows), "median_s": round(statistics.median(totals), 3),
                     "worst_s": round(totals[-1], 3), "decide_median_s": round(decide, 4)}  # fmt: skip
    out["after_over_before"] = round(out["after"]["median_s"] / out["before"]["median_s"], 3)
    out["before_ref"] = args.before_ref
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=1200, help="jobs submitted (5300 leaves ~5,000 pending at 500 nodes)")
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--budget-s", type=float, default=1.0, help="Slurm budget per cycle [1.0, as shipped]")
    ap.add_argument(
        "--weights-churn",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="before each steady cycle, put half the nodes' weights off (the cycle sets them back) [on]",
    )
    # 8 saturated munged (4 threads) beside 500 slurmd on 2 cores: "Munge encode failed ... temporarily unavailable"
    ap.add_argument("--submit-threads", type=int, default=4, help="parallel sbatch [4]")
    ap.add_argument("--slurm", default="22.05", help="Slurm version of the cluster [22.05]")
    ap.add_argument("--before-ref", default=None, help="also run the controller at this commit, same queue")
    ap.add_argument("--queue", choices=("partition-down", "running"), default="partition-down",
                    help="how the released jobs wait (module docstring) [partition-down]")  # fmt: skip
    args = ap.parse_args()
    # MLflow and its bridge are no part of a cycle; at 500 nodes this box's memory is the 500 agents' (the 26.05
    # cluster's MLflow was OOM-killed at start-up)
    os.environ.setdefault("NURO_DEVCLUSTER_MLFLOW", "0")
    ensure_unix_users(POLICY_USERS)
    with cluster(args.nodes, args.port_base, f"cycle{args.nodes}", slurm=args.slurm) as (layout, env, _up):
        policy_raw, policy_path = apply_scaled_policy(layout, env, args.nodes * 8)
        teams = list(MEMBERS)
        niced = nice_compute_hosts(layout, OTHER_HOSTS_NICE)
        print(f"{niced} compute-host processes at nice {OTHER_HOSTS_NICE}", flush=True)

        def submit(i: int) -> int:
            args_ = ["--hold", f"--nodes={1 + i % 4}", "--gres=gpu:8", "--output=/dev/null", "--wrap", "sleep 3600"]
            return sbatch_as_member(teams[i % len(teams)], env, args_, attempts=3)

        t_submit = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.submit_threads) as pool:
            ids = list(pool.map(submit, range(args.jobs)))
        submit_s = time.monotonic() - t_submit
        print(f"submitted {args.jobs} jobs in {submit_s:.0f} s", flush=True)
        if args.queue == "partition-down":
            partition = run(["sinfo", "-h", "-o", "%R"], env).split()[0]
            run(["scontrol", "update", f"partitionname={partition}", "state=down"], env)
        for i in range(0, len(ids), 500):
            run(["scontrol", "release", ",".join(map(str, ids[i : i + 500]))], env)
        settled_s = wait_settled(env)
        print(f"released; no job configuring or completing after {settled_s:.0f} s", flush=True)
        backend = CliBackend(env=env, timeout_s=120)
        controller = shipped(backend, policy_raw, args.budget_s, layout.controller_state)
        reports, scrambled = [], []
        for k in range(args.cycles):
            scrambled.append(scramble_weights(env, backend, k) if k and args.weights_churn else 0)
            reports.append(controller.cycle())
        restarted = Controller(backend, parse_policy(policy_raw), apply_budget_s=args.budget_s).cycle()
        snap = backend.read_snapshot()
        bare = median_s(lambda: (run(["squeue", "--json"], env), run(["sinfo", "--json"], env)), 5)
        steady = reports[1:] or reports
        versus = compare(layout, env, backend, policy_path, policy_raw, args) if args.before_ref else None

        def med(attr: str) -> float:
            return round(statistics.median(getattr(r, attr) for r in steady), 3)

        first = reports[0]

        save(
            f"controller_cycle_{args.nodes}" + ("" if args.slurm == "22.05" else f"_{args.slurm}"),
            {
                "slurm": args.slurm,
                "queue": args.queue,
                "nodes": args.nodes,
                "gpus": args.nodes * 8,
                "jobs": len(snap.jobs),
                "running": sum(1 for j in snap.jobs if j.phase.value == "RUNNING"),
                "pending": sum(1 for j in snap.jobs if j.phase.value == "PENDING"),
                "apply_budget_s": args.budget_s,
                "submit_s": round(submit_s, 1),
                "settle_s": round(settled_s, 1),
                "first_cycle": {
                    "slurm_s": round(first.slurm_s, 3),
                    "snapshot_s": round(first.snapshot_s, 3),
                    "decide_s": round(first.decide_s, 3),
                    "apply_s": round(first.apply_s, 3),
                    "decisions": len(first.outcomes),
                    "deferred": first.deferred,
                },
                "first_cycle_after_restart": {
                    "slurm_s": round(restarted.slurm_s, 3),
                    "snapshot_s": round(restarted.snapshot_s, 3),
                    "decide_s": round(restarted.decide_s, 3),
                    "apply_s": round(restarted.apply_s, 3),
                    "decisions": len(restarted.outcomes),
                    "deferred": restarted.deferred,
                },
                "deferred_per_cycle": [r.deferred for r in reports],
                "weights_scrambled_before_cycle": scrambled,
                "weights_set_per_cycle": [r.weights for r in reports],
                "apply_s_per_cycle": [round(r.apply_s, 3) for r in reports],
                "slurm_s_per_cycle": [round(r.slurm_s, 3) for r in reports],
                "steady_cycle_median": {
                    "snapshot_s": med("snapshot_s"),
                    "decide_s": med("decide_s"),
                    "apply_s": med("apply_s"),
                    "decisions_per_cycle": statistics.median(len(r.outcomes) for r in steady),
                },
                "bare_squeue_sinfo_json_s": round(bare, 3),
                "steady_cycle_over_bare_ratio": round((med("snapshot_s") + med("decide_s") + med("apply_s")) / bare, 2),
                **({"before_vs_after": versus} if versus else {}),
            },
        )


if __name__ == "__main__":
    main()

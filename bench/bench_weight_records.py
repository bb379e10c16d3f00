"""What the packing node weights cost inside slurmctld: the config records that partial weight updates split.

slurmctld keeps one config record per distinct node configuration. ``scontrol update nodename=X weight=N`` on part of
a record splits it (``_update_node_weight``, 22.05 and 26.05), and records never merge again, so after the
controller's weights have churned a cluster can hold up to one record per node; the scheduler's
``_build_node_list`` walks every record for every job it tries. This bench measures slurmctld's own scheduling
cycles (``sdiag``: the main scheduler's and backfill's mean and max cycle) with every node busy (one 7-GPU job each)
and ``--jobs`` pending 2-GPU jobs that every pass tries and cannot start yet (backfill plans each of them, so it
builds each one's node list; the main scheduler stops at the first that does not fit), on one cluster, in three
weight states one after the other (records only ever split, so the order is fewest first):

1. as configured: every node the same weight (the fewest records the configuration has);
2. the packing values: node i gets ``1 + i % 9`` (the nine values the controller sets on 8-GPU nodes);
3. every node its own weight (``10 + i``): one record per node, the most churn can reach.

Each state: ``sdiag -r``, ``--window-s`` seconds, ``sdiag``. The dev cluster schedules every 5 s (``sched_interval``
and ``bf_interval``), so a 60 s window holds about a dozen passes of each.

    python -m bench.bench_weight_records [--nodes 256] [--jobs 1000] [--window-s 60] [--slurm 22.05]
"""

from __future__ import annotations

import argparse
import re
import time
from concurrent.futures import ThreadPoolExecutor

from bench.bench_controller_cycle import MEMBERS, SHARE, apply_scaled_policy, sbatch_as_member
from bench.common import OTHER_HOSTS_NICE, cluster, nice_compute_hosts, poll, run, save
from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.slurm import CliBackend, render_argv
from nuro.slurm.models import NodeInfo
from nuro.slurm_plugins.controller import weights

#: sdiag's sections and the figures read from each (microseconds)
_SECTIONS = {"main": "Main schedule statistics", "backfill": "Backfilling stats"}
_FIGURES = {
    "cycles": "Total cycles",
    "mean_us": "Mean cycle",
    "max_us": "Max cycle",
    "mean_depth": "Mean depth cycle",  # main scheduler: jobs looked at per cycle
    "depth_mean": "Depth Mean",  # backfill: jobs looked at per cycle
    "try_depth_mean": "Depth Mean (try depth)",  # backfill: jobs it tried to place (built a node list for)
}


def parse_sdiag(text: str) -> dict[str, dict[str, int]]:
    """The main scheduler's and backfill's cycle counts, mean and max cycle (µs) from ``sdiag`` text."""
    out: dict[str, dict[str, int]] = {}
    for key, title in _SECTIONS.items():
        start = text.find(title)
        if start < 0:
            continue
        block = text[start:]
        nxt = min((block.find(t, 1) for t in _SECTIONS.values() if block.find(t, 1) > 0), default=len(block))
        block = block[:nxt]
        figures = {}
        for name, label in _FIGURES.items():
            m = re.search(rf"^\s*{re.escape(label)}:\s+(\d+)", block, re.MULTILINE)
            if m:
                figures[name] = int(m.group(1))
        out[key] = figures
    return out


def set_weights(env: dict[str, str], nodes: list[NodeInfo], weight_of: dict[str, int]) -> int:
    """Set these weights, one ``scontrol`` call per value (``weights.plan``); how many calls."""
    todo = weights.plan(nodes, lambda n: weight_of.get(n.name))
    for update in todo.updates:
        run(render_argv(update), env)
    return len(todo.updates)


def measure(env: dict[str, str], window_s: float) -> dict[str, dict[str, int]]:
    run(["sdiag", "-r"], env)
    time.sleep(window_s)
    return parse_sdiag(run(["sdiag"], env))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=256)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--slurm", default="22.05")
    args = ap.parse_args()
    ensure_unix_users(POLICY_USERS)
    with cluster(args.nodes, args.port_base, f"weights{args.nodes}", slurm=args.slurm) as (layout, env, _up):
        apply_scaled_policy(layout, env, args.nodes * 8)
        nice_compute_hosts(layout, OTHER_HOSTS_NICE)
        backend = CliBackend(env=env, timeout_s=120)
        nodes = backend.nodes()
        teams = list(MEMBERS)

        # one 7-GPU job per node, each team's share of the nodes: every node keeps one idle GPU and every team's
        # quota room, so the pending 2-GPU jobs pass their QOS limit (a job a limit holds is skipped before any node
        # list is built) and wait for Resources: every pass tries them and none fits
        owners = [t for t in teams for _ in range(round(len(nodes) * SHARE[t]))][: len(nodes)]

        def submit(team: str, gpus: int) -> int:
            return sbatch_as_member(team, env, [f"--gres=gpu:{gpus}", "--output=/dev/null", "--wrap", "sleep 3600"])

        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda t: submit(t, 7), owners))

        def all_running() -> bool:
            return len(run(["squeue", "-h", "-t", "R", "-o", "%i"], env).split()) >= len(owners)

        if not poll(all_running, 600, interval_s=5):
            raise RuntimeError("the 7-GPU jobs did not all start within 600 s")
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda i: submit(teams[i % len(teams)], 2), range(args.jobs)))
        pending = len(run(["squeue", "-h", "-t", "PD", "-o", "%i"], env).split())
        print(f"{len(nodes)} nodes busy, {pending} jobs pending", flush=True)
        states = {
            "as configured": {},
            "nine packing values": {n.name: 1 + i % 9 for i, n in enumerate(nodes)},
            "one per node": {n.name: 10 + i for i, n in enumerate(nodes)},
        }
        rows = []
        for label, weight_of in states.items():
            calls = set_weights(env, backend.nodes(), weight_of) if weight_of else 0
            figures = measure(env, args.window_s)
            distinct = len({n.weight for n in backend.nodes()})
            rows.append({"weights": label, "distinct_weights": distinct, "scontrol_calls": calls, **figures})
            print(label, distinct, figures, flush=True)
        save(
            f"weight_records_{args.nodes}" + ("" if args.slurm == "22.05" else f"_{args.slurm}"),
            {
                "slurm": args.slurm,
                "nodes": args.nodes,
                "pending_jobs": pending,
                "window_s": args.window_s,
                "states": rows,
            },  # fmt: skip
        )


if __name__ == "__main__":
    main()

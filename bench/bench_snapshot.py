"""Cost of one adapter snapshot (nodes + jobs + partitions, parsed) at 8 and 500 nodes with 1,000 jobs queued.

Baseline in the same run: the bare `squeue --json` + `sinfo --json` calls the snapshot is built from (no parsing).
The ratio is what nuro's parsing and typing add.

Per Slurm version with ``--slurm 22.05 24.11 26.05`` (one cluster after the other, same box): the JSON grew between
versions, so the bare calls and the parse are measured on each.

    python bench/bench_snapshot.py [--nodes 8 500] [--jobs 1000] [--slurm 22.05 26.05]
"""

from __future__ import annotations

import argparse

from bench.common import cluster, median_s, run, save
from nuro.slurm import CliBackend


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 500])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--slurm", nargs="+", default=["22.05"], help="Slurm versions, one cluster each [22.05]")
    args = ap.parse_args()
    rows = []
    for version, n in ((v, n) for v in args.slurm for n in args.nodes):
        with cluster(n, args.port_base, f"snap{n}", slurm=version) as (_layout, env, up):
            backend = CliBackend(env=env)
            for _ in range(args.jobs):
                backend.submit("#!/bin/bash\ntrue\n", "--hold", "--nodes=1")
            snap = backend.read_snapshot()
            bare = median_s(lambda: (run(["squeue", "--json"], env), run(["sinfo", "--json"], env)), args.repeat)
            nuro = median_s(backend.read_snapshot, args.repeat)
            rows.append(
                {
                    "slurm": version,
                    "nodes": n,
                    "jobs_queued": len(snap.jobs),
                    "nodes_in_snapshot": len(snap.nodes),
                    "up_to_all_idle_s": round(up.seconds_to_idle, 1),
                    "bare_squeue_sinfo_json_s": round(bare, 3),
                    "adapter_snapshot_s": round(nuro, 3),
                    "adapter_over_bare_ratio": round(nuro / bare, 2),
                }
            )
    save("snapshot", {"repeat": args.repeat, "rows": rows})


if __name__ == "__main__":
    main()

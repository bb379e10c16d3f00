"""A burst of submissions through nuro's adapter vs bare `sbatch`, side by side in the same run.

Both submit the same held script on stdin (held jobs never run, so only submission is measured), alternating in
blocks of 25 so drift in slurmctld load hits both equally. Reports submits/s for each and the adapter/bare ratio.

    python bench/bench_submit_burst.py [--jobs 200] [--nodes 8]
"""

from __future__ import annotations

import argparse
import time

from bench.common import cluster, run, save
from nuro.slurm import CliBackend

SCRIPT = "#!/bin/bash\ntrue\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--port-base", type=int, default=28800)
    args = ap.parse_args()
    with cluster(args.nodes, args.port_base, "burst") as (_layout, env, _up):
        backend = CliBackend(env=env)
        bare_s = adapter_s = 0.0
        block = 25
        for _ in range(args.jobs // block):
            t0 = time.perf_counter()
            for _ in range(block):
                run(["sbatch", "--parsable", "--hold"], env, stdin=SCRIPT)
            bare_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(block):
                backend.submit(SCRIPT, "--hold")
            adapter_s += time.perf_counter() - t0
        n = (args.jobs // block) * block
        queued = len(backend.jobs())
        save(
            "submit_burst",
            {
                "nodes": args.nodes,
                "jobs_each": n,
                "bare_sbatch_submits_per_s": round(n / bare_s, 1),
                "adapter_submits_per_s": round(n / adapter_s, 1),
                "adapter_over_bare_time_ratio": round(adapter_s / bare_s, 3),
                "jobs_in_queue_after": queued,
            },
        )


if __name__ == "__main__":
    main()

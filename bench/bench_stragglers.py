"""Straggler detection inside the job (issue 16 item 1): time to flag a 1.3x slower rank, and false flags over a
healthy run with checkpoints, both on the dev cluster at the same time.

Two runs of the demo's job (``examples/train_ddp``: 2 nodes, DDP over gloo, 0.1 s of stand-in compute per step,
a checkpoint every ``--ckpt-interval`` seconds) through ``nuro-train submit``, side by side:

* ``slowed``: rank 1's stand-in compute is ``--slow-factor`` (1.3) times longer (``--slow-rank 1``): a throttled
  GPU that does not crash;
* ``healthy``: the same job, even ranks, for ``--healthy-minutes``.

From each run's own events (``nuro-train events``: ``first_step``, ``straggler``): the seconds from the first step
to the ``straggler`` event of the slowed run, and the number of ``straggler`` events of the healthy one (target 0).

    python -m bench.bench_stragglers [--healthy-minutes 10] [--slow-factor 1.3] [--ckpt-interval 20]

Benchmarks measure; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.common import cluster, save
from nuro.devcluster import scenario
from nuro.lifecycle import run_events
from nuro.objectstore import ObjectStore
from nuro.slurm import CliBackend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--healthy-minutes", type=float, default=10.0)
    p.add_argument("--slow-factor", type=float, default=1.3)
    p.add_argument("--ckpt-interval", type=int, default=20)
    p.add_argument("--port-base", type=int, default=26800)
    args = p.parse_args()
    with cluster(4, args.port_base, "stragglers") as (_layout, env, _up), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        dataset, repo = scenario.prepare(env, work)
        backend, store = CliBackend(env=env), ObjectStore.from_env(env)
        healthy_steps = int(args.healthy_minutes * 60 / 0.11)
        healthy = scenario.submit(env, work, dataset, repo, steps=healthy_steps, ckpt_interval_s=args.ckpt_interval,
                                  name="healthy")  # fmt: skip
        slow = ("--slow-rank", "1", "--slow-factor", str(args.slow_factor))
        slowed = scenario.submit(env, work, dataset, repo, steps=400, ckpt_interval_s=args.ckpt_interval,
                                 name="slowed", script_args=slow)  # fmt: skip
        out = {}
        for run in (slowed, healthy):
            info = backend.wait_for_job(run.job_id, timeout_s=args.healthy_minutes * 60 * 2 + 600)
            events = run_events.read(store, run.team, run.name, run.job_id)
            first = next((e.ts for e in events if e.kind == "first_step"), None)
            flags = [e for e in events if e.kind == "straggler"]
            out[run.name] = {
                "job": run.job_id, "state": info.state, "steps": healthy_steps if run is healthy else 400,
                "straggler_events": len(flags),
                "flags": [{"rank": e.fields.get("rank"), "slowdown": e.fields.get("slowdown"),
                           "after_first_step_s": round(e.ts - first, 1) if first else None} for e in flags],
            }  # fmt: skip
            print(out[run.name], flush=True)
    result = {"slow_factor": args.slow_factor, "healthy_minutes": args.healthy_minutes,
              "ckpt_interval_s": args.ckpt_interval, **out}  # fmt: skip
    save("stragglers", result)


if __name__ == "__main__":
    main()

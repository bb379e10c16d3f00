"""A 2-node job with one throttled node: left alone vs moved to a hot spare, the same job, in the same run.

The throttle is real: the second training node's job processes get a quarter of a CPU (a cgroup cpu quota,
``devcluster.cgroups.throttle_node``) from the moment its launcher starts, and the example's stand-in compute burns
a fixed amount of CPU per step (``--burn``), so that rank is ~4x slower and the whole synchronous job with it. Both
runs hold 2 nodes + 1 spare; only the mitigated one runs ``StragglerWatch`` with a ``MovePolicy``
(``--move-stragglers``): it flags the rank, decides by cost, checkpoints at one agreed step and goes on on the spare.
Runs alternate (one at a time: they would share the 2 cores otherwise). Measured from the first step to the end
(run events): wall time, steps per second, and the steps the left-alone run had done when the mitigated one ended.

    python -m bench.bench_straggler_move [--rounds 2] [--steps 400] [--port-base 29700]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import cluster, save
from nuro.devcluster import cgroups, scenario
from nuro.lifecycle import run_events
from nuro.objectstore import ObjectStore
from nuro.slurm import CliBackend, JobPhase

CPU_SHARE = 0.25
STEP_CPU_S = 0.03


def _round(layout, env: dict[str, str], work: Path, dataset: str, repo: Path, steps: int, move: bool) -> dict:
    backend = CliBackend(env=env)
    store = ObjectStore.from_env(env)
    args = ("--burn", "--move-stragglers") if move else ("--burn",)
    run = scenario.submit(env, work, dataset, repo, spare_nodes=1, steps=steps, step_time_s=STEP_CPU_S,
                          ckpt_interval_s=30, script_args=args)  # fmt: skip
    job = scenario.wait_for("the run to start", lambda: (j := backend.find_job(run.job_id))
                            and j.phase == JobPhase.RUNNING and len(j.nodes) == 3 and j, 180)  # fmt: skip
    slow = job.nodes[1]
    scenario.wait_for(f"job processes on {slow}", lambda: cgroups.throttle_node(layout.root, slow, CPU_SHARE), 60,
                      poll_s=0.05)  # fmt: skip
    final = backend.wait_for_job(run.job_id, timeout_s=900)
    time.sleep(2)  # the finished event is written on a thread
    events = run_events.read(store, run.team, run.name, run.job_id)
    first = min(e.ts for e in events if e.kind == "first_step")
    end = max(e.ts for e in events if e.kind == "finished")
    progress = sorted((e.ts - first, e.step) for e in events if e.kind == "progress" and e.step is not None)
    decision = next((e.fields for e in events if e.kind == "straggler_decision"), {})
    return {
        "mode": "mitigated" if move else "left_alone",
        "job": run.job_id,
        "state": final.state,
        "slow_node": slow,
        "wall_s": round(end - first, 2),
        "steps_per_s": round(steps / (end - first), 2),
        "progress": progress,
        "swaps": sum(e.kind == "spare_swap" for e in events),
        "decision": decision.get("why"),
    }


def _steps_by(progress: list, t: float) -> int:
    return max((s for ts, s in progress if ts <= t), default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per mode (they alternate)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--port-base", type=int, default=29700)
    args = ap.parse_args()
    rows: list[dict] = []
    with cluster(8, args.port_base, "straggler-move") as (layout, env, _up):
        work = Path(tempfile.mkdtemp(prefix="nuro-bench-move-", dir="/tmp"))
        work.chmod(0o755)
        dataset, repo = scenario.prepare(env, work)
        time.sleep(4)
        for i in range(2 * args.rounds):
            row = _round(layout, env, work, dataset, repo, args.steps, move=i % 2 == 1)
            rows.append(row)
            print({k: v for k, v in row.items() if k != "progress"}, flush=True)
    alone = [r for r in rows if r["mode"] == "left_alone"]
    moved = [r for r in rows if r["mode"] == "mitigated"]
    wall_alone = statistics.median(r["wall_s"] for r in alone)
    wall_moved = statistics.median(r["wall_s"] for r in moved)
    # the same wall time: the steps the left-alone run had done when the mitigated one finished
    alone_in_moved_time = statistics.median(_steps_by(r["progress"], wall_moved) for r in alone)
    save("straggler_move", {
        "steps": args.steps, "cpu_share_of_slow_node": CPU_SHARE, "step_cpu_s": STEP_CPU_S,
        "rounds": [{k: v for k, v in r.items() if k != "progress"} for r in rows],
        "p50_wall_s": {"left_alone": wall_alone, "mitigated": wall_moved},
        "throughput_mitigated_over_left_alone": round(wall_alone / wall_moved, 2),
        "steps_done_in_the_mitigated_wall_time": {"left_alone": alone_in_moved_time, "mitigated": args.steps},
    })  # fmt: skip


if __name__ == "__main__":
    main()

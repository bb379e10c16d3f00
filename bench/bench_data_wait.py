"""Data wait per training step of the example DDP job, read through the node cache vs one ranged GET per file, in the
same run (issue 15 item 5: the example job's data wait < 5 % of its step time).

Each round runs the demo's job (``examples/train_ddp``: 2 nodes, ``--steps``, ``--step-time`` seconds of stand-in
compute per step, batch 64 per rank, loader workers per ``--loader-workers``) through ``nuro-train submit`` on the dev
cluster, then reads what the job logged per step (``nuro-train metrics``' rows): ``data_wait_s`` (how long the step
waited for its batch) and the time between a rank's consecutive steps (its step time). Modes, alternating:

* ``cache``: the job's ``SnapshotLoader`` reads through the node's shard cache (``NURO_DATA_CACHE_DIR``, as shipped);
* ``get-per-file``: the same job with no cache dir in its environment: one ranged GET per file (the old path).

Reported per mode: data wait as a share of step time (median and p95 over every rank's steps after the first, and
the first step on its own), and seconds. The team's caches are emptied before every round.

    python -m bench.bench_data_wait [--rounds 2] [--steps 120] [--step-time 0.1] [--loader-workers 0]

Benchmarks measure; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from bench.common import cluster, save
from nuro.devcluster import scenario
from nuro.slurm import CliBackend, JobPhase

MODES = ("cache", "get-per-file")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _shares(history: list[dict]) -> dict:
    """Per rank, in step order: data_wait_s / (ts of this step − ts of the previous one)."""
    by_rank: dict[int, list[dict]] = {}
    for row in history:
        if "data_wait_s" in row and "step" in row:
            by_rank.setdefault(row["rank"], []).append(row)
    shares, waits, steps_s, first = [], [], [], []
    for rows in by_rank.values():
        rows.sort(key=lambda r: r["step"])
        first.append(float(rows[0]["data_wait_s"]))
        for prev, row in zip(rows, rows[1:], strict=False):
            dt = (row["ts_ns"] - prev["ts_ns"]) / 1e9
            if dt > 0:
                shares.append(float(row["data_wait_s"]) / dt)
                waits.append(float(row["data_wait_s"]))
                steps_s.append(dt)
    return {
        "steps": len(shares), "share_median": round(statistics.median(shares), 4),
        "share_p95": round(_pct(shares, 0.95), 4),
        "share_mean": round(sum(waits) / sum(steps_s), 4), "wait_median_s": round(statistics.median(waits), 4),
        "step_median_s": round(statistics.median(steps_s), 4), "first_step_wait_s": round(max(first), 3),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2, help="rounds per mode (alternating)")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--step-time", type=float, default=0.1, help="the example's stand-in compute per step [0.1]")
    p.add_argument("--loader-workers", type=int, default=0, help="DataLoader workers per rank [0, the example's]")
    p.add_argument("--port-base", type=int, default=31600)
    args = p.parse_args()
    with cluster(4, args.port_base, "data-wait") as (layout, env, _res):
        backend = CliBackend(env=env)
        rows = []
        with tempfile.TemporaryDirectory(prefix="nuro-data-wait-", dir="/tmp") as tmp:
            work = Path(tmp)
            dataset, repo = scenario.prepare(env, work)
            for _ in range(args.rounds):
                for mode in MODES:
                    shutil.rmtree(layout.datacache / "perception" / "sha256", ignore_errors=True)
                    job_env = (
                        dict(env) if mode == "cache" else {k: v for k, v in env.items() if k != "NURO_DATA_CACHE_DIR"}
                    )
                    run = scenario.submit(
                        job_env, work, dataset, repo, steps=args.steps, step_time_s=args.step_time, ckpt_interval_s=60,
                        script_args=("--loader-workers", str(args.loader_workers)),
                    )  # fmt: skip
                    info = backend.wait_for_job(run.job_id, timeout_s=900)
                    if info.phase is not JobPhase.COMPLETED:
                        raise RuntimeError(f"job {run.job_id} ended {info.phase.name}")
                    summary, _ = scenario.metrics_view(env, run.job_id, backend, plot=False)
                    rows.append({"mode": mode, "job": run.job_id, **_shares(summary["history"])})
                    print(json.dumps(rows[-1]), flush=True)
    result = {"steps": args.steps, "step_time_s": args.step_time, "loader_workers": args.loader_workers, "rounds": rows}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        result[mode] = {k: statistics.median(r[k] for r in mine) for k in mine[0] if k not in ("mode", "job")}
    result["wait_ratio_get_per_file_over_cache"] = round(
        result["get-per-file"]["wait_median_s"] / max(1e-9, result["cache"]["wait_median_s"]), 2
    )
    save("bench_data_wait", result)


if __name__ == "__main__":
    main()

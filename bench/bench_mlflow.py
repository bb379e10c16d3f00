"""MLflow as the tracking UI (issue 18): what mirroring costs the training, and how much the bridge sustains.

One MLflow 3.17 server of our own (SQLite, loopback, one worker, ``nuro.devcluster.tracking``) and one embedded
SQLite metrics sink; the real ``nuro.tracking.bridge.Bridge`` in its own process, fed 100 synthetic nuro jobs (their
records as Slurm would list them: a ``nuro`` comment, account = team) instead of Slurm's queue, so the load is the
issue's and nothing else runs.

- **load**: a generator process writes what 100 runs × 10 steps/s × 1 rank log through ``MetricsLogger`` (loss,
  step time, samples/s, one custom scalar: 4 values a point) into the sink, for ``--seconds``.
- **overhead** (baseline = MLflow off: no bridge): in this process one ``MetricsLogger.log`` loop of ``--calls`` calls
  into the same sink, timed while the load runs, with the bridge off and on, alternating ``--rounds`` times;
  ``overhead_on_over_off`` is the ratio of the median per-call times (target ≤ 1.2).
- **throughput**: with the bridge on, MLflow metric values written per second (the bridge's own count over the
  window), the points the generator wrote, and the bridge's lag at the end (how old the oldest run's newest mirrored
  point is). There are no drops to count: the bridge never discards a point, it falls behind (its cursor), and the
  points wait in the sink.

    python -m bench.bench_mlflow [--seconds 30] [--rounds 3] [--calls 20000] [--runs 100] [--rate 10]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import save

PORT = 9470


def _generator(db: str, runs: int, rate: float, seconds: float, written) -> None:  # noqa: ANN001
    """What ``runs`` runs log at ``rate`` steps/s each, in 100 ms batches, straight into the sink."""
    from nuro.metrics.model import TRAIN, Point
    from nuro.metrics.sqlite import SQLiteSink

    sink = SQLiteSink(db)
    step, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        now = time.time_ns()
        per_tick = rate / 10
        batch = [Point(TRAIN, {"team": "perception", "run": f"bench-{i}", "job": str(1000 + i), "rank": "0",
                               "restart": "0"},
                       {"step": step + k, "loss": 1.0 / (1 + step + k), "step_time_s": 0.1, "samples_per_s": 640.0,
                        "lr": 0.001}, now + k)  # fmt: skip
                 for i in range(runs) for k in range(int(per_tick))]  # fmt: skip
        sink.write(batch)
        written.value += len(batch)
        step += int(per_tick)
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t0) % 0.1))
    sink.close()


def _bridge(db: str, url: str, runs: int, stop, points, lag_ns) -> None:  # noqa: ANN001
    from nuro.devcluster.scenario import listed_jobs
    from nuro.metrics.sqlite import SQLiteSink
    from nuro.tracking.bridge import Bridge, sink_rows
    from nuro.tracking.mlflow import MlflowClient

    jobs = listed_jobs(runs)
    rows = sink_rows(lambda team: SQLiteSink(db))
    bridge = Bridge(MlflowClient(url, timeout_s=30), lambda: jobs, lambda ids: [], rows)
    while not stop.is_set():
        bridge.sync_once()
        points.value = bridge.stats.points
        lag_ns.value = min((st.cursor_ns for st in bridge.runs.values()), default=0)


def _pin(pid: int, cpus: set[int]) -> None:
    """``pid`` and its children onto ``cpus`` (the MLflow server's uvicorn worker too)."""
    import psutil

    proc = psutil.Process(pid)
    for p in [proc, *proc.children(recursive=True)]:
        p.cpu_affinity(sorted(cpus))


def _log_loop(db: str, calls: int) -> float:
    """Seconds per ``MetricsLogger.log`` call (median of 5 chunks) into the sink, as a training rank would."""
    from nuro.metrics.sqlite import SQLiteSink
    from nuro.wrappers.sdk.metrics import MetricsLogger
    from nuro.wrappers.sdk.runenv import RunEnv

    logger = MetricsLogger(SQLiteSink(db), env=RunEnv(team="perception", run_name="timed", job_id=999))
    chunks = []
    for c in range(5):
        t0 = time.perf_counter()
        for i in range(calls // 5):
            logger.log(c * calls + i, loss=0.5, samples=64, lr=0.001)
        chunks.append((time.perf_counter() - t0) / (calls // 5))
    logger.close()
    return statistics.median(chunks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each load window")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second per run")
    ap.add_argument("--no-isolate", dest="isolate", action="store_false",
                    help="share every core (default: the timed training loop has a core of its own, as a training "
                    "process has on its node while the bridge and MLflow run on the controller)")  # fmt: skip
    args = ap.parse_args()
    from nuro.devcluster.tracking import standalone_mlflow

    work = Path(tempfile.mkdtemp(prefix="nuro-bench-mlflow-"))
    ctx = mp.get_context("spawn")
    rows = []
    try:
        with standalone_mlflow(work / "mlflow", PORT) as server:
            cpus = sorted(os.sched_getaffinity(0))
            if args.isolate and len(cpus) >= 2:  # the training on its own core; load, bridge and server on the rest
                others = set(cpus[:-1])
                _pin(server.pid, others)
                os.sched_setaffinity(0, {cpus[-1]})
            for r in range(args.rounds):
                for on in (False, True):
                    db = str(work / f"m-{r}-{int(on)}.sqlite")
                    written, points, lag = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
                    stop = ctx.Event()
                    gen = ctx.Process(target=_generator, args=(db, args.runs, args.rate, args.seconds, written))
                    gen.start()
                    if args.isolate and len(cpus) >= 2:
                        os.sched_setaffinity(gen.pid, others)
                    time.sleep(1.0)  # the file exists
                    bridge_args = (db, server.url, args.runs, stop, points, lag)
                    br = ctx.Process(target=_bridge, args=bridge_args) if on else None
                    if br:
                        br.start()
                        if args.isolate and len(cpus) >= 2:
                            os.sched_setaffinity(br.pid, others)
                    t0 = time.monotonic()
                    per_call = _log_loop(db, args.calls)
                    gen.join()
                    window = time.monotonic() - t0
                    row = {"round": r, "bridge": on, "per_call_us": round(per_call * 1e6, 2), "written": written.value}
                    if br:
                        stop.set()
                        br.join(timeout=120)
                        row.update(mirrored_values=points.value, window_s=round(window, 1),
                                   values_per_s=round(points.value / window, 1),
                                   lag_s=round(time.time() - lag.value / 1e9, 1) if lag.value else None)  # fmt: skip
                    rows.append(row)
                    print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    off = statistics.median(r["per_call_us"] for r in rows if not r["bridge"])
    on = statistics.median(r["per_call_us"] for r in rows if r["bridge"])
    mirrored = [r for r in rows if r["bridge"]]
    result = {
        "runs": args.runs, "steps_per_s_per_run": args.rate, "seconds": args.seconds, "rounds": rows,
        "per_call_us_off": off, "per_call_us_on": on, "overhead_on_over_off": round(on / off, 3),
        "values_per_s_p50": statistics.median(r["values_per_s"] for r in mirrored),
        "points_offered_per_s": round(args.runs * args.rate, 1), "isolated_core": args.isolate,
    }  # fmt: skip
    save("mlflow", result)


if __name__ == "__main__":
    main()

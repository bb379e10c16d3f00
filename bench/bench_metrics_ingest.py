"""Metrics ingest: a 500-node × 8-GPU cluster at 1 Hz plus 100 runs logging 10 steps/s, into a local influxd 1.6.7.

Offered load per second: 4,000 ``gpu`` points (one per GPU, 6 fields) + 1,000 ``train`` points (100 runs × 10
steps, 4 fields) = 5,000 points/s, generated on a wall-clock schedule (1 Hz GPU ticks, 10 Hz train ticks) for
``--duration-s`` (default 60) per path. Both paths run in the same run against the same fresh influxd (ours, on
``--port``, data in a temp dir), each into its own database:

- nuro: ``BufferedWriter`` (defaults: batch 5,000, flush every 1 s, capacity 100,000) over ``InfluxV1Sink``; one
  writer for the GPU points and one for the train points (the node agents' and SDK's path, fanned in).
- baseline: raw line-protocol ``POST /write`` of the same points as they are produced, no buffer: one POST per
  node per GPU tick (8 points) and one per run step (1 point) — what a naive client does — from one thread.

Reported per path: points/s achieved vs offered (written ÷ time until the last point reached influxd), CPU of the
producing process (and of the writer threads alone, from /proc per-thread times) and of influxd in cores, drops,
``add()`` latency, and influxd's own ``count()`` of what it stored. Nothing asserts a speed.

    python -m bench.bench_metrics_ingest [--duration-s 60] [--nodes 500] [--runs 100] [--port 8950]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import psutil
import urllib3

from bench.common import save
from nuro.devcluster import tsdb
from nuro.metrics.buffer import BufferedWriter
from nuro.metrics.influx import InfluxV1Sink, line, quote_ident
from nuro.metrics.model import GPU, TRAIN, Point

GPUS = 8
STEPS_PER_S = 10


def gpu_points(nodes: int, ts_ns: int, tick: int) -> list[list[Point]]:
    """One tick of GPU telemetry: per node, its 8 GPUs' points."""
    out = []
    for n in range(nodes):
        node = f"gpu{n + 1:03d}"
        out.append([
            Point(GPU, {"node": node, "gpu": str(g), "uuid": f"GPU-{n:04d}-{g}", "model": "H100"},
                  {"util_pct": float((tick + g) % 100), "mem_used_bytes": 40 << 30, "mem_total_bytes": 80 << 30,
                   "temp_c": 60.0 + g, "sm_clock_mhz": 1980, "power_w": 550.5}, ts_ns + g)
            for g in range(GPUS)
        ])  # fmt: skip
    return out


def train_points(runs: int, ts_ns: int, step: int) -> list[Point]:
    return [
        Point(TRAIN, {"team": f"team{r % 5}", "run": f"run-{r:03d}", "job": str(1000 + r), "restart": "0",
                      "rank": "0"}, {"step": step, "loss": 1.0 / (step + 1), "step_time_s": 0.1,
                      "samples_per_s": 2560.0}, ts_ns)
        for r in range(runs)
    ]  # fmt: skip


def drive(
    duration_s: float,
    nodes: int,
    runs: int,
    emit_gpu: Callable[[list[Point]], None],
    emit_train: Callable[[Point], None],
) -> dict:
    """Produce the load on schedule for ``duration_s``. A slow emitter falls behind and is cut off at the end of
    the window, so ``produced`` < ``offered`` (the schedule's count) shows it could not keep up."""
    t0 = time.monotonic()
    produced = 0
    behind_max = 0.0
    ticks = int(duration_s * STEPS_PER_S)
    for k in range(ticks):
        due = t0 + k / STEPS_PER_S
        now = time.monotonic()
        if now >= t0 + duration_s:
            break
        if due > now:
            time.sleep(due - now)
        behind_max = max(behind_max, now - due)
        ts = time.time_ns()
        if k % STEPS_PER_S == 0:
            for node_pts in gpu_points(nodes, ts, k // STEPS_PER_S):
                emit_gpu(node_pts)
                produced += len(node_pts)
        for p in train_points(runs, ts, k):
            emit_train(p)
            produced += 1
    offered = ticks // STEPS_PER_S * nodes * GPUS + ticks * runs
    return {"offered": offered, "produced": produced, "produce_s": round(time.monotonic() - t0, 2),
            "max_behind_schedule_s": round(behind_max, 3)}  # fmt: skip


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def thread_cpu_s(native_ids: set[int]) -> float:
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in native_ids)


def count_in(url: str, db: str) -> dict[str, int]:
    out = {}
    for meas, fld in ((GPU, "util_pct"), (TRAIN, "step")):
        q = f"SELECT count({quote_ident(fld)}) FROM {quote_ident(meas)}"
        resp = urllib3.request("GET", f"{url}/query?" + urllib.parse.urlencode({"db": db, "q": q}), timeout=60)
        series = json.loads(resp.data)["results"][0].get("series") or []
        out[meas] = int(series[0]["values"][0][1]) if series else 0
    return out


def run_buffered(url: str, influxd: psutil.Process, args: argparse.Namespace) -> dict:
    db = "bench_buffered"
    tsdb.create_database(url, db)
    sink = InfluxV1Sink(url, db)
    gpu_w = BufferedWriter(sink, self_tags={"source": "agent", "node": "bench"})
    train_w = BufferedWriter(sink, self_tags={"source": "rank0", "run": "bench"})
    writer_ids = {gpu_w._thread.native_id, train_w._thread.native_id}
    lat: list[float] = []
    accepted = 0

    def add(w: BufferedWriter, p: Point) -> None:
        nonlocal accepted
        s = time.perf_counter()
        accepted += w.add(p)
        lat.append(time.perf_counter() - s)

    me = psutil.Process()
    c0, i0, w0, t0 = cpu_s(me), cpu_s(influxd), thread_cpu_s(writer_ids), time.monotonic()
    produced = drive(
        args.duration_s, args.nodes, args.runs,
        lambda pts: [add(gpu_w, p) for p in pts], lambda p: add(train_w, p),
    )  # fmt: skip
    flushed = gpu_w.flush(120) and train_w.flush(120)
    wall = time.monotonic() - t0
    c1, i1, w1 = cpu_s(me), cpu_s(influxd), thread_cpu_s(writer_ids)
    stats = [gpu_w.stats, train_w.stats]
    gpu_w.close()
    train_w.close()
    written = sum(s["written"] for s in stats)
    lat.sort()
    return {
        **produced,
        "accepted": accepted,
        "written": written,
        "dropped": sum(s["dropped"] for s in stats),
        "errors": sum(s["errors"] for s in stats),
        "retries": sum(s["retries"] for s in stats),
        "all_flushed": flushed,
        "wall_s": round(wall, 2),
        "points_per_s": round(written / wall),
        "offered_per_s": round(produced["offered"] / args.duration_s),
        "process_cpu_cores": round((c1 - c0) / wall, 3),
        "writer_threads_cpu_cores": round((w1 - w0) / wall, 3),
        "influxd_cpu_cores": round((i1 - i0) / wall, 3),
        "add_latency_us": {
            "p50": round(lat[len(lat) // 2] * 1e6, 1),
            "p99": round(lat[int(len(lat) * 0.99)] * 1e6, 1),
            "max": round(lat[-1] * 1e6, 1),
        },  # fmt: skip
        "influxd_count": count_in(url, db),
    }


def run_raw(url: str, influxd: psutil.Process, args: argparse.Namespace) -> dict:
    db = "bench_raw"
    tsdb.create_database(url, db)
    http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2.0, read=10.0))
    path = f"{url}/write?" + urllib.parse.urlencode({"db": db, "precision": "ns"})
    posts = errors = written = 0
    lat: list[float] = []

    def post(pts: list[Point]) -> None:
        nonlocal posts, errors, written
        s = time.perf_counter()
        resp = http.request("POST", path, body="\n".join(line(p) for p in pts).encode())
        lat.append(time.perf_counter() - s)
        posts += 1
        if resp.status == 204:
            written += len(pts)
        else:
            errors += len(pts)

    me = psutil.Process()
    c0, i0, t0 = cpu_s(me), cpu_s(influxd), time.monotonic()
    produced = drive(args.duration_s, args.nodes, args.runs, post, lambda p: post([p]))
    wall = time.monotonic() - t0
    c1, i1 = cpu_s(me), cpu_s(influxd)
    return {
        **produced,
        "posts": posts,
        "written": written,
        "errors": errors,
        "wall_s": round(wall, 2),
        "points_per_s": round(written / wall),
        "offered_per_s": round(produced["offered"] / args.duration_s),
        "process_cpu_cores": round((c1 - c0) / wall, 3),
        "influxd_cpu_cores": round((i1 - i0) / wall, 3),
        "post_latency_ms": {"p50": round(statistics.median(lat) * 1e3, 2), "max": round(max(lat) * 1e3, 2)},
        "influxd_count": count_in(url, db),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_metrics_ingest")
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--port", type=int, default=8950)
    args = parser.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="nuro-bench-influx-"))
    try:
        t_up = time.monotonic()
        with tsdb.standalone_influx(state, args.port) as server:
            up_s = time.monotonic() - t_up
            influxd = psutil.Process(server.pid)
            threading.current_thread().name = "bench-producer"
            raw = run_raw(server.url, influxd, args)
            buffered = run_buffered(server.url, influxd, args)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    offered = args.nodes * GPUS + args.runs * STEPS_PER_S
    result = {
        "machine": f"{psutil.cpu_count()} cores, shared",
        "server": "influxd 1.6.7 (Debian), inmem index, loopback",
        "influxd_start_s": round(up_s, 3),
        "load": {
            "nodes": args.nodes,
            "gpus_per_node": GPUS,
            "runs": args.runs,
            "steps_per_s": STEPS_PER_S,
            "offered_points_per_s": offered,
            "duration_s": args.duration_s,
        },  # fmt: skip
        "buffered": buffered,
        "raw_posts": raw,
        "ratio": {
            "achieved_buffered_over_raw": round(buffered["points_per_s"] / max(raw["points_per_s"], 1), 2),
            "influxd_cpu_raw_over_buffered": round(
                raw["influxd_cpu_cores"] / max(buffered["influxd_cpu_cores"], 1e-6), 2
            ),  # fmt: skip
            "client_cpu_raw_over_buffered": round(
                raw["process_cpu_cores"] / max(buffered["process_cpu_cores"], 1e-6), 2
            ),  # fmt: skip
        },
    }
    save("metrics_ingest", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Detection of a lost node that runs a multi-node job: heartbeats plus the job's in-band report vs heartbeats alone,
side by side in one run (issue 16 item 5; ``nuro.protocol.peerloss``).

Each round starts a 2-node gloo job through ``nuro-launch --launcher=direct`` (one rank per node, an all-reduce every
50 ms), waits until its ranks are in the loop, then crashes its second node like a host (``devcluster kill-node``)
and polls Slurm every ~0.1 s for the node going DOWN with nuro's reason. Modes alternate:

* ``inband``: as shipped: the surviving rank's gloo error reaches its launcher, which reports to its agent, which
  beats at once with ``suspect_jobs``; the controller judges the lost node on half the timeout;
* ``heartbeats``: the same job with ``NURO_AGENT_SOCKET_DIR`` pointing nowhere: no report, the plain timeout.

Per mode: kill → DOWN p50/p99 and how many losses the report decided (reason "… lost a peer"). Nodes rotate so none
is lost twice in 10 minutes (three losses would be flapping).

    python -m bench.bench_inband [--kills 20] [--nodes 24] [--port-base 26400]

Benchmarks measure; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_detection import _node_state, _pct, _wait
from bench.common import cluster, save
from nuro.devcluster import manager
from nuro.devcluster.layout import node_names
from nuro.protocol.heartbeat import DEFAULT_INTERVAL_S, DEFAULT_MISS_LIMIT
from nuro.slurm import CliBackend

MODES = ("inband", "heartbeats")
_WORKER = """
import os, time, torch, torch.distributed as dist
from datetime import timedelta
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
t = torch.ones(1024)
ready = False
while True:
    dist.all_reduce(t)
    if not ready and dist.get_rank() == 0:
        print("READY", flush=True)
        ready = True
    time.sleep(0.05)
"""


def _round(layout, env: dict, backend: CliBackend, work: Path, nodes: tuple[str, str], mode: str) -> dict:  # noqa: ANN001
    exclude = ",".join(n for n in node_names(len(backend.nodes())) if n not in nodes)
    out = work / f"{mode}-{time.monotonic_ns()}.out"
    step = (f"srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 {sys.executable} -m nuro.wrappers.launch "
            f"--launcher=direct --nproc-per-node=1 -- {work / 'worker.py'}")  # fmt: skip
    export = "ALL" if mode == "inband" else "ALL,NURO_AGENT_SOCKET_DIR=/nonexistent-nuro-bench"
    job_id = backend.submit(f"#!/bin/bash\n{step}\n", "-N2", f"--exclude={exclude}", "-o", str(out),
                            f"--export={export}")  # fmt: skip
    if not _wait(lambda: out.exists() and "READY" in out.read_text(errors="replace"), 90):
        backend.cancel(job_id)
        raise RuntimeError(f"job {job_id} never reached its all-reduce loop: {out.read_text()[-1500:]}")
    victim = sorted(backend.job_nodes(job_id))[-1]  # not the batch host: the step and the survivor's launcher live
    time.sleep(1.0)
    killed = manager.kill_node(layout, victim)
    detect, reason = None, ""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state, why = _node_state(env, victim)
        if "DOWN" in state and why.startswith("nuro:"):
            detect, reason = time.time() - killed["at"], why
            break
        time.sleep(0.05)
    backend.cancel(job_id)
    manager.revive_node(layout, victim)
    _wait(lambda: _node_state(env, victim)[0] == "IDLE", 60, 0.2)
    return {"mode": mode, "job": job_id, "node": victim, "detect_s": None if detect is None else round(detect, 2),
            "by_report": "lost a peer" in reason, "reason": reason[:160]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="kills per mode")
    ap.add_argument("--nodes", type=int, default=24)
    ap.add_argument("--port-base", type=int, default=26400)
    args = ap.parse_args()
    rows: list[dict] = []
    with cluster(args.nodes, args.port_base, "inband") as (layout, env, _up), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        (work / "worker.py").write_text(_WORKER)
        backend = CliBackend(env=env)
        names = node_names(args.nodes)
        time.sleep(4)  # the controller's restart grace
        for i in range(args.kills):
            for m, mode in enumerate(MODES):
                j = (2 * i + m) % (len(names) - 1)  # the victim is the pair's second: each node at most twice
                pair = (names[j], names[j + 1])
                rows.append(_round(layout, env, backend, work, pair, mode))
                print(rows[-1], flush=True)
    summary: dict = {
        "nodes": args.nodes,
        "heartbeat": {"interval_s": DEFAULT_INTERVAL_S, "miss_limit": DEFAULT_MISS_LIMIT},
    }
    for mode in MODES:
        xs = [r["detect_s"] for r in rows if r["mode"] == mode and r["detect_s"] is not None]
        summary[mode] = {"kills": len(xs), "p50": _pct(xs, 0.5), "p99": _pct(xs, 0.99), "max": max(xs, default=None),
                         "mean": round(statistics.mean(xs), 3) if xs else None,
                         "decided_by_report": sum(1 for r in rows if r["mode"] == mode and r["by_report"])}  # fmt: skip
    if summary["inband"]["p50"] and summary["heartbeats"]["p50"]:
        summary["p50_heartbeats_over_inband"] = round(summary["heartbeats"]["p50"] / summary["inband"]["p50"], 2)
        summary["p99_heartbeats_over_inband"] = round(summary["heartbeats"]["p99"] / summary["inband"]["p99"], 2)
    summary["rows"] = rows
    save("inband_detection", summary)


if __name__ == "__main__":
    main()

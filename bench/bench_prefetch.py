"""Start-up of a job reading a pinned snapshot: from the prolog's start to the first batch, with the prolog's prefetch
of the run's first shards (``nuro.datasets.prefetch``) vs without it, side by side in one run (issue 15 item 3).

Each round one 2-node job of a team member (alice, account perception) pins the multi-camera set of
``bench_data_loader`` (``--frames`` timestamps of 6 frames, 64 MiB shards) with a data seed; on each node one rank
does what a training process does first: imports torch, opens the snapshot (``SnapshotDataset``) and its loader
(``SnapshotLoader``, ``--workers`` DataLoader workers, ``--batch`` samples per rank) and takes the first batch. The
team's node caches are emptied before every round, so each round starts cold, as a job on fresh nodes does. The
prefetch is switched by rewriting ``NURO_DATA_PREFETCH_SHARDS`` in the cluster's node env file (the prolog reads it
on every run): ``prefetch`` = 4 shards (the default: one shuffle window), ``none`` = 0. Modes alternate.

Per round and node: seconds from the prolog's start (its hook-log line: end time − its own duration) to the first
batch, split into the prolog, the process start + torch import, the snapshot and loader set-up, and the first batch
itself (the data wait); plus what the prefetch did (shards, seconds, from its report). The job's figure is its
slower node (a step needs every rank).

    python -m bench.bench_prefetch [--rounds 3] [--frames 200] [--workers 2] [--batch 8] [--port-base 31200]

Benchmarks measure; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from bench.bench_data_loader import GROUP, make_set
from bench.common import REPO, cluster, save
from nuro.datasets.snapshot import snapshot
from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment
from nuro.slurm import CliBackend, JobPhase

USER, TEAM = "alice", "perception"
SEED = 5
MODES = {"prefetch": 4, "none": 0}

_WORKER = r"""
import json, os, sys, time
t_start = time.time()
import torch
t_import = time.time()
from nuro.wrappers.sdk.data import SnapshotDataset, SnapshotLoader
batch, workers = int(sys.argv[1]), int(sys.argv[2])
ds = SnapshotDataset(samples=sys.argv[3])
loader = SnapshotLoader(ds, batch, rank=int(os.environ["SLURM_PROCID"]), world_size=int(os.environ["SLURM_NTASKS"]),
                        num_workers=workers)
t_ready = time.time()
first = next(iter(loader))
t_first = time.time()
node = os.environ["SLURMD_NODENAME"]
report = os.path.join(os.environ["NURO_STAGING_ROOT"].replace("{node}", node), os.environ["SLURM_JOB_ID"],
                      "prefetch.json")
deadline = time.time() + (30 if sys.argv[4] == "prefetch" else 0)
while not os.path.exists(report) and time.time() < deadline:
    time.sleep(0.2)
got = json.load(open(report)) if os.path.exists(report) else None
print("RESULT " + json.dumps({"node": node, "t_start": t_start, "t_import": t_import, "t_ready": t_ready,
                              "t_first": t_first, "samples": len(first), "prefetch": got}), flush=True)
"""


def _set_prefetch(env_file: Path, shards: int) -> None:
    lines = [ln for ln in env_file.read_text().splitlines() if not ln.startswith("NURO_DATA_PREFETCH_SHARDS=")]
    env_file.write_text("\n".join([*lines, f"NURO_DATA_PREFETCH_SHARDS={shards}"]) + "\n")


def _prolog_start(hooks: Path, job: int) -> float:
    """When the prolog of ``job`` began on this node: its "prolog done in X s" line's time − X."""
    needle = f" nuro-prolog INFO job={job} prolog done in "
    for line in hooks.read_text().splitlines():
        if needle in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, like time.time()
            return stamp - float(line.split(needle, 1)[1].split()[0])
    raise RuntimeError(f"no prolog line for job {job} in {hooks}")


def _round(backend: CliBackend, layout, env: dict, work: Path, pin: tuple[str, str], mode: str, args) -> dict:  # noqa: ANN001
    shutil.rmtree(layout.datacache / TEAM / "sha256", ignore_errors=True)  # cold: fresh nodes for every round
    _set_prefetch(layout.nuro_env, MODES[mode])
    meta = {"v": 1, "team": TEAM, "dataset": {"name": pin[0], "digest": pin[1]}, "data": {"seed": SEED}}
    out = work / f"{mode}-{time.monotonic_ns()}.out"
    worker = work / "worker.py"
    worker.write_text(_WORKER)
    step = f"srun --ntasks-per-node=1 {sys.executable} {worker} {args.batch} {args.workers} '{GROUP}' {mode}"
    script = f"#!/bin/bash\n{step}\n"
    job_env = {**env, "NURO_DATASET": pin[0], "NURO_DATASET_DIGEST": pin[1], "NURO_DATA_SEED": str(SEED)}
    argv = ["runuser", "-u", USER, "--", "env", *(f"{k}={v}" for k, v in job_env.items()), "sbatch", "--parsable",
            "--nodes=2", "--account", TEAM, "--time", "10", "-o", str(out),
            f"--comment={jobcomment.merge(None, nuro=meta)}"]  # fmt: skip
    res = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"sbatch as {USER} failed: {res.stderr.strip()}")
    job = int(res.stdout)
    info = backend.wait_for_job(job, timeout_s=600)
    text = out.read_text() if out.exists() else ""
    if info.phase is not JobPhase.COMPLETED:
        raise RuntimeError(f"job {job} ended {info.phase.name}: {text[-2000:]}")
    nodes = []
    for line in text.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            t0 = _prolog_start(layout.log / f"hooks-{r['node']}.log", job)
            pre = r["prefetch"] or {}
            nodes.append({
                "node": r["node"], "to_first_batch_s": round(r["t_first"] - t0, 2),
                "prolog_and_launch_s": round(r["t_start"] - t0, 2),
                "torch_import_s": round(r["t_import"] - r["t_start"], 2),
                "setup_s": round(r["t_ready"] - r["t_import"], 2),
                "first_batch_wait_s": round(r["t_first"] - r["t_ready"], 2),
                "prefetched_shards": len(pre.get("shards", [])), "prefetch_s": pre.get("seconds"),
                "prefetch_error": pre.get("error"),
            })  # fmt: skip
    return {"mode": mode, "job": job, "to_first_batch_s": max(n["to_first_batch_s"] for n in nodes), "nodes": nodes}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds per mode (alternating)")
    p.add_argument("--frames", type=int, default=200, help="timestamps in the set (6 frames + labels each)")
    p.add_argument("--frame-kib", type=int, default=1536)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--batch", type=int, default=8, help="samples per rank per step")
    p.add_argument("--port-base", type=int, default=31200)
    args = p.parse_args()
    ensure_unix_users(POLICY_USERS)
    tree = make_set(args.frames, args.frame_kib)
    with cluster(4, args.port_base, "prefetch") as (layout, env, _res):
        admin = Path(sys.executable).parent / "nuro-admin"  # the teams' accounts and associations
        subprocess.run([str(admin), "policy", "apply", str(REPO / "examples" / "policy" / "teams.yaml")],
                       env={**os.environ, **env}, check=True, capture_output=True)  # fmt: skip
        (layout.etc / "nuro_policy.lua").unlink(missing_ok=True)  # bridge in pass-through: a hand-made record
        snap = snapshot(ObjectStore.from_env(env), tree, "bench-multicam", target_bytes=64 << 20, samples=GROUP)
        backend = CliBackend(env=env)
        rows = []
        with tempfile.TemporaryDirectory(prefix="nuro-prefetch-", dir="/tmp") as tmp:
            work = Path(tmp)
            work.chmod(0o777)
            # the first job of a pin verifies the whole snapshot in the prolog (once per node, then remembered):
            # a warm-up job pays that, so every measured round compares the same prolog
            print("warm-up:", json.dumps(_round(backend, layout, env, work, (snap.name, snap.digest), "none", args)))
            for _ in range(args.rounds):
                for mode in MODES:
                    rows.append(_round(backend, layout, env, work, (snap.name, snap.digest), mode, args))
                    print(json.dumps(rows[-1]), flush=True)
        med = {m: statistics.median(r["to_first_batch_s"] for r in rows if r["mode"] == m) for m in MODES}
        wait = {m: statistics.median(n["first_batch_wait_s"] for r in rows if r["mode"] == m for n in r["nodes"])
                for m in MODES}  # fmt: skip
        summary = {
            "frames": args.frames, "shards": snap.shards, "bytes": snap.total_bytes, "workers": args.workers,
            "batch": args.batch, "rounds": rows, "to_first_batch_s": med, "first_batch_wait_s": wait,
            "ratio_none_over_prefetch": round(med["none"] / med["prefetch"], 2),
        }  # fmt: skip
    save("bench_prefetch", summary)


if __name__ == "__main__":
    main()

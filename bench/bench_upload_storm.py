"""Many nodes committing checkpoints at once: do they stall the store or each other? (issue 15 item 6)

``--nodes`` (8) emulated nodes, each with its own staging root and one staged step of ``--mib`` (128) MiB (written
through the SDK with ``upload="agent"``, so only the upload request waits). Each node's uploads run in their own
process, as each node's agent does (``UploadWorker``, one pass until committed). Modes, same bytes, same SeaweedFS,
one run:

* ``one_after_another``: the nodes commit in turn (the baseline: no contention at all);
* ``all_at_once``: every node starts together (the "storm": 8 × ``max_concurrency`` parts in flight);
* ``all_at_once_capped``: the same with ``NURO_S3_MAX_UPLOAD_MIBPS`` = ``--cap-mibps`` per node (the per-node
  bandwidth bound) and ``NURO_S3_UPLOAD_CONCURRENCY`` = ``--cap-concurrency`` parts in flight per node.

Reported per mode: wall time until every node committed, aggregate MiB/s, and each node's own commit time (p50,
max): a storm that stalls shows as a max far above the p50, or an aggregate below the baseline's.

    python -m bench.bench_upload_storm [--nodes 8] [--mib 128] [--cap-mibps 20] [--cap-concurrency 2] [--port-base 8800]

Benchmarks measure; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import shutil
import statistics
import time
import uuid
from pathlib import Path

import torch

from bench.common import REPO, save
from nuro.checkpoint.upload import UploadWorker
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.objectstore import ObjectStore
from nuro.wrappers.sdk.checkpointer import Checkpointer
from nuro.wrappers.sdk.runenv import RunEnv

MiB = 1 << 20
TEAM = "bench"


def _stage(plan: PortPlan, root: Path, job: int, run: str, mib: int) -> None:
    job_dir = root / str(job)
    ck = Checkpointer(team=TEAM, run=run, store=s3.dev_store(plan), staging_dir=job_dir, upload="agent",
                      env=RunEnv(job_id=job))  # fmt: skip
    ck.save({"w": torch.rand(mib * MiB // 4)}, 1, sync=True)
    ck.close(timeout_s=1)


def _commit(plan_base: int, job_dir: str, caps: dict[str, str], start_at: float, out: mp.Queue) -> None:
    """One node's upload worker: wait for the common start, one pass per second until nothing is pending."""
    store = ObjectStore.from_env({**s3.s3_env(PortPlan(plan_base)), **caps})
    worker = UploadWorker(store, Path(job_dir).parent, job_dirs=[Path(job_dir)], trust="request")
    time.sleep(max(0.0, start_at - time.time()))
    t0 = time.time()
    while worker.pending(Path(job_dir).name):
        worker.run_once()
        if worker.pending(Path(job_dir).name):
            time.sleep(0.1)
    out.put((job_dir, t0, time.time()))


def _mode(base: int, work: Path, nodes: int, mib: int, together: bool, caps: dict[str, str]) -> dict:
    plan = PortPlan(base)
    jobs = []
    for n in range(nodes):
        root = work / f"node{n}" / "staging"
        job = 5000 + n
        _stage(plan, root, job, f"storm-{uuid.uuid4().hex[:8]}", mib)
        jobs.append(str(root / str(job)))
    ctx = mp.get_context("fork")
    out: mp.Queue = ctx.Queue()
    t_all = 0.0
    if together:
        start_at = time.time() + 1.0
        procs = [ctx.Process(target=_commit, args=(base, j, caps, start_at, out)) for j in jobs]
        for p in procs:
            p.start()
        results = [out.get(timeout=1800) for _ in procs]
        for p in procs:
            p.join()
        t_all = start_at
    else:
        results = []
        for j in jobs:
            p = ctx.Process(target=_commit, args=(base, j, caps, time.time(), out))
            p.start()
            results.append(out.get(timeout=1800))
            p.join()
    times = [r[2] - r[1] for r in results]
    # one after another: the sum of the nodes' own commit times (each child's start-up is not the store's time)
    wall = max(r[2] for r in results) - t_all if together else sum(times)
    shutil.rmtree(work, ignore_errors=True)
    return {"wall_s": round(wall, 2), "aggregate_mib_per_s": round(nodes * mib / wall, 1),
            "per_node_commit_s_p50": round(statistics.median(times), 2),
            "per_node_commit_s_max": round(max(times), 2)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--cap-mibps", type=float, default=20.0)
    ap.add_argument("--cap-concurrency", type=int, default=2)
    ap.add_argument("--port-base", type=int, default=8800)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/nuro-bench-storm"))
    args = ap.parse_args()
    state = REPO / f".devcluster-bench-storm-{args.port_base}"
    shutil.rmtree(state, ignore_errors=True)
    result: dict = {"nodes": args.nodes, "mib_per_node": args.mib, "cap_mibps": args.cap_mibps,
                    "cap_concurrency": args.cap_concurrency}  # fmt: skip
    caps = {"NURO_S3_MAX_UPLOAD_MIBPS": str(args.cap_mibps), "NURO_S3_UPLOAD_CONCURRENCY": str(args.cap_concurrency)}
    with s3.standalone(state, args.port_base):
        for name, together, mode_caps in (("one_after_another", False, {}), ("all_at_once", True, {}),
                                          ("all_at_once_capped", True, caps)):  # fmt: skip
            result[name] = _mode(args.port_base, args.work_dir / name, args.nodes, args.mib, together, mode_caps)
            print(name, result[name], flush=True)
    shutil.rmtree(state, ignore_errors=True)
    base = result["one_after_another"]["aggregate_mib_per_s"]
    result["all_at_once_over_one_after_another"] = round(result["all_at_once"]["aggregate_mib_per_s"] / base, 2)
    save("bench_upload_storm", result)


if __name__ == "__main__":
    main()

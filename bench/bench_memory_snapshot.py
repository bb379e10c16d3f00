"""In-memory snapshots: what one costs the training (stall), how long until it is replicated, what memory it holds.

Two gloo ranks on this machine, each its own "node" (its own staging and snapshot dirs, the snapshot dirs on tmpfs
``/dev/shm`` as on a real node), each holding ``--tensors`` float32 tensors of ``--tensor-mib`` MiB of its own (a
ZeRO/FSDP-like shard: every node's share is as big as the state it holds). Measured in one run, per rank:

- baseline ``warm_copy_s``: copying the state into buffers already allocated (the least any save can block);
- ``save_stall_s``: what ``Checkpointer.save`` blocks (the persistent, async save to the staging dir: "as now");
- ``snapshot_stall_s``: what ``Checkpointer.snapshot`` blocks (``maybe_save`` when a snapshot is due), each one
  taken after the previous one finished (the interval longer than a replication, as it must be set);
- ``replicated_s``: from the snapshot's start until this node holds its share and its neighbour's, and both are
  promotable (requests written): the age of the newest complete copy right after a snapshot is taken;
- ``held_bytes`` over ``state_bytes``: the memory snapshots hold on the node (its share and its neighbour's).

Target (issue 31): the worst snapshot stall ≤ 2× the warm copy. Benchmarks measure; nothing asserts a speed.

    python -m bench.bench_memory_snapshot [--tensors 4] [--tensor-mib 64] [--snapshots 5] [--port-base 8900]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import time
import uuid
from pathlib import Path

from bench.common import REPO, save

MiB = 1024 * 1024


def _worker(rank: int, args: argparse.Namespace, port: int, run: str, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank), GLOO_SOCKET_IFNAME="lo",
                      SLURMD_NODENAME=f"node{rank}", NURO_SNAPSHOT_DIR=str(args.shm / f"node{rank}" / "1"))  # fmt: skip
    import torch
    import torch.distributed as dist

    from nuro.devcluster import s3
    from nuro.devcluster.layout import PortPlan
    from nuro.wrappers.sdk.checkpointer import Checkpointer
    from nuro.wrappers.sdk.runenv import RunEnv

    dist.init_process_group("gloo")
    numel = args.tensor_mib * MiB // 4
    state = {f"r{rank}.w{i}": torch.rand(numel) for i in range(args.tensors)}
    bufs = {k: torch.empty_like(v) for k, v in state.items()}
    for k, v in state.items():
        bufs[k].copy_(v)
    t0 = time.perf_counter()
    for k, v in state.items():
        bufs[k].copy_(v)
    warm = time.perf_counter() - t0
    del bufs
    ck = Checkpointer(team="bench", run=run, store=s3.dev_store(PortPlan(args.port_base)), upload="agent",
                      staging_dir=args.work / f"node{rank}" / "1", interval_s=3600, snapshot_interval_s=3600,
                      env=RunEnv.from_env())  # fmt: skip
    assert ck.restore(state) is None
    time.sleep(1)  # the rest of a start-up: the pre-staged buffers are ready, as in a run
    t0 = time.perf_counter()
    ck.save(state, 1)
    save_stall = time.perf_counter() - t0
    ck.flush()
    stalls = []
    for n in range(args.snapshots):
        for v in state.values():
            v.add_(1)  # the training moves on
        t0 = time.perf_counter()
        ck.snapshot(state, 2 + n)
        stalls.append(time.perf_counter() - t0)
        ck.flush()  # the previous snapshot is replicated before the next one is due
    replicated = [ck.snapshot_timings[2 + n]["replicated_s"] for n in range(args.snapshots)]
    out[rank] = {"warm_copy_s": warm, "save_stall_s": save_stall, "snapshot_stalls_s": stalls,
                 "replicated_s": replicated, "held_bytes": ck.snapshot_bytes,
                 "state_bytes": sum(t.numel() * t.element_size() for t in state.values())}  # fmt: skip
    ck.close()
    dist.destroy_process_group()


def _spawn(rank: int, args: argparse.Namespace, port: int, run: str, results: dict) -> None:
    out: dict = {}
    _worker(rank, args, port, run, out)
    results[rank] = out[rank]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=4)
    ap.add_argument("--tensor-mib", type=int, default=64)
    ap.add_argument("--snapshots", type=int, default=5)
    ap.add_argument("--port-base", type=int, default=8900)
    ap.add_argument("--work", type=Path, default=Path("/var/tmp/nuro-bench-snapshot"))
    ap.add_argument("--shm", type=Path, default=Path("/dev/shm/nuro-bench-snapshot"))
    args = ap.parse_args()

    import torch.multiprocessing as mp  # lazy: torch takes seconds to import

    from nuro.devcluster import s3

    for d in (args.work, args.shm):
        shutil.rmtree(d, ignore_errors=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state_dir = REPO / f".devcluster-test-{args.port_base}-bench-snap"
    shutil.rmtree(state_dir, ignore_errors=True)
    try:
        with s3.standalone(state_dir, args.port_base):
            manager = mp.Manager()
            results = manager.dict()
            mp.spawn(_spawn, args=(args, port, f"snap-{uuid.uuid4().hex[:6]}", results), nprocs=2, join=True)
            rows = dict(results)
    finally:
        for d in (args.work, args.shm, state_dir):
            shutil.rmtree(d, ignore_errors=True)
    summary = {}
    for rank, r in sorted(rows.items()):
        stalls, repl = r["snapshot_stalls_s"], r["replicated_s"]
        summary[f"rank{rank}"] = {
            "state_mib": round(r["state_bytes"] / MiB, 1),
            "warm_copy_s": round(r["warm_copy_s"], 3),
            "save_stall_s": round(r["save_stall_s"], 3),
            "snapshot_stall_p50_s": round(statistics.median(stalls), 3),
            "snapshot_stall_worst_s": round(max(stalls), 3),
            "worst_snapshot_stall_over_warm_copy": round(max(stalls) / r["warm_copy_s"], 2),
            "replicated_p50_s": round(statistics.median(repl), 3),
            "replicated_worst_s": round(max(repl), 3),
            "held_over_state": round(r["held_bytes"] / r["state_bytes"], 2),
        }
    save("memory_snapshot", {"tensors": args.tensors, "tensor_mib": args.tensor_mib, **summary})


if __name__ == "__main__":
    main()

"""Checkpoint stall: how long training blocks for a 1 GiB checkpoint, and how long until it is durable and committed.

State: ``--tensors`` (8) float32 tensors of ``--tensor-mib`` (128) MiB = 1 GiB, one process, CPU. Measured in one
run, same machine, same state (the same experiment without nuro, measured on this machine: clone 1.68 s, dcp.save
4.71 s, async_save blocks 1.60 s):

- baseline ``clone_s``: copying the state in memory (``{k: v.clone()}``) — the least any async scheme must block;
- ``sync_save_s``: plain ``dcp.save`` to local disk (what a synchronous checkpoint blocks);
- ``bare_async_stall_s``: plain ``dcp.async_save`` (returns after staging to memory);
- baseline ``warm_copy_s``: copying the state into buffers already allocated (the least a save can block);
- nuro ``Checkpointer.save`` after ``restore`` (as a run starts), saves 1, 2, 3: ``stall_per_save_s`` (what each
  ``save`` blocks; ``stall_s`` is the first), and for the last save ``durable_local_s`` (DCP finished and fsynced on
  the staging dir), ``requested_s`` (files hashed, upload request written), ``committed_s`` (manifest in S3, from
  the start of ``save``; inline upload worker, SeaweedFS ``weed mini`` on loopback).

Baseline for the commit: the same step's files uploaded by plain boto3 ``upload_file`` (multipart, its defaults)
into the same bucket, ``boto3_upload_mib_per_s``; ``upload_over_boto3`` is nuro's commit rate over it (issue 15
item 6 asks ≥ 0.9).

Ratios: ``async_stall_over_clone`` (target ≤ 1.5: the stall is only the in-memory copy) and ``sync_over_async``.
Benchmarks measure; nothing asserts a speed.

    python -m bench.bench_checkpoint_stall [--tensors 8] [--tensor-mib 128] [--port-base 8800]
"""

from __future__ import annotations

import argparse
import gc
import shutil
import time
import uuid
from pathlib import Path

from bench.common import REPO, save
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.wrappers.sdk.checkpointer import Checkpointer

MiB = 1024 * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensors", type=int, default=8)
    ap.add_argument("--tensor-mib", type=int, default=128)
    ap.add_argument("--port-base", type=int, default=8800)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/nuro-bench-ckpt"))
    args = ap.parse_args()

    # lazy: torch takes seconds to import; --help and a bad argument answer without it
    import torch
    import torch.distributed.checkpoint as dcp

    work = args.work_dir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    numel = args.tensor_mib * MiB // 4
    state = {f"w{i}": torch.rand(numel) for i in range(args.tensors)}
    total = sum(t.numel() * t.element_size() for t in state.values())

    t0 = time.perf_counter()
    copy = {k: v.clone() for k, v in state.items()}
    clone_s = time.perf_counter() - t0
    del copy
    gc.collect()
    bufs = {k: torch.empty_like(v) for k, v in state.items()}
    for k, v in state.items():
        bufs[k].copy_(v)
    t0 = time.perf_counter()
    for k, v in state.items():  # the least a save can block: one copy into memory already allocated and faulted in
        bufs[k].copy_(v)
    warm_copy_s = time.perf_counter() - t0
    del bufs
    gc.collect()

    t0 = time.perf_counter()
    dcp.save(state, checkpoint_id=str(work / "sync"), no_dist=True)
    sync_s = time.perf_counter() - t0
    shutil.rmtree(work / "sync")

    t0 = time.perf_counter()
    fut = dcp.async_save(state, checkpoint_id=str(work / "bare-async"), no_dist=True)
    bare_stall_s = time.perf_counter() - t0
    fut.result()
    bare_durable_s = time.perf_counter() - t0
    shutil.rmtree(work / "bare-async")
    gc.collect()

    state_dir = REPO / f".devcluster-test-{args.port_base}-bench"
    shutil.rmtree(state_dir, ignore_errors=True)
    try:
        with s3.standalone(state_dir, args.port_base):
            store = s3.dev_store(PortPlan(args.port_base))
            ck = Checkpointer(
                team="bench", run=f"stall-{uuid.uuid4().hex[:6]}", store=store, staging_dir=work / "job" / "1",
                upload="inline",
            )  # fmt: skip
            assert ck.restore(state) is None  # what a run does first; a new run has nothing to load
            time.sleep(2)  # the rest of a training start-up
            stalls = []
            for step in (1, 2, 3):  # every save, the first included (issue 15 item 6)
                t0 = time.perf_counter()
                ck.save(state, step)
                stalls.append(time.perf_counter() - t0)
                committed = ck.wait_committed(step, 600)
                committed_s = time.perf_counter() - t0
                for v in state.values():
                    v.add_(1)  # the training moves on
            stall_s, timing = stalls[0], ck.timings[3]
            ck.close()
            # baseline in the same run: the same files of the last step, uploaded by plain boto3 multipart
            # (upload_file, its default TransferConfig: 8 MiB parts, 10 threads), no hashing, no manifest
            files = [f for f in ck.step_dir(3).rglob("*") if f.is_file() and not f.name.startswith(".")]
            t0 = time.perf_counter()
            for f in files:
                store.client.upload_file(str(f), store.bucket, f"bench-boto3/{uuid.uuid4().hex}/{f.name}")
            boto3_s = time.perf_counter() - t0
            boto3_bytes = sum(f.stat().st_size for f in files)
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)

    save(
        "checkpoint_stall",
        {
            "state_bytes": total,
            "tensors": args.tensors,
            "clone_s": round(clone_s, 3),
            "sync_save_s": round(sync_s, 3),
            "bare_async_stall_s": round(bare_stall_s, 3),
            "bare_async_durable_s": round(bare_durable_s, 3),
            "warm_copy_s": round(warm_copy_s, 3),
            "stall_s": round(stall_s, 3),
            "stall_per_save_s": [round(x, 3) for x in stalls],
            "worst_stall_over_warm_copy": round(max(stalls) / warm_copy_s, 2),
            "durable_local_s": round(timing.get("durable_s", float("nan")), 3),
            "requested_s": round(timing.get("requested_s", float("nan")), 3),
            "committed_s": round(committed_s, 3),
            "committed": committed,
            "async_stall_over_clone": round(stall_s / clone_s, 2),
            "sync_over_async": round(sync_s / stall_s, 2),
            "upload_mib_per_s": round(total / MiB / max(1e-9, committed_s - timing.get("requested_s", 0.0)), 1),
            "boto3_upload_mib_per_s": round(boto3_bytes / MiB / boto3_s, 1),
            "upload_over_boto3": round(
                (total / MiB / max(1e-9, committed_s - timing.get("requested_s", 0.0))) / (boto3_bytes / MiB / boto3_s),
                2,
            ),
        },
    )


if __name__ == "__main__":
    main()

"""Feeding workers from a pinned snapshot: nuro's SnapshotLoader (node shard cache, block shuffle) vs today's path
(``PinnedDataset.read``: one ranged GET per file) in the same run, against the same fresh SeaweedFS.

The set: ``--frames`` timestamps of 6 camera frames of ``--frame-kib`` KiB plus a small label file each (a sample =
one timestamp's 7 files), pseudo-random bytes made deterministically, snapshotted into 64 MiB shards. Both paths read
it as ``--nodes`` emulated nodes (one process each, its own node cache for nuro) x ``--workers`` DataLoader workers,
in a random order, ``--epochs`` epochs, batch ``--batch`` samples per node:

- nuro: ``SnapshotLoader`` over ``SnapshotDataset`` (shards fetched once per node, local preads, sha256 per file);
- baseline: torch ``DistributedSampler`` (shuffle, per epoch) over a dataset whose item is 7 ``PinnedDataset.read``
  calls (one ranged GET each, sha256 per file).

Reported per path: samples/s (all nodes together, per epoch), S3 bytes read per epoch (nuro: shard bytes fetched;
baseline: file bytes fetched), and the startup (process start to first batch). Nothing asserts a speed.

    python -m bench.bench_data_loader [--frames 400] [--frame-kib 1536] [--nodes 2] [--workers 4] [--epochs 2]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench.common import REPO, save
from nuro.datasets.snapshot import snapshot
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan

MiB = 1024 * 1024
CAMERAS = ("front", "front_left", "front_right", "back_left", "back_right", "back")
GROUP = r"^(\d+)/"


def make_set(frames: int, frame_kib: int) -> Path:
    root = Path(f"/tmp/nuro-bench-multicam-{frames}x{frame_kib}k")
    marker = root.with_name(root.name + ".complete")
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    for f in range(frames):
        d = root / f"{f:06d}"
        d.mkdir(parents=True)
        for c, cam in enumerate(CAMERAS):
            (d / f"{cam}.jpg").write_bytes(random.Random(f * 16 + c).randbytes(frame_kib * 1024))
        (d / "labels.json").write_text(json.dumps({"frame": f, "boxes": [[f % 7, 1, 2, 3]] * 20}))
    marker.write_text(f"{frames} frames x 6 x {frame_kib} KiB\n")
    return root


_WORKER = r"""
import json, os, sys, time
t0 = time.perf_counter()
import torch
from torch.utils.data import DataLoader, DistributedSampler
args = json.loads(sys.argv[1])
rank, world = args["rank"], args["world"]
def size(sample):
    return sum(len(v) for v in sample.values())
if args["mode"] == "nuro":
    from nuro.wrappers.sdk.data import SnapshotDataset, SnapshotLoader
    ds = SnapshotDataset(args["name"], args["digest"], samples=args["group"], transform=size)
    loader = SnapshotLoader(ds, args["batch"], seed=1, rank=rank, world_size=world, num_workers=args["workers"])
    epochs = [loader for _ in range(args["epochs"])]
else:
    from nuro.datasets.reader import PinnedDataset
    from nuro.datasets.samples import group_samples
    class PerFile(torch.utils.data.Dataset):
        def __init__(self):
            self.pinned = None
            self.samples = group_samples(PinnedDataset.from_env().paths(), args["group"])
        def __len__(self):
            return len(self.samples)
        def __getitem__(self, i):
            if self.pinned is None:  # per worker process: its own S3 client
                self.pinned = PinnedDataset.from_env()
            return sum(len(self.pinned.read(p)) for p in self.samples[i])
    ds = PerFile()
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=1)
    dl = DataLoader(ds, batch_size=args["batch"], sampler=sampler, num_workers=args["workers"])
    def epoch(e):
        sampler.set_epoch(e)
        return dl
    epochs = [epoch(e) for e in range(args["epochs"])]
out = {"epochs": []}
first = None
for e, it in enumerate(epochs):
    t = time.perf_counter()
    n = nbytes = 0
    for batch in it:
        if first is None:
            first = time.perf_counter() - t0
        n += len(batch)
        nbytes += int(sum(batch))
    out["epochs"].append({"seconds": time.perf_counter() - t, "samples": n, "bytes": nbytes})
out["first_batch_s"] = first
print("RESULT " + json.dumps(out), flush=True)
"""


def run_path(mode: str, nodes: int, base_args: dict, env: dict[str, str], cache_root: Path) -> list[dict]:
    procs = []
    for rank in range(nodes):
        penv = {**env, "NURO_DATA_CACHE_DIR": str(cache_root / f"node{rank}"), "PYTHONPATH": str(REPO)}
        a = json.dumps({**base_args, "mode": mode, "rank": rank, "world": nodes})
        procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, a], env=penv, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=3600)
        line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
        if p.returncode != 0 or line is None:
            raise SystemExit(f"{mode} worker failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(line[7:]))
    return results


def cached(cache_root: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """Every shard in the node caches: (node, name) -> (inode, size). A new inode is a fetch: the cache renames
    each fetched shard into place, so comparing two listings counts the bytes fetched in between (the fetches run
    in DataLoader worker processes, whose counters die with them)."""
    out = {}
    for path in cache_root.glob("node*/*/sha256/*"):
        if len(path.name) == 64:
            st = path.stat()
            out[(path.parts[-4], path.name)] = (st.st_ino, st.st_size)
    return out


def fetched(before: dict, after: dict) -> int:
    return sum(size for key, (ino, size) in after.items() if before.get(key, (None,))[0] != ino)


def summarize(results: list[dict], dataset_bytes: int, epochs: int, per_epoch_fetch: list[int] | None) -> dict:
    out = []
    for e in range(epochs):
        secs = max(r["epochs"][e]["seconds"] for r in results)
        samples = sum(r["epochs"][e]["samples"] for r in results)
        out.append({"epoch": e, "seconds": round(secs, 2), "samples_per_s": round(samples / secs, 1)})
    fetched_x = [round(b / dataset_bytes, 3) for b in per_epoch_fetch] if per_epoch_fetch else None
    return {"epochs": out, "first_batch_s": round(max(r["first_batch_s"] for r in results), 2),
            "s3_bytes_per_epoch_x_dataset": fetched_x}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=400)
    ap.add_argument("--frame-kib", type=int, default=1536)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--port-base", type=int, default=29800)
    args = ap.parse_args()
    root = make_set(args.frames, args.frame_kib)
    state = REPO / ".devcluster-bench" / "data-loader-s3"
    cache = Path(tempfile.mkdtemp(prefix="nuro-bench-cache-"))
    with ExitStack() as stack:
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        stack.enter_context(s3.standalone(state, args.port_base))
        stack.callback(shutil.rmtree, state, True)
        stack.callback(shutil.rmtree, cache, True)
        store = s3.dev_store(PortPlan(args.port_base))
        name = f"bench-multicam-{os.getpid()}"
        snap = snapshot(store, root, name)
        env = {**os.environ, **s3.s3_env(PortPlan(args.port_base)), "NURO_DATASET": name,
               "NURO_DATASET_DIGEST": snap.digest}  # fmt: skip
        base = {"name": name, "digest": snap.digest, "group": GROUP, "batch": args.batch, "workers": args.workers,
                "epochs": args.epochs}  # fmt: skip
        nuro = run_path("nuro", args.nodes, base, env, cache)
        after_first = cached(cache)
        fetched_first = fetched({}, after_first)
        # a second run on the warm node caches: what the next job of the team on these nodes pays
        nuro_warm = run_path("nuro", args.nodes, {**base, "epochs": 1}, env, cache)
        fetched_warm = fetched(after_first, cached(cache))
        baseline = run_path("baseline", args.nodes, base, env, cache)
    total = snap.total_bytes
    per_node_first = fetched_first / args.nodes
    result = {
        "set": {"frames": args.frames, "frame_kib": args.frame_kib, "mib": round(total / MiB, 1), "shards": snap.shards,
                "nodes": args.nodes, "workers_per_node": args.workers, "batch": args.batch, "epochs": args.epochs},
        "nuro": summarize(nuro, total, args.epochs, None),
        "nuro_s3_bytes_per_node_x_dataset": {"run_1_all_epochs": round(per_node_first / total, 3),
                                             "run_2_warm_cache": round(fetched_warm / args.nodes / total, 3)},
        "nuro_warm_cache": summarize(nuro_warm, total, 1, None),
        "baseline_get_per_file": summarize(baseline, total, args.epochs, [total] * args.epochs),
        "speedup_samples_per_s": [
            round(n["samples_per_s"] / b["samples_per_s"], 2)
            for n, b in zip(summarize(nuro, total, args.epochs, None)["epochs"],
                            summarize(baseline, total, args.epochs, None)["epochs"], strict=True)
        ],
        "machine": f"{os.cpu_count()} CPUs",
    }  # fmt: skip
    save(f"data_loader_{args.frames}x{args.frame_kib}k", result)


if __name__ == "__main__":
    mp.set_start_method("fork")
    main()

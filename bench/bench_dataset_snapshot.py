"""Dataset snapshot throughput: nuro's sharded snapshot vs a plain per-file upload (``aws s3 sync``-style).

The tree: ``--size-gib`` (default 2) of ``--file-kib`` (default 100) KiB files — 20,972 files for 2 GiB — spread
over 100 directories, pseudo-random (incompressible) bytes generated deterministically from their index, under
``/tmp/nuro-bench-dataset-<size>g-<file>k`` (kept and reused by later runs; ``….complete`` beside it says it is
complete).

Both paths run in the same run against the same fresh SeaweedFS (``weed mini``, our own on ``--port-base``, or
the one in ``NURO_S3_ENDPOINT`` with ``--use-env``), through the same ``ObjectStore`` client settings (timeouts,
retries, connection pool):

- nuro: ``snapshot()`` — files packed into ~64 MiB content-addressed shards, 4 shards in flight, multipart parts
  of 16 MiB, manifest last. Measured cold (every shard new) and again on the unchanged tree (dedup: nothing new).
- baseline: one PutObject per file from a pool of ``--concurrency`` threads (10 = ``aws s3 sync``'s default
  ``max_concurrent_requests``), no conditions, no hashing on our side.

The tree is read once before timing, so both read from the page cache. Benchmarks measure; nothing asserts a speed.

    python -m bench.bench_dataset_snapshot [--size-gib 2] [--file-kib 100] [--port-base 28800] [--verify]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from bench.common import REPO, save
from nuro.datasets.snapshot import scan, snapshot
from nuro.datasets.verify import verify
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.objectstore import ObjectStore

MiB = 1024 * 1024


def make_tree(size_gib: float, file_kib: int) -> tuple[Path, int]:
    """The deterministic tree (created once, reused): returns its path and number of files."""
    n_files = int(size_gib * 1024 * 1024 // file_kib)
    root = Path(f"/tmp/nuro-bench-dataset-{size_gib:g}g-{file_kib}k")
    marker = root.with_name(root.name + ".complete")  # beside the tree, not in it: it is not part of the data
    if marker.exists():
        return root, n_files
    shutil.rmtree(root, ignore_errors=True)
    for i in range(n_files):
        path = root / f"dir{i % 100:03d}" / f"sample-{i:06d}.bin"
        if i < 100:
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(random.Random(i).randbytes(file_kib * 1024))
    marker.write_text(f"{n_files} files of {file_kib} KiB\n")
    return root, n_files


def warm(root: Path) -> None:
    for f in scan(root):
        (root / f.path).read_bytes()


def plain_upload(store: ObjectStore, root: Path, prefix: str, concurrency: int) -> int:
    """One PUT per file, like ``aws s3 sync``: the baseline."""
    files = [f.path for f in scan(root)]

    def put(rel: str) -> None:
        store.put(f"{prefix}{rel}", (root / rel).read_bytes())

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        list(pool.map(put, files))
    return len(files)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--file-kib", type=int, default=100)
    ap.add_argument("--port-base", type=int, default=28800)
    ap.add_argument("--concurrency", type=int, default=10, help="baseline threads (aws s3 sync default: 10)")
    ap.add_argument("--use-env", action="store_true", help="use the S3 in NURO_S3_ENDPOINT instead of our own")
    ap.add_argument("--verify", action="store_true", help="also time a full verify (download + re-hash)")
    args = ap.parse_args()

    t0 = time.perf_counter()
    root, n_files = make_tree(args.size_gib, args.file_kib)
    t_gen = time.perf_counter() - t0
    warm(root)
    total = sum(f.size for f in scan(root))
    state = REPO / ".devcluster-bench" / "dataset-s3"
    with ExitStack() as stack:
        if args.use_env:
            store = ObjectStore.from_env(max_concurrency=args.concurrency)
        else:
            shutil.rmtree(state, ignore_errors=True)  # a fresh store: the first snapshot must upload everything
            stack.enter_context(s3.standalone(state, args.port_base))
            store = s3.dev_store(PortPlan(args.port_base), max_concurrency=args.concurrency)
        run_id = f"{int(time.time())}-{os.getpid()}"
        name = f"bench-{run_id}"

        t = time.perf_counter()
        cold = snapshot(store, root, name)
        nuro_s = time.perf_counter() - t

        t = time.perf_counter()
        again = snapshot(store, root, name)
        dedup_s = time.perf_counter() - t

        t = time.perf_counter()
        plain_files = plain_upload(store, root, f"bench-plain/{run_id}/", args.concurrency)
        plain_s = time.perf_counter() - t

        verify_s = None
        if args.verify:
            t = time.perf_counter()
            report = verify(store, name, cold.digest)
            verify_s = time.perf_counter() - t
            if not report.ok:
                raise SystemExit(f"verify failed: {report.problems[:3]}")
    if not args.use_env:
        shutil.rmtree(state, ignore_errors=True)

    mib = total / MiB
    result = {
        "tree": {"path": str(root), "files": n_files, "mib": round(mib, 1), "file_kib": args.file_kib,
                 "generated_s": round(t_gen, 1)},
        "nuro_snapshot": {"seconds": round(nuro_s, 2), "mib_per_s": round(mib / nuro_s, 1),
                          "files_per_s": round(n_files / nuro_s), "shards": cold.shards,
                          "shards_uploaded": cold.shards_uploaded},
        "nuro_resnapshot_unchanged": {"seconds": round(dedup_s, 2), "mib_per_s": round(mib / dedup_s, 1),
                                      "shards_uploaded": again.shards_uploaded},
        "plain_per_file_put": {"seconds": round(plain_s, 2), "mib_per_s": round(mib / plain_s, 1),
                               "files_per_s": round(plain_files / plain_s), "concurrency": args.concurrency},
        "speedup_nuro_vs_plain": round(plain_s / nuro_s, 2),
        "verify": {"seconds": round(verify_s, 2), "mib_per_s": round(mib / verify_s, 1)} if verify_s else None,
        "machine": f"{os.cpu_count()} CPUs",
    }  # fmt: skip
    save(f"dataset_snapshot_{args.size_gib:g}g", result)


if __name__ == "__main__":
    main()

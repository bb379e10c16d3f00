"""nuro's own snapshot reader (``SnapshotLoader``: content-addressed shards, node cache, sha256 per file) vs the
MosaicML Streaming API as packaged by the community fork ``streaming-community`` (``MDSWriter`` +
``StreamingDataset``/``StreamingDataLoader`` with ``remote=s3://...``), on the same synthetic multi-camera set as
``bench_data_loader`` (``make_set``: a sample = one timestamp's 6 camera files + labels), against one fresh SeaweedFS.

Measured in one run:

1. conversion: streaming needs its own copy of the data as MDS shards (64 MiB, sha256 per shard so that
   ``validate_hash`` has something to check): time and S3 bytes it adds. nuro reads the snapshot it already has
   (its one-time ``snapshot`` time is reported for reference; it is not an extra step);
2. reading: ``--nodes`` emulated nodes (one process each, its own cache dir, its own ``/dev/shm`` and ``TMPDIR``:
   streaming coordinates a node's ranks and workers through POSIX shared memory named per node, so two "nodes" on
   one host must not see each other's) x ``--workers`` DataLoader workers, ``--epochs`` epochs, batch ``--batch``,
   shuffled: samples/s per epoch (all nodes), process start to first batch, S3 bytes per node, and which samples
   each epoch read (repeats, misses). Streaming twice: as shipped, and with the boto3 client that
   ``StreamingDataset.__init__`` made for ``index.json`` dropped before the DataLoader forks its workers (as shipped,
   every worker inherits it: one keep-alive connection read by several processes);
3. resume: 2 ranks read ``k`` batches mid-epoch and save the loader state; 1 rank (then 3 ranks) load it and
   read the rest of the epoch. Exact = nothing read twice and nothing of the uninterrupted epoch skipped;
4. integrity: a byte flipped in a node's cached shard; a byte flipped in a shard in the store; the same with the
   index/manifest rewritten to match. Reported: which samples came back with wrong bytes, which error was raised.
   And with streaming's default ``validate_hash=None``: every sample's sha256 after a cold read through the
   inherited client (1 node, all workers), as shipped and with a client per worker.

Runs in a venv that has both nuro and streaming (the project venv must not get streaming's dependencies)::

    python3.11 -m venv /tmp/venv-streaming
    /tmp/venv-streaming/bin/pip install torch==2.14.1 torchvision==0.29.1 numpy streaming-community==0.14.2 \\
        boto3 click rich psutil pydantic pyyaml
    # nuro's package map (nuro.devcluster = devcluster/, ...): the editable finder of the project venv
    cp .venv/lib/python3.11/site-packages/__editable__*nuro* /tmp/venv-streaming/lib/python3.11/site-packages/
    ln -s "$PWD/.venv/bin/weed" /tmp/venv-streaming/bin/weed
    PYTHONDONTWRITEBYTECODE=1 /tmp/venv-streaming/bin/python -m bench.bench_data_libs \\
        [--frames 200] [--frame-kib 1536] [--nodes 2] [--workers 4] [--epochs 2] [--batch 8] [--port-base 30800] \\
        [--out FILE]

(torch 2.14.1 + torchvision 0.29.1, not the project's torch 2.13.0+cpu: ``import streaming`` imports torchvision,
and PyPI's torchvision does not load beside the CPU-only torch. Both readers run on the same torch here.)
Emulating nodes needs ``unshare`` (root) for the private ``/dev/shm``. Nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from bench.bench_data_loader import CAMERAS, GROUP, MiB, cached, fetched, make_set, summarize
from bench.common import REPO, save
from nuro.datasets.manifest import manifest_key, shard_key
from nuro.datasets.refs import load_manifest
from nuro.datasets.snapshot import snapshot
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.objectstore import ObjectStore

COLUMNS = (*CAMERAS, "labels")  # MDS columns: the 6 frames and the label file, all raw bytes
SHARD_BYTES = 64 * MiB  # both: nuro's SHARD_TARGET_BYTES and MDSWriter's default size_limit
SEED = 1

_WORKER = r"""
import hashlib, json, os, sys, time
t0 = time.perf_counter()
import torch
args = json.loads(sys.argv[1])
cols = args["columns"]

def frame_of(labels):
    return json.loads(labels)["frame"]

def by_column(sample):  # nuro: {"000012/front.jpg": b"..", "000012/labels.json": b".."} -> {"front": b"..", ...}
    return {p.rsplit("/", 1)[1].split(".")[0]: v for p, v in sample.items()}

def as_row(s):  # what a batch carries: the sample's bytes, which frame it was (and 56 bits of its sha256)
    row = [sum(len(s[c]) for c in cols), frame_of(s["labels"])]
    if args.get("digests"):
        row.append(int(hashlib.sha256(b"".join(s[c] for c in cols)).hexdigest()[:14], 16))
    return torch.tensor(row)

if args["lib"] == "nuro":
    from nuro.wrappers.sdk.data import SnapshotDataset, SnapshotLoader
    def open_dataset(transform):
        return SnapshotDataset(args["name"], args["digest"], samples=args["group"], transform=transform)
    def make_loader():
        ds = open_dataset(lambda sample: as_row(by_column(sample)))
        return SnapshotLoader(ds, args["batch"], seed=args["seed"], rank=args["rank"], world_size=args["world"],
                              num_workers=args["workers"])
else:
    from streaming import StreamingDataLoader, StreamingDataset
    class Rows(StreamingDataset):
        def get_item(self, sample_id, retry=7):
            return as_row(super().get_item(sample_id, retry))
    def open_dataset(cls=StreamingDataset, **kw):
        return cls(remote=args["remote"], local=args["local"], validate_hash=args["validate_hash"], **kw)
    def make_loader():
        ds = open_dataset(Rows, shuffle=True, shuffle_seed=args["seed"], batch_size=args["batch"])
        if args.get("client_per_worker"):  # drop the boto3 client that fetched index.json before the workers fork
            for stream in ds.streams:
                stream._downloader.clean_up()
        return StreamingDataLoader(ds, batch_size=args["batch"], num_workers=args["workers"])

out = {"import_s": time.perf_counter() - t0}
if args["mode"] == "read":
    loader = make_loader()
    if args.get("state"):
        loader.load_state_dict(args["state"])
    first = None
    out["epochs"] = []
    for e in range(args["epochs"]):
        t = time.perf_counter()
        n = nbytes = 0
        ids = []
        for step, batch in enumerate(loader):
            if first is None:
                first = time.perf_counter() - t0
            n += len(batch)
            nbytes += int(batch[:, 0].sum())
            ids += batch[:, 1].tolist()
            if args.get("digests"):
                out.setdefault("digests", []).extend(batch[:, 1:3].tolist())
            if args.get("steps") and step + 1 == args["steps"]:
                break
        out["epochs"].append({"seconds": time.perf_counter() - t, "samples": n, "bytes": nbytes, "ids": ids})
    out["first_batch_s"] = first
    if args.get("steps"):
        out["state"] = loader.state_dict()
else:  # integrity: read every sample of one shard directly (ds[i]); optionally flip a byte of its cached copy
    read, error, damaged = [], None, None
    try:
        shard = args["shard"]
        if args["lib"] == "nuro":
            ds = open_dataset(None)
            ids = [i for i, g in enumerate(ds.groups) if g == shard]
            cached_path = lambda: ds.cache._paths(ds.manifest.shards[shard].digest)[0]
            def get(i):  # the frame from the paths: labels may be the damaged bytes
                raw = ds[i]
                return int(next(iter(raw)).split("/")[0]), by_column(raw)
        else:
            ds = open_dataset()
            start = int(sum(ds.samples_per_shard[:shard]))
            ids = list(range(start, start + int(ds.samples_per_shard[shard])))
            cached_path = lambda: os.path.join(args["local"], ds.shards[shard].file_pairs[0][0].basename)
            get = lambda i: (i, ds[i])  # MDS sample i = frame i (written in frame order)
        if args["damage_local"]:
            get(ids[0])  # the shard is now in the node's cache
            damaged = str(cached_path())
            with open(damaged, "r+b") as f:
                f.seek(os.path.getsize(damaged) // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0xFF]))
        for i in ids:
            frame, s = get(i)
            read.append([frame, hashlib.sha256(b"".join(s[c] for c in cols)).hexdigest()])
        if args["lib"] == "nuro" and ds.cache is not None:
            out["cache_stats"] = ds.cache.stats.to_dict()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:400]
    out.update(read=read, error=error, damaged=damaged)
print("RESULT " + json.dumps(out), flush=True)
sys.stdout.flush()
os._exit(0)  # streaming's prefetch threads and atexit shm cleanup must not hold the process
"""


class Runner:
    """Starts emulated nodes: one process per rank, its own cache dir, ``TMPDIR`` and (with unshare) ``/dev/shm``."""

    def __init__(self, env: dict[str, str], cache: Path, port_base: int, isolate: bool) -> None:
        self.env, self.cache, self.isolate = env, cache, isolate
        self.port = port_base + 90  # torch.distributed rendezvous for streaming's ranks (a new one per launch)
        # TMPDIR per node, short: torch passes a batch's tensors over a Unix socket under it (sun_path: 108 bytes)
        self.tmp_root = Path(tempfile.mkdtemp(prefix="nbl-"))

    def local(self, lib: str, node: int | str) -> Path:
        return self.cache / lib / f"node{node}"

    def run(
        self,
        lib: str,
        ranks: list[int],
        world: int,
        args: dict,
        nodes: list | None = None,
        tolerate: bool = False,
        timeout_s: float = 3600,
    ) -> list:
        """One process per rank; their results. ``tolerate``: a failed rank gives ``{"error": its stderr's end}``,
        one with no result after ``timeout_s`` is killed (its process group: the rank and its DataLoader workers)."""
        self.port += 1
        procs = []
        for rank, node in zip(ranks, nodes or ranks, strict=True):
            tmp = tempfile.mkdtemp(dir=self.tmp_root)
            local = self.local(lib, node)
            penv = {**self.env, "TMPDIR": tmp, "NURO_DATA_CACHE_DIR": str(local), "RANK": str(rank),
                    "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.port), "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip
            a = json.dumps({**args, "lib": lib, "rank": rank, "world": world, "local": str(local)})
            argv = [sys.executable, "-c", _WORKER, a]
            if self.isolate:  # a node's own /dev/shm: streaming names its shared memory per node, not per host
                argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs -o size=8g tmpfs /dev/shm && exec "$@"', "sh", *argv]  # fmt: skip
            procs.append(subprocess.Popen(argv, env=penv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          start_new_session=True))  # fmt: skip
        results = []
        deadline = time.monotonic() + timeout_s
        for p in procs:
            hung = False
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
                os.killpg(p.pid, signal.SIGKILL)
                out, err = p.communicate()
            line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                if not tolerate:
                    raise SystemExit(f"{lib} rank failed ({p.returncode}):\n{err[-4000:]}")
                lines = [x.strip() for x in err.splitlines() if "Error:" in x or "Exception:" in x]
                error = (lines or [f"exit {p.returncode}"])[-1][:400]
                if hung:
                    error = f"hung: no result after {timeout_s:.0f} s, killed" + (
                        f" (last error: {error})" if lines else ""
                    )
                results.append({"error": error, "stderr": err[-6000:]})
                continue
            results.append(json.loads(line[7:]))
        return results


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def coverage(results: list[dict], epoch: int, frames: int) -> dict:
    ids = [i for r in results for i in r["epochs"][epoch]["ids"]]
    distinct = set(ids)
    return {"read": len(ids), "distinct": len(distinct), "read_twice": len(ids) - len(distinct),
            "not_read": frames - len(distinct)}  # fmt: skip


def convert_mds(root: Path, remote: str) -> float:
    """The set as MDS shards in S3 (MDSWriter writes locally under TMPDIR and uploads each shard as it closes)."""
    from streaming import MDSWriter

    t0 = time.perf_counter()
    with MDSWriter(out=remote, columns=dict.fromkeys(COLUMNS, "bytes"), hashes=["sha256"], size_limit=SHARD_BYTES,
                   exist_ok=True) as writer:  # fmt: skip
        for d in sorted(root.iterdir()):
            sample = {c: (d / f"{c}.jpg").read_bytes() for c in CAMERAS}
            writer.write({**sample, "labels": (d / "labels.json").read_bytes()})
    return time.perf_counter() - t0


def expected_digests(root: Path) -> dict[int, str]:
    """Per frame: sha256 of its files in column order (what a reader that returns the right bytes hashes to)."""
    out = {}
    for d in sorted(root.iterdir()):
        h = hashlib.sha256()
        for c in CAMERAS:
            h.update((d / f"{c}.jpg").read_bytes())
        h.update((d / "labels.json").read_bytes())
        out[int(d.name)] = h.hexdigest()
    return out


def judge(result: dict, expected: dict[int, str]) -> dict:
    wrong = sorted(f for f, digest in result["read"] if expected[f] != digest)
    out = {"samples_returned": len(result["read"]), "samples_with_wrong_bytes": len(wrong), "error": result["error"]}
    if "cache_stats" in result:
        out["cache_discarded_and_refetched"] = result["cache_stats"].get("discarded", 0)
    return out


def flip_object(store: ObjectStore, key: str) -> bytes:
    data = bytearray(store.get(key)[0])
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
    return bytes(data)


def resume_check(first: list[int], rest: list[int], reference: list[int]) -> dict:
    """first: what the 2 ranks read before the save; rest: what 1 rank read after loading it; reference: the
    uninterrupted epoch at 2 ranks (same seed). Exact: no sample twice, none of the reference skipped."""
    before, after, ref = set(first), set(rest), set(reference)
    return {"read_before_save": len(first), "read_after_resume": len(rest), "read_twice": len(before & after),
            "skipped_vs_uninterrupted": len(ref - before - after), "not_in_uninterrupted": len((before | after) - ref),
            "exact": not (before & after) and not (ref - before - after) and len(rest) == len(after)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--frame-kib", type=int, default=1536)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--port-base", type=int, default=30800)
    ap.add_argument("--no-isolate", action="store_true", help="no private /dev/shm per node (streaming: 1 node)")
    ap.add_argument("--out", type=Path, help="write the result here instead of bench/results/")
    args = ap.parse_args()
    root = make_set(args.frames, args.frame_kib)
    state = Path(f"/tmp/nuro-bench-data-libs-{args.port_base}")
    cache = Path(tempfile.mkdtemp(prefix="nuro-bench-data-libs-cache-"))
    ports = PortPlan(args.port_base)
    with ExitStack() as stack:
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)
        stack.callback(shutil.rmtree, state, True)
        stack.callback(shutil.rmtree, cache, True)
        stack.enter_context(s3.standalone(state, args.port_base))
        store = s3.dev_store(ports)
        env3 = s3.s3_env(ports)
        aws_config = cache / "aws-config"
        aws_config.write_text("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
        env = {**os.environ, **env3, "PYTHONPATH": str(REPO), "S3_ENDPOINT_URL": env3["NURO_S3_ENDPOINT"],
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(aws_config)}  # fmt: skip
        os.environ.update({k: env[k] for k in ("S3_ENDPOINT_URL", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE")})
        os.environ.update({k: v for k, v in env3.items() if k.startswith("AWS_")})
        runner = Runner(env, cache, args.port_base, isolate=not args.no_isolate)
        stack.callback(shutil.rmtree, runner.tmp_root, True)

        # 1. conversion
        name = f"bench-libs-{os.getpid()}"
        t0 = time.perf_counter()
        snap = snapshot(store, root, name)
        nuro_snapshot_s = time.perf_counter() - t0
        prefix = f"mds/{name}/"
        remote = f"s3://{env3['NURO_S3_BUCKET']}/{prefix.rstrip('/')}"
        mds_s = convert_mds(root, remote)
        mds_objects = list(store.list(prefix))
        mds_bytes = sum(o.size for o in mds_objects)

        # 2. reading, cold node caches, 2 epochs
        nuro_args = {"name": name, "digest": snap.digest, "group": GROUP, "columns": list(COLUMNS), "seed": SEED,
                     "batch": args.batch, "workers": args.workers, "epochs": args.epochs, "mode": "read"}  # fmt: skip
        shipped_args = {**nuro_args, "remote": remote, "validate_hash": "sha256"}
        # StreamingDataset.__init__ fetches index.json with a boto3 client that the DataLoader workers then inherit
        # through fork (one keep-alive connection, several processes): as shipped, and with that client dropped
        st_args = {**shipped_args, "client_per_worker": True}
        ranks = list(range(args.nodes))
        nuro = runner.run("nuro", ranks, args.nodes, nuro_args)
        nuro_fetched = fetched({}, cached(cache / "nuro")) / args.nodes
        shipped = runner.run("streaming", ranks, args.nodes, shipped_args, [f"shipped{r}" for r in ranks], True)
        stream = runner.run("streaming", ranks, args.nodes, st_args)
        stream_fetched = sum(tree_bytes(runner.local("streaming", r)) for r in ranks) / args.nodes

        # 3. resume mid-epoch: --nodes ranks save after k batches; 1 rank (and 3 ranks) continue from that state
        per_rank_batches = args.frames // args.nodes // args.batch
        k = max(1, per_rank_batches // 2)
        resume: dict = {"steps_before_save_per_rank": k, "ranks_before": args.nodes}
        for lib, a, reference in (("nuro", nuro_args, nuro), ("streaming", st_args, stream)):
            before = runner.run(lib, ranks, args.nodes, {**a, "epochs": 1, "steps": k})
            saved = before[0]["state"]
            first = [i for r in before for i in r["epochs"][0]["ids"]]
            ref = [i for r in reference for i in r["epochs"][0]["ids"]]
            resume[lib] = {"saved_state": saved}
            for world in (1, 3):
                nodes = [f"resume{world}-{r}" for r in range(world)]
                after = runner.run(lib, list(range(world)), world, {**a, "epochs": 1, "state": saved}, nodes, True)
                errors = [r["error"] for r in after if "error" in r]
                rest = [i for r in after if "error" not in r for i in r["epochs"][0]["ids"]]
                out = {"error": errors[0]} if errors else resume_check(first, rest, ref)
                if lib == "nuro" and not errors:  # by design: the last (n - position) % W samples wait (drop_last)
                    out["drop_last_tail"] = (args.frames - saved["position"]) % world
                resume[lib][f"to_{world}_ranks"] = out

        # 4. integrity
        expected = expected_digests(root)
        # the inherited client, without validate_hash (the default): are the bytes served right? 1 node, all samples
        forked_client = {}
        for label, extra in (("as_shipped", {}), ("client_per_worker", {"client_per_worker": True})):
            a = {**shipped_args, **extra, "validate_hash": None, "digests": True, "epochs": 1}
            r = runner.run("streaming", [0], 1, a, [f"check-{label}"], True, timeout_s=600)[0]
            if "error" in r:
                forked_client[label] = {"error": r["error"]}
                continue
            wrong = sum(1 for f, d in r["digests"] if int(expected[f][:14], 16) != d)
            forked_client[label] = {"samples": len(r["digests"]), "samples_with_wrong_bytes": wrong,
                                    "epoch_s": round(r["epochs"][0]["seconds"], 2)}  # fmt: skip
        one = {**nuro_args, "mode": "integrity", "workers": 0}
        sone = {**st_args, "mode": "integrity", "workers": 0}
        integ: dict[str, dict] = {}

        def check(label: str, lib: str, a: dict, node: str) -> None:
            integ.setdefault(label, {})[lib if lib == "nuro" else f"streaming_validate_hash={a['validate_hash']}"] = (
                judge(runner.run(lib, [0], 1, a, nodes=[node])[0], expected)
            )

        check("byte_flipped_in_node_cache", "nuro", {**one, "shard": 0, "damage_local": True}, "0")
        check("byte_flipped_in_node_cache", "streaming", {**sone, "shard": 0, "damage_local": True}, "resume1-0")
        # the last shard of each, read by nodes with empty caches
        manifest = load_manifest(store, name, snap.digest)[0]
        nuro_last = {**one, "shard": len(manifest.shards) - 1, "damage_local": False}
        flip_object(store, shard_key(manifest.shards[-1].digest, name))
        index = json.loads(store.get(prefix + "index.json")[0])
        mds_last = index["shards"][-1]["raw_data"]
        altered = flip_object(store, prefix + mds_last["basename"])
        st_last = {**sone, "shard": len(index["shards"]) - 1, "damage_local": False}
        check("byte_flipped_in_store", "nuro", nuro_last, "fresh0")
        check("byte_flipped_in_store", "streaming", {**st_last, "validate_hash": None}, "fresh1")
        check("byte_flipped_in_store", "streaming", st_last, "fresh2")
        # what a re-conversion into the same prefix (or anyone who may write it) leaves: index.json agrees again
        mds_last["hashes"]["sha256"] = hashlib.sha256(altered).hexdigest()
        store.put(prefix + "index.json", json.dumps(index).encode())
        check("shard_and_index_rewritten", "streaming", st_last, "fresh3")
        # nuro's analogue: the manifest rewritten under the pinned name (one file's sha256 changed)
        mkey = manifest_key(name, snap.digest)
        mdoc = json.loads(store.get(mkey)[0])
        mdoc["files"][next(iter(mdoc["files"]))]["sha256"] = "sha256:" + "0" * 64
        store.put(mkey, json.dumps(mdoc).encode())
        check("shard_and_index_rewritten", "nuro", nuro_last, "fresh4")

    total = snap.total_bytes
    epochs = range(args.epochs)
    ns, ss = summarize(nuro, total, args.epochs, None), summarize(stream, total, args.epochs, None)
    for s in (ns, ss):
        s.pop("s3_bytes_per_epoch_x_dataset")
    shipped_errors = [r["error"] for r in shipped if "error" in r]
    if shipped_errors:
        shipped_summary: dict = {"error": shipped_errors[0], "ranks_failed": len(shipped_errors)}
    else:
        shipped_summary = summarize(shipped, total, args.epochs, None)
        shipped_summary.pop("s3_bytes_per_epoch_x_dataset")
        shipped_summary["epoch_seconds_per_rank"] = [[round(e["seconds"], 1) for e in r["epochs"]] for r in shipped]
    result = {
        "set": {"frames": args.frames, "frame_kib": args.frame_kib, "mib": round(total / MiB, 1),
                "nuro_shards": snap.shards, "mds_shards": len(index["shards"]), "nodes": args.nodes,
                "workers_per_node": args.workers, "batch": args.batch, "epochs": args.epochs},
        "conversion": {"nuro_extra_s": 0.0, "nuro_extra_s3_bytes": 0,
                       "nuro_snapshot_s_for_reference": round(nuro_snapshot_s, 2),
                       "streaming_mds_s": round(mds_s, 2), "streaming_extra_s3_bytes": mds_bytes,
                       "streaming_extra_x_dataset": round(mds_bytes / total, 3), "streaming_objects": len(mds_objects)},
        "read": {
            "nuro": {**ns, "import_s": round(max(r["import_s"] for r in nuro), 2),
                     "s3_bytes_per_node_x_dataset": round(nuro_fetched / total, 3),
                     "coverage": [coverage(nuro, e, args.frames) for e in epochs]},
            "streaming_as_shipped": shipped_summary,
            "streaming_client_per_worker": {**ss, "import_s": round(max(r["import_s"] for r in stream), 2),
                     "s3_bytes_per_node_x_dataset": round(stream_fetched / total, 3),
                     "coverage": [coverage(stream, e, args.frames) for e in epochs]},
            "streaming_over_nuro_samples_per_s": [
                round(s["samples_per_s"] / n["samples_per_s"], 2)
                for n, s in zip(ns["epochs"], ss["epochs"], strict=True)],
        },
        "resume": resume,
        "integrity": {**integ, "inherited_client_validate_hash=None_1_node": forked_client},
        "machine": f"{os.cpu_count()} CPUs",
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    else:
        save(f"data_libs_{args.frames}x{args.frame_kib}k", result)


if __name__ == "__main__":
    main()

"""SnapshotDataset / SnapshotLoader against a real SeaweedFS: a synthetic multi-camera snapshot read in nuro's order
by 2 and 4 ranks, a mid-epoch resume through a real Checkpointer on another world size, 16 processes sharing one
node cache (one GET per shard), eviction under a budget, a damaged cached shard and a tampered shard in S3.

One SeaweedFS (``standalone``, port base 9800, state under ``.devcluster-test-9800-data``) serves the module.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro.datasets.errors import IntegrityError
from nuro.datasets.manifest import shard_key
from nuro.datasets.snapshot import snapshot
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.objectstore import ObjectStore
from nuro.wrappers.sdk.checkpointer import Checkpointer
from nuro.wrappers.sdk.data import SnapshotDataset, SnapshotLoader

REPO = Path(__file__).resolve().parents[2]
PORT_BASE = int(os.environ.get("NURO_TEST_DATA_PORT_BASE", "9800"))
STATE_DIR = REPO / f".devcluster-test-{PORT_BASE}-data"
CAMERAS = ("front", "front_left", "front_right", "back", "left", "right")
FRAMES = 48
GROUP = r"^(drive-\d+)/[a-z_]+/(\d+)\."  # key: drive + frame -> 6 camera frames and the labels of one timestamp


@pytest.fixture(scope="module")
def store() -> Iterator[ObjectStore]:
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    STATE_DIR.mkdir(parents=True)
    with s3.standalone(STATE_DIR, PORT_BASE):
        yield s3.dev_store(PortPlan(PORT_BASE))
    shutil.rmtree(STATE_DIR, ignore_errors=True)


@pytest.fixture(scope="module")
def snap(store: ObjectStore, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """48 timestamps x (6 camera frames of ~3 KiB + labels) in shards of ~32 KiB: 300+ files, ~30 shards."""
    root = tmp_path_factory.mktemp("multicam")
    for f in range(FRAMES):
        drive = f"drive-{f // 24:02d}"
        for cam in CAMERAS:
            path = root / drive / cam / f"{f:06d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(f"{drive}/{cam}/{f}|".encode() * 150)
        (root / drive / "labels").mkdir(exist_ok=True)
        (root / drive / "labels" / f"{f:06d}.json").write_text(f'{{"frame": {f}}}')
    (root / "README").write_text("not a sample\n")
    name = f"multicam-{uuid.uuid4().hex[:6]}"
    res = snapshot(store, root, name, target_bytes=32 * 1024)
    assert res.shards >= 10
    return name, res.digest


def _ds(store: ObjectStore, snap: tuple[str, str], cache: Path | None, **kw) -> SnapshotDataset:
    from nuro.datasets.cache import ShardCache

    return SnapshotDataset(*snap, samples=GROUP, store=store, cache=ShardCache(cache) if cache else None, **kw)


def _frame(sample: dict[str, bytes]) -> int:
    return int(next(iter(sample)).rsplit("/", 1)[1].split(".")[0])


def _steps(loaders: list[SnapshotLoader], steps: int | None = None) -> list[list[int]]:
    """Global batches (frames of all ranks) of up to ``steps`` steps, every rank stepping together."""
    out: list[list[int]] = []
    its = [iter(ld) for ld in loaders]
    while steps is None or len(out) < steps:
        try:
            out.append([_frame(s) for it in its for s in next(it)])
        except StopIteration:
            break
    return out


def test_every_world_size_reads_the_same_verified_samples_in_the_same_order(store, snap, tmp_path) -> None:
    ds = _ds(store, snap, tmp_path / "cache")
    assert len(ds) == FRAMES and all(len(s) == 7 for s in ds.samples)  # README is not a sample
    sample = ds[0]
    assert sorted(p.split("/")[1] for p in sample) == sorted([*CAMERAS, "labels"])
    by_world = {}
    for world in (2, 4):
        loaders = [SnapshotLoader(ds, 3, seed=11, rank=r, world_size=world, num_workers=2) for r in range(world)]
        batches = _steps(loaders)
        by_world[world] = [sorted(b) for b in batches]
        assert sorted(f for b in batches for f in b) == list(range(FRAMES))
        assert all(ld.epoch == 1 and ld.state.position == 0 for ld in loaders)
    # 4 ranks x 3 = one 12-sample global batch = two global batches of 2 ranks x 3, in order
    assert by_world[4] == [sorted(a + b) for a, b in zip(by_world[2][::2], by_world[2][1::2], strict=True)]
    ds.close()


def test_a_run_resumed_on_fewer_ranks_reads_exactly_the_samples_not_yet_seen(store, snap, tmp_path) -> None:
    """4 ranks read 2 steps, rank 0 checkpoints the loader with the model (real DCP, real S3); the run resumes on
    2 ranks from the restored state and reads exactly the rest of the epoch, then the next epoch whole."""
    ds = _ds(store, snap, tmp_path / "cache")
    loaders = [SnapshotLoader(ds, 2, seed=3, rank=r, world_size=4) for r in range(4)]
    seen = [f for b in _steps(loaders, 2) for f in b]
    run = f"data-{uuid.uuid4().hex[:6]}"
    ck = Checkpointer(team="vision", run=run, store=store, staging_dir=tmp_path / "stage" / "1", upload="inline")
    import torch

    ck.save({"w": torch.ones(4), "loader": loaders[0].state_dict()}, 2, sync=True)
    assert ck.wait_committed(2, 30)
    ck.close()

    fresh = _ds(store, snap, tmp_path / "cache2")
    resumed = [SnapshotLoader(fresh, 2, seed=3, rank=r, world_size=2) for r in range(2)]
    state = {"w": torch.zeros(4), "loader": resumed[0].state_dict()}
    ck2 = Checkpointer(team="vision", run=run, store=store, staging_dir=tmp_path / "stage2" / "2", upload="inline")
    assert ck2.restore(state) == 2
    ck2.close()
    assert state["loader"]["position"] == 16
    for ld in resumed:
        ld.load_state_dict(state["loader"])
    rest = [f for b in _steps(resumed) for f in b]
    assert not set(seen) & set(rest) and sorted(seen + rest) == list(range(FRAMES))
    assert resumed[0].epoch == 1 and len(_steps(resumed)) == FRAMES // 4  # the next epoch: whole, 4 per step
    with pytest.raises(Exception, match="resume with the snapshot and seed"):
        SnapshotLoader(fresh, 2, seed=4, rank=0, world_size=2).load_state_dict(state["loader"])


def _read_all(store_env: dict[str, str], snap: tuple[str, str], cache: str, out: mp.Queue) -> None:
    os.environ.update(store_env)
    from nuro.datasets.cache import ShardCache

    ds = SnapshotDataset(*snap, samples=GROUP, cache=ShardCache(Path(cache)))
    frames = sorted(_frame(ds[i]) for i in range(len(ds)))
    out.put((ds.cache.stats.fetches, frames == list(range(FRAMES))))


def test_sixteen_readers_on_a_node_fetch_each_shard_once(store, snap, tmp_path) -> None:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    env = s3.s3_env(PortPlan(PORT_BASE))
    procs = [ctx.Process(target=_read_all, args=(env, snap, str(tmp_path / "c"), out)) for _ in range(16)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    shards = len(_ds(store, snap, None).manifest.shards)
    assert all(ok for _, ok in results)
    assert sum(f for f, _ in results) == shards  # one GET per shard for the whole node


def test_over_budget_the_cache_evicts_but_reads_stay_right(store, snap, tmp_path) -> None:
    from nuro.datasets.cache import ShardCache

    sizes = sorted(s.size for s in _ds(store, snap, None).manifest.shards)
    budget = sum(sizes[-4:])  # room for about four shards
    cache = ShardCache(tmp_path / "c", budget_bytes=budget)
    ds = SnapshotDataset(*snap, samples=GROUP, store=store, cache=cache, open_shards=2)
    loader = SnapshotLoader(ds, 4, seed=1, rank=0, world_size=1)
    for _ in range(2):  # two epochs
        assert sorted(f for b in loader for f in map(_frame, b)) == list(range(FRAMES))
    assert cache.stats.evictions > 0 and cache.usage()[0] <= budget + 2 * sizes[-1]


def test_a_damaged_cached_shard_is_fetched_again_and_a_tampered_one_fails_the_read(store, snap, tmp_path) -> None:
    ds = _ds(store, snap, tmp_path / "c")
    first = ds.samples[0][0]
    good = ds.read(first)
    entry = ds.files[first]
    cached = ds.cache.dir / entry.shard.removeprefix("sha256:")
    with open(cached, "r+b") as fh:  # the node's disk flips a byte of the verified copy
        fh.seek(entry.offset)
        fh.write(b"\xff")
    assert ds.read(first) == good and ds.cache.stats.discarded == 1 and ds.cache.stats.fetches == 2
    ds.close()

    key = shard_key(entry.shard, snap[0])
    original, _ = store.get(key)
    store.put(key, original[:-1] + b"!")  # someone with the admin key altered the stored shard
    try:
        with pytest.raises(IntegrityError, match=entry.shard):
            _ds(store, snap, tmp_path / "fresh").read(first)  # the cache refuses it on arrival
        last = ds.manifest.files_in(entry.shard)[-1].path
        with pytest.raises(IntegrityError, match=entry.shard):
            _ds(store, snap, None).read(last)  # no cache: the ranged GET of the altered file fails too
    finally:
        store.put(key, original)


def test_a_snapshot_taken_with_a_sample_index_groups_alike_for_every_reader(store, tmp_path) -> None:
    """Issue 15 item 1: ``--samples`` stores the grouping in the snapshot (its digest covers it); a reader without
    its own pattern reads the snapshot's samples, a pattern that groups nothing is refused before any upload."""
    from click.testing import CliRunner

    from nuro.login.dataset_cli import dataset

    root = tmp_path / "set"
    for f in range(3):
        for cam in ("front", "left"):
            (root / "drive-01" / cam).mkdir(parents=True, exist_ok=True)
            (root / "drive-01" / cam / f"{f:06d}.jpg").write_bytes(f"{cam}{f}".encode())
    (root / "README").write_text("not a sample\n")
    name = f"indexed-{uuid.uuid4().hex[:6]}"
    env = {**s3.s3_env(PortPlan(PORT_BASE)), "NURO_TEAM": ""}
    res = CliRunner().invoke(dataset, ["snapshot", str(root), "-n", name, "--samples", GROUP, "--json"], env=env)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["samples"], out["sample_pattern"], out["files"]) == (3, GROUP, 7)
    ds = SnapshotDataset(name, out["digest"], store=store, cache=None)  # no pattern given: the snapshot's
    assert len(ds) == 3 and sorted(ds[0]) == ["drive-01/front/000000.jpg", "drive-01/left/000000.jpg"]
    per_file = SnapshotDataset(name, out["digest"], samples=r"^(.*\.jpg)$", store=store, cache=None)
    assert len(per_file) == 6  # a pattern given wins over the snapshot's
    bad = CliRunner().invoke(dataset, ["snapshot", str(root), "-n", name, "--samples", "^nope/"], env=env)
    assert bad.exit_code != 0 and "matches none of the snapshot's 7 files" in bad.output, bad.output

"""The node's shard cache on a local directory: one fetch per shard however many processes ask at once, eviction
that never removes a shard in use, verification on arrival, and damaged copies thrown away. The fetch is a local
callable here; tests/integration/test_dataset_loader.py reads through it from a real SeaweedFS."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time
from pathlib import Path

import pytest

from nuro.datasets.cache import CachedShard, ShardCache
from nuro.datasets.errors import IntegrityError


def _shard(i: int, size: int = 4096) -> tuple[str, bytes]:
    data = bytes([i % 251]) * size
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _open(cache: ShardCache, i: int, slow_s: float = 0.0) -> CachedShard:
    digest, data = _shard(i)

    def fetch():
        time.sleep(slow_s)
        yield data[:1000]
        yield data[1000:]

    return cache.open(digest, len(data), fetch)


def _reader(root: str, out: mp.Queue, everyone: mp.Barrier) -> None:
    cache = ShardCache(Path(root))
    shard = _open(cache, 1, slow_s=0.3)
    ok = shard.read(0, 4096) == _shard(1)[1]
    everyone.wait(30)  # keep it open until all have it, like DataLoader workers keep their current shards
    shard.close()
    out.put((cache.stats.fetches, ok))


def test_sixteen_processes_asking_at_once_fetch_once(tmp_path: Path) -> None:
    """None of them waits on a lock that a reader keeps while it has the shard open (that deadlocked a loader)."""
    ctx = mp.get_context("fork")
    out, everyone = ctx.Queue(), ctx.Barrier(16)
    procs = [ctx.Process(target=_reader, args=(str(tmp_path), out, everyone)) for _ in range(16)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert sum(f for f, _ in results) == 1 and all(ok for _, ok in results)


def test_eviction_keeps_the_budget_and_never_a_shard_in_use(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, budget_bytes=3 * 4096)
    in_use = _open(cache, 0)  # stays open
    for i in range(1, 4):
        _open(cache, i).close()
        time.sleep(0.01)  # distinct mtimes: least recently used first
    used, entries = cache.usage()
    names = {e.name for e in entries}
    assert used <= 3 * 4096 and cache.stats.evictions == 1
    assert _shard(0)[0].removeprefix("sha256:") in names and _shard(1)[0].removeprefix("sha256:") not in names
    assert in_use.read(0, 10) == _shard(0)[1][:10]
    in_use.close()


def test_a_shard_that_arrives_wrong_is_never_cached(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path)
    digest, data = _shard(5)
    with pytest.raises(IntegrityError, match=f"shard {digest}"):
        cache.open(digest, len(data), lambda: [data[:-1] + b"X"])
    assert cache.usage()[0] == 0 and not [e for e in os.scandir(cache.dir) if e.name.endswith(".part")]


def test_a_damaged_copy_is_discarded_and_fetched_again(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path)
    shard = _open(cache, 7)
    path = cache.dir / shard.digest.removeprefix("sha256:")
    with open(path, "r+b") as fh:  # bit rot on the node's disk after it was verified
        fh.write(b"\0")
    assert shard.read(0, 1) == b"\0"
    cache.discard(shard)
    again = _open(cache, 7)
    assert again.read(0, 4096) == _shard(7)[1] and cache.stats.fetches == 2 and cache.stats.discarded == 1
    again.close()
    path.write_bytes(b"short")  # truncated: the next open fetches instead of serving it
    _open(cache, 7).close()
    assert cache.stats.fetches == 3

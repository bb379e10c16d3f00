"""The node cache's eviction (``nodestage._evict``) and the epilog's free-space setting. Pure but for a temp dir:
the disk's free space is injected, so "the disk is nearly full" needs no full disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nuro.checkpoint import layout as L
from nuro.checkpoint.nodestage import _evict
from nuro.prolog_epilog.epilog import cache_keep_free_bytes

GIB = 1 << 30


def _cached(root: Path, *runs: str) -> list[Path]:
    """Cached runs, the first the least recently cached (mtimes 1000 s apart)."""
    out = []
    for i, run in enumerate(runs):
        d = L.cache_dir(root, "perception", run)
        (d / "step-00000001").mkdir(parents=True)
        os.utime(d, (1_000_000 + 1000 * i,) * 2)
        out.append(d)
    return out


def test_count_limit_keeps_the_most_recent(tmp_path: Path) -> None:
    a, b, c = _cached(tmp_path, "a", "b", "c")
    assert _evict(tmp_path, 2) == [a]
    assert not a.exists() and b.exists() and c.exists()


def test_a_nearly_full_disk_evicts_least_recent_first_until_enough_is_free(tmp_path: Path) -> None:
    runs = _cached(tmp_path, "a", "b", "c", "d")

    def free(_root: Path) -> int:  # every cached run holds 10 GiB of a disk with 15 GiB free when all four stay
        return 15 * GIB + 10 * GIB * sum(not r.exists() for r in runs)

    removed = _evict(tmp_path, 4, keep_free_bytes=40 * GIB, disk_free=free)
    assert removed == runs[:3] and [r.exists() for r in runs] == [False, False, False, True]


def test_the_newest_goes_too_when_the_disk_stays_short(tmp_path: Path) -> None:
    runs = _cached(tmp_path, "a", "b")
    assert _evict(tmp_path, 4, keep_free_bytes=40 * GIB, disk_free=lambda _r: GIB) == [runs[0], runs[1]]
    assert not any(r.exists() for r in runs)


def test_enough_free_space_evicts_nothing_beyond_the_count(tmp_path: Path) -> None:
    runs = _cached(tmp_path, "a", "b", "c")
    assert _evict(tmp_path, 4, keep_free_bytes=40 * GIB, disk_free=lambda _r: 100 * GIB) == []
    assert all(r.exists() for r in runs)


@pytest.mark.parametrize(
    ("env", "gib"),
    [
        ({}, 40),  # twice the health check's default 20 GiB
        ({"NURO_STAGING_MIN_FREE_GB": "1"}, 2),
        ({"NURO_STAGING_MIN_FREE_GB": "1", "NURO_STAGING_CACHE_KEEP_FREE_GB": "100"}, 100),
        ({"NURO_STAGING_CACHE_KEEP_FREE_GB": "0"}, 0),  # 0 = no free-space eviction
        ({"NURO_STAGING_CACHE_KEEP_FREE_GB": "lots"}, 40),
    ],
)
def test_keep_free_setting(env: dict[str, str], gib: int) -> None:
    assert cache_keep_free_bytes(env) == gib * GIB

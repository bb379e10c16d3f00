"""The node cache's eviction (``nodestage._evict``) and the epilog's free-space setting. Pure but for a temp dir:
the disk's free space is injected, so "the disk is nearly full" needs no full disk. Then root's work in a job's dir
(making it, caching its newest step) against what a hostile job user plants there: symlinks, FIFOs, hard links."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nuro.checkpoint import layout as L
from nuro.checkpoint.nodestage import _evict, prepare_job_dir
from nuro.healthcheck.uploads import cache_keep_free_bytes

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


# -- root in a job's dir: what a hostile job user leaves there ----------------------------------------------------
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the job's user needs root")


def _outside(tmp_path: Path) -> Path:
    """A root-owned directory outside every job, with a file: what planted symlinks aim at."""
    out = tmp_path / "etc-like"
    out.mkdir()
    (out / "passwd").write_bytes(b"root:x:0:0\n")
    return out


def _unchanged(out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == ["passwd"]
    st = (out / "passwd").stat()
    assert (st.st_uid, (out / "passwd").read_bytes()) == (0, b"root:x:0:0\n")
    assert out.stat().st_uid == 0


@needs_root
def test_prepare_job_dir_replaces_planted_symlinks_and_fifos_without_following_them(tmp_path: Path) -> None:
    root, out = tmp_path / "staging", _outside(tmp_path)
    job = root / "77"
    job.mkdir(parents=True)
    os.chown(job, NOBODY, NOBODY)
    (job / "restore").symlink_to(out)
    os.mkfifo(job / "ckpt")
    prepare_job_dir(root, "77", NOBODY, NOBODY)
    for sub in ("restore", "ckpt"):
        st = os.lstat(job / sub)
        assert stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_mode & 0o777) == (NOBODY, 0o700)
    _unchanged(out)


@needs_root
def test_prepare_job_dir_removes_a_dir_of_another_owner_without_following_its_links(tmp_path: Path) -> None:
    root, out = tmp_path / "staging", _outside(tmp_path)
    job = root / "78"
    job.mkdir(parents=True)
    os.chown(job, 1234, 1234)
    (job / "link").symlink_to(out)
    prepare_job_dir(root, "78", NOBODY, NOBODY)
    assert os.lstat(job).st_uid == NOBODY and not (job / "link").exists()
    _unchanged(out)


@needs_root
def test_own_tree_gives_away_only_single_link_regular_files_and_dirs(tmp_path: Path) -> None:
    from nuro.checkpoint.nodestage import _own_tree
    from nuro.safeio.safefs import Dir, open_dir

    out = _outside(tmp_path)
    top = tmp_path / "step"
    (top / "sub").mkdir(parents=True)
    (top / "sub" / "shard").write_bytes(b"x")
    (top / "link").symlink_to(out / "passwd")
    os.mkfifo(top / "pipe")
    os.link(out / "passwd", top / "hard")  # a hard link to a root file must never change owner
    d = Dir(open_dir(top), top)
    try:
        _own_tree(d, NOBODY, NOBODY)
    finally:
        d.close()
    assert sorted(p.name for p in top.iterdir()) == ["sub"]
    assert (top / "sub" / "shard").stat().st_uid == NOBODY
    _unchanged(out)


@needs_root
def test_the_epilog_caches_under_the_record_team_and_run_and_ignores_a_fifo_marker(tmp_path: Path) -> None:
    from nuro.checkpoint.nodestage import _cache
    from nuro.protocol import jobrecord
    from nuro.protocol.jobrecord import JobRecord

    root = tmp_path / "staging"
    prepare_job_dir(root, "80", NOBODY, NOBODY)
    rec = JobRecord(80, NOBODY, NOBODY, "nobody", "vision", "vision", "mine", 0, "n1", None)
    jobrecord.write(root, rec)
    ckpt = root / "80" / "ckpt"
    for step in (1, 2):
        (ckpt / L.step_name(step)).mkdir()
        (ckpt / L.step_name(step) / "shard").write_bytes(b"s%d" % step)
    (ckpt / L.step_name(1) / L.DONE_FILE).write_bytes(b"{}")
    os.mkfifo(ckpt / L.step_name(2) / L.DONE_FILE)  # would block a reader that opened it
    assert _cache(root, "80", rec, 4) == "vision/mine@1"
    cached = L.cache_dir(root, "vision", "mine") / L.step_name(1)
    assert (cached / "shard").read_bytes() == b"s1" and (cached / "shard").stat().st_uid == 0
    assert not (root / L.CACHE_DIR / "nlp").exists()

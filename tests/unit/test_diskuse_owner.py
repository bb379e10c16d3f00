"""Disk-full attribution counts what a job writes anywhere on the staging disk (issue 30, item 4).

Each test mounts a small tmpfs as "the staging disk" (as a node's NVMe would be: the staging root and a ``/tmp``
on the same file system), then acts as alice (uid 5001, team perception) would: write outside her own staging dir,
hide the bytes in a tree too deep or too wide for the health check's walk, or unlink a big file she keeps open.
bob (uid 5002, team prediction) runs an ordinary job on the same node. The attribution must name alice's job, with
an upper bound where the walk was cut, never bob's and never "node problem".
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from nuro.healthcheck import diskuse
from nuro.healthcheck.checks import disk_verdict
from nuro.healthcheck.run import HealthSettings, disk_free_bytes, disk_state
from nuro.protocol import jobrecord

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs and writes root-owned job records")

MIB = 1 << 20
ALICE, BOB = 5001, 5002
ALICE_JOB, BOB_JOB = 41, 42


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 96 MiB tmpfs: the staging disk. The staging root is ``<disk>/staging``, its ``/tmp`` is ``<disk>/tmp``."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0755", "t", str(mnt)], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here: no mount rights (a container without CAP_SYS_ADMIN)")
    try:
        (mnt / "staging").mkdir()
        (mnt / "tmp").mkdir(mode=0o1777)
        os.chmod(mnt / "tmp", 0o1777)
        for job, uid, team in ((ALICE_JOB, ALICE, "perception"), (BOB_JOB, BOB, "prediction")):
            jobrecord.write(mnt / "staging", jobrecord.JobRecord(job, uid, uid, f"u{uid}", team, team, None, 0, "n1",
                                                                  None))  # fmt: skip
            _mkdir(mnt / "staging" / str(job), uid)
        _write(mnt / "staging" / str(BOB_JOB) / "ckpt", 2 * MIB, BOB)  # bob's honest checkpoint
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _mkdir(path: Path, uid: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)


def _write(path: Path, n: int, uid: int) -> None:
    """A file of ``n`` real bytes owned by ``uid`` (what the user's job would leave)."""
    with open(path, "wb") as fh:
        fh.write(os.urandom(n))
    os.chown(path, uid, uid)


def _usage(disk: Path, **kw: object) -> dict[int, diskuse.JobDiskUse]:
    return {u.job_id: u for u in diskuse.running_job_usage(disk / "staging", **kw)}  # type: ignore[arg-type]


def _blamed(disk: Path, shortfall: int) -> tuple[list[int], bool]:
    """(jobs failed, node drained) for a floor ``shortfall`` bytes above the disk's free space now."""
    free = disk_free_bytes(str(disk / "staging"))
    settings = replace(HealthSettings(probe="none"), staging_root=str(disk / "staging"),
                       staging_min_free_bytes=free + shortfall, min_blame_bytes=MIB)  # fmt: skip
    got, usage = disk_state(settings, "n1", free, reader=lambda _p: free)
    verdict = disk_verdict(got, settings.staging_min_free_bytes, usage, settings.min_blame_bytes)
    return [u.job_id for u in verdict.jobs_to_fail], verdict.node_problem


def test_bytes_outside_the_jobs_dir_count_for_the_job_of_their_owner(disk: Path) -> None:
    """alice fills the disk's /tmp, not her staging dir: her job is failed, not bob's, and the node is not drained."""
    _write(disk / "tmp" / "scratch", 40 * MIB, ALICE)
    _write(disk / "staging" / "cache-junk", 1 * MIB, 0)  # root's own: never a job's
    use = _usage(disk)
    assert use[ALICE_JOB].bytes >= 40 * MIB and use[ALICE_JOB].complete, use
    assert 2 * MIB <= use[BOB_JOB].bytes < 3 * MIB, use
    assert _blamed(disk, 30 * MIB) == ([ALICE_JOB], False)


def test_a_tree_too_deep_to_walk_is_an_upper_bound_for_its_owner(disk: Path) -> None:
    """alice hides 40 MiB at the bottom of a tree deeper than the walk goes: the space the walk could not see is
    hers (upper bound), so her job is failed and the node stays up."""
    here = disk / "tmp" / "d"
    for _ in range(diskuse.MAX_OPEN_DIRS + 8):
        _mkdir(here, ALICE)
        here = here / "d"
    _mkdir(here, ALICE)
    _write(here / "hidden", 40 * MIB, ALICE)
    use = _usage(disk)
    assert use[ALICE_JOB].upper_bound and use[ALICE_JOB].bytes >= 40 * MIB, use
    assert use[BOB_JOB].complete and use[BOB_JOB].bytes < 3 * MIB, use
    assert _blamed(disk, 30 * MIB) == ([ALICE_JOB], False)


def test_an_entry_flood_is_an_upper_bound_for_its_owner(disk: Path) -> None:
    """alice puts more entries in one directory than the walk reads of one (with her big file among them): she
    gets the bound, the walk goes on and still counts bob exactly."""
    flood = disk / "staging" / str(ALICE_JOB) / "flood"
    _mkdir(flood, ALICE)
    _write(flood / "big", 40 * MIB, ALICE)
    for i in range(diskuse.MAX_DIR_ENTRIES + 500):
        (flood / f"f{i}").touch()
    use = _usage(disk)
    assert not use[ALICE_JOB].complete and use[ALICE_JOB].bytes >= 40 * MIB, use
    assert use[BOB_JOB].complete and 2 * MIB <= use[BOB_JOB].bytes < 3 * MIB, use
    assert _blamed(disk, 30 * MIB) == ([ALICE_JOB], False)


def test_the_budget_running_out_in_a_jobs_tree_blames_that_job(disk: Path) -> None:
    """An entry budget spent inside alice's many directories (each under the per-directory cap): the unseen space
    is hers, not the node's."""
    base = disk / "tmp" / "many"
    _mkdir(base, ALICE)
    for i in range(30):
        _mkdir(base / f"d{i}", ALICE)
        for j in range(100):
            (base / f"d{i}" / f"f{j}").touch()
    _write(base / "d29" / "big", 40 * MIB, ALICE)
    use = _usage(disk, max_entries=1500)
    assert not use[ALICE_JOB].complete and use[ALICE_JOB].bytes >= 40 * MIB, use


def test_a_file_unlinked_but_held_open_counts_for_its_owner(disk: Path) -> None:
    """alice writes 40 MiB, keeps it open and unlinks it: no walk sees it, /proc does."""
    path = disk / "tmp" / "gone"
    _write(path, 40 * MIB, ALICE)
    fd = os.open(path, os.O_RDONLY)
    try:
        path.unlink()
        use = _usage(disk)
        assert use[ALICE_JOB].bytes >= 40 * MIB and use[ALICE_JOB].complete, use
        assert _blamed(disk, 30 * MIB) == ([ALICE_JOB], False)
    finally:
        os.close(fd)


def test_an_ended_jobs_dir_and_other_file_systems_are_nobodys(disk: Path) -> None:
    """A handed-off (ended) job dir of alice's is in transit, not her running job's; a symlink out of the disk and
    a mount inside it are not followed: a disk full of that is the node's problem, no job is failed."""
    ended = disk / "staging" / "40"
    _mkdir(ended, ALICE)
    _write(ended / "last", 40 * MIB, ALICE)
    (disk / "tmp" / "link").symlink_to("/usr", target_is_directory=True)
    use = _usage(disk)
    assert use[ALICE_JOB].bytes < MIB and use[ALICE_JOB].complete, use
    assert _blamed(disk, 30 * MIB) == ([], True)

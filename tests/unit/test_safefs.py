"""nuro.safeio.safefs: the no-follow primitives root uses inside a job's dir, tried with what a hostile user plants
there."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from nuro.safeio import safefs
from nuro.safeio.safefs import UnsafePath


@pytest.fixture
def jobdir(tmp_path: Path) -> tuple[Path, int]:
    d = tmp_path / "job"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f.bin").write_bytes(b"data")
    fd = safefs.open_dir(d)
    yield d, fd
    os.close(fd)


def test_reads_a_regular_file_beneath(jobdir: tuple[Path, int]) -> None:
    _, fd = jobdir
    assert safefs.read_regular(fd, "sub/f.bin") == b"data"


def test_symlinked_directory_component_is_refused(jobdir: tuple[Path, int], tmp_path: Path) -> None:
    d, fd = jobdir
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "shadow").write_bytes(b"secret")
    (d / "evil").symlink_to(tmp_path / "etc")
    with pytest.raises(UnsafePath, match="symlink"):
        safefs.read_regular(fd, "evil/shadow")
    with pytest.raises(UnsafePath, match="symlink"):
        safefs.open_dir_beneath(fd, "evil")


def test_symlinked_leaf_is_refused(jobdir: tuple[Path, int], tmp_path: Path) -> None:
    d, fd = jobdir
    (tmp_path / "outside").write_bytes(b"x")
    (d / "link").symlink_to(tmp_path / "outside")
    with pytest.raises(UnsafePath, match="symlink"):
        safefs.read_regular(fd, "link")


def test_dev_zero_symlink_is_refused_not_read_forever(jobdir: tuple[Path, int]) -> None:
    d, fd = jobdir
    (d / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnsafePath, match="symlink"):
        safefs.read_regular(fd, "zero")


def test_fifo_is_refused_without_blocking(jobdir: tuple[Path, int]) -> None:
    d, fd = jobdir
    os.mkfifo(d / "pipe")
    done = threading.Event()
    errors: list[BaseException] = []

    def go() -> None:
        try:
            safefs.read_regular(fd, "pipe")
        except BaseException as exc:
            errors.append(exc)
        done.set()

    threading.Thread(target=go, daemon=True).start()
    assert done.wait(5), "opening a FIFO blocked"
    assert isinstance(errors[0], UnsafePath) and "FIFO" in str(errors[0])


def test_device_is_refused(tmp_path: Path) -> None:
    fd = safefs.open_dir("/dev")
    try:
        with pytest.raises(UnsafePath, match="character device"):
            safefs.open_regular("zero", dir_fd=fd)
    finally:
        os.close(fd)


def test_oversize_file_is_refused(jobdir: tuple[Path, int]) -> None:
    d, fd = jobdir
    (d / "big").write_bytes(b"a" * 2000)
    with pytest.raises(UnsafePath, match="larger than 1000"):
        safefs.read_regular(fd, "big", max_bytes=1000)
    assert safefs.read_regular(fd, "big", max_bytes=2000) == b"a" * 2000


def test_directory_where_a_file_was_expected(jobdir: tuple[Path, int]) -> None:
    _, fd = jobdir
    with pytest.raises(UnsafePath, match="directory"):
        safefs.read_regular(fd, "sub")


def test_file_where_a_directory_was_expected(jobdir: tuple[Path, int]) -> None:
    _, fd = jobdir
    with pytest.raises(UnsafePath, match="not a directory"):
        safefs.open_dir_beneath(fd, "sub/f.bin")


def test_bad_components_are_refused(jobdir: tuple[Path, int]) -> None:
    _, fd = jobdir
    for bad in ("../x", "a//b", "/etc/passwd", "./f", ""):
        with pytest.raises(UnsafePath):
            safefs.open_beneath(fd, bad)


def test_write_atomic_replaces_a_planted_symlink_never_writes_through_it(
    jobdir: tuple[Path, int], tmp_path: Path
) -> None:
    d, fd = jobdir
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (d / "marker").symlink_to(victim)
    (d / f".marker.tmp.{os.getpid()}.{threading.get_ident()}").symlink_to(victim)  # the temp name planted too
    safefs.write_atomic_at(fd, "marker", b"new", 0o644)
    assert victim.read_bytes() == b"keep me"
    assert not (d / "marker").is_symlink() and (d / "marker").read_bytes() == b"new"
    assert (d / "marker").stat().st_mode & 0o777 == 0o644


def test_mkdir_at_refuses_a_symlink_at_the_name(jobdir: tuple[Path, int], tmp_path: Path) -> None:
    d, fd = jobdir
    (d / "restore").symlink_to(tmp_path)
    with pytest.raises(UnsafePath, match="symlink"):
        safefs.mkdir_at(fd, "restore")
    new = safefs.mkdir_at(fd, "ckpt", 0o700)
    os.close(new)
    assert (d / "ckpt").is_dir()


def test_remove_at_never_follows_a_symlink(jobdir: tuple[Path, int], tmp_path: Path) -> None:
    d, fd = jobdir
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"x")
    (d / "sub" / "link").symlink_to(outside)
    (d / "sub" / "deep").mkdir()
    (d / "sub" / "deep" / "link2").symlink_to(outside / "precious")
    os.mkfifo(d / "sub" / "pipe")
    safefs.remove_at(fd, "sub")
    assert not (d / "sub").exists()
    assert (outside / "precious").read_bytes() == b"x"


def test_list_dir_reports_symlinks_as_such(jobdir: tuple[Path, int], tmp_path: Path) -> None:
    d, fd = jobdir
    (d / "l").symlink_to(tmp_path)
    by_name = {e.name: e for e in safefs.list_dir(fd)}
    assert by_name["l"].is_symlink and not by_name["l"].is_dir
    assert by_name["sub"].is_dir


def test_walk_files_does_not_enter_symlinked_dirs(jobdir: tuple[Path, int], tmp_path: Path) -> None:
    d, fd = jobdir
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_bytes(b"")
    (d / "sub" / "l").symlink_to(tmp_path / "o")
    paths = [p for p, _ in safefs.walk_files(fd)]
    assert paths == ["sub", "sub/f.bin", "sub/l"]


def test_open_dir_refuses_a_symlinked_root(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePath, match="symlink"):
        safefs.open_dir(tmp_path / "l")


def test_remove_at_a_very_deep_tree_needs_neither_recursion_nor_an_fd_per_level(tmp_path: Path) -> None:
    top = tmp_path / "deep"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        cur = os.dup(fd)
        for _ in range(1500):  # deeper than Python's recursion limit
            os.mkdir("d", dir_fd=cur)
            os.close(os.open("f", os.O_CREAT | os.O_WRONLY, dir_fd=cur))
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            os.close(cur)
            cur = nxt
        os.close(cur)
    finally:
        os.close(fd)
    with safefs.opened(safefs.open_dir(tmp_path)) as root:
        safefs.remove_at(root, "deep")
    assert not top.exists()


def _writer_during_rmdir(monkeypatch: pytest.MonkeyPatch, target: str, times: int) -> None:
    """os.rmdir of ``target`` first finds a file written into it meanwhile, ``times`` times (as the node agent's
    upload worker may write a marker into a step dir while the epilog removes the job's dir)."""
    real = os.rmdir
    left = [times]

    def rmdir(path, *, dir_fd=None):  # noqa: ANN001, ANN202
        if path == target and left[0] > 0:
            left[0] -= 1
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
            try:
                os.close(os.open(f"marker-{left[0]}", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
            finally:
                os.close(fd)
        return real(path, dir_fd=dir_fd)

    monkeypatch.setattr(safefs.os, "rmdir", rmdir)


def test_remove_at_empties_again_a_directory_written_into_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI-like run of make test: the epilog's removal failed with 'Directory not empty' and left a job's dir."""
    (tmp_path / "job" / "step-1").mkdir(parents=True)
    (tmp_path / "job" / "step-1" / "a.distcp").write_bytes(b"x")
    _writer_during_rmdir(monkeypatch, "step-1", 2)
    fd = safefs.open_dir(tmp_path)
    try:
        safefs.remove_at(fd, "job")
    finally:
        os.close(fd)
    assert not (tmp_path / "job").exists()


def test_remove_at_gives_up_on_a_writer_that_never_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "job" / "step-1").mkdir(parents=True)
    _writer_during_rmdir(monkeypatch, "step-1", 100)
    fd = safefs.open_dir(tmp_path)
    try:
        with pytest.raises(OSError, match="not empty"):
            safefs.remove_at(fd, "job")
    finally:
        os.close(fd)

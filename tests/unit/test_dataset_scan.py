"""What a snapshot accepts from the file system: regular files only, acceptable names, nothing empty."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from nuro.datasets.errors import InvalidInput
from nuro.datasets.snapshot import scan


def test_scan_lists_regular_files_with_relative_posix_paths_sizes_and_modes(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x.bin").write_bytes(b"12345")
    (tmp_path / "top.txt").write_text("hi")
    (tmp_path / "top.txt").chmod(0o600)
    (tmp_path / "empty-dir").mkdir()
    got = sorted(scan(tmp_path), key=lambda f: f.path)
    assert [(f.path, f.size, f.mode) for f in got] == [("a/b/x.bin", 5, 0o644), ("top.txt", 2, 0o600)]


def test_symlinks_are_refused_and_listed(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("x")
    (tmp_path / "link").symlink_to("/etc/passwd")
    (tmp_path / "dirlink").symlink_to(tmp_path)
    with pytest.raises(InvalidInput) as err:
        scan(tmp_path)
    msg = str(err.value)
    assert "2 entries" in msg and "link: symlink to '/etc/passwd'" in msg and "dirlink: symlink" in msg
    assert "cp -rL" in msg


def test_special_files_and_bad_names_are_refused(tmp_path: Path) -> None:
    (tmp_path / "ok").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "new\nline").write_text("x")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(tmp_path / "sock"))
        with pytest.raises(InvalidInput) as err:
            scan(tmp_path)
    msg = str(err.value)
    assert "fifo: not a regular file" in msg and "sock: not a regular file" in msg
    assert "'new\\nline': contains a control character" in msg


def test_non_utf8_names_are_refused(tmp_path: Path) -> None:
    (tmp_path / "ok").write_text("x")
    with open(os.path.join(os.fsencode(tmp_path), b"bad\xff"), "wb") as fh:
        fh.write(b"x")
    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        scan(tmp_path)


def test_empty_trees_and_non_directories_are_refused(tmp_path: Path) -> None:
    (tmp_path / "only-dirs" / "x").mkdir(parents=True)
    with pytest.raises(InvalidInput, match="no files"):
        scan(tmp_path / "only-dirs")
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidInput, match="not a directory"):
        scan(tmp_path / "file")

"""Root's view of a job's staging dir (``JobDir``/``StepDir``): nothing followed, nothing blocks, nothing big read.

Each test plants what a hostile job could (a FIFO, a symlink, a huge file) and checks the refusal is immediate;
``signal.alarm`` turns a regression that blocks into a failure instead of a hung test run.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.staging import MAX_REQUEST_BYTES, JobDir
from nuro.checkpoint.upload import prune_local
from nuro.safeio.safefs import UnsafePath


@pytest.fixture(autouse=True)
def no_blocking() -> Iterator[None]:
    def fail(*_: object) -> None:
        raise TimeoutError("blocked on a job's file")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _step(root: Path, job: str = "42", step: int = 1) -> Path:
    d = root / job / "ckpt" / L.step_name(step)
    d.mkdir(parents=True)
    return d


def test_fifo_request_lock_and_marker_are_refused_at_once(tmp_path: Path) -> None:
    d = _step(tmp_path)
    os.mkfifo(d / L.request_file(0))
    os.mkfifo(d / L.lock_file(0))
    os.mkfifo(d / L.DONE_FILE)
    with JobDir.open(tmp_path, "42") as jd:
        [(step, name)] = jd.step_names()
        sd = jd.open_step(step, name)
        assert sd.parts == [0] and sd.is_pending  # a FIFO at the done marker marks nothing
        with pytest.raises(ManifestError, match="not a regular file"):
            sd.read_request(0)
        with pytest.raises(UnsafePath, match="lock file is not a regular file"), sd.claimed(0):
            pass
        sd.mark(L.DONE_FILE, {"state": "committed"})  # replaces the FIFO, never opens it
        assert sd.is_done


def test_a_huge_request_is_refused_without_reading_it(tmp_path: Path) -> None:
    d = _step(tmp_path)
    with open(d / L.request_file(0), "wb") as fh:
        fh.truncate(MAX_REQUEST_BYTES * 64)
    with JobDir.open(tmp_path, "42") as jd:
        sd = jd.open_step(*jd.step_names()[0])
        with pytest.raises(ManifestError, match="larger than"):
            sd.read_request(0)


def test_symlinked_job_ckpt_and_step_dirs_are_refused(tmp_path: Path) -> None:
    elsewhere = _step(tmp_path / "other")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "42").symlink_to(elsewhere.parents[1])
    with pytest.raises(UnsafePath, match="symlink"):
        JobDir.open(tmp_path / "root", "42")
    (tmp_path / "root" / "43").mkdir()
    (tmp_path / "root" / "43" / "ckpt").symlink_to(elsewhere.parent)
    with pytest.raises(UnsafePath, match="symlink"):
        JobDir.open(tmp_path / "root", "43")
    ckpt = tmp_path / "root" / "44" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / L.step_name(1)).symlink_to(elsewhere)
    with JobDir.open(tmp_path / "root", "44") as jd:
        assert jd.step_names() == []  # a symlink is not a step dir
        with pytest.raises(UnsafePath, match="symlink"):
            jd.open_step(1, L.step_name(1))  # swapped after the listing: refused too


def test_shard_paths_never_leave_the_step_dir(tmp_path: Path) -> None:
    d = _step(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only")
    (d / "sub").symlink_to(tmp_path)
    (d / "leaf").symlink_to(secret)
    with JobDir.open(tmp_path, "42") as jd:
        sd = jd.open_step(*jd.step_names()[0])
        for rel in ("sub/secret", "leaf", "../secret"):
            with pytest.raises(OSError):
                os.close(sd.open_file(rel))


def test_prune_local_removes_old_steps_without_following_symlinks(tmp_path: Path) -> None:
    keep_me = tmp_path / "outside"
    keep_me.mkdir()
    (keep_me / "precious").write_bytes(b"x")
    old = _step(tmp_path, step=1)
    (old / "link").symlink_to(keep_me)
    (old / L.DONE_FILE).write_text("{}")
    new = _step(tmp_path, step=2)
    with JobDir.open(tmp_path, "42") as jd:
        assert prune_local(jd, 2) == [1]
    assert not old.exists() and new.exists() and (keep_me / "precious").read_bytes() == b"x"

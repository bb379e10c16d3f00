"""Local verification and the staging protocol on a real file system (no store): hashing, symlink refusal, atomic
markers, request hand-off, and the upload lock that lets two workers share a node."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from nuro.checkpoint import layout as L
from nuro.checkpoint.manifest import FileEntry, UploadRequest
from nuro.checkpoint.staging import StagedStep, claimed, job_steps, mark, read_request, write_request
from nuro.checkpoint.verify import open_beneath, scan_dir, verify_local
from nuro.safeio.atomic import write_atomic


def _tree(root: Path) -> tuple[FileEntry, ...]:
    (root / "sub").mkdir(parents=True)
    (root / ".metadata").write_bytes(b"meta")
    (root / "sub" / "__0_0.distcp").write_bytes(b"x" * 1000)
    (root / L.request_file(0)).write_bytes(b"{}")  # control files are not part of the checkpoint
    (root / L.DONE_FILE).write_bytes(b"{}")
    (root / f".{L.request_file(1)}.tmp.12.34").write_bytes(b"{")  # another node's request being written
    return scan_dir(root)


def test_scan_hashes_every_file_but_control_files(tmp_path: Path) -> None:
    entries = _tree(tmp_path)
    assert [e.path for e in entries] == [".metadata", "sub/__0_0.distcp"]
    assert entries[1] == FileEntry("sub/__0_0.distcp", 1000, hashlib.sha256(b"x" * 1000).hexdigest())
    assert verify_local(tmp_path, entries) == []


def test_verify_names_missing_short_and_altered_files(tmp_path: Path) -> None:
    entries = _tree(tmp_path)
    (tmp_path / ".metadata").write_bytes(b"META")  # same size, other bytes
    (tmp_path / "sub" / "__0_0.distcp").write_bytes(b"x" * 10)
    problems = {p.path: p.why for p in verify_local(tmp_path, entries)}
    assert "sha256" in problems[".metadata"] and "size 10" in problems["sub/__0_0.distcp"]
    (tmp_path / ".metadata").unlink()
    assert "missing" in {p.path: p.why for p in verify_local(tmp_path, entries)}[".metadata"]


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"root only")
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "leaf").symlink_to(secret)
    (root / "dir").symlink_to(tmp_path)
    for rel in ("leaf", "dir/secret"):
        with pytest.raises(OSError):
            os.close(open_beneath(root, rel))
    entry = FileEntry("dir/secret", 9, hashlib.sha256(b"root only").hexdigest())
    assert verify_local(root, [entry])  # a symlinked copy never verifies
    with pytest.raises(OSError, match="symlink"):
        scan_dir(root)


def test_write_atomic_replaces_a_planted_symlink_instead_of_following_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (tmp_path / "marker").symlink_to(victim)
    write_atomic(tmp_path / "marker", b"new")
    assert victim.read_text() == "keep me" and (tmp_path / "marker").read_bytes() == b"new"


def test_request_hand_off_and_states(tmp_path: Path) -> None:
    step_dir = tmp_path / "job" / "ckpt" / L.step_name(3)
    entries = _tree(step_dir)
    (step_dir / L.request_file(0)).unlink()
    (step_dir / L.DONE_FILE).unlink()
    (step_dir / f".{L.request_file(1)}.tmp.12.34").unlink()
    (tmp_path / "job" / "ckpt" / L.step_name(4)).mkdir()  # torn: no request
    req = UploadRequest("vision", "r", 3, "job", 0, 1, 2, 2, entries, "t")
    write_request(step_dir, req)
    assert read_request(step_dir, 1) == req
    steps = job_steps(tmp_path / "job")
    assert [(s.step, s.is_pending, s.parts) for s in steps] == [(3, True, [1]), (4, False, [])]
    write_request(step_dir, UploadRequest("vision", "r", 3, "job", 0, 0, 2, 2, entries, "t"))
    assert job_steps(tmp_path / "job")[0].parts == [0, 1]  # two nodes sharing a file system: two requests
    mark(step_dir, L.DONE_FILE, {"state": "committed"})
    assert not StagedStep(tmp_path / "job", 3, step_dir).is_pending


def test_only_one_worker_holds_a_step(tmp_path: Path) -> None:
    # a second open file description is excluded by flock, even in the same process
    with claimed(tmp_path, 0) as first, claimed(tmp_path, 0) as second, claimed(tmp_path, 1) as other:
        assert first and not second and other
    with claimed(tmp_path) as again:
        assert again


def test_copies_into_a_job_dir_never_follow_a_planted_link_and_never_block(tmp_path: Path) -> None:
    """What root does when it places verified files into a job's restore dir, against what the job planted."""
    import threading

    from nuro.checkpoint.verify import copy_verified, write_verified
    from nuro.safeio.safefs import Dir, UnsafePath, open_dir

    outside = tmp_path / "etc-like"
    outside.mkdir()
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.distcp").write_bytes(b"abc")
    entry = FileEntry("sub/a.distcp", 3, hashlib.sha256(b"abc").hexdigest())
    dest_path = tmp_path / "restore"
    dest_path.mkdir()
    (dest_path / "sub").symlink_to(outside)  # the job swapped the shard's dir for a link
    dest = Dir(open_dir(dest_path), dest_path)
    try:
        with pytest.raises(UnsafePath, match="symlink"):
            copy_verified(src, entry, dest)
        assert list(outside.iterdir()) == []
        (dest_path / "sub").unlink()
        assert copy_verified(src, entry, dest) is None and (dest_path / "sub" / "a.distcp").read_bytes() == b"abc"
        # sources that are a FIFO or a /dev/zero link: a problem at once, never a read that blocks or never ends
        os.unlink(src / "sub" / "a.distcp")
        os.mkfifo(src / "sub" / "a.distcp")
        done = threading.Event()
        threading.Thread(target=lambda: (copy_verified(src, entry, dest), done.set()), daemon=True).start()
        assert done.wait(5), "a FIFO source blocked the copy"
        os.unlink(src / "sub" / "a.distcp")
        (src / "sub" / "a.distcp").symlink_to("/dev/zero")
        assert "unreadable" in copy_verified(src, entry, dest).why
        # more bytes than the manifest says: refused without writing them all
        assert "more than 3" in write_verified(dest, entry, iter([b"abcd"])).why
    finally:
        dest.close()

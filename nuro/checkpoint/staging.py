"""The node-local staging protocol between a training job and the upload worker that outlives it.

A step directory ``<root>/<job_id>/ckpt/step-<N>/`` moves through these states, each marked by one file that is
written atomically (temp file, fsync, ``os.replace``, fsync of the directory), so a crash at any moment leaves one
of them and never a half-written marker:

| marker                      | meaning                                                   | who writes it |
|-----------------------------|-----------------------------------------------------------|---------------|
| (none)                      | DCP is writing, or died writing: never uploaded           | —             |
| ``.upload-<part>.json``     | this node's share is complete; upload it (the request)    | the job       |
| ``.upload.done.json``       | its manifest is committed in S3                            | a worker      |
| ``.upload.abandoned.json``  | given up at the epilog's deadline (``incomplete.json``)   | the epilog    |

Two workers (the node agent's and a job's inline one) may scan the same directory. A worker handles a step only
while it holds ``flock`` on ``.upload-<part>.lock``: the kernel drops the lock when its holder dies, so a crashed worker
never strands a request, and a second worker just skips it this round. Each node (part) has its own request, lock
and state file, so nodes sharing one file system (the emulated dev cluster) never overwrite each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.layout import (
    ABANDONED_FILE,
    DONE_FILE,
    job_ckpt_dir,
    lock_file,
    parse_request_file,
    parse_step_name,
    request_file,
)
from nuro.checkpoint.manifest import UploadRequest, dumps, parse_request


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` so readers see the old state or the whole new file, even across a crash."""
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    # O_EXCL|O_NOFOLLOW: root (epilog, agent) writes markers into a directory the job's user owns, where a planted
    # symlink at the temp name must not redirect the write; rename then replaces a symlink at ``path`` itself.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except FileExistsError:
        os.unlink(tmp)
        fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_request(step_dir: Path, req: UploadRequest) -> Path:
    """Hand a finished share of a checkpoint to the upload worker (the last thing the job does for this step)."""
    path = step_dir / request_file(req.part)
    write_atomic(path, dumps(req.to_json_obj()))
    return path


def read_request(step_dir: Path, part: int = 0) -> UploadRequest:
    path = step_dir / request_file(part)
    req = parse_request(path.read_bytes(), what=str(path))
    if req.part != part:
        raise ManifestError(f"{path}: names part {req.part}, stored as part {part}")
    return req


def request_parts(step_dir: Path) -> list[int]:
    """The parts (nodes) that left a request in ``step_dir``."""
    try:
        names = os.listdir(step_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p for p in map(parse_request_file, names) if p is not None)


@dataclass(frozen=True)
class StagedStep:
    """A step directory of one job on this node."""

    job_dir: Path
    step: int
    path: Path

    @property
    def job_id(self) -> str:
        return self.job_dir.name

    @property
    def parts(self) -> list[int]:
        """Parts with a request here (one on a real node; several where nodes share the file system)."""
        return request_parts(self.path)

    @property
    def has_request(self) -> bool:
        return bool(self.parts)

    @property
    def is_done(self) -> bool:
        return (self.path / DONE_FILE).is_file()

    @property
    def is_abandoned(self) -> bool:
        return (self.path / ABANDONED_FILE).is_file()

    @property
    def is_pending(self) -> bool:
        """Requested, and neither committed nor given up."""
        return self.has_request and not self.is_done and not self.is_abandoned


def job_steps(job_dir: Path) -> list[StagedStep]:
    """The step directories of one job, by step."""
    out: list[StagedStep] = []
    ckpt = job_ckpt_dir(job_dir)
    if ckpt.is_symlink():
        return []  # a job dir is ours to read only through real directories (see nuro.checkpoint.verify)
    try:
        names = os.listdir(ckpt)
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        step = parse_step_name(name)
        path = ckpt / name
        if step is not None and path.is_dir() and not path.is_symlink():
            out.append(StagedStep(job_dir, step, path))
    return sorted(out, key=lambda s: s.step)


def job_dirs(staging_root: Path) -> list[Path]:
    """Every job directory under the staging root (the node cache excluded)."""
    try:
        entries = sorted(os.scandir(staging_root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith((".", "cache"))]


def mark(step_dir: Path, marker: str, info: dict[str, Any]) -> None:
    write_atomic(step_dir / marker, json.dumps(info, sort_keys=True).encode())


def read_marker(step_dir: Path, marker: str) -> dict[str, Any] | None:
    try:
        data = json.loads((step_dir / marker).read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def claimed(step_dir: Path, part: int = 0) -> Iterator[bool]:
    """Hold the upload lock of one part for the block; yields False (holding nothing) when another worker has it."""
    try:
        fd = os.open(step_dir / lock_file(part), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def safe_request(step: StagedStep, part: int = 0) -> UploadRequest | None:
    """The request of ``part``, or None if it is not there; a malformed one raises ManifestError."""
    try:
        return read_request(step.path, part)
    except FileNotFoundError:
        return None
    except ManifestError:
        raise

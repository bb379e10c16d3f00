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

Root (the node agent's worker, the epilog) works in these directories, which the job's user owns and may change at
any moment, only through ``StepDir``/``JobDir``: directory fds opened one component at a time with ``O_NOFOLLOW``
(``nuro.safeio.safefs``), files opened ``O_NONBLOCK`` that must ``fstat`` as regular files, reads capped in size. A
symlink, FIFO or device where a request, marker, state or lock file belongs is refused (``UnsafePath``), never followed,
never waited on. The path-based helpers below (``StagedStep``, ``read_request``, ...) are for the job's own side
and read the same way.

Two workers (the node agent's and a job's inline one) may scan the same directory. A worker handles a step only
while it holds ``flock`` on ``.upload-<part>.lock``: the kernel drops the lock when its holder dies, so a crashed worker
never strands a request, and a second worker just skips it this round. Each node (part) has its own request, lock
and state file, so nodes sharing one file system (the emulated dev cluster) never overwrite each other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.layout import (
    ABANDONED_FILE,
    CKPT_DIR,
    DONE_FILE,
    job_ckpt_dir,
    lock_file,
    parse_request_file,
    parse_step_name,
    request_file,
)
from nuro.checkpoint.manifest import UploadRequest, dumps, parse_request
from nuro.safeio import safefs
from nuro.safeio.atomic import write_atomic
from nuro.safeio.safefs import UnsafePath

#: An upload request lists one node's files of one step (~150 bytes each): 16 MiB is ~100k files, far above DCP.
MAX_REQUEST_BYTES = 16 << 20
#: Markers are tiny; the state file lists the files already stored (like a request).
MAX_MARKER_BYTES = 64 << 10
MAX_STATE_BYTES = MAX_REQUEST_BYTES


def write_request(step_dir: Path, req: UploadRequest) -> Path:
    """Hand a finished share of a checkpoint to the upload worker (the last thing the job does for this step)."""
    path = step_dir / request_file(req.part)
    write_atomic(path, dumps(req.to_json_obj()))
    return path


def _parse_request_bytes(data: bytes, part: int, what: str) -> UploadRequest:
    req = parse_request(data, what=what)
    if req.part != part:
        raise ManifestError(f"{what}: names part {req.part}, stored as part {part}")
    return req


def read_request(step_dir: Path, part: int = 0) -> UploadRequest:
    """The request of ``part`` in ``step_dir`` (no symlink followed, regular file, at most MAX_REQUEST_BYTES)."""
    with safefs.opened(safefs.open_dir(step_dir)) as fd:
        data = safefs.read_regular(fd, request_file(part), MAX_REQUEST_BYTES)
    return _parse_request_bytes(data, part, str(step_dir / request_file(part)))


def request_parts(step_dir: Path) -> list[int]:
    """The parts (nodes) that left a request in ``step_dir``."""
    try:
        names = os.listdir(step_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(p for p in map(parse_request_file, names) if p is not None)


@dataclass(frozen=True)
class StagedStep:
    """A step directory of one job on this node, by path: the job's own view (and tests). Root uses ``StepDir``."""

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
        return _is_regular(self.path / DONE_FILE)

    @property
    def is_abandoned(self) -> bool:
        return _is_regular(self.path / ABANDONED_FILE)

    @property
    def is_pending(self) -> bool:
        """Requested, and neither committed nor given up."""
        return self.has_request and not self.is_done and not self.is_abandoned


def _is_regular(path: Path) -> bool:
    """A marker counts only as a regular file (a planted symlink or FIFO at its name marks nothing)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def job_steps(job_dir: Path) -> list[StagedStep]:
    """The step directories of one job, by step (real directories only: a symlinked ``ckpt`` or step is skipped)."""
    out: list[StagedStep] = []
    ckpt = job_ckpt_dir(job_dir)
    try:
        fd = safefs.open_dir(ckpt)
    except (OSError, ValueError):
        return []
    with safefs.opened(fd):
        entries = safefs.list_dir(fd)
    for e in entries:
        step = parse_step_name(e.name)
        if step is not None and e.is_dir:
            out.append(StagedStep(job_dir, step, ckpt / e.name))
    return sorted(out, key=lambda s: s.step)


def job_dirs(staging_root: Path) -> list[Path]:
    """Every job directory under the staging root (the node cache and dot-dirs such as ``.jobs`` excluded)."""
    try:
        entries = sorted(os.scandir(staging_root), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False) and not e.name.startswith((".", "cache"))]


def mark(step_dir: Path, marker: str, info: dict[str, Any]) -> None:
    write_atomic(step_dir / marker, json.dumps(info, sort_keys=True).encode())


def read_marker(step_dir: Path, marker: str) -> dict[str, Any] | None:
    """A marker's JSON object, or None when it is missing, unreadable, not a regular file or not an object."""
    try:
        with safefs.opened(safefs.open_dir(step_dir)) as fd:
            return _json_object(safefs.read_regular(fd, marker, MAX_STATE_BYTES))
    except (OSError, ValueError):
        return None


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@contextlib.contextmanager
def _flocked(dir_fd: int, name: str) -> Iterator[bool]:
    """Hold ``flock`` on the lock file ``name`` in ``dir_fd`` for the block; False when another holder has it.
    Opened ``O_NOFOLLOW|O_NONBLOCK`` and required to be a regular file: a FIFO, symlink or device planted at the
    name raises UnsafePath at once (never blocks, never touches anything else)."""
    with _flocked_fd(dir_fd, name) as fd:
        yield fd is not None


@contextlib.contextmanager
def _flocked_fd(dir_fd: int, name: str) -> Iterator[int | None]:
    """``_flocked`` yielding the fd that holds the lock (None: not ours). A ``dup`` of it keeps the lock after the
    block (flock belongs to the open file description): the upload worker's background upload holds a step so."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except PermissionError:  # root's worker made it (0600): root has the step, this (user's) worker skips it
        yield None
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(name, "the lock file is a symlink") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(name, f"the lock file is not a regular file (mode {stat.filemode(st.st_mode)})")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def claimed(step_dir: Path, part: int = 0) -> Iterator[bool]:
    """Hold the upload lock of one part for the block; yields False (holding nothing) when another worker has it
    or the lock cannot be taken safely."""
    try:
        dfd = safefs.open_dir(step_dir)
    except OSError:
        yield False
        return
    try:
        try:
            with _flocked(dfd, lock_file(part)) as mine:
                yield mine
        except UnsafePath:
            yield False
    finally:
        os.close(dfd)


def safe_request(step: StagedStep, part: int = 0) -> UploadRequest | None:
    """The request of ``part``, or None if it is not there; a malformed or unsafe one (symlink, FIFO, too big)
    raises ManifestError."""
    try:
        return read_request(step.path, part)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"{step.path / request_file(part)}: {exc}") from None


# -- root's view: everything through directory fds --------------------------------------------------------------
@dataclass
class StepDir:
    """One step directory opened for root's work: every read and write goes through ``fd`` (no-follow), never a
    path; ``where`` is for messages only. Closed by the ``JobDir`` that opened it."""

    job_id: str
    step: int
    name: str
    fd: int
    where: str

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    @property
    def parts(self) -> list[int]:
        return sorted(p for p in map(parse_request_file, self.names()) if p is not None)

    @property
    def has_request(self) -> bool:
        return bool(self.parts)

    def has_marker(self, marker: str) -> bool:
        st = safefs.lstat_at(self.fd, marker)
        return st is not None and stat.S_ISREG(st.st_mode)

    @property
    def is_done(self) -> bool:
        return self.has_marker(DONE_FILE)

    @property
    def is_abandoned(self) -> bool:
        return self.has_marker(ABANDONED_FILE)

    @property
    def is_pending(self) -> bool:
        return self.has_request and not self.is_done and not self.is_abandoned

    def read(self, name: str, max_bytes: int) -> bytes | None:
        """A regular file's bytes (None if missing); a symlink, FIFO, device or oversized file raises UnsafePath."""
        try:
            return safefs.read_regular(self.fd, name, max_bytes)
        except FileNotFoundError:
            return None

    def read_request(self, part: int) -> UploadRequest | None:
        """The request of ``part`` (None if missing); an unsafe or malformed one raises ManifestError."""
        try:
            data = self.read(request_file(part), MAX_REQUEST_BYTES)
        except OSError as exc:
            raise ManifestError(f"{self.where}/{request_file(part)}: {exc}") from None
        return None if data is None else _parse_request_bytes(data, part, f"{self.where}/{request_file(part)}")

    def read_json(self, name: str, max_bytes: int = MAX_MARKER_BYTES) -> dict[str, Any] | None:
        """A marker/state file's JSON object; None when missing or not an object. Unsafe raises UnsafePath."""
        data = self.read(name, max_bytes)
        return None if data is None else _json_object(data)

    def write(self, name: str, data: bytes) -> None:
        safefs.write_atomic_at(self.fd, name, data, 0o644)

    def mark(self, marker: str, info: dict[str, Any]) -> None:
        self.write(marker, json.dumps(info, sort_keys=True).encode())

    def claimed(self, part: int) -> contextlib.AbstractContextManager[bool]:
        """The upload lock of ``part`` (see ``_flocked``): an unsafe lock file raises UnsafePath."""
        return _flocked(self.fd, lock_file(part))

    def claimed_fd(self, part: int) -> contextlib.AbstractContextManager[int | None]:
        """``claimed`` yielding the lock's fd (None: another worker has it); see ``_flocked_fd``."""
        return _flocked_fd(self.fd, lock_file(part))

    def open_file(self, relpath: str) -> int:
        """A read fd of a checkpoint file below this step, no symlink followed on the way, regular files only."""
        return safefs.open_beneath(self.fd, relpath)


@dataclass
class JobDir:
    """A job's staging dir opened for root: ``<staging_root>/<job_id>`` and its ``ckpt`` as no-follow fds.

    Use as a context manager (``with JobDir.open(root, job_id) as jd``); it closes every ``StepDir`` it handed out.
    ``ckpt_fd`` is None when the job has no real ``ckpt`` directory (nothing to upload)."""

    job_id: str
    where: str
    job_fd: int
    ckpt_fd: int | None
    _opened: list[StepDir] = field(default_factory=list)

    @classmethod
    def open(cls, staging_root: Path, job_id: str) -> JobDir:
        """Open ``job_id`` below the (admin-configured, root-owned) staging root; a symlink anywhere raises
        UnsafePath, a missing dir FileNotFoundError."""
        with safefs.opened(safefs.open_dir(staging_root)) as root_fd:
            return cls.open_at(root_fd, job_id, str(staging_root / job_id))

    @classmethod
    def open_path(cls, job_dir: Path) -> JobDir:
        """Open a job dir given by path (a job's inline worker: its own dir, as its own user)."""
        return cls._from_fd(job_dir.name, str(job_dir), safefs.open_dir(job_dir))

    @classmethod
    def open_at(cls, root_fd: int, job_id: str, where: str) -> JobDir:
        return cls._from_fd(job_id, where, safefs.open_dir(job_id, dir_fd=root_fd))

    @classmethod
    def _from_fd(cls, job_id: str, where: str, job_fd: int) -> JobDir:
        try:
            ckpt_fd: int | None = safefs.open_dir(CKPT_DIR, dir_fd=job_fd)
        except FileNotFoundError:
            ckpt_fd = None
        except BaseException:
            os.close(job_fd)
            raise
        return cls(job_id, where, job_fd, ckpt_fd)

    def __enter__(self) -> JobDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for s in self._opened:
            with contextlib.suppress(OSError):
                os.close(s.fd)
        self._opened.clear()
        for fd in (self.ckpt_fd, self.job_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.ckpt_fd = None

    def step_names(self) -> list[tuple[int, str]]:
        """(step, dir name) of every step entry that is a real directory, by step."""
        if self.ckpt_fd is None:
            return []
        out = [(parse_step_name(e.name), e.name) for e in safefs.list_dir(self.ckpt_fd) if e.is_dir]
        return sorted((s, n) for s, n in out if s is not None)

    def open_step(self, step: int, name: str) -> StepDir:
        """The step dir as an fd; swapped for a symlink meanwhile raises UnsafePath."""
        assert self.ckpt_fd is not None
        fd = safefs.open_dir(name, dir_fd=self.ckpt_fd)
        s = StepDir(self.job_id, step, name, fd, f"{self.where}/ckpt/{name}")
        self._opened.append(s)
        return s

    def close_step(self, sd: StepDir) -> None:
        """Close one step's fd now: a job with 100 000 step dirs must not hold as many fds of root's process."""
        if any(s is sd for s in self._opened):
            self._opened = [s for s in self._opened if s is not sd]
            with contextlib.suppress(OSError):
                os.close(sd.fd)

    def remove_step(self, name: str) -> None:
        """Remove a step dir and everything below it, never following a symlink (``safefs.remove_at``)."""
        if self.ckpt_fd is not None:
            safefs.remove_at(self.ckpt_fd, name)

"""Hash and verify checkpoint files, local or in S3, against the manifest (size + sha256).

Why re-hash rather than trust ETags or mtimes: an ETag is the store's checksum of what it received (for multipart
uploads not even that), and a local copy may be a torn write from a killed save or a file the job's user changed.
Only bytes that hash to the manifest are ever loaded.

Local files are opened with ``O_NOFOLLOW`` and must be regular files: the prolog runs this as root over a
directory the job's user owns, and must not be led through a symlink to read some other file.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from nuro.checkpoint.layout import is_control_file, shard_key
from nuro.checkpoint.manifest import FileEntry, Manifest
from nuro.objectstore import NotFound, ObjectStore

CHUNK = 4 * 1024 * 1024
Progress = Callable[[int], None]


def open_regular(path: Path) -> int:
    """An fd for reading ``path``, refusing symlinks and anything that is not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


def open_beneath(root: Path, relpath: str) -> int:
    """An fd for reading ``root/relpath`` that never follows a symlink in ``relpath``: each component is opened
    with ``O_NOFOLLOW`` relative to its parent, and the last must be a regular file. Root uses this on directories
    a job's user controls, where a planted ``sub -> /etc`` would otherwise make it read (and upload) other files."""
    parts = relpath.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise OSError(f"{root / relpath} is not a regular file")
    return leaf


def hash_fd(fd: int) -> tuple[int, str]:
    """(size, sha256 hex) of an open file, streamed from its start; closes ``fd``."""
    digest = hashlib.sha256()
    size = 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def hash_file(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a regular file, streamed."""
    digest = hashlib.sha256()
    size = 0
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def scan_dir(root: Path) -> tuple[FileEntry, ...]:
    """Every regular file under ``root`` (our control files excluded), with size and sha256, sorted by path.

    Raises OSError on a symlink or special file: a checkpoint directory written by DCP holds only regular files.
    """
    entries: list[FileEntry] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        for d in dirnames:
            if (base / d).is_symlink():
                raise OSError(f"{base / d} is a symlink; a checkpoint directory holds only regular files")
        for name in sorted(filenames):
            rel = (base / name).relative_to(root).as_posix()
            if is_control_file(rel):
                continue
            size, sha = hash_file(base / name)
            entries.append(FileEntry(rel, size, sha))
    entries.sort(key=lambda e: e.path)
    return tuple(entries)


@dataclass(frozen=True)
class Problem:
    """One file that does not match the manifest; ``why`` is for people."""

    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def check_local_file(root: Path, entry: FileEntry) -> Problem | None:
    try:
        size, sha = hash_fd(open_beneath(root, entry.path))
    except FileNotFoundError:
        return Problem(entry.path, "missing")
    except OSError as exc:
        return Problem(entry.path, f"unreadable ({exc})")
    if size != entry.size:
        return Problem(entry.path, f"size {size}, manifest says {entry.size}")
    if sha != entry.sha256:
        return Problem(entry.path, f"sha256 {sha[:12]}…, manifest says {entry.sha256[:12]}…")
    return None


def verify_local(root: Path, entries: Iterable[FileEntry]) -> list[Problem]:
    """Every problem of a local copy against the manifest's entries (empty = valid). Extra files are ignored."""
    if not root.is_dir() or root.is_symlink():
        return [Problem(".", f"{root} is not a directory")]
    problems: list[Problem] = []
    for e in entries:
        # a cheap size check first: a torn copy is usually short, and hashing GiBs to learn that is wasteful
        try:
            st = os.lstat(root / e.path)
            if not stat.S_ISREG(st.st_mode) or st.st_size != e.size:
                problems.append(Problem(e.path, f"size {st.st_size}, manifest says {e.size}"))
                continue
        except FileNotFoundError:
            problems.append(Problem(e.path, "missing"))
            continue
        p = check_local_file(root, e)
        if p:
            problems.append(p)
    return problems


def check_remote_shard(store: ObjectStore, manifest: Manifest, entry: FileEntry) -> Problem | None:
    """Stream one shard from S3 and compare size and sha256 with the manifest."""
    key = shard_key(manifest.team, manifest.run, manifest.step, entry.path)
    digest = hashlib.sha256()
    size = 0
    try:
        for chunk in store.iter_chunks(key):
            digest.update(chunk)
            size += len(chunk)
    except NotFound:
        return Problem(entry.path, "missing from the store")
    if size != entry.size:
        return Problem(entry.path, f"size {size} in the store, manifest says {entry.size}")
    if digest.hexdigest() != entry.sha256:
        return Problem(
            entry.path, f"sha256 {digest.hexdigest()[:12]}… in the store, manifest says {entry.sha256[:12]}…"
        )
    return None


def download_verified(store: ObjectStore, manifest: Manifest, entry: FileEntry, dest_root: Path) -> Problem | None:
    """Download one shard to ``dest_root/<path>`` while hashing it; keep it only if it matches the manifest.

    Written to a temp name then renamed, so a half-downloaded file never sits under its real name.
    """
    key = shard_key(manifest.team, manifest.run, manifest.step, entry.path)
    target = dest_root / entry.path
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.part")
    digest = hashlib.sha256()
    size = 0
    try:
        with open(tmp, "wb") as out:
            for chunk in store.iter_chunks(key):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except NotFound:
        tmp.unlink(missing_ok=True)
        return Problem(entry.path, "missing from the store")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if size != entry.size or digest.hexdigest() != entry.sha256:
        tmp.unlink(missing_ok=True)
        return Problem(
            entry.path,
            f"the store holds {size} bytes with sha256 {digest.hexdigest()[:12]}…, manifest says {entry.size} "
            f"bytes with sha256 {entry.sha256[:12]}…",
        )
    os.replace(tmp, target)
    return None

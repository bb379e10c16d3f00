"""Hash and verify checkpoint files, local or in S3, against the manifest (size + sha256).

Why re-hash rather than trust ETags or mtimes: an ETag is the store's checksum of what it received (for multipart
uploads not even that), and a local copy may be a torn write from a killed save or a file the job's user changed.
Only bytes that hash to the manifest are ever loaded.

Local files are opened with ``O_NOFOLLOW`` through directory fds (``nuro.safeio.safefs``) and must be regular files: the
prolog runs this as root over a directory the job's user owns, and must not be led through a symlink to read, or
write, some other file. Written files are made under a temp name ``O_EXCL|O_NOFOLLOW`` and given to their owner by
fd before the rename.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from nuro.checkpoint.layout import is_control_file, shard_key
from nuro.checkpoint.manifest import FileEntry, Manifest
from nuro.objectstore import NotFound, ObjectStore
from nuro.safeio import safefs
from nuro.safeio.safefs import Dir, UnsafePath, as_dir

CHUNK = 4 * 1024 * 1024
Progress = Callable[[int], None]
#: A directory to work in: a path (the job on its own files) or an open no-follow Dir (root in a job's dir).
Where = Path | Dir


def open_regular(path: Path) -> int:
    """An fd for reading ``path``, refusing symlinks and anything that is not a regular file (``safefs``)."""
    return safefs.open_regular(os.fspath(path))


def open_beneath(root: Where | int, relpath: str) -> int:
    """An fd for reading ``root/relpath`` that never follows a symlink in ``relpath``: each component is opened
    with ``O_NOFOLLOW`` relative to its parent, and the last must be a regular file (``safefs.open_beneath``).
    Root passes a Dir (or a dir fd) it opened itself; a path's own last component is not followed either."""
    if isinstance(root, int):
        return safefs.open_beneath(root, relpath)
    with as_dir(root) as d:
        return safefs.open_beneath(d.fd, relpath)


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
    return hash_fd(open_regular(path))


def scan_dir(root: Where) -> tuple[FileEntry, ...]:
    """Every regular file under ``root`` (our control files excluded), with size and sha256, sorted by path.

    Raises OSError on a symlink or special file: a checkpoint directory written by DCP holds only regular files.
    """
    entries: list[FileEntry] = []
    with as_dir(root) as d:
        for rel, entry in safefs.walk_files(d.fd):
            if entry.is_dir:
                continue
            if not entry.is_file:
                kind = "a symlink" if entry.is_symlink else "not a regular file"
                raise UnsafePath(str(d.path / rel), f"is {kind}; a checkpoint directory holds only regular files")
            if is_control_file(rel):
                continue
            size, sha = hash_fd(safefs.open_beneath(d.fd, rel))
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


def check_local_file(root: Where, entry: FileEntry) -> Problem | None:
    """Why the local copy of ``entry`` under ``root`` is not the manifest's file, or None. The size is checked
    (on the open fd) before hashing: a torn copy is usually short, and hashing GiBs to learn that is wasteful."""
    try:
        fd = open_beneath(root, entry.path)
    except FileNotFoundError:
        return Problem(entry.path, "missing")
    except OSError as exc:
        return Problem(entry.path, f"unreadable ({exc})")
    size = os.fstat(fd).st_size
    if size != entry.size:
        os.close(fd)
        return Problem(entry.path, f"size {size}, manifest says {entry.size}")
    try:
        size, sha = hash_fd(fd)
    except OSError as exc:
        return Problem(entry.path, f"unreadable ({exc})")
    if size != entry.size:
        return Problem(entry.path, f"size {size}, manifest says {entry.size}")
    if sha != entry.sha256:
        return Problem(entry.path, f"sha256 {sha[:12]}…, manifest says {entry.sha256[:12]}…")
    return None


def verify_local(root: Where, entries: Iterable[FileEntry]) -> list[Problem]:
    """Every problem of a local copy against the manifest's entries (empty = valid). Extra files are ignored."""
    try:
        with as_dir(root) as d:
            return [p for e in entries if (p := check_local_file(d, e))]
    except OSError as exc:
        return [Problem(".", f"{root if isinstance(root, Path) else root.path} is not a directory ({exc})")]


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


def write_verified(
    dest_root: Where, entry: FileEntry, chunks: Iterable[bytes], owner: tuple[int, int] | None = None
) -> Problem | None:
    """Write ``chunks`` to ``dest_root/<entry.path>`` while hashing them; keep the file only if it matches the
    manifest. The directories on the way are made (no symlink followed, given to ``owner``), the data goes to a
    temp name created ``O_EXCL|O_NOFOLLOW`` and given to ``owner`` by fd, then renamed: root writing into a job's
    dir can neither be redirected nor leave a half-written file under the real name."""
    *dirs, leaf = entry.path.split("/")
    with as_dir(dest_root) as top:
        parent = safefs.makedirs_at(top, "/".join(dirs), 0o700, owner) if dirs else Dir(os.dup(top.fd), top.path)
        try:
            tmp = f".{leaf}.{os.getpid()}.{threading.get_ident()}.part"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent.fd)
            fd = os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent.fd
            )
            digest = hashlib.sha256()
            size = 0
            try:
                with os.fdopen(fd, "wb") as out:
                    if owner is not None:
                        safefs.fchown(out.fileno(), *owner)
                    for chunk in chunks:
                        digest.update(chunk)
                        size += len(chunk)
                        if size > entry.size:
                            break  # more than the manifest's size: wrong, whatever follows
                        out.write(chunk)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent.fd)
                raise
            if size != entry.size or digest.hexdigest() != entry.sha256:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent.fd)
                what = f"more than {entry.size}" if size > entry.size else str(size)
                return Problem(
                    entry.path,
                    f"the source holds {what} bytes with sha256 {digest.hexdigest()[:12]}…, manifest says "
                    f"{entry.size} bytes with sha256 {entry.sha256[:12]}…",
                )
            os.rename(tmp, leaf, src_dir_fd=parent.fd, dst_dir_fd=parent.fd)
            return None
        finally:
            parent.close()


def _file_chunks(fd: int) -> Iterator[bytes]:
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(CHUNK):
            yield chunk


def copy_verified(
    src_root: Where, entry: FileEntry, dest_root: Where, owner: tuple[int, int] | None = None
) -> Problem | None:
    """Copy ``entry`` from a local copy to ``dest_root``, verified on the way (``write_verified``); the source is
    opened without following any symlink and must be a regular file."""
    try:
        fd = open_beneath(src_root, entry.path)
    except OSError as exc:
        return Problem(entry.path, f"unreadable ({exc})")
    return write_verified(dest_root, entry, _file_chunks(fd), owner)


def download_verified(
    store: ObjectStore, manifest: Manifest, entry: FileEntry, dest_root: Where, owner: tuple[int, int] | None = None
) -> Problem | None:
    """Download one shard to ``dest_root/<path>`` while hashing it; keep it only if it matches the manifest."""
    key = shard_key(manifest.team, manifest.run, manifest.step, entry.path)
    try:
        problem = write_verified(dest_root, entry, store.iter_chunks(key), owner)
    except NotFound:
        return Problem(entry.path, "missing from the store")
    return None if problem is None else Problem(entry.path, problem.why.replace("the source", "the store", 1))

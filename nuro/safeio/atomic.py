"""Whole-file replacement a crash cannot tear: readers see the old file or the new one, never part of either.

The writer that root (epilog, node agent, upload worker) and jobs share for small state files: markers, upload
requests, job records. Bottom floor (``nuro.safeio``): standard library only.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


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


__all__ = ["write_atomic"]

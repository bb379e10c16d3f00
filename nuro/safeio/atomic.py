"""Whole-file replacement a crash cannot tear: readers see the old file or the new one, never part of either.

The one writer of small state files for every part of nuro: markers, upload requests, job records, the bridge's
policy table, node keys, credential files, status and reasons files, launch verdicts. Its options are named for the
guarantee a caller needs:

* ``mode`` and ``owner``: set on the temp file before the rename, so the file never exists with other permissions
  (a team's credential file is root:``nuro-<team>`` 0640 from its first byte on disk);
* ``durable``: fsync the file and its directory (a crash after the call keeps the new file); off for soft state
  rewritten every second, where a stale or missing file after a crash is exactly what readers must handle;
* always: the temp file is created ``O_EXCL|O_NOFOLLOW`` beside the target (root writing into a directory the job's
  user owns: a planted symlink at the temp name must not redirect the write; the rename replaces a symlink at the
  target itself), and removed when the write fails.

Bottom floor (``nuro.safeio``): standard library only.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path


def write_atomic(
    path: Path | str,
    data: bytes | str,
    mode: int = 0o644,
    *,
    owner: tuple[int, int] | None = None,
    durable: bool = True,
) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8) whole; see the module docstring for ``mode``, ``owner`` (uid,
    gid) and ``durable``. The directory must exist."""
    path = Path(path)
    body = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}.{threading.get_ident()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
    except FileExistsError:  # left by a writer of this pid and thread that died mid-write
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            if owner is not None:
                os.fchown(fh.fileno(), *owner)
            os.fchmod(fh.fileno(), mode)
            fh.write(body)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


__all__ = ["write_atomic"]

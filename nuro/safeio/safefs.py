"""No-follow file primitives for root working inside directories a job's user controls.

Why: a job's staging dir belongs to its user, who can swap any name in it for a symlink (to ``/etc``, to another
job's dir), a FIFO or a device between root's check and root's use. Every primitive here therefore works on
directory file descriptors and opens one component at a time with ``O_NOFOLLOW``, so a symlink anywhere is refused
rather than followed; files are opened ``O_NONBLOCK`` (a FIFO cannot block the open) and must ``fstat`` as
regular files before a byte is read, reads are size-capped (``/dev/zero`` cannot exhaust memory), and ownership
changes go through ``fchown`` on an fd that was opened this way (never a recursive chown by path).

Whatever is wrong raises ``UnsafePath`` (an ``OSError``) naming the path and the reason, so callers that already
treat ``OSError`` as "not usable" stay correct.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Flags of every directory open: no symlink, must be a directory, not inherited by children.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Flags of every file open for reading: no symlink, a FIFO cannot block the open, not inherited.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: Default cap for small files root reads (records, requests, markers): far above what nuro writes.
SMALL_FILE_CAP = 1 << 20


class UnsafePath(OSError):
    """A path root was asked to use is not what it must be (a symlink, a FIFO, a device, a dir where a file was
    expected, too big, ...). ``path`` names it, ``why`` says what was wrong."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EPERM, f"{path}: {why}")
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def _check_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePath(name, "not a single path component")
    return name


def _split(relpath: str) -> list[str]:
    parts = relpath.split("/")
    for p in parts:
        _check_name(p)
    return parts


def _open_no_follow(name: str, flags: int, dir_fd: int | None, mode: int = 0o777) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(name, "is a symlink") from None
        if exc.errno == errno.ENOTDIR and flags & os.O_DIRECTORY:
            # O_DIRECTORY|O_NOFOLLOW on a symlink fails with ENOTDIR: say which it was
            try:
                mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
            except OSError:
                mode = 0
            raise UnsafePath(name, "is a symlink" if stat.S_ISLNK(mode) else "is not a directory") from None
        raise


def open_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """An fd of the directory ``path`` (relative to ``dir_fd`` when given); its last component must not be a
    symlink. Use it for trusted roots (the staging root); below them walk with ``open_dir_beneath``."""
    return _open_no_follow(os.fspath(path), DIR_FLAGS, dir_fd)


def open_dir_beneath(dir_fd: int, relpath: str) -> int:
    """An fd of ``relpath`` below ``dir_fd``, opened one component at a time with ``O_NOFOLLOW``."""
    fd = os.dup(dir_fd)
    try:
        for part in _split(relpath):
            nxt = _open_no_follow(part, DIR_FLAGS, fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(name: str, *, dir_fd: int | None = None) -> int:
    """An fd for reading the regular file ``name`` (relative to ``dir_fd``); a symlink, FIFO, device, socket or
    directory raises UnsafePath. ``O_NONBLOCK`` is cleared once it is known to be a regular file."""
    fd = _open_no_follow(name, READ_FLAGS, dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(name, f"is not a regular file ({_kind(st.st_mode)})")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_beneath(dir_fd: int, relpath: str) -> int:
    """An fd for reading the regular file ``relpath`` below ``dir_fd``, no symlink followed on the way."""
    *dirs, leaf = _split(relpath)
    if not dirs:
        return open_regular(leaf, dir_fd=dir_fd)
    parent = open_dir_beneath(dir_fd, "/".join(dirs))
    try:
        return open_regular(leaf, dir_fd=parent)
    finally:
        os.close(parent)


def read_fd(fd: int, max_bytes: int, what: str = "file") -> bytes:
    """All of an open file, refusing more than ``max_bytes`` (reads one byte past the cap to know). Closes ``fd``."""
    try:
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise UnsafePath(what, f"larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_regular(dir_fd: int, relpath: str, max_bytes: int = SMALL_FILE_CAP) -> bytes:
    """The bytes of the regular file ``relpath`` below ``dir_fd`` (no symlink, no FIFO, at most ``max_bytes``)."""
    return read_fd(open_beneath(dir_fd, relpath), max_bytes, relpath)


def write_atomic_at(
    dir_fd: int, name: str, data: bytes, mode: int = 0o644, owner: tuple[int, int] | None = None
) -> None:
    """Replace ``name`` in ``dir_fd`` with ``data`` atomically: a temp file created ``O_EXCL|O_NOFOLLOW`` (a planted
    name cannot redirect the write), fsync'd, given to ``owner`` by fd, ``renameat`` over ``name`` (which replaces
    a symlink there, never writes through it), then the directory fsync'd."""
    _check_name(name)
    tmp = f".{name}.tmp.{os.getpid()}.{threading.get_ident()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(tmp, dir_fd=dir_fd)
        fd = os.open(tmp, flags, mode, dir_fd=dir_fd)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not narrow a record others read
            if owner is not None:
                fchown(fd, *owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def mkdir_at(dir_fd: int, name: str, mode: int = 0o700) -> int:
    """``name`` in ``dir_fd`` as a real directory (created with ``mode`` if missing), returned as an open fd.
    An existing symlink or non-directory at the name raises UnsafePath (callers decide whether to remove it)."""
    _check_name(name)
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=dir_fd)
    return _open_no_follow(name, DIR_FLAGS, dir_fd)


def fchown(fd: int, uid: int, gid: int) -> None:
    """Give the file or directory open at ``fd`` to ``uid:gid`` (a no-op unless we are root)."""
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)


@dataclass(frozen=True)
class Entry:
    """A name in a directory and its ``lstat`` (a symlink is reported as one, never followed)."""

    name: str
    st: os.stat_result

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.st.st_mode)

    @property
    def is_file(self) -> bool:
        return stat.S_ISREG(self.st.st_mode)

    @property
    def is_symlink(self) -> bool:
        return stat.S_ISLNK(self.st.st_mode)


def list_dir(dir_fd: int) -> list[Entry]:
    """The entries of ``dir_fd`` with their lstat, sorted by name; names that vanish meanwhile are left out."""
    out: list[Entry] = []
    for name in sorted(os.listdir(dir_fd)):
        try:
            out.append(Entry(name, os.stat(name, dir_fd=dir_fd, follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return out


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in ``dir_fd``, None if it does not exist."""
    try:
        return os.stat(_check_name(name), dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


#: Directory depth ``remove_at`` descends with open fds; deeper subtrees are moved up to the top first, so a
#: hostile 100 000-level tree costs neither recursion nor one fd per level.
_REMOVE_DEPTH = 32
#: How often ``remove_at`` looks again into a directory that gained entries while it was emptied (rmdir's ENOTEMPTY):
#: the node agent's upload worker may still write a marker into a job's step dir while the epilog removes it. Bounded,
#: so a writer that never stops fails the removal instead of holding it.
_REMOVE_REFILLS = 3


def remove_at(dir_fd: int, name: str) -> None:
    """Remove ``name`` from ``dir_fd`` whatever it is (a directory with everything below it), never following a
    symlink: a symlink is unlinked itself, a directory is emptied through its own no-follow fd. Missing is fine.
    Iterative, with at most ``_REMOVE_DEPTH`` directories open at once."""
    st = lstat_at(dir_fd, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    try:
        top = _open_no_follow(name, DIR_FLAGS, dir_fd)
    except UnsafePath:  # swapped for a symlink since the lstat: unlink the link
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    except FileNotFoundError:
        return
    # frames: (fd of the parent, our name in it, our fd, names still to look at)
    stack: list[tuple[int, str, int, Iterator[str]]] = [(dir_fd, name, top, iter(os.listdir(top)))]
    moved = 0
    refills: dict[int, int] = {}  # fd of a directory → times it was emptied again
    try:
        while stack:
            parent, here, fd, names = stack[-1]
            descended = False
            for child in names:
                cst = lstat_at(fd, child)
                if cst is None:
                    continue
                if not stat.S_ISDIR(cst.st_mode):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(child, dir_fd=fd)
                    continue
                if len(stack) >= _REMOVE_DEPTH:  # too deep: hang it under the top, visit it from there
                    moved += 1
                    with contextlib.suppress(FileNotFoundError):
                        os.rename(child, f".deep.{moved}", src_dir_fd=fd, dst_dir_fd=top)
                    continue
                try:
                    sub = _open_no_follow(child, DIR_FLAGS, fd)
                except UnsafePath:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(child, dir_fd=fd)
                    continue
                except FileNotFoundError:
                    continue
                stack.append((fd, child, sub, iter(os.listdir(sub))))
                descended = True
                break
            if descended:
                continue
            if len(stack) == 1 and moved and os.listdir(fd):  # subtrees moved up meanwhile: another pass
                stack[0] = (parent, here, fd, iter(os.listdir(fd)))
                continue
            try:
                os.rmdir(here, dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError as exc:  # written into meanwhile: empty it again (the fd is still open), a few times
                if exc.errno != errno.ENOTEMPTY or refills.get(fd, 0) >= _REMOVE_REFILLS:
                    raise
                refills[fd] = refills.get(fd, 0) + 1
                stack[-1] = (parent, here, fd, iter(os.listdir(fd)))
                continue
            stack.pop()
            os.close(fd)
            refills.pop(fd, None)  # the number may come back for another directory
    finally:
        for _, _, fd, _ in stack:
            os.close(fd)


def walk_files(dir_fd: int, prefix: str = "") -> Iterator[tuple[str, Entry]]:
    """Every entry below ``dir_fd`` as (relative path, Entry), depth first, sorted; directories are entered
    through no-follow fds, symlinks and special files are yielded (for the caller to refuse), never entered."""
    for entry in list_dir(dir_fd):
        rel = f"{prefix}{entry.name}"
        yield rel, entry
        if entry.is_dir:
            try:
                sub = _open_no_follow(entry.name, DIR_FLAGS, dir_fd)
            except (UnsafePath, FileNotFoundError):
                continue
            try:
                yield from walk_files(sub, f"{rel}/")
            finally:
                os.close(sub)


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


@dataclass(frozen=True)
class Dir:
    """An open directory: ``fd`` does the work, ``path`` is only for messages and results (never opened again).
    The caller that opened it closes it (``close`` or ``as_dir``)."""

    fd: int
    path: Path

    def sub(self, relpath: str) -> Dir:
        """``relpath`` below this directory, walked with no-follow (UnsafePath / FileNotFoundError otherwise)."""
        return Dir(open_dir_beneath(self.fd, relpath), self.path / relpath)

    def mkdir(self, name: str, mode: int = 0o700, owner: tuple[int, int] | None = None) -> Dir:
        """``name`` in this directory as a real directory (created if missing; given to ``owner`` by fd)."""
        fd = mkdir_at(self.fd, name, mode)
        if owner is not None:
            try:
                fchown(fd, *owner)
            except BaseException:
                os.close(fd)
                raise
        return Dir(fd, self.path / name)

    def close(self) -> None:
        os.close(self.fd)


@contextlib.contextmanager
def as_dir(d: Path | Dir) -> Iterator[Dir]:
    """``d`` as an open Dir for the block: a Dir is used as it is (its owner closes it), a path is opened with
    ``open_dir`` and closed at the end. A path is for callers that trust the path's parents (the job itself)."""
    if isinstance(d, Dir):
        yield d
        return
    opened_dir = Dir(open_dir(d), Path(d))
    try:
        yield opened_dir
    finally:
        opened_dir.close()


def makedirs_at(top: Dir, relpath: str, mode: int = 0o700, owner: tuple[int, int] | None = None) -> Dir:
    """``relpath``'s directories below ``top``, created (and given to ``owner``) where missing, never through a
    symlink; returns the last one open (the caller closes it)."""
    cur = Dir(os.dup(top.fd), top.path)
    try:
        for part in _split(relpath):
            nxt = cur.mkdir(part, mode, owner)
            cur.close()
            cur = nxt
    except BaseException:
        cur.close()
        raise
    return cur


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    """Close ``fd`` when the block ends: ``with opened(open_dir(p)) as d: ...``."""
    try:
        yield fd
    finally:
        os.close(fd)


def write_private(directory: str | Path, name: str, data: bytes) -> None:
    """``write_atomic_at`` into a daemon's own state dir (made 0700 when missing, never entered through a link),
    the file root-only (0600): the controller's ledger and progress book."""
    directory = Path(directory)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        write_atomic_at(dfd, name, data, mode=0o600)
    finally:
        os.close(dfd)


__all__ = [
    "DIR_FLAGS",
    "READ_FLAGS",
    "SMALL_FILE_CAP",
    "Dir",
    "Entry",
    "UnsafePath",
    "as_dir",
    "fchown",
    "list_dir",
    "lstat_at",
    "makedirs_at",
    "mkdir_at",
    "open_beneath",
    "open_dir",
    "open_dir_beneath",
    "open_regular",
    "opened",
    "read_fd",
    "read_regular",
    "remove_at",
    "walk_files",
    "write_atomic_at",
    "write_private",
]

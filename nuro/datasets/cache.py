"""The node-local shard cache: one verified copy of each shard on local NVMe, shared by every job of a team.

Why whole shards, content-addressed: a shard's name is its sha256, so the copy one job fetched is the bytes every
other job, epoch and run of any snapshot naming that shard wants; it never goes stale and is verified once, on
arrival (size and sha256 while it is written, before it is renamed into place). The bytes of each file are checked
again against the manifest on every read (``nuro.datasets.loader``): a copy damaged on disk later is thrown away
and fetched again (``discard``), never served.

Concurrency, between every rank and DataLoader worker of every job on the node, with ``flock`` on two lock files
per shard (kept: removing a lock file that another process may have open is the classic race):

- ``<hex>.lock``, the *use* lock: a reader holds it shared for as long as it has the shard open (``CachedShard``,
  a DataLoader worker keeps a few open); eviction takes it exclusive *without waiting*, so it never removes a shard
  in use. Nobody ever waits for it exclusively: readers keep it for minutes, and a waiter would deadlock the loader
  (workers holding shards open wait for the batch the waiter owes them).
- ``<hex>.fetch``, the *fetch* lock: held exclusive only while one process downloads the shard. A reader that finds
  no copy takes it, checks again and fetches; whoever asks at the same time waits on it (seconds) and then reads
  that one copy. One GET per shard per node.

Eviction keeps the cache under ``budget_bytes``: after each fetch the least recently opened shards (their mtime,
touched on open) go first, skipping any that is in use; a cache whose shards are all in use stays over budget until
they are closed (it never blocks a reader).

Team boundary: the cache root is ``<cache>/<team>``. The prolog makes it ``root:nuro-<team>`` mode 2770
(``ensure_team_dir``) so every member of the team shares it and no other team can list or read it. A shared
dataset is cached once per team that reads it: one team cannot plant or remove bytes another team will read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nuro.datasets.errors import IntegrityError, InvalidInput
from nuro.datasets.manifest import validate_digest
from nuro.names import validate_team
from nuro.protocol.envnames import NURO_DATA_CACHE_DIR, NURO_DATA_CACHE_GB
from nuro.safeio import safefs
from nuro.safeio.credfile import team_group

log = logging.getLogger(__name__)

GiB = 1024**3
#: Budget per team directory when ``NURO_DATA_CACHE_GB`` is unset.
DEFAULT_BUDGET_BYTES = 100 * GiB
#: A temporary file older than this is a crashed fetch's leftover; eviction removes it.
STALE_TEMP_S = 3600.0
_DATA_MODE = 0o660  # group: the team's other members read it and touch its mtime
_DIR_MODE = 0o2770

Fetch = Callable[[], Iterable[bytes]]


@dataclass
class CacheStats:
    """What this process did: hits (a copy was there), fetches (it downloaded), bytes fetched, evictions, shards
    thrown away as damaged."""

    hits: int = 0
    fetches: int = 0
    fetched_bytes: int = 0
    evictions: int = 0
    discarded: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class CachedShard:
    """An open, verified local shard; holds a shared lock until ``close`` so eviction leaves it alone."""

    def __init__(self, digest: str, fd: int, lock_fd: int) -> None:
        self.digest, self.fd, self.lock_fd = digest, fd, lock_fd

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset``; fewer if the copy was truncated on disk (the caller's check fails)."""
        return os.pread(self.fd, length, offset)

    def close(self) -> None:
        for fd in (self.fd, self.lock_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fd = self.lock_fd = -1


@dataclass
class ShardCache:
    """The shard cache under ``root`` (a team's directory); see the module docstring."""

    root: Path
    budget_bytes: int = DEFAULT_BUDGET_BYTES
    stats: CacheStats = field(default_factory=CacheStats)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.dir = self.root / "sha256"
        if not self.root.is_dir():  # no prolog made it (a laptop, a plain job): private to this user
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            if not self.dir.is_dir():  # the prolog makes it too; umask must not narrow a team's dir
                self.dir.mkdir(mode=0o700, exist_ok=True)
                with contextlib.suppress(PermissionError):
                    os.chmod(self.dir, _DIR_MODE if self._shared_root() else 0o700)
        except PermissionError:
            raise PermissionError(
                f"cannot create the dataset cache {self.dir}: the job's user may not write {self.root} (it should "
                "be root:nuro-<team> mode 2770, made by the prolog); set NURO_DATA_CACHE_DIR to a writable dir"
            ) from None
        self._lock = threading.Lock()

    def _shared_root(self) -> bool:
        return bool(self.root.stat().st_mode & stat.S_ISGID)

    def _paths(self, digest: str) -> tuple[Path, Path]:
        """The shard's data file and its use lock."""
        hex_ = validate_digest(digest).removeprefix("sha256:")
        return self.dir / hex_, self._use_lock(hex_)

    def _use_lock(self, name: str) -> Path:
        return self.dir / f"{name}.lock"

    # -- open -----------------------------------------------------------------------------------------------------
    def open(self, digest: str, size: int, fetch: Fetch) -> CachedShard:
        """The local copy of shard ``digest`` (``size`` bytes), fetched with ``fetch`` if absent; verified."""
        data_path, lock_path = self._paths(digest)
        lock_fd = self._lock_file(lock_path)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)  # in use from here on: eviction leaves it alone
            fd = self._open_data(data_path, size)
            if fd is None:
                with self._fetch_lock(digest):
                    fd = self._open_data(data_path, size, remove_bad=True)  # fetched while we waited?
                    if fd is None:
                        self._fetch(digest, size, data_path, fetch)
                        fd = self._open_data(data_path, size)
                        if fd is None:
                            raise OSError(f"dataset cache: {data_path} vanished right after it was fetched")
                self._evict(keep=data_path.name)
            else:
                self.stats.hits += 1
            return CachedShard(digest, fd, lock_fd)
        except BaseException:
            os.close(lock_fd)
            raise

    def _lock_file(self, path: Path) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, _DATA_MODE)
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, _DATA_MODE)  # whoever created it; umask must not keep the team out
        return fd

    @contextlib.contextmanager
    def _fetch_lock(self, digest: str) -> Iterator[None]:
        data_path, _ = self._paths(digest)
        fd = self._lock_file(data_path.with_name(f"{data_path.name}.fetch"))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # held only while one process downloads: a short wait
            yield
        finally:
            os.close(fd)

    def _open_data(self, path: Path, size: int, remove_bad: bool = False) -> int | None:
        """The copy open for reading, or None when it is missing or not a whole regular file (removed when
        ``remove_bad``: only under the fetch lock, so a copy fetched again meanwhile is never the one removed)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:  # not ours, or truncated: fetch it again
            os.close(fd)
            if remove_bad:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(fd)  # least recently used = oldest mtime
        return fd

    def _fetch(self, digest: str, size: int, data_path: Path, fetch: Fetch) -> None:
        """Download into a temporary file, verify size and sha256, rename into place (readers see all or none)."""
        tmp = data_path.with_name(f".{data_path.name}.{os.getpid()}.{threading.get_ident()}.part")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _DATA_MODE)
        h, n = hashlib.sha256(), 0
        try:
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, _DATA_MODE)
            with open(fd, "wb", closefd=False) as out:  # write() of a file object writes all of a chunk
                for chunk in fetch():
                    h.update(chunk)
                    n += len(chunk)
                    out.write(chunk)
            os.close(fd)
            fd = -1
            actual = "sha256:" + h.hexdigest()
            if n != size or actual != digest:
                raise IntegrityError(
                    f"shard {digest} fetched from the store is {n} bytes hashing to {actual}, expected {size} bytes: "
                    "the stored shard was altered or truncated (`nuro-train dataset verify` lists what it breaks)"
                )
            os.rename(tmp, data_path)
            self.stats.fetches += 1
            self.stats.fetched_bytes += n
        finally:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    # -- damage and eviction -----------------------------------------------------------------------------------
    def discard(self, shard: CachedShard) -> None:
        """Throw away a copy whose bytes failed their check: the next ``open`` fetches it again. Under the fetch
        lock, and only if the file is still the copy we read (not one fetched again meanwhile); other readers keep
        their open copy and find the damage themselves."""
        data_path, _ = self._paths(shard.digest)
        try:
            with self._fetch_lock(shard.digest):
                mine = os.fstat(shard.fd).st_ino
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(data_path, follow_symlinks=False).st_ino == mine:
                        os.unlink(data_path)
                self.stats.discarded += 1
                log.warning("dataset cache: discarded damaged shard %s", shard.digest)
        finally:
            shard.close()

    def usage(self) -> tuple[int, list[os.DirEntry]]:
        """Bytes of cached shards and their entries (no temporaries, no lock files)."""
        entries, _ = self._scan()
        return sum(e.stat(follow_symlinks=False).st_size for e in entries), entries

    def _scan(self) -> tuple[list[os.DirEntry], list[os.DirEntry]]:
        """One listing of the cache dir: the shards, and the temporaries of fetches (``.part``)."""
        shards, temps = [], []
        for e in os.scandir(self.dir):
            if e.name.endswith(".part"):
                temps.append(e)
            elif len(e.name) == 64 and e.is_file(follow_symlinks=False):
                shards.append(e)
        return shards, temps

    def _evict(self, keep: str) -> None:
        with self._lock:
            entries, temps = self._scan()
            total = sum(e.stat(follow_symlinks=False).st_size for e in entries)
            self._remove_stale(temps)
            if total <= self.budget_bytes:
                return
            for entry in sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime):
                if total <= self.budget_bytes:
                    break
                if entry.name == keep:
                    continue
                size = entry.stat(follow_symlinks=False).st_size
                if self._try_remove(entry.name):
                    total -= size
                    self.stats.evictions += 1
            if total > self.budget_bytes:
                log.info("dataset cache %s stays over budget (%d > %d bytes): the rest is in use", self.dir, total,
                         self.budget_bytes)  # fmt: skip

    def _try_remove(self, name: str) -> bool:
        """Remove one shard if nobody has it open (exclusive lock without waiting)."""
        try:
            lock_fd = os.open(self._use_lock(name), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            lock_fd = -1
        try:
            if lock_fd >= 0:
                try:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                        return False  # in use
                    raise
            os.unlink(self.dir / name)
            return True
        except FileNotFoundError:
            return False
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)

    @staticmethod
    def _remove_stale(temps: list[os.DirEntry]) -> None:
        now = time.time()
        for entry in temps:
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S:
                    os.unlink(entry.path)


def cache_root(base: str | Path, team: str) -> Path:
    """A team's directory in the node's cache (``<base>/<team>``)."""
    return Path(base) / validate_team(team)


def cache_from_env(team: str | None) -> ShardCache | None:
    """The node cache of ``NURO_DATA_CACHE_DIR`` for ``team`` (no team: a dir private to this user), with the budget
    of ``NURO_DATA_CACHE_GB``; None without a cache dir. The one reader of these settings (the SDK's dataset, the
    prolog's prefetch)."""
    base = os.environ.get(NURO_DATA_CACHE_DIR)
    if not base:
        return None
    raw = os.environ.get(NURO_DATA_CACHE_GB)
    try:
        budget = int(float(raw) * GiB) if raw else DEFAULT_BUDGET_BYTES
    except ValueError:
        raise InvalidInput(f"NURO_DATA_CACHE_GB={raw!r} is not a number of GiB") from None
    return ShardCache(cache_root(base, team or f"user_{os.getuid()}"), budget)


def ensure_team_dir(base: str | Path, team: str) -> Path | None:
    """Root (the prolog): make ``<base>/<team>`` the team's shared cache dir, ``root:nuro-<team>`` mode 2770.

    ``base`` is the admin's (``NURO_DATA_CACHE_DIR``, root-owned); the team name is the job's Slurm account, never
    the job's word. Nothing is followed: an existing symlink or file at the name raises ``UnsafePath``. None when
    the team has no Unix group on this node (then each job caches privately, in a dir of its own user).
    """
    path = cache_root(base, team)
    try:
        gid = grp.getgrnam(team_group(team)).gr_gid
    except KeyError:
        return None
    Path(base).mkdir(mode=0o755, parents=True, exist_ok=True)
    with (
        safefs.opened(safefs.open_dir(base)) as base_fd,
        safefs.opened(safefs.mkdir_at(base_fd, path.name, 0o700)) as fd,
    ):
        safefs.fchown(fd, 0, gid)
        os.fchmod(fd, _DIR_MODE)
        with safefs.opened(safefs.mkdir_at(fd, "sha256", 0o700)) as sub:
            safefs.fchown(sub, 0, gid)
            os.fchmod(sub, _DIR_MODE)
    return path


__all__ = [
    "DEFAULT_BUDGET_BYTES", "CacheStats", "CachedShard", "ShardCache", "cache_from_env", "cache_root",
    "ensure_team_dir",
]  # fmt: skip

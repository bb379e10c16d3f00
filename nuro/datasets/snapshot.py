"""Write a dataset snapshot: scan a directory, pack it into content-addressed shards, write the manifest last.

Crash safety comes from the order, not from clean-up: shards are immutable and content-addressed, so a shard
written before a crash is simply reused by the rerun (it is "already present"), and the manifest — the only thing
that makes a snapshot exist — is written after every shard it names is durable. A killed snapshot leaves shards
nobody refers to yet (garbage a future GC may collect), never a manifest pointing at missing data.

Symlinks are refused (and so are sockets, FIFOs and devices): a link may point outside the tree, or at something
that differs between the machine that snapshots and the nodes that read, and a snapshot must mean the same bytes
everywhere. The error lists them; dereference with ``cp -rL`` first if the targets are what you mean. Empty
directories are not recorded (a manifest lists files).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from nuro.datasets.errors import InvalidInput, SourceChanged, TagConflict
from nuro.datasets.manifest import (
    SHARD_TARGET_BYTES,
    FileEntry,
    PlannedShard,
    ShardRef,
    SourceFile,
    build_manifest,
    manifest_key,
    path_problem,
    plan_shards,
    shard_key,
    validate_name,
    validate_tag,
)
from nuro.datasets.refs import check_tag_free, set_tag
from nuro.datasets.samples import group_samples
from nuro.objectstore import DATASET_MANIFEST_MAX_BYTES, ObjectStore

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
_MAX_LISTED = 10


@dataclass(frozen=True)
class SnapshotResult:
    name: str
    digest: str
    files: int
    total_bytes: int
    shards: int
    shards_uploaded: int
    shards_present: int
    bytes_uploaded: int
    manifest_written: bool
    tag: str | None = None
    samples: int | None = None  # samples the stored pattern groups (None: no pattern, one per file)
    sample_pattern: str | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__, ref=f"{self.name}@{self.digest}")


def scan(root: Path) -> list[SourceFile]:
    """Every regular file under ``root`` as a relative POSIX path with size and permission bits.

    Raises InvalidInput listing (up to 10 of) the symlinks, special files and unacceptable names found.
    """
    root = Path(root)
    if not root.is_dir():
        raise InvalidInput(f"{root} is not a directory: snapshot takes a directory")
    files: list[SourceFile] = []
    bad: list[str] = []
    stack: list[tuple[str, str]] = [(str(root), "")]
    while stack:
        directory, rel = stack.pop()
        with os.scandir(directory) as entries:
            for entry in entries:
                path = f"{rel}{entry.name}"
                problem = path_problem(path)
                if problem:
                    bad.append(f"{path!r}: {problem}")
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    bad.append(f"{path}: symlink to {os.readlink(entry.path)!r} (symlinks are refused)")
                elif stat.S_ISDIR(st.st_mode):
                    stack.append((entry.path, f"{path}/"))
                elif stat.S_ISREG(st.st_mode):
                    files.append(SourceFile(path, st.st_size, stat.S_IMODE(st.st_mode)))
                else:
                    bad.append(f"{path}: not a regular file (socket, FIFO or device)")
    if bad:
        more = f"\n  … and {len(bad) - _MAX_LISTED} more" if len(bad) > _MAX_LISTED else ""
        raise InvalidInput(
            f"{root} holds {len(bad)} entries a snapshot cannot contain:\n  "
            + "\n  ".join(sorted(bad)[:_MAX_LISTED])
            + more
            + "\nRemove or rename them (for symlinks: copy the tree with 'cp -rL' to store the targets)."
        )
    if not files:
        raise InvalidInput(f"{root} contains no files: nothing to snapshot")
    return files


def _read_exact(path: Path, size: int, into: memoryview) -> None:
    with open(path, "rb") as fh:
        got = fh.readinto(into[:size]) if size else 0
        while got < size:
            n = fh.readinto(into[got:size])
            if not n:
                break
            got += n
        if got != size or fh.read(1):
            raise SourceChanged(f"{path} changed size while it was snapshotted (expected {size} bytes); re-run")


def _hash_file(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            h.update(chunk)
    return h.hexdigest()


class _Writer:
    """Packs planned shards and stores the new ones; at most ``inflight`` shards are held in memory."""

    def __init__(
        self, store: ObjectStore, name: str, root: Path, inflight: int, big_bytes: int, progress: Progress | None
    ) -> None:
        self.store, self.root, self.progress, self.big_bytes = store, root, progress, big_bytes
        self.name = name  # a team dataset's shards go to the team's own store (manifest.shards_root)
        self.slots = threading.BoundedSemaphore(inflight)
        self.pool = ThreadPoolExecutor(max_workers=inflight, thread_name_prefix="nuro-shard")
        self.lock = threading.Lock()
        self.uploaded = self.present = self.bytes_uploaded = 0

    def _count(self, uploaded: bool, size: int) -> None:
        with self.lock:
            if uploaded:
                self.uploaded += 1
                self.bytes_uploaded += size
            else:
                self.present += 1

    def _store(self, key: str, data: bytearray | None, path: Path | None, hex_: str, size: int) -> None:
        """Skip a shard already in the store (dedup, or a rerun after a crash), else create it (never overwrite)."""
        try:
            written = False
            if not self.store.exists(key):
                if path is not None:
                    self.store.put_file(key, path, if_none_match=True, expected_sha256=hex_, progress=self.progress)
                    written = True
                else:
                    written = self.store.put_if_absent(key, bytes(data or b""), progress=self.progress)
            self._count(written, size)
            if not written and self.progress:
                self.progress(size)
        finally:
            self.slots.release()

    def submit(self, shard: PlannedShard) -> tuple[Future, ShardRef, list[FileEntry]]:
        """Read and hash ``shard`` here (the caller's thread), then store it in the background."""
        self.slots.acquire()
        try:
            if len(shard.files) == 1 and shard.size >= self.big_bytes:
                # One big file: stream it twice (hash, then upload re-hashed) instead of holding it in memory.
                f = shard.files[0]
                hex_ = _hash_file(self.root / f.path, f.size)
                entries = [FileEntry(f.path, "sha256:" + hex_, 0, f.size, "sha256:" + hex_, f.mode)]
                ref = ShardRef("sha256:" + hex_, f.size)
                future = self.pool.submit(
                    self._store, shard_key(ref.digest, self.name), None, self.root / f.path, hex_, f.size
                )
                return future, ref, entries
            buf = bytearray(shard.size)
            view = memoryview(buf)
            shard_hash = hashlib.sha256()
            hashes = []
            for f, offset in zip(shard.files, shard.offsets(), strict=True):
                part = view[offset : offset + f.size]
                _read_exact(self.root / f.path, f.size, part)
                shard_hash.update(part)
                hashes.append("sha256:" + hashlib.sha256(part).hexdigest())
            digest = "sha256:" + shard_hash.hexdigest()
            entries = [
                FileEntry(f.path, digest, off, f.size, h, f.mode)
                for f, off, h in zip(shard.files, shard.offsets(), hashes, strict=True)
            ]
            future = self.pool.submit(self._store, shard_key(digest, self.name), buf, None, digest[7:], shard.size)
            return future, ShardRef(digest, shard.size), entries
        except BaseException:
            self.slots.release()
            raise


def snapshot(
    store: ObjectStore,
    root: Path,
    name: str,
    tag: str | None = None,
    *,
    force_tag: bool = False,
    target_bytes: int = SHARD_TARGET_BYTES,
    inflight: int = 4,
    progress: Progress | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    now: datetime | None = None,
    samples: str | None = None,
) -> SnapshotResult:
    """Snapshot the directory ``root`` as dataset ``name``; returns the digest (``sha256:<hex>``) and counts.

    Args:
        tag: also point this tag at the new snapshot. An existing tag is refused before anything is uploaded
            unless ``force_tag``; moving it is a conditional write on the ETag read (``refs.set_tag``).
        target_bytes: shard size aimed at (see ``plan_shards``).
        inflight: shards read ahead and uploading at once (memory ≈ inflight × target_bytes… 2×).
        progress: called with bytes as shards are stored or found present.
        on_plan: called once with (total bytes, number of shards) before the first upload.
        samples: the sample index to store: a regular expression grouping files into samples
            (``nuro.datasets.samples``); checked against the files before anything is uploaded.

    Raises:
        InvalidInput, SourceChanged, TagConflict, and the store's errors (nuro.objectstore).
    """
    validate_name(name)
    if tag is not None:
        validate_tag(tag)
        if not force_tag:
            check_tag_free(store, name, tag)
    root = Path(root)
    sources = scan(root)
    grouped = None if samples is None else len(group_samples((s.path for s in sources), samples))  # before uploading
    plan = plan_shards(sources, target_bytes)
    total = sum(s.size for s in plan)
    log.info("snapshot name=%s files=%d bytes=%d shards=%d", name, len(sources), total, len(plan))
    if on_plan:
        on_plan(total, len(plan))
    writer = _Writer(store, name, root, inflight, 2 * target_bytes, progress)
    pending: list[Future] = []
    refs: list[ShardRef] = []
    entries: list[FileEntry] = []
    try:
        for shard in plan:
            future, ref, files = writer.submit(shard)
            pending.append(future)
            refs.append(ref)
            entries.extend(files)
            pending = _without_finished(pending)  # stop reading as soon as an upload failed
        for future in pending:
            future.result()  # every shard durable before the manifest names it
    finally:
        writer.pool.shutdown(wait=True, cancel_futures=True)
    created = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    manifest = build_manifest(name, created, entries, refs, samples=samples)
    data = manifest.canonical_bytes()
    digest = manifest.digest()
    if len(data) > DATASET_MANIFEST_MAX_BYTES:  # every reader refuses it (a root prolog among them): never write one
        raise InvalidInput(
            f"{root}: the manifest of {len(entries)} files would be {len(data)} bytes, more than the "
            f"{DATASET_MANIFEST_MAX_BYTES} every reader accepts; pack small files into archives (tar, WebDataset) "
            "and snapshot those (docs/datasets.md)"
        )
    written = store.put_if_absent(manifest_key(name, digest), data)  # last: the snapshot exists from here on
    log.info("snapshot name=%s digest=%s manifest_written=%s", name, digest, written)
    if tag is not None:
        try:
            set_tag(store, name, tag, digest, force=force_tag)
        except TagConflict as exc:  # e.g. someone created the tag during the upload: the snapshot itself exists
            raise TagConflict(f"snapshot {name}@{digest} was written, but the tag was not set: {exc}") from exc
    return SnapshotResult(
        name=name, digest=digest, files=len(manifest.files), total_bytes=total, shards=len(manifest.shards),
        shards_uploaded=writer.uploaded, shards_present=writer.present, bytes_uploaded=writer.bytes_uploaded,
        manifest_written=written, tag=tag, samples=grouped, sample_pattern=samples,
    )  # fmt: skip


def _without_finished(futures: list[Future]) -> list[Future]:
    """The futures still running; raises the error of the first one that failed (the one to report)."""
    for future in futures:
        if future.done() and future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    return [f for f in futures if not f.done()]

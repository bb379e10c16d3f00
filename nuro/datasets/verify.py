"""Verify a snapshot end to end: the manifest hashes to its digest, every shard to its name, every file to its hash.

Why re-hash everything rather than trust ETags: an ETag is the store's checksum of what it received (and for
multipart uploads not even that), so it cannot see a shard overwritten with other bytes — which is exactly what
must be caught before a job trains on it. Each shard is streamed once; the shard hash and the hash of every file
inside it are computed from the same pass, so a problem is reported with the files it affects.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from nuro.datasets.manifest import FileEntry, Manifest, ShardRef, shard_key
from nuro.datasets.refs import load_manifest
from nuro.objectstore import NotFound, ObjectStore

Progress = Callable[[int], None]
_NAMED_FILES = 5


@dataclass
class VerifyReport:
    name: str
    digest: str
    files: int = 0
    shards: int = 0
    bytes_checked: int = 0
    problems: list[str] = field(default_factory=list)
    bad_files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {
            "ref": f"{self.name}@{self.digest}", "ok": self.ok, "files": self.files, "shards": self.shards,
            "bytes_checked": self.bytes_checked, "problems": self.problems, "bad_files": self.bad_files,
        }  # fmt: skip


def _names(files: list[FileEntry]) -> str:
    shown = ", ".join(f.path for f in files[:_NAMED_FILES])
    return shown + (f" and {len(files) - _NAMED_FILES} more" if len(files) > _NAMED_FILES else "")


def check_shard(
    store: ObjectStore,
    shard: ShardRef,
    files: list[FileEntry],
    progress: Progress | None = None,
    name: str | None = None,
) -> tuple[list[str], list[str], int]:
    """Stream one shard of dataset ``name`` (None: a shared one); returns (problems, paths of bad files, bytes
    read). ``files`` sorted by offset."""
    key = shard_key(shard.digest, name)
    whole = hashlib.sha256()
    hashers = [hashlib.sha256() for _ in files]
    pos, i = 0, 0
    try:
        for chunk in store.iter_chunks(key):
            view = memoryview(chunk)
            end = pos + len(chunk)
            whole.update(view)
            # feed each file the part of the chunk it covers (files are sorted and do not overlap)
            j = i
            while j < len(files) and files[j].offset < end:
                f = files[j]
                lo, hi = max(f.offset, pos), min(f.offset + f.length, end)
                if hi > lo:
                    hashers[j].update(view[lo - pos : hi - pos])
                if f.offset + f.length <= end:
                    j += 1
                    i = j
                else:
                    break
            pos = end
            if progress:
                progress(len(chunk))
    except NotFound:
        return [f"shard {shard.digest} is missing from the store (files: {_names(files)})"], [f.path for f in files], 0
    problems: list[str] = []
    bad = [f.path for f, h in zip(files, hashers, strict=True) if "sha256:" + h.hexdigest() != f.sha256]
    actual = "sha256:" + whole.hexdigest()
    if pos != shard.size or actual != shard.digest:
        problems.append(
            f"shard {shard.digest} does not match its name: {pos} bytes hashing to {actual} (expected {shard.size} "
            f"bytes); files affected: {', '.join(bad) if bad else 'none of its files, the bytes between them'}"
        )
    problems.extend(f"file {p}: content does not match its sha256 in the manifest (shard {shard.digest})" for p in bad)
    return problems, bad, pos


def verify(
    store: ObjectStore, name: str, digest: str, *, workers: int = 4, progress: Progress | None = None
) -> VerifyReport:
    """Re-hash the manifest and every shard of ``name@digest``. Problems are collected, not raised, so one run
    names every bad file; a missing or altered manifest raises (``DatasetNotFound`` / ``IntegrityError``)."""
    manifest: Manifest
    manifest, _ = load_manifest(store, name, digest)
    report = VerifyReport(name, digest, files=len(manifest.files), shards=len(manifest.shards))
    by_shard: dict[str, list[FileEntry]] = {}
    for f in manifest.files:
        by_shard.setdefault(f.shard, []).append(f)
    for files in by_shard.values():
        files.sort(key=lambda f: (f.offset, f.path))
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="nuro-verify") as pool:
        results = pool.map(lambda s: check_shard(store, s, by_shard.get(s.digest, []), progress, name), manifest.shards)
        for problems, bad, nbytes in results:
            report.problems.extend(problems)
            report.bad_files.extend(bad)
            report.bytes_checked += nbytes
    report.bad_files.sort()
    return report

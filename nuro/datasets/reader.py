"""Reading files of a pinned snapshot from inside a job, verified against the manifest.

Why here and not in the training script: the job knows only ``NURO_DATASET`` and ``NURO_DATASET_DIGEST`` (the
submit-time pin), and the bytes it trains on must be exactly those the digest names. The manifest is checked against
the digest (``load_manifest``), the file's bytes against its sha256 in the manifest; a mismatch is an error, never
silently different data. One ranged GET per file, so a small file packed in a big shard costs only its own bytes.

The pieces (``pin_from_env``, ``read_range``, ``check_file``) are shared with the training SDK's
``SnapshotDataset`` (``nuro.wrappers.sdk.data``), which reads the same files through the node's shard cache.
"""

from __future__ import annotations

import hashlib
import os

from nuro.datasets.errors import DatasetNotFound, IntegrityError
from nuro.datasets.manifest import FileEntry, Manifest, shard_key
from nuro.datasets.refs import load_manifest
from nuro.objectstore import ObjectStore
from nuro.protocol.envnames import NURO_DATASET, NURO_DATASET_DIGEST


def pin_from_env() -> tuple[str, str]:
    """The job's pinned snapshot (``NURO_DATASET``, ``NURO_DATASET_DIGEST``, set by the rendered script)."""
    name, digest = os.environ.get(NURO_DATASET), os.environ.get(NURO_DATASET_DIGEST)
    if not name or not digest:
        raise DatasetNotFound(
            "NURO_DATASET / NURO_DATASET_DIGEST are not set: run under nuro-train submit or nuro-sbatch --dataset"
        )
    return name, digest


def read_range(store: ObjectStore, name: str, entry: FileEntry) -> bytes:
    """One file's bytes straight from its shard in the store (one ranged GET), unchecked: see ``check_file``."""
    return store.get_range(shard_key(entry.shard, name), entry.offset, entry.length)


def file_ok(entry: FileEntry, data: bytes) -> bool:
    return len(data) == entry.length and "sha256:" + hashlib.sha256(data).hexdigest() == entry.sha256


def check_file(name: str, digest: str, entry: FileEntry, data: bytes) -> bytes:
    """``data`` if it is exactly the file the manifest names, else IntegrityError naming the file and its shard."""
    if not file_ok(entry, data):
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        raise IntegrityError(
            f"{name}@{digest}: file {entry.path} read back as {len(data)} bytes hashing to {actual}, "
            f"expected {entry.length} bytes with {entry.sha256}: the shard {entry.shard} was altered"
        )
    return data


class PinnedDataset:
    """The snapshot a job is pinned to; ``read(path)`` returns one file's verified bytes."""

    def __init__(self, store: ObjectStore, name: str, digest: str) -> None:
        self.store = store
        self.name = name
        self.digest = digest
        self.manifest: Manifest = load_manifest(store, name, digest)[0]
        self._files = {f.path: f for f in self.manifest.files}

    @classmethod
    def from_env(cls, store: ObjectStore | None = None) -> PinnedDataset:
        """The job's pinned snapshot (``pin_from_env``)."""
        name, digest = pin_from_env()
        return cls(store or ObjectStore.from_env(), name, digest)

    def paths(self) -> list[str]:
        return sorted(self._files)

    def read(self, path: str) -> bytes:
        entry = self._files.get(path)
        if entry is None:
            raise DatasetNotFound(f"{self.name}@{self.digest} has no file {path!r} (it has {len(self._files)} files)")
        return check_file(self.name, self.digest, entry, read_range(self.store, self.name, entry))

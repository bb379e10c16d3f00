"""Reading one file of a pinned snapshot from inside a job, verified against the manifest.

Why here and not in the training script: the job knows only ``NURO_DATASET`` and ``NURO_DATASET_DIGEST`` (the
submit-time pin), and the bytes it trains on must be exactly those the digest names. The manifest is checked against
the digest (``load_manifest``), the file's bytes against its sha256 in the manifest; a mismatch is an error, never
silently different data. One ranged GET per file, so a small file packed in a big shard costs only its own bytes.
"""

from __future__ import annotations

import hashlib
import os

from nuro.datasets.errors import DatasetNotFound, IntegrityError
from nuro.datasets.manifest import Manifest, shard_key
from nuro.datasets.refs import load_manifest
from nuro.objectstore import ObjectStore


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
        """The job's pinned snapshot (``NURO_DATASET``/``NURO_DATASET_DIGEST``, set by the rendered script)."""
        name, digest = os.environ.get("NURO_DATASET"), os.environ.get("NURO_DATASET_DIGEST")
        if not name or not digest:
            raise DatasetNotFound(
                "NURO_DATASET / NURO_DATASET_DIGEST are not set: run under nuro-train submit or nuro-sbatch --dataset"
            )
        return cls(store or ObjectStore.from_env(), name, digest)

    def paths(self) -> list[str]:
        return sorted(self._files)

    def read(self, path: str) -> bytes:
        entry = self._files.get(path)
        if entry is None:
            raise DatasetNotFound(f"{self.name}@{self.digest} has no file {path!r} (it has {len(self._files)} files)")
        data = self.store.get_range(shard_key(entry.shard, self.name), entry.offset, entry.length)
        actual = "sha256:" + hashlib.sha256(data).hexdigest()
        if len(data) != entry.length or actual != entry.sha256:
            raise IntegrityError(
                f"{self.name}@{self.digest}: file {path} read back as {len(data)} bytes hashing to {actual}, "
                f"expected {entry.length} bytes with {entry.sha256}: the shard {entry.shard} was altered"
            )
        return data

"""In-memory snapshots, job side: each node's share of a snapshot goes to the next node of the job, so that the loss
of any one node leaves a full copy on the others (Gemini, SOSP '23; NVRx local checkpointing).

Path of one snapshot (``Checkpointer.maybe_save`` when ``NURO_SNAPSHOT_INTERVAL_S`` is due and a persistent save
is not)::

    snapshot(state, step)                      # training thread: the same staged copy as an async save
      └ DCP / DeepSpeed write → $NURO_SNAPSHOT_ROOT/<job>/ckpt/step-N/     (tmpfs: node memory)
          └ each node's leader: its files → the next node's leader (``exchange``, over a gloo group of the
            leaders, in the save's background thread), written beside the receiver's own
              └ leaders' barrier: every node holds its share and its neighbour's
                  └ each leader writes the upload requests of both shares (``tier: memory``); older snapshots go

Nothing uploads a snapshot while the job runs. When the job ends, each surviving node's epilog promotes the newest
complete one if it is newer than the newest committed checkpoint (``nuro.checkpoint.promote``): a requeue after a
node loss resumes seconds behind, not half a checkpoint interval.

Pure helpers here (``ring``, ``pack``/``unpack``); ``exchange`` is the one collective.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nuro.checkpoint.errors import InvalidCheckpointInput, ManifestError
from nuro.checkpoint.manifest import FileEntry, parse_files
from nuro.protocol.envnames import NURO_SNAPSHOT_INTERVAL_S
from nuro.safeio.atomic import write_atomic
from nuro.wrappers.sdk.runenv import env_seconds

ENV_INTERVAL = NURO_SNAPSHOT_INTERVAL_S
ENV_MAX_BYTES = "NURO_SNAPSHOT_MAX_BYTES"
ENV_DIR = "NURO_SNAPSHOT_DIR"
DEFAULT_MAX_BYTES = 8 << 30  # per node: two snapshots of its share and its neighbour's
_HEADER = struct.Struct("<Q")
MAX_FILES = 100_000


@dataclass(frozen=True)
class SnapshotSettings:
    """``interval_s``: seconds between snapshots (0 = off); ``max_bytes``: the most this node may hold (its share
    and its neighbour's, of two snapshots); above it snapshots stop, loudly."""

    interval_s: float = 0.0
    max_bytes: int = DEFAULT_MAX_BYTES

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SnapshotSettings:
        e = os.environ if env is None else env
        interval = env_seconds(e, ENV_INTERVAL, error=InvalidCheckpointInput, allow_zero=True) or 0.0
        raw = e.get(ENV_MAX_BYTES, "").strip()
        try:
            max_bytes = int(raw) if raw else DEFAULT_MAX_BYTES
        except ValueError:
            raise InvalidCheckpointInput(f"{ENV_MAX_BYTES}={raw!r} is not a number of bytes") from None
        if max_bytes <= 0:
            raise InvalidCheckpointInput(f"{ENV_MAX_BYTES} must be positive, got {max_bytes}")
        return cls(interval, max_bytes)


def ring(parts: int, part: int) -> tuple[int, int]:
    """(the part this node sends its share to, the part it receives one from): the next and the previous node."""
    return (part + 1) % parts, (part - 1) % parts


def pack(files: Sequence[tuple[FileEntry, bytes]]) -> bytes:
    """One buffer of (file entry, bytes) pairs: a length-prefixed JSON index (path, size, sha256), then the bytes in
    order. The sender's sha256 travels along: the receiver lists it in its request unhashed, and the upload worker,
    which hashes every byte it sends, refuses a share that does not match (a promoted step then falls back)."""
    index = json.dumps([[f.path, f.size, f.sha256] for f, _ in files]).encode()
    return b"".join([_HEADER.pack(len(index)), index, *(data for _, data in files)])


def unpack(blob: bytes) -> list[tuple[FileEntry, bytes]]:
    """The inverse of ``pack``, strict: every path a safe relative path, the sizes adding up to the buffer."""
    if len(blob) < _HEADER.size:
        raise InvalidCheckpointInput("snapshot share: buffer shorter than its header")
    (n,) = _HEADER.unpack_from(blob)
    start = _HEADER.size + n
    try:
        index = json.loads(blob[_HEADER.size : start])
    except ValueError as exc:
        raise InvalidCheckpointInput(f"snapshot share: unreadable index ({exc})") from None
    if not isinstance(index, list) or len(index) > MAX_FILES:
        raise InvalidCheckpointInput("snapshot share: the index is not a list of files")
    out, at = [], start
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 3 and type(entry[1]) is int and entry[1] >= 0):
            raise InvalidCheckpointInput(f"snapshot share: bad index entry {entry!r:.100}")
        try:
            (f,) = parse_files([{"path": entry[0], "size": entry[1], "sha256": entry[2]}], "snapshot share")
        except ManifestError as exc:
            raise InvalidCheckpointInput(str(exc)) from None
        out.append((f, blob[at : at + f.size]))
        at += f.size
    if at != len(blob):
        raise InvalidCheckpointInput(f"snapshot share: {len(blob) - at} bytes beyond its index")
    return out


def exchange(dist: Any, group: Any, to_rank: int, from_rank: int, blob: bytes) -> bytes:
    """Send ``blob`` to ``to_rank`` and receive one from ``from_rank`` (global ranks of ``group``), at once: with two
    nodes they are the same peer. Sizes first, then the bytes, as uint8 tensors over gloo."""
    import torch  # lazy: torch is the optional 'train' extra

    size_out = torch.tensor([len(blob)], dtype=torch.int64)
    size_in = torch.zeros(1, dtype=torch.int64)
    for w in (dist.isend(size_out, to_rank, group=group), dist.irecv(size_in, from_rank, group=group)):
        w.wait()
    out = torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else torch.empty(0, dtype=torch.uint8)
    got = torch.empty(int(size_in.item()), dtype=torch.uint8)
    for w in (dist.isend(out, to_rank, group=group), dist.irecv(got, from_rank, group=group)):
        w.wait()
    return got.numpy().tobytes()


def write_share(step_dir: Path, files: Sequence[tuple[FileEntry, bytes]]) -> None:
    """Write the neighbour's share beside this node's own (its files have other names: a DCP or ZeRO file is one
    rank's; a DeepSpeed model-states copy this node also wrote, but does not own, is replaced by the owner's)."""
    for entry, data in files:
        dest = step_dir / entry.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dest, data, durable=False)  # node memory (tmpfs): nothing to make durable


def held_bytes(snapshot_dir: Path) -> int:
    """Bytes this node holds in snapshots now (every file below the job's snapshot dir)."""
    total = 0
    for dirpath, _dirs, names in os.walk(snapshot_dir):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


__all__ = [
    "DEFAULT_MAX_BYTES",
    "ENV_DIR",
    "ENV_INTERVAL",
    "ENV_MAX_BYTES",
    "SnapshotSettings",
    "exchange",
    "held_bytes",
    "pack",
    "ring",
    "unpack",
    "write_share",
]

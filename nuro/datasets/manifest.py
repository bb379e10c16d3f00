"""The pure core of dataset snapshots: names and references, S3 keys, the manifest and its digest, shard packing.

Nothing here touches the store or the file system, so every rule is unit-tested on its own.

S3 key layout (all under the bucket). A dataset is either *shared* or *owned by a team*, and its name says which:
``<team>.<rest>`` (the part before the first ``.`` is a team name: lower-case letter first, then letters, digits or
``_``) belongs to that team; any other name is shared. Each kind lives under its own prefix, so an S3 identity
policy can grant each team exactly its own prefix (docs/security.md):

- shared, written by the platform (admin), read by every team::

    datasets/shards/sha256/<hex>                    a shard, the files' bytes concatenated; <hex> is its sha256
    datasets/<name>/manifests/sha256:<hex>.json     the manifest (canonical JSON); its sha256 is the snapshot digest
    datasets/<name>/tags/<tag>                      a mutable ref

- owned by ``<team>``, written and read by that team only (and read by the nodes)::

    team-datasets/<team>/shards/sha256/<hex>
    team-datasets/<team>/<team>.<rest>/manifests/sha256:<hex>.json
    team-datasets/<team>/<team>.<rest>/tags/<tag>

Why each team has its own shard store: a shard key is content-addressed, so whoever may write the shard prefix may
also delete or overwrite a shard that another team's manifests name (S3 ``Write`` includes delete, and nothing makes
a plain PUT conditional server-side). A shared, team-writable shard store would let one team destroy another's
snapshots; dedup therefore stops at the team boundary (docs/security.md has the reasoning).

Shards are written with ``If-None-Match: *`` and skipped when already present; the manifest is written last, with
``If-None-Match: *``; a tag is JSON ``{"digest", "previous", "updated", "name", "tag"}``, created with
``If-None-Match: *``, moved with ``If-Match: <etag read>``.

Manifest (format ``nuro.dataset/v1``), serialised with sorted keys, no whitespace, UTF-8::

    {"created": "2026-01-02T03:04:05Z", "files": {"a/b.bin": {"length": 3, "mode": 420, "offset": 0,
     "sha256": "sha256:…", "shard": "sha256:…"}}, "format": "nuro.dataset/v1", "name": "imagenet",
     "shards": [{"digest": "sha256:…", "size": 3}]}

plus ``"samples": "<regular expression>"`` when the snapshot was taken with a sample index (``--samples``): which
files make one training example, stored with the digest so every reader groups alike (absent: one per file).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nuro import names
from nuro.datasets.errors import IntegrityError, InvalidInput
from nuro.datasets.samples import compile_pattern, group_samples

FORMAT = "nuro.dataset/v1"
MiB = 1024 * 1024
SHARD_TARGET_BYTES = 64 * MiB
MAX_PATH_BYTES = 4096
PREFIX = "datasets/"
TEAM_PREFIX = "team-datasets/"

#: A team-owned name's owner: a team (``nuro.names.TEAM``) before the first '.'.
_OWNER = re.compile(rf"({names.TEAM})\.")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# -- names, references, keys ----------------------------------------------------------------------------------
def validate_name(name: str) -> str:
    if not isinstance(name, str) or not names.is_dataset(name):
        raise InvalidInput(
            f"bad dataset name {name!r}: use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a "
            "letter or digit (e.g. imagenet-1k)"
        )
    return name


def validate_tag(tag: str) -> str:
    if not isinstance(tag, str) or not names.is_tag(tag):
        raise InvalidInput(
            f"bad tag {tag!r}: use 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit "
            "(e.g. latest, v2)"
        )
    return tag


def validate_digest(digest: str) -> str:
    if not isinstance(digest, str) or not names.is_digest(digest):
        raise InvalidInput(f"bad digest {digest!r}: expected 'sha256:' followed by 64 lower-case hex digits")
    return digest


def sha256_digest(data: bytes | bytearray | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Ref:
    """``name@tag`` (mutable, resolved once at submit) or ``name@sha256:<hex>`` (pinned)."""

    name: str
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        return f"{self.name}@{self.digest or self.tag}"

    @property
    def is_pinned(self) -> bool:
        return self.digest is not None


def parse_ref(text: str) -> Ref:
    name, sep, rest = text.partition("@") if isinstance(text, str) else ("", "", "")
    if not sep or not rest:
        raise InvalidInput(f"bad dataset reference {text!r}: write NAME@TAG or NAME@sha256:<64 hex digits>")
    validate_name(name)
    if rest.startswith("sha256:"):
        return Ref(name, digest=validate_digest(rest))
    return Ref(name, tag=validate_tag(rest))


def owner_team(name: str) -> str | None:
    """The team that owns dataset ``name`` (``<team>.<rest>``), or None for a shared dataset."""
    m = _OWNER.match(validate_name(name))
    return m.group(1) if m else None


def dataset_root(name: str) -> str:
    """The key prefix everything of one dataset lives under (``datasets/<name>/`` or the team's)."""
    team = owner_team(name)
    return f"{TEAM_PREFIX}{team}/{name}/" if team else f"{PREFIX}{name}/"


def shards_root(name: str | None = None) -> str:
    """Where the shards of ``name`` live: the team's own store for a team dataset, else the shared one."""
    team = owner_team(name) if name is not None else None
    return f"{TEAM_PREFIX}{team}/shards/sha256/" if team else f"{PREFIX}shards/sha256/"


def shard_key(digest: str, name: str | None = None) -> str:
    """The key of a shard of dataset ``name`` (None: the shared store, where every shared dataset's shards are)."""
    return shards_root(name) + validate_digest(digest).removeprefix("sha256:")


def manifest_key(name: str, digest: str) -> str:
    return f"{dataset_root(name)}manifests/{validate_digest(digest)}.json"


def manifests_prefix(name: str) -> str:
    return f"{dataset_root(name)}manifests/"


def tag_key(name: str, tag: str) -> str:
    return f"{dataset_root(name)}tags/{validate_tag(tag)}"


def tags_prefix(name: str) -> str:
    return f"{dataset_root(name)}tags/"


# -- paths ----------------------------------------------------------------------------------------------------
def path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a manifest path, or None. Paths are relative POSIX paths that cannot escape the
    dataset root on any reader: no absolute path, no '.' or '..' component, no empty component, no control
    characters (NUL and newline included), valid UTF-8, at most 4096 bytes."""
    if not isinstance(path, str) or not path:
        return "empty path"
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        return "not valid UTF-8"
    if size > MAX_PATH_BYTES:
        return f"longer than {MAX_PATH_BYTES} bytes"
    if _CONTROL.search(path):
        return "contains a control character (NUL, newline, tab, …)"
    if path.startswith("/"):
        return "absolute path"
    parts = path.split("/")
    if ".." in parts:
        return "contains a '..' component"
    if "." in parts or "" in parts:
        return "contains an empty or '.' component"
    return None


def validate_path(path: str) -> str:
    problem = path_problem(path)
    if problem:
        raise InvalidInput(f"bad path {path!r} in dataset: {problem}")
    return path


# -- the manifest ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FileEntry:
    """One file: where its bytes sit (shard, offset, length), their sha256, and its permission bits."""

    path: str
    shard: str
    offset: int
    length: int
    sha256: str
    mode: int = 0o644


@dataclass(frozen=True)
class ShardRef:
    digest: str
    size: int


@dataclass(frozen=True)
class Manifest:
    name: str
    created: str
    files: tuple[FileEntry, ...]
    shards: tuple[ShardRef, ...]
    format: str = field(default=FORMAT)
    #: The snapshot's sample index: a regular expression grouping files into samples (``nuro.datasets.samples``),
    #: chosen when the snapshot is taken, so every reader of the digest groups alike. None: one sample per file.
    #: Stored only when set: a snapshot taken without it keeps the digest it always had.
    samples: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.length for f in self.files)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "name": self.name,
            "created": self.created,
            "files": {
                f.path: {"shard": f.shard, "offset": f.offset, "length": f.length, "sha256": f.sha256, "mode": f.mode}
                for f in self.files
            },
            "shards": [{"digest": s.digest, "size": s.size} for s in self.shards],
            **({"samples": self.samples} if self.samples is not None else {}),
        }

    def canonical_bytes(self) -> bytes:
        """The bytes whose sha256 is the snapshot digest: sorted keys, no whitespace, UTF-8 (deterministic)."""
        return json.dumps(self.to_json_obj(), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    def digest(self) -> str:
        return sha256_digest(self.canonical_bytes())

    def sample_shards(self, pattern: str | None = None) -> tuple[list[tuple[str, ...]], list[int]]:
        """The samples (``pattern``, default the snapshot's own index) and, for each, the shard it is read from (its
        first file's, as an index into ``shards``): what the loader's block shuffle groups by. One function, so the
        prolog's prefetch and every rank group alike."""
        samples = group_samples((f.path for f in self.files), pattern if pattern is not None else self.samples)
        shard_ids = {s.digest: i for i, s in enumerate(self.shards)}
        by_path = {f.path: f.shard for f in self.files}
        return samples, [shard_ids[by_path[s[0]]] for s in samples]

    def files_in(self, shard: str) -> list[FileEntry]:
        """The files stored in ``shard``, by offset (the order a reader streams them)."""
        return sorted((f for f in self.files if f.shard == shard), key=lambda f: (f.offset, f.path))


def build_manifest(
    name: str, created: str, files: Sequence[FileEntry], shards: Sequence[ShardRef], samples: str | None = None
) -> Manifest:
    """A manifest with files sorted by path and each shard listed once, in first-use order; validated. ``samples``:
    the sample pattern to store (it must group at least one of the files: ``InvalidInput`` otherwise)."""
    seen: dict[str, ShardRef] = {}
    for s in shards:
        seen.setdefault(s.digest, s)
    ordered = tuple(sorted(files, key=lambda f: f.path))
    if samples is not None:
        group_samples((f.path for f in ordered), samples)  # raises InvalidInput naming the pattern and the files
    manifest = Manifest(validate_name(name), created, ordered, tuple(seen.values()), samples=samples)
    _check(manifest)
    return manifest


def _check(m: Manifest) -> None:
    """Structural rules every stored manifest obeys; raises IntegrityError naming the first violation."""
    sizes = {s.digest: s.size for s in m.shards}
    if len(sizes) != len(m.shards):
        raise IntegrityError(f"manifest of {m.name}: a shard is listed twice")
    used: dict[str, list[FileEntry]] = {}
    for f in m.files:
        problem = path_problem(f.path)
        if problem:
            raise IntegrityError(f"manifest of {m.name}: bad path {f.path!r}: {problem}")
        if f.shard not in sizes:
            raise IntegrityError(f"manifest of {m.name}: {f.path} refers to unlisted shard {f.shard}")
        if f.offset < 0 or f.length < 0 or f.offset + f.length > sizes[f.shard]:
            raise IntegrityError(f"manifest of {m.name}: {f.path} lies outside shard {f.shard}")
        if not 0 <= f.mode <= 0o7777:
            raise IntegrityError(f"manifest of {m.name}: {f.path} has bad mode {f.mode!r}")
        used.setdefault(f.shard, []).append(f)
    for shard, entries in used.items():
        entries.sort(key=lambda f: f.offset)
        for a, b in zip(entries, entries[1:], strict=False):
            if a.offset + a.length > b.offset:
                raise IntegrityError(f"manifest of {m.name}: {a.path} and {b.path} overlap in shard {shard}")


def parse_manifest(data: bytes, expect_name: str | None = None) -> Manifest:
    """Parse and validate stored manifest bytes (the caller has already checked their digest)."""
    try:
        obj = json.loads(data)
        if obj.get("format") != FORMAT:
            raise IntegrityError(f"unknown manifest format {obj.get('format')!r} (this nuro reads {FORMAT})")
        files = tuple(
            FileEntry(
                path=str(path), shard=validate_digest(e["shard"]), offset=_int(e["offset"]),
                length=_int(e["length"]), sha256=validate_digest(e["sha256"]), mode=_int(e["mode"]),
            )
            for path, e in obj["files"].items()
        )  # fmt: skip
        shards = tuple(ShardRef(validate_digest(s["digest"]), _int(s["size"])) for s in obj["shards"])
        samples = obj.get("samples")
        if samples is not None:
            if not isinstance(samples, str):
                raise IntegrityError(f"manifest sample pattern is {type(samples).__name__}, not a string")
            try:
                compile_pattern(samples)
            except InvalidInput as exc:
                raise IntegrityError(f"manifest sample pattern: {exc}") from None
        manifest = Manifest(validate_name(obj["name"]), str(obj["created"]), files, shards, FORMAT, samples)
    except IntegrityError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise IntegrityError(f"malformed manifest: {exc}") from exc
    if expect_name is not None and manifest.name != expect_name:
        raise IntegrityError(f"manifest names dataset {manifest.name!r}, stored under {expect_name!r}")
    _check(manifest)
    return manifest


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r}")
    return value


# -- packing files into shards --------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceFile:
    path: str
    size: int
    mode: int = 0o644


@dataclass(frozen=True)
class PlannedShard:
    """Files whose bytes are concatenated, in this order, into one shard."""

    files: tuple[SourceFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def offsets(self) -> list[int]:
        out, pos = [], 0
        for f in self.files:
            out.append(pos)
            pos += f.size
        return out


def _cut_after(f: SourceFile, span_bytes: int) -> bool:
    """A boundary after ``f`` with probability size/span, decided by a hash of its path: the same file always
    decides the same way, whatever precedes it."""
    h = int.from_bytes(hashlib.sha256(f.path.encode()).digest()[:8], "big")
    return h * span_bytes < f.size * (1 << 64)


def plan_shards(files: Sequence[SourceFile], target_bytes: int = SHARD_TARGET_BYTES) -> list[PlannedShard]:
    """Pack files, in path order, into shards of about ``target_bytes`` (between 1/4 and 2× of it).

    Boundaries are content-defined at file granularity (``_cut_after``) rather than "cut at 64 MiB": a file
    added, removed or resized changes only the shard it sits in (and perhaps the next), and every other shard
    keeps its bytes, so its digest, so a new snapshot of a slightly changed tree re-uploads one or two shards
    instead of everything after the change. A file of 2× target or more gets a shard of its own.
    """
    if target_bytes < 4:
        raise ValueError(f"target_bytes must be at least 4, got {target_bytes}")
    low, high = target_bytes // 4, 2 * target_bytes
    span = target_bytes - low  # expected bytes past the minimum before a boundary: average shard ≈ target
    shards: list[PlannedShard] = []
    current: list[SourceFile] = []
    size = 0

    def close() -> None:
        nonlocal current, size
        if current:
            shards.append(PlannedShard(tuple(current)))
        current, size = [], 0

    for f in sorted(files, key=lambda f: f.path):
        if f.size >= high:
            close()
            shards.append(PlannedShard((f,)))
            continue
        if size + f.size > high:
            close()
        current.append(f)
        size += f.size
        if size >= low and _cut_after(f, span):
            close()
    close()
    return shards

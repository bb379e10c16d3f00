"""The checkpoint records: the upload request a node leaves for its upload worker, the part record each node writes
to S3, and the manifest that commits a checkpoint. Pure: parse, validate, serialise.

Every record is JSON with a ``format`` field and is parsed strictly: unknown formats, missing or mistyped fields,
bad paths and inconsistent totals raise ``ManifestError`` naming the field, so a damaged or forged record is never
trusted (a root prolog reads them).

Manifest (``nuro.checkpoint/v1``)::

    {"format": "nuro.checkpoint/v1", "team": "vision", "run": "resnet", "step": 1200, "job_id": "4711",
     "restart": 0, "created_at": "2026-01-02T03:04:05Z", "parent": 1100, "world_size": 16, "parts": 2,
     "shards": [{"path": ".metadata", "size": 812, "sha256": "<64 hex>"}, ...], "total_bytes": 123456}

``parent`` is the newest older step of the run that was committed when this one was (lineage), or null. Commits
of different steps can land out of order (each waits for its slowest node), so it is a lower bound, not a chain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nuro.checkpoint.errors import InvalidCheckpointInput, ManifestError
from nuro.checkpoint.layout import (
    validate_job_id,
    validate_node,
    validate_path,
    validate_run,
    validate_step,
    validate_team,
)

MANIFEST_FORMAT = "nuro.checkpoint/v1"
PART_FORMAT = "nuro.checkpoint-part/v1"
REQUEST_FORMAT = "nuro.checkpoint-upload/v1"
INCOMPLETE_FORMAT = "nuro.checkpoint-incomplete/v1"
_SHA = re.compile(r"[0-9a-f]{64}")
MAX_PARTS = 100_000


#: Where a checkpoint's bytes were taken from (``tier``): the job's periodic checkpoint, or an in-memory snapshot that a
#: surviving node promoted after a node loss (``nuro.checkpoint.promote``). Written only when not the default, so a
#: periodic checkpoint's records are byte for byte what they were.
TIER_PERSISTENT = "persistent"
TIER_MEMORY = "memory"
TIERS = (TIER_PERSISTENT, TIER_MEMORY)

#: How manifests, parts and upload requests write a time (whole seconds, UTC).
UTC_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def utc_now() -> str:
    return datetime.now(UTC).strftime(UTC_FORMAT)


def utc_seconds(text: str) -> float:
    """Unix seconds of a time written by ``utc_now``. Raises ValueError for anything else."""
    return datetime.strptime(text, UTC_FORMAT).replace(tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint directory, size in bytes, sha256 (hex)."""

    path: str
    size: int
    sha256: str

    def to_json_obj(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}

    @classmethod
    def of_bytes(cls, path: str, data: bytes) -> FileEntry:
        """The entry of a file whose bytes are in hand (a snapshot share received from another node)."""
        return cls(validate_path(path), len(data), hashlib.sha256(data).hexdigest())


@dataclass(frozen=True)
class Attempt:
    """Who wrote a record: the Slurm job and its restart count. A requeued job keeps its id, so both are needed
    to tell a stale record of an earlier attempt from the current one."""

    job_id: str
    restart: int


@dataclass(frozen=True)
class _NodePart:
    """What an upload request and the part record made from it share: one node's files of one step of an attempt.
    ``part`` is the node's rank among ``parts_expected`` nodes."""

    team: str
    run: str
    step: int
    job_id: str
    restart: int
    part: int
    parts_expected: int
    world_size: int
    files: tuple[FileEntry, ...]
    created_at: str
    tier: str = TIER_PERSISTENT

    @property
    def attempt(self) -> Attempt:
        return Attempt(self.job_id, self.restart)

    def _json_obj(self, fmt: str) -> dict[str, Any]:
        return {
            "format": fmt, "team": self.team, "run": self.run, "step": self.step, "job_id": self.job_id,
            "restart": self.restart, "part": self.part, "parts_expected": self.parts_expected,
            "world_size": self.world_size, "files": [f.to_json_obj() for f in self.files],
            "created_at": self.created_at, **_tier_obj(self.tier),
        }  # fmt: skip


@dataclass(frozen=True)
class UploadRequest(_NodePart):
    """What one node asks its upload worker to do (``step-N/.upload-<part>.json``); ``keep`` is the retention count
    (None = keep everything). The job writes it: root binds it to the job record first (``bind_request``).

    ``writers``: the Slurm node of every part, by part (empty where unknown, e.g. outside Slurm). Why: a step whose
    writer node is lost before its share is uploaded can never commit, and the epilog of a surviving node must know
    that at once instead of waiting for it until a timeout (``nuro.checkpoint.lostwriters``). The job writes the
    list, so it can only make its own step be given up early."""

    keep: int | None = None
    writers: tuple[str, ...] = ()

    def to_json_obj(self) -> dict[str, Any]:
        return {**self._json_obj(REQUEST_FORMAT), "keep": self.keep, "writers": list(self.writers)}


@dataclass(frozen=True)
class PartRecord(_NodePart):
    """What one node uploaded for a step (``parts/<part>.json``): the manifest is the union of all parts."""

    @classmethod
    def from_request(cls, req: UploadRequest) -> PartRecord:
        shared = {f.name: getattr(req, f.name) for f in dataclasses.fields(_NodePart)}
        return cls(**{**shared, "created_at": utc_now()})

    def to_json_obj(self) -> dict[str, Any]:
        return self._json_obj(PART_FORMAT)


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint. Valid iff it exists in S3 and every shard verifies (size + sha256)."""

    team: str
    run: str
    step: int
    job_id: str
    restart: int
    created_at: str
    parent: int | None
    world_size: int
    parts: int
    shards: tuple[FileEntry, ...]
    total_bytes: int
    format: str = MANIFEST_FORMAT
    tier: str = TIER_PERSISTENT

    @property
    def attempt(self) -> Attempt:
        return Attempt(self.job_id, self.restart)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": self.format, "team": self.team, "run": self.run, "step": self.step, "job_id": self.job_id,
            "restart": self.restart, "created_at": self.created_at, "parent": self.parent,
            "world_size": self.world_size, "parts": self.parts, "shards": [s.to_json_obj() for s in self.shards],
            "total_bytes": self.total_bytes, **_tier_obj(self.tier),
        }  # fmt: skip

    def to_bytes(self) -> bytes:
        return dumps(self.to_json_obj())


@dataclass(frozen=True)
class Incomplete:
    """``incomplete.json``: the epilog gave up on a step (its uploads did not finish in time). Never valid."""

    team: str
    run: str
    step: int
    job_id: str
    restart: int
    reason: str
    missing_parts: tuple[int, ...]
    created_at: str

    @property
    def attempt(self) -> Attempt:
        return Attempt(self.job_id, self.restart)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": INCOMPLETE_FORMAT, "team": self.team, "run": self.run, "step": self.step,
            "job_id": self.job_id, "restart": self.restart, "reason": self.reason,
            "missing_parts": list(self.missing_parts), "created_at": self.created_at,
        }  # fmt: skip


def _tier_obj(tier: str) -> dict[str, str]:
    return {} if tier == TIER_PERSISTENT else {"tier": tier}


def dumps(obj: Mapping[str, Any]) -> bytes:
    """Stable JSON (sorted keys, compact), so equal records are equal bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


# -- strict parsing --------------------------------------------------------------------------------------------
class _Fields:
    """Typed field access over a parsed JSON object; every error names the record and the field."""

    def __init__(self, data: bytes | str | Mapping[str, Any], what: str, fmt: str) -> None:
        self.what = what
        if isinstance(data, Mapping):
            obj: Any = data
        else:
            try:
                obj = json.loads(data)
            except ValueError as exc:
                raise ManifestError(f"{what}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ManifestError(f"{what}: expected a JSON object, got {type(obj).__name__}")
        self.obj = obj
        if obj.get("format") != fmt:
            raise ManifestError(f"{what}: unknown format {obj.get('format')!r} (this nuro reads {fmt})")

    def _get(self, key: str) -> Any:
        if key not in self.obj:
            raise ManifestError(f"{self.what}: missing field {key!r}")
        return self.obj[key]

    def int(self, key: str, minimum: int = 0, maximum: int | None = None) -> int:
        v = self._get(key)
        if type(v) is not int or v < minimum or (maximum is not None and v > maximum):
            bounds = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
            raise ManifestError(f"{self.what}: field {key!r} must be an integer {bounds}, got {v!r}")
        return v

    def opt_int(self, key: str, minimum: int = 0) -> int | None:
        if self.obj.get(key) is None:
            return None
        return self.int(key, minimum)

    def str(self, key: str, max_len: int = 200) -> str:
        v = self._get(key)
        if not isinstance(v, str) or len(v) > max_len:
            raise ManifestError(f"{self.what}: field {key!r} must be a string of at most {max_len} characters")
        return v

    def tier(self) -> str:
        v = self.obj.get("tier", TIER_PERSISTENT)
        if v not in TIERS:
            raise ManifestError(f"{self.what}: field 'tier' must be one of {list(TIERS)}, got {v!r:.80}")
        return v

    def checked(self, key: str, validate: Any) -> Any:
        try:
            return validate(self._get(key))
        except InvalidCheckpointInput as exc:
            raise ManifestError(f"{self.what}: field {key!r}: {exc}") from None

    def files(self, key: str) -> tuple[FileEntry, ...]:
        raw = self._get(key)
        if not isinstance(raw, list):
            raise ManifestError(f"{self.what}: field {key!r} must be a list of {{path, size, sha256}}")
        return parse_files(raw, f"{self.what}: {key}")


def parse_files(raw: Iterable[Any], what: str) -> tuple[FileEntry, ...]:
    """File entries ({path, size, sha256}, strict): the one parser of every list of checkpoint files."""
    out: list[FileEntry] = []
    seen: set[str] = set()
    for i, e in enumerate(raw):
        if not isinstance(e, dict) or set(e) != {"path", "size", "sha256"}:
            raise ManifestError(f"{what}[{i}]: expected exactly {{path, size, sha256}}, got {e!r:.200}")
        try:
            path = validate_path(e["path"])
        except InvalidCheckpointInput as exc:
            raise ManifestError(f"{what}[{i}]: {exc}") from None
        size, sha = e["size"], e["sha256"]
        if type(size) is not int or size < 0:
            raise ManifestError(f"{what}[{i}] {path}: size must be a non-negative integer, got {size!r}")
        if not isinstance(sha, str) or not _SHA.fullmatch(sha):
            raise ManifestError(f"{what}[{i}] {path}: sha256 must be 64 lower-case hex digits, got {sha!r:.80}")
        if path in seen:
            raise ManifestError(f"{what}: {path} is listed twice")
        seen.add(path)
        out.append(FileEntry(path, size, sha))
    return tuple(out)


def _identity(f: _Fields) -> dict[str, Any]:
    return {
        "team": f.checked("team", validate_team),
        "run": f.checked("run", validate_run),
        "step": f.checked("step", validate_step),
        "job_id": f.checked("job_id", validate_job_id),
        "restart": f.int("restart"),
    }


def parse_manifest(data: bytes | str | Mapping[str, Any], *, what: str = "manifest") -> Manifest:
    """Parse and validate a stored manifest; raises ManifestError naming the first problem."""
    f = _Fields(data, what, MANIFEST_FORMAT)
    ident = _identity(f)
    parts = f.int("parts", 1, MAX_PARTS)
    world = f.int("world_size", 1)
    shards = f.files("shards")
    total = f.int("total_bytes")
    if not shards:
        raise ManifestError(f"{what}: lists no shards")
    if sum(s.size for s in shards) != total:
        raise ManifestError(f"{what}: total_bytes {total} is not the sum of the shard sizes")
    parent = f.opt_int("parent")
    if parent is not None and parent >= ident["step"]:
        raise ManifestError(f"{what}: parent step {parent} is not before step {ident['step']}")
    return Manifest(
        **ident, created_at=f.str("created_at"), parent=parent, world_size=world, parts=parts, shards=shards,
        total_bytes=total, tier=f.tier(),
    )  # fmt: skip


def _part_fields(f: _Fields) -> dict[str, Any]:
    fields = {**_identity(f), "part": f.int("part"), "parts_expected": f.int("parts_expected", 1, MAX_PARTS)}
    if fields["part"] >= fields["parts_expected"]:
        raise ManifestError(f"{f.what}: part {fields['part']} is not below parts_expected {fields['parts_expected']}")
    fields["world_size"] = f.int("world_size", 1)
    fields["files"] = f.files("files")
    fields["created_at"] = f.str("created_at")
    fields["tier"] = f.tier()
    return fields


def parse_request(data: bytes | str | Mapping[str, Any], *, what: str = "upload request") -> UploadRequest:
    f = _Fields(data, what, REQUEST_FORMAT)
    fields = _part_fields(f)
    return UploadRequest(**fields, keep=f.opt_int("keep", 1), writers=_writers(f, fields["parts_expected"]))


def _writers(f: _Fields, parts: int) -> tuple[str, ...]:
    """The optional ``writers`` list: absent or empty, or exactly one Slurm node name per part."""
    raw = f.obj.get("writers") or []
    if not isinstance(raw, list) or len(raw) not in (0, parts):
        raise ManifestError(f"{f.what}: field 'writers' must list one node per part ({parts}), got {raw!r:.200}")
    try:
        return tuple(validate_node(n) for n in raw)
    except InvalidCheckpointInput as exc:
        raise ManifestError(f"{f.what}: field 'writers': {exc}") from None


def bind_request(
    req: UploadRequest, *, team: str, run: str, job_id: str, restart: int, keep: int | None
) -> UploadRequest:
    """The request as root acts on it: whose checkpoint it is comes from the root-owned job record (the
    arguments), never from the request, which the job's user writes. The request may only choose the step, its
    part and its files; a request naming another team, run, job or attempt is refused (ManifestError naming both
    sides), and its ``keep`` is replaced by the record's (retention is not the job's to choose as root)."""
    theirs = {"team": req.team, "run": req.run, "job_id": req.job_id, "restart": req.restart}
    ours = {"team": team, "run": run, "job_id": job_id, "restart": restart}
    wrong = [k for k in ours if theirs[k] != ours[k]]
    if wrong:
        said = ", ".join(f"{k}={theirs[k]!r}" for k in wrong)
        real = ", ".join(f"{k}={ours[k]!r}" for k in wrong)
        raise ManifestError(
            f"upload request of step {req.step} names {said} but the job record says {real}: refused (a job may "
            "upload only its own run's checkpoints)"
        )
    return dataclasses.replace(req, keep=keep)


def parse_part(data: bytes | str | Mapping[str, Any], *, what: str = "part record") -> PartRecord:
    return PartRecord(**_part_fields(_Fields(data, what, PART_FORMAT)))


def parse_incomplete(data: bytes | str | Mapping[str, Any], *, what: str = "incomplete.json") -> Incomplete:
    f = _Fields(data, what, INCOMPLETE_FORMAT)
    missing = f.obj.get("missing_parts", [])
    if not isinstance(missing, list) or not all(type(p) is int and p >= 0 for p in missing):
        raise ManifestError(f"{what}: missing_parts must be a list of part numbers")
    return Incomplete(
        **_identity(f), reason=f.str("reason", 2000), missing_parts=tuple(missing), created_at=f.str("created_at")
    )


def build_manifest(parts: Iterable[PartRecord], *, parent: int | None, created_at: str | None = None) -> Manifest:
    """Merge the part records of one attempt into the manifest.

    Rules: every part belongs to the same team/run/step/attempt and agrees on parts_expected and world_size; parts
    0..parts_expected-1 are all present, once each; a file path appears in one part only (two nodes claiming the
    same path is an error that names both) and the result lists shards sorted by path.
    """
    records = sorted(parts, key=lambda p: p.part)
    if not records:
        raise ManifestError("no part records to build a manifest from")
    first = records[0]
    key = (first.team, first.run, first.step, first.attempt, first.parts_expected, first.world_size)
    for p in records:
        if (p.team, p.run, p.step, p.attempt, p.parts_expected, p.world_size) != key:
            raise ManifestError(
                f"part {p.part} of step {p.step} belongs to {p.team}/{p.run} job {p.job_id}.{p.restart} "
                f"({p.parts_expected} parts, world {p.world_size}); part {first.part} to {first.team}/{first.run} "
                f"job {first.job_id}.{first.restart} ({first.parts_expected} parts, world {first.world_size})"
            )
    numbers = [p.part for p in records]
    if numbers != list(range(first.parts_expected)):
        raise ManifestError(f"step {first.step}: have parts {numbers}, need 0..{first.parts_expected - 1}")
    owner: dict[str, int] = {}
    shards: list[FileEntry] = []
    for p in records:
        for f in p.files:
            if f.path in owner:
                raise ManifestError(f"step {first.step}: {f.path} uploaded by parts {owner[f.path]} and {p.part}")
            owner[f.path] = p.part
            shards.append(f)
    shards.sort(key=lambda s: s.path)
    if parent is not None and parent >= first.step:
        parent = None
    tier = TIER_MEMORY if any(p.tier == TIER_MEMORY for p in records) else TIER_PERSISTENT
    m = Manifest(
        first.team, first.run, first.step, first.job_id, first.restart, created_at or utc_now(), parent,
        first.world_size, first.parts_expected, tuple(shards), sum(s.size for s in shards), tier=tier,
    )  # fmt: skip
    return parse_manifest(m.to_json_obj())  # one set of rules for what we write and what we read

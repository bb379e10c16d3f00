"""Find and materialise the newest valid checkpoint of a run: a verified local copy first, else S3.

A step is a candidate only if its manifest exists, parses, names this team/run/step, and no ``incomplete.json`` of
the same attempt says it was given up. Its files are then checked against the manifest (size + sha256):

- a local copy (one of ``local_roots``/step-N, e.g. this node's staging dir or the prolog's restore dir) that
  verifies completely is used in place: no download;
- otherwise every shard goes to ``dest/step-N``, taken from a verified local file when one exists (a multi-node
  job's own part is usually on the node already) and downloaded from S3 otherwise, each hashed on the way.

A torn step (shards, no manifest) or a corrupt one (a shard missing, short, or with another sha256) is skipped with
a warning naming what failed, and the next older step is tried. Nothing that failed verification is ever returned.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import ManifestError, VerificationFailed
from nuro.checkpoint.manifest import FileEntry, Manifest, dumps, parse_incomplete, parse_manifest, utc_now
from nuro.checkpoint.verify import Problem, Where, check_local_file, copy_verified, download_verified, verify_local
from nuro.objectstore import (
    CHECKPOINT_INCOMPLETE_MAX_BYTES,
    CHECKPOINT_MANIFEST_MAX_BYTES,
    NotFound,
    ObjectStore,
    ObjectTooLarge,
)
from nuro.safeio import safefs
from nuro.safeio.safefs import Dir, as_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Skipped:
    """A step that was not used, and why (for logs and for the user)."""

    step: int
    reason: str

    def __str__(self) -> str:
        return f"step {self.step}: {self.reason}"


@dataclass
class Restored:
    """The checkpoint to load: ``path`` is a DCP checkpoint directory whose files all match ``manifest``."""

    step: int
    path: Path
    source: Literal["local", "s3"]
    manifest: Manifest
    skipped: list[Skipped] = field(default_factory=list)
    downloaded_bytes: int = 0
    reused_bytes: int = 0
    files: int = 0  # files of the step materialised: all of them, or the ``need`` share


def step_numbers(store: ObjectStore, team: str, run: str) -> list[int]:
    """Every step prefix of the run in S3, newest first (committed or not)."""
    steps = []
    for prefix in store.list_prefixes(L.run_prefix(team, run)):
        step = L.parse_step_name(prefix.rstrip("/").rsplit("/", 1)[-1])
        if step is not None:
            steps.append(step)
    return sorted(steps, reverse=True)


def load_manifest(store: ObjectStore, team: str, run: str, step: int) -> Manifest:
    """The step's manifest, parsed and checked against where it is stored; NotFound / ManifestError otherwise.

    The team writes this object: it is read capped (``CHECKPOINT_MANIFEST_MAX_BYTES``), and one over the cap is a
    bad manifest (ManifestError: that step is skipped) rather than GiBs in a root daemon's memory."""
    key = L.manifest_key(team, run, step)
    try:
        data = store.get(key, max_bytes=CHECKPOINT_MANIFEST_MAX_BYTES)[0]
    except ObjectTooLarge as exc:
        raise ManifestError(f"{key}: {exc}") from None
    m = parse_manifest(data, what=key)
    if (m.team, m.run, m.step) != (team, run, step):
        raise ManifestError(f"{key}: names {m.team}/{m.run} step {m.step}; stored under {team}/{run} step {step}")
    return m


def read_incomplete(store: ObjectStore, team: str, run: str, step: int) -> bytes:
    """The step's ``incomplete.json``, read capped (``CHECKPOINT_INCOMPLETE_MAX_BYTES``; over it: ManifestError)."""
    key = L.incomplete_key(team, run, step)
    try:
        return store.get(key, max_bytes=CHECKPOINT_INCOMPLETE_MAX_BYTES)[0]
    except ObjectTooLarge as exc:
        raise ManifestError(f"{key}: {exc}") from None


def latest_committed_step(store: ObjectStore, team: str, run: str) -> int | None:
    """The newest step with a manifest (not verified: for records and retention, not for loading)."""
    for step in step_numbers(store, team, run):
        if store.exists(L.manifest_key(team, run, step)):
            return step
    return None


def _committed_manifest(store: ObjectStore, team: str, run: str, step: int) -> Manifest | Skipped | None:
    """The step's manifest if it may be loaded; Skipped with the reason if not; None for an empty prefix (a
    deleted step: some stores, SeaweedFS among them, keep listing the emptied "directory")."""
    try:
        manifest = load_manifest(store, team, run, step)
    except NotFound:
        if next(iter(store.list(L.step_prefix(team, run, step))), None) is None:
            return None
        given_up = store.exists(L.incomplete_key(team, run, step))
        return Skipped(step, "given up (incomplete.json)" if given_up else "torn: shards without a manifest")
    except ManifestError as exc:
        return Skipped(step, f"bad manifest: {exc}")
    try:
        inc = parse_incomplete(read_incomplete(store, team, run, step))
        if inc.attempt == manifest.attempt:
            return Skipped(step, f"given up by job {inc.job_id}.{inc.restart}: {inc.reason}")
    except NotFound:
        pass
    except ManifestError as exc:
        return Skipped(step, f"unreadable incomplete.json beside the manifest: {exc}")
    return manifest


def _open_step(root: Where, name: str) -> Dir | None:
    """``root/name`` opened without following a symlink anywhere below ``root``; None when it is not there (or is
    not a real directory: then it is simply no candidate)."""
    try:
        with as_dir(root) as d:
            return d.sub(name)
    except OSError as exc:
        if not isinstance(exc, FileNotFoundError):
            log.debug("local copy %s/%s not usable: %s", root, name, exc)
        return None


def _move_verified(src: Dir, entry: FileEntry, dest: Dir, owner: tuple[int, int] | None) -> bool:
    """Move ``entry`` from a root-owned local copy (the node cache, which no job can change) into ``dest``: it is
    verified, given to ``owner`` by its own fd (only with a single link), and renamed between directory fds.
    False when it cannot be moved (the caller then copies or downloads it)."""
    if check_local_file(src, entry) is not None:
        return False
    *dirs, leaf = entry.path.split("/")
    fd = safefs.open_beneath(src.fd, entry.path)
    try:
        if os.fstat(fd).st_nlink != 1:  # a hard link to some other file must never change owner
            return False
        if owner is not None:
            safefs.fchown(fd, *owner)
    finally:
        os.close(fd)
    src_parent = src.sub("/".join(dirs)) if dirs else Dir(os.dup(src.fd), src.path)
    dst_parent = safefs.makedirs_at(dest, "/".join(dirs), 0o700, owner) if dirs else Dir(os.dup(dest.fd), dest.path)
    try:
        os.rename(leaf, leaf, src_dir_fd=src_parent.fd, dst_dir_fd=dst_parent.fd)
    finally:
        src_parent.close()
        dst_parent.close()
    return check_local_file(dest, entry) is None


def _materialise(
    store: ObjectStore,
    manifest: Manifest,
    entries: Sequence[FileEntry],
    candidates: Sequence[tuple[Dir, bool]],
    dest: Dir,
    owner: tuple[int, int] | None,
) -> tuple[list[Problem], int, int]:
    """Fill ``dest`` with verified shards, from a local copy (moved when it may be, else copied, verified either
    way) or from S3; returns (problems, downloaded bytes, reused local bytes)."""
    downloaded = reused = 0
    problems: list[Problem] = []
    for entry in entries:
        if check_local_file(dest, entry) is None:
            reused += entry.size
            continue
        placed = False
        for cand, movable in candidates:
            try:
                placed = (
                    _move_verified(cand, entry, dest, owner)
                    if movable
                    else check_local_file(cand, entry) is None and copy_verified(cand, entry, dest, owner) is None
                )
            except OSError as exc:
                log.debug("local copy %s of %s not usable: %s", cand.path, entry.path, exc)
            if placed:
                break
        if placed:
            reused += entry.size
            continue
        problem = download_verified(store, manifest, entry, dest, owner)
        if problem:
            problems.append(problem)
        else:
            downloaded += entry.size
    return problems, downloaded, reused


def restore_step(
    store: ObjectStore,
    manifest: Manifest,
    *,
    local_roots: Sequence[Where] = (),
    dest: Where | None = None,
    owner: tuple[int, int] | None = None,
    in_place: bool = True,
    movable: Sequence[Where] = (),
    need: Callable[[str], bool] | None = None,
) -> Restored:
    """Materialise one committed step (a valid local copy in place, else into ``dest/step-N``); VerificationFailed
    if a shard cannot be had with the right bytes.

    ``need`` limits it to the files one node must have (a DeepSpeed checkpoint: the model states and its own ranks'
    shards, ``nuro.checkpoint.dsfiles.needed``); None = every file of the step.

    Root (the prolog) passes open Dirs for every root and ``dest``, ``owner`` = the job's uid/gid for everything it
    creates, ``in_place=False`` (the job must get its own copy in its restore dir) and ``movable`` = roots no job
    can write (the node cache), whose files are moved rather than copied. The job itself passes paths.
    """
    name = L.step_name(manifest.step)
    entries = manifest.shards if need is None else tuple(s for s in manifest.shards if need(s.path))
    with contextlib.ExitStack() as stack:
        candidates: list[tuple[Dir, bool]] = []
        for root in [*local_roots, *movable]:
            d = _open_step(root, name)
            if d is not None:
                stack.callback(d.close)
                candidates.append((d, any(root is m for m in movable)))
        if in_place:
            for cand, _ in candidates:
                if not verify_local(cand, entries):
                    return Restored(manifest.step, cand.path, "local", manifest, reused_bytes=_size(entries),
                                    files=len(entries))  # fmt: skip
        if dest is None:
            raise VerificationFailed(f"step {manifest.step}: no valid local copy and no dest to download into")
        if isinstance(dest, Path):
            dest.mkdir(parents=True, exist_ok=True)  # the job's own path
        top = stack.enter_context(as_dir(dest))
        target = top.mkdir(name, 0o700, owner)
        stack.callback(target.close)
        if in_place and not verify_local(target, entries):
            return Restored(manifest.step, target.path, "local", manifest, reused_bytes=_size(entries),
                            files=len(entries))  # fmt: skip
        problems, downloaded, reused = _materialise(store, manifest, entries, candidates, target, owner)
        if problems:
            safefs.remove_at(top.fd, name)
            raise VerificationFailed(f"step {manifest.step}: corrupt: " + "; ".join(str(p) for p in problems[:5]))
        verified = dumps({"step": manifest.step, "at": utc_now()})
        safefs.write_atomic_at(target.fd, L.VERIFIED_FILE, verified, 0o644, owner)
        source: Literal["local", "s3"] = "s3" if downloaded else "local"
        return Restored(manifest.step, target.path, source, manifest, downloaded_bytes=downloaded, reused_bytes=reused,
                        files=len(entries))  # fmt: skip


def _size(entries: Sequence[FileEntry]) -> int:
    return sum(e.size for e in entries)


def restore_latest(
    store: ObjectStore,
    team: str,
    run: str,
    *,
    local_roots: Sequence[Where] = (),
    dest: Where | None = None,
    max_step: int | None = None,
    owner: tuple[int, int] | None = None,
    in_place: bool = True,
    movable: Sequence[Where] = (),
    need: Callable[[str], bool] | None = None,
    need_of: Callable[[Manifest], Callable[[str], bool] | None] | None = None,
) -> Restored | None:
    """The newest valid checkpoint of ``team/run`` (at or below ``max_step``), materialised; None if there is none.

    Args:
        local_roots: directories that may hold ``step-N`` copies (checked first, by sha256 against the manifest).
        dest: where ``step-N`` is downloaded when no local copy is valid. None = local copies only.
        owner, in_place, movable: root's settings (``restore_step``).
        need: only the files one node must have (``restore_step``).
        need_of: the same, told from each candidate step's manifest (the prolog: its world size and node count);
            used where ``need`` is None, and None from it means every file.
    """
    skipped: list[Skipped] = []
    for step in step_numbers(store, L.validate_team(team), L.validate_run(run)):
        if max_step is not None and step > max_step:
            continue
        found = _committed_manifest(store, team, run, step)
        if found is None:
            continue
        if isinstance(found, Skipped):
            skipped.append(found)
            log.warning("restore team=%s run=%s skipping %s", team, run, found)
            continue
        try:
            restored = restore_step(
                store,
                found,
                local_roots=local_roots,
                dest=dest,
                owner=owner,
                in_place=in_place,
                movable=movable,
                need=need if need is not None or need_of is None else need_of(found),
            )
        except (VerificationFailed, OSError) as exc:
            skipped.append(Skipped(step, str(exc).removeprefix(f"step {step}: ")))
            log.warning("restore team=%s run=%s skipping step %d: %s", team, run, step, exc)
            continue
        restored.skipped = skipped
        log.info(
            "restore team=%s run=%s step=%d source=%s path=%s downloaded=%d reused=%d skipped=%d",
            team, run, step, restored.source, restored.path, restored.downloaded_bytes, restored.reused_bytes,
            len(skipped),
        )  # fmt: skip
        return restored
    return None

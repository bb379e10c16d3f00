"""The upload worker: turns node-local upload requests into committed checkpoints in S3.

It runs in the node agent (one thread per node, outliving jobs), inside a job without an agent
(``Checkpointer(upload="inline")``), and in the epilog (``flush``); any of them may run at once on the same files
(see ``nuro.checkpoint.staging`` for the lock). For each pending request (one per part), holding its lock:

1. manifest already in S3 → mark done (someone committed it; a lost 412 reply looks the same). Never re-upload
   into a committed step.
2. ``incomplete.json`` of this attempt in S3 → the epilog gave up: mark abandoned.
3. upload every file not yet durable (``.upload.state.json`` remembers which), hashing the bytes as they are sent:
   a file that changed since the request was written is never stored (the request is abandoned, loudly).
4. write ``parts/<part>.json`` (this node's share).
5. when every part of this attempt is present, build the manifest (parent = previous committed step) and write it
   with ``If-None-Match: *``; "already exists" is success. Then mark done and apply retention (``keep``).

S3 down (``StoreUnavailable``) → the step is retried with backoff (0.5 s doubling to 30 s); training never sees it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.manifest import (
    Incomplete,
    PartRecord,
    UploadRequest,
    build_manifest,
    dumps,
    parse_incomplete,
    parse_part,
    utc_now,
)
from nuro.checkpoint.retention import apply_retention, list_steps
from nuro.checkpoint.staging import (
    StagedStep,
    claimed,
    job_dirs,
    job_steps,
    mark,
    read_marker,
    safe_request,
    write_atomic,
)
from nuro.checkpoint.verify import open_beneath
from nuro.objectstore import NotFound, ObjectStore, ObjectStoreError, StoreUnavailable

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
WAIT_MAX_S = 5.0


class PermanentUploadError(Exception):
    """The request can never be fulfilled as written (a file changed or vanished); retrying will not help."""


@dataclass
class FlushResult:
    """What ``flush`` achieved for one job: steps committed, steps given up (``incomplete.json``), and why."""

    job_id: str
    committed: list[int] = field(default_factory=list)
    incomplete: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    waited_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.incomplete


@dataclass
class _Backoff:
    attempts: int = 0
    next_at: float = 0.0


@dataclass
class PassReport:
    """One ``run_once`` pass: steps committed, still waiting (for other parts or after an error), abandoned."""

    committed: list[tuple[str, int]] = field(default_factory=list)
    waiting: list[tuple[str, int]] = field(default_factory=list)
    abandoned: list[tuple[str, int]] = field(default_factory=list)


class UploadWorker:
    """Uploads the checkpoints staged under ``staging_root`` (every job dir, or only ``job_dirs``).

    Args:
        store: the S3 adapter.
        staging_root: ``NURO_STAGING_ROOT`` (``<root>/<job_id>/ckpt/step-N``).
        job_dirs: restrict the worker to these job directories (a job's inline worker); None = all jobs.
        on_commit: called with (request, manifest step) after a step is committed by this worker or seen committed.
        clock: ``time.monotonic`` unless a test injects one.
    """

    def __init__(
        self,
        store: ObjectStore,
        staging_root: str | Path,
        *,
        job_dirs: Sequence[Path] | None = None,
        on_commit: Callable[[UploadRequest], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.staging_root = Path(staging_root)
        self.only = [Path(p) for p in job_dirs] if job_dirs is not None else None
        self.on_commit = on_commit
        self.clock = clock
        self._backoff: dict[tuple[Path, int], _Backoff] = {}
        self._lock = threading.Lock()  # one pass at a time per worker object (flush may run beside run())

    # -- public ------------------------------------------------------------------------------------------------
    def run(self, stop_event: threading.Event, interval_s: float = 1.0) -> None:
        """Loop ``run_once`` every ``interval_s`` until ``stop_event`` is set. Never raises for a store outage."""
        while not stop_event.is_set():
            try:
                self.run_once()
            except Exception:  # a bug must not kill the agent's thread; say it and keep going
                log.exception("upload worker pass failed root=%s", self.staging_root)
            stop_event.wait(interval_s)

    def run_once(self, job_id: str | None = None) -> PassReport:
        """One pass over every pending request (of ``job_id`` only, if given)."""
        report = PassReport()
        with self._lock:
            for job_dir in self._job_dirs(job_id):
                for step in job_steps(job_dir):
                    for part in step.parts if step.is_pending else ():
                        self._handle(step, part, report)
        return report

    def pending(self, job_id: str) -> list[int]:
        """Steps of ``job_id`` on this node that are requested but neither committed nor given up."""
        return [s.step for d in self._job_dirs(job_id) for s in job_steps(d) if s.is_pending]

    def flush(self, job_id: str, timeout_s: float, poll_s: float = 0.5) -> FlushResult:
        """Wait (bounded) until every request of ``job_id`` is committed; then give up on the rest.

        Called by the epilog before the node is released. Leftovers get ``incomplete.json`` in S3 (best effort:
        the store may be the reason they are left) and ``.upload.abandoned.json`` locally — never a manifest.
        """
        start = self.clock()
        deadline = start + timeout_s
        result = FlushResult(job_id)
        committed: set[int] = set()
        while True:
            committed.update(step for _, step in self.run_once(job_id).committed)  # pruned dirs are gone after
            left = self.pending(job_id)
            if not left or self.clock() >= deadline:
                break
            time.sleep(min(poll_s, max(0.0, deadline - self.clock())))
        for d in self._job_dirs(job_id):
            for s in job_steps(d):
                if s.is_done:
                    committed.add(s.step)
                elif s.is_pending:
                    err = self._give_up(s, f"epilog flush timed out after {timeout_s:.0f} s")
                    result.incomplete.append(s.step)
                    if err:
                        result.errors.append(err)
        result.committed = sorted(committed)
        result.waited_s = round(self.clock() - start, 3)
        return result

    # -- one step ----------------------------------------------------------------------------------------------
    def _job_dirs(self, job_id: str | None) -> list[Path]:
        dirs = self.only if self.only is not None else job_dirs(self.staging_root)
        return [d for d in dirs if job_id is None or d.name == job_id]

    def _handle(self, step: StagedStep, part: int, report: PassReport) -> None:
        key = (step.path, part)
        bo = self._backoff.get(key)
        if bo and self.clock() < bo.next_at:
            report.waiting.append((step.job_id, step.step))
            return
        with claimed(step.path, part) as mine:
            if not mine or not step.is_pending:  # another worker has it, or the step finished meanwhile
                return
            try:
                req = safe_request(step, part)
                if req is None:
                    return
                if self._process(step, req):
                    report.committed.append((step.job_id, step.step))
                    self._backoff.pop(key, None)
                    self._after_commit(step, req)
                else:
                    self._wait_for_peers(key)
                    report.waiting.append((step.job_id, step.step))
            except (ManifestError, PermanentUploadError) as exc:
                log.error("checkpoint upload abandoned job=%s step=%d: %s", step.job_id, step.step, exc)
                mark(step.path, L.ABANDONED_FILE, {"reason": str(exc)[:2000], "at": utc_now()})
                report.abandoned.append((step.job_id, step.step))
            except ObjectStoreError as exc:
                self._retry_later(key, step, exc)
                report.waiting.append((step.job_id, step.step))

    def _wait_for_peers(self, key: tuple[Path, int]) -> None:
        """Poll a step that waits for other nodes' parts less and less often (0.5 s up to 5 s): with N nodes each
        polling, S3 sees N LISTs per interval, not a storm."""
        bo = self._backoff.setdefault(key, _Backoff())
        bo.attempts += 1
        bo.next_at = self.clock() + min(WAIT_MAX_S, BACKOFF_FIRST_S * 2 ** (bo.attempts - 1))

    def _retry_later(self, key: tuple[Path, int], step: StagedStep, exc: Exception) -> None:
        bo = self._backoff.setdefault(key, _Backoff())
        bo.attempts += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (bo.attempts - 1))
        bo.next_at = self.clock() + delay
        level = logging.WARNING if isinstance(exc, StoreUnavailable) else logging.ERROR
        log.log(
            level, "checkpoint upload job=%s step=%d attempt=%d failed, retry in %.1f s: %s",
            step.job_id, step.step, bo.attempts, delay, exc,
        )  # fmt: skip

    def _process(self, step: StagedStep, req: UploadRequest) -> bool:
        """Advance one request as far as it goes now; True once the step is committed."""
        if self.store.exists(L.manifest_key(req.team, req.run, req.step)):
            mark(step.path, L.DONE_FILE, {"state": "committed", "at": utc_now(), "by": "seen"})
            return True
        if self._given_up_remotely(req):
            raise PermanentUploadError(f"incomplete.json of job {req.job_id}.{req.restart} exists for this step")
        if not self._upload_files(step, req):
            self.store.put(
                L.part_key(req.team, req.run, req.step, req.part), dumps(PartRecord.from_request(req).to_json_obj())
            )
            self._save_state(step, req, part_written=True)
        keys = list(self.store.list(L.parts_prefix(req.team, req.run, req.step)))
        if len(keys) < req.parts_expected:  # cheap check first: one LIST, no GETs, while peers are still uploading
            return False
        parts = self._parts_of_attempt(req)
        if len(parts) < req.parts_expected:
            log.debug("step=%d waiting for parts have=%s of %d", req.step, sorted(parts), req.parts_expected)
            return False
        if step.is_abandoned or self._given_up_remotely(req):  # the epilog's deadline passed meanwhile
            raise PermanentUploadError("given up by the epilog while the last part was uploading")
        manifest = build_manifest(parts.values(), parent=self._parent(req))
        created = self.store.put_if_absent(L.manifest_key(req.team, req.run, req.step), manifest.to_bytes())
        log.info(
            "checkpoint committed team=%s run=%s step=%d bytes=%d shards=%d by=%s",
            req.team, req.run, req.step, manifest.total_bytes, len(manifest.shards), "us" if created else "peer",
        )  # fmt: skip
        mark(step.path, L.DONE_FILE, {"state": "committed", "at": utc_now(), "by": "us" if created else "peer"})
        return True

    def _state(self, step: StagedStep, req: UploadRequest) -> dict:
        """What earlier passes stored for this attempt: {"files": {path: sha256}, "part_written": bool}."""
        state = read_marker(step.path, L.state_file(req.part)) or {}
        if state.get("attempt") != f"{req.job_id}.{req.restart}" or not isinstance(state.get("files"), dict):
            return {"files": {}, "part_written": False}
        return state

    def _save_state(self, step: StagedStep, req: UploadRequest, **changes: object) -> None:
        state = {**self._state(step, req), **changes, "attempt": f"{req.job_id}.{req.restart}"}
        write_atomic(step.path / L.state_file(req.part), json.dumps(state, sort_keys=True).encode())

    def _upload_files(self, step: StagedStep, req: UploadRequest) -> bool:
        """Upload what is not durable yet; True when the part record was already written by an earlier pass."""
        state = self._state(step, req)
        done: dict[str, str] = state["files"]
        for f in req.files:
            if done.get(f.path) == f.sha256:
                continue  # stored in an earlier pass
            local = step.path / f.path
            try:
                fd = open_beneath(step.path, f.path)  # never through a symlink: the worker may run as root
            except OSError as exc:
                raise PermanentUploadError(f"{local} cannot be read safely: {exc}") from None
            try:
                # /proc/self/fd/N reopens exactly the file we opened safely, whatever the path points at now
                self.store.put_file(
                    L.shard_key(req.team, req.run, req.step, f.path), Path(f"/proc/self/fd/{fd}"),
                    expected_sha256=f.sha256,
                )  # fmt: skip
            except ObjectStoreError as exc:
                if "changed while it was uploaded" in str(exc):
                    raise PermanentUploadError(str(exc)) from None
                raise
            finally:
                os.close(fd)
            done[f.path] = f.sha256
            self._save_state(step, req, files=done)
        return bool(state.get("part_written")) and all(done.get(f.path) == f.sha256 for f in req.files)

    def _parts_of_attempt(self, req: UploadRequest) -> dict[int, PartRecord]:
        parts: dict[int, PartRecord] = {}
        for info in self.store.list(L.parts_prefix(req.team, req.run, req.step)):
            try:
                rec = parse_part(self.store.get(info.key)[0], what=info.key)
            except NotFound:
                continue
            except ManifestError as exc:
                log.warning("ignoring bad part record %s: %s", info.key, exc)
                continue
            if rec.attempt == req.attempt and rec.step == req.step:
                parts[rec.part] = rec
        return parts

    def _given_up_remotely(self, req: UploadRequest) -> bool:
        try:
            data, _ = self.store.get(L.incomplete_key(req.team, req.run, req.step))
        except NotFound:
            return False
        try:
            return parse_incomplete(data).attempt == req.attempt
        except ManifestError:
            return True  # unreadable: treat as given up rather than commit over it

    def _parent(self, req: UploadRequest) -> int | None:
        older = [s.step for s in list_steps(self.store, req.team, req.run) if s.committed and s.step < req.step]
        return max(older) if older else None

    def _after_commit(self, step: StagedStep, req: UploadRequest) -> None:
        if self.on_commit:
            try:
                self.on_commit(req)
            except Exception:
                log.exception("on_commit callback failed step=%d", req.step)
        if req.keep:
            try:
                apply_retention(self.store, req.team, req.run, req.keep)
            except ObjectStoreError as exc:
                log.warning(
                    "retention skipped team=%s run=%s: %s (runs again after the next commit)", req.team, req.run, exc
                )
        prune_local(step)

    def _give_up(self, step: StagedStep, reason: str) -> str | None:
        """Mark a leftover step incomplete, in S3 (best effort) and locally. Returns an error text or None."""
        err = None
        part = step.parts[0] if step.parts else 0
        with claimed(step.path, part) as mine:
            if not mine:
                log.warning("step=%d still locked by another worker; marking it incomplete anyway", step.step)
            try:
                req = safe_request(step, part)
            except ManifestError as exc:
                req, err = None, str(exc)
            if req is not None:
                missing = sorted(set(range(req.parts_expected)) - set(self._safe_parts(req)))
                inc = Incomplete(
                    req.team, req.run, req.step, req.job_id, req.restart, reason, tuple(missing), utc_now()
                )
                try:
                    if not self.store.exists(L.manifest_key(req.team, req.run, req.step)):
                        self.store.put(L.incomplete_key(req.team, req.run, req.step), dumps(inc.to_json_obj()))
                except ObjectStoreError as exc:
                    err = f"step {req.step}: could not write incomplete.json ({exc}); it has no manifest either"
            mark(step.path, L.ABANDONED_FILE, {"reason": reason, "at": utc_now()})
        log.warning(
            "checkpoint step=%d job=%s marked incomplete: %s%s",
            step.step,
            step.job_id,
            reason,
            f" ({err})" if err else "",
        )
        return err

    def _safe_parts(self, req: UploadRequest) -> list[int]:
        try:
            return list(self._parts_of_attempt(req))
        except ObjectStoreError:
            return []


def prune_local(committed: StagedStep) -> list[int]:
    """Remove this job's local step directories older than ``committed`` that are done or never requested
    (torn): S3 holds them now and the staging disk is small. Pending ones stay (their upload is not finished)."""
    import shutil

    removed: list[int] = []
    for s in job_steps(committed.job_dir):
        if s.step < committed.step and (s.is_done or s.is_abandoned or not s.has_request):
            shutil.rmtree(s.path, ignore_errors=True)
            removed.append(s.step)
    return removed

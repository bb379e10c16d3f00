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

Whose checkpoint it is (``trust``):

- ``"record"`` (the default: the node agent and the epilog, as root): team, run, job id, restart and ``keep`` come
  from the root-owned per-job record the prolog wrote from Slurm's own data (``nuro.protocol.jobrecord``), never from
  the request, which the job's user writes. The request only chooses the step and which of its own files (paths
  beneath the step dir, regular files owned by the job's user, one link). A request naming another team, run,
  job or attempt is abandoned with that reason; a job dir without a record (or whose record has no team/run) is
  not uploaded by root at all. Both are logged once per job, not per pass.
- ``"request"``: a job's inline worker, as the job's user with the team's own S3 credential, takes the request's
  word (it can only write what that credential may).

Root never follows a path in a job dir: every access goes through ``JobDir``/``StepDir`` (no-follow directory
fds, regular files only, size caps), and each job is handled in isolation, so one hostile job dir (a FIFO lock, a
huge request, a step swapped for a symlink) costs that job its uploads and nothing else.

Fairness (issue 30): the node agent has one worker for every job of the node, so one job's slow or huge upload
must not hold another team's commit. The node-wide pass (every job dir, ``run_once()`` without a job) gives each
job a **turn** of at most ``UploadLimits.turn_s`` seconds and ``turn_bytes`` bytes, jobs in round-robin order
(the first job rotates every pass). A turn ends between files (the state file remembers what is durable, so the
next turn resumes there); a single file whose upload outlives the turn goes on in a thread of its own (a
"flight", holding the step's lock) while the other jobs take their turns, and that job gets no new work until it
lands (at most ``max_flights`` at once). What root will read at all is bounded by what the job could really have
written: at most ``max_files`` files per request, listed bytes at most the staging file system's size, no sparse
file above 1 MiB (allocated blocks below ``min_allocated`` of its size: a 100 GiB hole is not a checkpoint, and
hashing it would read 100 GiB of zeros), no file on another file system (a mount inside the job dir, whose reads
the job controls). A request over a bound is abandoned with the reason, logged once; only that job loses.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from nuro.checkpoint import layout as L
from nuro.checkpoint import lostwriters
from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.manifest import (
    Incomplete,
    PartRecord,
    UploadRequest,
    bind_request,
    build_manifest,
    dumps,
    parse_incomplete,
    parse_part,
    utc_now,
)
from nuro.checkpoint.retention import apply_retention, effective_keep, list_steps
from nuro.checkpoint.staging import MAX_STATE_BYTES, JobDir, StepDir
from nuro.objectstore import (
    CHECKPOINT_INCOMPLETE_MAX_BYTES,
    CHECKPOINT_PART_MAX_BYTES,
    NotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectTooLarge,
    StoreUnavailable,
)
from nuro.protocol import jobrecord
from nuro.protocol.nodeenv import env_number
from nuro.safeio import safefs
from nuro.safeio.safefs import UnsafePath

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
WAIT_MAX_S = 5.0
#: How many of a job's newest step dirs the flush settles at once (``nuro.checkpoint.lostwriters``): a save in flight
#: at the job's end is one of the last; a job that leaves thousands of empty step dirs gets no S3 write per dir.
SETTLE_NEWEST = 4
_MAX_SAID = 10_000  # "logged once" memory: bounded whatever the number of hostile job dirs
SPARSE_SLACK_BYTES = 1 << 20  # files up to this size are never judged sparse (tails, inline data, empty files)

Trust = Literal["record", "request"]


@dataclass(frozen=True)
class UploadLimits:
    """The bounds that keep one job's uploads from holding the node's worker (module docstring, "Fairness").

    Attributes:
        turn_s: seconds of uploading one job gets per node-wide pass before the next job's turn. 2 s: another
            team's commit waits at most about this long per misbehaving job, while a big checkpoint still moves
            at full speed (its file goes on in a flight).
        turn_bytes: bytes one job may start uploading per turn (1 GiB: at the ~1 GB/s of a node's link, about one
            turn; at least one file always starts, so a bigger shard still progresses).
        max_files: files one request (one node's share of a step) may list. 10 000: a DCP/DeepSpeed share is a few
            files per GPU; the part record S3 readers accept is capped at ~25 000 files (``objectstore``).
        min_allocated: a file above ``SPARSE_SLACK_BYTES`` must have at least this fraction of its size allocated
            on disk (``st_blocks * 512``); 0 turns the check off (a compressing file system, where zeros take
            nothing, would need that).
        max_flights: uploads that outlived their turn going on at once (one per job at most; each buffers up to
            ``max_concurrency × part_size`` of the store config). A job finding none free waits for its turn.
    """

    turn_s: float = 2.0
    turn_bytes: int = 1 << 30
    max_files: int = 10_000
    min_allocated: float = 0.5
    max_flights: int = 8

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UploadLimits:
        """``NURO_UPLOAD_TURN_S``, ``NURO_UPLOAD_TURN_MIB``, ``NURO_UPLOAD_MAX_FILES``, ``NURO_UPLOAD_MIN_ALLOCATED``
        (the node's env); a malformed or negative value keeps the default, loudly."""
        env = os.environ if env is None else env
        d = cls()

        def num(name: str, kind: type, default: float) -> Any:
            try:
                return env_number(env, name, kind, default)
            except ValueError as exc:  # the node's one upload worker runs on with its default, loudly
                log.warning("%s: using %s", exc, default)
                return default

        return cls(
            turn_s=num("NURO_UPLOAD_TURN_S", float, d.turn_s) or d.turn_s,
            turn_bytes=int(num("NURO_UPLOAD_TURN_MIB", float, d.turn_bytes / (1 << 20)) * (1 << 20)) or d.turn_bytes,
            max_files=num("NURO_UPLOAD_MAX_FILES", int, d.max_files) or d.max_files,
            min_allocated=min(1.0, num("NURO_UPLOAD_MIN_ALLOCATED", float, d.min_allocated)),
            max_flights=d.max_flights,
        )


class PermanentUploadError(Exception):
    """The request can never be fulfilled as written (a file changed or vanished); retrying will not help."""


class Superseded(PermanentUploadError):
    """The step's uploaded objects were removed by retention after newer steps committed: nothing is left to do."""


@dataclass(frozen=True)
class Owner:
    """Whose checkpoint root is uploading, from the job record (never from the request): the S3 prefix is
    ``checkpoints/<team>/<run>/``; ``uid`` is the job's user (the only owner, besides root, of a file root uploads)."""

    team: str
    run: str
    job_id: str
    restart: int
    keep: int | None
    uid: int | None

    @classmethod
    def of(cls, rec: jobrecord.JobRecord) -> Owner | None:
        if rec.team is None or rec.run is None:
            return None
        return cls(L.validate_team(rec.team), L.validate_run(rec.run), str(rec.job_id), rec.restart,
                   effective_keep(rec.keep), rec.uid)  # fmt: skip


@dataclass
class FlushResult:
    """What ``flush`` achieved for one job: steps committed, steps given up (``incomplete.json``), and why."""

    job_id: str
    committed: list[int] = field(default_factory=list)
    incomplete: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    waited_s: float = 0.0
    #: steps given up at once because they can never commit (``nuro.checkpoint.lostwriters``): step → why
    settled: dict[int, str] = field(default_factory=dict)

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
    skipped_jobs: list[str] = field(default_factory=list)
    sliced: list[tuple[str, int]] = field(default_factory=list)  # turn ended with work left (also in ``waiting``)


class _NotOurs(Exception):
    """Root does nothing for this job (no record, or a record without team/run); the message says why."""


class _TurnOver(Exception):
    """The job's turn of this pass is spent (``UploadLimits``): the next job goes; this one resumes next pass."""

    def __init__(self, step: int, flying: bool = False) -> None:
        super().__init__(step)
        self.step = step
        self.flying = flying


@dataclass
class _Flight:
    """One file upload that outlived its job's turn: it goes on in a thread of its own while the other jobs take
    their turns, and the job's next turn takes the result. ``lock_fd`` (a dup of the claimed lock fd) keeps the
    part's flock, so no other worker uploads the same step meanwhile."""

    job_id: str
    step: int
    part: int
    attempt: str
    path: str
    sha256: str
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    lock_fd: int | None = None

    def release(self) -> None:
        if self.lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = None


@dataclass
class _Turn:
    """What one job may still spend in this node-wide pass."""

    deadline: float
    bytes_left: int
    lock_fd: int | None = None  # the lock of the part being handled (a flight keeps a dup of it)
    started: int = 0  # parts handled and files sent this turn: the first always goes, so every turn progresses

    def over(self, now: float) -> bool:
        return self.started > 0 and (now >= self.deadline or self.bytes_left <= 0)


class UploadWorker:
    """Uploads the checkpoints staged under ``staging_root`` (every job dir, or only ``job_dirs``).

    Args:
        store: the S3 adapter; None only for ``pending`` (the epilog's hand-off check: boto3 costs ~0.5 s of CPU
            to import and a client to build, and looking at local files needs neither).
        staging_root: ``NURO_STAGING_ROOT`` (``<root>/<job_id>/ckpt/step-N``; job records in ``<root>/.jobs``).
        job_dirs: restrict the worker to these job directories (a job's inline worker); None = all jobs.
        trust: ``"record"`` (root: whose checkpoint it is comes from the job record) or ``"request"`` (a job's
            inline worker, with its own team's credential). See the module docstring.
        on_commit: called with (request, manifest step) after a step is committed by this worker or seen committed.
        clock: ``time.monotonic`` unless a test injects one.
        limits: the fairness bounds (``UploadLimits.from_env()`` when None). Turns apply to the node-wide pass only
            (every job dir, no ``job_id``): a job's inline worker and the epilog's flush serve one job.
    """

    def __init__(
        self,
        store: ObjectStore | None,
        staging_root: str | Path,
        *,
        job_dirs: Sequence[Path] | None = None,
        trust: Trust = "record",
        on_commit: Callable[[UploadRequest], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        limits: UploadLimits | None = None,
    ) -> None:
        if trust not in ("record", "request"):
            raise ValueError(f"trust must be 'record' or 'request', got {trust!r}")
        self.store = store
        self.staging_root = Path(staging_root)
        self.only = [Path(p) for p in job_dirs] if job_dirs is not None else None
        self.trust = trust
        self.on_commit = on_commit
        self.clock = clock
        self._backoff: dict[tuple[str, int, int], _Backoff] = {}
        self._said: set[tuple[str, str]] = set()
        self._lock = threading.Lock()  # one pass at a time per worker object (flush may run beside run())
        self.limits = limits if limits is not None else UploadLimits.from_env()
        self._flights: dict[str, _Flight] = {}  # job id -> its upload that outlived its turn
        self._landed: dict[str, _Flight] = {}  # job id -> its flight that finished, until its result is taken
        self._rr = 0  # round robin: which job goes first in the next node-wide pass
        self._peer_wait_max_s = WAIT_MAX_S  # the flush polls its peers at its own pace (``flush``)

    @property
    def _s3(self) -> ObjectStore:
        if self.store is None:
            raise RuntimeError("this UploadWorker was made without a store: it may only answer pending()")
        return self.store

    # -- public ------------------------------------------------------------------------------------------------
    def run(self, stop_event: threading.Event, interval_s: float = 1.0, wake: threading.Event | None = None) -> None:
        """Loop ``run_once`` every ``interval_s`` until ``stop_event`` is set. Never raises for a store outage.

        ``wake``: set by whoever writes a request in this process (the SDK's inline worker) to start the next pass
        at once instead of at the next tick (up to ``interval_s`` of a commit's time); whoever sets ``stop_event``
        sets it too."""
        while not stop_event.is_set():
            more = False
            try:
                more = bool(self.run_once().sliced)
                self.after_pass()
            except Exception:  # a bug must not kill the agent's thread; say it and keep going
                log.exception("upload worker pass failed root=%s", self.staging_root)
            if more:  # a job's turn ended with work left: the next pass (every job's next turn) starts at once
                continue
            self._idle(stop_event, wake, interval_s)
            if wake is not None:
                wake.clear()

    def _idle(self, stop_event: threading.Event, wake: threading.Event | None, interval_s: float) -> None:
        """Wait for the next pass: ``interval_s``, less when woken or when a flight lands (its job's next turn
        should not wait a whole interval; polled every 50 ms only while a flight is on its way)."""
        ev = wake or stop_event
        end = time.monotonic() + interval_s
        while not ev.is_set() and not stop_event.is_set():
            left = end - time.monotonic()
            flights = list(self._flights.values())
            if left <= 0 or any(f.done.is_set() for f in flights):
                return
            ev.wait(min(left, 0.05) if flights else left)

    def after_pass(self) -> None:
        """Called by ``run`` after each pass; the node agent's worker finishes hand-offs here (``HandoffWorker``)."""

    def run_once(self, job_id: str | None = None, deadline: float | None = None) -> PassReport:
        """One pass over every pending request (of ``job_id`` only, if given); no new step is started after
        ``deadline`` (``clock`` time). A job whose dir or files are hostile or broken is skipped (logged once);
        the others are handled as usual."""
        report = PassReport()
        fair = job_id is None and self.only is None  # the node-wide pass: jobs take turns (module docstring)
        with self._lock:
            seen: set[str] = set()
            jobs = self._jobs(job_id)
            if fair and jobs:
                first = self._rr % len(jobs)
                jobs = jobs[first:] + jobs[:first]
                self._rr = first + 1
            for jid, opener in jobs:
                seen.add(jid)
                flight = self._flights.get(jid)
                if flight is not None and not flight.done.is_set():
                    report.waiting.append((jid, flight.step))  # its upload goes on; no new work for it meanwhile
                    continue
                if flight is not None:  # landed: its lock is let go, its result waits for the file to come up again
                    self._landed[jid] = self._flights.pop(jid)
                    flight.release()
                turn = _Turn(self.clock() + self.limits.turn_s, self.limits.turn_bytes) if fair else None
                try:
                    with opener() as jd:
                        owner = self._owner(jd)
                        for sd in self._steps(jd):
                            for part in sd.parts if sd.is_pending else ():
                                if deadline is not None and self.clock() >= deadline:
                                    return report
                                if turn is not None and turn.over(self.clock()):
                                    raise _TurnOver(sd.step)
                                self._handle(jd, sd, part, owner, report, turn)
                                if turn is not None:
                                    turn.started += 1
                except _TurnOver as over:
                    report.waiting.append((jid, over.step))
                    if not over.flying:
                        report.sliced.append((jid, over.step))
                except _NotOurs as exc:
                    self._say_once(jid, str(exc), logging.WARNING)
                    report.skipped_jobs.append(jid)
                except Exception as exc:  # noqa: BLE001 - one job's dir must never stop the others' uploads
                    self._say_once(jid, f"job={jid} checkpoint uploads skipped: {type(exc).__name__}: {exc}")
                    report.skipped_jobs.append(jid)
            if job_id is None:
                self._said = {k for k in self._said if k[0] in seen}  # forget jobs that are gone
                for gone in [j for j, f in self._flights.items() if j not in seen and f.done.is_set()]:
                    self._flights.pop(gone).release()
                self._landed = {j: f for j, f in self._landed.items() if j in seen}
        return report

    def pending(self, job_id: str) -> list[int]:
        """Steps of ``job_id`` on this node that this worker would upload and are neither committed nor given up."""
        out: list[int] = []
        for _jid, opener in self._jobs(job_id):
            try:
                with opener() as jd:
                    self._owner(jd)
                    out.extend(sd.step for sd in self._steps(jd) if sd.is_pending)
            except Exception:  # noqa: BLE001 - not ours, or unreadable: nothing of it is pending for us
                continue
        return out

    def flush(
        self,
        job_id: str,
        timeout_s: float,
        poll_s: float = 0.5,
        lost_nodes: Callable[[Sequence[str]], Collection[str]] | None = None,
    ) -> FlushResult:
        """Wait (bounded) until every request of ``job_id`` is committed; then give up on the rest.

        Called by the epilog before the node is released, when the job's processes on this node are gone. Leftovers
        get ``incomplete.json`` in S3 (best effort: the store may be the reason they are left) and
        ``.upload.abandoned.json`` locally — never a manifest. Nothing waits for a step that can never commit
        (``nuro.checkpoint.lostwriters``): a step torn on this node is given up first thing, and one whose missing
        part's writer ``lost_nodes`` (asked with those writers' names, answering the ones Slurm reports gone)
        names is given up as soon as that is known; the peers' workers see the ``incomplete.json`` and stop too.
        """
        start = self.clock()
        deadline = start + timeout_s
        result = FlushResult(job_id)
        committed: set[int] = set()
        self._settle_torn(job_id, result)  # before waiting: the peers' epilogs stop waiting for our torn parts
        self._peer_wait_max_s = poll_s
        try:
            while True:
                rep = self.run_once(job_id, deadline=deadline)
                committed.update(step for _, step in rep.committed)  # pruned dirs are gone after
                left = self.pending(job_id)
                if left and lost_nodes is not None:
                    self._settle_lost_writers(job_id, lost_nodes, result)
                    left = self.pending(job_id)
                if not left or self.clock() >= deadline:
                    break
                time.sleep(min(poll_s, max(0.0, deadline - self.clock())))
        finally:
            self._peer_wait_max_s = WAIT_MAX_S
        for jid, opener in self._jobs(job_id):
            try:
                with opener() as jd:
                    owner = self._owner(jd)
                    for sd in self._steps(jd):
                        if sd.is_done:
                            committed.add(sd.step)
                        elif sd.is_pending:
                            err = self._give_up(sd, owner, f"epilog flush timed out after {timeout_s:.0f} s")
                            result.incomplete.append(sd.step)
                            if err:
                                result.errors.append(err)
            except _NotOurs:
                continue
            except Exception as exc:  # noqa: BLE001 - the epilog must finish whatever the job left
                result.errors.append(f"job {jid}: {type(exc).__name__}: {exc}")
        result.committed = sorted(committed)
        result.waited_s = round(self.clock() - start, 3)
        return result

    def _settle_torn(self, job_id: str, result: FlushResult) -> None:
        """Give up every step of ``job_id`` torn on this node: a step dir without this node's request at the end of
        the job (root only: the identity of the ``incomplete.json`` comes from the job record)."""
        if self.trust != "record":
            return

        def torn(sd: StepDir, owner: Owner | None) -> str | None:
            done = sd.has_request or sd.is_done or sd.is_abandoned or owner is None
            return None if done else lostwriters.TORN_REASON

        self._settle(job_id, result, torn)

    def _settle_lost_writers(
        self, job_id: str, lost_nodes: Callable[[Sequence[str]], Collection[str]], result: FlushResult
    ) -> None:
        """Give up every pending step of ``job_id`` a part of which only a lost node could have uploaded."""
        self._settle(job_id, result, lambda sd, owner: self._lost_writer(sd, owner, lost_nodes) if sd.is_pending
                     else None)  # fmt: skip

    def _settle(self, job_id: str, result: FlushResult, why: Callable[[StepDir, Owner | None], str | None]) -> None:
        """Give up, at once, each of the job's newest ``SETTLE_NEWEST`` steps ``why`` says can never commit."""
        for jid, opener in self._jobs(job_id):
            try:
                with opener() as jd:
                    owner = self._owner(jd)
                    for sd in self._steps(jd, newest=SETTLE_NEWEST):
                        reason = why(sd, owner)
                        if reason is None:
                            continue
                        err = self._give_up(sd, owner, reason)
                        result.incomplete.append(sd.step)
                        result.settled[sd.step] = reason
                        if err:
                            result.errors.append(err)
            except _NotOurs:
                continue
            except Exception as exc:  # noqa: BLE001 - the epilog must finish whatever the job left; a failed look
                result.errors.append(f"job {jid}: {type(exc).__name__}: {exc}")  # is no decision: the flush waits on

    def _lost_writer(
        self, sd: StepDir, owner: Owner | None, lost_nodes: Callable[[Sequence[str]], Collection[str]]
    ) -> str | None:
        for part in sd.parts:
            try:
                req = self._request(sd, part, owner)
            except ManifestError:
                return None  # the pass abandons a bad request with its own reason
            if req is None or not req.writers:
                continue
            missing = lostwriters.missing_parts(req.parts_expected, self._parts_of_attempt(req))
            ask = lostwriters.writers_to_ask(req.writers, missing)
            if ask:
                return lostwriters.lost_writer_reason(req.writers, missing, set(lost_nodes(ask)))
        return None

    # -- jobs and steps ----------------------------------------------------------------------------------------
    def _jobs(self, job_id: str | None) -> list[tuple[str, Callable[[], JobDir]]]:
        """(job id, opener) of every job dir this worker covers; opening happens per job, in isolation."""
        if self.only is not None:
            return [
                (d.name, lambda d=d: JobDir.open_path(d))  # type: ignore[misc]
                for d in self.only
                if job_id is None or d.name == job_id
            ]
        try:
            with safefs.opened(safefs.open_dir(self.staging_root)) as root_fd:
                entries = safefs.list_dir(root_fd)
        except FileNotFoundError:
            return []
        root = self.staging_root
        return [
            (e.name, lambda n=e.name: JobDir.open(root, n))  # type: ignore[misc]
            for e in entries
            if e.is_dir and not e.name.startswith((".", L.CACHE_DIR)) and (job_id is None or e.name == job_id)
        ]

    def _owner(self, jd: JobDir) -> Owner | None:
        """The job's owner from its record (trust="record"); None = take the request's word (trust="request")."""
        if self.trust == "request":
            return None
        try:
            rec = jobrecord.read(self.staging_root, jd.job_id)
        except (OSError, ValueError) as exc:  # JobRecordError, UnsafePath, a bad name: no trustworthy record
            raise _NotOurs(
                f"job={jd.job_id} has no usable job record ({exc}): root uploads none of its checkpoints"
            ) from None
        if rec is None:
            raise _NotOurs(f"job={jd.job_id} has no job record (the prolog writes it): root uploads none of its "
                           "checkpoints")  # fmt: skip
        owner = Owner.of(rec)
        if owner is None:
            raise _NotOurs(
                f"job={jd.job_id} record has no nuro team/run (account {rec.account!r}; a plain job, or a nuro record "
                "naming another team): root uploads none of its checkpoints"
            )
        return owner

    def _steps(self, jd: JobDir, newest: int | None = None) -> Iterator[StepDir]:
        """Each step dir of the job (only the ``newest`` ones, if given), opened one at a time and closed once its
        turn is over (a job with 100 000 step dirs must not hold as many fds of the agent)."""
        names = jd.step_names()
        for step, name in names[-newest:] if newest else names:
            try:
                sd = jd.open_step(step, name)
            except FileNotFoundError:
                continue
            except OSError as exc:  # swapped for a symlink since the listing: only this step is refused
                self._say_once(jd.job_id, f"job={jd.job_id} step dir {name} refused: {exc}")
                continue
            try:
                yield sd
            finally:
                jd.close_step(sd)

    def _say_once(self, job_id: str, message: str, level: int = logging.ERROR) -> None:
        key = (job_id, message)
        if key in self._said:
            return
        if len(self._said) < _MAX_SAID:
            self._said.add(key)
        log.log(level, "%s", message)

    # -- one step ----------------------------------------------------------------------------------------------
    def _handle(
        self, jd: JobDir, sd: StepDir, part: int, owner: Owner | None, report: PassReport, turn: _Turn | None = None
    ) -> None:
        key = (jd.job_id, sd.step, part)
        bo = self._backoff.get(key)
        if bo and self.clock() < bo.next_at:
            report.waiting.append((sd.job_id, sd.step))
            return
        try:
            with sd.claimed_fd(part) as lock_fd:
                if lock_fd is None or not sd.is_pending:  # another worker has it, or the step finished meanwhile
                    return
                if turn is not None:
                    turn.lock_fd = lock_fd
                req = self._request(sd, part, owner)
                if req is None:
                    return
                if self._process(sd, req, owner, turn):
                    report.committed.append((sd.job_id, sd.step))
                    self._backoff.pop(key, None)
                    self._after_commit(jd, sd, req)
                else:
                    self._wait_for_peers(key)
                    report.waiting.append((sd.job_id, sd.step))
        except Superseded as exc:  # expected under out-of-order commits: not an error
            self._abandon(sd, f"superseded: {exc}", logging.INFO)
            report.abandoned.append((sd.job_id, sd.step))
        except (ManifestError, PermanentUploadError, UnsafePath) as exc:
            self._abandon(sd, str(exc))
            report.abandoned.append((sd.job_id, sd.step))
        except ObjectStoreError as exc:
            self._retry_later(key, sd, exc)
            report.waiting.append((sd.job_id, sd.step))

    def _request(self, sd: StepDir, part: int, owner: Owner | None) -> UploadRequest | None:
        """The request of ``part``, bound to the job record (trust="record"): the request may choose only the step
        and its files; team/run/job/attempt must be the record's and ``keep`` is the record's (ManifestError)."""
        req = sd.read_request(part)
        if req is None or owner is None:
            return req
        if req.step != sd.step:
            raise ManifestError(f"{sd.where}: the request names step {req.step}, its directory is step {sd.step}")
        ours = [f.path for f in req.files if L.is_control_file(f.path)]
        if ours:  # markers, locks and state root writes there are never part of a checkpoint
            raise ManifestError(f"{sd.where}: the request lists the upload worker's own files {ours[:5]}")
        if len(req.files) > self.limits.max_files:
            raise ManifestError(
                f"{sd.where}: the request lists {len(req.files)} files, more than the {self.limits.max_files} one "
                "node's share of a step may have (NURO_UPLOAD_MAX_FILES): refused"
            )
        listed = sum(f.size for f in req.files)
        vfs = os.fstatvfs(sd.fd)
        if listed > vfs.f_blocks * vfs.f_frsize:
            raise ManifestError(
                f"{sd.where}: the request lists {listed} bytes, more than the staging file system holds "
                f"({vfs.f_blocks * vfs.f_frsize}): refused"
            )
        return bind_request(
            req, team=owner.team, run=owner.run, job_id=owner.job_id, restart=owner.restart, keep=owner.keep
        )

    def _abandon(self, sd: StepDir, reason: str, level: int = logging.ERROR) -> None:
        self._say_once(sd.job_id, f"checkpoint upload abandoned job={sd.job_id} step={sd.step}: {reason}", level)
        try:
            sd.mark(L.ABANDONED_FILE, {"reason": reason[:2000], "at": utc_now()})
        except OSError as exc:
            self._say_once(sd.job_id, f"job={sd.job_id} step={sd.step}: cannot mark it abandoned: {exc}")

    def _wait_for_peers(self, key: tuple[str, int, int]) -> None:
        """Poll a step that waits for other nodes' parts less and less often (0.5 s up to 5 s): with N nodes each
        polling, S3 sees N LISTs per interval, not a storm."""
        bo = self._backoff.setdefault(key, _Backoff())
        bo.attempts += 1
        bo.next_at = self.clock() + min(self._peer_wait_max_s, BACKOFF_FIRST_S * 2 ** (bo.attempts - 1))

    def _retry_later(self, key: tuple[str, int, int], sd: StepDir, exc: Exception) -> None:
        bo = self._backoff.setdefault(key, _Backoff())
        bo.attempts += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (bo.attempts - 1))
        bo.next_at = self.clock() + delay
        level = logging.WARNING if isinstance(exc, StoreUnavailable) else logging.ERROR
        log.log(
            level, "checkpoint upload job=%s step=%d attempt=%d failed, retry in %.1f s: %s",
            sd.job_id, sd.step, bo.attempts, delay, exc,
        )  # fmt: skip

    def _process(self, sd: StepDir, req: UploadRequest, owner: Owner | None, turn: _Turn | None = None) -> bool:
        """Advance one request as far as it goes now; True once the step is committed."""
        if self._s3.exists(L.manifest_key(req.team, req.run, req.step)):
            sd.mark(L.DONE_FILE, {"state": "committed", "at": utc_now(), "by": "seen"})
            return True
        if self._given_up_remotely(req):
            raise PermanentUploadError(f"incomplete.json of job {req.job_id}.{req.restart} exists for this step")
        earlier = self._upload_files(sd, req, owner, turn)
        part_key = L.part_key(req.team, req.run, req.step, req.part)
        if not earlier:
            self._s3.put(part_key, dumps(PartRecord.from_request(req).to_json_obj()))
            self._save_state(sd, req, part_written=True)
        keys = [o.key for o in self._s3.list(L.parts_prefix(req.team, req.run, req.step))]
        if earlier and part_key not in keys:  # written by an earlier pass, gone now: never wait on it forever
            self._part_vanished(sd, req)
            return False
        if len(keys) < req.parts_expected:  # cheap check first: one LIST, no GETs, while peers are still uploading
            return False
        parts = self._parts_of_attempt(req)
        if len(parts) < req.parts_expected:
            log.debug("step=%d waiting for parts have=%s of %d", req.step, sorted(parts), req.parts_expected)
            return False
        if sd.is_abandoned or self._given_up_remotely(req):  # the epilog's deadline passed meanwhile
            raise PermanentUploadError("given up by the epilog while the last part was uploading")
        manifest = build_manifest(parts.values(), parent=self._parent(req))
        created = self._s3.put_if_absent(L.manifest_key(req.team, req.run, req.step), manifest.to_bytes())
        log.info(
            "checkpoint committed team=%s run=%s step=%d bytes=%d shards=%d by=%s",
            req.team, req.run, req.step, manifest.total_bytes, len(manifest.shards), "us" if created else "peer",
        )  # fmt: skip
        sd.mark(L.DONE_FILE, {"state": "committed", "at": utc_now(), "by": "us" if created else "peer"})
        return True

    def _part_vanished(self, sd: StepDir, req: UploadRequest) -> None:
        """Our part record, written by an earlier pass, is no longer in S3. Retention removes an uncommitted step
        once ``keep`` newer steps are committed (another worker of the node committed them first): then the step is
        superseded (``Superseded``). Otherwise someone deleted it: upload the whole part again."""
        newer = [s.step for s in list_steps(self._s3, req.team, req.run) if s.committed and s.step > req.step]
        if newer:
            raise Superseded(
                f"its uploaded part was removed from S3 after newer steps committed (newest {max(newer)}): "
                "retention superseded it"
            )
        log.warning("checkpoint job=%s step=%d: its part record vanished from S3; uploading it again", sd.job_id,
                    sd.step)  # fmt: skip
        sd.write(L.state_file(req.part), b"{}")

    def _state(self, sd: StepDir, req: UploadRequest) -> dict:
        """What earlier passes stored for this attempt: {"files": {path: sha256}, "part_written": bool}. A state
        file that is missing, unsafe (FIFO, symlink, huge) or of another attempt counts as nothing stored."""
        try:
            state = sd.read_json(L.state_file(req.part), MAX_STATE_BYTES) or {}
        except OSError:
            state = {}
        if state.get("attempt") != f"{req.job_id}.{req.restart}" or not isinstance(state.get("files"), dict):
            return {"files": {}, "part_written": False}
        return state

    def _save_state(self, sd: StepDir, req: UploadRequest, **changes: object) -> None:
        state = {**self._state(sd, req), **changes, "attempt": f"{req.job_id}.{req.restart}"}
        sd.write(L.state_file(req.part), json.dumps(state, sort_keys=True).encode())

    def _open_shard(self, sd: StepDir, path: str, size: int, owner: Owner | None, dev: int | None = None) -> int:
        """A read fd of one listed file: beneath the step dir, no symlink on the way, a regular file of the listed
        size; for root also one link only and owned by the job's user (or root), so a hard link to someone
        else's file is never read, dense (not a sparse file: ``UploadLimits.min_allocated``) and on the step
        dir's own file system (``dev``; a mount inside the job dir could make every read block).
        PermanentUploadError otherwise."""
        try:
            fd = sd.open_file(path)
        except OSError as exc:
            raise PermanentUploadError(f"{sd.where}/{path} cannot be read safely: {exc}") from None
        st = os.fstat(fd)
        problem = None
        if st.st_size != size:
            problem = f"is {st.st_size} bytes, the request lists {size} (changed since it was written)"
        elif owner is not None and st.st_nlink != 1:
            problem = f"has {st.st_nlink} links (a hard link is never uploaded by root)"
        elif owner is not None and st.st_uid not in (owner.uid, 0):
            problem = f"belongs to uid {st.st_uid}, not the job's user (uid {owner.uid})"
        elif owner is not None and dev is not None and st.st_dev != dev:
            problem = "is on another file system than its step dir (a mount inside the job's dir is never read)"
        elif owner is not None and _sparse(st, self.limits.min_allocated):
            problem = (
                f"is sparse: {st.st_size} bytes long but only {st.st_blocks * 512} allocated (a checkpoint file is "
                f"written in full; root reads at most what the job really stored)"
            )
        if problem:
            os.close(fd)
            raise PermanentUploadError(f"{sd.where}/{path} {problem}")
        assert stat.S_ISREG(st.st_mode)
        return fd

    def _upload_files(self, sd: StepDir, req: UploadRequest, owner: Owner | None, turn: _Turn | None = None) -> bool:
        """Upload what is not durable yet; True when the part record was already written by an earlier pass.

        With a ``turn`` (the node-wide pass) this stops between files once the turn is spent (``_TurnOver``; the
        state file says where the next turn resumes), and a file still uploading when the turn ends goes on as a
        flight (``_fly_in_turn``)."""
        state = self._state(sd, req)
        done: dict[str, str] = state["files"]
        todo = [f for f in req.files if done.get(f.path) != f.sha256]  # the rest was stored in an earlier pass
        dev = os.fstat(sd.fd).st_dev
        for f in todo:  # every listed file must be safe to read before any is sent: a bad list uploads nothing
            os.close(self._open_shard(sd, f.path, f.size, owner, dev))
        for f in todo:
            if self._took_landed(sd, req, f.path, f.sha256):
                done[f.path] = f.sha256
                self._save_state(sd, req, files=done)
                continue
            if turn is not None:
                if turn.over(self.clock()):
                    raise _TurnOver(sd.step)
                turn.started += 1
                turn.bytes_left -= f.size
            fd = self._open_shard(sd, f.path, f.size, owner, dev)
            if turn is None:
                try:
                    self._put_shard(req, f.path, f.sha256, fd)
                finally:
                    os.close(fd)
            elif not self._fly_in_turn(sd, req, f.path, f.sha256, fd, turn):
                raise _TurnOver(sd.step, flying=True)
            done[f.path] = f.sha256
            self._save_state(sd, req, files=done)
        return bool(state.get("part_written")) and all(done.get(f.path) == f.sha256 for f in req.files)

    def _put_shard(self, req: UploadRequest, path: str, sha256: str, fd: int) -> None:
        """Send one checkpoint file from its safely opened ``fd``, hashed on the way (a file that changed since the
        request is PermanentUploadError)."""
        try:
            # /proc/self/fd/N reopens exactly the file we opened safely, whatever the path points at now
            self._s3.put_file(
                L.shard_key(req.team, req.run, req.step, path), Path(f"/proc/self/fd/{fd}"), expected_sha256=sha256
            )
        except ObjectStoreError as exc:
            if "changed while it was uploaded" in str(exc):
                raise PermanentUploadError(str(exc)) from None
            raise

    def _took_landed(self, sd: StepDir, req: UploadRequest, path: str, sha256: str) -> bool:
        """True when this file's flight (started in an earlier turn) stored it; its error, if it failed, is
        raised here as if the upload had just failed."""
        f = self._landed.get(sd.job_id)
        attempt = f"{req.job_id}.{req.restart}"
        if f is None or (f.step, f.part, f.attempt, f.path, f.sha256) != (sd.step, req.part, attempt, path, sha256):
            return False
        del self._landed[sd.job_id]
        if f.error is not None:
            raise f.error
        return True

    def _fly_in_turn(self, sd: StepDir, req: UploadRequest, path: str, sha256: str, fd: int, turn: _Turn) -> bool:
        """Upload one file in a thread of its own and wait for it at most until the turn's end. True: stored.
        False: it outlived the turn and goes on as the job's flight (holding the part's lock) while the other jobs
        take their turns; the job's next turn, once it landed, takes the result (``_landed``). No free flight
        slot: the job's turn ends before the file starts (``_TurnOver``)."""
        if len(self._flights) >= self.limits.max_flights:
            os.close(fd)
            self._say_once(sd.job_id, f"job={sd.job_id} step={sd.step}: {len(self._flights)} uploads of other jobs "
                                      "are in flight; this job waits for its next turn", logging.WARNING)  # fmt: skip
            raise _TurnOver(sd.step, flying=True)
        flight = _Flight(sd.job_id, sd.step, req.part, f"{req.job_id}.{req.restart}", path, sha256)

        def fly() -> None:
            try:
                self._put_shard(req, path, sha256, fd)
            except BaseException as exc:  # noqa: BLE001 - handed to the job's next turn, which raises it there
                flight.error = exc
            finally:
                os.close(fd)
                flight.done.set()

        threading.Thread(target=fly, name=f"nuro-upload-{sd.job_id}", daemon=True).start()
        if flight.done.wait(max(0.0, turn.deadline - self.clock())):
            if flight.error is not None:
                raise flight.error
            return True
        flight.lock_fd = os.dup(turn.lock_fd) if turn.lock_fd is not None else None
        self._flights[sd.job_id] = flight
        self._say_once(sd.job_id, f"job={sd.job_id} step={sd.step}: {path} ({req.step} of run {req.run}) outlives "
                                  f"its {self.limits.turn_s:g} s upload turn: it goes on beside the other jobs' turns",
                       logging.INFO)  # fmt: skip
        return False

    def _parts_of_attempt(self, req: UploadRequest) -> dict[int, PartRecord]:
        parts: dict[int, PartRecord] = {}
        for info in self._s3.list(L.parts_prefix(req.team, req.run, req.step)):
            try:
                rec = parse_part(self._s3.get(info.key, max_bytes=CHECKPOINT_PART_MAX_BYTES)[0], what=info.key)
            except NotFound:
                continue
            except (ManifestError, ObjectTooLarge) as exc:  # the team's own prefix: its oversized part only
                log.warning("ignoring bad part record %s: %s", info.key, exc)
                continue
            if rec.attempt == req.attempt and rec.step == req.step and (rec.team, rec.run) == (req.team, req.run):
                parts[rec.part] = rec
        return parts

    def _given_up_remotely(self, req: UploadRequest) -> bool:
        try:
            key = L.incomplete_key(req.team, req.run, req.step)
            data, _ = self._s3.get(key, max_bytes=CHECKPOINT_INCOMPLETE_MAX_BYTES)
        except NotFound:
            return False
        except ObjectTooLarge:
            return True  # a team's oversized marker in its own prefix: its step is given up, nobody else's
        try:
            return parse_incomplete(data).attempt == req.attempt
        except ManifestError:
            return True  # unreadable: treat as given up rather than commit over it

    def _parent(self, req: UploadRequest) -> int | None:
        older = [s.step for s in list_steps(self._s3, req.team, req.run) if s.committed and s.step < req.step]
        return max(older) if older else None

    def _after_commit(self, jd: JobDir, sd: StepDir, req: UploadRequest) -> None:
        if self.on_commit:
            try:
                self.on_commit(req)
            except Exception:
                log.exception("on_commit callback failed step=%d", req.step)
        if req.keep:  # bound to the record's keep (or the platform default) when root uploads
            try:
                apply_retention(self._s3, req.team, req.run, req.keep)
            except ObjectStoreError as exc:
                log.warning(
                    "retention skipped team=%s run=%s: %s (runs again after the next commit)", req.team, req.run, exc
                )
        try:
            prune_local(jd, sd.step)
        except OSError as exc:
            self._say_once(jd.job_id, f"job={jd.job_id} could not prune old local steps: {exc}", logging.WARNING)

    def _give_up(self, sd: StepDir, owner: Owner | None, reason: str) -> str | None:
        """Mark a leftover step incomplete, in S3 (best effort) and locally. Returns an error text or None."""
        err = None
        part = sd.parts[0] if sd.parts else 0
        try:
            with sd.claimed(part) as mine:
                if not mine:
                    log.warning("step=%d still locked by another worker; marking it incomplete anyway", sd.step)
                err = self._write_incomplete(sd, part, owner, reason)
        except UnsafePath as exc:  # the lock file is hostile: give up without it (nothing of ours is waiting on it)
            err = f"step {sd.step}: {exc}"
        try:
            sd.mark(L.ABANDONED_FILE, {"reason": reason, "at": utc_now()})
        except OSError as exc:
            err = f"{err + '; ' if err else ''}could not mark step {sd.step} abandoned: {exc}"
        log.warning(
            "checkpoint step=%d job=%s marked incomplete: %s%s", sd.step, sd.job_id, reason, f" ({err})" if err else ""
        )
        return err

    def _write_incomplete(self, sd: StepDir, part: int, owner: Owner | None, reason: str) -> str | None:
        try:
            req = self._request(sd, part, owner)
        except ManifestError as exc:
            return str(exc)  # a forged or broken request: nothing is written in S3 for it
        if req is not None:
            missing = tuple(sorted(set(range(req.parts_expected)) - set(self._safe_parts(req))))
            inc = Incomplete(req.team, req.run, req.step, req.job_id, req.restart, reason, missing, utc_now())
        elif owner is not None:  # torn here: no request, whose step it is comes from the job record alone
            inc = Incomplete(owner.team, owner.run, sd.step, owner.job_id, owner.restart, reason, (), utc_now())
        else:
            return None
        try:
            if not self._s3.exists(L.manifest_key(inc.team, inc.run, inc.step)):
                self._s3.put(L.incomplete_key(inc.team, inc.run, inc.step), dumps(inc.to_json_obj()))
        except ObjectStoreError as exc:
            return f"step {inc.step}: could not write incomplete.json ({exc}); it has no manifest either"
        return None

    def _safe_parts(self, req: UploadRequest) -> list[int]:
        try:
            return list(self._parts_of_attempt(req))
        except ObjectStoreError:
            return []


def _sparse(st: os.stat_result, min_allocated: float) -> bool:
    """A file much bigger than the space it takes (``st_blocks``): holes, which cost a job nothing to make and root
    a full read to hash. Files up to ``SPARSE_SLACK_BYTES`` are never judged."""
    return min_allocated > 0 and st.st_size > SPARSE_SLACK_BYTES and st.st_blocks * 512 < st.st_size * min_allocated


def prune_local(jd: JobDir, committed_step: int) -> list[int]:
    """Remove this job's local step directories older than ``committed_step`` that are done, given up or never
    requested (torn): S3 holds them now and the staging disk is small. Pending ones stay (their upload is not
    finished). Removal goes through the ckpt dir's fd and never follows a symlink (``safefs.remove_at``)."""
    removed: list[int] = []
    for step, name in jd.step_names():
        if step >= committed_step:
            continue
        try:
            with safefs.opened(safefs.open_dir(name, dir_fd=jd.ckpt_fd)) as fd:
                sd = StepDir(jd.job_id, step, name, fd, f"{jd.where}/ckpt/{name}")
                finished = sd.is_done or sd.is_abandoned or not sd.has_request
        except OSError:
            continue
        if finished:
            jd.remove_step(name)
            removed.append(step)
    return removed


__all__ = [
    "FlushResult",
    "Owner",
    "PassReport",
    "PermanentUploadError",
    "Superseded",
    "UploadLimits",
    "UploadWorker",
    "prune_local",
]

"""A node agent's in-band reports (``nuro.protocol.peerloss``), the report room of ``nuro-nodeagent``: the Unix
datagram socket a job's processes write to (a lost peer, a straggler, a commit or a stop's acknowledgement), each
sender's uid from the kernel, rate limits per job and per sender, and the beats' fields they fill (``suspect_jobs``,
``stragglers``, ``commits``, ``acks``). A report counts only when the job's root-written record names this node and
that user. ``InBandReports`` is mixed into ``nuro.healthcheck.agent.Agent``, whose lock, clocks and early-beat event
it shares.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nuro.protocol import heartbeat as hb
from nuro.protocol import jobrecord, peerloss

log = logging.getLogger("nuro.nodeagent")

#: A refused in-band report is logged at most this often (with the count so far).
REFUSAL_LOG_EVERY_S = 60.0
#: How often the agent checks that a job whose commit it carries still has its record here (a stat per job).
ALIVE_CHECK_S = 5.0


class RateLimit:
    """Token buckets by key (a job id, a uid): ``allow(key)`` takes one token or says no. Bounded memory: at most
    ``max_keys`` buckets (when full, the fullest ones, i.e. the idle keys, are dropped first)."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float], max_keys: int = 4096) -> None:
        self.rate, self.burst, self.clock, self.max_keys = rate, burst, clock, max_keys
        self._buckets: dict[object, tuple[float, float]] = {}  # key -> (tokens, at)

    def allow(self, key: object) -> bool:
        now = self.clock()
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.rate)
        if len(self._buckets) >= self.max_keys and key not in self._buckets:
            full = [k for k, (t, a) in self._buckets.items() if t + (now - a) * self.rate >= self.burst]
            for k in full or list(self._buckets)[: self.max_keys // 2]:
                del self._buckets[k]
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return False
        self._buckets[key] = (tokens - 1.0, now)
        return True


class InBandReports:
    """The report room (module docstring). Expects the agent's ``config``, ``clock``, ``monotonic``, ``_lock`` and
    ``_kick``; ``_init_reports`` sets its own state."""

    config: Any
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    _lock: threading.Lock
    _kick: threading.Event

    def _init_reports(self) -> None:
        self._suspects: dict[int, float] = {}  # job id -> until (monotonic)
        self._stragglers: dict[tuple[int, str], tuple[float, float]] = {}  # (job, node) -> (until, slowdown)
        self._kicked: dict[int, float] = {}  # job id -> when its last report kicked a beat (monotonic)
        self._last_kick = float("-inf")  # any report's early beat, at most one per KICK_EVERY_S (monotonic)
        self._commits: dict[int, tuple[int, int]] = {}  # job id -> (newest committed step, wall s it was learnt)
        self._acks: dict[int, tuple[int, int, float]] = {}  # job id -> (step, wall s, until monotonic)
        self._alive_checked: dict[int, float] = {}  # job id -> when its record was last seen here (monotonic)
        self._per_job = RateLimit(*peerloss.REPORT_RATE["job"], clock=self.monotonic)
        self._per_uid = RateLimit(*peerloss.REPORT_RATE["uid"], clock=self.monotonic)
        self.reports_limited = 0
        self.reports_accepted = 0
        self.reports_refused = 0
        self._refusal_logged = float("-inf")

    # -- in-band reports (nuro.protocol.peerloss) -----------------------------------------------------------------
    def _record_of(self, job_id: int) -> jobrecord.JobRecord | None:
        """The job's root-written record on this node, or None (no job of this node)."""
        root = self.config.health.for_node(self.config.node).staging_root
        try:
            return jobrecord.read(Path(root), str(job_id))
        except (OSError, ValueError):  # not a record root wrote: no job of this node
            return None

    def _within_rate(self, job_id: int, sender_uid: int) -> bool:
        """Whether a report of ``job_id`` from ``sender_uid`` is within both rates (``peerloss.REPORT_RATE``)."""
        if self._per_uid.allow(sender_uid) and self._per_job.allow(job_id):
            return True
        self.reports_limited += 1
        now = self.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_EVERY_S:
            self._refusal_logged = now
            log.warning("report rate-limited job=%d uid=%d (%d limited so far)", job_id, sender_uid,
                        self.reports_limited)  # fmt: skip
        return False

    def _kick_once(self) -> bool:
        """Beat now, unless a report made the agent beat early within ``KICK_EVERY_S`` (any job's)."""
        now = self.monotonic()
        with self._lock:
            if now - self._last_kick < peerloss.KICK_EVERY_S:
                return False
            self._last_kick = now
        self._kick.set()
        return True

    def _accepts(self, job_id: int, sender_uid: int, kind: str) -> bool:
        """Whether an in-band report of ``job_id`` from ``sender_uid`` is heard (``peerloss.accept`` against the job's
        root-written record on this node); refusals are counted and logged at most once a minute."""
        rec = self._record_of(job_id)
        uid, node = (rec.uid, rec.node) if rec is not None else (None, None)
        if peerloss.accept(job_id, sender_uid, uid, node, self.config.node):
            return True
        self.reports_refused += 1
        now = self.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_EVERY_S:  # a user flooding the socket must not flood the log
            self._refusal_logged = now
            log.warning("%s report refused job=%d uid=%d (no record of that job and user here; %d refused so far)",
                        kind, job_id, sender_uid, self.reports_refused)  # fmt: skip
        return False

    def report(self, job_id: int, sender_uid: int) -> bool:
        """A job's process on this node saw a peer die: accepted when the job's root-written record names this node
        and ``sender_uid`` (the kernel's word) is its user or root; the next beat then goes at once."""
        if not self._accepts(job_id, sender_uid, "peer-loss"):
            return False
        now = self.monotonic()
        with self._lock:
            self._suspects[job_id] = now + peerloss.SUSPECT_TTL_S
            kick = now - self._kicked.get(job_id, float("-inf")) >= peerloss.KICK_EVERY_S
            if kick:
                self._kicked[job_id] = now
        self.reports_accepted += 1
        if kick and self._kick_once():
            log.warning("node=%s job=%d reports a lost peer: beating now", self.config.node, job_id)
        return True

    def report_straggler(self, job_id: int, node: str, slowdown: float, sender_uid: int) -> bool:
        """A job of this node flagged a rank on ``node`` as slow: carried in the beats for ``STRAGGLER_TTL_S`` when
        the job's record names this node and that user (as ``report``). The controller decides what it is worth."""
        if not self._accepts(job_id, sender_uid, "straggler"):
            return False
        with self._lock:
            self._stragglers[(job_id, node)] = (self.monotonic() + peerloss.STRAGGLER_TTL_S, slowdown)
        self.reports_accepted += 1
        log.warning("node=%s job=%d reports a straggler on %s (%.2fx)", self.config.node, job_id, node, slowdown)
        self._kick_once()
        return True

    def note_commit(self, job_id: int, step: int, at: float | None = None) -> None:
        """Step ``step`` of ``job_id`` is committed (this agent's upload worker, or the job's accepted report): the
        beats carry the newest one per job while the job runs here. ``at``: when the checkpoint was taken (its
        request's creation, never later than now); default now."""
        now = self.clock()
        at = round(min(now, at) if at is not None else now)
        with self._lock:
            old = self._commits.get(job_id)
            if old is None or step > old[0]:
                self._commits[job_id] = (step, at)
                self._alive_checked.setdefault(job_id, self.monotonic())
            if len(self._commits) > 4 * hb.MAX_COMMITS:  # bounded: the oldest learnt go first
                for j in sorted(self._commits, key=lambda j: self._commits[j][1])[: -4 * hb.MAX_COMMITS]:
                    self._commits.pop(j, None)

    def on_upload_commit(self, req: Any) -> None:
        """``UploadWorker.on_commit``: root committed a step (the request's job id is the root-written record's:
        a root worker abandons a request that names another job). Its time is when the job made the checkpoint
        (the request's ``created_at``), so that a save already under way when a preemption signal came is never
        taken for the checkpoint the signal asked for (``progress.Progress.acked_since``); the job writes that time,
        so a false one only hurries its own requeue."""
        from nuro.checkpoint.manifest import utc_seconds  # the upload worker's own module: loaded already

        try:
            made = utc_seconds(str(req.created_at))
        except (AttributeError, ValueError):
            made = None
        try:
            self.note_commit(int(req.job_id), int(req.step), made)
        except (TypeError, ValueError):
            log.warning("upload commit with job id %r not noted", getattr(req, "job_id", None))

    def report_progress(self, kind: str, job_id: int, step: int, why: str, sender_uid: int) -> bool:
        """A job's rank 0 says step ``step`` is committed (``ckpt``) or acknowledges its stop (``ack``): accepted on
        ``report``'s terms; an ack beats at once (at most once per ``KICK_EVERY_S``) and is repeated in the beats
        for ``ACK_TTL_S``."""
        if not self._accepts(job_id, sender_uid, f"progress {kind}"):
            return False
        self.reports_accepted += 1
        if kind == peerloss.KIND_CKPT:  # ``why`` of a ckpt report: when its state was taken (the job's word)
            self.note_commit(job_id, step, float(why) if why else None)
            return True
        with self._lock:
            self._acks[job_id] = (step, round(self.clock()), self.monotonic() + hb.ACK_TTL_S)
            while len(self._acks) > hb.MAX_ACKS:
                self._acks.pop(min(self._acks, key=lambda j: self._acks[j][2]))
        log.info("node=%s job=%d acknowledged its stop at step %d (%s)", self.config.node, job_id, step, why or "-")
        self._kick_once()
        return True

    def _fresh_progress(self) -> tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, int, int], ...]]:
        """(commits, acks) for the next beat: acks within their TTL; commits of jobs whose record is still here
        (looked at once per ``ALIVE_CHECK_S`` per job), the newest ``MAX_COMMITS``."""
        now = self.monotonic()
        with self._lock:
            for job in [j for j, (_, _, until) in self._acks.items() if until <= now]:
                del self._acks[job]
            due = [j for j in self._commits if now - self._alive_checked.get(j, now) >= ALIVE_CHECK_S]
        gone = [j for j in due if self._record_of(j) is None]
        with self._lock:
            for job in due:
                self._alive_checked[job] = now
            for job in gone:
                self._commits.pop(job, None)
                self._alive_checked.pop(job, None)
            commits = sorted(((j, s, at) for j, (s, at) in self._commits.items()), key=lambda r: (r[2], r[0]))
            acks = tuple(sorted((j, s, at) for j, (s, at, _) in self._acks.items()))
        return tuple(commits[-hb.MAX_COMMITS :]), acks

    def _fresh_stragglers(self) -> tuple[tuple[int, str, float], ...]:
        now = self.monotonic()
        with self._lock:
            for key in [k for k, (until, _) in self._stragglers.items() if until <= now]:
                del self._stragglers[key]
            return tuple((job, node, s) for (job, node), (_, s) in sorted(self._stragglers.items()))[
                : hb.MAX_STRAGGLERS
            ]

    def _suspect_jobs(self) -> tuple[int, ...]:
        now = self.monotonic()
        with self._lock:
            for job in [j for j, until in self._suspects.items() if until <= now]:
                del self._suspects[job]
                self._kicked.pop(job, None)
            return tuple(sorted(self._suspects))[: hb.MAX_SUSPECT_JOBS]

    def _report_loop(self, sock: socket.socket, stop: threading.Event) -> None:
        """Receive reports until ``stop``; each one's sender uid from its SCM_CREDENTIALS."""
        creds = struct.Struct("iII")  # struct ucred: pid, uid, gid
        while not stop.is_set():
            try:
                data, ancdata, _flags, _addr = sock.recvmsg(peerloss.MAX_DATAGRAM, socket.CMSG_SPACE(creds.size))
            except TimeoutError:
                continue
            except OSError as exc:
                if stop.is_set():
                    return
                log.warning("report socket failed: %s", exc)
                stop.wait(1.0)
                continue
            uid = next((creds.unpack(d[: creds.size])[1] for lvl, typ, d in ancdata
                        if lvl == socket.SOL_SOCKET and typ == socket.SCM_CREDENTIALS and len(d) >= creds.size),
                       None)  # fmt: skip
            if uid is None:
                continue
            job = peerloss.parse(data)
            straggler = peerloss.parse_straggler(data) if job is None else None
            progress = peerloss.parse_progress(data) if job is None and straggler is None else None
            about = job or (straggler[0] if straggler else None) or (progress[1] if progress else None)
            if about is None or not self._within_rate(about, uid):
                continue
            if job is not None:
                self.report(job, uid)
            elif straggler is not None:
                self.report_straggler(*straggler, uid)
            elif progress is not None:
                self.report_progress(*progress, uid)

    def _open_report_socket(self) -> socket.socket | None:
        """The report socket, world-writable (who sent a datagram is the kernel's word), or None when it cannot be
        made (the agent works on without in-band reports)."""
        directory = self.config.socket_dir or self.config.status_dir
        if not directory:
            return None
        path = peerloss.socket_path(directory, self.config.node)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)  # a crashed agent's socket
            sock.bind(str(path))
            os.chmod(path, 0o666)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.settimeout(0.5)
        except OSError as exc:
            sock.close()
            log.warning("no in-band report socket at %s: %s", path, exc)
            return None
        return sock


__all__ = ["ALIVE_CHECK_S", "REFUSAL_LOG_EVERY_S", "InBandReports", "RateLimit"]

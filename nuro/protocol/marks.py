"""Preempt marks only the controller can make: an HMAC over the job id and the mark's fields, with a controller key.

The controller writes ``preempt = {"at", "for", "why"}`` into a victim's job comment before it signals it, so that
a restarted controller still knows the preemption is in flight. A job owner can write their own comment too, so an
unsigned mark would let a user make their job look "already being preempted" forever (it would never be chosen
again: no reclaim, no urgent preemption). Hence ``sig``: HMAC-SHA256 over the canonical JSON of
``{"at", "for", "job", "why"}`` (the job id binds a mark to its job: a mark copied from another job is invalid) with
the *mark key*, ``HMAC(master, PURPOSE)``, derived from the controller's master heartbeat key (``use_master_key``;
root-only file, never on a login node). The key only the controller has; an unsigned or badly signed mark is
ignored, logged once per job and signature. The job_submit bridge also refuses a user who adds, changes or removes a
``preempt`` key (rule ``preempt_forged``).

A mark of the job's previous run cannot be replayed into its next run: readers ignore marks older than the job's
start (``preemption.finish_in_flight``). Without a master key (a controller run without the failure detector) a
random key for this process is used: marks then verify only until the controller restarts, and a restarted
controller forgets in-flight preemptions (logged once; the victims' GraceTime still holds them to account).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading

from nuro.protocol import jobcomment
from nuro.protocol.jobcomment import JobComment, PreemptRequest

log = logging.getLogger(__name__)

PURPOSE = b"nuro-preempt-mark/v1"

_lock = threading.Lock()
_key: bytes | None = None
_warned: set[tuple[int, str]] = set()
_MAX_WARNED = 10_000  # bounded memory: a flood of forged marks is logged at most this many times per process


def purpose_key(master: bytes) -> bytes:
    """The mark key for a master key: its own purpose, so a mark key never verifies heartbeats or the reverse."""
    return hmac.new(master, PURPOSE, hashlib.sha256).digest()


def use_master_key(master: bytes | None) -> None:
    """Sign and verify with the key derived from ``master`` (the controller's master heartbeat key); None: a random
    key for this process (marks survive no controller restart)."""
    global _key
    with _lock:
        _key = purpose_key(master) if master else None


def _current_key() -> bytes:
    global _key
    with _lock:
        if _key is None:
            _key = secrets.token_bytes(32)
            log.warning(
                "preempt marks: no master key configured (heartbeat_key_file with the detector); signing with a key "
                "for this process only, so a restarted controller ignores the marks it wrote before"
            )
        return _key


def _message(job_id: int, at: int, for_job: int | None, why: str) -> bytes:
    return jobcomment.canonical({"at": at, "for": for_job, "job": job_id, "why": why}).encode()


def sign(job_id: int, at: int, for_job: int | None, why: str) -> dict:
    """The ``preempt`` value the controller writes for ``job_id``: ``{"at", "for", "sig", "why"}``."""
    sig = hmac.new(_current_key(), _message(job_id, at, for_job, why), hashlib.sha256).hexdigest()
    return {"at": at, "for": for_job, "sig": sig, "why": why}


def is_authentic(job_id: int, req: PreemptRequest) -> bool:
    """Whether ``req`` is a mark this controller key made for ``job_id``."""
    if not req.sig or not float(req.at).is_integer():
        return False
    want = hmac.new(_current_key(), _message(job_id, int(req.at), req.for_job, req.why), hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, req.sig)


def authentic_preempt(job_id: int, comment: JobComment) -> PreemptRequest | None:
    """The job's ``preempt`` mark when the controller made it, else None (a forged or stale-key mark, logged once)."""
    req = comment.preempt
    if req is None:
        return None
    if is_authentic(job_id, req):
        return req
    seen = (job_id, req.sig[:64])
    with _lock:
        first = seen not in _warned and len(_warned) < _MAX_WARNED
        if first:
            _warned.add(seen)
    if first:
        log.warning(
            "job=%d preempt mark ignored: %s (only marks the controller signed count)",
            job_id, "unsigned" if not req.sig else "bad signature",
        )  # fmt: skip
    return None


__all__ = ["PURPOSE", "authentic_preempt", "is_authentic", "purpose_key", "sign", "use_master_key"]

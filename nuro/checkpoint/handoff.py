"""The epilog hands a finished job's last checkpoint uploads to the node agent, so the node is released at once.

Why: the epilog used to hold the node (COMPLETING, its GPUs idle) until every pending upload had committed, about
16 s for a 1 GiB final checkpoint here, against the brief's "< 5 % idle between job transitions". A job that will
not run again gains nothing from that wait: its uploads only have to finish durably. So the epilog of such a job
(``wants_flush`` false) leaves its staging dir and its root-owned record where they are and writes a marker,
``<staging root>/.handoff/<job>`` (root's, in a 0700 dir, so its mtime is the hand-off time and no job can forge or
move one). The node agent's upload worker already uploads every job dir on the node; ``HandoffWorker`` also finishes
each handed-off job once nothing of it is pending, exactly as the epilog would have (``nodestage.finish_job``: cache
the newest committed step for a later run on this node, remove the job dir), then removes the record and the marker.
Everything lives on the node's disk: an agent restarted, or a node rebooted with its NVMe, carries on where it was.
A hand-off still pending after ``NURO_HANDOFF_TIMEOUT_S`` (default 1 h) is given up the way the epilog gives up
(``incomplete.json`` in S3, never a manifest).

A job that Slurm is requeueing keeps the old path (the epilog flushes and waits): its next attempt may start on
another node and restore from S3, so its newest checkpoint must be committed before that attempt looks for it.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from nuro.checkpoint import layout as L
from nuro.checkpoint.nodestage import DEFAULT_CACHE_RUNS, finish_job, open_root
from nuro.checkpoint.upload import UploadWorker
from nuro.objectstore import ObjectStore
from nuro.protocol import jobrecord
from nuro.protocol.nodeenv import setting
from nuro.safeio import safefs

log = logging.getLogger(__name__)

HANDOFF_DIR = L.HANDOFF_DIR
DEFAULT_TIMEOUT_S = 3600.0
ENV_ENABLED = "NURO_EPILOG_HANDOFF"
ENV_TIMEOUT = "NURO_HANDOFF_TIMEOUT_S"


def enabled(env: Mapping[str, str]) -> bool:
    """``NURO_EPILOG_HANDOFF=1`` in the node env: an agent with an upload worker runs on this node (Ansible's
    compute role and the dev cluster set it), so the epilog may leave uploads to it."""
    return env.get(ENV_ENABLED, "").strip() == "1"


def timeout_s(env: Mapping[str, str]) -> float:
    """``NURO_HANDOFF_TIMEOUT_S`` (default 1 h); a malformed or non-positive value keeps the default, loudly."""
    return float(setting(env, ENV_TIMEOUT, float, DEFAULT_TIMEOUT_S, positive=True))


def wants_flush(restarts_at_start: int, restarts_now: int | None, state: str | None) -> bool:
    """Whether the epilog must flush and wait (the old path) instead of handing off. Pure.

    Slurm counts a requeue in the job's restart count when it happens, so a count above the one the prolog saw
    (the job record's) means this attempt is being requeued and the next one must find its checkpoint in S3. The
    state can say so too (REQUEUED, PENDING: a requeue that already completed elsewhere). Anything unknown (Slurm
    did not answer) flushes: waiting is slow, losing the newest checkpoint to a resumed run is worse.
    """
    if restarts_now is None or state is None:
        return True
    if restarts_now > restarts_at_start:
        return True
    return state.upper().startswith(("REQUEUE", "PENDING"))


def hand_off(root: Path, job_id: str) -> None:
    """Write the root-owned marker that gives ``job_id``'s pending uploads to the node agent."""
    name = L.validate_job_id(job_id)
    with open_root(root) as r:
        d = r.mkdir(HANDOFF_DIR, 0o700, (0, 0))
        try:
            safefs.write_atomic_at(d.fd, name, b"", mode=0o600, owner=(0, 0))
        finally:
            d.close()


@dataclass(frozen=True)
class Handoff:
    job_id: str
    at: float  # wall clock: the marker's mtime


@contextlib.contextmanager
def _markers(root: Path) -> Iterator[safefs.Dir | None]:
    """The open ``.handoff`` dir below ``root``, or None when there is none (no hand-off yet)."""
    with open_root(root) as r:
        try:
            d = r.sub(HANDOFF_DIR)
        except (FileNotFoundError, safefs.UnsafePath):
            yield None
            return
        try:
            yield d
        finally:
            d.close()


def handoffs(root: Path) -> list[Handoff]:
    """Every hand-off on this node, oldest first (regular files named like job ids; anything else is ignored)."""
    with _markers(root) as d:
        if d is None:
            return []
        out = [Handoff(e.name, e.st.st_mtime) for e in safefs.list_dir(d.fd) if e.is_file and e.name.isdigit()]
    return sorted(out, key=lambda h: h.at)


def _drop_marker(root: Path, job_id: str) -> None:
    with _markers(root) as d:
        if d is not None:
            safefs.remove_at(d.fd, job_id)


class HandoffWorker(UploadWorker):
    """The node agent's upload worker (``trust="record"``, every job dir) that also finishes hand-offs.

    Each pass uploads as before (``UploadWorker.run_once``), then (``after_pass``) finishes every handed-off job
    with nothing left pending, or whose hand-off timed out (its leftovers are given up as the epilog gives them up).
    """

    def __init__(
        self,
        store: ObjectStore,
        staging_root: str | Path,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        cache_runs: int = DEFAULT_CACHE_RUNS,
        cache_keep_free_bytes: int = 0,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(store, staging_root)
        self.timeout_s = timeout_s
        self.cache_runs = cache_runs
        self.cache_keep_free_bytes = cache_keep_free_bytes
        self.wall = wall

    def after_pass(self) -> None:
        self.finish_handoffs()

    def finish_handoffs(self) -> list[str]:
        """Finish what can be finished; returns the job ids finished in this pass."""
        done = []
        for h in handoffs(self.staging_root):
            expired = self.wall() - h.at >= self.timeout_s
            if self.pending(h.job_id) and not expired:
                continue
            try:
                result, cached = finish_job(
                    self._s3, self.staging_root, h.job_id, flush_timeout_s=0.0, cache_runs=self.cache_runs,
                    cache_keep_free_bytes=self.cache_keep_free_bytes,
                )  # fmt: skip
                jobrecord.remove(self.staging_root, h.job_id)
                _drop_marker(self.staging_root, h.job_id)
            except Exception as exc:  # noqa: BLE001 - one job's leftovers must not stop the others'
                log.warning("job=%s hand-off not finished yet: %s: %s", h.job_id, type(exc).__name__, exc)
                continue
            waited = self.wall() - h.at
            if result is not None and result.incomplete:
                log.error("job=%s hand-off given up after %.0f s: steps %s marked incomplete", h.job_id, waited,
                          result.incomplete)  # fmt: skip
            else:
                log.info("job=%s hand-off finished %.1f s after the epilog: committed=%s cached=%s", h.job_id,
                         waited, result.committed if result else [], cached or "-")  # fmt: skip
            done.append(h.job_id)
        return done


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "HANDOFF_DIR",
    "Handoff",
    "HandoffWorker",
    "enabled",
    "hand_off",
    "handoffs",
    "timeout_s",
    "wants_flush",
]

"""Slurm Epilog (once per allocated node after the job ends, as root).

Checkpoint staging (``nuro.checkpoint.nodestage.finish_job``): the node is not released before the job's pending
checkpoint uploads are committed, or the time is up (``NURO_EPILOG_FLUSH_TIMEOUT_S``, default 120 s; keep it below
Slurm's ``PrologEpilogTimeout``) — leftovers get ``incomplete.json`` in S3 and are never valid. Nothing waits for a
step that can never commit (``nuro.checkpoint.lostwriters``): one this node never finished writing, or one whose
missing part's writer node Slurm reports DOWN or not responding (``SlurmLostNodes``) is given up at once.
The newest committed copy stays in the node cache for a requeue on this node (the least recently cached runs go
first when the disk has less than ``NURO_STAGING_CACHE_KEEP_FREE_GB`` free, default twice
``NURO_STAGING_MIN_FREE_GB``); the job's staging dir is removed.

Hand-off (``nuro.checkpoint.handoff``, on with ``NURO_EPILOG_HANDOFF=1`` where the node agent runs an upload
worker): a job that is *not* being requeued does not wait for its uploads. The epilog leaves its staging dir and
record to the node agent, which commits them from local disk, caches and cleans up as above, and the node is
released at once. A requeued job still waits: its next attempt may restore on another node, from S3.

The whole checkpoint part is bounded by our own deadline (``NURO_EPILOG_DEADLINE_S``, default the flush timeout
plus 30 s; keep it below ``PrologEpilogTimeout``): it runs in a thread the epilog stops waiting for at the
deadline, so neither a slow store nor anything a job left in its dir can hold the node in COMPLETING (root reads
a job's files only through no-follow fds, non-blocking, regular files only: ``nuro.checkpoint.staging``). At the
end the job's root-owned record (``nuro.protocol.jobrecord``) is removed, whatever happened before (unless handed
off: then the agent removes it when it is done).

Then the node's health check (``nuro.prolog_epilog.health``): an unhealthy node is drained with the precise reason
and the epilog exits 1. Otherwise it exits 0: neither a store outage nor a job's leftovers are the node's fault.
Problems are logged (slurmd's log) with the job id.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from nuro.checkpoint import handoff, lostwriters, promote
from nuro.checkpoint.nodestage import finish_job, staging_root
from nuro.checkpoint.upload import UploadWorker
from nuro.healthcheck.uploads import cache_keep_free_bytes, cache_runs
from nuro.objectstore import ObjectStore
from nuro.prolog_epilog import hooklog, prefetchguard
from nuro.prolog_epilog.health import node_is_healthy
from nuro.protocol import jobrecord
from nuro.protocol.gpujobs import forget
from nuro.protocol.nodeenv import load_node_env, setting
from nuro.safeio import safefs

log = logging.getLogger("nuro.epilog")


DEFAULT_FLUSH_TIMEOUT_S = 120.0
DEADLINE_MARGIN_S = 30.0  # caching the newest copy and removing the job dir after the flush


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return float(setting(env, name, float, default, positive=True))


def flush_timeout_s(env: Mapping[str, str]) -> float:
    """``NURO_EPILOG_FLUSH_TIMEOUT_S`` (default 120 s), never more than the deadline leaves for it."""
    flush = _seconds(env, "NURO_EPILOG_FLUSH_TIMEOUT_S", DEFAULT_FLUSH_TIMEOUT_S)
    return min(flush, max(1.0, deadline_s(env) - DEADLINE_MARGIN_S))


def deadline_s(env: Mapping[str, str]) -> float:
    """``NURO_EPILOG_DEADLINE_S``: the most the checkpoint part of the epilog may take (default: the flush timeout
    plus 30 s). Keep it below slurm.conf's ``PrologEpilogTimeout``, so our deadline, not Slurm's, ends it."""
    flush = _seconds(env, "NURO_EPILOG_FLUSH_TIMEOUT_S", DEFAULT_FLUSH_TIMEOUT_S)
    return _seconds(env, "NURO_EPILOG_DEADLINE_S", flush + DEADLINE_MARGIN_S)


class SlurmLostNodes:
    """Which of some nodes Slurm reports gone (``nuro.checkpoint.lostwriters.node_is_lost``), for the flush: a step
    whose missing part only a lost node could upload is given up at once. One node read per ``every_s`` at most (the
    flush polls twice a second); a read that fails answers "none lost", so the flush waits as it did before."""

    def __init__(self, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.clock = clock
        self._at: float | None = None
        self._lost: frozenset[str] = frozenset()

    def __call__(self, names: Sequence[str]) -> frozenset[str]:
        if self._at is None or self.clock() - self._at >= self.every_s:
            self._at = self.clock()
            self._lost = self._read()
        return self._lost.intersection(names)

    def _read(self) -> frozenset[str]:
        from nuro.slurm import CliBackend, SlurmError  # lazy: asked only while a step waits for a missing part

        try:
            return frozenset(n.name for n in CliBackend(timeout_s=5).nodes() if lostwriters.node_is_lost(n.flags))
        except (SlurmError, OSError, ValueError) as exc:
            log.warning("node states unreadable (%s): waiting for missing checkpoint parts as usual", exc)
            return frozenset()


def flush_and_clean(job: str, timeout_s: float | None = None) -> None:
    timeout_s = flush_timeout_s(os.environ) if timeout_s is None else timeout_s
    result, cached = finish_job(
        ObjectStore.from_env(), staging_root(), job, flush_timeout_s=timeout_s, cache_runs=cache_runs(os.environ),
        cache_keep_free_bytes=cache_keep_free_bytes(os.environ), lost_nodes=SlurmLostNodes(),
    )  # fmt: skip
    if result is None:
        return
    for step, why in sorted(result.settled.items()):
        log.info("job=%s checkpoint step %d given up at once, not waited for: %s", job, step, why)
    promote_snapshot(job)
    timed_out = [s for s in result.incomplete if s not in result.settled]
    if timed_out:
        log.warning(
            "job=%s checkpoint uploads not committed within %.0f s, marked incomplete: steps %s %s",
            job, timeout_s, timed_out, "; ".join(result.errors),
        )  # fmt: skip
    log.info(
        "job=%s checkpoints committed=%s incomplete=%s waited=%.1fs cached=%s",
        job, result.committed, result.incomplete, result.waited_s, cached or "-",
    )  # fmt: skip


def promote_snapshot(job: str) -> None:
    """The newest complete in-memory snapshot this node holds becomes a committed checkpoint when it is newer than
    the run's newest one (``nuro.checkpoint.promote``): what a requeue after a node loss resumes from."""
    root = promote.snapshot_root()
    if not (root / job).is_dir():
        return
    got = promote.promote(ObjectStore.from_env(), root, job, promote.promote_timeout_s(os.environ))
    if got.committed:
        log.info("job=%s in-memory snapshot step %s promoted to a committed checkpoint (newest before: %s)", job,
                 got.committed[-1], got.newest_before)  # fmt: skip
    else:
        log.info("job=%s no in-memory snapshot promoted: %s", job, got.why)


def _slurm_restarts(job: str) -> tuple[int | None, str | None]:
    """(restart count, state) of the job as slurmctld has it now; (None, None) when it did not answer."""
    from nuro.slurm import CliBackend, SlurmError  # lazy: only a job with pending uploads asks Slurm anything

    try:
        return CliBackend(timeout_s=10).job_restarts(job)
    except (SlurmError, KeyError, ValueError) as exc:
        log.warning("job=%s restart count unreadable (%s): flushing its uploads before the node is released", job, exc)
        return None, None


def try_hand_off(job: str, env: Mapping[str, str] = os.environ) -> bool:
    """Leave the job's pending uploads to the node agent (``nuro.checkpoint.handoff``) when that is safe: hand-off
    on (``NURO_EPILOG_HANDOFF=1``), something pending, a nuro job record, and the job not being requeued. True when
    handed off: the job dir and record then stay for the agent."""
    if not handoff.enabled(env):
        return False
    root = staging_root()
    rec = jobrecord.read(root, job)
    if rec is None or rec.team is None or not UploadWorker(None, root).pending(job):  # no S3 client just to look
        return False
    restarts, state = _slurm_restarts(job)
    if handoff.wants_flush(rec.restart, restarts, state):
        log.info("job=%s is being requeued (restarts %s → %s, %s): its uploads commit before the node is released",
                 job, rec.restart, restarts, state)  # fmt: skip
        return False
    handoff.hand_off(root, job)
    log.info("job=%s pending checkpoint uploads handed to the node agent; node released now", job)
    return True


def forget_gpus(job: str) -> None:
    """The job no longer holds its GPUs: the agent's next points are untagged (``nuro.protocol.gpujobs``)."""
    node = os.environ.get("SLURMD_NODENAME", "")
    if node:
        forget(staging_root(), node, job)


def _checkpoints(job: str, handed: list[str]) -> None:
    try:
        if try_hand_off(job):
            handed.append(job)
            return
    except Exception as exc:  # noqa: BLE001 - a hand-off that fails falls back to the flush, never to nothing
        log.warning("job=%s hand-off failed (%s: %s): flushing its uploads here", job, type(exc).__name__, exc)
    try:
        flush_and_clean(job)
    except Exception as exc:  # never drain a node for a bug of ours; say it loudly instead
        log.exception("job=%s epilog checkpoint flush failed: %s", job, exc)


def bounded_checkpoints(job: str, limit_s: float) -> str:
    """Hand off, or flush, cache and clean, the job's checkpoints in a daemon thread, waiting at most ``limit_s``.

    Returns "handed-off" (the job dir and record stay for the node agent), "done", or "deadline": the thread is
    left behind (it dies with this process) and the job dir is removed here, without following anything in it, so
    the node is released on time and its disk is not leaked."""
    handed: list[str] = []
    t = threading.Thread(target=_checkpoints, args=(job, handed), name=f"epilog-ckpt-{job}", daemon=True)
    t.start()
    t.join(limit_s)
    if not t.is_alive():
        return "handed-off" if handed else "done"
    log.error(
        "job=%s epilog deadline (%.0f s, NURO_EPILOG_DEADLINE_S) passed with the checkpoint flush still running: "
        "giving up on its uploads (no manifest is written for them) and removing the job dir", job, limit_s,
    )  # fmt: skip
    try:
        with safefs.opened(safefs.open_dir(staging_root())) as root_fd:
            safefs.remove_at(root_fd, job)
    except Exception as exc:  # noqa: BLE001 - best effort: the next epilog on a full disk drains via health
        log.warning("job=%s could not remove its staging dir after the deadline: %s", job, exc)
    return "deadline"


def forget_record(job: str) -> None:
    """The job is over on this node: its root-owned record goes (``nuro.protocol.jobrecord``), nothing root does trusts
    it any more."""
    jobrecord.remove(staging_root(), job)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="nuro-epilog: %(message)s", stream=sys.stderr)
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return 0
    start = time.monotonic()
    try:
        load_node_env()
        hooklog.attach("nuro-epilog")
        forget_gpus(job)
    except Exception as exc:  # never drain a node for a bug of ours; say it loudly instead
        log.exception("job=%s epilog set-up failed: %s", job, exc)
    try:  # the prolog's dataset prefetch ends with the job, whatever it was doing (nuro.prolog_epilog.prefetchguard)
        outcome = prefetchguard.stop(staging_root(), job)
        if outcome != "none":
            log.info("job=%s dataset prefetch: %s", job, outcome)
    except Exception as exc:  # noqa: BLE001
        log.exception("job=%s dataset prefetch not stopped: %s", job, exc)
    outcome = bounded_checkpoints(job, deadline_s(os.environ))
    try:  # the job's in-memory snapshots give their memory back, promoted or not
        promote.drop(promote.snapshot_root(), job)
    except Exception as exc:  # noqa: BLE001
        log.exception("job=%s could not remove its snapshot dir: %s", job, exc)
    if outcome != "handed-off":  # a hand-off keeps the record: the agent's uploads read whose checkpoint it is
        try:
            forget_record(job)
        except Exception as exc:  # noqa: BLE001
            log.exception("job=%s could not remove the job record: %s", job, exc)
    log.info("job=%s epilog checkpoints %s in %.2f s", job, outcome, time.monotonic() - start)
    return 0 if node_is_healthy(job, "epilog") else 1


if __name__ == "__main__":
    sys.exit(main())

"""Slurm Epilog (once per allocated node after the job ends, as root).

Checkpoint staging (``nuro.checkpoint.nodestage.finish_job``): the node is not released before the job's pending
checkpoint uploads are committed, or the time is up (``NURO_EPILOG_FLUSH_TIMEOUT_S``, default 120 s; keep it below
Slurm's ``PrologEpilogTimeout``) — leftovers get ``incomplete.json`` in S3 and are never valid. The newest committed
copy stays in the node cache for a requeue on this node (the least recently cached runs go first when the disk
has less than ``NURO_STAGING_CACHE_KEEP_FREE_GB`` free, default twice ``NURO_STAGING_MIN_FREE_GB``); the job's
staging dir is removed.

The whole checkpoint part is bounded by our own deadline (``NURO_EPILOG_DEADLINE_S``, default the flush timeout
plus 30 s; keep it below ``PrologEpilogTimeout``): it runs in a thread the epilog stops waiting for at the
deadline, so neither a slow store nor anything a job left in its dir can hold the node in COMPLETING (root reads
a job's files only through no-follow fds, non-blocking, regular files only: ``nuro.checkpoint.staging``). At the
end the job's root-owned record (``nuro.protocol.jobrecord``) is removed, whatever happened before.

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
from collections.abc import Mapping

from nuro.checkpoint.nodestage import DEFAULT_CACHE_RUNS, finish_job, staging_root
from nuro.healthcheck.checks import DEFAULT_STAGING_MIN_FREE_GB
from nuro.healthcheck.run import HealthSettings
from nuro.objectstore import ObjectStore
from nuro.prolog_epilog import hooklog
from nuro.prolog_epilog.health import node_is_healthy
from nuro.protocol import jobrecord
from nuro.protocol.gpujobs import forget
from nuro.protocol.nodeenv import load_node_env
from nuro.safeio import safefs

log = logging.getLogger("nuro.epilog")


def cache_keep_free_bytes(env: Mapping[str, str]) -> int:
    """``NURO_STAGING_CACHE_KEEP_FREE_GB``, default twice the health check's ``NURO_STAGING_MIN_FREE_GB`` (20 GiB
    → 40 GiB): the node cache gives way well before the staging disk is full enough to drain the node."""
    raw = env.get("NURO_STAGING_CACHE_KEEP_FREE_GB", "").strip()
    try:
        return int(max(float(raw), 0.0) * (1 << 30)) if raw else 2 * HealthSettings.from_env(env).staging_min_free_bytes
    except ValueError as exc:  # the node's settings are broken; the health check reports the same error
        log.warning("cache free-space floor unreadable (%s): the cache keeps 40 GiB free", exc)
        return int(2 * DEFAULT_STAGING_MIN_FREE_GB * (1 << 30))


DEFAULT_FLUSH_TIMEOUT_S = 120.0
DEADLINE_MARGIN_S = 30.0  # caching the newest copy and removing the job dir after the flush


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a number of seconds: using %.0f", name, raw, default)
        return default
    return value if value > 0 else default


def flush_timeout_s(env: Mapping[str, str]) -> float:
    """``NURO_EPILOG_FLUSH_TIMEOUT_S`` (default 120 s), never more than the deadline leaves for it."""
    flush = _seconds(env, "NURO_EPILOG_FLUSH_TIMEOUT_S", DEFAULT_FLUSH_TIMEOUT_S)
    return min(flush, max(1.0, deadline_s(env) - DEADLINE_MARGIN_S))


def deadline_s(env: Mapping[str, str]) -> float:
    """``NURO_EPILOG_DEADLINE_S``: the most the checkpoint part of the epilog may take (default: the flush timeout
    plus 30 s). Keep it below slurm.conf's ``PrologEpilogTimeout``, so our deadline, not Slurm's, ends it."""
    flush = _seconds(env, "NURO_EPILOG_FLUSH_TIMEOUT_S", DEFAULT_FLUSH_TIMEOUT_S)
    return _seconds(env, "NURO_EPILOG_DEADLINE_S", flush + DEADLINE_MARGIN_S)


def flush_and_clean(job: str, timeout_s: float | None = None) -> None:
    timeout_s = flush_timeout_s(os.environ) if timeout_s is None else timeout_s
    cache_runs = int(os.environ.get("NURO_STAGING_CACHE_RUNS") or DEFAULT_CACHE_RUNS)
    result, cached = finish_job(
        ObjectStore.from_env(), staging_root(), job, flush_timeout_s=timeout_s, cache_runs=cache_runs,
        cache_keep_free_bytes=cache_keep_free_bytes(os.environ),
    )  # fmt: skip
    if result is None:
        return
    if result.incomplete:
        log.warning(
            "job=%s checkpoint uploads not committed within %.0f s, marked incomplete: steps %s %s",
            job, timeout_s, result.incomplete, "; ".join(result.errors),
        )  # fmt: skip
    log.info(
        "job=%s checkpoints committed=%s incomplete=%s waited=%.1fs cached=%s",
        job, result.committed, result.incomplete, result.waited_s, cached or "-",
    )  # fmt: skip


def forget_gpus(job: str) -> None:
    """The job no longer holds its GPUs: the agent's next points are untagged (``nuro.protocol.gpujobs``)."""
    node = os.environ.get("SLURMD_NODENAME", "")
    if node:
        forget(staging_root(), node, job)


def _checkpoints(job: str) -> None:
    try:
        flush_and_clean(job)
    except Exception as exc:  # never drain a node for a bug of ours; say it loudly instead
        log.exception("job=%s epilog checkpoint flush failed: %s", job, exc)


def bounded_checkpoints(job: str, limit_s: float) -> bool:
    """Flush, cache and clean the job's checkpoints in a daemon thread, waiting at most ``limit_s``. False when
    the deadline passed: the thread is left behind (it dies with this process) and the job dir is removed here,
    without following anything in it, so the node is released on time and its disk is not leaked."""
    t = threading.Thread(target=_checkpoints, args=(job,), name=f"epilog-ckpt-{job}", daemon=True)
    t.start()
    t.join(limit_s)
    if not t.is_alive():
        return True
    log.error(
        "job=%s epilog deadline (%.0f s, NURO_EPILOG_DEADLINE_S) passed with the checkpoint flush still running: "
        "giving up on its uploads (no manifest is written for them) and removing the job dir", job, limit_s,
    )  # fmt: skip
    try:
        with safefs.opened(safefs.open_dir(staging_root())) as root_fd:
            safefs.remove_at(root_fd, job)
    except Exception as exc:  # noqa: BLE001 - best effort: the next epilog on a full disk drains via health
        log.warning("job=%s could not remove its staging dir after the deadline: %s", job, exc)
    return False


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
    bounded_checkpoints(job, deadline_s(os.environ))
    try:
        forget_record(job)
    except Exception as exc:  # noqa: BLE001
        log.exception("job=%s could not remove the job record: %s", job, exc)
    log.info("job=%s epilog checkpoints done in %.2f s", job, time.monotonic() - start)
    return 0 if node_is_healthy(job, "epilog") else 1


if __name__ == "__main__":
    sys.exit(main())

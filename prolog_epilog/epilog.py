"""Slurm Epilog (once per allocated node after the job ends, as root).

Checkpoint staging (``nuro.checkpoint.nodestage.finish_job``): the node is not released before the job's pending
checkpoint uploads are committed, or the time is up (``NURO_EPILOG_FLUSH_TIMEOUT_S``, default 120 s; keep it below
Slurm's ``PrologEpilogTimeout``) — leftovers get ``incomplete.json`` in S3 and are never valid. The newest committed
copy stays in the node cache for a requeue on this node (the least recently cached runs go first when the disk
has less than ``NURO_STAGING_CACHE_KEEP_FREE_GB`` free, default twice ``NURO_STAGING_MIN_FREE_GB``); the job's
staging dir is removed.

Then the node's health check (``nuro.prolog_epilog.health``): an unhealthy node is drained with the precise reason
and the epilog exits 1. Otherwise it exits 0: neither a store outage nor a job's leftovers are the node's fault.
Problems are logged (slurmd's log) with the job id.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from nuro.nodeenv import load_node_env
from nuro.prolog_epilog.health import node_is_healthy

log = logging.getLogger("nuro.epilog")


def cache_keep_free_bytes(env: Mapping[str, str]) -> int:
    """``NURO_STAGING_CACHE_KEEP_FREE_GB``, default twice the health check's ``NURO_STAGING_MIN_FREE_GB`` (20 GiB
    → 40 GiB): the node cache gives way well before the staging disk is full enough to drain the node."""
    from nuro.healthcheck.checks import DEFAULT_STAGING_MIN_FREE_GB
    from nuro.healthcheck.cli import HealthSettings

    raw = env.get("NURO_STAGING_CACHE_KEEP_FREE_GB", "").strip()
    try:
        return int(max(float(raw), 0.0) * (1 << 30)) if raw else 2 * HealthSettings.from_env(env).staging_min_free_bytes
    except ValueError as exc:  # the node's settings are broken; the health check reports the same error
        log.warning("cache free-space floor unreadable (%s): the cache keeps 40 GiB free", exc)
        return int(2 * DEFAULT_STAGING_MIN_FREE_GB * (1 << 30))


def flush_and_clean(job: str) -> None:
    from nuro.checkpoint.nodestage import DEFAULT_CACHE_RUNS, finish_job, staging_root
    from nuro.objectstore import ObjectStore

    timeout_s = float(os.environ.get("NURO_EPILOG_FLUSH_TIMEOUT_S") or 120)
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
    """The job no longer holds its GPUs: the agent's next points are untagged (``nuro.gpujobs``)."""
    from nuro.checkpoint.nodestage import staging_root
    from nuro.gpujobs import forget

    node = os.environ.get("SLURMD_NODENAME", "")
    if node:
        forget(staging_root(), node, job)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="nuro-epilog: %(message)s", stream=sys.stderr)
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return 0
    try:
        load_node_env()
        forget_gpus(job)
        flush_and_clean(job)
    except Exception as exc:  # never drain a node for a bug of ours; say it loudly instead
        log.exception("job=%s epilog checkpoint flush failed: %s", job, exc)
    return 0 if node_is_healthy(job, "epilog") else 1


if __name__ == "__main__":
    sys.exit(main())

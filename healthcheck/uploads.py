"""The node's checkpoint cache and hand-off settings, read once for both of their users: the epilog (a job's
uploads flushed before the node is released) and the node agent's upload worker (a job's uploads handed off by the
epilog, finished after): a job's newest checkpoint is cached alike whichever of the two finishes it.

Here rather than in the epilog: the node agent runs the worker, and the hooks already depend on the health check's
library (``prolog_epilog`` → ``healthcheck``, never back).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from nuro.checkpoint import handoff
from nuro.checkpoint.nodestage import DEFAULT_CACHE_RUNS
from nuro.healthcheck.checks import DEFAULT_STAGING_MIN_FREE_GB
from nuro.healthcheck.run import HealthSettings
from nuro.objectstore import ObjectStore
from nuro.protocol.nodeenv import setting

log = logging.getLogger(__name__)


def cache_keep_free_bytes(env: Mapping[str, str]) -> int:
    """``NURO_STAGING_CACHE_KEEP_FREE_GB``, default twice the health check's ``NURO_STAGING_MIN_FREE_GB`` (20 GiB
    → 40 GiB): the node cache gives way well before the staging disk is full enough to drain the node."""
    gib = setting(env, "NURO_STAGING_CACHE_KEEP_FREE_GB", float, -1.0)
    if gib >= 0:
        return int(gib * (1 << 30))
    try:
        return 2 * HealthSettings.from_env(env).staging_min_free_bytes
    except ValueError as exc:  # the node's settings are broken; the health check reports the same error
        log.warning("cache free-space floor unreadable (%s): the cache keeps 40 GiB free", exc)
        return int(2 * DEFAULT_STAGING_MIN_FREE_GB * (1 << 30))


def cache_runs(env: Mapping[str, str]) -> int:
    return int(setting(env, "NURO_STAGING_CACHE_RUNS", int, DEFAULT_CACHE_RUNS))


def node_handoff_worker(store: ObjectStore, root: Path, env: Mapping[str, str]) -> handoff.HandoffWorker:
    """The node agent's upload worker, finishing hand-offs with the epilog's own cache settings (so a job's newest
    checkpoint is cached alike whichever of the two finishes it)."""
    return handoff.HandoffWorker(
        store, root, timeout_s=handoff.timeout_s(env), cache_runs=cache_runs(env),
        cache_keep_free_bytes=cache_keep_free_bytes(env),
    )  # fmt: skip


__all__ = ["cache_keep_free_bytes", "cache_runs", "node_handoff_worker"]

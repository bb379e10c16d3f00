"""The node health check inside the prolog and epilog: a job never starts on, and a node is never released from a
job as, a node whose GPUs, staging disk or agent are bad.

Why here too and not only as HealthCheckProgram: that one runs every ``HealthCheckInterval`` (tens of seconds); a GPU
that fell off the bus in between would take the next job down with it. The prolog's check is the last gate before a
job's processes start; the epilog's catches what the job itself broke (an XID, a full staging disk).

On problems the node is drained with a precise ``nuro-health:`` reason (``nuro-healthcheck``'s own rules and
action: ``nuro.healthcheck.run`` and ``nuro.healthcheck.act``) and the hook exits 1, so slurmd does not start the
job there and Slurm requeues it. A bug of ours never fails the hook: it is logged and the node is treated as healthy
(fail operational).

A staging disk that running jobs filled is not a node problem: those jobs are cancelled with the reason
(``nuro.healthcheck.act.fail_disk_jobs``) and the hook goes on; this job starts.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("nuro.prolog_epilog.health")


def node_is_healthy(job: str, mode: str) -> bool:
    """Run the health check for this node (``SLURMD_NODENAME``); drain it when unhealthy. ``mode``: prolog|epilog."""
    node = os.environ.get("SLURMD_NODENAME", "")
    if not node or os.environ.get("NURO_HOOK_HEALTHCHECK", "1") == "0":
        return True
    try:
        # lazy, and inside the guard: the TaskProlog (``nuro-prolog --task``, once per task) never checks health and
        # must start fast (Slurm's adapter alone is ~0.1 s), and an import error of ours must not fail the hook
        from nuro.healthcheck.act import SLURM_TIMEOUT_S, act, fail_disk_jobs
        from nuro.healthcheck.run import HealthSettings, check_node
        from nuro.slurm import CliBackend

        outcome = check_node(node, HealthSettings.from_env(), mode)
    except Exception as exc:  # noqa: BLE001 - our bug must not fail the hook (and drain the node) by itself
        log.exception("job=%s node=%s %s health check did not run (node treated as healthy): %s", job, node, mode, exc)
        return True
    if outcome.healthy:
        if outcome.jobs_to_fail:
            try:
                fail_disk_jobs(outcome, CliBackend(timeout_s=SLURM_TIMEOUT_S))
            except Exception as exc:  # noqa: BLE001 - the node is healthy; the periodic check retries the cancel
                log.error("job=%s node=%s could not fail the jobs that filled the staging disk: %s", job, node, exc)
        return True
    try:
        outcome = act(outcome, CliBackend(timeout_s=SLURM_TIMEOUT_S))
    except Exception as exc:  # noqa: BLE001 - could not drain: the verdict stands, the job must not start here
        log.error("job=%s node=%s could not drain the node: %s", job, node, exc)
    log.error(
        "job=%s node=%s unhealthy at %s: %s (action: %s)",
        job, node, mode, "; ".join(p.message for p in outcome.problems), outcome.action,
    )  # fmt: skip
    return False

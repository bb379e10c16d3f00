"""Act on a health check's ``Outcome`` (``nuro.healthcheck.run``): drain or resume the node, and fail the running
jobs that filled the staging disk instead of draining the node for them.

A staging disk below ``NURO_STAGING_MIN_FREE_GB`` that running jobs' staging dirs account for fails those jobs
(largest first, until the floor would be met: ``checks.disk_verdict``): each is cancelled with the reason in its job
comment (``refused``), in the event log (``$NURO_EVENT_LOG``, kind ``job_disk_full``) and in the log. Only space no
job accounts for drains the node, and only a drain nuro-health set is ever lifted (never an admin's).

Used by ``nuro-healthcheck`` (``nuro.healthcheck.cli``) and the prolog/epilog (``nuro.prolog_epilog.health``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

from nuro.healthcheck.checks import JobDiskUse, drain_reason, gib, is_our_reason
from nuro.healthcheck.run import Outcome
from nuro.lifecycle.platform_events import EventLog
from nuro.protocol import adminnote
from nuro.protocol.contract import NOTE_REFUSED
from nuro.protocol.envnames import NURO_EVENT_LOG
from nuro.slurm import Action, Cancel, CliBackend, DrainNode, ResumeNode, parse_scontrol_show_oneliner

log = logging.getLogger("nuro.healthcheck")

SLURM_TIMEOUT_S = 15.0  # each scontrol/scancel call of a health check


def node_drain_state(backend: CliBackend, node: str) -> tuple[bool, str | None]:
    """(drained?, reason) from ``scontrol show -o node`` (one node; cheaper than sinfo for the whole cluster)."""
    rows = parse_scontrol_show_oneliner(backend.run(["scontrol", "show", "-o", "node", node]).stdout)
    if not rows:
        raise RuntimeError(f"scontrol show node {node} printed nothing")
    flags = set(rows[0].get("State", "").upper().split("+"))
    drained = bool(flags & {"DRAIN", "DRAINED", "DRAINING"})
    reason = rows[0].get("Reason") or None
    if reason and reason.endswith("]") and " [" in reason:  # "<reason> [root@2026-01-01T00:00:00]"
        reason = reason.rsplit(" [", 1)[0]
    return drained, reason


def plan_node_action(outcome: Outcome, drained: bool, reason: str | None) -> tuple[str, Action | None, str]:
    """Pure: what to do about this outcome given the node's drain state; returns (action, Slurm action, detail).

    ==========  ======================================  =====================================================
    healthy?    node now                                 action
    ==========  ======================================  =====================================================
    no          not drained, or drained by nuro-health   ``drained``: DrainNode with ``drain_reason(problems)``
                with another reason
    no          drained by nuro-health, same reason      ``none`` (no update: the reason's timestamp stays)
    no          drained by anyone else                   ``kept-admin-drain`` (never overwrite an admin's reason)
    yes         drained by nuro-health                   ``resumed``: ResumeNode
    yes         anything else                            ``none``
    ==========  ======================================  =====================================================
    """
    if not outcome.healthy:
        want = drain_reason(list(outcome.problems))
        if drained and not is_our_reason(reason):
            return "kept-admin-drain", None, f"already drained by someone else: {reason}"
        if drained and reason == want:
            return "none", None, "already drained with this reason"
        return "drained", DrainNode(outcome.node, want), want
    if drained and is_our_reason(reason):
        return "resumed", ResumeNode(outcome.node), reason or ""
    return "none", None, ""


def disk_full_reason(outcome: Outcome, use: JobDiskUse) -> str:
    """Why a job was failed for the staging disk, in words its owner reads (admin comment, event log, slurmd log)."""
    held = ("up to " if use.upper_bound else "") + gib(use.bytes) + ("" if use.complete else " or more")
    return (
        f"nuro-health: cancelled: the staging disk of {outcome.node} fell below its {gib(outcome.min_free_bytes)} "
        f"floor ({gib(outcome.disk_free_bytes or 0)} free) and this job's files on it (its staging dir "
        f"{outcome.staging_root}/{use.job_id} and what its user wrote elsewhere on the disk) hold {held}; write "
        "less to the staging disk (checkpoints only)"
    )


def fail_disk_jobs(outcome: Outcome, backend: CliBackend, dry_run: bool = False) -> tuple[int, ...]:
    """Fail the jobs the staging disk's shortfall is attributed to: reason into the job's admin comment
    (``refused``, ``nuro.protocol.adminnote``: a field no job can fill) and the event log, then ``scancel``. Each
    step is tried on its own (a job that just ended is fine: scancel of a finished job is a no-op). Returns the job
    ids cancelled."""
    done: list[int] = []
    for use in outcome.jobs_to_fail:
        why = disk_full_reason(outcome, use)
        if dry_run:
            log.warning("would cancel job=%s node=%s: %s", use.job_id, outcome.node, why)
            continue
        log.warning("cancel job=%s node=%s: %s", use.job_id, outcome.node, why)
        try:
            note = adminnote.render(NOTE_REFUSED, why, at=round(time.time()), node=outcome.node)
            backend.update_admin_comment(use.job_id, note)
        except Exception as exc:  # noqa: BLE001 - the cancel matters more than the note
            log.warning("job=%s reason not written to its admin comment: %s", use.job_id, exc)
        events = os.environ.get(NURO_EVENT_LOG, "").strip()
        if events:
            try:
                EventLog(events, source="nuro-health").append(
                    "job_disk_full", node=outcome.node, jobs=[use.job_id], bytes=use.bytes,
                    free_bytes=outcome.disk_free_bytes, min_free_bytes=outcome.min_free_bytes, reason=why,
                )  # fmt: skip
            except (OSError, ValueError) as exc:
                log.warning("job=%s disk-full event not logged: %s", use.job_id, exc)
        result = backend.apply(Cancel(use.job_id))
        if result.ok:
            done.append(use.job_id)
        else:
            log.error("job=%s could not be cancelled: %s", use.job_id, result.message)
    return tuple(done)


def act(outcome: Outcome, backend: CliBackend, dry_run: bool = False) -> Outcome:
    """Fail the jobs that filled the staging disk (``fail_disk_jobs``), then read the node's drain state, plan
    (``plan_node_action``) and apply, unless ``dry_run``."""
    if outcome.jobs_to_fail:
        outcome = replace(outcome, cancelled=fail_disk_jobs(outcome, backend, dry_run))
    drained, reason = node_drain_state(backend, outcome.node)
    action, slurm_action, detail = plan_node_action(outcome, drained, reason)
    if slurm_action is None:
        return replace(outcome, action=action, detail=detail)
    if dry_run:
        return replace(outcome, action={"drained": "would-drain", "resumed": "would-resume"}[action], detail=detail)
    result = backend.apply(slurm_action)
    if not result.ok:
        return replace(outcome, action="failed", detail=f"{action} failed: {result.message}")
    log.log(
        logging.WARNING if action == "drained" else logging.INFO, "%s node=%s reason=%r", action, outcome.node, detail
    )
    return replace(outcome, action=action, detail=detail)

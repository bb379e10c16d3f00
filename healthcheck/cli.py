"""``nuro-healthcheck``: Slurm's HealthCheckProgram, also run from the prolog/epilog (``--mode prolog|epilog``).

slurmd runs it with only ``SLURMD_NODENAME`` in the environment (no PATH, no SLURM_CONF), once per node every
HealthCheckInterval, and ignores its output; so it loads the node settings file (``$NURO_ENV_FILE``, see
``nuro.protocol.nodeenv``), sets a PATH itself, and acts on its own: on problems it drains the node with a precise
reason
(``nuro-health: gpu1: temperature 93 C ≥ 90 C``) and exits 1; when healthy it resumes the node only if it is
drained with a ``nuro-health:`` reason (never an admin's drain) and exits 0.

Settings (command line wins over the environment, which wins over the default):

==============================  ===========================  ==========================================
variable                        option                       meaning / default
==============================  ===========================  ==========================================
``NURO_EXPECT_GPUS``            ``--expect-gpus N``          GPUs the node must have; unset = no expectation
``NURO_HEALTH_PROBE``           ``--probe``                  auto | nvml | none (default auto)
``NURO_STAGING_ROOT``                                        staging dir; default /var/tmp/nuro-staging
``NURO_STAGING_MIN_FREE_GB``                                 least free GiB on its disk; default 20
``NURO_AGENT_STATUS_DIR``                                    agent liveness checked only when set
``NURO_HEALTH_MAX_TEMPERATURE_C``                            ``Limits.max_temperature_c`` (90)
``NURO_AGENT_SILENT_S``                                      ``Limits.agent_silent_s`` (10)
``NURO_AGENT_START_GRACE_S``                                 ``Limits.agent_start_grace_s`` (30)
==============================  ===========================  ==========================================

A staging disk below ``NURO_STAGING_MIN_FREE_GB`` that running jobs' staging dirs account for fails those jobs
(largest first, until the floor would be met: ``checks.disk_verdict``) instead of draining the node: each is
cancelled with the reason in its job comment (``refused``), in the event log (``$NURO_EVENT_LOG``, kind
``job_disk_full``) and in the log. Only space no job accounts for drains the node.

Exit status: 0 healthy, 1 unhealthy (drained unless ``--dry-run``), 2 bad usage or settings.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from nuro.healthcheck.checks import (
    DEFAULT_STAGING_MIN_FREE_GB,
    DEFAULT_STAGING_ROOT,
    JobDiskUse,
    Limits,
    Problem,
    _gib,
    disk_verdict,
    drain_reason,
    evaluate,
    is_our_reason,
)
from nuro.healthcheck.probes import NodeGpuReport, make_probe
from nuro.protocol.nodeenv import load_node_env

if TYPE_CHECKING:  # nuro.slurm is imported at run time only where Slurm is touched (keeps --help and tests light)
    from nuro.slurm import Action, CliBackend

log = logging.getLogger("nuro.healthcheck")

# slurmd gives the HealthCheckProgram no PATH; scontrol and friends live in these on Debian.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SLURM_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class HealthSettings:
    """What a health evaluation needs besides the probe report; shared by nuro-healthcheck and nuro-nodeagent.

    Attributes:
        expected_gpus: GPUs the node must have; None = no expectation (a node without NVML is then fine).
        staging_root: the NVMe staging directory whose disk must keep ``staging_min_free_bytes`` free.
        agent_status_dir: where the node agent writes ``<node>.json``; None = agent liveness not checked.
    """

    expected_gpus: int | None = None
    probe: str = "auto"
    staging_root: str = DEFAULT_STAGING_ROOT
    staging_min_free_bytes: int = int(DEFAULT_STAGING_MIN_FREE_GB * (1 << 30))
    agent_status_dir: str | None = None
    limits: Limits = field(default_factory=Limits)
    min_blame_bytes: int | None = None  # least a job's staging dir must hold to be failed; None: 1/20 of the floor

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str] | None = None) -> HealthSettings:
        """Read the variables of the module table. Raises ValueError naming the variable and its bad value."""
        env = os.environ if env is None else env

        def number(name: str, kind: type, default: float | int | None) -> float | int | None:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a {kind.__name__}") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r} must not be negative")
            return value

        limits = Limits()
        limits = replace(
            limits,
            max_temperature_c=number("NURO_HEALTH_MAX_TEMPERATURE_C", int, limits.max_temperature_c),
            agent_silent_s=number("NURO_AGENT_SILENT_S", float, limits.agent_silent_s),
            agent_start_grace_s=number("NURO_AGENT_START_GRACE_S", float, limits.agent_start_grace_s),
        )
        min_free_gb = number("NURO_STAGING_MIN_FREE_GB", float, DEFAULT_STAGING_MIN_FREE_GB)
        return cls(
            expected_gpus=number("NURO_EXPECT_GPUS", int, None),  # type: ignore[arg-type]
            probe=env.get("NURO_HEALTH_PROBE", "").strip() or "auto",
            staging_root=env.get("NURO_STAGING_ROOT", "").strip() or DEFAULT_STAGING_ROOT,
            staging_min_free_bytes=int(float(min_free_gb) * (1 << 30)),  # type: ignore[arg-type]
            agent_status_dir=env.get("NURO_AGENT_STATUS_DIR", "").strip() or None,
            limits=limits,
        )


def disk_free_bytes(path: str) -> int:
    """Free bytes (for unprivileged users) on the file system that holds ``path``, or would hold it: a staging dir
    that does not exist yet is measured at its nearest existing parent, where the prolog will create it."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize


SETTLE_S = 3.0  # the longest a low free-space reading is re-read while it is still rising
CONFIRM_S = 3.0  # an unattributed shortfall is judged again after this pause before it counts
SETTLE_POLL_S = 0.25


def settled_free_bytes(
    path: str,
    floor: int,
    free: int,
    *,
    budget_s: float = SETTLE_S,
    poll_s: float = SETTLE_POLL_S,
    reader: Callable[[str], int] | None = None,
) -> int:
    """A low ``free`` re-read while it keeps rising (at most ``budget_s``): space being given back right now (an
    epilog removing a job dir: unlinking a big file frees its blocks over a while on tmpfs, and in the background
    on XFS) is neither the node's problem nor a job's. Returns the last reading; a steady one stops at once."""
    read = reader or disk_free_bytes
    deadline = time.monotonic() + budget_s
    while free < floor and time.monotonic() < deadline:
        time.sleep(poll_s)
        again = read(path)
        if again <= free:  # steady (or falling): this is the disk's state
            return again
        free = again
    return free


def disk_state(
    settings: HealthSettings, node: str, free: int | None, reader: Callable[[str], int] | None = None
) -> tuple[int | None, list[JobDiskUse] | None]:
    """(free bytes, what running jobs' staging dirs hold). A reading below the floor is first settled
    (``settled_free_bytes``); only a disk still low is attributed, and a shortfall no job accounts for is measured
    again after ``CONFIRM_S`` before it counts. Usage is None when not low, and when it cannot be measured: then a
    low disk is the node's problem, as it was before attribution."""
    if free is None or free >= settings.staging_min_free_bytes:
        return free, None
    from nuro.checkpoint.layout import node_staging_root
    from nuro.healthcheck.diskuse import running_job_usage

    read = reader or disk_free_bytes
    floor = settings.staging_min_free_bytes
    try:
        root = node_staging_root(settings.staging_root, node)
        free = settled_free_bytes(settings.staging_root, floor, free, reader=read)
        if free >= floor:
            return free, None
        usage = running_job_usage(root)
        if disk_verdict(free, floor, usage, settings.min_blame_bytes).node_problem:
            # Unattributed space: confirm after a pause. An epilog unlinking a big file removes its name at once
            # but gives the blocks back only when the unlink returns (0.6 s for 384 MiB on tmpfs here), so for
            # that while the space is nobody's; a real node problem is still there afterwards.
            time.sleep(CONFIRM_S)
            free = read(settings.staging_root)
            if free >= floor:
                return free, None
            usage = running_job_usage(root)
        return free, usage
    except Exception as exc:  # noqa: BLE001 - cannot attribute: the low disk stays the node's problem
        log.warning("staging usage of running jobs not measured path=%s error=%s", settings.staging_root, exc)
        return free, None


def agent_age_s(status_dir: str, node: str, now: float) -> float:
    """Seconds since the node agent's last heartbeat, from its status file; ``math.inf`` when there is none."""
    from nuro.healthcheck.agent import read_status  # the agent owns the file format

    status = read_status(status_dir, node)
    if status is None:
        return math.inf
    return max(0.0, now - float(status.get("last_beat", 0.0)))


@dataclass(frozen=True)
class Outcome:
    """One health check: what was found and what was done (``--json`` prints it)."""

    node: str
    mode: str
    problems: tuple[Problem, ...]
    report: NodeGpuReport | None
    disk_free_bytes: int | None
    agent_age_s: float | None
    action: str = "none"  # none | drained | resumed | would-drain | would-resume | kept-admin-drain | failed
    detail: str = ""
    jobs_to_fail: tuple[JobDiskUse, ...] = ()  # running jobs whose staging dirs hold the missing free space
    min_free_bytes: int = 0
    staging_root: str = ""
    cancelled: tuple[int, ...] = ()  # what act() failed of jobs_to_fail (would-cancel: none)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {
            "node": self.node,
            "mode": self.mode,
            "healthy": self.healthy,
            "problems": [{"code": p.code, "message": p.message} for p in self.problems],
            "action": self.action,
            "detail": self.detail,
            "disk_free_bytes": self.disk_free_bytes,
            "jobs_to_fail": [{"job_id": u.job_id, "bytes": u.bytes, "complete": u.complete} for u in self.jobs_to_fail],
            "cancelled": list(self.cancelled),
            "agent_age_s": None if self.agent_age_s is None or math.isinf(self.agent_age_s) else self.agent_age_s,
            "gpu_report": self.report.to_dict() if self.report else None,
        }


def check_node(node: str, settings: HealthSettings, mode: str = "periodic", probe_timeout_s: float = 5.0) -> Outcome:
    """Probe, measure and evaluate; changes nothing."""
    probe = make_probe(settings.probe, timeout_s=probe_timeout_s)
    try:
        report = probe.read()
    finally:
        probe.close()
    try:
        free: int | None = disk_free_bytes(settings.staging_root)
    except OSError as exc:
        log.warning("staging disk unreadable path=%s error=%s", settings.staging_root, exc)
        free = None
    free, usage = disk_state(settings, node, free)
    age = agent_age_s(settings.agent_status_dir, node, time.time()) if settings.agent_status_dir else None
    if settings.agent_status_dir and age is not None and age <= settings.limits.agent_silent_s:
        report = with_agent_xids(report, settings.agent_status_dir, node)
    problems = evaluate(
        report,
        settings.expected_gpus,
        free,
        settings.staging_min_free_bytes,
        age,
        settings.limits,
        staging_root=settings.staging_root,
        slurmd_uptime_s=slurmd_uptime_s() if age is not None else None,
        job_disk_use=usage,
        min_job_bytes=settings.min_blame_bytes,
    )
    verdict = disk_verdict(free, settings.staging_min_free_bytes, usage, settings.min_blame_bytes)
    return Outcome(
        node, mode, tuple(problems), report, free, age, jobs_to_fail=verdict.jobs_to_fail,
        min_free_bytes=settings.staging_min_free_bytes, staging_root=settings.staging_root,
    )  # fmt: skip


def with_agent_xids(report: NodeGpuReport, status_dir: str, node: str) -> NodeGpuReport:
    """Add the XIDs the live agent saw to this one-shot report.

    Why: NVML delivers an XID event only to event sets that exist when it happens, so a health check that lives
    for 0.1 s sees almost none; the agent listens all the time and keeps them (``NvmlProbe``) in its status file.
    """
    from nuro.healthcheck.agent import read_status

    status = read_status(status_dir, node) or {}
    seen = {
        int(g["index"]): tuple(int(x) for x in g.get("xid_errors") or ())
        for g in ((status.get("gpu_report") or {}).get("gpus") or [])
        if g.get("xid_errors")
    }
    if not seen:
        return report
    gpus = tuple(replace(g, xid_errors=tuple(dict.fromkeys(seen.get(g.index, ()) + g.xid_errors))) for g in report.gpus)
    return replace(report, gpus=gpus)


def slurmd_uptime_s() -> float | None:
    """Seconds since our parent slurmd started, when slurmd runs us (HealthCheckProgram, prolog, epilog; the dev
    cluster's ``#!/bin/sh`` wrapper ``exec``s, so slurmd stays the parent); None otherwise (run by hand or tests)."""
    import psutil

    try:
        parent = psutil.Process(os.getppid())
        if parent.name() != "slurmd":
            return None
        return max(0.0, time.time() - parent.create_time())
    except psutil.Error:
        return None


def node_drain_state(backend: CliBackend, node: str) -> tuple[bool, str | None]:
    """(drained?, reason) from ``scontrol show -o node`` (one node; cheaper than sinfo for the whole cluster)."""
    from nuro.slurm import parse_scontrol_show_oneliner

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
    from nuro.slurm import DrainNode, ResumeNode

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
    """Why a job was failed for the staging disk, in words its owner reads (comment, event log, slurmd log)."""
    held = _gib(use.bytes) + ("" if use.complete else " or more")
    return (
        f"nuro-health: cancelled: the staging disk of {outcome.node} fell below its {_gib(outcome.min_free_bytes)} "
        f"floor ({_gib(outcome.disk_free_bytes or 0)} free) and this job's staging dir "
        f"({outcome.staging_root}/{use.job_id}) holds {held}; write less to the staging dir (checkpoints only)"
    )


def fail_disk_jobs(outcome: Outcome, backend: CliBackend, dry_run: bool = False) -> tuple[int, ...]:
    """Fail the jobs the staging disk's shortfall is attributed to: reason into the job comment (``refused``) and
    the event log, then ``scancel``. Each step is tried on its own (a job that just ended is fine: scancel of a
    finished job is a no-op). Returns the job ids cancelled."""
    from nuro.lifecycle.platform_events import EventLog

    done: list[int] = []
    for use in outcome.jobs_to_fail:
        why = disk_full_reason(outcome, use)
        if dry_run:
            log.warning("would cancel job=%s node=%s: %s", use.job_id, outcome.node, why)
            continue
        log.warning("cancel job=%s node=%s: %s", use.job_id, outcome.node, why)
        try:
            backend.merge_comment(use.job_id, refused={"at": round(time.time()), "node": outcome.node, "why": why})
        except Exception as exc:  # noqa: BLE001 - the cancel matters more than the note
            log.warning("job=%s reason not written to its comment: %s", use.job_id, exc)
        events = os.environ.get("NURO_EVENT_LOG", "").strip()
        if events:
            try:
                EventLog(events, source="nuro-health").append(
                    "job_disk_full", node=outcome.node, jobs=[use.job_id], bytes=use.bytes,
                    free_bytes=outcome.disk_free_bytes, min_free_bytes=outcome.min_free_bytes, reason=why,
                )  # fmt: skip
            except (OSError, ValueError) as exc:
                log.warning("job=%s disk-full event not logged: %s", use.job_id, exc)
        result = backend.apply(_cancel(use.job_id))
        if result.ok:
            done.append(use.job_id)
        else:
            log.error("job=%s could not be cancelled: %s", use.job_id, result.message)
    return tuple(done)


def _cancel(job_id: int) -> Action:
    from nuro.slurm import Cancel

    return Cancel(job_id)


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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nuro-healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--node", help="node name (default: $SLURMD_NODENAME)")
    p.add_argument("--mode", choices=("periodic", "prolog", "epilog"), default="periodic")
    p.add_argument("--probe", choices=("auto", "nvml", "none"), help="GPU probe (default $NURO_HEALTH_PROBE or auto)")
    p.add_argument("--expect-gpus", type=int, help="GPUs this node must have (default $NURO_EXPECT_GPUS)")
    p.add_argument("--probe-timeout-s", type=float, default=5.0, help="the most the GPU probe may take")
    p.add_argument("--json", action="store_true", help="print the outcome as JSON on stdout")
    p.add_argument("--dry-run", action="store_true", help="evaluate and report; do not drain or resume")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s nuro-healthcheck %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        load_node_env()
    except (OSError, ValueError) as exc:
        log.error("cannot read node settings $NURO_ENV_FILE: %s", exc)
        return 2
    os.environ.setdefault("PATH", DEFAULT_PATH)
    node = args.node or os.environ.get("SLURMD_NODENAME")
    if not node:
        log.error("no node name: pass --node NAME (slurmd sets SLURMD_NODENAME for HealthCheckProgram)")
        return 2
    try:
        settings = HealthSettings.from_env()
    except ValueError as exc:
        log.error("bad node setting: %s", exc)
        return 2
    if args.probe:
        settings = replace(settings, probe=args.probe)
    if args.expect_gpus is not None:
        settings = replace(settings, expected_gpus=args.expect_gpus)
    outcome = check_node(node, settings, args.mode, args.probe_timeout_s)
    from nuro.slurm import CliBackend, SlurmError

    try:
        outcome = act(outcome, CliBackend(timeout_s=SLURM_TIMEOUT_S), dry_run=args.dry_run)
    except (SlurmError, RuntimeError) as exc:
        # Slurm unreachable: the verdict still stands (exit status), the node state could not be changed.
        outcome = replace(outcome, action="failed", detail=f"could not read or change the node state: {exc}")
        log.error("node=%s %s", node, outcome.detail)
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2, ensure_ascii=False))
    level = logging.INFO if outcome.healthy else logging.WARNING
    log.log(
        level,
        "node=%s mode=%s healthy=%s action=%s problems=%s",
        node,
        args.mode,
        outcome.healthy,
        outcome.action,
        "; ".join(p.message for p in outcome.problems) or "-",
    )
    return 0 if outcome.healthy else 1


if __name__ == "__main__":
    sys.exit(main())

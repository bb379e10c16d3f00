"""Run the node health check: its settings, the measurements (GPU probe, staging disk, agent liveness) and the
``Outcome``; changes nothing. ``nuro.healthcheck.act`` acts on an outcome (drain, resume, fail the jobs that
filled the staging disk).

Why a library apart from the command (``nuro.healthcheck.cli``): the same check runs in Slurm's HealthCheckProgram,
in the prolog and epilog (``nuro.prolog_epilog.health``) and, measurements only, in the node agent every second.
The settings and their variables are in ``nuro-healthcheck``'s documentation (``nuro.healthcheck.cli``).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import psutil

from nuro.checkpoint.layout import node_staging_root
from nuro.healthcheck.checks import (
    DEFAULT_STAGING_MIN_FREE_GB,
    DEFAULT_STAGING_ROOT,
    JobDiskUse,
    Limits,
    Problem,
    disk_verdict,
    evaluate,
)
from nuro.healthcheck.diskuse import running_job_usage
from nuro.healthcheck.probes import GpuProbe, NodeGpuReport, NoGpuProbe
from nuro.healthcheck.statusfile import read_status
from nuro.protocol.envnames import NURO_AGENT_STATUS_DIR, NURO_STAGING_ROOT
from nuro.protocol.nodeenv import env_number

log = logging.getLogger("nuro.healthcheck")

# slurmd gives the HealthCheckProgram no PATH; scontrol and friends live in these on Debian.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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

    def for_node(self, node: str) -> HealthSettings:
        """These settings with ``{node}`` in the staging root resolved: the disk to measure is the node's own (on a
        shared disk, the dev cluster's emulated nodes each have a root below it, and the path with ``{node}`` in it
        does not exist: measured at its parent, it read the shared disk and never the node's)."""
        return replace(self, staging_root=str(node_staging_root(self.staging_root, node)))

    @classmethod
    def from_env(cls, env: dict[str, str] | os._Environ[str] | None = None) -> HealthSettings:
        """Read the variables of nuro-healthcheck's table (``nuro.healthcheck.cli``). Raises ValueError naming the
        variable and its bad value."""
        env = os.environ if env is None else env

        def number(name: str, kind: type, default: float | int | None) -> float | int | None:
            return env_number(env, name, kind, default)

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
            staging_root=env.get(NURO_STAGING_ROOT, "").strip() or DEFAULT_STAGING_ROOT,
            staging_min_free_bytes=int(float(min_free_gb) * (1 << 30)),  # type: ignore[arg-type]
            agent_status_dir=env.get(NURO_AGENT_STATUS_DIR, "").strip() or None,
            limits=limits,
        )


class ProbeKind(StrEnum):
    AUTO = "auto"
    NVML = "nvml"
    NONE = "none"


def make_probe(kind: str | ProbeKind, timeout_s: float = 5.0) -> GpuProbe:
    """The probe for ``--probe auto|nvml|none``.

    ``auto`` and ``nvml`` both build an ``NvmlProbe``: it never raises when the library is missing but reports
    ``ProbeFailure.LIBRARY_NOT_FOUND``, and the checks decide (with the node's expected GPU count) whether that
    is a problem. The two differ only in intent, kept for the CLI contract; ``none`` never touches NVML.

    Raises:
        ValueError: for an unknown kind (with the valid ones).
    """
    try:
        kind = ProbeKind(kind)
    except ValueError:
        raise ValueError(f"unknown probe {kind!r}: use one of {', '.join(k.value for k in ProbeKind)}") from None
    if kind is ProbeKind.NONE:
        return NoGpuProbe()
    # lazy: pynvml costs ~0.1 s to import and a --probe none node (no GPUs) never needs it
    from nuro.healthcheck.nvml import NvmlProbe

    return NvmlProbe(timeout_s=timeout_s)


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
    settings = settings.for_node(node)
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
    try:
        parent = psutil.Process(os.getppid())
        if parent.name() != "slurmd":
            return None
        return max(0.0, time.time() - parent.create_time())
    except psutil.Error:
        return None

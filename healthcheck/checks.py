"""Pure node-health rules: ``evaluate(...) -> list[Problem]``; no I/O, no clock, no NVML.

Why pure: the same rules run in ``nuro-healthcheck`` (Slurm's HealthCheckProgram, prolog/epilog) and in the node
agent every second, and they decide whether a node is drained, so they are tested case by case with in-memory
reports. Every reason is short and precise (it becomes a Slurm drain reason and a heartbeat problem text):

================  ==========================================================================
code              example message
================  ==========================================================================
probe             "NVML library not found (libnvidia-ml.so.1)", "NVML: driver not loaded"
gpu_count         "gpu count 7, expected 8"
gpu_error         "gpu2: GPU is lost"
ecc               "gpu3: 2 volatile uncorrectable ECC errors"
retired_pages     "gpu0: retired pages pending (reset needed)"
remapped_rows     "gpu0: row remapping pending (reset needed)", "gpu0: row remapping failed"
temperature       "gpu1: temperature 93 C ≥ 90 C"
throttle          "gpu1: clocks throttled (HW slowdown, HW thermal slowdown)"
xid               "gpu0: XID 79, 48"
disk              "staging disk /var/tmp/nuro-staging: 1.2 GiB free < 20 GiB"
agent             "node agent silent for 12 s", "node agent never reported"
================  ==========================================================================

A staging disk below its floor is the node's problem only when the space is not held by running jobs (their
staging dirs, and what their users own elsewhere on that file system: ``disk_verdict``): when it is, those jobs
(largest first, until the floor would be met) are failed instead and the node stays in service
(``nuro-healthcheck`` cancels them; ``nuro.healthcheck.diskuse`` measures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from nuro.healthcheck.probes import GpuStatus, NodeGpuReport, ProbeFailure

DEFAULT_STAGING_ROOT = "/var/tmp/nuro-staging"
DEFAULT_STAGING_MIN_FREE_GB = 20.0
REASON_PREFIX = "nuro-health: "
MAX_REASON_CHARS = 240  # a drain reason stays readable in sinfo -R and fits a heartbeat datagram


@dataclass(frozen=True)
class Limits:
    """Thresholds, with defaults chosen for datacentre GPUs (A100/H100 class).

    Attributes:
        max_temperature_c: a GPU at or above this core temperature is a problem. 90 C: H100/A100 start hardware
            slowdown around 87–92 C and shut down near 95 C, so 90 C means cooling has failed, not a busy GPU.
        max_ecc_volatile_uncorrected: more uncorrectable ECC errors than this since the driver loaded is a
            problem. 0: any uncorrectable error may have corrupted a job's memory; NVIDIA's guidance is to drain
            and reset.
        bad_throttle_reasons: clock event reasons that mean a hardware fault or failing cooling/power (not power
            capping or idling, which are normal).
        critical_xids: XID codes that make a node unhealthy; None means every XID NVML's critical-error event
            reports. The default is the hardware set from NVIDIA's XID catalogue (DBE ECC 48, uncontained ECC 95,
            unrecovered ECC 140, page retirement / row remap failure 64, high single-bit ECC rate 92, NVLink 74,
            fallen off the bus 79, internal micro-controller 61/62, GSP 119/120): application faults such as 13,
            31 or 43 also arrive as "critical" events and must not drain a node for a user's bug.
        agent_silent_s: the node agent's status file older than this is a problem (10 intervals of 1 s).
        agent_start_grace_s: a missing or stale agent is not judged while slurmd is younger than this. slurmd runs
            the HealthCheckProgram once as it starts, before the agent (systemd ``After=slurmd.service``, or the
            dev cluster's supervisor) is up, and a file left by an earlier run is stale by then; without the grace
            every node would be drained at every start until the next HealthCheckInterval.
    """

    max_temperature_c: int = 90
    max_ecc_volatile_uncorrected: int = 0
    bad_throttle_reasons: frozenset[str] = field(
        default_factory=lambda: frozenset({"HW slowdown", "HW thermal slowdown", "HW power brake slowdown"})
    )
    critical_xids: frozenset[int] | None = field(
        default_factory=lambda: frozenset({48, 61, 62, 64, 74, 79, 92, 95, 119, 120, 140})
    )
    agent_silent_s: float = 10.0
    agent_start_grace_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_temperature_c <= 0 or self.agent_silent_s <= 0 or self.max_ecc_volatile_uncorrected < 0:
            raise ValueError(f"Limits: thresholds must be positive, got {self}")


@dataclass(frozen=True)
class Problem:
    """One reason the node is unhealthy: ``code`` for machines (see the module table), ``message`` for people."""

    code: str
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class JobDiskUse:
    """Space a running job holds on the staging disk (``nuro.healthcheck.diskuse``): ``bytes`` (allocated blocks)
    of its staging dir and of what its user owns elsewhere on that file system. ``complete`` False when the
    bounded walk was cut in something of the job's (a tree too deep or too wide, the budget spent there); then
    ``upper_bound`` True: ``bytes`` includes all the space the walk could not see, so a job that hides its usage
    in a tree no walk can finish is still the one that pays for it."""

    job_id: int
    bytes: int
    complete: bool = True
    upper_bound: bool = False


@dataclass(frozen=True)
class DiskVerdict:
    """What the free space on the staging disk means.

    Attributes:
        low: below the floor.
        jobs_to_fail: the jobs whose staging dirs hold the missing space (largest first); failing them restores
            the floor. Empty when the disk is fine or when jobs do not account for the shortfall.
        shortfall: bytes missing to the floor (0 when not low).
    """

    low: bool
    jobs_to_fail: tuple[JobDiskUse, ...] = ()
    shortfall: int = 0

    @property
    def node_problem(self) -> bool:
        """Low, and not because of jobs we can fail: the node is drained."""
        return self.low and not self.jobs_to_fail


MIN_BLAME_FRACTION = 20  # a job holding less than 1/20 of the floor is never the cause of a shortfall


def disk_verdict(
    free_bytes: int | None,
    min_bytes: int,
    usage: Sequence[JobDiskUse] | None,
    min_job_bytes: int | None = None,
) -> DiskVerdict:
    """Attribute a shortfall of free space to running jobs. Pure.

    Rules: not low (or not measured) → nothing. Low → take jobs by the space they hold, largest first, until what
    they hold covers the shortfall: those jobs are failed and the node is healthy. If all of them together do not
    cover it, the space is not theirs to give back (logs, another tool, a cache): a node problem, and no job is
    failed for it. A job holding less than ``min_job_bytes`` (default: 1/20 of the floor) is never blamed: a
    shortfall of a few KiB caused elsewhere must not cancel the job with the largest small dir. ``usage`` None
    means "not measured" (callers that do not attribute): then low is always the node's problem, as before.
    """
    if min_job_bytes is None:
        min_job_bytes = min_bytes // MIN_BLAME_FRACTION
    if free_bytes is None or free_bytes >= min_bytes:
        return DiskVerdict(False)
    shortfall = min_bytes - free_bytes
    if usage is None:
        return DiskVerdict(True, (), shortfall)
    chosen: list[JobDiskUse] = []
    freed = 0
    for use in sorted(usage, key=lambda u: (-u.bytes, u.job_id)):
        if freed >= shortfall or use.bytes <= 0 or use.bytes < min_job_bytes:
            break
        chosen.append(use)
        freed += use.bytes
    if freed < shortfall:
        return DiskVerdict(True, (), shortfall)
    return DiskVerdict(True, tuple(chosen), shortfall)


def gib(n_bytes: float) -> str:
    """Bytes as the health messages write them (``1.2 GiB``, ``20 GiB``): in drain reasons and disk-full notes."""
    value = n_bytes / (1 << 30)
    return f"{value:.1f} GiB" if value < 10 else f"{value:.0f} GiB"


def evaluate(
    report: NodeGpuReport | None,
    expected_gpus: int | None,
    disk_free_bytes: int | None,
    disk_min_bytes: int,
    agent_age_s: float | None,
    limits: Limits | None = None,
    *,
    staging_root: str = DEFAULT_STAGING_ROOT,
    slurmd_uptime_s: float | None = None,
    job_disk_use: Sequence[JobDiskUse] | None = None,
    min_job_bytes: int | None = None,
) -> list[Problem]:
    """Every health problem of a node, in a fixed order (probe, GPU count, per GPU, disk, agent); [] = healthy.

    Args:
        report: the GPU probe's report; None means GPUs were not probed.
        expected_gpus: GPUs this node must have; None or 0 = no expectation, and then a node without an NVIDIA
            stack (library not found, driver not loaded) is fine: it is a CPU node.
        disk_free_bytes: free bytes on the staging disk; None = not checked.
        disk_min_bytes: the least free space that is healthy.
        agent_age_s: seconds since the node agent last wrote its status; None = not checked, ``math.inf`` =
            it never did (no status file).
        limits: thresholds (``Limits()`` when None).
        staging_root: the staging directory, only for the message.
        slurmd_uptime_s: how long the slurmd that runs this check has been up; None = unknown (not run by
            slurmd), then no start grace applies (see ``Limits.agent_start_grace_s``).
        job_disk_use: what running jobs' staging dirs hold; given, a low disk those jobs account for is not a
            node problem (``disk_verdict``: the caller fails the jobs). None = not measured.
        min_job_bytes: the least a job must hold to be blamed (``disk_verdict``; default 1/20 of the floor).
    """
    limits = limits or Limits()
    problems: list[Problem] = []
    expecting = bool(expected_gpus)
    if report is not None:
        no_stack = report.failure in (ProbeFailure.LIBRARY_NOT_FOUND, ProbeFailure.DRIVER_NOT_LOADED)
        if report.failure is not None and (expecting or not no_stack):
            problems.append(Problem("probe", report.error or f"GPU probe failed ({report.failure})"))
        elif report.failure is None:
            if expecting and len(report.gpus) != expected_gpus:
                problems.append(Problem("gpu_count", f"gpu count {len(report.gpus)}, expected {expected_gpus}"))
            for gpu in report.gpus:
                problems.extend(_gpu_problems(gpu, limits))
    verdict = disk_verdict(disk_free_bytes, disk_min_bytes, job_disk_use, min_job_bytes)
    if disk_free_bytes is not None and verdict.node_problem:
        problems.append(
            Problem(
                "disk",
                f"staging disk {staging_root}: {gib(disk_free_bytes)} free < {gib(disk_min_bytes)}",
            )
        )
    starting = slurmd_uptime_s is not None and slurmd_uptime_s < limits.agent_start_grace_s
    if agent_age_s is not None and not starting:
        if math.isinf(agent_age_s):
            problems.append(Problem("agent", "node agent never reported"))
        elif agent_age_s > limits.agent_silent_s:
            problems.append(Problem("agent", f"node agent silent for {agent_age_s:.0f} s"))
    return problems


def _gpu_problems(gpu: GpuStatus, limits: Limits) -> list[Problem]:
    tag = f"gpu{gpu.index}"
    if gpu.error:
        return [Problem("gpu_error", f"{tag}: {gpu.error}")]
    out: list[Problem] = []
    ecc = gpu.ecc_volatile_uncorrected
    if ecc is not None and ecc > limits.max_ecc_volatile_uncorrected:
        out.append(Problem("ecc", f"{tag}: {ecc} volatile uncorrectable ECC error{'s' if ecc != 1 else ''}"))
    if gpu.retired_pages_pending:
        out.append(Problem("retired_pages", f"{tag}: retired pages pending (reset needed)"))
    if gpu.remapped_rows_failure:
        out.append(Problem("remapped_rows", f"{tag}: row remapping failed"))
    elif gpu.remapped_rows_pending:
        out.append(Problem("remapped_rows", f"{tag}: row remapping pending (reset needed)"))
    if gpu.temperature_c is not None and gpu.temperature_c >= limits.max_temperature_c:
        out.append(Problem("temperature", f"{tag}: temperature {gpu.temperature_c} C ≥ {limits.max_temperature_c} C"))
    bad = [r for r in gpu.throttle_reasons if r in limits.bad_throttle_reasons]
    if bad:
        out.append(Problem("throttle", f"{tag}: clocks throttled ({', '.join(bad)})"))
    xids = [x for x in gpu.xid_errors if limits.critical_xids is None or x in limits.critical_xids]
    if xids:
        out.append(Problem("xid", f"{tag}: XID {', '.join(str(x) for x in xids)}"))
    return out


def drain_reason(problems: list[Problem]) -> str:
    """One Slurm drain reason for these problems: ``nuro-health: `` + messages joined by "; ", shortened to
    ``MAX_REASON_CHARS`` with a count of what was left out.

    >>> drain_reason([Problem("temperature", "gpu1: temperature 93 C ≥ 90 C")])
    'nuro-health: gpu1: temperature 93 C ≥ 90 C'
    """
    if not problems:
        raise ValueError("drain_reason: no problems, nothing to drain for")
    parts = [p.message for p in problems]
    for keep in range(len(parts), 0, -1):
        more = f" (+{len(parts) - keep} more)" if keep < len(parts) else ""
        text = REASON_PREFIX + "; ".join(parts[:keep]) + more
        if len(text) <= MAX_REASON_CHARS:
            return text
    return (REASON_PREFIX + parts[0])[:MAX_REASON_CHARS]


def is_our_reason(reason: str | None) -> bool:
    """A drain reason nuro-health set (and so may lift); anything else is an admin's or another tool's."""
    return reason is not None and reason.startswith(REASON_PREFIX)

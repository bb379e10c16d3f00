"""What a node agent's heartbeat and telemetry carry, as pure functions (``nuro-nodeagent``'s beat room): the beat
itself, fitted to one datagram; which GPUs are throttled; the boot number that survives agent restarts; the
controller address; the ``gpu`` points of one probe. ``nuro.healthcheck.agent`` sends them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from nuro.healthcheck.probes import NodeGpuReport
from nuro.healthcheck.statusfile import read_status
from nuro.metrics.model import GPU, Point
from nuro.protocol import heartbeat as hb


def fit_problems(problems: Sequence[str], make: Callable[[tuple[str, ...]], bytes]) -> tuple[str, ...]:
    """The longest prefix of ``problems`` (plus a "+N more" note) whose encoded heartbeat fits one datagram."""
    problems = tuple(problems)
    for keep in range(len(problems), -1, -1):
        cut = problems[:keep] + ((f"+{len(problems) - keep} more",) if keep < len(problems) else ())
        try:
            make(cut)
            return cut
        except hb.BadHeartbeat:
            continue
    return ()


def build_heartbeat(
    node: str,
    boot_ms: int,
    seq: int,
    sent: float,
    problems: Sequence[str],
    key: bytes,
    stopping_s: float = 0.0,
    suspect_jobs: tuple[int, ...] = (),
    throttled: tuple[str, ...] = (),
    stragglers: tuple[tuple[int, str, float], ...] = (),
    commits: tuple[tuple[int, int, int], ...] = (),
    acks: tuple[tuple[int, int, int], ...] = (),
) -> tuple[hb.Heartbeat, bytes]:
    """The heartbeat for one beat and its signed datagram; problems are shortened to fit ``hb.MAX_DATAGRAM``.
    ``stopping_s`` > 0 only in the last beat of a clean stop (``heartbeat.DEFAULT_STOP_GRACE_S``); ``suspect_jobs``
    and ``stragglers`` only while a report of this node's jobs is fresh (``nuro.protocol.peerloss``); ``throttled``:
    this node's GPUs a slowing clock reason holds down now (``throttled_gpus``); ``commits``/``acks``: its jobs'
    progress (``Agent._fresh_progress``).

    Every field is bounded, but all of them at their bounds exceed one datagram: then the oldest commits go first
    (each is repeated every beat), then throttle texts, so a beat always goes out and always carries the acks and
    the node's health."""
    full = {"stopping_s": stopping_s, "suspect_jobs": suspect_jobs, "throttled": throttled[: hb.MAX_THROTTLED],
            "stragglers": stragglers[: hb.MAX_STRAGGLERS], "commits": commits[-hb.MAX_COMMITS :],
            "acks": acks[-hb.MAX_ACKS :]}  # fmt: skip
    trims = ({}, {"commits": full["commits"][-2:]}, {"commits": (), "throttled": full["throttled"][:2]},
             {"commits": (), "throttled": (), "stragglers": ()})  # fmt: skip
    for trim in trims:
        extra = {**full, **trim}
        try:
            hb.encode(hb.Heartbeat(node, boot_ms, seq, sent, not problems, (), **extra), key)
            break
        except hb.BadHeartbeat:
            continue

    def make(cut: tuple[str, ...]) -> bytes:
        return hb.encode(hb.Heartbeat(node, boot_ms, seq, sent, not problems, cut, **extra), key)

    cut = fit_problems(problems, make)
    beat = hb.Heartbeat(node, boot_ms, seq, sent, healthy=not problems, problems=cut, **extra)
    return beat, hb.encode(beat, key)


#: Clock event reasons that make a GPU slower than its peers (not idle, application clocks, sync boost or display).
SLOWING_REASONS = frozenset(
    {"SW power cap", "HW slowdown", "SW thermal slowdown", "HW thermal slowdown", "HW power brake slowdown"}
)


def throttled_gpus(report: NodeGpuReport | None) -> tuple[str, ...]:
    """This node's GPUs a slowing clock reason holds down, as short texts for the heartbeat's ``throttled``
    ("gpu2: SM 900 MHz (SW thermal slowdown)"): the NVML half of a straggler's attribution."""
    out = []
    for g in report.gpus if report is not None else ():
        slowing = [r for r in g.throttle_reasons if r in SLOWING_REASONS]
        if slowing:
            clock = f"SM {g.sm_clock_mhz} MHz " if g.sm_clock_mhz is not None else ""
            out.append(f"gpu{g.index}: {clock}({', '.join(slowing)})"[: hb.MAX_THROTTLED_TEXT])
    return tuple(out[: hb.MAX_THROTTLED])


def next_boot(now_ms: int, status_dir: str | None, node: str) -> int:
    """This start's ``boot``: the wall clock in ms, but above the previous run's (from its status file).

    Why: the controller accepts a node's beats only with a newer ``(boot, seq)`` than the last it saw, so an agent
    restarted after the node's clock stepped back would be refused as a replay until the clock caught up; the node
    would look dead for that long.
    """
    prev = read_status(status_dir, node) if status_dir else None
    prev_boot = prev.get("boot") if isinstance(prev, dict) else None
    if isinstance(prev_boot, int) and not isinstance(prev_boot, bool) and prev_boot >= now_ms:
        return prev_boot + 1
    return now_ms


def parse_controller(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6addr]:PORT`` too). Raises ValueError with the expected shape."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--controller {text!r}: expected HOST:PORT, e.g. 127.0.0.1:16850")
    return host, int(port)


#: ``gpu`` measurement field <- ``GpuStatus`` attribute (nuro.metrics.model). All written as floats, so a field never
#: changes type between points (InfluxDB refuses a point whose field type differs from the shard's).
GPU_FIELDS = (
    ("util_pct", "utilization_pct"),
    ("mem_used_bytes", "memory_used_bytes"),
    ("mem_total_bytes", "memory_total_bytes"),
    ("temp_c", "temperature_c"),
    ("sm_clock_mhz", "sm_clock_mhz"),
    ("power_w", "power_w"),
)


def gpu_points(
    report: NodeGpuReport, node: str, ts_ns: int | None = None, jobs: Mapping[int, Mapping[str, str]] | None = None
) -> list[Point]:
    """One ``gpu`` point per GPU the report read (tags node, gpu, uuid, model, and job/team/run for a GPU a job
    holds: ``jobs`` is ``nuro.protocol.gpujobs.gpu_tags``). Pure.

    A GPU with no readable value (lost, or the whole probe failed) gives no point: a gap in the series is the
    honest record, and its problem is already in the heartbeat. Unknown uuid/model tags are left out (tag values
    may not be empty). ``ts_ns`` defaults to the report's ``taken_at``.
    """
    ts = ts_ns if ts_ns is not None else int(report.taken_at * 1e9)
    points = []
    for g in report.gpus:
        fields = {name: float(v) for name, attr in GPU_FIELDS if (v := getattr(g, attr)) is not None}
        if not fields:
            continue
        tags = {**(jobs or {}).get(g.index, {}), "node": node, "gpu": str(g.index), "uuid": g.uuid, "model": g.name}
        points.append(Point(GPU, {k: v for k, v in tags.items() if v}, fields, ts))
    return points


__all__ = ["GPU_FIELDS", "SLOWING_REASONS", "build_heartbeat", "fit_problems", "gpu_points", "next_boot",
           "parse_controller", "throttled_gpus"]  # fmt: skip

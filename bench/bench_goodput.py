"""Goodput soak (issue 31): a long training run with a node killed every few minutes; ETTR and where the time went.

One 8-node dev cluster; per variant the example training job (``nuro.devcluster.scenario``: 2 training nodes, gloo,
0.1 s steps, a step count it never reaches) runs for ``--minutes`` of wall time from its first start, with a
persistent checkpoint every ``--ckpt-interval`` s (600) and the SDK's in-memory snapshot every
``--snapshot-interval`` s (``nuro-train submit --snapshot-interval``, exported to the job as
``NURO_SNAPSHOT_INTERVAL_S``; the result records the value a training process saw; 0 = off).
Variants, one after the other on
the same cluster (not side by side: ``slurm`` pauses the controller for the whole cluster, and 2 cores would make the
variants slow each other down), nuro's first, ``slurm`` last:

* ``nuro``: the requeue path with nuro's controller running (detector, policy);
* ``spare``: the same with ``--spare-nodes 1`` (3 nodes allocated, a lost node swapped without a requeue);
* ``slurm``: Slurm alone: the controller paused (SIGSTOP by its recorded PID, as bench_resume.py does) for the whole
  run, no in-memory snapshot (only the job's own periodic checkpoint, same interval); SlurmdTimeout detects. The job
  is still nuro's (launcher, Checkpointer), as in bench_resume.py: only what the platform adds around it is off.

During a variant's run, a node of the job's training step is crashed like a host (``devcluster kill-node``) every
``--fail-every`` s ± 20 % (seeded RNG, ``--seed``), and revived (``revive_and_wait``) once the job has moved on and
``--revive-after`` s (30) passed since the kill (a host's reboot; the node's capacity returns then), so
capacity returns. The nuro variants also get, at set points: one urgent preemption at 45 % of the soak (``priya``
submits an ``urgent``-tier claimant for all 64 GPUs: the only way to start it is the controller's
checkpoint-confirmed preemption of the run; the claimant then holds the cluster for 10 s; if the controller has not
requeued the run within 90 s the claimant is cancelled and the run is sent the controller's preemption signal
directly, reported as ``via: signal``), and one controller restart at 70 % (SIGKILL by its recorded PID; the dev
cluster's supervisor starts it again, as systemd's ``Restart=on-failure`` would). For the claimant the bench installs
its own policy (the example's with ``min_run_s`` 0, ``grace_s`` 30, and prediction's borrow limit raised so one job
may ask for 64 GPUs) and restarts the controller once before the first variant so it runs the policy. A disturbance
waits until the run trains again after the previous one.

Measured per variant, from the run's timeline (``nuro.runs.timeline_report``: Slurm accounting, the controller's
event log, the run's own events), rank 0's log (each ``step N`` line, timestamped by a tail that reads it every
0.2 s; ``scenario.steps_logged`` checks the count) and the nodes' hook logs (prolog/epilog durations):

* ETTR = useful step time (seconds of training steps never done again) / wall time from the first start to
  completion or to the end of the soak;
* failures (node kills and any requeue or swap nobody caused) and per failure: recovery time (failure → first step
  after resume) p50, p99, worst, worst/median; steps redone (run since the previous failure and never kept);
* where each lost second went, by phase, p50 and worst per failure and summed over the run: detect, requeue wait,
  epilog, prolog/staging, start-up, restore, redone steps; plus the first start-up, recoveries the soak's end cut
  short (``unrecovered``) and what is left (``other``: step-time jitter, checkpoint stalls, the tails). The
  preemption's recovery is in the sums but not in the failures' spreads (it waits for the claimant's run).

The accounting is pure (functions of plain data, unit-tested in tests/unit/test_bench_goodput.py); the soak only
collects. Results go to ``bench/results/goodput.json``; a markdown table for docs/benchmarks.md is printed; each
run's raw inputs (``inputs.json``) and the cluster's logs are kept under the bench's /tmp work dir (named in the
run's notes), since the cluster's state dir is purged.

    python -m bench.bench_goodput --minutes 20 --fail-every 270 --slurm 22.05 --port-base 27000 \\
        [--variants nuro,spare,slurm] [--job ddp|deepspeed|both] [--seed 1] [--ckpt-interval 600] \\
        [--snapshot-interval 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psutil
import yaml

from bench.bench_detection import _controller
from bench.common import REPO, cluster, poll, save
from nuro.devcluster import scenario
from nuro.devcluster.layout import Layout
from nuro.lifecycle import run_events
from nuro.objectstore import ObjectStore
from nuro.protocol.contract import PREEMPT_SIGNAL
from nuro.runs import timeline_report
from nuro.slurm import CliBackend, JobInfo

# ---------------------------------------------------------------------------------------------------------------
# The accounting: pure functions of plain data (no cluster, no clock).
# ---------------------------------------------------------------------------------------------------------------

#: the phases of one recovery, in the order they happen; with ``redone`` (steps done again) they are its lost time
PHASES = ("detect", "requeue_wait", "epilog", "prolog", "startup", "restore", "redone")
#: timeline kinds that say a failure was noticed (controller, Slurm accounting, the run's own preemption record)
DETECT_KINDS = frozenset({"node_lost", "node_down", "requeued", "node_fail", "preempted"})
SLURM_DETECT = frozenset({"requeued", "node_fail"})
#: a new attempt allocated (Slurm) or the batch step going on with a spare (run event)
RESTART_KINDS = frozenset({"restarted", "spare_swap"})
#: an attempt that ended to be run again, for a recovery nobody caused
END_KINDS = frozenset({"requeued", "node_fail", "preempted", "failed", "timeout"})
#: a pause in rank 0's step log at least this long splits it (a recovery, a stall): its steps' rate stays clean
GAP_S = 3.0
#: the prologs of one allocation start within this many seconds of each other
PROLOG_BURST_S = 5.0
_HOOK_LINE = re.compile(
    r"^(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) (?P<node>\S+) (?P<hook>nuro-prolog|nuro-epilog) \S+ "
    r"job=(?P<job>\d+) (?:prolog done|epilog checkpoints \S+) in (?P<secs>[\d.]+) s"
)
_SECONDS = re.compile(r"seconds=([\d.]+)")


@dataclass(frozen=True)
class Segment:
    """A run of consecutive steps in rank 0's log without a resume or a pause of ``GAP_S`` or more."""

    first_ts: float
    last_ts: float
    first_step: int
    last_step: int

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1

    def step_s(self) -> float | None:
        """Seconds per step over the segment, None when it is one step (or one timestamp) long."""
        if self.last_step <= self.first_step or self.last_ts <= self.first_ts:
            return None
        return (self.last_ts - self.first_ts) / (self.last_step - self.first_step)


def segments(steps: Iterable[tuple[float, int]], gap_s: float = GAP_S) -> list[Segment]:
    """``(seen at, step)`` in log order → segments: a step not one more than the last starts a new one (a resume
    from a checkpoint goes back; a step skipped forward means lines were lost), and so does a pause of ``gap_s``."""
    out: list[Segment] = []
    cur: list[tuple[float, int]] = []
    for ts, step in steps:
        if cur and (step != cur[-1][1] + 1 or ts - cur[-1][0] >= gap_s):
            out.append(Segment(cur[0][0], cur[-1][0], cur[0][1], cur[-1][1]))
            cur = []
        cur.append((ts, step))
    if cur:
        out.append(Segment(cur[0][0], cur[-1][0], cur[0][1], cur[-1][1]))
    return out


def typical_step_s(segs: Sequence[Segment]) -> float | None:
    """The median seconds per step over the segments that have a rate (weighted by nothing: one value each)."""
    rates = [r for s in segs if (r := s.step_s()) is not None]
    return statistics.median(rates) if rates else None


def _merge(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _covered(lo: int, hi: int, merged: Sequence[tuple[int, int]]) -> int:
    return sum(max(0, min(hi, b) - max(lo, a) + 1) for a, b in merged)


def useful_steps(segs: Sequence[Segment]) -> list[int]:
    """Per segment, how many of its steps were never done again by a later segment (a step is useful once: the
    last time it ran)."""
    out = []
    for i, s in enumerate(segs):
        later = _merge((t.first_step, t.last_step) for t in segs[i + 1 :])
        out.append(s.steps - _covered(s.first_step, s.last_step, later))
    return out


def useful_seconds(segs: Sequence[Segment]) -> float:
    """Seconds of steps never done again: each segment's useful steps × its own seconds per step (the median rate
    for a segment too short to have one)."""
    typical = typical_step_s(segs) or 0.0
    return sum(n * (s.step_s() or typical) for s, n in zip(segs, useful_steps(segs), strict=True))


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) with linear interpolation between the closest ranks; None when empty."""
    vals = sorted(values)
    if not vals:
        return None
    pos = (len(vals) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def spread(values: Iterable[float | None]) -> dict:
    """n, p50, p99, worst and worst/median of the values that are not None (rounded to 0.01)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"n": 0, "p50": None, "p99": None, "worst": None, "worst_over_p50": None}
    p50, worst = percentile(vals, 50), max(vals)
    return {"n": len(vals), "p50": round(p50, 2), "p99": round(percentile(vals, 99), 2), "worst": round(worst, 2),
            "worst_over_p50": round(worst / p50, 2) if p50 else None}  # fmt: skip


def hook_windows(lines: Iterable[str], job_id: int, tz_offset_s: float | None = None) -> list[dict]:
    """The job's prolog and epilog runs from the nodes' hook logs (``nuro.prolog_epilog.hooklog`` lines such as
    ``2026-12-05 07:01:02,345 gpu002 nuro-epilog INFO job=7 epilog checkpoints flushed in 0.84 s``): one
    ``{"node", "hook" (prolog|epilog), "start", "end"}`` each, the end being when the line was written.
    ``tz_offset_s``: seconds east of UTC of the log's local time (None: this machine's)."""
    out = []
    for line in lines:
        m = _HOOK_LINE.match(line)
        if not m or int(m["job"]) != job_id:
            continue
        local = datetime.strptime(m["date"], "%Y-%m-%d %H:%M:%S")
        if tz_offset_s is None:
            end = time.mktime(local.timetuple()) + int(m["ms"]) / 1000
        else:
            end = (local - datetime(1970, 1, 1)).total_seconds() - tz_offset_s + int(m["ms"]) / 1000
        secs = float(m["secs"])
        out.append({"node": m["node"], "hook": m["hook"].removeprefix("nuro-"), "start": end - secs, "end": end})
    return out


def overlap(windows: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by the union of the windows."""
    total, reach = 0.0, lo
    for a, b in sorted(windows):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


def _first(events: Sequence[dict], kinds: Iterable[str], since: float, until: float, node: str | None = None):
    kinds = set(kinds)
    for e in events:
        if since <= e["ts"] < until and e["kind"] in kinds:
            if node and e["kind"].startswith("node_") and e.get("node") and e["node"] != node:
                continue
            return e
    return None


def _restore_s(entry: dict | None) -> float:
    """The restore's own seconds from a ``resumed`` entry's detail (``step 12, seconds=0.31``), else 0."""
    m = _SECONDS.search(entry.get("detail", "")) if entry else None
    return float(m[1]) if m else 0.0


def attempt_starts(events: Sequence[dict], hooks: Sequence[dict] = ()) -> list[dict]:
    """The timeline with one trustworthy ``restarted`` entry per new attempt. Slurm accounting keeps one record per
    job: an attempt requeued soon after it began may leave no start of its own, or one stamped after its training
    processes were up (22.05 soak: a kill 40 s after the preemption's restart left attempt 1 "started" at its end and
    attempt 2 with no start, so its recovery counted as lost up to the next kill). Such an attempt's start is the
    first prolog of the last burst before its processes (prologs of one allocation start within seconds), else the
    processes' own start."""
    procs: dict[int, float] = {}
    for e in events:
        if e["kind"] == "process_started" and e.get("attempt") is not None:
            procs.setdefault(e["attempt"], e["ts"])
    fixed = {
        a
        for a, t in procs.items()
        if a > 0 and not any(e["kind"] == "restarted" and e.get("attempt") == a and e["ts"] <= t for e in events)
    }
    out = [e for e in events if not (e["kind"] == "restarted" and e.get("attempt") in fixed)]
    for a in sorted(fixed):
        t_proc = procs[a]
        starts = sorted(h["start"] for h in hooks if h["hook"] == "prolog" and t_proc - 60 <= h["start"] <= t_proc)
        burst = [t for t in starts if t >= starts[-1] - PROLOG_BURST_S] if starts else [t_proc]
        out.append(
            {
                "ts": burst[0],
                "kind": "restarted",
                "source": "slurm",
                "attempt": a,
                "step": None,
                "node": None,
                "detail": f"attempt {a} (from its first prolog: accounting kept no start before its processes)",
            }
        )
    return sorted(out, key=lambda e: e["ts"])


def recovery(
    events: Sequence[dict],
    at: float,
    until: float,
    segs: Sequence[Segment],
    hooks: Sequence[dict] = (),
    *,
    kind: str = "kill",
    node: str | None = None,
    since: float = float("-inf"),
) -> dict:
    """One failure at ``at`` and its recovery, looked for in the timeline entries (``Entry.to_json()`` dicts, sorted
    by ``ts``) up to ``until`` (the next disturbance or the end of the run).

    Phases from ``at``: detect (→ the first node_lost / node_down / requeue / preempted record), requeue wait (→ the
    new attempt's allocation or the spare swap, less the epilog), epilog (the job's epilog runs in that span),
    prolog (its prolog runs between the allocation and the training processes), start-up (the rest up to the first
    step after resume, less the restore) and restore (the ``restored`` run event's own seconds); then redone: the
    steps run since ``since`` (the previous failure) and never kept (rank 0's log: done again after this failure or
    a later one), in seconds at their segments' rates. They
    add up to the recovery time (failure → first step) plus the redone seconds. A recovery that had not reached its
    first step by ``until`` has ``recovered`` False and its lost time runs to ``until`` (phases as far as known).
    """
    restart = _first(events, RESTART_KINDS, at, until)
    t_restart = restart["ts"] if restart else None
    # the controller's or the run's own record first: Slurm accounting's end times are whole seconds
    det = _first(events, DETECT_KINDS - SLURM_DETECT, at, until if t_restart is None else t_restart + 1e-6, node)
    det = det or _first(events, SLURM_DETECT, at, until if t_restart is None else t_restart + 1e-6, node)
    after = t_restart if t_restart is not None else until
    proc = _first(events, {"process_started"}, after, until)
    resumed = _first(events, {"resumed"}, after, until)
    first = _first(events, {"first_step"}, after, until)
    # the new segment of rank 0's log: the first that starts after the restart (its first line is the first step)
    new_seg = next((i for i, s in enumerate(segs) if s.first_ts >= after), None) if t_restart is not None else None
    t_first = first["ts"] if first else (segs[new_seg].first_ts if new_seg is not None else None)
    row: dict = {"kind": kind, "node": node, "at": round(at, 3), "via": None, "recovered": t_first is not None,
                 "detected_by": det["kind"] if det else None, "resumed_step": None, "redone_steps": None}  # fmt: skip
    t_det = det["ts"] if det else None
    if restart is not None:
        row["via"] = "spare" if restart["kind"] == "spare_swap" else "requeue"
    phases = dict.fromkeys(PHASES, 0.0)
    if t_det is not None:
        phases["detect"] = t_det - at
    if t_det is not None and t_restart is not None:
        epilog = [(h["start"], h["end"]) for h in hooks if h["hook"] == "epilog"]
        phases["epilog"] = overlap(epilog, t_det, t_restart) if row["via"] == "requeue" else 0.0
        phases["requeue_wait"] = t_restart - t_det - phases["epilog"]
    if t_restart is not None and t_first is not None:
        span = max(0.0, t_first - t_restart)
        t_proc = proc["ts"] if proc and proc["ts"] <= t_first else t_first
        prolog = [(h["start"], h["end"]) for h in hooks if h["hook"] == "prolog"]
        phases["prolog"] = overlap(prolog, t_restart - 1.0, t_proc) if row["via"] == "requeue" else 0.0
        phases["restore"] = min(_restore_s(resumed), max(0.0, span - phases["prolog"]))
        phases["startup"] = span - phases["prolog"] - phases["restore"]
    if new_seg is not None and new_seg > 0 and t_first is not None:
        # the steps run since ``since`` (the previous failure) up to this one that were never kept: done again
        # now or by a later attempt, they are this failure's loss (every step run is kept or lost to one failure)
        kept, typical = useful_steps(segs), typical_step_s(segs) or 0.0
        stretch = [k for k in range(new_seg) if segs[k].first_ts >= since]
        row["resumed_step"] = segs[new_seg].first_step
        row["redone_steps"] = sum(segs[k].steps - kept[k] for k in stretch)
        phases["redone"] = sum((segs[k].steps - kept[k]) * (segs[k].step_s() or typical) for k in stretch)
    row["recovery_s"] = round(t_first - at, 2) if t_first is not None else None
    row["phases"] = {k: round(v, 2) for k, v in phases.items()}
    row["lost_s"] = round((t_first - at if t_first is not None else until - at) + phases["redone"], 2)
    return row


def account(
    steps: Sequence[tuple[float, int]],
    events: Sequence[dict],
    disturbances: Sequence[dict],
    first_start: float,
    end: float,
    hooks: Sequence[dict] = (),
    *,
    completed: bool = False,
    gap_s: float = GAP_S,
) -> dict:
    """The goodput of one run.

    ``steps``: rank 0's ``(seen at, step)`` in log order; ``events``: the timeline's entries as dicts (``ts``,
    ``kind``, ``source``, ``attempt``, ``step``, ``detail``, ``node``); ``disturbances``: what the bench did
    (``{"at", "kind": kill|preempt|restart, "node"}``); ``first_start``: the first attempt's allocation; ``end``: the
    run's completion (``completed``) or the end of the soak; ``hooks``: ``hook_windows`` of the job.

    Failures are the kills plus every new attempt or spare swap no disturbance explains (``kind`` "unplanned"); a
    preemption is a recovery too but not a failure (its recovery waits for the claimant's run). Returns ETTR, the
    failures' spreads, the lost time by phase (p50 and worst per failure, sums over the run), and every recovery.
    """
    events = attempt_starts([e for e in events if first_start - 60 <= e["ts"] <= end], hooks)
    steps = [(ts, s) for ts, s in steps if ts <= end]
    segs = segments(steps, gap_s)
    planned = sorted((d for d in disturbances if d["kind"] in ("kill", "preempt") and d["at"] < end),
                     key=lambda d: d["at"])  # fmt: skip
    rows = []
    for i, d in enumerate(planned):
        until = planned[i + 1]["at"] if i + 1 < len(planned) else end
        at = d["at"]
        if d["kind"] == "preempt":  # the run trains on until the signal reaches it: lost time starts when it stops
            at = max([at] + [s.last_ts for s in segs if s.first_ts <= at <= s.last_ts + gap_s])
        rows.append(recovery(events, at, until, segs, hooks, kind=d["kind"], node=d.get("node")))
    # a new attempt or swap outside every planned recovery: a failure nobody caused, from the end of the attempt
    # (or the node loss) just before it
    spans = [(r["at"], r["at"] + r["recovery_s"] if r["recovered"] else end) for r in rows]
    for e in events:
        if e["kind"] not in RESTART_KINDS or e["ts"] < first_start or any(a <= e["ts"] <= b + 1 for a, b in spans):
            continue
        causes = [c for c in events if c["kind"] in END_KINDS | {"node_lost"} and e["ts"] - 300 <= c["ts"] <= e["ts"]]
        at = causes[-1]["ts"] if causes else e["ts"]
        # nobody saw it fail: it failed after the last step before that record (the gap counts as its detection)
        at = max((s.last_ts for s in segs if at - 60 <= s.last_ts <= at), default=at)
        nxt = next((d["at"] for d in planned if d["at"] > e["ts"]), end)
        row = recovery(events, at, nxt, segs, hooks, kind="unplanned")
        rows.append(row)
        spans.append((row["at"], row["at"] + row["recovery_s"] if row["recovered"] else end))
    rows.sort(key=lambda r: r["at"])
    # again, each knowing the failure before it (its stretch of steps starts there)
    bounds = [(r["at"], r["kind"], r["node"]) for r in rows]
    rows = [
        recovery(events, at, bounds[i + 1][0] if i + 1 < len(bounds) else end, segs, hooks, kind=kind, node=node,
                 since=bounds[i - 1][0] if i else float("-inf"))
        for i, (at, kind, node) in enumerate(bounds)
    ]  # fmt: skip
    useful = useful_seconds(segs)
    wall = max(0.0, end - first_start)
    first_step = segs[0].first_ts if segs else None
    first_startup = (first_step - first_start) if first_step is not None else wall
    failures = [r for r in rows if r["kind"] != "preempt"]
    lost_total = {k: round(sum(r["phases"][k] for r in rows), 2) for k in PHASES}
    unrecovered = sum(r["lost_s"] - sum(r["phases"].values()) for r in rows if not r["recovered"])
    accounted = first_startup + sum(r["lost_s"] for r in rows)
    return {
        "completed": completed,
        "wall_s": round(wall, 2),
        "useful_s": round(useful, 2),
        "ettr": round(useful / wall, 4) if wall > 0 else None,
        "steps_kept": sum(useful_steps(segs)),
        "steps_run": sum(s.steps for s in segs),
        "step_s": round(typical_step_s(segs) or 0.0, 4),
        "failures": len(failures),
        "preemptions": sum(1 for r in rows if r["kind"] == "preempt"),
        "unplanned": sum(1 for r in rows if r["kind"] == "unplanned"),
        "recovery_s": spread(r["recovery_s"] for r in failures),
        "redone_steps": spread(r["redone_steps"] for r in failures),
        "phases_per_failure": {k: spread(r["phases"][k] for r in failures if r["recovered"]) for k in PHASES},
        "lost_s": {
            "first_startup": round(first_startup, 2),
            **lost_total,
            "unrecovered": round(unrecovered, 2),
            "other": round(wall - useful - accounted, 2),
        },
        "recoveries": rows,
    }


def plan_disturbances(
    rng: random.Random, duration_s: float, fail_every_s: float, preempt_at: float | None, restart_at: float | None
) -> list[tuple[float, str]]:
    """``(seconds from the first start, kill|preempt|restart)`` in time order: a kill every ``fail_every_s`` ± 20 %
    (uniform), a preemption at ``preempt_at`` and a controller restart at ``restart_at`` (fractions of the soak;
    None: none)."""
    out: list[tuple[float, str]] = []
    t = 0.0
    while True:
        t += fail_every_s * rng.uniform(0.8, 1.2)
        if t >= duration_s:
            break
        out.append((round(t, 1), "kill"))
    for frac, kind in ((preempt_at, "preempt"), (restart_at, "restart")):
        if frac is not None:
            out.append((round(duration_s * frac, 1), kind))
    return sorted(out)


def _cell(v: object, unit: str = "") -> str:
    return "—" if v is None else f"{v}{unit}"


def markdown(results: Sequence[dict]) -> str:
    """The docs table: one column per run (variant, job), one row per measure."""
    cols = [f"{r['variant']} ({r['job']})" for r in results]
    rows = [
        ("ETTR", [_cell(round(100 * r["ettr"], 1) if r.get("ettr") is not None else None, " %") for r in results]),
        ("wall s / useful s", [f"{r['wall_s']} / {r['useful_s']}" for r in results]),
        (
            "failures (unplanned) / preemptions",
            [f"{r['failures']} ({r['unplanned']}) / {r['preemptions']}" for r in results],
        ),
    ]
    for key, label in (("recovery_s", "recovery s"), ("redone_steps", "steps redone")):
        rows.append((f"{label}: p50 / p99 / worst (worst/p50)", [
            f"{_cell(r[key]['p50'])} / {_cell(r[key]['p99'])} / {_cell(r[key]['worst'])} "
            f"({_cell(r[key]['worst_over_p50'], '×')})" for r in results]))  # fmt: skip
    for k in PHASES:
        rows.append((f"{k} s per failure: p50 / worst", [
            f"{_cell(r['phases_per_failure'][k]['p50'])} / {_cell(r['phases_per_failure'][k]['worst'])}"
            for r in results]))  # fmt: skip
    rows.append(("lost s over the run: " + ", ".join(("first_startup", *PHASES, "unrecovered", "other")),
                 [" / ".join(str(r["lost_s"][k]) for k in ("first_startup", *PHASES, "unrecovered", "other"))
                  for r in results]))  # fmt: skip
    pre = [next((x for x in r["recoveries"] if x["kind"] == "preempt"), None) for r in results]
    rows.append(("preemption: recovery s (redone steps)",
                 [f"{_cell(p['recovery_s'])} ({_cell(p['redone_steps'])})" if p else "—" for p in pre]))  # fmt: skip
    lines = ["| | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {label} | " + " | ".join(vals) + " |" for label, vals in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The soak on the dev cluster.
# ---------------------------------------------------------------------------------------------------------------

VARIANTS = ("nuro", "spare", "slurm")
#: steps the job is given: more than any soak reaches, so it ends by the bench's cancel, not by finishing
STEPS = 10**7
#: the claimant of the urgent preemption: the tier's user, its team, and how long it holds the cluster
CLAIMANT = ("priya", "prediction")
CLAIM_S = 10
PREEMPT_AT, RESTART_AT = 0.45, 0.7
#: the SDK's in-memory snapshot interval, passed to the job
SNAPSHOT_ENV = "NURO_SNAPSHOT_INTERVAL_S"


class StepTail(threading.Thread):
    """Reads rank 0's log every ``poll_s`` and timestamps each new ``step N`` line (the wall time it was seen)."""

    def __init__(self, log: Path, poll_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.log, self.poll_s = log, poll_s
        self.steps: list[tuple[float, int]] = []
        self._halt = threading.Event()
        self._pos, self._partial = 0, b""

    def read_once(self) -> None:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read()
        except FileNotFoundError:
            return
        now = time.time()
        self._pos += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            parts = raw.decode(errors="replace").split()
            if len(parts) >= 2 and parts[0] == "step" and parts[1].isdigit():
                self.steps.append((now, int(parts[1])))

    def run(self) -> None:
        while not self._halt.is_set():
            self.read_once()
            self._halt.wait(self.poll_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.read_once()


def _policy(layout: Layout, env: dict[str, str]) -> None:
    """The bench's policy in the cluster's ``etc/teams.yaml`` (the controller runs it from its next start) and in
    Slurm: the example's, preemptible at once, with a claimant team allowed one 64-GPU job."""
    raw = yaml.safe_load((REPO / "examples" / "policy" / "teams.yaml").read_text())
    raw.update(min_run_s=0, grace_s=30)
    raw["teams"][CLAIMANT[1]]["borrow_limit_gpus"] = raw["cluster_gpus"] - raw["teams"][CLAIMANT[1]]["quota_gpus"]
    layout.teams_yaml.parent.mkdir(parents=True, exist_ok=True)
    layout.teams_yaml.write_text(yaml.safe_dump(raw))
    scenario.run_cmd([str(scenario.BIN / "nuro-admin"), "policy", "apply", str(layout.teams_yaml)], env)


def _restart_controller(layout: Layout) -> dict:
    """SIGKILL the controller by its recorded PID and wait until the supervisor has started it again."""

    old = _controller(layout)
    t = time.time()
    old.send_signal(signal.SIGKILL)

    def back():
        with contextlib.suppress(Exception):
            proc = _controller(layout)
            return proc if proc.pid != old.pid and proc.is_running() else None
        return None

    new = poll(back, 60, 0.2)
    return {"kind": "restart", "at": round(t, 3), "node": None, "old_pid": old.pid,
            "new_pid": new.pid if new else None, "back_s": round(time.time() - t, 2) if new else None}  # fmt: skip


def _env_in_job(job_id: int, name: str) -> str | None:
    """``name`` in the environment of one of the job's training processes (``train.py`` with its SLURM_JOB_ID),
    None when no such process has it: that the setting passed to the job reached the SDK."""
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if "train.py" in " ".join(proc.info["cmdline"] or ()):
                env = proc.environ()
                if env.get("SLURM_JOB_ID") == str(job_id) and name in env:
                    return env[name]
    return None


def _nodes_in_service(backend: CliBackend, timeout_s: float) -> bool:

    def ok():
        return all(not n.flags & {"DOWN", "DRAIN", "NOT_RESPONDING"} for n in backend.nodes())

    return bool(poll(ok, timeout_s, 0.5))


class Soak:
    """One variant's run: submit, disturb on schedule, collect."""

    def __init__(self, layout: Layout, env: dict[str, str], work: Path, dataset: str, repo: Path, variant: str,
                 job: str, args: argparse.Namespace, rng: random.Random) -> None:  # fmt: skip
        self.layout, self.env, self.work, self.dataset, self.repo = layout, env, work, dataset, repo
        self.variant, self.job, self.args, self.rng = variant, job, args, rng
        self.backend = CliBackend(env=env)
        self.store = ObjectStore.from_env(env)
        self.disturbances: list[dict] = []
        self.notes: list[str] = []
        self.run = None
        self.tail: StepTail | None = None
        self.snapshot_env: str | None = None

    # -- what the bench reads while the run goes on --
    def _job(self) -> JobInfo | None:
        with contextlib.suppress(Exception):
            return self.backend.find_job(self.run.job_id)
        return None

    def _training(self, within_s: float = 3.0) -> bool:
        j = self._job()
        steps = self.tail.steps if self.tail else []
        return bool(j is not None and j.phase.name == "RUNNING" and steps and time.time() - steps[-1][0] < within_s)

    def _wait_training(self, deadline: float) -> bool:
        while time.time() < deadline:
            if self._training():
                return True
            time.sleep(0.5)
        return False

    def _training_nodes(self, job: JobInfo) -> list[str]:
        want = 2
        nodes = list(job.nodes)
        with contextlib.suppress(Exception):
            swaps = [e for e in run_events.read(self.store, self.run.team, self.run.name, self.run.job_id)
                     if e.kind == "spare_swap" and e.restart == job.restart_count]  # fmt: skip
            if swaps and isinstance(swaps[-1].fields.get("nodes"), list):
                return [str(n) for n in swaps[-1].fields["nodes"]]
        return nodes[:want]

    # -- disturbances --
    def _kill(self, deadline: float) -> dict:
        job = self._job()
        victim = self.rng.choice(self._training_nodes(job))
        before, seen = job.restart_count, len(self.tail.steps)
        t = time.time()
        killed = scenario.kill_node(self.env, victim)
        at = float(killed.get("at", t))

        def moved_on():
            j = self._job()
            if j is not None and j.restart_count > before:
                return True
            return any(ts > at + GAP_S for ts, _ in self.tail.steps[seen:])  # trains again (a spare swap)

        moved = bool(poll(moved_on, max(5.0, min(300.0, deadline - time.time())), 0.5))
        # a crashed host is back after a reboot, not a second later: a node in service again at once is also the one
        # case where starting a requeued job early is unsafe (nuro.slurm_plugins.controller.expedite)
        time.sleep(max(0.0, at + self.args.revive_after - time.time()))
        back = scenario.revive_and_wait(self.env, victim, timeout_s=120)
        if not back:
            self.notes.append(f"{victim} not back in service 120 s after its revive")
        return {"kind": "kill", "at": round(at, 3), "node": victim, "moved_on": moved, "revived": back}

    def _preempt(self, deadline: float) -> dict:
        if not _nodes_in_service(self.backend, 90):
            self.notes.append("preemption: not every node in service; the claimant may wait on a node")
        before = self._job().restart_count
        user, team = CLAIMANT
        script = f"#!/bin/bash\ntrap '{scenario.BIN / 'nuro-job'} ack --step 0' USR1\nsleep {CLAIM_S}\n"
        argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in self.env.items()), "sbatch",
                "--parsable", f"--account={team}", "--qos=urgent", "--nodes=8", "--gres=gpu:8", "--exclusive",
                "--output=/dev/null", "--job-name=goodput-claimant"]  # fmt: skip
        t = time.time()
        res = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            self.notes.append(f"claimant refused: {res.stderr.strip() or res.stdout.strip()}")
            claimant = None
        else:
            claimant = int(res.stdout.strip().split(";")[0])

        def requeued():
            j = self._job()
            return j is not None and j.restart_count > before

        via = "claimant"
        if claimant is None or not poll(requeued, min(90.0, max(5.0, deadline - time.time())), 0.5):
            if claimant is not None:
                self.notes.append(f"claimant {claimant}: the controller did not requeue the run within 90 s; "
                                  "signalled directly instead")  # fmt: skip
                self.backend.cancel(claimant)
            via = "signal"
            self.backend.signal(self.run.job_id, PREEMPT_SIGNAL, full=True)
            poll(requeued, min(120.0, max(5.0, deadline - time.time())), 0.5)
        elif not poll(lambda: (c := self.backend.find_job(claimant)) is None or c.phase.is_terminal, CLAIM_S + 120, 1):
            self.notes.append(f"claimant {claimant} still there {CLAIM_S + 120} s after the run's requeue: cancelled")
            self.backend.cancel(claimant)
        return {"kind": "preempt", "at": round(t, 3), "node": None, "via": via, "claimant": claimant}

    # -- the run --
    def go(self) -> dict:
        args, nuro = self.args, self.variant != "slurm"
        ctl = None if nuro else _controller(self.layout)
        snapshot = args.snapshot_interval if nuro else 0
        soak_s = args.minutes * 60
        if ctl is not None:
            ctl.send_signal(signal.SIGSTOP)
        completed, first_start = False, time.time()
        end = first_start + soak_s
        try:
            self.run = scenario.submit(
                self.env, self.work, self.dataset, self.repo, spare_nodes=1 if self.variant == "spare" else 0,
                steps=STEPS, ckpt_interval_s=args.ckpt_interval, deepspeed=self.job == "deepspeed",
                name=f"goodput-{self.variant}-{self.job}-{int(time.time()) % 10**6}",
                time_limit=str(int(args.minutes) + 30), max_requeues=100, snapshot_interval_s=int(snapshot),
            )  # fmt: skip
            self.tail = StepTail(self.run.log)
            self.tail.start()
            want = 3 if self.variant == "spare" else 2
            scenario.wait_for("the run to start", lambda: (j := self._job()) is not None
                              and j.phase.name == "RUNNING" and len(j.nodes) == want, 300)  # fmt: skip
            attempts = self.backend.attempts(self.run.job_id)
            first_start = attempts[0].start_time.timestamp() if attempts and attempts[0].start_time else time.time()
            end = first_start + soak_s
            scenario.wait_for("the first step", lambda: self.tail.steps, 300)
            self.snapshot_env = _env_in_job(self.run.job_id, SNAPSHOT_ENV)
            plan = plan_disturbances(self.rng, soak_s, args.fail_every, PREEMPT_AT if nuro else None,
                                     RESTART_AT if nuro else None)  # fmt: skip
            print(f"  {self.variant}: job {self.run.job_id}, plan {plan}", flush=True)
            for offset, kind in plan:
                time.sleep(max(0.0, min(first_start + offset, end) - time.time()))
                if time.time() >= end - 5 or not self._wait_training(end - 5):
                    self.notes.append(f"{kind} at +{offset:.0f} s not done: the soak ended first")
                    continue
                if kind == "kill":
                    d = self._kill(end)
                elif kind == "preempt":
                    d = self._preempt(end)
                else:
                    d = _restart_controller(self.layout)
                d["offset_s"] = round(d["at"] - first_start, 1)
                self.disturbances.append(d)
                print(f"  {self.variant}: {d}", flush=True)
            while time.time() < end:
                j = self._job()
                if j is not None and j.phase.is_terminal:
                    completed, end = j.phase.name == "COMPLETED", time.time()
                    break
                time.sleep(1)
        finally:
            if self.tail is not None:
                self.tail.stop()
            if ctl is not None:
                ctl.send_signal(signal.SIGCONT)
            if self.run is not None:
                with contextlib.suppress(Exception):
                    self.backend.cancel(self.run.job_id)
        return self._collect(first_start, end, completed, soak_s)

    def _collect(self, first_start: float, end: float, completed: bool, soak_s: float) -> dict:
        gone = poll(lambda: (j := self._job()) is None or j.phase.is_terminal, 90, 1.0)
        if not gone:
            self.notes.append(f"job {self.run.job_id} still there 90 s after its cancel")
        time.sleep(2)  # the last attempt's end reaches accounting
        tl, notes = timeline_report.gather(self.run.job_id, self.backend, Path(self.env["NURO_EVENT_LOG"]),
                                           self.store)  # fmt: skip
        self.notes += notes
        hooks: list[dict] = []
        for path in sorted(self.layout.log.glob("hooks-*.log")):
            hooks += hook_windows(path.read_text(errors="replace").splitlines(), self.run.job_id)
        logged = [s for _, s in scenario.steps_logged(self.run.log)]
        tailed = [s for _, s in self.tail.steps]
        if logged[: len(tailed)] != tailed:
            self.notes.append(f"the tail saw {len(tailed)} step lines, the log holds {len(logged)}")
        events = [e.to_json() for e in tl.entries]
        result = account(self.tail.steps, events, self.disturbances, first_start, end, hooks, completed=completed)
        # what the accounting read, and the cluster's logs (purged with the cluster), kept beside the run for a look
        keep = self.work / f"{self.variant}-{self.job}"
        shutil.copytree(self.layout.log, keep / "log", dirs_exist_ok=True)
        inputs = {"steps": self.tail.steps, "events": events, "hooks": hooks, "disturbances": self.disturbances,
                  "first_start": first_start, "end": end, "completed": completed}  # fmt: skip
        (keep / "inputs.json").write_text(json.dumps(inputs))
        self.notes.append(f"inputs and cluster logs kept in {keep}")
        return {"variant": self.variant, "job": self.job, "job_id": self.run.job_id, "soak_s": soak_s,
                "ckpt_interval_s": self.args.ckpt_interval,
                "snapshot_interval_s": self.args.snapshot_interval if self.variant != "slurm" else 0,
                "snapshot_env_in_job": self.snapshot_env,
                **result, "disturbances": self.disturbances, "notes": self.notes}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=20, help="soak length per variant (wall time from first start)")
    ap.add_argument("--fail-every", type=float, default=270, help="seconds between node kills (± 20 %%, random)")
    ap.add_argument("--slurm", default="22.05")
    ap.add_argument("--port-base", type=int, default=27000)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated: nuro,spare,slurm")
    ap.add_argument("--job", choices=("ddp", "deepspeed", "both"), default="ddp")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ckpt-interval", type=int, default=600, help="persistent checkpoint interval, s")
    ap.add_argument("--revive-after", type=float, default=30.0, help="a killed node comes back this long after, s")
    ap.add_argument("--snapshot-interval", type=int, default=5,
                    help="NURO_SNAPSHOT_INTERVAL_S for the nuro variants (0 = off)")  # fmt: skip
    args = ap.parse_args()

    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(wanted) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variant(s) {', '.join(sorted(unknown))}; choose from {', '.join(VARIANTS)}")
    variants = [v for v in VARIANTS if v in wanted]  # slurm last: it pauses the controller
    jobs = ["ddp", "deepspeed"] if args.job == "both" else [args.job]
    results: list[dict] = []
    # a state dir (and results file) of its own per Slurm version and port base: soaks may run side by side
    name = f"goodput-{args.slurm}-{args.job}-{args.port_base}"
    with cluster(8, args.port_base, name, slurm=args.slurm) as (layout, env, _up):
        backend = CliBackend(env=env)
        work = Path(tempfile.mkdtemp(prefix="nuro-bench-goodput-", dir="/tmp"))
        work.chmod(0o755)
        prepared = {}
        for job in jobs:
            sub = work / job
            sub.mkdir()
            example, name = ((scenario.DEEPSPEED_EXAMPLE, "demo-tracks") if job == "deepspeed"
                             else (scenario.EXAMPLE, "demo-synth"))  # fmt: skip
            prepared[job] = (sub, *scenario.prepare(env, sub, dataset=name, apply_policy=False, example=example))
        _policy(layout, env)
        restart = _restart_controller(layout)  # the controller runs the policy from now on
        print(f"controller restarted with the bench's policy: {restart}", flush=True)
        time.sleep(4)  # the controller's restart grace has passed
        for job in jobs:
            for variant in variants:
                _nodes_in_service(backend, 120)
                sub, dataset, repo = prepared[job]
                rng = random.Random(f"{args.seed}-{variant}-{job}")
                print(f"{variant} ({job}): {args.minutes} min, a kill every {args.fail_every} s ± 20 %", flush=True)
                res = Soak(layout, env, sub, dataset, repo, variant, job, args, rng).go()
                results.append({"slurm": args.slurm, **res})
                print(f"{variant} ({job}): ETTR {res['ettr']}, failures {res['failures']}, "
                      f"recovery {res['recovery_s']}, lost {res['lost_s']}", flush=True)  # fmt: skip
    table = markdown(results)
    save(f"goodput-{args.slurm}-{args.job}", {"slurm": args.slurm, "minutes": args.minutes,
                                              "fail_every_s": args.fail_every, "seed": args.seed, "runs": results,
                                              "table": table})  # fmt: skip
    print()
    print(table)


if __name__ == "__main__":
    main()

"""Shared bench plumbing: a throwaway cluster per benchmark, timing, and result files.

Benchmarks measure; they never assert a speed. Each one runs its baseline (bare Slurm commands) side by side with
nuro's path in the same run and reports the ratio, so a slow machine shifts both.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nuro.devcluster import manager  # noqa: E402
from nuro.devcluster.layout import Layout  # noqa: E402
from nuro.devcluster.record import read_record  # noqa: E402

RESULTS = REPO / "bench" / "results"


@contextmanager
def cluster(
    nodes: int, port_base: int, name: str, slurm: str = "22.05"
) -> Iterator[tuple[Layout, dict[str, str], manager.UpResult]]:
    """A fresh cluster (of Slurm ``slurm``) in its own state dir; stopped and purged afterwards."""
    layout = Layout(REPO / ".devcluster-bench" / name)
    manager.down(layout, purge=True)
    res = manager.up(layout, nodes, port_base, timeout_s=300, slurm=slurm)
    try:
        yield layout, manager.env_exports(layout), res
    finally:
        manager.down(layout, purge=True)


#: what runs on compute hosts in production: every node's slurmd (its slurmstepds, prologs and jobs are its
#: children and inherit its CPU priority) and node agent
COMPUTE_HOST_DAEMONS = ("slurmd:", "agent:")
#: the CPU priority (nice) of "other hosts'" work when a bench emulates separate hosts on this one machine
OTHER_HOSTS_NICE = 19


def nice_compute_hosts(layout: Layout, nice: int) -> int:
    """Set the CPU priority of every compute host's daemons (and what they run now) to ``nice``; returns how many.

    On one 2-core machine a burst's prologs, slurmstepds, jobs and sbatch processes compete for the same cores as
    slurmctld and the controller, which in production run on their own host. Niceness 19 for what would run on
    other hosts (compute nodes here, login nodes by running submitters under ``nice -n 19``) is the closest this
    machine gets to separate hosts; 0 puts everything back on an equal footing. New children inherit it.
    """
    record = read_record(layout.record)
    count = 0
    for ref in record.daemons if record else []:
        proc = ref.process() if ref.name.startswith(COMPUTE_HOST_DAEMONS) else None
        for p in [proc, *proc.children(recursive=True)] if proc else []:
            try:
                p.nice(nice)
                count += 1
            except psutil.NoSuchProcess:  # a prolog or step that ended meanwhile
                continue
    return count


def poll(pred: Callable[[], object], timeout_s: float, interval_s: float = 0.1) -> object:
    """``pred()``'s first truthy value within ``timeout_s`` (checked every ``interval_s``), else None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval_s)
    return None


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median_s(fn: Callable[[], object], repeat: int) -> float:
    return statistics.median(timed(fn) for _ in range(repeat))


def p50(rows: list[dict], key: str) -> float | None:
    """The median of ``key`` over the rows that have it (None when none does), rounded to 0.01."""
    vals = [r[key] for r in rows if r.get(key) is not None]
    return round(statistics.median(vals), 2) if vals else None


def run(argv: list[str], env: dict[str, str], stdin: str | None = None) -> str:
    res = subprocess.run(
        argv, input=stdin, env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=True
    )
    return res.stdout


def save(name: str, result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"bench": name, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **result}
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))

"""Controller cycle time before vs after per-job failure isolation (issue 11, deliverable 8), in the same run.

The cycle (snapshot → decide → apply) runs in-process on bench_decide's synthetic 500-host / 4,000-GPU cluster
(1,000 running and 5,000 pending jobs), from a backend that hands back that snapshot (no Slurm: this measures what
the daemon adds around ``decide``, which is what changed), apply in dry-run. "Before" is ``Controller`` as it was
before the change (slurm_plugins/controller/daemon.py at ``--before`` from git, loaded as its own module, on
today's engine); "after" is today's. Runs are interleaved so a slow moment of the machine hits both alike.
Also measured: the cycle with one job whose record makes ``decide`` raise (the engine's test fault hook), the first
cycle (it searches the culprit) and the steady state (the job stays quarantined).

    python -m bench.bench_controller_isolation [--repeat 15] [--before 0b1f475]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench.bench_decide import NOW, policy, synthesize
from bench.common import REPO, save
from nuro.slurm.models import ClusterSnapshot
from nuro.slurm_plugins.controller import engine
from nuro.slurm_plugins.controller.daemon import Controller


class SnapshotBackend:
    """Just enough of ``Backend`` for a dry-run cycle: the same snapshot every time."""

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.snap = snap

    def read_snapshot(self) -> ClusterSnapshot:
        return self.snap


def _old_controller_class(commit: str) -> type:
    src = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:slurm_plugins/controller/daemon.py"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "daemon_before.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("nuro_controller_daemon_before", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod.Controller


def _cycle_ms(controller: object) -> float:
    t0 = time.perf_counter()
    report = controller.cycle()
    assert not report.error, report.error
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--before", default="0b1f475", help="the commit before the change")
    args = ap.parse_args()
    snap, _ = synthesize(args.seed)
    pol = policy()
    before_cls = _old_controller_class(args.before)
    backend = SnapshotBackend(snap)
    before = before_cls(backend, pol, dry_run=True, clock=lambda: NOW)
    after = Controller(backend, pol, dry_run=True, clock=lambda: NOW)
    for c in (before, after):  # first cycles set every site factor; measure the steady state
        c.cycle()
        c.cycle()
    b_t, a_t = [], []
    for _ in range(args.repeat):
        b_t.append(_cycle_ms(before))
        a_t.append(_cycle_ms(after))
    # one job (a running one, so its GPUs matter) carries the fault mark: decide raises until it is quarantined
    engine.FAULT_MARK = "bench-fault"
    victim = next(j for j in snap.jobs if j.nodes)
    bad = replace(
        snap, jobs=tuple(replace(j, comment=j.comment + " bench-fault") if j is victim else j for j in snap.jobs)
    )
    faulty = Controller(SnapshotBackend(bad), pol, dry_run=True, clock=lambda: NOW)
    faulty.cycle()  # site factors
    faulty.isolator.jobs.clear()
    t0 = time.perf_counter()
    report = faulty.cycle()
    search_ms = (time.perf_counter() - t0) * 1000
    assert not report.error and victim.job_id in faulty.isolator.jobs, report.error
    q_t = [_cycle_ms(faulty) for _ in range(args.repeat)]
    engine.FAULT_MARK = ""
    med = statistics.median
    result = {
        "seed": args.seed,
        "repeat": args.repeat,
        "before_commit": args.before,
        "snapshot": {"hosts": len(snap.nodes), "jobs": len(snap.jobs)},
        "cycle_before_ms": round(med(b_t), 2),
        "cycle_after_ms": round(med(a_t), 2),
        "after_over_before": round(med(a_t) / med(b_t), 3),
        "target": 1.1,
        "target_met": med(a_t) / med(b_t) <= 1.1,
        "one_bad_job_first_cycle_ms": round(search_ms, 2),
        "one_bad_job_steady_cycle_ms": round(med(q_t), 2),
        "steady_over_before": round(med(q_t) / med(b_t), 3),
    }
    save("controller_isolation", result)


if __name__ == "__main__":
    main()

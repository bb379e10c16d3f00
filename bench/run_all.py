"""Run every benchmark that needs no destructive set-up; results land in bench/results/*.json."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

for module in (
    "bench.bench_devcluster_up",
    "bench.bench_submit_burst",
    "bench.bench_snapshot",
    "bench.bench_decide",
    "bench.bench_trace_replay",
    "bench.bench_dataset_snapshot",
    "bench.bench_checkpoint_stall",
    "bench.bench_upload_storm",
    "bench.bench_transition",
    "bench.bench_prefetch",
    "bench.bench_data_wait",
    "bench.bench_detection",
    "bench.bench_inband",
    "bench.bench_stragglers",
    "bench.bench_resume",
    # issue 11: what the isolation costs, each against 0b1f475 in the same run
    "bench.bench_bridge",
    "bench.bench_controller_isolation",
    "bench.bench_hooks",
    "bench.bench_epilog",
    "bench.bench_heartbeat_flood",
):
    print(f"== {module}", flush=True)
    subprocess.run([sys.executable, "-m", module], cwd=REPO, check=True)

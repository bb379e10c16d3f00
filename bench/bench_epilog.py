"""Epilog wall time per job, before vs after issue 11 (same run, same machine, same SeaweedFS).

"Before" is the tree at ``--before`` (default ``0b1f475``, the last commit before the isolation work), extracted
with ``git archive`` into a temp dir; "after" is this checkout. Each job is run as slurmd runs the hooks (root, a
job-only environment, the node env file; as tests/integration/test_staging.py does): the prolog (not timed) makes
the job's staging dir (and, after, its record), the "job" stages ``--steps`` checkpoint steps of ``--mib`` MiB
each with their upload requests, then the epilog is timed: flush (upload + commit every step), cache the newest
copy, remove the job dir (after: and the job record), the node health check. Trees alternate job by job.

Also one hostile job per tree: a FIFO planted at a step's upload state file (``.upload-0.state``), which root
reads. Before, the epilog blocks on it until slurmd's ``PrologEpilogTimeout`` (here: until ``--hang-s``, then it
is killed and reported as blocked); after, the FIFO is refused at once and the epilog ends in its normal time.

    python -m bench.bench_epilog [--jobs 5] [--steps 2] [--mib 8] [--port-base 14400] [--before 0b1f475] [--no-health]

``--no-health`` skips the node health check in both trees (``NURO_HOOK_HEALTHCHECK=0``): what is left is the
checkpoint part this work changed (flush, cache, job dir and record removal) plus the interpreter start.

Benchmarks measure; nothing asserts a speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import REPO, save
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan

NOBODY = 65534
TEAM = "vision"
# Both trees are imported the same way: ``nuro`` from the tree, and the tree itself on ``nuro.__path__`` so that
# nuro.prolog_epilog / nuro.healthcheck / nuro.wrappers resolve to that tree's folders (setup.cfg's package_dir),
# never to the editable install's mapping of this checkout.
_BOOT = (
    "import runpy, sys; tree = sys.argv.pop(1); sys.path.insert(0, tree); import nuro; nuro.__path__.append(tree); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__')"
)


def _extract(rev: str, dest: Path) -> Path:
    """The tree at ``rev`` under ``dest`` (git archive: no change to the repository or its worktrees)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _hook(
    tree: Path, module: str, node: Path, job: int, run: str, s3_env: dict[str, str], timeout_s: float, health: bool
) -> float:
    """Run one hook like slurmd does; returns its wall time (``inf`` when it had to be killed at ``timeout_s``)."""
    env_file = node / "nuro.env"
    settings = {**s3_env, "NURO_STAGING_ROOT": str(node / "staging"), "NURO_CACHE_DIR": str(node / "cache"),
                "NURO_STAGING_MIN_FREE_GB": "1"}  # fmt: skip
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    comment = json.dumps({"nuro": {"name": run, "team": TEAM, "v": 1}}, sort_keys=True, separators=(",", ":"))
    env = {
        "PATH": os.environ["PATH"], "NURO_ENV_FILE": str(env_file), "SLURM_JOB_ID": str(job),
        "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOBODY), "SLURM_JOB_USER": "nobody",
        "SLURM_JOB_ACCOUNT": TEAM, "SLURM_JOB_COMMENT": comment, "SLURMD_NODENAME": node.name,
        "NURO_HOOK_HEALTHCHECK": "1" if health else "0",
    }  # fmt: skip
    t0 = time.perf_counter()
    try:
        res = subprocess.run([sys.executable, "-c", _BOOT, str(tree), module], env=env, capture_output=True,
                             text=True, timeout=timeout_s, cwd=tree)  # fmt: skip
    except subprocess.TimeoutExpired:
        return float("inf")
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{module} of {tree} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return took


def _stage(job_dir: Path, job: int, run: str, steps: int, mib: int, hostile: bool) -> None:
    """What the job leaves: ``steps`` DCP-like steps with their upload requests (the request format is unchanged)."""
    for step in range(1, steps + 1):
        d = job_dir / "ckpt" / f"step-{step:012d}"
        d.mkdir(parents=True)
        files = {".metadata": os.urandom(512), "__0_0.distcp": os.urandom(mib << 20)}
        entries = []
        for name, data in files.items():
            (d / name).write_bytes(data)
            entries.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        req = {"format": "nuro.checkpoint-upload/v1", "team": TEAM, "run": run, "step": step, "job_id": str(job),
               "restart": 0, "part": 0, "parts_expected": 1, "world_size": 1, "files": entries,
               "created_at": "2026-01-01T00:00:00Z", "keep": None}  # fmt: skip
        if hostile and step == 1:
            os.mkfifo(d / ".upload-0.state")
        (d / ".upload-0.json").write_text(json.dumps(req))
        os.chown(d, NOBODY, NOBODY)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--mib", type=int, default=8)
    ap.add_argument("--port-base", type=int, default=14400)
    ap.add_argument("--before", default="0b1f475")
    ap.add_argument("--hang-s", type=float, default=30.0, help="kill a blocked epilog after this long")
    ap.add_argument("--no-health", action="store_true", help="skip the node health check (checkpoint part only)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="nuro-bench-epilog-"))
    work.chmod(0o755)
    trees = {"before": _extract(args.before, work / "before"), "after": REPO}
    s3_dir = work / "s3"
    times: dict[str, list[float]] = {name: [] for name in trees}
    hostile: dict[str, float] = {}
    try:
        with s3.standalone(s3_dir, args.port_base):
            s3_env = s3.s3_env(PortPlan(args.port_base))
            job = 5000
            for i in range(args.jobs + 1):
                for name, tree in trees.items():
                    job += 1
                    bad = i == args.jobs  # the last round: the hostile job
                    node = work / f"{name}-{job}"
                    node.mkdir()
                    run = f"b-{uuid.uuid4().hex[:8]}"
                    _hook(tree, "nuro.prolog_epilog.prolog", node, job, run, s3_env, 120, False)
                    _stage(node / "staging" / str(job), job, run, args.steps, args.mib, bad)
                    took = _hook(tree, "nuro.prolog_epilog.epilog", node, job, run, s3_env,
                                 args.hang_s if bad else 300, not args.no_health)  # fmt: skip
                    (hostile.__setitem__(name, took) if bad else times[name].append(took))
                    print(f"{name} job={job}{' (FIFO)' if bad else ''} epilog {took:.2f} s", flush=True)
                    shutil.rmtree(node, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    save(
        "epilog-no-health" if args.no_health else "epilog",
        {
            "health_check": not args.no_health,
            "jobs_per_tree": args.jobs, "steps_per_job": args.steps, "mib_per_step": args.mib,
            "before_rev": args.before,
            "epilog_s_median": {k: round(v, 3) for k, v in med.items()},
            "epilog_s_all": {k: [round(t, 3) for t in ts] for k, ts in times.items()},
            "after_over_before": round(med["after"] / med["before"], 3),
            "fifo_job_epilog_s": {k: (round(v, 3) if v != float("inf") else f"blocked >= {args.hang_s:.0f} s, killed")
                                  for k, v in hostile.items()},
        },
    )  # fmt: skip


if __name__ == "__main__":
    main()

"""Prolog (and epilog) wall time per job, before vs after issue 11's isolation work, in the same run.

Each hook is run like slurmd runs it (root, a job-only environment, the admin's settings in an env file) against one
standalone SeaweedFS, ``--repeat`` times per scenario, alternating the two trees so a busy machine shifts both:

* ``before``: the tree at ``--before`` (default ``0b1f475``, the commit issue 11 started from), exported with
  ``git archive`` to ``/tmp/nuro-before-<commit>`` (nothing in the checkout changes);
* ``after``: this checkout.

Both are started the same way (``_RUNNER``): ``nuro`` is imported from the tree's own directory, and the tree's
``prolog_epilog``/``wrappers`` are put on ``nuro.__path__`` (the editable install would map them to this checkout
otherwise). Scenarios (prolog):

* ``plain``: a job without a nuro record (make the staging dir; write the record);
* ``stage_s3``: a nuro job whose run has a committed checkpoint of ``--mib`` MiB, on an empty node: staged from S3;
* ``stage_cache``: the same, with the run's newest step in the node cache (an earlier job's epilog left it).

Wall time includes the interpreter start: that is what a job waits for.

    python -m bench.bench_hooks [--repeat 5] [--mib 16] [--port-base 13270]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

from bench.common import REPO, save
from nuro.checkpoint import layout as L
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment
from nuro.wrappers.sdk.checkpointer import Checkpointer
from nuro.wrappers.sdk.runenv import RunEnv

TEAM = "vision"
NOBODY = 65534
_RUNNER = (
    "import runpy, sys; tree = sys.argv.pop(1); sys.path.insert(0, tree); import nuro; nuro.__path__.append(tree); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__')"
)


def export_tree(commit: str) -> Path:
    """The tree at ``commit`` under /tmp (``git archive``: the checkout and its index are not touched)."""
    dest = Path(f"/tmp/nuro-before-{commit}")
    if not (dest / "nuro").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def hook(tree: Path, module: str, node: Path, job: int, comment: str, plan: PortPlan) -> float:
    """Run one hook of ``tree`` as slurmd would; its wall time in seconds."""
    env_file = node / "nuro.env"
    settings = {**s3.s3_env(plan), "NURO_STAGING_ROOT": str(node / "staging"), "NURO_CACHE_DIR": str(node / "cache"),
                "NURO_STAGING_MIN_FREE_GB": "1"}  # fmt: skip
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    env = {
        "PATH": os.environ["PATH"], "NURO_ENV_FILE": str(env_file), "SLURM_JOB_ID": str(job),
        "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOBODY), "SLURM_JOB_USER": "nobody",
        "SLURM_JOB_ACCOUNT": TEAM, "SLURM_JOB_COMMENT": comment, "SLURMD_NODENAME": node.name,
    }  # fmt: skip
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", _RUNNER, str(tree), module], env=env, capture_output=True, text=True, timeout=300
    )
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{tree} {module} exited {res.returncode}: {res.stderr[-2000:]}")
    if "staged step" not in res.stderr and "stage" in node.name:
        raise RuntimeError(f"{tree} {module} did not stage: {res.stderr[-2000:]}")
    return took


def seed(store: ObjectStore, tmp: Path, run: str, mib: int) -> Path:
    """A committed step 1 of ``TEAM/run`` and its local copy (for the node cache scenario)."""
    job_dir = tmp / "seed" / "7"
    ck = Checkpointer(team=TEAM, run=run, store=store, staging_dir=job_dir, upload="inline", env=RunEnv(job_id=7))
    ck.save({"w": torch.ones(mib * 256, 1024)}, 1, sync=True)
    if not ck.wait_committed(1, 300):
        raise RuntimeError("seed checkpoint not committed")
    ck.close()
    return job_dir / "ckpt" / L.step_name(1)


def prolog_round(trees: dict[str, Path], scenario: str, run: str, step_copy: Path, tmp: Path, plan: PortPlan,
                 job: int) -> dict[str, float]:  # fmt: skip
    out = {}
    comment = "" if scenario == "plain" else jobcomment.merge(None, nuro={"v": 1, "name": run, "team": TEAM})
    for name, tree in trees.items():
        node = tmp / f"{scenario}-{name}-{job}"
        node.mkdir()
        if scenario == "stage_cache":
            cached = L.cache_dir(node / "staging", TEAM, run) / L.step_name(1)
            shutil.copytree(step_copy, cached)
        out[name] = hook(tree, "nuro.prolog_epilog.prolog", node, job, comment, plan)
        shutil.rmtree(node)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--before", default="0b1f475")
    ap.add_argument("--port-base", type=int, default=13270)
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("run as root: the hooks chown to the job's user")
    trees = {"before": export_tree(args.before), "after": REPO}
    plan = PortPlan(args.port_base)
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="nuro-bench-hooks-") as tmp_s:
        tmp = Path(tmp_s)
        with s3.standalone(tmp / "s3", args.port_base):
            store = s3.dev_store(plan)
            run = f"bench-{uuid.uuid4().hex[:6]}"
            step_copy = seed(store, tmp, run, args.mib)
            for scenario in ("plain", "stage_s3", "stage_cache"):
                samples: dict[str, list[float]] = {"before": [], "after": []}
                for i in range(args.repeat):
                    order = dict(reversed(trees.items())) if i % 2 else trees
                    for name, took in prolog_round(order, scenario, run, step_copy, tmp, plan, 5000 + i).items():
                        samples[name].append(took)
                results[scenario] = samples
    summary = {
        scenario: {
            **{f"{k}_median_s": round(statistics.median(v), 3) for k, v in s.items()},
            "ratio": round(statistics.median(s["after"]) / statistics.median(s["before"]), 3),
            "samples_s": {k: [round(x, 3) for x in v] for k, v in s.items()},
        }
        for scenario, s in results.items()
    }
    save("hooks", {"repeat": args.repeat, "checkpoint_mib": args.mib, "before": args.before, "prolog": summary})
    return 0


if __name__ == "__main__":
    sys.exit(main())

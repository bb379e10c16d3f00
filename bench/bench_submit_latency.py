"""Submit latency: nuro's in-process submit path and the nuro-sbatch CLI vs bare sbatch, for the same job, one run.

Set-up (as root): a fresh 8-node dev cluster with the example policy applied (team accounts, QOS, the bridge's
table: job_submit.lua judges every submission), a one-file dataset snapshot in the cluster's S3 and a clean git
repository owned by alice. The measuring runs as alice (``--worker``), so the bridge judges every job (root would be
let through unjudged) and git's ownership check passes.

Paths measured, interleaved round by round so drift in slurmctld load hits all of them equally:

* ``bare_rendered``: ``sbatch --parsable --hold --comment=<record>`` with the rendered script on stdin (the bytes the
  in-process path submits);
* ``inprocess``: what ``nuro-train submit`` does after start-up: ``plan_submission`` (dataset digest checked in S3,
  code pinned with git, script rendered) + ``apply_submission`` (mkdir, adapter submit);
* ``bare_plain``: ``sbatch --parsable --hold -N2 --gpus-per-node=1 -t 5 job.sh``;
* ``cli``: ``nuro-sbatch --team ... --dataset ... --code ... <the same plain options> job.sh`` as a new process
  (Python start-up included; with the store configured it imports boto3 to check the digest exists);
* ``cli_no_store``: the same without ``NURO_S3_*`` (the digest is taken as given).

Then a 1,000-job burst of held jobs through the in-process path (and through bare sbatch for reference).

    python -m bench.bench_submit_latency [--rounds 30] [--burst 1000] [--port-base 14800]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, cluster, save
from nuro.datasets.snapshot import snapshot
from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.jobspec.codepin import pin_code
from nuro.jobspec.pins import resolve_dataset
from nuro.jobspec.render import render_submission
from nuro.jobspec.submission import apply_submission, plan_submission, spec_from
from nuro.objectstore import ObjectStore
from nuro.slurm import CliBackend

POLICY = REPO / "examples" / "policy" / "teams.yaml"
USER = "alice"
COMMON = ["--hold", "-N2", "--gpus-per-node=1", "-t", "5"]


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def worker(repo: Path, digest: str, run_root: Path, rounds: int, burst: int) -> dict:
    """Runs as the team member; returns the measurements."""
    backend = CliBackend()
    flags = {"name": "bench", "team": "perception", "nodes": "2", "gpus_per_node": "1", "time_limit": "5",
             "dataset": f"imagenet@{digest}", "code.repo": str(repo), "entrypoint.script": "train.py",
             "run_root": str(run_root)}  # fmt: skip
    spec = spec_from(None, flags)

    def inprocess() -> None:
        apply_submission(plan_submission(spec), backend, ["--hold"])

    planned = plan_submission(spec)
    bare_rendered_argv = ["sbatch", "--parsable", "--hold", *planned.request.args]

    def bare_rendered() -> None:
        subprocess.run(bare_rendered_argv, input=planned.request.script, text=True, capture_output=True, check=True)

    job = str(repo / "job.sh")

    def bare_plain() -> None:
        subprocess.run(["sbatch", "--parsable", *COMMON, job], capture_output=True, check=True, cwd=repo)

    cli_argv = [str(Path(sys.executable).parent / "nuro-sbatch"), "--team", "perception",
                f"--dataset=imagenet@{digest}", "--code", str(repo), "--run-root", str(run_root), "--parsable",
                *COMMON, job]  # fmt: skip

    def cli() -> None:
        subprocess.run(cli_argv, capture_output=True, check=True, cwd=repo)

    no_store = {k: v for k, v in os.environ.items() if not k.startswith("NURO_S3_")}

    def cli_no_store() -> None:  # the digest is taken as given: no boto3 import, no S3 round trip
        subprocess.run(cli_argv, capture_output=True, check=True, cwd=repo, env=no_store)

    paths = {"bare_rendered": bare_rendered, "inprocess": inprocess, "bare_plain": bare_plain, "cli": cli,
             "cli_no_store": cli_no_store}  # fmt: skip
    for fn in paths.values():  # warm-up: imports, page cache, slurmctld's first-use costs
        fn()
    samples: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(rounds):
        for name, fn in paths.items():
            samples[name].append(_timed(fn))

    def median_ms(fn) -> float:
        return round(statistics.median(_timed(fn) for _ in range(rounds)) * 1000, 2)

    imports = [sys.executable, "-c", "import nuro.login.sbatch_cli"]
    breakdown_ms = {
        "plan": median_ms(lambda: plan_submission(spec)),
        "pin_code_git": median_ms(lambda: pin_code(str(repo), require_paths=["train.py"])),
        "resolve_dataset_s3_head": median_ms(lambda: resolve_dataset(spec.dataset)),
        "render": median_ms(lambda: render_submission(spec, planned.pins)),
        "cli_python_start_and_imports": median_ms(lambda: subprocess.run(imports, check=True)),
    }
    bare_burst = _timed(lambda: [bare_rendered() for _ in range(burst)])
    nuro_burst = _timed(lambda: [inprocess() for _ in range(burst)])
    med = {k: statistics.median(v) for k, v in samples.items()}
    return {
        "rounds": rounds,
        "median_ms": {k: round(v * 1000, 2) for k, v in med.items()},
        "p90_ms": {k: round(sorted(v)[int(0.9 * (len(v) - 1))] * 1000, 2) for k, v in samples.items()},
        "inprocess_over_bare_ratio": round(med["inprocess"] / med["bare_rendered"], 3),
        "cli_over_bare_ratio": round(med["cli"] / med["bare_plain"], 3),
        "cli_no_store_over_bare_ratio": round(med["cli_no_store"] / med["bare_plain"], 3),
        "breakdown_median_ms": breakdown_ms,
        "burst_jobs": burst,
        "burst_inprocess_submits_per_s": round(burst / nuro_burst, 1),
        "burst_bare_submits_per_s": round(burst / bare_burst, 1),
        "jobs_in_queue_after": len(backend.jobs()),
    }


def _setup_policy(env: dict[str, str]) -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "nuro-admin"), "policy", "apply", str(POLICY)],
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=300)  # fmt: skip
    if out.returncode != 0:
        raise SystemExit(f"policy apply failed:\n{out.stdout}\n{out.stderr}")


def _setup_repo(base: Path, env: dict[str, str]) -> Path:
    repo = base / "vision"
    repo.mkdir()
    (repo / "train.py").write_text("print('train')\n")
    (repo / "job.sh").write_text("#!/bin/bash\ntrue\n")
    subprocess.run(["chown", "-R", USER, str(base)], check=True)
    git_env = {"GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "a",
               "GIT_COMMITTER_EMAIL": "a@x"}  # fmt: skip
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "one"]):
        subprocess.run(["runuser", "-u", USER, "--", "env", *(f"{k}={v}" for k, v in git_env.items()), "git", "-C",
                        str(repo), *args], check=True)  # fmt: skip
    return repo


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--port-base", type=int, default=14800)
    ap.add_argument("--worker", nargs=3, metavar=("REPO", "DIGEST", "RUN_ROOT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        repo, digest, run_root = args.worker
        print(json.dumps(worker(Path(repo), digest, Path(run_root), args.rounds, args.burst)))
        return
    ensure_unix_users(POLICY_USERS)
    with cluster(8, args.port_base, "submit-latency") as (_layout, env, _up), tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        base.chmod(0o755)
        _setup_policy(env)
        data = base / "imagenet"
        data.mkdir()
        (data / "part-0.bin").write_bytes(b"\x01" * 4096)
        digest = snapshot(ObjectStore.from_env(env), data, "imagenet", tag="v1").digest
        repo = _setup_repo(base, env)
        argv = ["runuser", "-u", USER, "--", "env", *(f"{k}={v}" for k, v in env.items()), f"PYTHONPATH={REPO}",
                sys.executable, "-m", "bench.bench_submit_latency", "--rounds", str(args.rounds), "--burst",
                str(args.burst), "--worker", str(repo), digest, str(base / "runs")]  # fmt: skip
        out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            raise SystemExit(f"worker failed:\n{out.stdout}\n{out.stderr}")
        result = json.loads(out.stdout.strip().splitlines()[-1])
    save("submit_latency", {"nodes": 8, "user": USER, "bridge": "job_submit.lua with the example policy", **result})


if __name__ == "__main__":
    main()

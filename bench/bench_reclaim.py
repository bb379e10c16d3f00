"""Reclaim latency: a lender's guaranteed job submitted → running, before vs after issue 30, same run.

The scenario (8-node dev cluster, the example policy with a 20 s grace): perception fills its 24-GPU quota and
borrows an 8-GPU node (its borrower traps USR1 and acknowledges at once through whatever channel its code version
uses), the other teams fill the remaining nodes, then prediction submits a guaranteed 8-GPU job. The only way to
start it is to reclaim the borrower. Measured: the claimant's submit → RUNNING (p50, p99, worst over the rounds), per

* code: ``before`` = the controller, ``nuro-job`` and SDK at ``--before-ref`` (the comment as the channel: a signed
  ``preempt`` mark merged into the job comment, the job's ``ack`` written there too), run from a copy of that commit
  on ``PYTHONPATH``; ``after`` = this checkout (the controller's ledger, the admin-comment note, the ack through the
  node agent's heartbeats);
* borrower comment: ``plain`` (a short one) or ``full`` (1,001 bytes of plain text: issue 30's reproduction, no room
  left under Slurm's 1,024-byte cap).

A claimant not running after ``--timeout-s`` is reported as ``never`` (the reclaim failed). Both variants run the
same controller cadence (``--interval-s``, 0.5 s) and against the same cluster, alternating, so a slow machine
shifts both.

    python -m bench.bench_reclaim --rounds 3             # ~20 min
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import REPO, cluster, poll, save
from nuro.devcluster.layout import Layout
from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.slurm import CliBackend, JobPhase

BIN = Path(sys.executable).parent
TEAMS = {"perception": "alice", "prediction": "priya", "controls": "chen", "simulation": "sam"}
#: the commit before issue 30 (the comment channel), the default "before"
BEFORE_REF = "c270996"
GRACE_S = 20
#: where each top-level folder lives in the ``nuro`` namespace (setup.cfg ``package_dir``)
NAMESPACE = {"login": "login", "wrappers": "wrappers", "slurm_plugins": "slurm_plugins",
             "prolog_epilog": "prolog_epilog", "healthcheck": "healthcheck", "admin": "admin",
             "devcluster": "devcluster"}  # fmt: skip


def before_tree(ref: str, into: Path) -> Path:
    """A ``PYTHONPATH`` dir holding the ``nuro`` package as it was at ``ref`` (namespace folders copied in)."""
    src = into / "src"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(src), ref], check=True,
                   capture_output=True)  # fmt: skip
    shim = into / "path"
    shutil.copytree(src / "nuro", shim / "nuro")
    for name, folder in NAMESPACE.items():
        shutil.copytree(src / folder, shim / "nuro" / name)
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(src)], check=False)
    shim.chmod(0o755)
    for p in shim.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return shim


def job_script(code: str, shim: Path | None) -> str:
    """The borrower (and filler) job: acknowledge a preemption at once, otherwise sleep."""
    # -P: no working directory on sys.path (the job's is this checkout, whose ``nuro`` would shadow the old one)
    old = f"env PYTHONPATH={shim} {sys.executable} -P -c 'from nuro.wrappers.jobchannel import main; main()'"
    nj = old if shim else str(BIN / "nuro-job")
    return (f"#!/bin/bash\non_usr1() {{ {nj} ack --step 42; }}\ntrap on_usr1 USR1\n"
            f"for i in $(seq 900); do sleep 1; done\n")  # fmt: skip


def submit(env: dict[str, str], team: str, script: str, comment: str | None = None) -> int:
    argv = ["runuser", "-u", TEAMS[team], "--", "env", *(f"{k}={v}" for k, v in env.items()), "sbatch",
            "--parsable", f"--account={team}", "--output=/dev/null", "--requeue", "--gres=gpu:8", "--exclusive",
            *([f"--comment={comment}"] if comment else [])]  # fmt: skip
    res = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=60, check=True, cwd="/tmp")
    return int(res.stdout.strip().split(";")[0])


wait = poll


def phase(backend: CliBackend, job_id: int) -> JobPhase | None:
    job = backend.find_job(job_id)
    return job.phase if job else None


def clear(env: dict[str, str], backend: CliBackend) -> None:
    for user in TEAMS.values():
        subprocess.run(["scancel", "-u", user], env=env, check=False, capture_output=True)
    members = set(TEAMS.values())
    wait(lambda: not [j for j in backend.jobs() if j.user in members and not j.phase.is_terminal], 120, 0.5)
    wait(lambda: all(n.gpus_alloc == 0 for n in backend.nodes()), 120, 0.5)


def one(layout: Layout, env: dict[str, str], policy: Path, code: str, shim: Path | None, full: bool,
        timeout_s: float, interval_s: float) -> dict:  # fmt: skip
    """One reclaim with ``code``'s controller and job channel; the claimant's submit → running."""
    backend = CliBackend(env=env, timeout_s=30)
    clear(env, backend)
    log = layout.root / f"bench-controller-{code}.log"
    argv = [sys.executable, "-P", "-m", "nuro.slurm_plugins.controller.daemon", "--policy", str(policy),
            "--interval-s", str(interval_s), "--heartbeat-key", str(layout.heartbeat_key)]  # fmt: skip
    penv = {**env, "PATH": f"{BIN}:/usr/bin:/bin"}
    if shim is not None:
        penv["PYTHONPATH"] = str(shim)
    else:
        argv += ["--state-dir", str(layout.controller_state)]
    with open(log, "a") as out:
        proc = subprocess.Popen(argv, env={**os.environ, **penv}, stdout=out, stderr=subprocess.STDOUT, cwd="/")
    if shim is not None:  # the old code, not this checkout's: its marks are signed (nuro.protocol.marks)
        check = subprocess.run([sys.executable, "-P", "-c", "import nuro.protocol.marks, sys; print(nuro.__file__)"],
                               env={**os.environ, **penv}, capture_output=True, text=True, cwd="/")  # fmt: skip
        assert check.returncode == 0 and str(shim) in check.stdout, (check.stdout, check.stderr)
    try:
        script = job_script(code, shim)
        guaranteed = [submit(env, "perception", script) for _ in range(3)]
        wait(lambda: all(phase(backend, j) == JobPhase.RUNNING for j in guaranteed), 90)
        borrower = submit(env, "perception", script, "x" * 1001 if full else "my run")
        ok = wait(lambda: phase(backend, borrower) == JobPhase.RUNNING, 90)
        fillers = [submit(env, t, script) for t in ("simulation", "simulation", "controls", "prediction")]
        wait(lambda: all(phase(backend, j) == JobPhase.RUNNING for j in fillers), 90)
        time.sleep(2)  # let the borrower's first beats (its node agent's) reach the controller
        t0 = time.monotonic()
        claimant = submit(env, "prediction", script)
        started = wait(lambda: phase(backend, claimant) == JobPhase.RUNNING, timeout_s, 0.05)
        latency = time.monotonic() - t0 if started else None
        requeued = backend.find_job(borrower)
        return {"code": code, "comment": "full" if full else "plain", "borrowed": bool(ok),
                "claimant_running_s": round(latency, 2) if latency is not None else None,
                "borrower_restarts": requeued.restart_count if requeued else None}  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def summary(rows: list[dict]) -> dict:
    out = {}
    for code in ("before", "after"):
        for comment in ("plain", "full"):
            rs = [r for r in rows if r["code"] == code and r["comment"] == comment]
            vals = sorted(r["claimant_running_s"] for r in rs if r["claimant_running_s"] is not None)
            never = sum(r["claimant_running_s"] is None for r in rs)
            out[f"{code}/{comment}"] = {
                "runs": len(rs), "never": never,
                "p50_s": round(statistics.median(vals), 2) if vals else None,
                "p99_s": round(vals[min(len(vals) - 1, int(0.99 * len(vals)))], 2) if vals else None,
                "worst_s": "never" if never else (vals[-1] if vals else None),
            }  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before-ref", default=BEFORE_REF)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--interval-s", type=float, default=0.5)
    ap.add_argument("--port-base", type=int, default=18800)
    args = ap.parse_args()
    ensure_unix_users(POLICY_USERS)
    with (
        tempfile.TemporaryDirectory(prefix="nuro-before-") as tmp,
        cluster(8, args.port_base, "reclaim") as (layout, env, _),
    ):
        Path(tmp).chmod(0o755)
        shim = before_tree(args.before_ref, Path(tmp))
        raw = yaml.safe_load((REPO / "examples" / "policy" / "teams.yaml").read_text())
        raw.update(grace_s=GRACE_S, min_run_s=0)
        policy = layout.root / "bench-teams.yaml"
        policy.write_text(yaml.safe_dump(raw))
        subprocess.run([str(BIN / "nuro-admin"), "policy", "apply", str(policy)], env={**os.environ,
                       **env}, check=True, capture_output=True)  # fmt: skip
        rows = []
        for r in range(args.rounds):
            for full in (False, True):
                for code, path in (("before", shim), ("after", None)):
                    row = one(layout, env, policy, code, path, full, args.timeout_s, args.interval_s)
                    row["round"] = r
                    print(row, flush=True)
                    rows.append(row)
        save("reclaim", {"rounds": args.rounds, "before_ref": args.before_ref, "grace_s": GRACE_S,
                         "interval_s": args.interval_s, "timeout_s": args.timeout_s, "summary": summary(rows),
                         "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()

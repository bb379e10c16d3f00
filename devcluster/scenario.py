"""The "survive a node loss" scenario on the dev cluster, shared by ``make demo``, the e2e tests and the resume bench.

One real run: the example DDP job (``examples/train_ddp``) is submitted with ``nuro-train submit`` as a team member
on 2 nodes, checkpoints to SeaweedFS, and one of its nodes is crashed like a host (``devcluster kill-node``). What
happens next is nuro's and Slurm's: detection, DOWN+DRAIN, requeue, restart elsewhere, restore, finish. Steps are
plain functions so each caller keeps its own pacing and assertions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from nuro.devcluster.users import POLICY_USERS, ensure_unix_users
from nuro.jobspec.codepin import CodePin
from nuro.jobspec.pins import DatasetPin
from nuro.jobspec.record import comment_json, run_record
from nuro.metrics.sink import sink_from_env
from nuro.runs import report
from nuro.slurm import CliBackend, JobInfo, JobPhase

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_ddp"
DEEPSPEED_EXAMPLE = REPO / "examples" / "train_deepspeed"
#: the DeepSpeed example's config (in its repository), given with ``submit(..., deepspeed=True)``
DEEPSPEED_CONFIG = "ds_zero2.json"
BIN = Path(sys.executable).parent
T = TypeVar("T")


class ScenarioError(RuntimeError):
    """A step of the scenario failed; the message has the command and its output."""


@dataclass(frozen=True)
class Run:
    job_id: int
    name: str
    team: str
    log: Path


def run_cmd(
    argv: list[str], env: dict[str, str], user: str | None = None, cwd: Path | None = None, timeout_s: float = 300
) -> subprocess.CompletedProcess:
    shown = " ".join(argv)  # the command, never the environment: it carries the S3 secret and the metrics token
    if user:
        argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items()), *argv]
    res = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=timeout_s, cwd=cwd)
    if res.returncode != 0:
        raise ScenarioError(f"{shown} failed ({res.returncode}):\n{res.stderr or res.stdout}")
    return res


def wait_for(what: str, check: Callable[[], T], timeout_s: float, poll_s: float = 0.5) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ScenarioError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def prepare(
    env: dict[str, str],
    work: Path,
    user: str = "alice",
    dataset: str = "demo-synth",
    apply_policy: bool = True,
    example: Path = EXAMPLE,
) -> tuple[str, Path]:
    """Team policy, the synthetic dataset snapshot, and a git repository of the example; returns (dataset, repo).
    ``example``: the DDP example, or ``DEEPSPEED_EXAMPLE`` (its own dataset: pass ``dataset="demo-tracks"``)."""
    ensure_unix_users(POLICY_USERS)
    if apply_policy:
        run_cmd([str(BIN / "nuro-admin"), "policy", "apply", str(REPO / "examples/policy/teams.yaml")], env)
    data = work / "data"
    # made afresh: a file left by an earlier demo (an older example wrote data/train.npy) would be snapshotted too
    # and become a sample of another size than the rows (seen: "stack expects each tensor to be equal size")
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    run_cmd([sys.executable, str(example / "make_dataset.py"), str(data)], env)
    snap = json.loads(
        run_cmd(
            [str(BIN / "nuro-train"), "dataset", "snapshot", str(data), "--name", dataset, "--json", "--no-progress"],
            env,
        ).stdout
    )
    repo = work / "code"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(example, repo, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=nuro", "-c", "user.email=nuro@example.invalid", "-C", str(repo)]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "example training code"]):
        run_cmd(git + argv, {})
    (work / "runs").mkdir(exist_ok=True)
    run_cmd(["chown", "-R", f"{user}:{user}", str(work)], {})
    return f"{dataset}@{snap['digest']}", repo


def submit(
    env: dict[str, str],
    work: Path,
    dataset: str,
    repo: Path,
    *,
    user: str = "alice",
    team: str = "perception",
    nodes: int = 2,
    spare_nodes: int = 0,
    steps: int = 240,
    step_time_s: float = 0.1,
    ckpt_interval_s: int = 4,
    ckpt_keep: int = 100,
    progress_every_s: float = 1.0,
    name: str | None = None,
    script_args: tuple[str, ...] = (),
    deepspeed: bool = False,
    resume_from: int | None = None,
    time_limit: str = "15:00",
    max_requeues: int | None = None,
    extra_env: dict[str, str] | None = None,
    snapshot_interval_s: int = 0,
) -> Run:
    """``nuro-train submit`` of the example in ``repo`` as ``user``; ``deepspeed``: the DeepSpeed example (launcher
    deepspeed with its ZeRO-2 config). ``time_limit``: per attempt, in sbatch's forms; ``max_requeues``: the job's
    requeue budget (None: nuro-train's default); ``extra_env``: more environment for the training processes, as
    ``--env KEY=VALUE``, except ``NURO_*`` names, which ``--env`` refuses (nuro's own): those are set in the
    submitting environment, which sbatch hands to the job (its default ``--export=ALL``); ``snapshot_interval_s``:
    ``--snapshot-interval`` (in-memory snapshots; 0 = off)."""
    extra_env = extra_env or {}
    own = {k: v for k, v in extra_env.items() if k.startswith("NURO_")}
    name = name or f"{'ds' if deepspeed else 'ddp'}-{int(time.time() * 1000) % 10**9}"
    argv = [
        str(BIN / "nuro-train"), "submit", "--name", name, "--team", team, "--nodes", str(nodes),
        *(["--spare-nodes", str(spare_nodes)] if spare_nodes else []),
        "--gpus-per-node", "1", "--time", time_limit, "--dataset", dataset, "--code", str(repo), "--script", "train.py",
        "--arg", "--steps", "--arg", str(steps), "--arg", "--step-time", "--arg", str(step_time_s),
        "--arg", "--progress-every-s", "--arg", str(progress_every_s),
        *(w for a in script_args for w in ("--arg", a)),
        "--python", sys.executable, "--ckpt-interval", str(ckpt_interval_s), "--ckpt-keep", str(ckpt_keep),
        "--run-root", str(work / "runs"),
        *(["--deepspeed-config", DEEPSPEED_CONFIG] if deepspeed else []),
        *(["--resume-from", str(resume_from)] if resume_from else []),
        *(["--max-requeues", str(max_requeues)] if max_requeues is not None else []),
        *(["--snapshot-interval", str(snapshot_interval_s)] if snapshot_interval_s else []),
        *(w for k, v in extra_env.items() if k not in own for w in ("--env", f"{k}={v}")),
        "--env", "GLOO_SOCKET_IFNAME=lo", "--json",
    ]  # fmt: skip
    res = json.loads(run_cmd(argv, {**env, **own}, user=user, cwd=work).stdout)
    job_id = int(res["job_id"])
    return Run(job_id=job_id, name=name, team=team, log=work / "runs" / name / f"slurm-{job_id}.out")


def kill_node(env: dict[str, str], node: str) -> dict:
    """Crash ``node`` like a host: its slurmd, its job processes and its agent (``devcluster kill-node``)."""
    return json.loads(run_cmd([str(BIN / "nuro-admin"), "devcluster", "kill-node", node, "--json"], env).stdout)


def revive_node(env: dict[str, str], node: str) -> None:
    run_cmd([str(BIN / "nuro-admin"), "devcluster", "revive-node", node], env)


def revive_and_wait(env: dict[str, str], node: str, timeout_s: float = 60) -> bool:
    """Revive ``node`` and wait until the detector has put it back in service (no DOWN, DRAIN, NOT_RESPONDING);
    False when it was not back within ``timeout_s`` (the caller decides whether that matters)."""
    revive_node(env, node)
    backend = CliBackend(env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = next((n for n in backend.nodes() if n.name == node), None)
        if info is not None and not info.flags & {"DOWN", "DRAIN", "NOT_RESPONDING"}:
            return True
        time.sleep(0.5)
    return False


def steps_logged(log: Path) -> list[tuple[float, int]]:
    """``(line number, step)`` for each ``step N loss X`` line rank 0 printed (the output file is appended to)."""
    if not log.exists():
        return []
    found = []
    for n, line in enumerate(log.read_text(errors="replace").splitlines()):
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "step" and parts[1].isdigit():
            found.append((n, int(parts[1])))
    return found


def metrics_view(env: dict[str, str], job_id: int, backend: CliBackend, plot: bool = True) -> tuple[dict, str | None]:
    """What ``nuro-train metrics JOB [--plot]`` shows, read with the cluster's env (its ``NURO_METRICS_URL``).

    Returns (the summary, the plot text or None). Raises ``nuro.metrics.sink.SinkError`` when the sink cannot be
    read, LookupError/SlurmError when the job cannot be found.
    """
    sink = sink_from_env(env)
    try:
        ref = report.resolve_run(backend, job_id)
        train, gpus = report.read_rows(sink, ref, time.time_ns())
    finally:
        sink.close()
    summary = report.summarize(ref, train, gpus)
    text = report.plot_text(report.plot_series(train), width=100, height=24) if plot and train else None
    return summary, text


def mlflow_url(env: dict[str, str], job_id: int) -> str | None:
    """The job's run page in the cluster's MLflow (``nuro-train open JOB``), None until the bridge mirrored it."""
    res = subprocess.run([str(BIN / "nuro-train"), "open", str(job_id)], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    return res.stdout.strip() if res.returncode == 0 else None


def listed_jobs(n: int) -> list[JobInfo]:
    """``n`` running nuro jobs of team perception as Slurm would list them (a ``nuro`` record in the comment):
    the MLflow bridge's input in its bench and tests, without a cluster."""
    out = []
    for i in range(n):
        meta = run_record(team="perception", dataset=DatasetPin("bench", "sha256:" + "0" * 64),
                          code=CodePin("/r", "a" * 40), ckpt_interval_s=600, ckpt_keep=3, max_requeues=3,
                          name=f"bench-{i}", entry={"launcher": "torchrun", "script": "t.py", "args": []})  # fmt: skip
        out.append(JobInfo(job_id=1000 + i, name=f"bench-{i}", user="alice", state="RUNNING",
                           phase=JobPhase.RUNNING, account="perception", comment=comment_json(meta),
                           nodes=("gpu001",), node_count=1))  # fmt: skip
    return out

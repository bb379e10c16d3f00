"""The rendered script's own logic, run by bash: launch line, stop signals, requeue budget (T6), failure vs stop.

``srun``/``scontrol`` are small stand-ins on PATH (srun runs its command locally; scontrol answers the two queries
the script makes and records a requeue), and the "interpreter" is a script that records its argv and behaves as
told. Real Slurm and the real checkout are covered by tests/integration/test_submit.py; this pins down the shell
logic every run depends on, quickly and without a cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nuro.jobspec import build_spec
from nuro.jobspec.codepin import pin_code
from nuro.jobspec.pins import DatasetPin
from nuro.jobspec.render import Pins, render_submission
from nuro.protocol.contract import EXIT_REQUEUE
from tests.unit.test_codepin import git

DIGEST = "sha256:" + "3f" * 32

SRUN = """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec "$@"
"""
SCONTROL = """#!/bin/sh
case "$1 $2" in
  "show hostnames") echo gpu001 ;;
  "show node") echo "NodeName=gpu001 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=box" ;;
  "requeue "*) echo "$2" >> "$FAKE_DIR/requeued" ;;
  *) echo "unexpected scontrol $*" >&2; exit 1 ;;
esac
"""
PYTHON = """#!/bin/bash
if [ "$1 $2 $3" = "-m nuro.wrappers.launch --step" ]; then  # the real step wrapper: relays signals, folds verdicts
  printf '%s\\n' "$@" > "$FAKE_DIR/step_argv"; exec "$REAL_PYTHON" "$@"
fi
printf '%s\\n' "$PWD" "$@" > "$FAKE_DIR/argv"
env | grep -E '^(NURO_|MY_)' | sort > "$FAKE_DIR/env"
case "$FAKE_MODE" in
  exit:*) exit "${FAKE_MODE#exit:}" ;;
  write-verdict:*) f="${FAKE_MODE#write-verdict:}"; mkdir -p "$(dirname "$f")"
        echo '{"kind": "requeue", "exit_code": 75, "why": "lost a peer", "node": 0, "at": 1.0}' > "$f"; exit 137 ;;
  usr2) trap 'echo got-usr2 >> "$FAKE_DIR/signals"; exit 75' USR2; touch "$FAKE_DIR/ready"
        while :; do sleep 0.05; done ;;
esac
"""


@pytest.fixture
def job(tmp_path: Path):
    """A real repo, fake Slurm tools and a renderer for a 1-node CPU job; returns (script path, env)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "train.py").write_text("print('hi')\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", SRUN), ("scontrol", SCONTROL), ("python", PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    spec = build_spec({
        "name": "t", "team": "perception", "dataset": f"imagenet@{DIGEST}", "code.repo": str(repo),
        "entrypoint.script": "train.py", "entrypoint.args": ["--epochs", "2"], "gpus_per_node": 0,
        "entrypoint.python": str(bin_dir / "python"), "env": {"MY_VAR": "x"}, "max_requeues": 2,
        "run_root": str(tmp_path / "runs"),
    })  # fmt: skip
    req = render_submission(spec, Pins(pin_code(str(repo)), DatasetPin("imagenet", DIGEST)))
    script = tmp_path / "job.sh"
    script.write_text(req.script)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_DIR": str(tmp_path), "SLURM_JOB_ID": "4711",
        "SLURM_JOB_NODELIST": "gpu001", "SLURM_JOB_NUM_NODES": "1", "REAL_PYTHON": sys.executable,
    }  # fmt: skip
    return script, env, tmp_path


def run(script: Path, env: dict, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env={**env, **extra}, capture_output=True, text=True, timeout=60)


def test_launch_line_runs_nuro_launch_per_node_inside_the_step_wrapper(job) -> None:
    script, env, d = job
    out = run(script, env, FAKE_MODE="exit:0")
    assert out.returncode == 0 and "nuro: run finished" in out.stdout, out.stderr
    python = str(d / "bin" / "python")
    assert (d / "step_argv").read_text().splitlines() == [
        "-m", "nuro.wrappers.launch", "--step", "--", "srun", "--nodes=1", "--ntasks-per-node=1",
        "--kill-on-bad-exit=1", python, "-m", "nuro.wrappers.launch", "--launcher=direct", "--nproc-per-node=1", "--",
        "train.py", "--epochs", "2",
    ]  # fmt: skip
    cwd, *argv = (d / "argv").read_text().splitlines()
    assert cwd == str(d / "runs" / "t" / "4711" / "code")
    assert argv == [
        "-m", "nuro.wrappers.launch", "--launcher=direct", "--nproc-per-node=1", "--", "train.py", "--epochs", "2",
    ]  # fmt: skip
    env_lines = (d / "env").read_text()
    assert "MY_VAR=x" in env_lines and "NURO_DATASET_DIGEST=" + DIGEST in env_lines
    assert f"NURO_RDZV_ADDR=127.0.0.1\nNURO_RDZV_PORT={29500 + 4711 % 1000}\n" in env_lines
    assert f"NURO_LAUNCH_DIR={d}/runs/t/4711/launch" in env_lines
    assert not (d / "requeued").exists()


def test_the_step_folds_a_node_verdict_over_srun_status(job) -> None:
    """srun reports the maximum over tasks (137 for a task killed by --kill-on-bad-exit); the verdict says 75."""
    script, env, d = job
    verdict = d / "runs" / "t" / "4711" / "launch" / "attempt-0" / "node-0.json"
    mode = f"write-verdict:{verdict}"
    out = run(script, env, FAKE_MODE=mode)
    assert out.returncode == EXIT_REQUEUE, out.stdout + out.stderr
    assert "srun exit 137, launch verdict 75" in out.stdout and "nuro: requeue 1 of 2 (exit 75)" in out.stdout


def test_exit_requeue_requeues_within_the_budget(job) -> None:
    script, env, d = job
    out = run(script, env, FAKE_MODE=f"exit:{EXIT_REQUEUE}", SLURM_RESTART_COUNT="1")
    assert out.returncode == EXIT_REQUEUE and "nuro: requeue 2 of 2 (exit 75)" in out.stdout, out.stderr
    assert (d / "requeued").read_text() == "4711\n"


def test_spent_budget_stops_for_good(job) -> None:
    script, env, d = job
    out = run(script, env, FAKE_MODE=f"exit:{EXIT_REQUEUE}", SLURM_RESTART_COUNT="2")
    assert out.returncode == EXIT_REQUEUE and "requeue budget spent (2 of 2)" in out.stderr
    assert not (d / "requeued").exists()


def test_a_failure_is_not_requeued(job) -> None:
    script, env, d = job
    out = run(script, env, FAKE_MODE="exit:3")
    assert out.returncode == 3 and "a failure, not a stop; not requeued" in out.stderr
    assert not (d / "requeued").exists()


def test_time_limit_signal_is_forwarded_once_and_the_job_requeues(job) -> None:
    script, env, d = job
    proc = subprocess.Popen(["bash", str(script)], env={**env, "FAKE_MODE": "usr2"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (d / "ready").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR2)  # Slurm's --signal=B:USR2 reaches the batch shell only
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == EXIT_REQUEUE, err
    assert (d / "signals").read_text() == "got-usr2\n"
    assert "nuro: requeue 1 of 2 (time_limit)" in out
    assert (d / "requeued").read_text() == "4711\n"

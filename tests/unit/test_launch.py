"""nuro-launch without a cluster: the torchrun command as data, node addresses, verdict files, and node mode run
against a stand-in "python" (records its argv and signal dispositions, then behaves as told) — no torch needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nuro.wrappers import launch
from nuro.wrappers.launch import LaunchError, plan_torchrun, rdzv_port
from nuro.wrappers.launch_outcome import Kind
from tests.clocks import SleepClock

ENV = {"SLURM_JOB_ID": "4711", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "1"}


def plan(env: dict[str, str] | None = None, **kw: object) -> launch.TorchrunPlan:
    args = {"nproc_per_node": 8, "python": "/venv/bin/python", "local_addr": "10.0.0.2", "error_file": "/t/err.json",
            "log_dir": "/t/logs", **kw}  # fmt: skip
    return plan_torchrun({**ENV, **(env or {})}, ["train.py", "--lr=3e-4"], **args)  # type: ignore[arg-type]


def test_torchrun_command_is_a_pure_function_of_the_slurm_env() -> None:
    p = plan({"NURO_RDZV_ADDR": "10.0.0.1", "NURO_RDZV_PORT": "30211"})
    assert p.argv == (
        "/venv/bin/python", "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1", "--nproc-per-node=8",
        "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:30211", "--rdzv-id=4711", "--local-addr=10.0.0.2",
        "--max-restarts=0", "--monitor-interval=0.5", "--log-dir=/t/logs", "--tee=2", "train.py", "--lr=3e-4",
    )  # fmt: skip
    assert p.env["TORCHELASTIC_ERROR_FILE"] == "/t/err.json"
    assert p.env["NURO_PG_TIMEOUT_S"] == p.env["TORCH_NCCL_TIMEOUT"] == "60"
    assert "GLOO_SOCKET_IFNAME" not in p.env  # a dev-cluster setting: comes from the job's environment, never here
    assert plan({"NURO_RDZV_ADDR": "a"}) == plan({"NURO_RDZV_ADDR": "a"})


def test_port_from_job_id_and_address_from_the_resolver_when_the_script_gave_none() -> None:
    p = plan(rdzv_addr="10.0.0.9", pg_timeout_s=30)
    assert f"--rdzv-endpoint=10.0.0.9:{rdzv_port(4711)}" in p.argv and rdzv_port(4711) == 29500 + 711
    assert p.env["NURO_PG_TIMEOUT_S"] == "30"


@pytest.mark.parametrize(
    "env,kw,text",
    [
        ({"SLURM_JOB_ID": ""}, {"rdzv_addr": "x"}, "SLURM_JOB_ID is not set"),
        ({}, {}, "no rendezvous address"),
        ({}, {"rdzv_addr": "x", "script": []}, "no training script"),
    ],  # fmt: skip
)
def test_missing_inputs_are_named(env: dict, kw: dict, text: str) -> None:
    script = kw.pop("script", ["t.py"])
    with pytest.raises(LaunchError, match=text):
        plan_torchrun({**ENV, **env}, script, nproc_per_node=1, python="p", local_addr="l", error_file="e",
                      log_dir="d", **kw)  # fmt: skip


def test_node_addr_reads_nodeaddr_and_falls_back_to_the_name() -> None:
    line = "NodeName=gpu002 Arch=x86_64 CoresPerSocket=1 NodeAddr=127.0.0.1 NodeHostName=box Version=22.05.8"

    def fake(argv, **_):  # noqa: ANN001, ANN202
        assert argv == ["scontrol", "show", "node", "-o", "gpu002"]
        return subprocess.CompletedProcess(argv, 0, line, "")

    assert launch.node_addr("gpu002", run=fake) == "127.0.0.1"
    assert launch.node_addr("gpu002", run=lambda argv, **_: subprocess.CompletedProcess(argv, 1, "", "")) == "gpu002"


def test_parse_args_takes_everything_after_the_double_dash() -> None:
    a = launch.parse_args(["--nproc-per-node=2", "--", "train.py", "--nproc-per-node=9"])
    assert a.nproc_per_node == 2 and a.script == ["train.py", "--nproc-per-node=9"] and not a.step
    with pytest.raises(SystemExit):
        launch.parse_args(["--nproc-per-node=2"])


AGENT = """import os, signal, subprocess, sys, time
# an "agent" that starts a worker in its own session, like torchrun; the worker records signals it gets
worker = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def h(n, f):
    open(sys.argv[1], "a").write(signal.Signals(n).name + "\\\\n")
    if n == signal.SIGTERM: sys.exit(0)
for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM): signal.signal(s, h)
open(sys.argv[1] + ".ready", "w").close()
while True: time.sleep(0.05)
''', sys.argv[1]], start_new_session=True)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # torchrun would stop its workers; the test sends both
worker.wait()
"""


def test_forwarding_reaches_a_worker_in_its_own_session_and_spares_the_agent(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(log)])
    try:
        deadline = time.monotonic() + 20
        while not Path(str(log) + ".ready").exists():
            assert time.monotonic() < deadline and agent.poll() is None
            time.sleep(0.05)
        workers = launch.descendants(agent.pid)
        assert len(workers) == 1 and os.getsid(workers[0].pid) != os.getsid(agent.pid)
        assert launch.forward(signal.SIGUSR1, agent.pid, include_root=False) == [workers[0].pid]
        launch.forward(signal.SIGUSR2, agent.pid, include_root=False)
        launch.forward(signal.SIGTERM, agent.pid, include_root=True)
        assert agent.wait(timeout=20) == 0  # USR1/USR2 never reached the agent (their default action kills)
        deadline = time.monotonic() + 10  # the worker handles its signals on its own schedule
        while len(log.read_text().splitlines()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(log.read_text().splitlines()) == ["SIGTERM", "SIGUSR1", "SIGUSR2"]
    finally:
        agent.kill()


FAKE_TORCHRUN = """#!/bin/bash
printf '%s\\n' "$@" > "$FAKE_DIR/argv"
grep -E '^SigIgn' /proc/self/status > "$FAKE_DIR/sigign"
env | grep -E '^(TORCHELASTIC_ERROR_FILE|NURO_PG_TIMEOUT_S|NURO_RDZV_)' | sort > "$FAKE_DIR/env"
case "$FAKE_MODE" in
  exit:*) exit "${FAKE_MODE#exit:}" ;;
  orphan) setsid sleep 300 & echo $! > "$FAKE_DIR/orphan"; sleep 2.5; exit 0 ;;
  killed)
    cat >&2 <<'SUMMARY'
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_07:40:37
  host      : localhost
  rank      : 1 (local_rank: 0)
  exitcode  : -9 (pid: 28382)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 28382
======================================================
SUMMARY
    exit 1 ;;
esac
"""


@pytest.fixture
def fake(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    py = tmp_path / "python"
    py.write_text(FAKE_TORCHRUN)
    py.chmod(0o755)
    env = {**ENV, "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "NURO_RDZV_ADDR": "127.0.0.1",
           "NURO_LOCAL_ADDR": "127.0.0.1", "FAKE_DIR": str(tmp_path), "NURO_LAUNCH_DIR": str(tmp_path / "launch"),
           "PATH": os.environ["PATH"]}  # fmt: skip
    return py, env


def run_launch(py: Path, env: dict[str, str], mode: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "nuro.wrappers.launch", f"--python={py}", "--", "train.py"]
    return subprocess.run(argv, env={**env, "FAKE_MODE": mode}, capture_output=True, text=True, timeout=60)


def test_node_mode_runs_torchrun_with_training_signals_ignored_and_writes_a_verdict(fake, tmp_path: Path) -> None:
    py, env = fake
    out = run_launch(py, env, "exit:0")
    assert out.returncode == 0, out.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[:2] == ["-m", "torch.distributed.run"] and argv[-1] == "train.py"
    ignored = int((tmp_path / "sigign").read_text().split()[1], 16)
    assert ignored & (1 << (signal.SIGUSR1 - 1)) and ignored & (1 << (signal.SIGUSR2 - 1))
    assert "NURO_PG_TIMEOUT_S=60" in (tmp_path / "env").read_text()
    verdict = json.loads((tmp_path / "launch" / "attempt-0" / "node-0.json").read_text())
    assert verdict["kind"] == Kind.DONE.value and verdict["exit_code"] == 0


def test_node_mode_maps_a_killed_worker_to_requeue_and_a_failure_to_its_code(fake, tmp_path: Path) -> None:
    py, env = fake
    killed = run_launch(py, env, "killed")
    assert killed.returncode == 75 and "killed by SIGKILL" in killed.stderr, killed.stderr
    failed = run_launch(py, {**env, "SLURM_RESTART_COUNT": "1"}, "exit:2")
    assert failed.returncode == 2
    assert json.loads((tmp_path / "launch" / "attempt-1" / "node-0.json").read_text())["kind"] == "failure"


def test_step_mode_folds_verdicts_and_clears_stale_ones(tmp_path: Path) -> None:
    vdir = tmp_path / "launch" / "attempt-0"
    vdir.mkdir(parents=True)
    (vdir / "node-0.json").write_text('{"kind": "failure", "exit_code": 9, "why": "stale", "node": 0, "at": 1}')
    verdict = '{"kind": "requeue", "exit_code": 75, "why": "lost a peer", "node": 1, "at": 2}'
    step = f"mkdir -p {vdir} && echo '{verdict}' > {vdir}/node-1.json && exit 137"
    env = {"NURO_LAUNCH_DIR": str(tmp_path / "launch"), "SLURM_JOB_NUM_NODES": "2", "PATH": os.environ["PATH"]}
    out = subprocess.run([sys.executable, "-m", "nuro.wrappers.launch", "--step", "--", "bash", "-c", step],
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 75, out.stdout + out.stderr
    assert "srun exit 137, launch verdict 75 (node 1: lost a peer)" in out.stdout


def test_node_mode_kills_workers_its_torchrun_left_behind(fake, tmp_path: Path) -> None:
    """A worker outliving its agent escapes linuxproc's tracking; nuro-launch kills the PIDs it saw under torchrun."""
    py, env = fake
    out = run_launch(py, env, "orphan")
    assert out.returncode == 0, out.stderr
    orphan = int((tmp_path / "orphan").read_text())
    assert "left behind" in out.stderr
    deadline = time.monotonic() + 5
    while psutil.pid_exists(orphan) and psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"orphan {orphan} still running"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("kind", "nodes", "stop", "want"),
    [
        ("requeue", 2, None, True),  # lost a peer: give the root cause's node time to write its verdict
        ("stopped", 4, None, True),
        ("requeue", 2, "TERM", False),  # Slurm is tearing the step down (node failure, scancel): do not hold the node
        ("stopped", 2, "INT", False),
        ("requeue", 1, None, False),  # nobody to wait for
        ("failure", 2, None, False),  # a root cause never waits
        ("done", 2, None, False),
    ],
)
def test_only_an_unsignalled_consequence_verdict_waits_for_the_others(kind, nodes, stop, want) -> None:
    from nuro.wrappers.launch_outcome import Kind

    assert launch.should_settle(Kind(kind), nodes, stop) is want


def test_the_step_requeues_itself_when_no_node_goes_down_in_time() -> None:
    clock, asked = SleepClock(), []
    taken = launch.await_node_loss("7", 3.0, job_state=lambda j: asked.append(j) or "RUNNING",
                                   sleep=clock.sleep, clock=clock)  # fmt: skip
    assert taken is False and 3.0 <= clock.now < 4.0 and set(asked) == {"7"}


def test_once_slurm_requeues_the_job_the_step_waits_to_be_ended_and_never_requeues() -> None:
    clock = SleepClock()
    states = iter(["RUNNING", "RUNNING", "SlurmError", "REQUEUED"])

    def state(_job: str) -> str:
        s = next(states, "PENDING")
        if s == "SlurmError":
            raise launch.SlurmError("squeue timed out", returncode=None)
        return s

    taken = launch.await_node_loss("7", 3.0, job_state=state, sleep=clock.sleep, clock=clock)
    # Slurm's kill would have ended the process long before: the wait outlived the node-loss wait by TAKEOVER_WAIT_S
    assert taken is True and clock.now >= launch.TAKEOVER_WAIT_S


@pytest.mark.parametrize(("raw", "want"), [("", 10.0), ("0", 0.0), (" 2.5 ", 2.5)])
def test_node_loss_wait_comes_from_the_env(raw: str, want: float) -> None:
    assert launch.node_loss_wait_s({"NURO_NODE_LOSS_WAIT_S": raw}) == want


@pytest.mark.parametrize("raw", ["ten", "-1", "1e9", "nan"])
def test_a_malformed_node_loss_wait_is_refused_with_the_range(raw: str) -> None:
    with pytest.raises(launch.LaunchError, match="between 0 and 600"):
        launch.node_loss_wait_s({"NURO_NODE_LOSS_WAIT_S": raw})


def test_a_per_node_staging_root_is_resolved_on_the_node_not_on_the_batch_host() -> None:
    env = {"NURO_STAGING_ROOT": "/st/{node}", "SLURM_JOB_ID": "12", "SLURMD_NODENAME": "gpu002"}
    assert launch.with_node_staging_dir(env)["NURO_STAGING_DIR"] == "/st/gpu002/12"
    kept = {**env, "NURO_STAGING_DIR": "/set/by/batch/12"}
    assert launch.with_node_staging_dir(kept) is kept  # a plain root: the batch script's value holds everywhere
    assert "NURO_STAGING_DIR" not in launch.with_node_staging_dir({**env, "SLURMD_NODENAME": ""})


needs_root = pytest.mark.skipif(
    os.geteuid() != 0,
    reason="job records are root-owned (the prolog writes them as root; jobrecord.read refuses any other owner's)",
)


def _prolog_env(root: Path, restart: str | None = None, **extra: str) -> dict[str, str]:
    env = {"NURO_STAGING_ROOT": str(root / "{node}"), "SLURM_JOB_ID": "41", "SLURMD_NODENAME": "gpu003",
           "SLURM_NODEID": "1", **extra}  # fmt: skip
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = restart
    return env


def _record(root: Path, restart: int) -> None:
    from nuro.protocol import jobrecord

    staging = root / "gpu003"
    staging.mkdir(parents=True, exist_ok=True)
    jobrecord.write(staging, jobrecord.JobRecord(41, 0, 0, "root", "perception", "perception", None, restart,
                                                 "gpu003", None))  # fmt: skip


@needs_root
def test_an_attempt_the_prolog_skipped_is_told_apart(tmp_path: Path) -> None:
    """slurmd skips the prolog of a job it still remembers (a 22.05 survivor, a host back from a crash): no record of
    this attempt on the node. Where no nuro prolog runs at all (no records dir), nothing is judged."""
    assert launch.prolog_missing(_prolog_env(tmp_path, "2")) is None  # no nuro prolog on this node
    _record(tmp_path, 2)
    assert launch.prolog_missing(_prolog_env(tmp_path, "2")) is None
    why = launch.prolog_missing(_prolog_env(tmp_path, "3"))
    assert why == ("no prolog ran on gpu003 for attempt 3 of job 41 (its job record is attempt 2's: slurmd skipped "
                   "the prolog)")  # fmt: skip
    assert "(no job record: slurmd skipped it)" in launch.prolog_missing(
        {**_prolog_env(tmp_path), "SLURM_JOB_ID": "42"}
    )
    assert launch.prolog_missing({**_prolog_env(tmp_path, "2"), "NURO_STAGING_ROOT": ""}) is None  # outside nuro


@needs_root
def test_a_node_without_its_prolog_restarts_the_job_at_once_with_its_verdict(tmp_path: Path) -> None:
    """Exit 75 before any worker starts, and a REQUEUE verdict that names why: the step neither trains without the
    prolog (its checkpoints could never commit) nor waits for this node as for a lost one."""
    _record(tmp_path, 0)
    verdicts = tmp_path / "launch"
    args = launch.parse_args(["--verdict-dir", str(verdicts), "--nproc-per-node=1", "--", "train.py"])
    assert launch.run_node(args, _prolog_env(tmp_path, "1")) == launch.EXIT_REQUEUE
    (verdict,) = launch.read_verdicts(verdicts / "attempt-1")
    assert verdict.kind is Kind.REQUEUE and verdict.node == 1 and "no prolog ran on gpu003" in verdict.why

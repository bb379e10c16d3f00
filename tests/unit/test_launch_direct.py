"""nuro-launch --launcher=direct without a cluster: the workers as data, and node mode running real Python workers
(no torch needed: the stand-in training script records what it got and behaves as told)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nuro.wrappers.direct import plan_workers
from nuro.wrappers.launch_outcome import Kind

TRAIN = """import json, os, signal, sys, time
rank = int(os.environ["RANK"])
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_ERROR_FILE", "NURO_PG_TIMEOUT_S", "OMP_NUM_THREADS")
ignored = int(next(l for l in open("/proc/self/status") if l.startswith("SigIgn")).split()[1], 16)
out = {k: os.environ.get(k) for k in keys}
out["usr1_ignored"] = bool(ignored & (1 << (signal.SIGUSR1 - 1)))
open(os.path.join(os.environ["OUT_DIR"], f"rank-{rank}.json"), "w").write(json.dumps(out))
mode = os.environ.get("MODE", "ok")
if mode == "ok":
    sys.exit(0)
if mode == "fail-rank-1":
    if rank == 1:
        time.sleep(0.3)
        raise ValueError("bad learning rate schedule")
    signal.signal(signal.SIGTERM, lambda *_: (open(os.path.join(os.environ["OUT_DIR"], "termed"), "w"), sys.exit(143)))
    time.sleep(60)
if mode == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "peer-lost":
    raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")
if mode == "usr1":
    def on_usr1(*_):
        open(os.path.join(os.environ["OUT_DIR"], f"usr1-{rank}"), "w").close()
        sys.exit(75)
    signal.signal(signal.SIGUSR1, on_usr1)
    open(os.path.join(os.environ["OUT_DIR"], f"ready-{rank}"), "w").close()
    time.sleep(60)
"""


def test_workers_get_torchruns_variables_with_contiguous_ranks() -> None:
    specs = plan_workers(
        ["train.py", "--lr=3e-4"], python="/venv/bin/python", node_id=1, num_nodes=2, nproc_per_node=4,
        master_addr="10.0.0.1", master_port=29711, job_id=4711, error_dir="/t", base_env={"NURO_PG_TIMEOUT_S": "60"},
    )  # fmt: skip
    assert [(s.rank, s.local_rank) for s in specs] == [(4, 0), (5, 1), (6, 2), (7, 3)]
    env = specs[1].env
    assert env["RANK"] == "5" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_RANK"] == "1" and env["MASTER_ADDR"] == "10.0.0.1"
    assert env["MASTER_PORT"] == "29711" and env["TORCHELASTIC_RUN_ID"] == "4711" and env["OMP_NUM_THREADS"] == "1"
    assert env["TORCHELASTIC_ERROR_FILE"] == "/t/rank-5-error.json" and env["NURO_PG_TIMEOUT_S"] == "60"
    assert specs[0].argv == ("/venv/bin/python", "-u", "train.py", "--lr=3e-4")
    one = plan_workers(["t.py"], python="p", node_id=0, num_nodes=1, nproc_per_node=1, master_addr="a",
                       master_port=1, job_id=1, error_dir="/t", base_env={})  # fmt: skip
    assert "OMP_NUM_THREADS" not in one[0].env  # one worker per node: the job's own threads setting stands


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "train.py").write_text(TRAIN)
    env = {"SLURM_JOB_ID": "4711", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "NURO_RDZV_ADDR": "127.0.0.1",
           "NURO_LOCAL_ADDR": "127.0.0.1", "OUT_DIR": str(tmp_path), "NURO_LAUNCH_DIR": str(tmp_path / "launch"),
           "PATH": os.environ["PATH"]}  # fmt: skip
    return tmp_path, env


def launch(d: Path, env: dict[str, str], mode: str, nproc: int = 2, **kw) -> subprocess.Popen:
    argv = [sys.executable, "-m", "nuro.wrappers.launch", "--launcher=direct", f"--nproc-per-node={nproc}",
            "--", str(d / "train.py")]  # fmt: skip
    return subprocess.Popen(argv, env={**env, "MODE": mode}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)  # fmt: skip


def verdict(d: Path) -> dict:
    return json.loads((d / "launch" / "attempt-0" / "node-0.json").read_text())


def test_every_worker_runs_with_its_rank_and_training_signals_ignored(job) -> None:
    d, env = job
    proc = launch(d, env, "ok")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    got = [json.loads((d / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [g["RANK"] for g in got] == ["0", "1"] and {g["WORLD_SIZE"] for g in got} == {"2"}
    assert {g["MASTER_ADDR"] for g in got} == {"127.0.0.1"} and got[0]["MASTER_PORT"] == got[1]["MASTER_PORT"]
    assert all(g["usr1_ignored"] for g in got) and got[0]["NURO_PG_TIMEOUT_S"] == "60"
    assert verdict(d)["kind"] == Kind.DONE.value
    assert "torchrun" not in err.split("argv=")[1].split()[0]  # the worker itself, no agent


def test_one_failed_worker_stops_the_others_and_is_the_verdict(job) -> None:
    d, env = job
    proc = launch(d, env, "fail-rank-1")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert (d / "termed").exists(), "rank 0 was not stopped when rank 1 failed"
    v = verdict(d)
    assert v["kind"] == Kind.FAILURE.value and "rank 1 failed with exit 1: ValueError: bad learning rate" in v["why"]
    assert "ValueError: bad learning rate schedule" in err  # the worker's stderr reaches the job's log


def test_a_killed_worker_or_a_lost_peer_asks_for_a_requeue(job) -> None:
    d, env = job
    for mode, text in (("killed", "killed by SIGKILL"), ("peer-lost", "lost a peer")):
        proc = launch(d, env, mode, nproc=1)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 75, (mode, err)
        assert text in verdict(d)["why"], verdict(d)


def test_usr1_reaches_every_worker_and_their_75_requeues(job) -> None:
    d, env = job
    proc = launch(d, env, "usr1")
    deadline = time.monotonic() + 30
    while not all((d / f"ready-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 75, err
    assert (d / "usr1-0").exists() and (d / "usr1-1").exists()
    assert verdict(d)["kind"] == Kind.REQUEUE.value

"""A straggler report end to end on the real cluster: a node is drained ``nuro-straggler:`` only when Slurm says it is
the reporting job's and its own NVML readings show a slowing clock reason; resumed once they no longer do.

Every part is real: a 2-node Slurm job whose batch step (on the first node) reports the second node to its node
agent's socket every second, as ``StragglerWatch`` does on a flag (``nuro-straggler/1``; the agent checks the sender's
uid from the kernel against the job's root-written record); the agents' heartbeats; the controller's judgement;
Slurm's drain and resume. The flagged node's GPUs come from the fake ``libnvidia-ml.so.1`` (tests/fake_nvml.py): a
node agent with the NVML probe replaces the dev cluster's own (which probes nothing) while the GPU is "throttled".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nuro.devcluster import manager
from nuro.devcluster.layout import PortPlan
from nuro.lifecycle.platform_events import read_events
from nuro.protocol import peerloss
from nuro.slurm import NodeInfo
from tests import fake_nvml
from tests.integration.conftest import LiveCluster, wait_until

pytestmark = [pytest.mark.slurm]

REPORTER, FLAGGED = "gpu003", "gpu004"
THROTTLED = {"gpus": 8, "gpu2.throttle": "0x20", "gpu2.sm_clock": 900}  # SW thermal slowdown
SLOW_TEXT = "gpu2: SM 900 MHz (SW thermal slowdown)"


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake_nvml"))


def _node(cluster: LiveCluster, name: str) -> NodeInfo:
    return next(n for n in cluster.backend.nodes() if n.name == name)


def _agent_status(cluster: LiveCluster, node: str) -> dict:
    return json.loads((cluster.layout.agents_dir / f"{node}.json").read_text())


def _events(cluster: LiveCluster, since: float, kind: str) -> list[dict]:
    return [e for e in read_events(cluster.layout.events_log, since=since, node=FLAGGED) if e["kind"] == kind]


def _nvml_agent(cluster: LiveCluster, lib_dir: Path, tmp_path: Path) -> subprocess.Popen:
    """A node agent for FLAGGED with the NVML probe on the fake library (throttled GPU 2), its own status dir; its
    boot is newer than the dev cluster's agent, so the controller takes its beats from then on."""
    env = fake_nvml.env_for(lib_dir, fake_nvml.write_scenario(tmp_path / "throttled.txt", THROTTLED))
    env.pop("NURO_ENV_FILE", None)
    port = PortPlan(manager.recorded_port_base(cluster.layout)).heartbeat
    key = cluster.layout.heartbeat_key.parent / "heartbeat-nodes" / f"{FLAGGED}.key"
    argv = [sys.executable, "-m", "nuro.healthcheck.agent", "--node", FLAGGED, "--controller", f"127.0.0.1:{port}",
            "--key-file", str(key), "--interval-s", "0.25", "--probe", "nvml", "--status-dir", str(tmp_path / "st"),
            "--log-file", str(tmp_path / "agent.log")]  # fmt: skip
    agent = subprocess.Popen(argv, env=env)
    wait_until(lambda: (tmp_path / "st" / f"{FLAGGED}.json").exists(), 30, "the NVML agent's first beat")
    return agent


def test_a_flagged_node_is_drained_only_when_it_is_the_jobs_and_its_nvml_agrees(
    cluster: LiveCluster, restore: list[str], lib_dir: Path, tmp_path: Path
) -> None:
    restore += [REPORTER, FLAGGED]
    sock = peerloss.socket_path(peerloss.socket_dir(cluster.env), REPORTER)
    report = (f"from pathlib import Path; from nuro.protocol import peerloss; "
              f"peerloss.send_straggler(Path('{sock}'), int('$SLURM_JOB_ID'), '{FLAGGED}', 1.4)")  # fmt: skip
    script = f'#!/bin/bash\nwhile :; do {sys.executable} -c "{report}"; sleep 1; done\n'
    t0 = time.time()
    job_id = cluster.backend.submit(script, "-N2", f"--nodelist={REPORTER},{FLAGGED}", "-o", "/dev/null")
    nvml_agent = None
    own = _agent_status(cluster, FLAGGED)["pid"]
    try:
        wait_until(lambda: (j := cluster.backend.find_job(job_id)) and j.state == "RUNNING", 60, "the job running")
        # 1. the job's word alone (the node's agent probes no GPU slowdown): not acted on, on record
        wait_until(lambda: _events(cluster, t0, "straggler_unconfirmed"), 30, "the unconfirmed report on record")
        assert not _node(cluster, FLAGGED).is_drained
        # 2. its NVML shows a slowing clock reason: drained with it in the reason, on record
        nvml_agent = _nvml_agent(cluster, lib_dir, tmp_path)
        os.kill(own, signal.SIGSTOP)  # its beats (an older boot) are refused from now on anyway
        wait_until(lambda: _node(cluster, FLAGGED).is_drained, 30, f"{FLAGGED} drained as a straggler")
        reason = _node(cluster, FLAGGED).reason or ""
        assert reason == f"nuro-straggler: job {job_id} ran 1.40x slower here; {SLOW_TEXT}", reason
        assert _events(cluster, t0, "node_straggler") and not _node(cluster, REPORTER).is_drained
    finally:
        cluster.run(["scancel", str(job_id)], check=False)
        with contextlib.suppress(ProcessLookupError):  # restarted: a new boot, beats taken over from the NVML agent
            os.kill(own, signal.SIGCONT)
            os.kill(own, signal.SIGTERM)
        with contextlib.suppress(Exception):
            wait_until(lambda: _agent_status(cluster, FLAGGED)["pid"] != own, 30, f"{FLAGGED}'s own agent restarted")
        if nvml_agent is not None:
            nvml_agent.terminate()
            nvml_agent.wait(10)
    # 3. no slowing reason any more (its own agent again): resumed once straggler_clear_s (30 s) has passed
    cleared = time.time()
    wait_until(lambda: not _node(cluster, FLAGGED).is_drained, 75, f"{FLAGGED} resumed once its clocks recovered")
    print(f"\nresumed {time.time() - cleared:.1f} s after its GPUs stopped reporting a slowing reason")
    assert [e for e in read_events(cluster.layout.events_log, since=cleared, node=FLAGGED)
            if e["kind"] == "node_resumed"]  # fmt: skip

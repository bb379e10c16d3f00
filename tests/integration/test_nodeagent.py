"""The real ``nuro-nodeagent`` process: authenticated UDP heartbeats a test socket decodes with nuro.protocol.heartbeat,
health from the fake libnvidia-ml.so.1, a hung NVML call that does not delay beats, the status file, SIGTERM.

No cluster needed: the "controller" is a UDP socket in the test.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro.healthcheck.statusfile import read_status
from nuro.protocol import heartbeat as hb
from tests import fake_nvml

AGENT = [sys.executable, "-m", "nuro.healthcheck.agent"]


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake_nvml"))


@pytest.fixture
def receiver() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5.0)
    yield sock
    sock.close()


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "heartbeat.key"
    hb.write_key(path)
    return path


def _start(lib_dir: Path, tmp_path: Path, port: int, key_file: Path, scenario: dict, *extra: str) -> subprocess.Popen:
    env = fake_nvml.env_for(lib_dir, fake_nvml.write_scenario(tmp_path / "scenario.txt", scenario))
    env.pop("NURO_ENV_FILE", None)
    argv = [
        *AGENT,
        "--node", "gpu007", "--controller", f"127.0.0.1:{port}", "--key-file", str(key_file),
        "--interval-s", "0.2", "--status-dir", str(tmp_path / "status"), "--expect-gpus", "8",
        "--log-file", str(tmp_path / "agent.log"), *extra,
    ]  # fmt: skip
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def _beats(sock: socket.socket, key: bytes, n: int) -> list[tuple[float, hb.Heartbeat]]:
    out = []
    while len(out) < n:
        data, _ = sock.recvfrom(hb.MAX_DATAGRAM + 100)
        out.append((time.monotonic(), hb.decode(data, key)))
    return out


def test_authenticated_heartbeats_and_clean_stop(
    lib_dir: Path, tmp_path: Path, receiver: socket.socket, key_file: Path
) -> None:
    proc = _start(lib_dir, tmp_path, receiver.getsockname()[1], key_file, {"gpus": 8})
    try:
        key = hb.load_key(key_file)
        data, _ = receiver.recvfrom(2000)
        with pytest.raises(hb.BadHeartbeat, match="MAC mismatch"):
            hb.decode(data, b"not-the-key-" * 3)  # a wrong key is refused
        first = hb.decode(data, key)
        beats = [first] + [b for _, b in _beats(receiver, key, 5)]
        guard = hb.ReplayGuard()
        for beat in beats:
            guard.check(beat, time.time())  # fresh and strictly increasing: the controller accepts every one
        assert {b.node for b in beats} == {"gpu007"} and len({b.boot for b in beats}) == 1
        assert [b.seq for b in beats] == list(range(first.seq, first.seq + 6))
        assert all(b.healthy and b.problems == () for b in beats)
        status = read_status(tmp_path / "status", "gpu007")
        assert status is not None and status["pid"] == proc.pid and status["healthy"] is True
        assert status["last_beat"] >= beats[0].sent and len(status["gpu_report"]["gpus"]) == 8
    finally:
        rc = _stop(proc)
    assert rc == 0  # a clean exit on SIGTERM within _stop's 5 s
    log = (tmp_path / "agent.log").read_text()
    assert "agent started node=gpu007" in log and "agent stopped node=gpu007" in log
    assert log.count("node=gpu007 healthy") == 1  # one line per state change, not per beat


def test_unhealthy_gpu_is_reported_in_beats(
    lib_dir: Path, tmp_path: Path, receiver: socket.socket, key_file: Path
) -> None:
    proc = _start(lib_dir, tmp_path, receiver.getsockname()[1], key_file, {"gpus": 8, "gpu3.ecc_unc": 2})
    try:
        _, beat = _beats(receiver, hb.load_key(key_file), 1)[0]
        assert not beat.healthy and beat.problems == ("gpu3: 2 volatile uncorrectable ECC errors",)
    finally:
        assert _stop(proc) == 0


def test_hung_nvml_does_not_delay_heartbeats(
    lib_dir: Path, tmp_path: Path, receiver: socket.socket, key_file: Path
) -> None:
    """The NVML call hangs for a minute and the probe gives up after 3 s: beats tied to the probe would stop for
    those 3 s, while the agent's beats keep their 0.2 s interval (gaps far below 3 s, slack for a loaded box)."""
    scenario = {"gpus": 8, "gpu0.hang_ms": 60000}
    proc = _start(lib_dir, tmp_path, receiver.getsockname()[1], key_file, scenario, "--probe-timeout-s", "3")
    try:
        beats = _beats(receiver, hb.load_key(key_file), 25)  # about 5 s of beats: the probe's timeout falls inside
        gaps = [b[0] - a[0] for a, b in zip(beats, beats[1:], strict=False)]
        assert max(gaps) < 2.0, f"heartbeat gaps {gaps} (interval 0.2 s, probe stuck 3 s)"
        problems = {p for _, b in beats for p in b.problems}
        assert any(p.startswith("NVML") for p in problems), problems  # timeout reported as a problem
    finally:
        assert _stop(proc) == 0


def test_refuses_a_key_others_can_read(lib_dir: Path, tmp_path: Path, receiver: socket.socket, key_file: Path) -> None:
    os.chmod(key_file, 0o644)
    proc = _start(lib_dir, tmp_path, receiver.getsockname()[1], key_file, {"gpus": 8})
    assert proc.wait(timeout=10) == 2
    assert "chmod 600" in (tmp_path / "agent.log").read_text()

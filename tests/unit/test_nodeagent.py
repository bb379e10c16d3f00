"""The node agent's loop pieces with a fake clock, an in-memory socket and FakeProbe (no threads where avoidable)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from nuro.healthcheck.agent import Agent, AgentConfig
from nuro.healthcheck.beats import build_heartbeat, parse_controller
from nuro.healthcheck.probes import FakeProbe
from nuro.healthcheck.run import HealthSettings
from nuro.healthcheck.statusfile import read_status
from nuro.protocol import heartbeat as hb

KEY = b"k" * 32
GIB = 1 << 30


class FakeSocket:
    """Records datagrams; ``fail`` makes sendto raise like a full buffer."""

    family = 2

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, tuple[str, int]]] = []
        self.fail: OSError | None = None
        self.closed = False

    def setblocking(self, flag: bool) -> None:
        assert flag is False

    def sendto(self, data: bytes, addr: tuple[str, int]) -> int:
        if self.fail:
            raise self.fail
        self.sent.append((data, addr))
        return len(data)

    def close(self) -> None:
        self.closed = True


class FakeClock:
    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 100.0

    def advance(self, s: float) -> None:
        self.wall += s
        self.mono += s


def _agent(
    probe: FakeProbe, tmp_path: Path | None = None, expect: int | None = 8, **kw
) -> tuple[Agent, FakeSocket, FakeClock]:  # noqa: ANN003
    clock, sock = FakeClock(), FakeSocket()
    config = AgentConfig(
        node="gpu001",
        controller=("127.0.0.1", 9999),
        key=KEY,
        status_dir=str(tmp_path) if tmp_path else None,
        health=HealthSettings(expected_gpus=expect, staging_root="/stage", staging_min_free_bytes=20 * GIB),
        **kw,
    )
    agent = Agent(
        config, probe, sock=sock, clock=lambda: clock.wall, monotonic=lambda: clock.mono, disk_free=lambda _p: 100 * GIB
    )  # type: ignore[arg-type]
    return agent, sock, clock


def _run_for(agent: Agent, seconds: float) -> None:
    """``agent.run`` in a thread for ``seconds``, then stopped as SIGTERM stops it, and joined."""
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t.start()
    time.sleep(seconds)
    stop.set()
    t.join(10)
    assert not t.is_alive(), "the agent did not stop"


def test_heartbeat_from_fake_probe_report() -> None:
    agent, sock, _ = _agent(FakeProbe.healthy(8).with_gpu(1, temperature_c=93))
    agent.probe_once()
    beat = agent.beat_once()
    got = hb.decode(sock.sent[0][0], KEY)
    assert got == beat
    assert (got.node, got.seq, got.healthy, got.problems) == ("gpu001", 1, False, ("gpu1: temperature 93 C ≥ 90 C",))
    assert got.boot == agent.boot_ms and sock.sent[0][1] == ("127.0.0.1", 9999)


def test_seq_increments_and_boot_is_fixed() -> None:
    agent, sock, clock = _agent(FakeProbe.healthy(8))
    agent.probe_once()
    for _ in range(3):
        agent.beat_once()
        clock.advance(1)
    beats = [hb.decode(d, KEY) for d, _ in sock.sent]
    assert [b.seq for b in beats] == [1, 2, 3] and {b.boot for b in beats} == {agent.boot_ms}
    assert all(b.healthy for b in beats)
    guard = hb.ReplayGuard()
    for b in beats:
        guard.check(b, b.sent)  # each is newer than the last: the controller accepts all


def test_beats_before_first_probe_are_healthy() -> None:
    agent, sock, _ = _agent(FakeProbe.healthy(8))
    assert agent.beat_once().healthy


def test_stale_probe_becomes_a_problem() -> None:
    agent, _, clock = _agent(FakeProbe.healthy(8))
    agent.probe_once()
    clock.advance(agent.config.stale_after_s + 1)  # type: ignore[operator]
    beat = agent.beat_once()
    assert not beat.healthy and beat.problems[0].startswith("health probe stale for ")


def test_send_errors_do_not_raise_and_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="nuro.nodeagent")
    agent, sock, _ = _agent(FakeProbe.healthy(8))
    sock.fail = BlockingIOError(11, "Resource temporarily unavailable")
    for _ in range(5):
        agent.beat_once()
    assert agent.sent_ok == 0 and agent.seq == 5
    assert sum("heartbeat send failing" in r.message for r in caplog.records) == 1
    sock.fail = None
    agent.beat_once()
    assert agent.sent_ok == 1 and sum("recovered" in r.message for r in caplog.records) == 1


def test_logs_state_changes_not_beats(caplog: pytest.LogCaptureFixture) -> None:
    probe = FakeProbe.healthy(8)
    agent, _, _ = _agent(probe)
    caplog.set_level("INFO", logger="nuro.nodeagent")
    for _ in range(3):
        agent.probe_once()
        agent.beat_once()
    agent.probe = probe.with_gpu(2, ecc_volatile_uncorrected=1)
    for _ in range(3):
        agent.probe_once()
        agent.beat_once()
    states = [r.message for r in caplog.records if "healthy" in r.message]
    assert states == ["node=gpu001 healthy", "node=gpu001 unhealthy problems=gpu2: 1 volatile uncorrectable ECC error"]


def test_status_file(tmp_path: Path) -> None:
    agent, _, clock = _agent(FakeProbe.healthy(8).with_gpu(0, utilization_pct=77), tmp_path)
    agent.probe_once()
    agent.beat_once()
    status = read_status(tmp_path, "gpu001")
    assert status is not None
    assert (status["seq"], status["healthy"], status["last_beat"]) == (1, True, clock.wall)
    assert status["gpu_report"]["gpus"][0]["utilization_pct"] == 77  # telemetry kept for a metrics sink
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_restart_after_the_clock_stepped_back_still_starts_a_newer_boot(tmp_path: Path) -> None:
    """The controller wants a newer (boot, seq): a restarted agent whose wall clock went back must not be refused."""
    agent, _, clock = _agent(FakeProbe.healthy(8), tmp_path)
    agent.probe_once()
    agent.beat_once()
    back = clock.wall - 3600  # the node's clock stepped back an hour
    again = Agent(agent.config, FakeProbe.healthy(8), sock=FakeSocket(), clock=lambda: back)  # type: ignore[arg-type]
    assert again.boot_ms == agent.boot_ms + 1


def test_an_oversized_or_nested_status_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "gpu001.json").write_text("[" * 100_000)
    assert read_status(tmp_path, "gpu001") is None
    (tmp_path / "gpu001.json").write_text(" " * (2 << 20))
    assert read_status(tmp_path, "gpu001") is None


def test_many_problems_still_fit_one_datagram() -> None:
    problems = [f"gpu{i}: {'very ' * 20}long problem text" for i in range(40)]
    beat, data = build_heartbeat("gpu001", 1, 1, time.time(), problems, KEY)
    assert len(data) <= hb.MAX_DATAGRAM and not beat.healthy
    assert beat.problems[-1].startswith("+") and beat.problems[-1].endswith(" more")


@pytest.mark.parametrize("text,want", [("127.0.0.1:16850", ("127.0.0.1", 16850)), ("[::1]:5", ("::1", 5))])
def test_parse_controller(text: str, want: tuple[str, int]) -> None:
    assert parse_controller(text) == want


@pytest.mark.parametrize("text", ["localhost", "host:0", ":80", "host:http"])
def test_parse_controller_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_controller(text)


class _Flaky:
    """A worker that fails once, then runs until stopped."""

    def __init__(self) -> None:
        self.calls = 0
        self.running = threading.Event()

    def run(self, stop: threading.Event) -> None:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("first run fails")
        self.running.set()
        stop.wait()


def test_run_beats_restarts_workers_and_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real loop with real threads and time (short interval): probe thread, worker restart, clean stop."""
    import nuro.healthcheck.agent as agent_mod

    monkeypatch.setattr(agent_mod, "WORKER_RESTART_S", 0.05)
    sock = FakeSocket()
    worker = _Flaky()
    config = AgentConfig(node="gpu001", controller=("127.0.0.1", 9999), key=KEY, interval_s=0.05)
    hung = threading.Event()
    probe = FakeProbe.healthy(8)
    agent = Agent(config, probe, workers=[worker], sock=sock, disk_free=lambda _p: 100 * GIB)  # type: ignore[arg-type]
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t.start()
    assert worker.running.wait(5), "worker was not restarted after its failure"
    probe.on_read = lambda: hung.wait(10)  # the probe now hangs: beats must go on
    seq_at_hang = agent.seq
    deadline = time.monotonic() + 8  # the probe stays hung for 10 s: beats tied to it would not move before then
    while agent.seq < seq_at_hang + 5:
        assert time.monotonic() < deadline, f"beats stopped while the probe hung (seq {agent.seq})"
        time.sleep(0.02)
    stop.set()
    hung.set()
    t.join(5)
    assert not t.is_alive() and sock.closed and worker.calls == 2
    assert json.loads(sock.sent[-1][0].partition(b" ")[2])["seq"] == agent.seq  # <mac>.<node> <json>
    last = hb.decode(sock.sent[-1][0], KEY)
    assert last.stopping_s == hb.DEFAULT_STOP_GRACE_S  # a clean stop says so: the restart is no node loss
    assert all(hb.decode(d, KEY).stopping_s == 0 for d, _ in sock.sent[:-1])


def test_a_stop_grace_of_zero_announces_nothing_and_out_of_range_ones_are_refused() -> None:
    sock = FakeSocket()
    config = AgentConfig(node="gpu001", controller=("127.0.0.1", 9999), key=KEY, interval_s=0.05, stop_grace_s=0)
    agent = Agent(config, FakeProbe.healthy(8), sock=sock, disk_free=lambda _p: 100 * GIB)  # type: ignore[arg-type]
    _run_for(agent, 0.2)
    assert sock.sent and all(hb.decode(d, KEY).stopping_s == 0 for d, _ in sock.sent)
    for bad in (-1, hb.MAX_STOP_GRACE_S + 1):
        with pytest.raises(ValueError, match="--stop-grace-s"):
            AgentConfig(node="gpu001", controller=("127.0.0.1", 9999), key=KEY, stop_grace_s=bad)


def test_a_beat_without_stopping_s_is_byte_for_byte_the_old_format() -> None:
    """Only a stopping beat carries the new key: controllers of the previous release parse every other beat."""
    plain = hb.encode(hb.Heartbeat("gpu001", 1, 2, 3.0), KEY)
    assert b"stopping_s" not in plain
    stopping = hb.decode(hb.encode(hb.Heartbeat("gpu001", 1, 3, 3.0, stopping_s=15.0), KEY), KEY)
    assert stopping.stopping_s == 15.0
    with pytest.raises(hb.BadHeartbeat, match="stopping_s"):
        hb.Heartbeat("gpu001", 1, 4, 3.0, stopping_s=float("nan"))


def test_a_status_file_write_that_blocks_never_holds_up_the_beats(tmp_path: Path) -> None:
    """Seen in CI: the status file's create + rename blocked ~2.7 s while the disk wrote checkpoints back, the beat
    loop waited on it, and the node was declared lost. While ``run`` beats, the file is written by its own thread."""
    sock = FakeSocket()
    config = AgentConfig(
        node="gpu001", controller=("127.0.0.1", 9999), key=KEY, status_dir=str(tmp_path), interval_s=0.02,
        probe_interval_s=0.05, stop_grace_s=0,
        health=HealthSettings(expected_gpus=8, staging_root="/stage", staging_min_free_bytes=20 * GIB),
    )  # fmt: skip
    agent = Agent(config, FakeProbe.healthy(8), sock=sock, disk_free=lambda _p: 100 * GIB)  # type: ignore[arg-type]
    real_write, writes = agent._write_status, []

    def slow_write(beat, now) -> None:  # noqa: ANN001 - the disk stalls for a second on each status write
        time.sleep(1.0)
        writes.append(beat.seq)
        real_write(beat, now)

    agent._write_status = slow_write  # type: ignore[method-assign]
    _run_for(agent, 1.5)
    assert len(sock.sent) >= 30, f"{len(sock.sent)} beats in 1.5 s at 0.02 s: the beats waited on the status file"
    assert 1 <= len(writes) <= 3  # the newest beat each time, not a backlog of every beat
    status = read_status(tmp_path, "gpu001")
    assert status is not None and status["seq"] == agent.seq  # the last beat's status is on disk at the end

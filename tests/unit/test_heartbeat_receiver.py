"""The controller's heartbeat receiver on a real loopback UDP socket: accepts, counts rejects by reason, checks each
beat with its own node's key, survives a burst of junk, and judges freshness on a clock a wall-clock step cannot move.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import pytest

from nuro.protocol.heartbeat import Heartbeat, encode, node_key
from nuro.slurm_plugins.controller.heartbeats import HeartbeatReceiver

MASTER = b"k" * 32


def _send(port: int, data: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(data, ("127.0.0.1", port))


def _wait(pred, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


def _signed(node: str, seq: int, sent: float, **kw) -> bytes:
    return encode(Heartbeat(node, boot=1, seq=seq, sent=sent, **kw), node_key(MASTER, node))


@pytest.fixture
def receiver():
    rx = HeartbeatReceiver("127.0.0.1", 0, MASTER).start()
    yield rx
    rx.stop()


def test_valid_beats_are_handed_over_once_and_rejects_are_counted_by_reason(receiver, caplog) -> None:
    now = time.time()
    good = _signed("gpu001", 1, now, healthy=False, problems=("ecc",))
    caplog.set_level(logging.WARNING)
    _send(receiver.port, good)
    _send(receiver.port, good)  # replay
    _send(receiver.port, encode(Heartbeat("gpu001", 1, 2, now), b"x" * 32))  # wrong key
    _send(receiver.port, encode(Heartbeat("gpu001", 1, 3, now), b"x" * 32))  # wrong key again: counted, not logged
    _send(receiver.port, b"garbage")
    _send(receiver.port, _signed("gpu002", 1, now - 3600))  # an hour old
    _send(receiver.port, b"x" * 1500)  # bigger than any heartbeat
    _wait(lambda: sum(receiver.rejects.values()) == 6)
    beats = receiver.drain()
    assert [(b.node, b.seq, b.healthy, b.problems) for b in beats] == [("gpu001", 1, False, ("ecc",))]
    assert receiver.drain() == []
    assert dict(receiver.rejects) == {"replay": 1, "bad_mac": 2, "malformed": 1, "clock_skew": 1, "too_big": 1}
    assert receiver.stats()["accepted"] == 1
    assert sum("reason=bad_mac" in r.getMessage() for r in caplog.records) == 1  # once per source per minute


def test_a_node_key_speaks_for_its_own_node_only(receiver) -> None:
    """gpu002's key (all a user who broke into gpu002 could learn) cannot forge gpu001's beats."""
    now = time.time()
    _send(receiver.port, encode(Heartbeat("gpu001", 1, 1, now), node_key(MASTER, "gpu002")))
    _send(receiver.port, encode(Heartbeat("gpu001", 1, 1, now), MASTER))  # the master itself is no node's key
    _send(receiver.port, _signed("gpu002", 1, now))
    _wait(lambda: receiver.accepted + sum(receiver.rejects.values()) == 3)
    assert [b.node for b in receiver.drain()] == ["gpu002"]
    assert dict(receiver.rejects) == {"bad_mac": 2}


def test_a_burst_of_forgeries_does_not_cost_the_real_beats(receiver) -> None:
    now = time.time()
    forged = encode(Heartbeat("gpu001", 1, 10**6, now), b"y" * 32)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for i in range(3000):
            s.sendto(forged if i % 2 else os.urandom(100), ("127.0.0.1", receiver.port))
            if i % 1000 == 0:
                s.sendto(_signed("gpu003", i + 1, now), ("127.0.0.1", receiver.port))
    _wait(lambda: receiver.accepted + sum(receiver.rejects.values()) == 3003)
    assert [b.seq for b in receiver.drain()] == [1, 1001, 2001]
    assert receiver.rcvbuf >= 200_000


def test_a_wall_clock_step_changes_neither_freshness_nor_arrival_times() -> None:
    """The receiver's wall clock jumps 30 s ahead after start: good beats still pass the skew check (it runs on the
    start-time wall clock advanced monotonically), and arrival times are monotonic."""
    offset = [0.0]
    rx = HeartbeatReceiver("127.0.0.1", 0, MASTER, clock=lambda: time.time() + offset[0], max_skew_s=10).start()
    try:
        offset[0] = 30.0
        _send(rx.port, _signed("gpu004", 1, time.time()))
        _wait(lambda: rx.accepted == 1)
        beat = rx.drain()[0]
        assert abs(beat.received - time.monotonic()) < 5
        assert beat.received_wall is not None and beat.received_wall - time.time() > 25  # records show the wall
    finally:
        rx.stop()


def test_stop_joins_the_thread(receiver) -> None:
    receiver.stop()
    assert not receiver._thread.is_alive()


def test_pump_reads_what_the_kernel_holds_when_the_thread_has_not_run() -> None:
    """A descheduled receiver thread leaves beats in the kernel's buffer; ``pump`` (the detector calls it before it
    takes the time it judges at) reads them from the caller's thread."""
    rx = HeartbeatReceiver("127.0.0.1", 0, MASTER)  # never started: its thread stands for one that has not run
    try:
        now = time.time()
        for seq in (1, 2, 3):
            _send(rx.port, _signed("gpu005", seq, now))
        _wait(lambda: rx.pump() > 0 or bool(rx._beats))
        rx.pump()
        assert [b.seq for b in rx.drain()] == [1, 2, 3]
        assert rx.pump() == 0
    finally:
        rx.stop()


def test_a_starved_receiver_thread_costs_no_node_its_liveness() -> None:
    """The CI case: the controller wakes after a stall with beats unread in the kernel; the tick judges with them."""
    from nuro.slurm.models import NodeInfo
    from nuro.slurm_plugins.controller.detection import FailureDetector
    from nuro.slurm_plugins.controller.liveness import LivenessConfig

    class _Backend:
        def nodes(self) -> list[NodeInfo]:
            return [NodeInfo(name="gpu006", state="IDLE", flags=frozenset({"IDLE"}))]

    mono = [100.0]
    rx = HeartbeatReceiver("127.0.0.1", 0, MASTER, monotonic=lambda: mono[0])  # not started
    try:
        det = FailureDetector(
            _Backend(), rx, LivenessConfig(interval_s=0.25, miss_limit=4), dry_run=True,  # type: ignore[arg-type]
            monotonic=lambda: mono[0], node_poll_s=2.0,
        )  # fmt: skip
        _send(rx.port, _signed("gpu006", 1, time.time()))
        _wait(lambda: rx.pump() > 0)  # seq 1 arrived at t=100, when the detector started
        assert det.tick() == []
        _send(rx.port, _signed("gpu006", 2, time.time()))  # seq 2 reaches the kernel at about t=100.75 ...
        time.sleep(0.05)
        mono[0] += 1.5  # ... and the controller wakes at t=101.5: seq 1 is 1.5 s old (> 1 s), seq 2 was never read
        assert det.tick() == [], "a beat the kernel held was not counted: the node was declared lost"
        assert det.state.nodes["gpu006"].seq == 2
    finally:
        rx.stop()

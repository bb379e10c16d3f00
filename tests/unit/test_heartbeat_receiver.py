"""The controller's heartbeat receiver on a real loopback UDP socket: accepts, counts rejects by reason."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from nuro.heartbeat import Heartbeat, encode
from nuro.slurm_plugins.controller.heartbeats import HeartbeatReceiver

KEY = b"k" * 32


def _send(port: int, data: bytes) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(data, ("127.0.0.1", port))


def _wait(pred, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)


@pytest.fixture
def receiver():
    rx = HeartbeatReceiver("127.0.0.1", 0, KEY).start()
    yield rx
    rx.stop()


def test_valid_beats_are_handed_over_once_and_rejects_are_counted_by_reason(receiver, caplog) -> None:
    now = time.time()
    good = encode(Heartbeat("gpu001", boot=1, seq=1, sent=now, healthy=False, problems=("ecc",)), KEY)
    caplog.set_level(logging.WARNING)
    _send(receiver.port, good)
    _send(receiver.port, good)  # replay
    _send(receiver.port, encode(Heartbeat("gpu001", 1, 2, now), b"x" * 32))  # wrong key
    _send(receiver.port, encode(Heartbeat("gpu001", 1, 3, now), b"x" * 32))  # wrong key again: counted, not logged
    _send(receiver.port, b"garbage")
    _send(receiver.port, encode(Heartbeat("gpu002", 1, 1, now - 3600), KEY))  # an hour old
    _wait(lambda: sum(receiver.rejects.values()) == 5)
    beats = receiver.drain()
    assert [(b.node, b.seq, b.healthy, b.problems) for b in beats] == [("gpu001", 1, False, ("ecc",))]
    assert receiver.drain() == []
    assert dict(receiver.rejects) == {"replay": 1, "bad_mac": 2, "malformed": 1, "clock_skew": 1}
    assert receiver.stats()["accepted"] == 1
    assert sum("reason=bad_mac" in r.getMessage() for r in caplog.records) == 1  # once per source per minute


def test_stop_joins_the_thread(receiver) -> None:
    receiver.stop()
    assert not receiver._thread.is_alive()

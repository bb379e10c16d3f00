"""The heartbeat wire format: authentic beats round-trip; forged, altered, stale and malformed ones are refused."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nuro.heartbeat import (
    MAX_DATAGRAM,
    BadHeartbeat,
    Heartbeat,
    Replay,
    ReplayGuard,
    decode,
    encode,
    load_key,
    write_key,
)

KEY = b"k" * 32


def beat(**kw) -> Heartbeat:
    return Heartbeat(**{"node": "gpu001", "boot": 1000, "seq": 1, "sent": 100.0, **kw})


def test_round_trip_keeps_every_field() -> None:
    hb = beat(healthy=False, problems=("gpu3: 2 volatile uncorrectable ECC errors",))
    assert decode(encode(hb, KEY), KEY) == hb


def test_wrong_key_is_refused() -> None:
    with pytest.raises(BadHeartbeat, match="MAC mismatch"):
        decode(encode(beat(), KEY), b"x" * 32)


def test_altered_body_is_refused() -> None:
    data = encode(beat(healthy=True), KEY).replace(b'"healthy":true', b'"healthy":false')
    with pytest.raises(BadHeartbeat, match="MAC mismatch"):
        decode(data, KEY)


@given(st.binary(max_size=200))
def test_garbage_only_ever_raises_bad_heartbeat(data: bytes) -> None:
    with pytest.raises(BadHeartbeat):
        decode(data, KEY)


def test_invalid_node_name_is_refused() -> None:
    with pytest.raises(BadHeartbeat, match="node name"):
        beat(node="gpu001; rm -rf /")


def test_oversized_problem_list_is_refused_at_the_sender() -> None:
    with pytest.raises(BadHeartbeat, match=str(MAX_DATAGRAM)):
        encode(beat(problems=tuple("x" * 100 for _ in range(20))), KEY)


def test_replay_guard_wants_newer_sequence_per_boot() -> None:
    guard = ReplayGuard(max_skew_s=5)
    guard.check(beat(seq=1), now=100)
    guard.check(beat(seq=2), now=101)
    with pytest.raises(Replay, match="not newer"):
        guard.check(beat(seq=2), now=101)
    # a restarted agent (new boot) starts its sequence again
    guard.check(beat(boot=2000, seq=0), now=102)
    # another node has its own sequence
    guard.check(beat(node="gpu002", seq=1), now=102)


def test_replay_guard_refuses_clock_far_off() -> None:
    with pytest.raises(Replay, match="from our clock"):
        ReplayGuard(max_skew_s=5).check(beat(sent=100.0), now=200.0)


def test_key_file_is_created_private_and_refused_when_readable(tmp_path) -> None:
    path = tmp_path / "etc" / "heartbeat.key"
    key = write_key(path)
    assert len(key) == 64 and oct(path.stat().st_mode & 0o777) == "0o600"
    assert write_key(path) == key  # idempotent: an existing key is kept
    os.chmod(path, 0o644)
    with pytest.raises(BadHeartbeat, match="chmod 600"):
        load_key(path)


def test_missing_key_file_says_where(tmp_path) -> None:
    with pytest.raises(BadHeartbeat, match="does not exist"):
        load_key(tmp_path / "nope")

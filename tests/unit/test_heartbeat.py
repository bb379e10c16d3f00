"""The heartbeat wire format: authentic beats round-trip; forged, altered, stale and malformed ones are refused."""

from __future__ import annotations

import hashlib
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nuro.protocol.heartbeat import (
    MAX_DATAGRAM,
    BadHeartbeat,
    Heartbeat,
    NodeKeys,
    Replay,
    ReplayGuard,
    decode,
    derive_key,
    encode,
    load_key,
    mac,
    node_key,
    verify,
    write_key,
    write_node_key,
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


def test_node_keys_are_derived_per_node_and_per_purpose() -> None:
    a, b = node_key(KEY, "gpu001"), node_key(KEY, "gpu002")
    assert a != b and len(a) == 64 and a == node_key(KEY, "gpu001")  # deterministic, hex, distinct per node
    assert a != node_key(b"m" * 32, "gpu001")  # another master, another key
    assert derive_key(KEY, "preempt") not in (a, b, KEY)  # other purposes get their own key
    with pytest.raises(BadHeartbeat, match="node name"):
        node_key(KEY, "../etc")


def test_a_beat_checks_with_its_own_node_key_only() -> None:
    keys = NodeKeys(KEY)
    hb = beat(node="gpu001")
    assert decode(encode(hb, node_key(KEY, "gpu001")), keys) == hb
    with pytest.raises(BadHeartbeat, match="MAC mismatch"):
        decode(encode(hb, node_key(KEY, "gpu002")), keys)  # gpu002's key cannot speak for gpu001


def test_the_clear_node_name_must_match_the_body() -> None:
    k1 = node_key(KEY, "gpu001")
    data = encode(beat(node="gpu001"), k1)
    _, _, signed = data.partition(b".")
    _, _, body = signed.partition(b" ")
    # re-signed with gpu002 in front and gpu001 inside: the MAC holds (same key) but the names differ
    forged_signed = b"gpu002 " + body
    forged = mac(k1, forged_signed) + b"." + forged_signed
    with pytest.raises(BadHeartbeat, match="differs"):
        decode(forged, k1)


def test_junk_is_refused_before_any_parsing() -> None:
    with pytest.raises(BadHeartbeat, match="exceeds"):
        verify(b"0" * (MAX_DATAGRAM + 1), KEY)
    with pytest.raises(BadHeartbeat, match="no node name"):
        verify(b"0" * 64 + b".no-space-here", KEY)
    with pytest.raises(BadHeartbeat, match="unknown node"):
        verify(b"0" * 64 + b".gpu001 {}", lambda node: None)


def test_node_key_cache_is_bounded() -> None:
    keys = NodeKeys(KEY, max_nodes=4)
    for i in range(10):
        assert keys(f"n{i}") == node_key(KEY, f"n{i}")
    assert len(keys._cache) <= 4


def test_node_key_file_is_private_and_loads_back(tmp_path) -> None:
    path = tmp_path / "keys" / "gpu001.key"
    key = write_node_key(path, KEY, "gpu001")
    assert oct(path.stat().st_mode & 0o777) == "0o600" and load_key(path) == key == node_key(KEY, "gpu001")


def test_a_huge_key_file_is_refused_without_reading_it_whole(tmp_path) -> None:
    path = tmp_path / "big.key"
    path.write_bytes(b"a" * 100_000)
    os.chmod(path, 0o600)
    with pytest.raises(BadHeartbeat, match="larger than"):
        load_key(path)


def test_the_mac_is_keyed_blake2b_of_the_signed_part_and_long_keys_are_hashed_first() -> None:
    data = encode(beat(), KEY)
    signed = data[65:]
    assert data[:64] == hashlib.blake2b(signed, key=KEY, digest_size=32).hexdigest().encode()
    long_key = b"z" * 100
    assert decode(encode(beat(), long_key), long_key) == beat()
    keys = NodeKeys(KEY)
    assert keys.mac("gpu001", signed) == mac(node_key(KEY, "gpu001"), signed)

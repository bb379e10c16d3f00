"""In-memory snapshots: the pure parts of the job side (``nuro.wrappers.sdk.snapshots``) and the ``tier`` of the
checkpoint records (``nuro.checkpoint.manifest``)."""

from __future__ import annotations

import dataclasses

import pytest

from nuro.checkpoint.errors import InvalidCheckpointInput
from nuro.checkpoint.manifest import (
    FileEntry,
    PartRecord,
    UploadRequest,
    build_manifest,
    parse_manifest,
    parse_part,
    parse_request,
)
from nuro.wrappers.sdk.snapshots import SnapshotSettings, pack, ring, unpack


def test_each_node_sends_to_the_next_and_takes_from_the_previous() -> None:
    assert [ring(3, p) for p in range(3)] == [(1, 2), (2, 0), (0, 1)]
    assert ring(2, 0) == (1, 1) and ring(2, 1) == (0, 0)  # two nodes: each holds the whole snapshot


def test_a_share_round_trips_and_a_bad_one_is_refused() -> None:
    raw = [(".metadata", b"m" * 10), ("__1_0.distcp", b""), ("sub/x.pt", bytes(range(256)))]
    files = [(FileEntry.of_bytes(p, d), d) for p, d in raw]
    assert unpack(pack(files)) == files
    blob = pack(files)
    with pytest.raises(InvalidCheckpointInput, match="beyond its index"):
        unpack(blob + b"x")
    with pytest.raises(InvalidCheckpointInput, match="bad checkpoint file path"):
        unpack(pack([(FileEntry("../etc/passwd", 1, "0" * 64), b"x")]))
    with pytest.raises(InvalidCheckpointInput, match="shorter than its header"):
        unpack(b"\x01")


def test_settings_come_from_the_environment_and_a_bad_value_is_an_error() -> None:
    assert SnapshotSettings.from_env({}) == SnapshotSettings(0.0, 8 << 30)
    got = SnapshotSettings.from_env({"NURO_SNAPSHOT_INTERVAL_S": "5", "NURO_SNAPSHOT_MAX_BYTES": "1000"})
    assert got == SnapshotSettings(5.0, 1000)
    with pytest.raises(InvalidCheckpointInput, match="NURO_SNAPSHOT_INTERVAL_S"):
        SnapshotSettings.from_env({"NURO_SNAPSHOT_INTERVAL_S": "soon"})
    with pytest.raises(InvalidCheckpointInput, match="NURO_SNAPSHOT_MAX_BYTES"):
        SnapshotSettings.from_env({"NURO_SNAPSHOT_MAX_BYTES": "-1"})


def _req(part: int, tier: str) -> UploadRequest:
    files = (FileEntry.of_bytes(f"__{part}_0.distcp", b"x" * (part + 1)),)
    return UploadRequest("vision", "r", 7, "12", 0, part, 2, 2, files, "2026-12-05T00:00:00Z", tier=tier)


def test_the_tier_travels_from_request_to_part_to_manifest_and_a_periodic_record_is_unchanged() -> None:
    plain = _req(0, "persistent")
    assert "tier" not in plain.to_json_obj()  # a periodic checkpoint's records are what they were
    mem = [_req(p, "memory") for p in (0, 1)]
    assert parse_request(mem[0].to_json_obj()).tier == "memory"
    parts = [parse_part(PartRecord.from_request(r).to_json_obj()) for r in mem]
    m = build_manifest(parts, parent=None)
    assert m.tier == "memory" and parse_manifest(m.to_json_obj()).tier == "memory"
    assert build_manifest([PartRecord.from_request(_req(p, "persistent")) for p in (0, 1)], parent=None).tier == (
        "persistent"
    )
    with pytest.raises(Exception, match="tier"):
        parse_request({**plain.to_json_obj(), "tier": "disk"})
    assert dataclasses.replace(plain, tier="memory").to_json_obj()["tier"] == "memory"

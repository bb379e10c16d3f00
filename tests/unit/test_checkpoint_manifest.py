"""Checkpoint records: strict parsing with errors that name the field, layout validation, manifest merging."""

from __future__ import annotations

import dataclasses
import json

import pytest

from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import InvalidCheckpointInput, ManifestError
from nuro.checkpoint.manifest import (
    FileEntry,
    PartRecord,
    UploadRequest,
    bind_request,
    build_manifest,
    parse_manifest,
    parse_part,
    parse_request,
)

SHA = "a" * 64


def _part(part: int, files: tuple[FileEntry, ...], parts: int = 2, restart: int = 0) -> PartRecord:
    return PartRecord("vision", "resnet", 100, "4711", restart, part, parts, 4, files, "2026-01-01T00:00:00Z")


def _manifest_obj(**over) -> dict:
    m = build_manifest(
        [_part(0, (FileEntry(".metadata", 3, SHA),)), _part(1, (FileEntry("__1_0.distcp", 5, SHA),))], parent=90
    )
    return {**m.to_json_obj(), **over}


def test_build_manifest_merges_parts_sorted_with_totals_and_parent() -> None:
    m = parse_manifest(json.dumps(_manifest_obj()))
    assert [s.path for s in m.shards] == [".metadata", "__1_0.distcp"]
    assert (m.total_bytes, m.parts, m.world_size, m.parent, m.step, m.job_id) == (8, 2, 4, 90, 100, "4711")


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"format": "nuro.checkpoint/v9"}, "unknown format"),
        ({"total_bytes": 9}, "total_bytes 9 is not the sum"),
        ({"step": -1}, "field 'step'"),
        ({"team": "Vision"}, "bad team"),
        ({"run": "../x"}, "bad run name"),
        ({"restart": True}, "field 'restart'"),
        ({"parent": 100}, "parent step 100 is not before"),
        ({"shards": []}, "lists no shards"),
        ({"shards": [{"path": "../etc/passwd", "size": 1, "sha256": SHA}]}, "'..'"),
        ({"shards": [{"path": "a", "size": 1, "sha256": "XYZ"}]}, "64 lower-case hex"),
        ({"shards": [{"path": "a", "size": -1, "sha256": SHA}]}, "non-negative"),
        ({"shards": [{"path": "a", "size": 1, "sha256": SHA, "x": 1}]}, "exactly {path, size, sha256}"),
        ({"shards": [{"path": "a", "size": 1, "sha256": SHA}] * 2, "total_bytes": 2}, "listed twice"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_bad_manifests_are_refused_naming_the_problem(over: dict, words: str) -> None:
    with pytest.raises(ManifestError, match=None) as err:
        parse_manifest(json.dumps(_manifest_obj(**over)))
    assert words in str(err.value)


def test_missing_field_and_non_json_are_named() -> None:
    obj = _manifest_obj()
    del obj["world_size"]
    with pytest.raises(ManifestError, match="missing field 'world_size'"):
        parse_manifest(json.dumps(obj))
    with pytest.raises(ManifestError, match="not valid JSON"):
        parse_manifest(b"{")
    with pytest.raises(ManifestError, match="expected a JSON object"):
        parse_manifest(b"[]")


def test_build_refuses_missing_parts_mixed_attempts_and_double_claims() -> None:
    a = _part(0, (FileEntry("x", 1, SHA),))
    with pytest.raises(ManifestError, match=r"have parts \[0\], need 0..1"):
        build_manifest([a], parent=None)
    with pytest.raises(ManifestError, match="job 4711.1"):
        build_manifest([a, _part(1, (FileEntry("y", 1, SHA),), restart=1)], parent=None)
    with pytest.raises(ManifestError, match="x uploaded by parts 0 and 1"):
        build_manifest([a, _part(1, (FileEntry("x", 1, SHA),))], parent=None)


def test_request_and_part_round_trip_and_part_bounds() -> None:
    req = UploadRequest("vision", "resnet", 7, "12", 1, 0, 1, 1, (FileEntry("a/b", 2, SHA),), "t", keep=3)
    assert parse_request(json.dumps(req.to_json_obj())) == req
    part = PartRecord.from_request(req)
    assert parse_part(json.dumps(part.to_json_obj())).attempt == req.attempt
    bad = {**req.to_json_obj(), "part": 1}
    with pytest.raises(ManifestError, match="part 1 is not below parts_expected 1"):
        parse_request(json.dumps(bad))
    with pytest.raises(ManifestError, match="field 'keep'"):
        parse_request(json.dumps({**req.to_json_obj(), "keep": 0}))


@pytest.mark.parametrize("path", ["", "/abs", "a//b", "./a", "a/../b", "a\nb", "x" * 1025])
def test_layout_refuses_escaping_paths(path: str) -> None:
    assert L.path_problem(path)
    with pytest.raises(InvalidCheckpointInput):
        L.shard_key("vision", "resnet", 1, path)


def test_keys_are_zero_padded_and_parse_back() -> None:
    assert L.manifest_key("vision", "resnet", 42) == "checkpoints/vision/resnet/step-000000000042/manifest.json"
    assert L.parse_step_name("step-000000000042/") == 42
    assert L.parse_step_name("step-42") is None
    with pytest.raises(InvalidCheckpointInput, match="bad step"):
        L.step_name(10**12)


def _req(**over) -> UploadRequest:
    base = UploadRequest("vision", "resnet", 100, "4711", 0, 0, 1, 1, (FileEntry(".metadata", 3, SHA),), "t", keep=1)
    return dataclasses.replace(base, **over)


def test_bind_request_takes_keep_from_the_record_and_keeps_what_the_job_may_choose() -> None:
    bound = bind_request(_req(), team="vision", run="resnet", job_id="4711", restart=0, keep=3)
    assert bound == _req(keep=3)  # step, part and files are the job's; keep is the record's (the request said 1)


@pytest.mark.parametrize(
    ("over", "named"),
    [
        ({"team": "nlp"}, "team='nlp'"),
        ({"run": "their-run"}, "run='their-run'"),
        ({"job_id": "4712"}, "job_id='4712'"),
        ({"restart": 1}, "restart=1"),
        ({"team": "nlp", "run": "x"}, "team='nlp', run='x'"),
    ],
)
def test_bind_request_refuses_a_request_naming_another_owner(over: dict, named: str) -> None:
    with pytest.raises(ManifestError, match="job record says") as err:
        bind_request(_req(**over), team="vision", run="resnet", job_id="4711", restart=0, keep=None)
    assert named in str(err.value) and "refused" in str(err.value)

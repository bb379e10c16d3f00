"""Capped reads of objects a team can write (issue 30): the adapter refuses an oversized object without holding it,
and every reader a root daemon uses turns that refusal into "this record is bad" and goes on with the rest.

The store is the real ``ObjectStore`` over a fake boto3 client that serves objects from memory and counts every
byte a caller pulled from a body, so "refused unread" is measured, not assumed. A team writes into its own prefix
here as it could with its own key: anything, of any size, under its checkpoint, run-event and dataset keys.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.manifest import MANIFEST_FORMAT, dumps
from nuro.checkpoint.restore import load_manifest, read_incomplete
from nuro.checkpoint.retention import tagged_steps
from nuro.datasets import snapshot as snapshot_mod
from nuro.datasets.errors import IntegrityError, InvalidInput
from nuro.datasets.manifest import manifest_key as dataset_manifest_key
from nuro.datasets.refs import get_tag
from nuro.datasets.refs import load_manifest as load_dataset_manifest
from nuro.lifecycle.run_events import read_event
from nuro.objectstore import (
    CHECKPOINT_MANIFEST_MAX_BYTES,
    MiB,
    ObjectStore,
    ObjectTooLarge,
    StoreConfig,
)
from nuro.runs.checkpoints import run_checkpoints

SHA = "ab" * 32


class _Body:
    """A streaming body that counts what was read from it."""

    def __init__(self, data: bytes, counter: list[int]) -> None:
        self._io, self._counter = io.BytesIO(data), counter

    def read(self, n: int = -1) -> bytes:
        chunk = self._io.read(n)
        self._counter[0] += len(chunk)
        return chunk

    def close(self) -> None:
        pass


class FakeS3:
    """The few boto3 S3 calls the readers make, from a dict. ``lie_about_length``: answer without ContentLength
    (a store or proxy that streams chunked), so only the chunked read can stop an oversized body."""

    def __init__(self, lie_about_length: bool = False) -> None:
        self.objects: dict[str, bytes] = {}
        self.read_bytes = [0]
        self.lie = lie_about_length

    def get_object(self, Bucket: str, Key: str, **_: Any) -> dict[str, Any]:  # noqa: N803 - boto3's names
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "Get")
        data = self.objects[Key]
        res: dict[str, Any] = {"Body": _Body(data, self.read_bytes), "ETag": '"e"'}
        if not self.lie:
            res["ContentLength"] = len(data)
        return res

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "404"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "Head")
        return {"ContentLength": len(self.objects[Key]), "ETag": '"e"'}

    def put_object(self, Bucket: str, Key: str, Body: bytes, **_: Any) -> dict[str, Any]:  # noqa: N803
        self.objects[Key] = bytes(Body)
        return {"ETag": '"e"'}

    def get_paginator(self, _name: str) -> Any:
        objects = self.objects

        class Pages:
            def paginate(self, Bucket: str, Prefix: str, Delimiter: str | None = None) -> list[dict]:  # noqa: N803
                keys = sorted(k for k in objects if k.startswith(Prefix))
                if Delimiter is None:
                    return [{"Contents": [{"Key": k, "Size": len(objects[k]), "ETag": '"e"'} for k in keys]}]
                subs = sorted({Prefix + k[len(Prefix) :].split(Delimiter, 1)[0] + Delimiter for k in keys
                               if Delimiter in k[len(Prefix) :]})  # fmt: skip
                return [{"CommonPrefixes": [{"Prefix": p} for p in subs]}]

        return Pages()


@pytest.fixture
def fake() -> FakeS3:
    return FakeS3()


def _store(fake: FakeS3) -> ObjectStore:
    store = ObjectStore(StoreConfig("http://127.0.0.1:1"))
    store.client = fake
    return store


def _manifest(team: str, run: str, step: int, pad: int = 0) -> bytes:
    obj = {"format": MANIFEST_FORMAT, "team": team, "run": run, "step": step, "job_id": "7", "restart": 0,
           "created_at": "2026-01-02T03:04:05Z", "parent": None, "world_size": 1, "parts": 1,
           "shards": [{"path": "a.bin", "size": 3, "sha256": SHA}], "total_bytes": 3}  # fmt: skip
    data = dumps(obj)
    return data if not pad else data[:-1] + b',"x":"' + b"0" * pad + b'"}'  # still valid JSON, just huge


def test_an_object_over_the_cap_by_its_length_is_refused_unread(fake: FakeS3) -> None:
    fake.objects["checkpoints/vision/r/step-00000001/manifest.json"] = b"{" + b" " * (2 * MiB) + b"}"
    with pytest.raises(ObjectTooLarge) as err:
        _store(fake).get("checkpoints/vision/r/step-00000001/manifest.json", max_bytes=1 * MiB)
    assert fake.read_bytes == [0]  # ContentLength said it all: not one byte pulled
    msg = str(err.value)
    assert "checkpoints/vision/r/step-00000001/manifest.json" in msg and str(1 * MiB) in msg
    assert (err.value.key, err.value.max_bytes, err.value.size) == (
        "checkpoints/vision/r/step-00000001/manifest.json",
        1 * MiB,
        2 * MiB + 2,
    )


def test_without_a_length_the_chunked_read_stops_just_past_the_cap() -> None:
    fake = FakeS3(lie_about_length=True)
    fake.objects["k"] = b"x" * (50 * MiB)
    with pytest.raises(ObjectTooLarge, match=r"more than the 3145728 bytes"):
        _store(fake).get("k", max_bytes=3 * MiB)
    assert fake.read_bytes[0] == 3 * MiB + 1  # the cap and one byte, never the 50 MiB


def test_an_object_within_the_cap_is_returned_whole_and_uncapped_reads_are_unchanged() -> None:
    fake = FakeS3(lie_about_length=True)
    fake.objects["k"] = b"y" * (MiB + 5)
    store = _store(fake)
    assert store.get("k", max_bytes=MiB + 5) == (b"y" * (MiB + 5), '"e"')  # exactly at the cap is fine
    assert store.get("k")[0] == b"y" * (MiB + 5)


def test_an_oversized_checkpoint_manifest_is_a_bad_step_and_the_others_are_still_listed(fake: FakeS3) -> None:
    """The MLflow bridge's and ``nuro-train lineage``'s listing (``run_checkpoints``) and the prolog's staging
    (``load_manifest``): the team's padded manifest costs its own step, and another team's run lists as before."""
    store = _store(fake)
    fake.objects[L.manifest_key("vision", "r", 1)] = _manifest("vision", "r", 1)
    fake.objects[L.manifest_key("vision", "r", 2)] = _manifest("vision", "r", 2, pad=CHECKPOINT_MANIFEST_MAX_BYTES)
    fake.objects[L.manifest_key("speech", "s", 5)] = _manifest("speech", "s", 5)
    with pytest.raises(ManifestError, match="manifest.json.*more than the"):
        load_manifest(store, "vision", "r", 2)
    before = fake.read_bytes[0]
    committed, other = run_checkpoints(store, "vision", "r")
    assert [c["step"] for c in committed] == [1]
    assert [o["step"] for o in other] == [2] and "more than the" in other[0]["status"]
    assert fake.read_bytes[0] - before < 2048  # two small manifests read, the 32 MiB one never
    assert [c["step"] for c in run_checkpoints(store, "speech", "s")[0]] == [5]


def test_an_oversized_incomplete_marker_tag_and_run_event_are_refused_or_skipped(fake: FakeS3) -> None:
    store = _store(fake)
    fake.objects[L.incomplete_key("vision", "r", 3)] = b"{" + b" " * (2 * MiB) + b"}"
    with pytest.raises(ManifestError, match="incomplete.json"):
        read_incomplete(store, "vision", "r", 3)
    fake.objects[L.tag_key("vision", "r", "best")] = b'{"step": 1, "x": "' + b"0" * MiB + b'"}'
    fake.objects[L.tag_key("vision", "r", "good")] = b'{"step": 2}'
    assert tagged_steps(store, "vision", "r") == {2}  # the huge tag protects nothing and breaks nothing
    fake.objects["runs/vision/r/events/7/huge.json"] = b"[" + b"0," * MiB + b"0]"
    assert read_event(store, "runs/vision/r/events/7/huge.json") is None
    assert fake.read_bytes == [11]  # only the good tag's bytes were ever read


def test_an_oversized_dataset_manifest_or_tag_is_an_integrity_error(
    fake: FakeS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``refs.load_manifest`` is what the prolog's verification reads (as root); its cap is large (a real manifest
    of millions of files), so the test lowers it rather than storing 512 MiB."""
    import nuro.datasets.refs as refs

    monkeypatch.setattr(refs, "DATASET_MANIFEST_MAX_BYTES", 4096)
    digest = "sha256:" + "c" * 64
    fake.objects[dataset_manifest_key("vision.big", digest)] = b"{" + b" " * 10_000 + b"}"
    with pytest.raises(IntegrityError, match=r"vision\.big.*more than the 4096 bytes"):
        load_dataset_manifest(_store(fake), "vision.big", digest)
    monkeypatch.setattr(refs, "TAG_MAX_BYTES", 16)
    fake.objects["team-datasets/vision/vision.big/tags/latest"] = b'{"digest": "' + b"0" * 64 + b'"}'
    with pytest.raises(IntegrityError, match="tag vision.big@latest"):
        get_tag(_store(fake), "vision.big", "latest")
    assert fake.read_bytes == [0]


def test_snapshot_never_writes_a_manifest_readers_would_refuse(
    fake: FakeS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(snapshot_mod, "DATASET_MANIFEST_MAX_BYTES", 1000)
    for i in range(10):
        (tmp_path / f"f{i:02d}.txt").write_text(str(i))
    with pytest.raises(InvalidInput, match="more than the 1000 every reader accepts"):
        snapshot_mod.snapshot(_store(fake), tmp_path, "vision.small")
    assert not [k for k in fake.objects if "/manifests/" in k]

"""The pure core of dataset snapshots: names, references, keys, paths, the canonical manifest, shard packing."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nuro.datasets.errors import IntegrityError, InvalidInput
from nuro.datasets.manifest import (
    FileEntry,
    Ref,
    ShardRef,
    SourceFile,
    build_manifest,
    manifest_key,
    parse_manifest,
    parse_ref,
    path_problem,
    plan_shards,
    sha256_digest,
    shard_key,
    tag_key,
    validate_name,
)

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    "text, want",
    [
        ("imagenet@latest", Ref("imagenet", tag="latest")),
        (f"imagenet-1k@{D1}", Ref("imagenet-1k", digest=D1)),
        ("a.b_c@V2.0-rc_1", Ref("a.b_c", tag="V2.0-rc_1")),
    ],
    ids=["tag", "digest", "punctuation"],
)
def test_parse_ref_accepts_tags_and_digests(text: str, want: Ref) -> None:
    assert parse_ref(text) == want
    assert str(parse_ref(text)) == text
    assert parse_ref(text).is_pinned == (want.digest is not None)


@pytest.mark.parametrize(
    "text",
    [
        "imagenet", "imagenet@", "@latest", "Imagenet@latest", "imagenet@sha256:abc", f"imagenet@{D1.upper()}",
        "image net@latest", "imagenet@la test", "imagenet@-x", "../etc@latest", "imagenet@a/b", "imagenet@x\n",
        "a" * 64 + "@latest", "imagenet@" + "t" * 129,
    ],
)  # fmt: skip
def test_parse_ref_refuses_what_is_not_a_name_and_a_ref(text: str) -> None:
    with pytest.raises(InvalidInput, match="bad"):
        parse_ref(text)


def test_keys_follow_the_documented_layout() -> None:
    assert shard_key(D1) == "datasets/shards/sha256/" + "a" * 64
    assert manifest_key("imagenet", D2) == f"datasets/imagenet/manifests/{D2}.json"
    assert tag_key("imagenet", "latest") == "datasets/imagenet/tags/latest"
    with pytest.raises(InvalidInput):
        tag_key("imagenet", "../manifests/x")
    with pytest.raises(InvalidInput, match="dataset name"):
        validate_name("shards/..")


@pytest.mark.parametrize(
    "path, problem",
    [
        ("a/b.txt", None),
        ("ünïcødé/файл.bin", None),
        ("", "empty"),
        ("/etc/passwd", "absolute"),
        ("a/../../etc", "'..'"),
        ("..", "'..'"),
        ("a//b", "empty or '.'"),
        ("./a", "empty or '.'"),
        ("a/", "empty or '.'"),
        ("a\nb", "control character"),
        ("a\x00b", "control character"),
        ("bad\udcff", "UTF-8"),
        ("x" * 4097, "longer than 4096"),
    ],
)
def test_path_rules(path: str, problem: str | None) -> None:
    got = path_problem(path)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got


def _manifest(files=None, shards=None):
    files = files or [
        FileEntry("b/two.bin", D1, 3, 4, sha256_digest(b"2222"), 0o600),
        FileEntry("a/one.txt", D1, 0, 3, sha256_digest(b"111"), 0o644),
    ]
    return build_manifest("demo", "2026-01-02T03:04:05Z", files, shards or [ShardRef(D1, 7)])


def test_manifest_is_canonical_and_its_digest_is_the_hash_of_its_bytes() -> None:
    m = _manifest()
    data = m.canonical_bytes()
    assert b" " not in data and b"\n" not in data
    assert list(json.loads(data)) == sorted(json.loads(data))  # sorted keys
    assert [f.path for f in m.files] == ["a/one.txt", "b/two.bin"]  # sorted by path whatever the input order
    assert m.digest() == sha256_digest(data)
    assert parse_manifest(data, expect_name="demo") == m
    assert parse_manifest(data).canonical_bytes() == data  # round trip is byte-identical
    assert m.total_bytes == 7
    assert [f.path for f in m.files_in(D1)] == ["a/one.txt", "b/two.bin"]


def test_any_change_changes_the_digest() -> None:
    m = _manifest()
    other = _manifest(files=[FileEntry("a/one.txt", D1, 0, 3, sha256_digest(b"111"), 0o600)])
    assert m.digest() != other.digest()


@pytest.mark.parametrize(
    "files, shards, match",
    [
        ([FileEntry("a", D2, 0, 1, D1)], [ShardRef(D1, 1)], "unlisted shard"),
        ([FileEntry("a", D1, 0, 2, D1)], [ShardRef(D1, 1)], "outside shard"),
        ([FileEntry("a", D1, 0, 2, D1), FileEntry("b", D1, 1, 1, D1)], [ShardRef(D1, 2)], "overlap"),
        ([FileEntry("../x", D1, 0, 1, D1)], [ShardRef(D1, 1)], "bad path"),
        ([FileEntry("a", D1, 0, 1, D1, 0o17777)], [ShardRef(D1, 1)], "bad mode"),
    ],
    ids=["unlisted", "outside", "overlap", "traversal", "mode"],
)
def test_inconsistent_manifests_are_refused(files, shards, match) -> None:
    with pytest.raises(IntegrityError, match=match):
        build_manifest("demo", "t", files, shards)


def test_parse_refuses_malformed_or_foreign_manifests() -> None:
    good = json.loads(_manifest().canonical_bytes())
    with pytest.raises(IntegrityError, match="malformed"):
        parse_manifest(b"{not json")
    with pytest.raises(IntegrityError, match="format"):
        parse_manifest(json.dumps({**good, "format": "other/v9"}).encode())
    with pytest.raises(IntegrityError, match="stored under"):
        parse_manifest(json.dumps(good).encode(), expect_name="other")
    bad = json.loads(json.dumps(good))
    bad["files"]["a/one.txt"]["offset"] = "0"
    with pytest.raises(IntegrityError, match="integer"):
        parse_manifest(json.dumps(bad).encode())
    bad = {**good, "files": {"/etc/passwd": good["files"]["a/one.txt"]}}
    with pytest.raises(IntegrityError, match="absolute"):
        parse_manifest(json.dumps(bad).encode())


# -- packing ---------------------------------------------------------------------------------------------------
def _tree(n: int, seed: int = 1, max_size: int = 200_000) -> list[SourceFile]:
    rng = random.Random(seed)
    return [SourceFile(f"d{i % 17}/f{i:05d}.bin", rng.randrange(max_size)) for i in range(n)]


def _boundaries(shards) -> list[tuple[str, ...]]:
    return [tuple(f.path for f in s.files) for s in shards]


def test_packing_keeps_every_file_once_in_path_order_within_bounds() -> None:
    files = _tree(3000)
    target = 4_000_000
    shards = plan_shards(files, target)
    flat = [f for s in shards for f in s.files]
    assert flat == sorted(files, key=lambda f: f.path)
    assert all(s.size <= 2 * target for s in shards)
    assert all(s.size >= target // 4 for s in shards[:-1])
    mean = sum(s.size for s in shards) / len(shards)
    assert target * 0.6 < mean < target * 1.5, mean
    assert shards[0].offsets()[:2] == [0, shards[0].files[0].size]


def test_big_files_get_a_shard_of_their_own() -> None:
    files = [SourceFile("a", 10), SourceFile("b", 100), SourceFile("c", 10)]
    assert _boundaries(plan_shards(files, 40)) == [("a",), ("b",), ("c",)]


def test_packing_is_deterministic_and_a_small_change_moves_few_boundaries() -> None:
    files = _tree(5000, seed=7)
    target = 8_000_000
    before = plan_shards(files, target)
    assert plan_shards(list(reversed(files)), target) == before
    changed = list(files)
    changed[2500] = SourceFile(changed[2500].path, changed[2500].size + 50_000)  # one file grows
    changed.insert(100, SourceFile("d0/new-file.bin", 120_000))  # one file added
    after = plan_shards(changed, target)
    same = set(_boundaries(before)) & set(_boundaries(after))
    assert len(before) - len(same) <= 4, (len(before), len(same))  # only the shards around the two edits differ


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=80), st.integers(4, 3000))
def test_packing_property_every_byte_is_placed_exactly_once(sizes: list[int], target: int) -> None:
    files = [SourceFile(f"f{i:03d}", s) for i, s in enumerate(sizes)]
    shards = plan_shards(files, target)
    assert sum(s.size for s in shards) == sum(sizes)
    assert sorted(f.path for s in shards for f in s.files) == [f.path for f in files]
    for s in shards:
        assert len(s.files) == 1 or s.size <= 2 * target


def test_a_sample_index_is_stored_in_the_snapshot_and_changes_the_digest_only_when_given() -> None:
    files = [
        FileEntry("d1/cam_front/000123.jpg", D1, 0, 1, D1), FileEntry("d1/cam_left/000123.jpg", D1, 1, 1, D1),
        FileEntry("d1/labels/000123.json", D1, 2, 1, D1), FileEntry("README", D1, 3, 1, D1),
    ]  # fmt: skip
    plain = build_manifest("demo", "2026-01-02T03:04:05Z", files, [ShardRef(D1, 4)])
    assert "samples" not in json.loads(plain.canonical_bytes())  # a snapshot without an index keeps its digest
    pattern = r"^([^/]+)/[^/]+/(\d+)\."
    indexed = build_manifest("demo", "2026-01-02T03:04:05Z", files, [ShardRef(D1, 4)], samples=pattern)
    assert json.loads(indexed.canonical_bytes())["samples"] == pattern and indexed.digest() != plain.digest()
    assert parse_manifest(indexed.canonical_bytes()) == indexed  # round trip, pattern included
    with pytest.raises(InvalidInput, match="matches none of the snapshot's 4 files"):
        build_manifest("demo", "2026-01-02T03:04:05Z", files, [ShardRef(D1, 4)], samples=r"^nope/")
    for bad, match in ((r"(unclosed", "sample pattern"), (7, "not a string")):
        obj = json.loads(plain.canonical_bytes())
        obj["samples"] = bad
        with pytest.raises(IntegrityError, match=match):
            parse_manifest(json.dumps(obj).encode())

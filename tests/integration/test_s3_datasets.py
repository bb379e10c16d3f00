"""Dataset snapshots against the dev cluster's real SeaweedFS: write, dedup, conditional writes, tampering, crashes.

Every dataset name carries a random suffix and every tree random bytes, so the tests neither see each other's
shards nor depend on the order they run in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner

from nuro.datasets.errors import DatasetNotFound, IntegrityError, TagConflict
from nuro.datasets.manifest import manifest_key, manifests_prefix, shard_key, tag_key
from nuro.datasets.reader import PinnedDataset
from nuro.datasets.refs import get_tag, load_manifest, resolve, set_tag
from nuro.datasets.snapshot import snapshot
from nuro.datasets.verify import verify
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.devcluster.record import read_record
from nuro.login.dataset_cli import dataset
from nuro.objectstore import (
    AccessDenied,
    ObjectExists,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailed,
    StoreUnavailable,
)
from tests.integration.conftest import REPO, TEST_PORT_BASE, LiveCluster

pytestmark = pytest.mark.slurm

KiB = 1024
SHARD = 256 * KiB  # small shards so a few MiB make many of them


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _tree(root: Path, n_files: int = 40, size: int = 30 * KiB) -> Path:
    for i in range(n_files):
        path = root / f"part{i % 3}" / f"sample-{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size + i))
    (root / "README.txt").write_text("a small test dataset\n")
    return root


@pytest.fixture(scope="module")
def store(cluster: LiveCluster) -> ObjectStore:
    return ObjectStore.from_env(cluster.env)


@pytest.fixture
def cli(cluster: LiveCluster):
    def invoke(*args: str):
        return CliRunner().invoke(dataset, list(args), env=cluster.env)

    return invoke


def _raw_client(cluster: LiveCluster, secret: str | None = None):
    env = cluster.env
    return boto3.client(
        "s3", endpoint_url=env["NURO_S3_ENDPOINT"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=secret or env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
    )  # fmt: skip


def test_cluster_runs_seaweedfs_on_its_own_ports(cluster: LiveCluster, tmp_path: Path) -> None:
    record = read_record(cluster.layout.record)
    assert record is not None and "seaweedfs" in [d.name for d in record.daemons]
    assert cluster.env["NURO_S3_ENDPOINT"] == f"http://127.0.0.1:{TEST_PORT_BASE + 33}"
    assert s3.is_ready(PortPlan(TEST_PORT_BASE), cluster.layout.s3_data)
    assert not s3.is_ready(PortPlan(TEST_PORT_BASE))  # the fixed key in the source is not this cluster's admin
    # A second S3 with another port base runs beside it, and each holds its own objects.
    with s3.standalone(tmp_path / "other", TEST_PORT_BASE + 100):
        other = s3.dev_store(PortPlan(TEST_PORT_BASE + 100))
        key = f"coexist/{uuid.uuid4().hex}"
        assert other.put_if_absent(key, b"other")
        assert not ObjectStore.from_env(cluster.env).exists(key)


def test_snapshot_resolve_tag_verify_show_ls(cluster: LiveCluster, store: ObjectStore, cli, tmp_path: Path) -> None:
    name = _name("flow")
    data = _tree(tmp_path / "data")
    res = cli("snapshot", str(data), "--name", name, "--tag", "latest", "--shard-mib", "1", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    digest = out["digest"]
    assert out["files"] == 41 and out["shards"] >= 2 and out["shards_uploaded"] == out["shards"]
    assert resolve(store, f"{name}@latest") == digest == resolve(store, f"{name}@{digest}")
    assert store.exists(manifest_key(name, digest))

    res = cli("verify", f"{name}@latest")
    assert res.exit_code == 0, res.stderr
    assert f"ok: {name}@{digest}: 41 files" in res.stdout

    shown = json.loads(cli("show", f"{name}@latest", "--json").stdout)
    assert shown["digest"] == digest and shown["tags"] == ["latest"] and shown["files"] == 41
    assert shown["manifest"]["files"]["README.txt"]["length"] == len("a small test dataset\n")
    listed = {d["name"]: d for d in json.loads(cli("ls", "--json").stdout)}
    assert listed[name]["snapshots"] == 1 and listed[name]["tags"] == {"latest": digest}

    res = cli("tag", f"{name}@{digest}", "v1")
    assert res.exit_code == 0 and resolve(store, f"{name}@v1") == digest


def test_progress_reports_every_byte(store: ObjectStore, tmp_path: Path) -> None:
    seen: list[int] = []
    planned: list[tuple[int, int]] = []
    res = snapshot(
        store, _tree(tmp_path / "d", 20, 50 * KiB), _name("progress"), target_bytes=SHARD,
        progress=seen.append, on_plan=lambda total, n: planned.append((total, n)),
    )  # fmt: skip
    assert planned == [(res.total_bytes, res.shards)] and sum(seen) == res.total_bytes


def test_a_second_snapshot_of_the_same_data_writes_no_new_shard(store: ObjectStore, tmp_path: Path) -> None:
    data = _tree(tmp_path / "data", 60)
    first = snapshot(store, data, _name("dedup-a"), target_bytes=SHARD)
    shards_before = sum(1 for _ in store.list("datasets/shards/"))
    second = snapshot(store, data, _name("dedup-b"), target_bytes=SHARD)  # another dataset, same bytes
    assert first.shards_uploaded == first.shards >= 3
    assert (second.shards_uploaded, second.shards_present, second.bytes_uploaded) == (0, second.shards, 0)
    assert sum(1 for _ in store.list("datasets/shards/")) == shards_before


def test_conditional_writes_never_overwrite(cluster: LiveCluster, store: ObjectStore, tmp_path: Path) -> None:
    name = _name("cond")
    res = snapshot(store, _tree(tmp_path / "data", 5), name, "stable", target_bytes=SHARD)
    key = manifest_key(name, res.digest)
    original, _ = store.get(key)
    assert store.put_if_absent(key, b"{}") is False  # a second manifest put is refused...
    with pytest.raises(ObjectExists, match="PreconditionFailed"):
        store.put(key, b"{}", if_none_match=True)
    assert store.get(key)[0] == original  # ...and the stored one is untouched
    raw = _raw_client(cluster)
    with pytest.raises(raw.exceptions.ClientError) as err:
        raw.put_object(Bucket=store.bucket, Key=key, Body=b"{}", IfNoneMatch="*")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412

    other = snapshot(store, _tree(tmp_path / "other", 3), name, target_bytes=SHARD).digest
    with pytest.raises(TagConflict, match="--force"):
        set_tag(store, name, "stable", other)  # tags are not moved by accident
    state = get_tag(store, name, "stable")
    assert state is not None and state.digest == res.digest
    moved = set_tag(store, name, "stable", other, force=True)
    assert (moved.digest, moved.previous) == (other, res.digest)
    with pytest.raises(PreconditionFailed):  # a mover holding the old ETag cannot overwrite the newer move
        store.put_if_match(tag_key(name, "stable"), b'{"digest": "x"}', state.etag)
    assert resolve(store, f"{name}@stable") == other


def test_tampered_shard_is_caught_naming_the_file(cluster: LiveCluster, store: ObjectStore, cli, tmp_path) -> None:
    name = _name("tamper")
    data = _tree(tmp_path / "data", 30)
    digest = snapshot(store, data, name, target_bytes=SHARD).digest
    manifest, _ = load_manifest(store, name, digest)
    victim = manifest.files[7]
    shard, _ = store.get(shard_key(victim.shard))
    flipped = bytearray(shard)
    flipped[victim.offset + 5] ^= 0xFF
    _raw_client(cluster).put_object(Bucket=store.bucket, Key=shard_key(victim.shard), Body=bytes(flipped))

    report = verify(store, name, digest)
    assert not report.ok and report.bad_files == [victim.path]
    res = cli("verify", f"{name}@{digest}")
    assert res.exit_code == 1
    assert f"file {victim.path}: content does not match" in res.stderr and "verification failed" in res.stderr


def test_a_job_reads_pinned_files_verified_and_refuses_altered_bytes(
    cluster: LiveCluster, store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _name("reader")
    data = _tree(tmp_path / "data", 12)
    digest = snapshot(store, data, name, target_bytes=SHARD).digest
    monkeypatch.setenv("NURO_DATASET", name)
    monkeypatch.setenv("NURO_DATASET_DIGEST", digest)
    pinned = PinnedDataset.from_env(store)
    assert pinned.paths()[0] == "README.txt" and len(pinned.paths()) == 13
    for path in ("README.txt", "part1/sample-0004.bin"):
        assert pinned.read(path) == (data / path).read_bytes()
    with pytest.raises(DatasetNotFound, match="no file 'nope'"):
        pinned.read("nope")

    victim = next(f for f in pinned.manifest.files if f.path == "part2/sample-0005.bin")
    shard, _ = store.get(shard_key(victim.shard))
    flipped = bytearray(shard)
    flipped[victim.offset] ^= 0xFF
    _raw_client(cluster).put_object(Bucket=store.bucket, Key=shard_key(victim.shard), Body=bytes(flipped))
    with pytest.raises(IntegrityError, match="part2/sample-0005.bin read back"):
        pinned.read(victim.path)


def test_tampered_manifest_is_refused(cluster: LiveCluster, store: ObjectStore, tmp_path: Path) -> None:
    name = _name("tamper-m")
    digest = snapshot(store, _tree(tmp_path / "data", 3), name, target_bytes=SHARD).digest
    data, _ = store.get(manifest_key(name, digest))
    forged = data.replace(b'"mode":420', b'"mode":511')
    _raw_client(cluster).put_object(Bucket=store.bucket, Key=manifest_key(name, digest), Body=forged)
    with pytest.raises(IntegrityError, match="altered"):
        verify(store, name, digest)


def test_bad_credentials_are_access_denied_with_s3s_message(cluster: LiveCluster, cli) -> None:
    bad = ObjectStore.from_env(cluster.env, secret_key="not-the-secret")
    with pytest.raises(AccessDenied) as err:
        bad.get("datasets/anything")
    assert "signature we calculated does not match" in str(err.value), str(err.value)
    res = CliRunner().invoke(dataset, ["ls"], env={**cluster.env, "AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert res.exit_code == 1 and "SignatureDoesNotMatch" in res.stderr


def test_usage_and_not_found_exit_codes(cli, tmp_path: Path) -> None:
    assert cli("show", "nope-" + uuid.uuid4().hex[:6] + "@latest").exit_code == 4
    assert cli("verify", "x@sha256:" + "0" * 64).exit_code == 4
    assert cli("show", "Bad Name@latest").exit_code == 2
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "d" / "link").symlink_to("/etc/passwd")
    res = cli("snapshot", str(tmp_path / "d"), "--name", "links")
    assert res.exit_code == 2 and "symlink" in res.stderr


_DIE_AFTER_TWO_SHARDS = """
import os, signal, sys
from pathlib import Path
from nuro.objectstore import ObjectStore
from nuro.datasets.snapshot import snapshot
real = ObjectStore.put_if_absent
stored = []
def put_then_die(self, key, data, progress=None):
    if key.startswith("datasets/shards/") and len(stored) == 2:
        os.kill(os.getpid(), signal.SIGKILL)  # between shards: two are durable, the third never starts
    ok = real(self, key, data, progress)
    stored.append(key)
    return ok
ObjectStore.put_if_absent = put_then_die
snapshot(ObjectStore.from_env(), Path(sys.argv[1]), sys.argv[2], target_bytes=int(sys.argv[3]), inflight=1)
"""


def test_crash_mid_snapshot_leaves_no_manifest_and_a_rerun_completes(
    cluster: LiveCluster, store: ObjectStore, tmp_path: Path
) -> None:
    name = _name("crash")
    data = _tree(tmp_path / "data", 60)
    proc = subprocess.run(
        [sys.executable, "-c", _DIE_AFTER_TWO_SHARDS, str(data), name, str(SHARD)],
        env={**os.environ, **cluster.env}, cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert list(store.list(manifests_prefix(name))) == []  # the snapshot does not exist

    res = snapshot(store, data, name, target_bytes=SHARD)
    assert res.shards >= 4 and res.shards_present == 2 and res.shards_uploaded == res.shards - 2
    assert [o.key for o in store.list(manifests_prefix(name))] == [manifest_key(name, res.digest)]
    assert verify(store, name, res.digest).ok


def test_a_big_file_streams_through_multipart_and_verifies(store: ObjectStore, cli, tmp_path: Path) -> None:
    data = _tree(tmp_path / "data", 4)
    (data / "big.bin").write_bytes(os.urandom(40 * 1024 * KiB))  # > 2x shard and > the 32 MiB multipart threshold
    name = _name("big")
    res = snapshot(store, data, name, target_bytes=SHARD)
    manifest, _ = load_manifest(store, name, res.digest)
    big = next(f for f in manifest.files if f.path == "big.bin")
    assert big.shard == big.sha256 and store.head(shard_key(big.shard)).etag.endswith('-3"')  # 3 parts of 16 MiB
    assert cli("verify", f"{name}@{res.digest}").exit_code == 0


@pytest.mark.parametrize("size", [3 * KiB, 40 * 1024 * KiB], ids=["single-put", "multipart"])
def test_put_file_never_stores_bytes_that_miss_their_hash(store: ObjectStore, tmp_path: Path, size: int) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    key = f"test/{uuid.uuid4().hex}"
    with pytest.raises(ObjectStoreError, match="changed while it was uploaded"):
        store.put_file(key, path, if_none_match=True, expected_sha256="0" * 64)
    assert not store.exists(key)


def test_an_endpoint_that_does_not_answer_is_store_unavailable(cluster: LiveCluster) -> None:
    dead = ObjectStore.from_env(
        cluster.env, endpoint_url=f"http://127.0.0.1:{TEST_PORT_BASE + 44}", max_attempts=1, connect_timeout_s=1.0
    )
    with pytest.raises(StoreUnavailable, match="did not answer"):
        dead.head("anything")

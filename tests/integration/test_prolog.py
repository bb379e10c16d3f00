"""The prolog on the real cluster: a job pinned to a dataset snapshot starts only if the snapshot verifies; a tampered
shard or a malformed pin holds the job with a reason its owner can read, before anything trains."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from nuro.datasets.manifest import shard_key
from nuro.datasets.refs import load_manifest
from nuro.datasets.snapshot import snapshot
from nuro.objectstore import ObjectStore
from nuro.protocol import adminnote, jobcomment
from nuro.slurm import JobPhase
from tests.integration.conftest import LiveCluster, cancel_jobs_of, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def store(cluster: LiveCluster) -> Iterator[ObjectStore]:
    """The cluster's S3, with the job_submit bridge in pass-through (no policy table) for this module: these tests
    prove the prolog is a second line of defence, so records the bridge would refuse must reach it."""
    table = Path(cluster.env["SLURM_CONF"]).parent / "nuro_policy.lua"
    saved = table.read_bytes() if table.exists() else None
    table.unlink(missing_ok=True)
    yield ObjectStore.from_env(cluster.env)
    if saved is not None:
        table.write_bytes(saved)


@pytest.fixture
def shared_tmp(cluster: LiveCluster) -> Iterator[Path]:
    """Job output under the cluster's state dir, not pytest's tmp: a concurrent pytest session resets
    /tmp/pytest-of-root to 0700 and the job's user could no longer write its output there."""
    d = cluster.layout.root / f"prolog-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _dataset(store: ObjectStore, root: Path) -> tuple[str, str]:
    for i in range(6):
        (root / f"shard-{i}.bin").parent.mkdir(parents=True, exist_ok=True)
        (root / f"shard-{i}.bin").write_bytes(os.urandom(40_000 + i))
    name = f"prolog-{uuid.uuid4().hex[:8]}"
    return name, snapshot(store, root, name, target_bytes=64 * 1024).digest


def _submit(cluster: LiveCluster, out: Path, comment: str) -> int:
    res = subprocess.run(
        ["runuser", "-u", "nuro-alice", "--", "env", *(f"{k}={v}" for k, v in cluster.env.items()),
         "sbatch", "--parsable", "--nodes=2", f"--output={out}", f"--comment={comment}"],
        input="#!/bin/bash\necho TRAINING-STARTED\n", capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return int(res.stdout.strip())


def _pin(name: str, digest: str) -> str:
    return jobcomment.merge(None, nuro={"v": 1, "dataset": {"name": name, "digest": digest}})  # canonical form


def _held_with_reason(cluster: LiveCluster, job_id: int) -> str:
    def refused():
        job = next((j for j in cluster.backend.jobs() if j.job_id == job_id), None)
        if job is None or job.phase is not JobPhase.PENDING:
            return None
        note = adminnote.parse(cluster.backend.job_admin_comment(job_id))  # root's note: a field no job can fill
        why = note.get("refused", {}).get("why")
        return why if why and job.reason.startswith("JobHeld") else None

    return wait_until(refused, 90, f"job {job_id} to be held with a reason")  # a prolog takes ~10-40 s here


def test_a_verified_snapshot_lets_the_job_run(cluster: LiveCluster, store: ObjectStore, shared_tmp: Path) -> None:
    name, digest = _dataset(store, shared_tmp / "data")
    job_id = _submit(cluster, shared_tmp / "ok.out", _pin(name, digest))
    job = cluster.backend.wait_for_job(job_id, timeout_s=60)
    assert job.phase is JobPhase.COMPLETED and "TRAINING-STARTED" in (shared_tmp / "ok.out").read_text()


def test_a_tampered_shard_holds_the_job_before_it_trains(
    cluster: LiveCluster, store: ObjectStore, shared_tmp: Path
) -> None:
    name, digest = _dataset(store, shared_tmp / "data")
    manifest, _ = load_manifest(store, name, digest)
    victim = manifest.files[2]
    body, _ = store.get(shard_key(victim.shard))
    bad = bytearray(body)
    bad[victim.offset] ^= 0xFF
    env = cluster.env
    boto3.client(
        "s3", endpoint_url=env["NURO_S3_ENDPOINT"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
    ).put_object(Bucket=store.bucket, Key=shard_key(victim.shard), Body=bytes(bad))  # fmt: skip
    out = shared_tmp / "tampered.out"
    job_id = _submit(cluster, out, _pin(name, digest))
    try:
        why = _held_with_reason(cluster, job_id)
        assert "failed verification" in why and victim.path in why and "re-snapshot" in why, why
        assert not out.exists() or "TRAINING-STARTED" not in out.read_text()
        shown = cluster.run([str(BIN / "nuro-train"), "status", str(job_id), "--json"], check=False)
        assert shown.returncode == 0 and "failed verification" in shown.stdout
    finally:
        cancel_jobs_of(cluster, ("nuro-alice",))


def test_a_malformed_pin_is_refused_and_nothing_runs(
    cluster: LiveCluster, store: ObjectStore, shared_tmp: Path
) -> None:
    out = shared_tmp / "bad.out"
    job_id = _submit(cluster, out, _pin("data", "sha256:$(touch /tmp/nuro-pwned)"))
    try:
        why = _held_with_reason(cluster, job_id)
        assert "bad dataset pin" in why, why
        assert not Path("/tmp/nuro-pwned").exists()
        assert not out.exists() or "TRAINING-STARTED" not in out.read_text()
    finally:
        cancel_jobs_of(cluster, ("nuro-alice",))


def test_a_plain_job_without_metadata_is_untouched(cluster: LiveCluster, store: ObjectStore, shared_tmp: Path) -> None:
    job_id = _submit(cluster, shared_tmp / "plain.out", "just a note")
    assert cluster.backend.wait_for_job(job_id, timeout_s=60).phase is JobPhase.COMPLETED


def test_a_store_that_never_answers_holds_the_job_within_the_deadline_and_drains_nothing(
    cluster: LiveCluster, store: ObjectStore, shared_tmp: Path
) -> None:
    """Fail closed, never hang: the prolog's S3 endpoint accepts connections and never answers; the pin cannot
    be verified, so the job is held with that reason within the prolog's own deadline, and no node is drained."""
    import socket
    import threading

    name, digest = _dataset(store, shared_tmp / "data")  # a fresh digest: not in any node's verified cache
    env_file = cluster.layout.nuro_env
    saved = env_file.read_bytes()
    tarpit = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        tarpit.settimeout(0.5)
        while not stop.is_set():
            try:
                held.append(tarpit.accept()[0])  # never answered
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    lines = [ln for ln in saved.decode().splitlines() if not ln.startswith(("NURO_S3_ENDPOINT=", "NURO_PROLOG_DEAD"))]
    lines += [f"NURO_S3_ENDPOINT=http://127.0.0.1:{tarpit.getsockname()[1]}", "NURO_PROLOG_DEADLINE_S=66"]
    env_file.write_text("\n".join(lines) + "\n")
    out = shared_tmp / "tarpit.out"
    try:
        job_id = _submit(cluster, out, _pin(name, digest))
        why = _held_with_reason(cluster, job_id)
        # within what the 66 s deadline leaves after its 60 s reserve (less the prolog's own start)
        assert re.search(r"could not be verified: .* within [0-9] s", why) and "scontrol release" in why, why
        assert not out.exists() or "TRAINING-STARTED" not in out.read_text()
        drained = cluster.run(["sinfo", "-h", "-R", "-o", "%N %E"], check=False).stdout.strip()
        assert not drained, f"a node was drained for the store's silence: {drained}"
    finally:
        env_file.write_bytes(saved)
        stop.set()
        tarpit.close()
        for conn in held:
            conn.close()
        cancel_jobs_of(cluster, ("nuro-alice",))

"""Checkpoints against a real SeaweedFS and real torch DCP: save → upload → manifest → restore, corruption, torn and
given-up steps, an S3 outage during training, a save killed mid-write, retention, and a 2-process gloo group.

One SeaweedFS (``standalone``, port base 8800, state under ``.devcluster-test-8800-ckpt``) serves the module; the
outage test stops and restarts it. Every test uses its own run name, so tests do not see each other's steps.
Processes are few (torch costs ~5 s of CPU to import): one subprocess for the SIGKILL test, two for the gloo group.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import boto3
import pytest
import torch

from nuro.checkpoint import layout as L
from nuro.checkpoint.manifest import FileEntry, UploadRequest, dumps, parse_part
from nuro.checkpoint.restore import load_manifest, restore_latest
from nuro.checkpoint.retention import tag_step
from nuro.checkpoint.staging import read_request, write_request
from nuro.checkpoint.upload import UploadWorker
from nuro.checkpoint.verify import check_remote_shard
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.objectstore import ObjectStore
from nuro.protocol import jobrecord
from nuro.runs.report import RunRef, checkpoint_status, gather_artifacts
from nuro.wrappers.sdk.checkpointer import Checkpointer
from tests.gloo import free_port

REPO = Path(__file__).resolve().parents[2]
PORT_BASE = int(os.environ.get("NURO_TEST_CKPT_PORT_BASE", "8800"))
STATE_DIR = REPO / f".devcluster-test-{PORT_BASE}-ckpt"
TEAM = "vision"


class S3Server:
    """The module's SeaweedFS, stoppable and restartable (data persists in STATE_DIR across restarts)."""

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self.ports = PortPlan(PORT_BASE)

    def start(self) -> None:
        stack = ExitStack()
        stack.enter_context(s3.standalone(STATE_DIR, PORT_BASE))
        self._stack = stack

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def store(self, **overrides: object) -> ObjectStore:
        return s3.dev_store(self.ports, **overrides)

    def env(self) -> dict[str, str]:
        return s3.s3_env(self.ports)


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    srv = S3Server()
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        shutil.rmtree(STATE_DIR, ignore_errors=True)


@pytest.fixture
def store(server: S3Server) -> ObjectStore:
    return server.store()


def _run() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _state(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"model": {"w": torch.randn(256, 64, generator=g), "b": torch.randn(64, generator=g)}, "step": seed}


def _zeros() -> dict:
    return {"model": {"w": torch.zeros(256, 64), "b": torch.zeros(64)}, "step": -1}


def _ckpt(store: ObjectStore, run: str, staging: Path, **kw) -> Checkpointer:
    return Checkpointer(team=TEAM, run=run, store=store, staging_dir=staging, upload=kw.pop("upload", "inline"), **kw)


def _raw(server: S3Server):
    env = server.env()
    return boto3.client(
        "s3", endpoint_url=env["NURO_S3_ENDPOINT"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
    )  # fmt: skip


def _record(root: Path, job: int, run: str | None, team: str = TEAM, keep: int | None = None) -> None:
    """What the prolog writes for a job on this node: the root-owned record root's upload worker trusts."""
    rec = jobrecord.JobRecord(job, os.getuid(), os.getgid(), "tester", team, team, run, 0, "n1", keep)
    jobrecord.write(root, rec)


def _steps_in_s3(store: ObjectStore, run: str) -> list[int]:
    return sorted({L.parse_step_name(o.key.split("/")[3]) for o in store.list(L.run_prefix(TEAM, run))} - {None})


def test_save_upload_commit_restore_round_trip(store: ObjectStore, tmp_path: Path) -> None:
    run = _run()
    ck = _ckpt(store, run, tmp_path / "node" / "101", keep=5)
    for step in (10, 20):
        ck.save(_state(step), step)  # async: returns after staging in memory
    assert ck.wait_committed(20, 30)
    ck.close()
    m = load_manifest(store, TEAM, run, 20)
    assert (m.step, m.parent, m.parts, m.world_size, m.job_id) == (20, 10, 1, 1, "101")
    assert {s.path for s in m.shards} >= {".metadata", "__0_0.distcp"}
    assert m.total_bytes == sum(s.size for s in m.shards)

    # a fresh node (empty staging): downloaded from S3, verified, loaded
    fresh = _ckpt(store, run, tmp_path / "other" / "102")
    state = _zeros()
    assert fresh.restore(state) == 20
    want = _state(20)
    assert torch.equal(state["model"]["w"], want["model"]["w"]) and state["step"] == 20
    assert fresh.latest_committed_step() == 20
    fresh.close()

    # the node that saved it: the local copy is used (no download)
    found = restore_latest(store, TEAM, run, local_roots=[tmp_path / "node" / "101" / "ckpt"], dest=tmp_path / "d")
    assert found is not None and found.source == "local" and found.downloaded_bytes == 0


def test_corrupt_latest_falls_back_to_the_previous_valid_one(
    server: S3Server, store: ObjectStore, tmp_path: Path
) -> None:
    run = _run()
    ck = _ckpt(store, run, tmp_path / "n" / "201")
    for step in (1, 2):
        ck.save(_state(step), step, sync=True)
    assert ck.wait_committed(2, 30)
    ck.close()
    key = L.shard_key(TEAM, run, 2, "__0_0.distcp")
    body = bytearray(store.get(key)[0])
    body[len(body) // 2] ^= 0xFF  # same size, other bytes
    _raw(server).put_object(Bucket=store.bucket, Key=key, Body=bytes(body))

    found = restore_latest(store, TEAM, run, dest=tmp_path / "restore")
    assert found is not None and found.step == 1 and found.source == "s3"
    assert [s.step for s in found.skipped] == [2]
    assert "__0_0.distcp" in found.skipped[0].reason and "sha256" in found.skipped[0].reason
    assert not (tmp_path / "restore" / L.step_name(2)).exists()  # the bad download was removed

    # a missing shard is named too
    store.delete(L.shard_key(TEAM, run, 1, ".metadata"))
    assert restore_latest(store, TEAM, run, dest=tmp_path / "restore2") is None


def test_torn_and_given_up_steps_are_skipped(store: ObjectStore, tmp_path: Path) -> None:
    run = _run()
    ck = _ckpt(store, run, tmp_path / "n" / "301")
    ck.save(_state(5), 5, sync=True)
    assert ck.wait_committed(5, 30)
    ck.close()
    # step 9: shards and a part, no manifest (a node died before the last part)
    store.put(L.shard_key(TEAM, run, 9, "__0_0.distcp"), b"half")
    store.put(L.part_key(TEAM, run, 9, 0), b"{}")
    # step 7: given up by the epilog
    store.put(L.shard_key(TEAM, run, 7, "__0_0.distcp"), b"x")
    store.put(
        L.incomplete_key(TEAM, run, 7),
        dumps({"format": "nuro.checkpoint-incomplete/v1", "team": TEAM, "run": run, "step": 7, "job_id": "1",
               "restart": 0, "reason": "timeout", "missing_parts": [1], "created_at": "x"}),
    )  # fmt: skip
    found = restore_latest(store, TEAM, run, dest=tmp_path / "r")
    assert found is not None and found.step == 5
    reasons = {s.step: s.reason for s in found.skipped}
    assert "torn" in reasons[9] and "given up" in reasons[7]


def test_s3_outage_during_training_retries_until_committed(server: S3Server, tmp_path: Path) -> None:
    run = _run()
    store = server.store(connect_timeout_s=0.5, read_timeout_s=2.0, max_attempts=1)
    ck = _ckpt(store, run, tmp_path / "n" / "401")
    ck.save(_state(1), 1, sync=True)
    assert ck.wait_committed(1, 30)
    server.stop()
    try:
        steps_done = 0
        t0 = time.monotonic()
        ck.save(_state(2), 2)  # S3 is down: save still returns at once
        stall = time.monotonic() - t0
        w = torch.randn(64, 64)
        for _ in range(50):  # "training" goes on
            w = w @ w.T / 64
            steps_done += 1
        assert stall < 5 and steps_done == 50
        assert not ck.wait_committed(2, 3)  # nothing can commit while the store is down
        assert (ck.step_dir(2) / L.request_file(0)).is_file() and not (ck.step_dir(2) / L.DONE_FILE).exists()
    finally:
        server.start()
    assert ck.wait_committed(2, 60)  # the worker's backoff retries (at most 30 s apart)
    ck.close()
    assert load_manifest(store, TEAM, run, 2).parent == 1


_KILLED_SAVER = r"""
import sys, time, torch
from pathlib import Path
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.wrappers.sdk.checkpointer import Checkpointer
store = s3.dev_store(PortPlan(int(sys.argv[3])))
ck = Checkpointer(team="vision", run=sys.argv[1], store=store, staging_dir=Path(sys.argv[2]), upload="inline")
state = {"w%d" % i: torch.randn(1024, 1024) for i in range(16)}   # 64 MiB: the write takes a while
for step in range(1, 1000):
    print("saving", step, flush=True)
    ck.save(state, step, sync=True)
"""


def _mid_write(step_dir: Path) -> bool:
    step = L.parse_step_name(step_dir.name) or 0
    return step >= 2 and (step_dir / "__0_0.distcp").exists() and not (step_dir / L.request_file(0)).exists()


def test_a_save_killed_mid_write_never_commits_a_torn_checkpoint(store: ObjectStore, tmp_path: Path) -> None:
    run = _run()
    job = tmp_path / "n" / "501"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SAVER, run, str(job), str(PORT_BASE)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # kill when a step's DCP file is being written and its request is not there yet (mid-write)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(_mid_write(d) for d in (job / "ckpt").glob("step-*")):
                break
            time.sleep(0.005)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    staged = {p.name: p for p in (job / "ckpt").iterdir() if L.parse_step_name(p.name) is not None}
    torn = [L.parse_step_name(n) for n, p in staged.items() if not (p / L.request_file(0)).exists()]
    assert torn, f"expected the kill to land inside a write; staged: {sorted(staged)}"
    for step in torn:
        assert not store.exists(L.manifest_key(TEAM, run, step))

    # the node agent's worker picks up what the dead process left: requests commit, torn dirs never do
    _record(job.parent, 501, run)
    worker = UploadWorker(store, job.parent)
    for _ in range(20):
        worker.run_once()
        if not worker.pending("501"):
            break
        time.sleep(0.2)
    for step in torn:
        assert not store.exists(L.manifest_key(TEAM, run, step))
    found = restore_latest(store, TEAM, run, dest=tmp_path / "r")
    assert found is not None and found.step not in torn
    m = found.manifest
    assert all(check_remote_shard(store, m, e) is None for e in m.shards)


def test_retention_keeps_last_k_and_tagged_and_never_in_flight(store: ObjectStore, tmp_path: Path) -> None:
    run = _run()
    ck = _ckpt(store, run, tmp_path / "n" / "601", keep=2)
    ck.save(_state(1), 1, sync=True)
    assert ck.wait_committed(1, 30)
    tag_step(store, TEAM, run, 1, "best")
    store.put(L.shard_key(TEAM, run, 99, "__0_0.distcp"), b"in flight")  # a newer step still uploading elsewhere
    for step in (2, 3, 4, 5):
        ck.save(_state(step), step, sync=True)
        assert ck.wait_committed(step, 30)
    ck.close()
    assert _steps_in_s3(store, run) == [1, 4, 5, 99]
    assert store.exists(L.manifest_key(TEAM, run, 1))


def test_two_workers_committing_out_of_order_never_strand_the_older_step(store: ObjectStore, tmp_path: Path) -> None:
    """The job's inline worker and the node agent share a node: a newer step may commit before an older one. The
    older step keeps its objects while it would still be kept (keep 3); once ``keep`` newer steps committed and
    retention removed it, its uploader gives it up as superseded instead of waiting on its vanished part."""
    root = tmp_path / "staging"
    job = root / "701"
    for keep, steps, older_commits in ((3, (1, 2), True), (1, (1,), False)):
        run = _run()
        _stage(job, 0, {"__0_0.distcp": b"zero" * 64}, run=run, keep=keep, parts_expected=2)  # waits for a peer
        first = UploadWorker(store, root, job_dirs=[job], trust="request")
        assert first.run_once().waiting == [("701", 0)]  # part 0 uploaded and recorded; part 1 never comes
        for step in steps:  # the node agent commits newer steps meanwhile
            _stage(job, step, {"__0_0.distcp": bytes([step]) * 64}, run=run, keep=keep)
        other = UploadWorker(store, root, job_dirs=[job], trust="request")
        while any(s > 0 for s in other.pending("701")):
            other.run_once()
        step0 = job / "ckpt" / L.step_name(0)
        if older_commits:  # still within keep: its part stays; the peer's part arrives and it commits late
            assert store.exists(L.part_key(TEAM, run, 0, 0))
            (step0 / "__1_0.distcp").write_bytes(b"peer" * 64)  # the other node's part arrives
            peer = FileEntry("__1_0.distcp", 256, hashlib.sha256(b"peer" * 64).hexdigest())
            write_request(step0, dataclasses.replace(read_request(step0), part=1, files=(peer,)))
            UploadWorker(store, root, job_dirs=[job], trust="request").run_once()
            assert store.exists(L.manifest_key(TEAM, run, 0))
        else:  # retention took it: given up as superseded, not pending forever
            assert not store.exists(L.part_key(TEAM, run, 0, 0))
            last = UploadWorker(store, root, job_dirs=[job], trust="request")  # the first one's backoff is its own
            rep = last.run_once()
            assert rep.abandoned == [("701", 0)] and last.pending("701") == []
            assert "superseded" in (step0 / L.ABANDONED_FILE).read_text()
        shutil.rmtree(job)


_GLOO_WORKER = r"""
import os, sys, torch, torch.distributed as dist
from datetime import timedelta
from pathlib import Path

def main(rank, run, root, port, s3_port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank),
                      GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=60))
    from nuro.devcluster import s3
    from nuro.devcluster.layout import PortPlan
    from nuro.wrappers.sdk.checkpointer import Checkpointer
    store = s3.dev_store(PortPlan(s3_port))
    # each rank is its own "node" (GROUP_RANK), and both share one staging dir, like the emulated dev cluster's
    # nodes do: each node must upload only its own ranks' files, under its own request
    ck = Checkpointer(team="vision", run=run, store=store, staging_dir=Path(root) / "shared" / "777",
                      upload="inline")
    def state(step):
        g = torch.Generator().manual_seed(step)
        return {"shared": torch.randn(128, 128, generator=g), f"own{rank}": torch.full((64,), float(rank + step))}
    net = torch.ones(4)
    for step in (1, 2):
        ck.save(state(step), step)          # async, on the Checkpointer's own gloo group
        dist.all_reduce(net)                # training collectives on the default group meanwhile
    assert ck.wait_committed(2, 60), "step 2 not committed"
    ck.close()
    fresh = Checkpointer(team="vision", run=run, store=store, staging_dir=Path(root) / f"fresh{rank}" / "778",
                         upload="inline")
    got = {"shared": torch.zeros(128, 128), f"own{rank}": torch.zeros(64)}
    assert fresh.restore(got) == 2
    want = state(2)
    assert all(torch.equal(got[k], want[k]) for k in want), "restored tensors differ"
    fresh.close()

    # step 2's rank-0 shard torn in S3: rank 0's node still has its good local copy (the shared staging root), the
    # other node has none and must download it: both must agree on step 1, not fail nor load different steps
    from nuro.checkpoint import layout as L
    if rank == 0:
        store.put(L.shard_key("vision", run, 2, "__0_0.distcp"), b"torn")
    dist.barrier()
    where = Path(root) / ("shared" if rank == 0 else "other") / str(780 + rank)
    again = Checkpointer(team="vision", run=run, store=store, staging_dir=where, upload="inline")
    got = {"shared": torch.zeros(128, 128), f"own{rank}": torch.zeros(64)}
    assert again.restore(got) == 1, again.restore_skipped
    want = state(1)
    assert all(torch.equal(got[k], want[k]) for k in want), "step 1's tensors differ"
    assert [s for s, _ in again.restore_skipped] == [2], again.restore_skipped
    if rank == 0:  # the skip is on record for nuro-train artifacts/events, not only in this output
        import time
        from nuro.lifecycle import run_events
        deadline = time.monotonic() + 20
        while not (evs := [e for e in run_events.read(store, "vision", run, 780) if e.kind == "checkpoint_skipped"]):
            assert time.monotonic() < deadline, "no checkpoint_skipped run event"
            time.sleep(0.2)
        assert [s["step"] for s in evs[0].fields["steps"]] == [2] and evs[0].fields["restored"] == 1, evs
    again.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    import torch.multiprocessing as mp
    mp.spawn(main, args=tuple(sys.argv[1:3]) + (int(sys.argv[3]), int(sys.argv[4])), nprocs=2, join=True)
"""


def test_two_process_gloo_group_commits_one_manifest_of_two_parts(store: ObjectStore, tmp_path: Path) -> None:
    """Two gloo ranks as two nodes commit one manifest of two parts and restore it; then, with a shard of the
    newest step torn in S3 that only one node has a good local copy of, both fall back together to the step
    before (issue 15: rank 0 alone used to choose, and the other node's failure failed the whole restore)."""
    run = _run()
    script = tmp_path / "gloo_worker.py"
    script.write_text(_GLOO_WORKER)
    res = subprocess.run(
        [sys.executable, str(script), run, str(tmp_path), str(free_port()), str(PORT_BASE)],
        cwd=REPO, capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-4000:]
    m = load_manifest(store, TEAM, run, 2)
    assert (m.parts, m.world_size) == (2, 2)
    assert m.parent in (None, 1)  # two nodes' workers race: step 2 may commit before step 1 does
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= {s.path for s in m.shards}
    parts = [parse_part(store.get(L.part_key(TEAM, run, 2, p))[0]) for p in (0, 1)]
    assert {f.path for f in parts[0].files} == {".metadata", "__0_0.distcp"}
    assert {f.path for f in parts[1].files} == {"__1_0.distcp"}
    ref = RunRef(job_id=780, team=TEAM, run=run, meta={}, job=None)  # type: ignore[arg-type]
    shown = {c["step"]: c for c in gather_artifacts(ref, store)["checkpoints"]}
    assert shown[2]["damaged"] == [
        "__0_0.distcp (4 bytes, manifest says " + str(next(s.size for s in m.shards if s.path == "__0_0.distcp")) + ")"
    ], shown[2]
    assert [s["job_id"] for s in shown[2]["skipped_by"]] == [780] and not shown[1]["damaged"], shown
    assert checkpoint_status(shown[2]).startswith("torn: __0_0.distcp") and "skipped at restore by job 780" in (
        checkpoint_status(shown[2]))  # fmt: skip


def _stage(job_dir: Path, step: int, files: dict[str, bytes], **req: object) -> Path:
    """A step as a job leaves it: its files and its upload request (``req`` overrides any request field)."""
    import hashlib

    d = job_dir / "ckpt" / L.step_name(step)
    d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    entries = tuple(FileEntry(n, len(b), hashlib.sha256(b).hexdigest()) for n, b in sorted(files.items()))
    fields = {"team": TEAM, "run": "r", "step": step, "job_id": job_dir.name, "restart": 0, "part": 0,
              "parts_expected": 1, "world_size": 1, "files": entries, "created_at": "t", "keep": None}  # fmt: skip
    fields.update(req)
    write_request(d, UploadRequest(**fields))  # type: ignore[arg-type]
    return d


def test_root_worker_trusts_the_job_record_and_survives_hostile_job_dirs(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The node agent's worker (trust="record") over one staging root where most jobs are hostile: it commits the
    honest job's step, refuses every forgery and unsafe file with a reason, writes nothing under another run, and
    one pass finishes at once (no FIFO blocks it, no huge file is read)."""
    root = tmp_path / "staging"
    mine, theirs = _run(), _run()
    files = {".metadata": b"meta", "__0_0.distcp": os.urandom(4096)}
    victim = _ckpt(store, theirs, tmp_path / "victim" / "800", keep=5)  # the other run's committed step
    victim.save(_state(1), 1, sync=True)
    assert victim.wait_committed(1, 30)
    victim.close()
    before = {o.key: store.get(o.key)[0] for o in store.list(L.run_prefix(TEAM, theirs))}

    runs = {j: f"{mine}-{j}" for j in range(801, 814)}  # each job its own run: no step is committed by another
    honest = _stage(root / "801", 1, files, run=runs[801])
    _stage(root / "802", 1, files, run=theirs, keep=1)  # forged: another run, and keep=1 to delete its steps
    _stage(root / "803", 1, files, run=runs[803], team="nlp")  # forged: another team
    _stage(root / "804", 1, files, run=runs[804], restart=3)  # another attempt's request
    fifo_lock = _stage(root / "805", 1, files, run=runs[805])
    os.mkfifo(fifo_lock / L.lock_file(0))
    fifo_req = _stage(root / "806", 1, files, run=runs[806])
    (fifo_req / L.request_file(0)).unlink()
    os.mkfifo(fifo_req / L.request_file(0))
    links = _stage(root / "807", 1, {**files, "__1_0.distcp": b"x" * 10}, run=runs[807])
    (links / "__1_0.distcp").unlink()
    (links / "__1_0.distcp").symlink_to("/dev/zero")
    shadow = _stage(root / "808", 1, {**files, "__1_0.distcp": b"y"}, run=runs[808])
    (shadow / "__1_0.distcp").unlink()
    (shadow / "__1_0.distcp").symlink_to("/etc/shadow")
    huge = _stage(root / "809", 1, files, run=runs[809])
    with open(huge / L.request_file(0), "r+b") as fh:
        fh.truncate(8 << 30)  # sparse 8 GiB: never read past the cap
    swapped = root / "810" / "ckpt"
    swapped.mkdir(parents=True)
    (swapped / L.step_name(1)).symlink_to(honest)  # a step dir that is a symlink (to another job's step)
    _stage(root / "811", 1, files, run=runs[811])  # no record: root uploads nothing of it
    hard = _stage(root / "812", 1, files, run=runs[812])
    (hard / "__0_0.distcp").unlink()
    elsewhere = tmp_path / "someone-elses-file"
    elsewhere.write_bytes(files["__0_0.distcp"])
    os.link(elsewhere, hard / "__0_0.distcp")  # same bytes, but a hard link: root never reads it
    _stage(root / "813", 1, {**files, ".verified.json": b"{}"}, run=runs[813])  # lists a file of root's
    for job in range(801, 814):
        if job != 811:
            _record(root, job, runs[job])

    worker = UploadWorker(store, root)
    t0 = time.monotonic()
    report = worker.run_once()
    took = time.monotonic() - t0
    assert report.committed == [("801", 1)], report
    refused = (802, 803, 804, 805, 806, 807, 808, 809, 812, 813)
    assert sorted(report.abandoned) == [(str(j), 1) for j in refused], report
    assert report.skipped_jobs == ["811"], report
    assert took < 30, f"one pass took {took:.1f} s"
    assert store.exists(L.manifest_key(TEAM, runs[801], 1))
    assert not list(store.list(L.run_prefix("nlp", runs[803])))
    for j in refused:  # nothing of the refused jobs reached S3
        assert not list(store.list(L.run_prefix(TEAM, runs[j]))), j
    after = {o.key: store.get(o.key)[0] for o in store.list(L.run_prefix(TEAM, theirs))}
    assert after == before  # the other run: byte-identical, nothing new
    reasons = {
        j: json.loads((root / str(j) / "ckpt" / L.step_name(1) / L.ABANDONED_FILE).read_bytes())["reason"]
        for j in refused
    }
    assert "job record says" in reasons[802] and theirs in reasons[802], reasons[802]
    assert "team='nlp'" in reasons[803] and "restart=3" in reasons[804]
    assert "lock file is not a regular file" in reasons[805], reasons[805]
    assert "not a regular file" in reasons[806] and "symlink" in reasons[807] and "symlink" in reasons[808]
    assert "larger than" in reasons[809] and "links" in reasons[812], (reasons[809], reasons[812])
    assert "upload worker's own files" in reasons[813], reasons[813]
    assert not (root / "811" / "ckpt" / L.step_name(1) / L.ABANDONED_FILE).exists()
    # a second pass says nothing new and still finishes at once; flush of a hostile job is bounded too
    assert worker.run_once().committed == []
    assert sum("job=811 has no job record" in r.getMessage() for r in caplog.records) == 1  # once, not per pass
    res = worker.flush("805", timeout_s=2)
    assert res.committed == [] and res.incomplete == []


def test_the_epilog_ends_at_its_own_deadline_when_the_store_hangs(tmp_path: Path) -> None:
    """An S3 endpoint that accepts connections and never answers: the epilog's flush cannot finish, so the epilog
    stops waiting at NURO_EPILOG_DEADLINE_S (not at slurmd's PrologEpilogTimeout), removes the job dir and the job
    record, and exits 0 (a store outage is not the node's fault)."""
    import socket

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(64)  # connections complete in the kernel's backlog; nothing ever reads or answers
    try:
        node = tmp_path / "node1"
        root = node / "staging"
        run = _run()
        _stage(root / "3001", 1, {".metadata": b"m", "__0_0.distcp": os.urandom(1 << 20)}, run=run)
        _record(root, 3001, run)
        settings = {
            "NURO_S3_ENDPOINT": f"http://127.0.0.1:{hole.getsockname()[1]}", "NURO_S3_BUCKET": "nuro",
            "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y", "NURO_STAGING_ROOT": str(root),
            "NURO_EPILOG_FLUSH_TIMEOUT_S": "60", "NURO_EPILOG_DEADLINE_S": "4",
        }  # fmt: skip
        (node / "nuro.env").write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        env = {"PATH": os.environ["PATH"], "NURO_ENV_FILE": str(node / "nuro.env"), "SLURM_JOB_ID": "3001",
               "SLURMD_NODENAME": "node1", "NURO_HOOK_HEALTHCHECK": "0", "PYTHONPATH": str(REPO)}  # fmt: skip
        t0 = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "nuro.prolog_epilog.epilog"], env=env, capture_output=True,
                             text=True, timeout=120, cwd=REPO)  # fmt: skip
        took = time.monotonic() - t0
    finally:
        hole.close()
    assert res.returncode == 0, res.stderr
    assert "epilog deadline (4 s" in res.stderr, res.stderr
    assert took < 4 + 20, f"the epilog took {took:.1f} s with a 4 s deadline"  # + interpreter start and imports
    assert not (root / "3001").exists() and jobrecord.read(root, 3001) is None


def test_reused_staging_buffers_never_mix_saves(store: ObjectStore, tmp_path: Path) -> None:
    """Every save stages into the same buffers (issue 15 item 6): each step on disk must still hold exactly the
    state as it was when its save returned, while the training changes the tensors in place right after."""
    import torch.distributed.checkpoint as dcp

    ck = Checkpointer(team=TEAM, run=_run(), store=store, staging_dir=tmp_path / "job" / "901", upload="agent")
    state = {"w": torch.arange(1 << 16, dtype=torch.float32), "nested": {"b": torch.ones(8)}, "step": 0}
    assert ck.restore(state) is None  # nothing to load: pre-stages the state for the first save
    want = {}
    for step in (1, 2, 3):
        state["step"] = step
        ck.save(state, step)
        want[step] = (state["w"].clone(), state["nested"]["b"].clone())
        state["w"].add_(1000)  # in place, before the async write has finished
        state["nested"]["b"].mul_(3)
    stager = ck._stager
    ck.close(timeout_s=5)
    assert stager is not None
    for step, (w, b) in want.items():
        got = {"w": torch.zeros_like(w), "nested": {"b": torch.zeros(8)}, "step": -1}
        dcp.load(got, checkpoint_id=str(ck.step_dir(step)), no_dist=True)
        assert torch.equal(got["w"], w) and torch.equal(got["nested"]["b"], b) and got["step"] == step, step


_DS_WORKER = r"""
import os, sys, torch, torch.distributed as dist
from datetime import timedelta
from pathlib import Path
os.environ.setdefault("DS_ACCELERATOR", "cpu")
CFG = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 2},
       "zero_allow_untested_optimizer": True, "checkpoint": {"use_node_local_storage": True},
       "steps_per_print": 10**9}

def engine(world, seed):
    import deepspeed
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    cfg = dict(CFG, train_batch_size=16 * world)
    eng, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=cfg)
    return eng

def train(eng, steps, rank):
    losses = []
    for s in steps:
        x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1000 * s + rank))
        loss = torch.nn.functional.mse_loss(eng(x), x.sum(1, keepdim=True))
        eng.backward(loss)
        eng.step()
        losses.append(loss.item())
    return losses

def main(rank, world, run, root, port, s3_port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", GROUP_RANK=str(rank), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    from nuro.checkpoint.errors import CheckpointError
    from nuro.devcluster import s3
    from nuro.devcluster.layout import PortPlan
    from nuro.wrappers.sdk.checkpointer import Checkpointer
    store = s3.dev_store(PortPlan(s3_port))
    jobs = {"node": "900", "fresh": "901", "solo": "902", "snap": "903", "again": "904"}
    node = lambda name: Path(root) / f"{name}{rank}" / jobs[name]  # each rank its own node's staging dir
    if world == 1:  # a ZeRO checkpoint of 2 ranks cannot be loaded by 1: a clear error, nothing loaded
        ck = Checkpointer(team="vision", run=run, store=store, staging_dir=node("solo"), upload="inline",
                          engine=engine(1, 0))
        try:
            ck.restore({})
        except CheckpointError as exc:
            assert "saved by 2 ranks and this run has 1" in str(exc), exc
            print("refused:", exc)
        else:
            raise AssertionError("a world-size change was not refused")
        ck.close()
        # without it gloo's threads outlive the interpreter now and then: "terminate called without an active
        # exception", SIGABRT at exit (seen once in CI under load; pytorch/pytorch#179291)
        dist.destroy_process_group()
        return
    eng = engine(world, 0)
    ck = Checkpointer(team="vision", run=run, store=store, staging_dir=node("node"), upload="inline", engine=eng)
    state = {"progress": {"step": -1}}
    assert ck.restore(state) is None
    train(eng, range(0, 3), rank)
    state["progress"]["step"] = 2
    ck.save(state, 2)                      # async: the next steps change the weights while the writer writes
    train(eng, range(3, 5), rank)
    state["progress"]["step"] = 4
    ck.save(state, 4)
    want = train(eng, range(5, 9), rank)
    assert ck.wait_committed(4, 60), "step 4 not committed"
    ck.close()
    assert type(eng.checkpoint_engine).__name__ == "TorchCheckpointEngine"  # the engine's own saves work again
    eng2 = engine(world, 1)               # other initial weights: everything must come from the checkpoint
    fresh = Checkpointer(team="vision", run=run, store=store, staging_dir=node("fresh"), upload="inline",
                         engine=eng2)
    got = {"progress": {"step": -1}}
    assert fresh.restore(got) == 4 and got == {"progress": {"step": 4}}, got
    assert train(eng2, range(5, 9), rank) == want, "the resumed losses differ from the uninterrupted run"
    from nuro.checkpoint import layout as L
    restored = sorted(p.name for p in (node("fresh") / "restore" / L.step_name(4)).iterdir())
    shard = f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
    assert restored == [".verified.json", "mp_rank_00_model_states.pt", shard], restored  # only this node's
    fresh.save(got, 9, sync=True)
    assert (fresh.step_dir(9) / shard).is_file()
    assert fresh.wait_committed(9, 60)
    fresh.close()

    # issue 31: an in-memory snapshot of the engine (each node's ZeRO shard, the model states) replicated to the
    # other node; node 1 is then lost, node 0 alone promotes it, and fresh engines resume from it bitwise
    from nuro.checkpoint import promote
    snapdir = Path(root) / f"snapmem{rank}" / "903"
    os.environ["NURO_SNAPSHOT_DIR"] = str(snapdir)
    snap = Checkpointer(team="vision", run=run, store=store, staging_dir=node("snap"), upload="agent", engine=eng2,
                        interval_s=3600, snapshot_interval_s=0.001)
    got["progress"]["step"] = 10
    import time
    time.sleep(0.05)  # the snapshot interval (1 ms) has passed on rank 0's clock
    assert snap.maybe_save(lambda: got, 10) is False  # a snapshot
    snap.close()
    names = sorted(p.name for p in (snapdir / "ckpt" / L.step_name(10)).iterdir())
    other = f"zero_pp_rank_{1 - rank}_mp_rank_00_optim_states.pt"
    assert {shard, other, "mp_rank_00_model_states.pt", ".upload-0.json", ".upload-1.json"} <= set(names), names
    want2 = train(eng2, range(11, 14), rank)
    if rank == 0:
        got_p = promote.promote(store, snapdir.parent, snapdir.name, 60, run=("vision", run))
        assert got_p.committed == [10], got_p
    dist.barrier()
    eng4 = engine(world, 1)
    again = Checkpointer(team="vision", run=run, store=store, staging_dir=node("again"), upload="inline",
                         engine=eng4)
    got4 = {"progress": {"step": -1}}
    assert again.restore(got4) == 10 and got4 == {"progress": {"step": 10}}, got4
    assert rank != 0 or again.restored_tier == "memory"
    assert train(eng4, range(11, 14), rank) == want2, "resumed from the snapshot, the losses differ"
    again.close()
    dist.destroy_process_group()

if __name__ == "__main__":
    import torch.multiprocessing as mp
    world = int(sys.argv[1])
    mp.spawn(main, args=(world, sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])), nprocs=world,
             join=True)
"""


def test_deepspeed_zero2_engine_checkpoints_through_the_pipeline(store: ObjectStore, tmp_path: Path) -> None:
    """Issue 17: a real ZeRO-2 DeepSpeed engine on two gloo ranks (each its own node) saves asynchronously through
    nuro's staging, upload and manifest; fresh engines resume bitwise equal, each node fetching only the model
    states and its own shard; a run of another world size is refused with a clear error."""
    run = _run()
    script = tmp_path / "ds_worker.py"
    script.write_text(_DS_WORKER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCH_EXTENSIONS_DIR": str(tmp_path / "no-jit")}
    for world in (2, 1):
        res = subprocess.run(
            [sys.executable, str(script), str(world), run, str(tmp_path), str(free_port()), str(PORT_BASE)],
            cwd=REPO, capture_output=True, text=True, timeout=240, env=env,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr[-4000:]
    parts = [parse_part(store.get(L.part_key(TEAM, run, 4, p))[0]) for p in (0, 1)]
    model, shard0 = "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    assert {f.path for f in parts[0].files} == {model, shard0}
    assert {f.path for f in parts[1].files} == {"zero_pp_rank_1_mp_rank_00_optim_states.pt"}  # not its model copy
    assert load_manifest(store, TEAM, run, 4).world_size == 2
    # the op DeepSpeed needs on CPU was built when it was installed: no job compiles it (no JIT cache was made)
    assert not (tmp_path / "no-jit").exists()

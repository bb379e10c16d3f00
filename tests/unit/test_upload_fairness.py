"""One job must not hold the node agent's single upload worker (issue 30, item 4).

Each test stages, as a team member's job would in its own staging dir, a load that used to hold the node-wide
worker (``UploadWorker(store, root)``, trust="record", as root) for as long as it liked: a file whose upload is
slow, thousands of small files, a 100 GiB sparse file, more files than a step may have, 100 000 step dirs. Another
team's job on the same node stages an ordinary step at the same time; its commit must land within seconds, and
the misbehaving job is the only one that loses (slow, or abandoned with the reason logged once).

The object store is an in-memory stand-in (thread-safe, optionally slow per key) so that "slow S3" is exact; the
staging dirs, records, locks and files are real (the tests run as root, as the worker does).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nuro.checkpoint import layout as L
from nuro.checkpoint.manifest import FileEntry, UploadRequest
from nuro.checkpoint.staging import write_request
from nuro.checkpoint.upload import UploadLimits, UploadWorker
from nuro.objectstore import NotFound, ObjectInfo, ObjectStoreError
from nuro.protocol import jobrecord

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job records are root-owned (the prolog writes them)")

ALICE, BOB = "perception", "prediction"  # two teams that do not trust each other


class MemStore:
    """The few ``ObjectStore`` calls the upload worker makes, in memory. ``delay(key)`` seconds are slept in each
    ``put_file`` (a slow upload of that object); every stored key is counted (to see nothing is sent twice)."""

    def __init__(self, delay: Callable[[str], float] = lambda _k: 0.0) -> None:
        self.objects: dict[str, bytes] = {}
        self.at: dict[str, float] = {}
        self.sent: Counter[str] = Counter()
        self.delay = delay
        self.lock = threading.Lock()
        self.max_fds = 0

    def _store(self, key: str, data: bytes) -> str:
        self.max_fds = max(self.max_fds, len(os.listdir("/proc/self/fd")))
        with self.lock:
            self.objects[key] = data
            self.at[key] = time.monotonic()
            self.sent[key] += 1
        return hashlib.md5(data).hexdigest()  # noqa: S324 - an ETag, not security

    def put(self, key: str, data: bytes, **_: object) -> str:
        return self._store(key, data)

    def put_if_absent(self, key: str, data: bytes, **_: object) -> bool:
        with self.lock:
            if key in self.objects:
                return False
        self._store(key, data)
        return True

    def put_file(self, key: str, path: Path, *, expected_sha256: str | None = None, **_: object) -> str:
        time.sleep(self.delay(key))
        data = Path(path).read_bytes()
        if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
            raise ObjectStoreError(f"PUT {key}: {path} changed while it was uploaded", key=key)
        return self._store(key, data)

    def get(self, key: str, **_: object) -> tuple[bytes, str]:
        with self.lock:
            if key not in self.objects:
                raise NotFound(f"GET {key}: no such key", key=key)
            return self.objects[key], "etag"

    def exists(self, key: str) -> bool:
        with self.lock:
            return key in self.objects

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        with self.lock:
            items = sorted((k, len(v)) for k, v in self.objects.items() if k.startswith(prefix))
        return iter([ObjectInfo(k, n, "etag") for k, n in items])

    def list_prefixes(self, prefix: str) -> list[str]:
        with self.lock:
            rest = {
                k[len(prefix) :].split("/", 1)[0]
                for k in self.objects
                if k.startswith(prefix) and "/" in k[len(prefix) :]
            }
        return sorted(prefix + r + "/" for r in rest)

    def delete(self, key: str) -> None:
        with self.lock:
            self.objects.pop(key, None)

    def committed(self, team: str, run: str, step: int) -> float | None:
        """When the step's manifest was stored (monotonic), None when it is not."""
        return self.at.get(L.manifest_key(team, run, step))


def _record(root: Path, job: int, team: str, run: str) -> None:
    """What the prolog writes for a job on this node (root's record: the worker takes team and run from it)."""
    root.mkdir(parents=True, exist_ok=True)
    jobrecord.write(root, jobrecord.JobRecord(job, os.getuid(), os.getgid(), "u", team, team, run, 0, "n1", None))


def _stage(root: Path, job: int, team: str, run: str, step: int, files: dict[str, bytes]) -> Path:
    """The job's side: write the step's files, then its upload request (the last thing a job does for a step)."""
    d = root / str(job) / "ckpt" / L.step_name(step)
    d.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (d / name).write_bytes(data)
    entries = tuple(FileEntry(n, len(b), hashlib.sha256(b).hexdigest()) for n, b in sorted(files.items()))
    _request(d, job, team, run, step, entries)
    return d


def _request(d: Path, job: int, team: str, run: str, step: int, entries: tuple[FileEntry, ...]) -> None:
    write_request(d, UploadRequest(team=team, run=run, step=step, job_id=str(job), restart=0, part=0,
                                   parts_expected=1, world_size=1, files=entries, created_at="t"))  # fmt: skip


def _bob(root: Path, job: int = 902, step: int = 1) -> None:
    """The other team's ordinary step: two small files."""
    _record(root, job, BOB, "bob-run")
    _stage(root, job, BOB, "bob-run", step, {".metadata": b"meta", "__0_0.distcp": os.urandom(4096)})


@pytest.fixture
def running() -> Iterator[Callable[[UploadWorker], None]]:
    """Run a worker's loop (as the node agent does) in a thread; stopped after the test."""
    stops: list[tuple[threading.Event, threading.Thread]] = []

    def start(worker: UploadWorker) -> None:
        stop = threading.Event()
        t = threading.Thread(target=worker.run, args=(stop, 0.05), daemon=True)
        t.start()
        stops.append((stop, t))

    yield start
    for stop, t in stops:
        stop.set()
        t.join(10)


def _wait(cond: Callable[[], object], limit_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < limit_s, f"{what}: not within {limit_s} s"
        time.sleep(0.02)
    return time.monotonic() - t0


def test_a_slow_upload_goes_on_beside_another_teams_commit(tmp_path: Path, running) -> None:
    """alice's shard takes 4 s to upload (a big file, or a slow store for it); bob's step commits in well under a
    second meanwhile, alice's step still commits afterwards, and nothing is sent twice."""
    root = tmp_path / "staging"
    store = MemStore(lambda key: 4.0 if "/alice-run/" in key and key.endswith("__0_0.distcp") else 0.0)
    _record(root, 901, ALICE, "alice-run")
    _stage(root, 901, ALICE, "alice-run", 1, {".metadata": b"m", "__0_0.distcp": os.urandom(8192)})
    _bob(root)
    commits: list[tuple[str, int]] = []
    worker = UploadWorker(store, root, limits=UploadLimits(turn_s=0.3),
                          on_commit=lambda req: commits.append((req.job_id, req.step)))  # fmt: skip
    t0 = time.monotonic()
    running(worker)
    _wait(lambda: store.committed(BOB, "bob-run", 1), 2.0, "bob's commit")
    assert store.committed(ALICE, "alice-run", 1) is None  # alice's shard is still on its way
    _wait(lambda: store.committed(ALICE, "alice-run", 1), 15.0, "alice's commit after her slow shard")
    assert store.committed(BOB, "bob-run", 1) - t0 < 1.5  # type: ignore[operator]
    assert max(store.sent.values()) == 1, store.sent  # resumed from the state file, never re-sent
    _wait(lambda: len(commits) == 2, 5.0, "on_commit of both (it fires after the manifest is stored)")
    time.sleep(0.2)
    assert sorted(commits) == [("901", 1), ("902", 1)]  # on_commit: once per committed step, as before


def test_the_lock_of_a_step_in_flight_stays_held(tmp_path: Path) -> None:
    """While alice's slow file goes on after her turn, a second root worker (the epilog's flush) cannot take the
    same step and upload it again; once it lands, the next pass commits it."""
    root = tmp_path / "staging"
    store = MemStore(lambda key: 1.5 if key.endswith("big") else 0.0)
    _record(root, 901, ALICE, "alice-run")
    _stage(root, 901, ALICE, "alice-run", 1, {"big": b"b" * 1000})
    worker = UploadWorker(store, root, limits=UploadLimits(turn_s=0.2))
    rep = worker.run_once()
    assert rep.waiting == [("901", 1)] and rep.committed == [] and not rep.sliced, rep
    assert UploadWorker(store, root).run_once("901").committed == []  # the lock is still ours
    assert worker.run_once().waiting == [("901", 1)]  # no new work for alice while it flies
    _wait(lambda: store.sent, 5.0, "the flight to land")
    time.sleep(0.1)
    assert worker.run_once().committed == [("901", 1)]
    assert store.sent[L.shard_key(ALICE, "alice-run", 1, "big")] == 1


def test_thousands_of_small_files_are_sent_in_turns(tmp_path: Path, running) -> None:
    """alice lists 2 000 files (each PUT takes 2 ms: 4 s in all); bob's step lands within a second, and alice's
    step is cut into turns that resume where the last one stopped."""
    root = tmp_path / "staging"
    store = MemStore(lambda key: 0.002 if "/alice-run/" in key else 0.0)
    _record(root, 901, ALICE, "alice-run")
    _stage(root, 901, ALICE, "alice-run", 1, {f"f{i:05d}": b"%d" % i for i in range(2000)})
    worker = UploadWorker(store, root, limits=UploadLimits(turn_s=0.25))
    t0 = time.monotonic()
    first = worker.run_once()  # the turn ends between two files (sliced) or during one (it goes on, flying)
    assert first.waiting == [("901", 1)] and not first.committed and time.monotonic() - t0 < 1, first
    _bob(root)
    t0 = time.monotonic()
    running(worker)
    _wait(lambda: store.committed(BOB, "bob-run", 1), 1.5, "bob's commit")
    _wait(lambda: store.committed(ALICE, "alice-run", 1), 30.0, "alice's commit")
    assert store.committed(BOB, "bob-run", 1) < store.committed(ALICE, "alice-run", 1)  # type: ignore[operator]
    assert max(store.sent.values()) == 1, "a file was uploaded twice"
    assert time.monotonic() - t0 < 30


def test_bytes_bound_a_turn_too(tmp_path: Path) -> None:
    """A turn ends after ``turn_bytes`` started (at least one file always goes, so every turn progresses)."""
    root = tmp_path / "staging"
    store = MemStore()
    _record(root, 901, ALICE, "alice-run")
    _stage(root, 901, ALICE, "alice-run", 1, {f"f{i}": os.urandom(1000) for i in range(5)})
    worker = UploadWorker(store, root, limits=UploadLimits(turn_bytes=1500))
    passes = 0
    while not store.committed(ALICE, "alice-run", 1):
        rep = worker.run_once()
        passes += 1
        assert passes < 10, rep
    assert passes == 3  # 2 files per turn (the second one crosses 1 500 bytes), then the last and the commit


def test_requests_over_the_bounds_are_abandoned_with_the_reason_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 100 GiB sparse shard, a request listing more bytes than the disk holds, and one listing 10 001 files: each
    is abandoned at once with its reason, logged once however many passes see it; nothing of them is read or
    sent, and bob's step commits in the same pass."""
    root = tmp_path / "staging"
    store = MemStore()
    for job in (911, 912, 913):
        _record(root, job, ALICE, f"alice-{job}")
    sparse = _stage(root, 911, ALICE, "alice-911", 1, {".metadata": b"m"})
    with open(sparse / "__0_0.distcp", "wb") as fh:
        fh.truncate(100 << 30)  # 100 GiB of holes: costs the job nothing, hashing it would read 100 GiB
    meta = FileEntry(".metadata", 1, hashlib.sha256(b"m").hexdigest())
    _request(sparse, 911, ALICE, "alice-911", 1, (meta, FileEntry("__0_0.distcp", 100 << 30, "0" * 64)))
    vfs = os.statvfs(root)
    disk = vfs.f_blocks * vfs.f_frsize
    huge = _stage(root, 912, ALICE, "alice-912", 1, {"a": b"a"})
    _request(huge, 912, ALICE, "alice-912", 1, (FileEntry("a", disk + 1, "0" * 64),))
    many = _stage(root, 913, ALICE, "alice-913", 1, {})
    for i in range(10_001):
        (many / f"f{i}").write_bytes(b"")
    empty = hashlib.sha256(b"").hexdigest()
    _request(many, 913, ALICE, "alice-913", 1, tuple(FileEntry(f"f{i}", 0, empty) for i in range(10_001)))
    _bob(root)
    worker = UploadWorker(store, root)  # the default bounds
    caplog.set_level(logging.INFO, logger="nuro.checkpoint.upload")
    t0 = time.monotonic()
    rep = worker.run_once()
    assert time.monotonic() - t0 < 10
    assert rep.committed == [("902", 1)], rep
    assert sorted(rep.abandoned) == [("911", 1), ("912", 1), ("913", 1)], rep
    assert not [k for k in store.objects if "/alice-" in k]  # nothing of alice's reached the store
    for _ in range(3):
        worker.run_once()
    said = [r.getMessage() for r in caplog.records if "abandoned" in r.getMessage()]
    assert len(said) == 3, said  # once each
    reasons = {s.split()[3]: s for s in said}
    assert "is sparse" in reasons["job=911"] and "__0_0.distcp" in reasons["job=911"], reasons
    assert "more than the staging file system holds" in reasons["job=912"], reasons
    assert "lists 10001 files, more than the 10000" in reasons["job=913"], reasons


def test_a_file_on_a_mount_inside_the_job_dir_is_never_read(tmp_path: Path) -> None:
    """A file system mounted inside the step (a FUSE mount a job controls could make every read block): refused."""
    root = tmp_path / "staging"
    store = MemStore()
    _record(root, 914, ALICE, "alice-914")
    d = _stage(root, 914, ALICE, "alice-914", 1, {})
    (d / "mnt").mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "t", str(d / "mnt")], check=False).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (d / "mnt" / "x").write_bytes(b"x")
        _request(d, 914, ALICE, "alice-914", 1, (FileEntry("mnt/x", 1, hashlib.sha256(b"x").hexdigest()),))
        rep = UploadWorker(store, root).run_once()
        assert rep.abandoned == [("914", 1)] and not store.sent, rep
        assert b"another file system" in (d / L.ABANDONED_FILE).read_bytes()
    finally:
        subprocess.run(["umount", "-l", str(d / "mnt")], check=False)


def test_a_dense_shard_is_uploaded_and_a_small_sparse_one_is_fine(tmp_path: Path) -> None:
    """The sparse rule does not touch honest files: a dense 4 MiB shard and a 1 MiB file of holes both go."""
    root = tmp_path / "staging"
    store = MemStore()
    _record(root, 915, ALICE, "alice-915")
    data = os.urandom(4 << 20)
    d = _stage(root, 915, ALICE, "alice-915", 1, {"dense": data})
    with open(d / "holes", "wb") as fh:
        fh.truncate(1 << 20)
    zeros = hashlib.sha256(b"\0" * (1 << 20)).hexdigest()
    dense = FileEntry("dense", len(data), hashlib.sha256(data).hexdigest())
    _request(d, 915, ALICE, "alice-915", 1, (dense, FileEntry("holes", 1 << 20, zeros)))
    assert UploadWorker(store, root).run_once().committed == [("915", 1)]


def test_a_hundred_thousand_step_dirs_do_not_hold_the_agents_fds(tmp_path: Path) -> None:
    """alice makes 20 000 step dirs (no requests); the worker opens them one at a time (before: all at once, as
    many fds as dirs in root's process, which also serves every other job) and bob still commits."""
    root = tmp_path / "staging"
    store = MemStore()
    _record(root, 916, ALICE, "alice-916")
    ckpt = root / "916" / "ckpt"
    ckpt.mkdir(parents=True)
    for i in range(20_000):
        (ckpt / L.step_name(i)).mkdir()
    _stage(root, 916, ALICE, "alice-916", 20_000, {"a": b"a"})
    _bob(root)
    base = len(os.listdir("/proc/self/fd"))
    rep = UploadWorker(store, root).run_once()
    assert sorted(rep.committed) == [("902", 1), ("916", 20_000)], rep
    assert store.max_fds < base + 50, (store.max_fds, base)


def test_turns_rotate_so_no_job_is_always_first(tmp_path: Path) -> None:
    """Three jobs each with more work than a turn: the job that goes first changes every pass."""
    root = tmp_path / "staging"
    store = MemStore()
    for job in (921, 922, 923):
        _record(root, job, ALICE, f"r{job}")
        _stage(root, job, ALICE, f"r{job}", 1, {f"f{i}": b"x" * 100 for i in range(6)})
    worker = UploadWorker(store, root, limits=UploadLimits(turn_bytes=100))
    firsts = []
    for _ in range(3):
        before = dict(store.at)
        worker.run_once()
        new = sorted((t, k) for k, t in store.at.items() if k not in before)
        firsts.append(new[0][1].split("/")[2])
    assert len(set(firsts)) == 3, firsts


def test_limits_from_env() -> None:
    env = {"NURO_UPLOAD_TURN_S": "0.5", "NURO_UPLOAD_MAX_FILES": "20", "NURO_UPLOAD_TURN_MIB": "x",
           "NURO_UPLOAD_MIN_ALLOCATED": "0"}  # fmt: skip
    lim = UploadLimits.from_env(env)
    assert (lim.turn_s, lim.max_files, lim.turn_bytes, lim.min_allocated) == (0.5, 20, 1 << 30, 0.0)

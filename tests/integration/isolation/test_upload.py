"""Attacks on the node's checkpoint upload worker (root, in every node agent and the epilog), run as a team member
(alice of perception) on the real cluster with the real SeaweedFS.

The job writes its own staging dir, so it writes its upload requests, markers, lock and state files too:

- a forged request naming another team's run, another run of its own team, or ``keep=1``: root takes team, run,
  attempt and keep from the job's root-owned record (``nuro.protocol.jobrecord``), so the forged steps are abandoned
  with
  the reason, nothing is written under the other team's prefix (byte-identical afterwards), and ``keep`` stays the
  record's (an older step of the job survives a ``keep=1`` request);
- a FIFO as request, lock, state and marker file, a request that is a huge (sparse) file, and shards that are
  symlinks to ``/etc/shadow`` and ``/dev/zero``: each is refused at once with its reason, nothing of them reaches
  S3, another job's upload on the same node still commits meanwhile, and the epilog ends in bounded time (the
  node is not left COMPLETING; the job's dir and record are gone).

The job_submit bridge is put in pass-through for this module (as in test_staging.py here): the worker must hold
even for records the bridge would refuse. Every test also runs the shared guard (other team's objects, root-owned
files, all daemons alive: controller, detector, node agents).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from nuro.checkpoint import layout as L
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment
from nuro.slurm import JobPhase
from nuro.wrappers.sdk.checkpointer import Checkpointer
from nuro.wrappers.sdk.runenv import RunEnv
from tests.integration.conftest import LiveCluster
from tests.integration.isolation.conftest import ATTACKER, ATTACKER_TEAM, VICTIM, VICTIM_TEAM, Guard, as_user

pytestmark = pytest.mark.slurm

NODE = "gpu005"

# The job's side: stage steps by hand (no torch in the job), then wait for root's verdict on each and print it.
_JOB = r"""
import hashlib, json, os, stat, sys, time
from pathlib import Path

root, mode, team, run, victim_team, victim_run = sys.argv[1:7]
job = os.environ["SLURM_JOB_ID"]
restart = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
ckpt = Path(root) / job / "ckpt"


def stage(step, files, write=True, **over):
    d = ckpt / f"step-{step:012d}"
    d.mkdir(parents=True, exist_ok=True)
    entries = []
    for name, data in files.items():
        (d / name).write_bytes(data)
        entries.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    req = {"format": "nuro.checkpoint-upload/v1", "team": team, "run": run, "step": step, "job_id": job,
           "restart": restart, "part": 0, "parts_expected": 1, "world_size": 1, "files": entries,
           "created_at": "2026-01-01T00:00:00Z", "keep": None}
    req.update(over)
    if write:
        put(d, json.dumps(req).encode())
    return d, req


def put(d, data):
    # atomically, as a job should: root must judge the file, not a half-written one
    (d / ".req.tmp").write_bytes(data)
    os.replace(d / ".req.tmp", d / ".upload-0.json")


seen = {}


def verdict(d):
    if d in seen:
        return seen[d]  # root prunes older finished steps after a newer commit: keep what was seen
    for name, what in ((".upload.done.json", "done"), (".upload.abandoned.json", "abandoned")):
        try:
            if stat.S_ISREG(os.lstat(d / name).st_mode):
                seen[d] = [what, json.loads((d / name).read_bytes()).get("reason", "")]
                return seen[d]
        except (OSError, ValueError):
            pass
    return None


files = {".metadata": b"meta-" + job.encode(), "__0_0.distcp": os.urandom(64 << 10)}
steps = {}
if mode == "forge":
    steps[2] = stage(2, files, team=victim_team, run=victim_run, keep=1)[0]   # the other team's run
    steps[4] = stage(4, files, run=victim_run)[0]                              # own team, another run's name
    # Step 3 commits, and a commit prunes the older finished steps (2): see the forged steps' verdicts first.
    for s in (2, 4):
        while verdict(steps[s]) is None:
            time.sleep(0.2)
    steps[3] = stage(3, files)[0]                                              # honest
    while verdict(steps[3]) is None:
        time.sleep(0.2)
    steps[5] = stage(5, files, keep=1)[0]                                      # keep=1: would delete step 3
elif mode == "hostile":
    d, req = stage(1, files, write=False)
    os.mkfifo(d / ".upload-0.json")                                            # the request is a FIFO
    steps[1] = d
    d, _ = stage(2, files, write=False)
    os.mkfifo(d / ".upload-0.lock")                                            # the lock file is a FIFO
    stage(2, files)
    steps[2] = d
    d, req = stage(4, files, write=False)
    os.symlink("/etc/shadow", d / "__1_0.distcp")
    os.symlink("/dev/zero", d / "__2_0.distcp")
    req["files"] += [{"path": "__1_0.distcp", "size": 1024, "sha256": "0" * 64},
                     {"path": "__2_0.distcp", "size": 1 << 30, "sha256": "1" * 64}]
    put(d, json.dumps(req).encode())
    steps[4] = d
    d, _ = stage(5, files, write=False)
    with open(d / ".req.tmp", "wb") as fh:
        fh.truncate(8 << 30)                                                   # an 8 GiB (sparse) request
    os.replace(d / ".req.tmp", d / ".upload-0.json")
    steps[5] = d
    # Step 3 commits, and a commit prunes the older finished steps (1, 2): see their verdicts first.
    deadline = time.monotonic() + float(os.environ.get("WAIT_S", "90"))
    while time.monotonic() < deadline and any(verdict(steps[s]) is None for s in (1, 2)):
        time.sleep(0.2)
    d, _ = stage(3, files, write=False)
    os.mkfifo(d / ".upload-0.state")                                           # state and marker: FIFOs
    os.mkfifo(d / ".upload.done.json")
    stage(3, files)
    steps[3] = d
    print("PLANTED", flush=True)
elif mode == "hog":
    d, req = stage(1, {".metadata": b"m"}, write=False)
    with open(d / "__0_0.distcp", "wb") as fh:
        fh.truncate(100 << 30)                                                 # 100 GiB of holes: costs the job 0
    req["files"].append({"path": "__0_0.distcp", "size": 100 << 30, "sha256": "0" * 64})
    put(d, json.dumps(req).encode())
    steps[1] = d
    steps[2] = stage(2, {f"__{i}_0.distcp": b"x" for i in range(12_000)})[0]   # more files than a step may have
    print("PLANTED", flush=True)
else:
    t0 = time.monotonic()
    steps[1] = stage(1, files)[0]
deadline = time.monotonic() + float(os.environ.get("WAIT_S", "90"))
while time.monotonic() < deadline and any(verdict(d) is None for d in steps.values()):
    time.sleep(0.2)
print("VERDICTS " + json.dumps({s: verdict(d) for s, d in steps.items()}), flush=True)
if mode not in ("forge", "hostile", "hog"):
    print(f"COMMITTED_AFTER_S {time.monotonic() - t0:.2f}", flush=True)
"""


@pytest.fixture
def shared(shared: Path) -> Path:
    """The shared job directory (conftest) with the member's checkpointing program in it."""
    (shared / "job.py").write_text(_JOB)
    (shared / "job.py").chmod(0o644)
    return shared


def _staging(cluster: LiveCluster) -> Path:
    return Path(cluster.env["NURO_STAGING_ROOT"].replace("{node}", NODE))


def _seed(store: ObjectStore, tmp: Path, team: str, run: str) -> None:
    """A committed checkpoint of ``team/run`` (step 1), written with the admin key: what the attack aims at."""
    ck = Checkpointer(team=team, run=run, store=store, staging_dir=tmp / "seed" / "9", upload="inline",
                      env=RunEnv(job_id=9))  # fmt: skip
    ck.save({"w": torch.full((256, 256), 1.0)}, 1, sync=True)
    assert ck.wait_committed(1, 120)
    ck.close()


def _submit(cluster: LiveCluster, shared: Path, name: str, mode: str, run: str, victim_run: str,
            user: str = ATTACKER, team: str = ATTACKER_TEAM) -> int:  # fmt: skip
    comment = jobcomment.merge(None, nuro={"v": 1, "name": run, "team": team})
    argv = [sys.executable, str(shared / "job.py"), str(_staging(cluster)), mode, team, run, VICTIM_TEAM,
            victim_run]  # fmt: skip
    res = as_user(
        cluster, user,
        ["sbatch", "--parsable", "--nodes=1", f"--nodelist={NODE}", "--ntasks=1", "--cpus-per-task=1",
         f"--account={team}", f"--output={shared / name}.out", f"--comment={comment}",
         "--wrap", " ".join(argv)],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _read(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def _wait_planted(out: Path, timeout_s: float) -> None:
    """Until the attacking job printed PLANTED (its hostile files are in place)."""
    deadline = time.monotonic() + timeout_s
    while "PLANTED" not in _read(out) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "PLANTED" in _read(out), _read(out)


def _verdicts(out: Path) -> dict[int, list[str] | None]:
    text = _read(out)
    line = next((ln for ln in text.splitlines() if ln.startswith("VERDICTS ")), None)
    assert line, f"the job printed no verdicts:\n{text}"
    return {int(k): v for k, v in json.loads(line.removeprefix("VERDICTS ")).items()}


def _node_state(cluster: LiveCluster) -> str:
    return cluster.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"], check=False).stdout.strip().lower()


def _wait_released(cluster: LiveCluster, job_id: int, limit_s: float) -> float:
    """Seconds until the job's dir and record are gone and the node is out of COMPLETING (fails past limit_s)."""
    t0 = time.monotonic()
    record = _staging(cluster) / ".jobs" / f"{job_id}.json"
    while time.monotonic() - t0 < limit_s:
        state = _node_state(cluster)
        if "completing" not in state and not (_staging(cluster) / str(job_id)).exists() and not record.exists():
            return time.monotonic() - t0
        time.sleep(0.5)
    raise AssertionError(
        f"job {job_id}: not released within {limit_s:.0f} s (node {NODE} {_node_state(cluster)!r}, dir "
        f"{(_staging(cluster) / str(job_id)).exists()}, record {record.exists()})"
    )


def test_a_forged_upload_request_writes_nothing_of_another_team_and_keep_stays_the_records(
    cluster: LiveCluster, passthrough: None, guard: Guard, shared: Path, tmp_path: Path
) -> None:
    store = guard.store
    run, victim_run = f"iso-{uuid.uuid4().hex[:6]}", f"iso-{uuid.uuid4().hex[:6]}"
    _seed(store, tmp_path, VICTIM_TEAM, victim_run)
    guard.watch_s3(f"{L.PREFIX}{VICTIM_TEAM}/")  # the whole victim team: byte-identical, nothing new
    guard.watch_s3(L.run_prefix(ATTACKER_TEAM, victim_run))  # nor under the victim's run name in our own team
    job_id = _submit(cluster, shared, "forge", "forge", run, victim_run)
    job = cluster.backend.wait_for_job(job_id, timeout_s=240)
    out = shared / "forge.out"
    assert job.phase is JobPhase.COMPLETED, _read(out)
    v = _verdicts(out)
    assert v[2] and v[2][0] == "abandoned" and "job record says" in v[2][1] and VICTIM_TEAM in v[2][1], v
    assert v[4] and v[4][0] == "abandoned" and f"run={victim_run!r}" in v[4][1], v
    assert v[3] == ["done", ""] and v[5] == ["done", ""], v
    assert store.exists(L.manifest_key(ATTACKER_TEAM, run, 5))
    assert store.exists(L.manifest_key(ATTACKER_TEAM, run, 3)), "keep=1 from the request deleted step 3"
    _wait_released(cluster, job_id, 120)


def test_fifos_huge_requests_and_links_to_shadow_block_nothing_and_upload_nothing(
    cluster: LiveCluster, passthrough: None, guard: Guard, shared: Path
) -> None:
    store = guard.store
    run, honest_run = f"iso-{uuid.uuid4().hex[:6]}", f"iso-{uuid.uuid4().hex[:6]}"
    hostile = _submit(cluster, shared, "hostile", "hostile", run, "unused")
    _wait_planted(shared / "hostile.out", 90)
    honest = _submit(cluster, shared, "honest", "honest", honest_run, "unused")  # same node, meanwhile
    job = cluster.backend.wait_for_job(honest, timeout_s=240)
    assert job.phase is JobPhase.COMPLETED, _read(shared / "honest.out")
    assert _verdicts(shared / "honest.out")[1] == ["done", ""], "another job's FIFOs blocked this job's upload"
    assert store.exists(L.manifest_key(ATTACKER_TEAM, honest_run, 1))

    job = cluster.backend.wait_for_job(hostile, timeout_s=240)
    ended = time.monotonic()
    assert job.phase is JobPhase.COMPLETED, _read(shared / "hostile.out")
    v = _verdicts(shared / "hostile.out")
    assert v[1] and v[1][0] == "abandoned" and "not a regular file (a FIFO)" in v[1][1], v
    assert v[2] and v[2][0] == "abandoned" and "lock file is not a regular file" in v[2][1], v
    assert v[3] == ["done", ""], v  # FIFOs at the state and done-marker names: replaced, never opened
    assert v[4] and v[4][0] == "abandoned" and "symlink" in v[4][1], v
    assert v[5] and v[5][0] == "abandoned" and "larger than" in v[5][1], v
    for step in (1, 2, 4, 5):
        assert not list(store.list(L.step_prefix(ATTACKER_TEAM, run, step))), f"step {step} reached S3"
    _wait_released(cluster, hostile, 120)
    assert "drain" not in _node_state(cluster), _node_state(cluster)
    print(f"hostile job's node released {time.monotonic() - ended:.1f} s after the job ended")


def test_a_job_that_hogs_the_upload_worker_costs_another_teams_commit_nothing(
    cluster: LiveCluster, passthrough: None, guard: Guard, shared: Path
) -> None:
    """Issue 30 item 4: alice's job stages a 100 GiB sparse shard and a step of 12,000 files on the node whose one
    upload worker (root, in the node agent) every job shares. Both are refused before anything is read (the sparse
    file by its allocated blocks, the step by its file count), and priya's step of another team, staged meanwhile on
    the same node, commits: the worker is never held by one job."""
    store = guard.store
    run, honest_run = f"iso-{uuid.uuid4().hex[:6]}", f"iso-{uuid.uuid4().hex[:6]}"
    hog = _submit(cluster, shared, "hog", "hog", run, "unused")
    _wait_planted(shared / "hog.out", 120)
    honest = _submit(cluster, shared, "other-team", "honest", honest_run, "unused", user=VICTIM, team=VICTIM_TEAM)
    job = cluster.backend.wait_for_job(honest, timeout_s=240)
    out = _read(shared / "other-team.out")
    assert job.phase is JobPhase.COMPLETED and _verdicts(shared / "other-team.out")[1] == ["done", ""], out
    assert store.exists(L.manifest_key(VICTIM_TEAM, honest_run, 1))
    print(f"\nthe other team's step committed {out.split('COMMITTED_AFTER_S ')[1].split()[0]} s after staging")
    job = cluster.backend.wait_for_job(hog, timeout_s=240)
    v = _verdicts(shared / "hog.out")
    assert v[1] and v[1][0] == "abandoned" and "allocated" in v[1][1], v
    assert v[2] and v[2][0] == "abandoned" and "files" in v[2][1], v
    for step in (1, 2):
        assert not list(store.list(L.step_prefix(ATTACKER_TEAM, run, step))), f"step {step} reached S3"
    _wait_released(cluster, hog, 120)

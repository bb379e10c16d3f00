"""Prolog/epilog checkpoint staging, called as slurmd calls them (root, a job-only environment, the node env file),
against a real SeaweedFS: the prolog makes the job's staging dir and stages the newest valid checkpoint (node cache
first, else S3); the epilog flushes the job's uploads (or marks them incomplete at its deadline), keeps the newest
committed copy in the node cache and removes the job dir.

No Slurm cluster is needed: the hooks are run as subprocesses with a crafted environment, like
tests/integration/test_prolog.py's jobs would give them. Needs root (chown to the job's user).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from nuro.checkpoint import dsfiles, handoff
from nuro.checkpoint import layout as L
from nuro.checkpoint.manifest import FileEntry, Manifest
from nuro.checkpoint.restore import load_manifest, restore_latest
from nuro.checkpoint.staging import read_request, write_request
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.healthcheck.uploads import node_handoff_worker
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment, jobrecord
from nuro.wrappers.sdk.checkpointer import Checkpointer
from nuro.wrappers.sdk.runenv import RunEnv

REPO = Path(__file__).resolve().parents[2]
PORT_BASE = int(os.environ.get("NURO_TEST_CKPT_PORT_BASE", "8800"))
STATE_DIR = REPO / f".devcluster-test-{PORT_BASE}-staging"
TEAM = "vision"
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the hooks run as root and chown to the job's user")


@pytest.fixture(scope="class")
def store() -> Iterator[ObjectStore]:
    """Our own SeaweedFS for the hook tests; class-scoped so it is gone before a Slurm cluster on the same port base
    starts for the job test at the end."""
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    with s3.standalone(STATE_DIR, PORT_BASE):
        yield s3.dev_store(PortPlan(PORT_BASE))
    shutil.rmtree(STATE_DIR, ignore_errors=True)


def _hook(module: str, node: Path, job: int, run: str, job_env: dict[str, str] | None = None, **extra: str) -> str:
    """Run a hook like slurmd does: root, SLURM_* of the job (+ ``job_env``), admin settings only in the env file."""
    env_file = node / "nuro.env"
    settings = {**s3.s3_env(PortPlan(PORT_BASE)), "NURO_STAGING_ROOT": str(node / "staging"),
                "NURO_CACHE_DIR": str(node / "cache"), "NURO_STAGING_MIN_FREE_GB": "1", **extra}  # fmt: skip
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    comment = jobcomment.merge(None, nuro={"v": 1, "name": run, "team": TEAM})
    env = {
        "PATH": os.environ["PATH"], "NURO_ENV_FILE": str(env_file), "SLURM_JOB_ID": str(job),
        "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOBODY), "SLURM_JOB_COMMENT": comment,
        "SLURM_JOB_USER": "nobody", "SLURM_JOB_ACCOUNT": TEAM,
        "SLURMD_NODENAME": node.name, "PYTHONPATH": str(REPO), **(job_env or {}),
    }  # fmt: skip
    res = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    return res.stderr


def _train(store: ObjectStore, job_dir: Path, run: str, steps: tuple[int, ...], team: str = TEAM) -> None:
    """What the job does: save through the SDK, leaving uploads to the node (upload="agent")."""
    run_env = RunEnv(job_id=int(job_dir.name))
    ck = Checkpointer(team=team, run=run, store=store, staging_dir=job_dir, upload="agent", env=run_env)
    for step in steps:
        ck.save({"w": torch.full((128, 128), float(step))}, step, sync=True)
    ck.close()


class TestHooksAsSlurmdRunsThem:
    """The hooks as subprocesses with a crafted slurmd environment, against our own SeaweedFS."""

    def test_prolog_epilog_stage_flush_cache_and_restage(self, store: ObjectStore, tmp_path: Path) -> None:
        run = f"s-{uuid.uuid4().hex[:8]}"
        node = tmp_path / "node1"
        node.mkdir()
        root = node / "staging"

        log = _hook("nuro.prolog_epilog.prolog", node, 1001, run)
        job_dir = root / "1001"
        st = job_dir.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (NOBODY, NOBODY, 0o700), log
        assert "no checkpoint to stage" in log

        _train(store, job_dir, run, (1, 2))
        assert not store.exists(L.manifest_key(TEAM, run, 2))  # no agent runs here: the epilog must commit them
        log = _hook("nuro.prolog_epilog.epilog", node, 1001, run)
        assert "committed=[1, 2]" in log and "incomplete=[]" in log, log
        assert load_manifest(store, TEAM, run, 2).parent == 1
        cached = L.cache_dir(root, TEAM, run) / L.step_name(2)
        assert cached.is_dir() and not job_dir.exists()

        # the requeued job on the same node: staged from the node cache, no download, owned by the job's user
        log = _hook("nuro.prolog_epilog.prolog", node, 1002, run)
        staged = root / "1002" / "restore" / L.step_name(2)
        assert "staged step=2 source=local" in log, log
        assert (staged / "__0_0.distcp").stat().st_uid == NOBODY and not cached.exists()

        # another node with an empty cache: from S3
        other = tmp_path / "node2"
        other.mkdir()
        log = _hook("nuro.prolog_epilog.prolog", other, 1002, run)
        assert "staged step=2 source=s3" in log, log
        state = {"w": torch.zeros(128, 128)}
        ck = Checkpointer(team=TEAM, run=run, store=store, staging_dir=other / "staging" / "1002", upload="agent")
        assert ck.restore(state) == 2 and torch.all(state["w"] == 2.0)
        ck.close()
        _hook("nuro.prolog_epilog.epilog", other, 1002, run)
        _hook("nuro.prolog_epilog.epilog", node, 1002, run)

    def test_each_node_of_a_gang_stages_only_its_share_of_a_deepspeed_step(
        self, store: ObjectStore, tmp_path: Path
    ) -> None:
        """A ZeRO step of 4 ranks written by 2 nodes: the prolog of node 2 of the requeued 2-node job stages the
        model states and ranks 2-3's shards, not ranks 0-1's (a node loads only its own, dsfiles); a 3-node job, or
        one without a node list, stages every file."""
        run = f"ds-{uuid.uuid4().hex[:8]}"
        names = [dsfiles.MODEL_STATES] + [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)]
        shards = []
        for name in names:
            data = name.encode() * 1000
            store.put(L.shard_key(TEAM, run, 3, name), data)
            shards.append(FileEntry(name, len(data), hashlib.sha256(data).hexdigest()))
        manifest = Manifest(TEAM, run, 3, "900", 0, "2026-12-04T00:00:00Z", None, 4, 2, tuple(shards),
                            sum(e.size for e in shards))  # fmt: skip
        store.put(L.manifest_key(TEAM, run, 3), manifest.to_bytes())
        for nodelist, node_name, want in (
            ("node[1-2]", "node2", {names[0], names[3], names[4]}),
            ("node[1-2]", "node1", set(names[:3])),
            ("node[1-3]", "node2", set(names)),
            (None, "node2", set(names)),
        ):
            node = tmp_path / f"{nodelist}-{node_name}"
            (node / node_name).mkdir(parents=True)
            node = node / node_name
            log = _hook("nuro.prolog_epilog.prolog", node, 1101, run,
                        job_env={"SLURM_JOB_NODELIST": nodelist} if nodelist else {})  # fmt: skip
            staged = node / "staging" / "1101" / "restore" / L.step_name(3)
            assert f"staged step=3 source=s3 files={len(want)}/5" in log, log
            assert {f.name for f in staged.iterdir() if not f.name.startswith(".")} == want, log
            _hook("nuro.prolog_epilog.epilog", node, 1101, run)

    def test_epilog_deadline_marks_incomplete_never_a_manifest(self, store: ObjectStore, tmp_path: Path) -> None:
        run = f"s-{uuid.uuid4().hex[:8]}"
        node = tmp_path / "node1"
        node.mkdir()
        _hook("nuro.prolog_epilog.prolog", node, 2001, run)
        _train(store, node / "staging" / "2001", run, (1,))
        _hook("nuro.prolog_epilog.epilog", node, 2001, run)  # step 1 committed
        # a 2-node job whose other node never uploads its part of step 5
        _hook("nuro.prolog_epilog.prolog", node, 2002, run)
        _train(store, node / "staging" / "2002", run, (5,))
        step_dir = node / "staging" / "2002" / "ckpt" / L.step_name(5)
        write_request(step_dir, dataclasses.replace(read_request(step_dir), parts_expected=2))
        log = _hook("nuro.prolog_epilog.epilog", node, 2002, run, NURO_EPILOG_FLUSH_TIMEOUT_S="2")
        assert "marked incomplete: steps [5]" in log, log
        assert store.exists(L.incomplete_key(TEAM, run, 5)) and not store.exists(L.manifest_key(TEAM, run, 5))
        assert not (node / "staging" / "2002").exists()
        found = restore_latest(store, TEAM, run, dest=tmp_path / "r")
        assert found is not None and found.step == 1 and "given up" in str(found.skipped[0])

    def test_a_step_torn_on_one_node_is_given_up_at_once_by_every_node(
        self, store: ObjectStore, tmp_path: Path
    ) -> None:
        """Issue 31: a 2-node job ends while step 5 is being written; node2 never finished its share (a step dir
        without its request). node2's epilog gives the step up at once (incomplete.json), and node1's epilog, whose
        own share of step 5 is staged, sees that and stops waiting: neither waits the flush timeout."""
        run = f"t-{uuid.uuid4().hex[:8]}"
        job = 2101
        nodes = [tmp_path / "node1", tmp_path / "node2"]
        for node in nodes:
            node.mkdir()
            _hook("nuro.prolog_epilog.prolog", node, job, run)
        _train(store, nodes[0] / "staging" / str(job), run, (5,))
        step_dir = nodes[0] / "staging" / str(job) / "ckpt" / L.step_name(5)
        req = read_request(step_dir)
        write_request(step_dir, dataclasses.replace(req, parts_expected=2, writers=("node1", "node2")))
        torn = nodes[1] / "staging" / str(job) / "ckpt" / L.step_name(5)
        torn.mkdir(parents=True)
        (torn / "__1_0.distcp").write_bytes(b"half a shard")
        for p in (torn.parent, torn, torn / "__1_0.distcp"):
            os.chown(p, NOBODY, NOBODY)

        log2 = _hook("nuro.prolog_epilog.epilog", nodes[1], job, run, NURO_EPILOG_FLUSH_TIMEOUT_S="100")
        assert f"job={job} checkpoint step 5 given up at once, not waited for: this node's share" in log2, log2
        assert store.exists(L.incomplete_key(TEAM, run, 5))
        log1 = _hook("nuro.prolog_epilog.epilog", nodes[0], job, run, NURO_EPILOG_FLUSH_TIMEOUT_S="100")
        assert f"step=5: incomplete.json of job {job}.0 exists" in log1, log1
        assert "not committed within" not in log1, log1
        assert not store.exists(L.manifest_key(TEAM, run, 5))
        assert not any((n / "staging" / str(job)).exists() for n in nodes)

    def test_a_snapshot_held_in_memory_by_the_surviving_node_is_promoted_and_restored(
        self, store: ObjectStore, tmp_path: Path
    ) -> None:
        """Issue 31 item 3: two gloo ranks as two nodes take in-memory snapshots (each node's share replicated to the
        other); node2 is then lost (its epilog never runs). node1's epilog alone promotes the newest complete
        snapshot to a committed checkpoint of two parts, ``tier: memory``, verified like any, and it restores."""
        from tests.gloo import run_two_ranks

        run = f"m-{uuid.uuid4().hex[:8]}"
        job = 2201
        nodes = [tmp_path / "node1", tmp_path / "node2"]
        for node in nodes:
            node.mkdir()
            _hook("nuro.prolog_epilog.prolog", node, job, run, NURO_SNAPSHOT_ROOT=str(node / "snapshots"))
            assert (node / "snapshots" / str(job) / "ckpt").is_dir()
        script = tmp_path / "snap_worker.py"
        script.write_text(_SNAP_WORKER)
        outs = run_two_ranks(script, run, str(tmp_path), str(PORT_BASE), str(job))
        assert outs == ["held 2 4", "held 2 4"], outs
        for n, node in enumerate(nodes):  # both shares of step 4 on each node, older snapshots gone
            steps = sorted(p.name for p in (node / "snapshots" / str(job) / "ckpt").iterdir())
            assert steps == [L.step_name(4)], steps
            names = {p.name for p in (node / "snapshots" / str(job) / "ckpt" / L.step_name(4)).iterdir()}
            assert {"__0_0.distcp", "__1_0.distcp", ".metadata", ".upload-0.json", ".upload-1.json"} <= names, n

        log = _hook("nuro.prolog_epilog.epilog", nodes[0], job, run, NURO_SNAPSHOT_ROOT=str(nodes[0] / "snapshots"))
        assert f"job={job} in-memory snapshot step 4 promoted to a committed checkpoint" in log, log
        m = load_manifest(store, TEAM, run, 4)
        assert (m.tier, m.parts, m.world_size) == ("memory", 2, 2)
        assert not (nodes[0] / "snapshots" / str(job)).exists()
        found = restore_latest(store, TEAM, run, dest=tmp_path / "r")
        assert found is not None and found.step == 4 and found.manifest.tier == "memory"
        from nuro.lifecycle import run_events

        (said,) = [e for e in run_events.read(store, TEAM, run) if e.kind == "snapshots"]  # the memory, once
        assert said.fields["held_bytes"] > 64 * 64 * 4 and said.fields["on"] is True, said  # both shares: all of it
        import torch.distributed.checkpoint as dcp

        got = {"shared": torch.zeros(64, 64), "own0": torch.zeros(8), "own1": torch.zeros(8)}
        dcp.load(got, checkpoint_id=str(found.path), no_dist=True)
        assert torch.all(got["shared"] == 4.0) and torch.all(got["own0"] == 4.0) and torch.all(got["own1"] == 5.0)


_SNAP_WORKER = """
import os, sys
from pathlib import Path
import torch
import torch.distributed as dist
run, tmp, s3_port, job = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rank = int(os.environ["RANK"])
node = tmp / f"node{rank + 1}"
os.environ.update(GROUP_RANK=str(rank), SLURMD_NODENAME=node.name, SLURM_JOB_ID=job,
                  NURO_SNAPSHOT_DIR=str(node / "snapshots" / job))
dist.init_process_group("gloo")
from nuro.devcluster import s3
from nuro.devcluster.layout import PortPlan
from nuro.wrappers.sdk.checkpointer import Checkpointer
ck = Checkpointer(team="vision", run=run, store=s3.dev_store(PortPlan(s3_port)), staging_dir=node / "staging" / job,
                  upload="agent", interval_s=3600, snapshot_interval_s=0.001)
import time
for step in (2, 3, 4):
    state = {"shared": torch.full((64, 64), float(step)), f"own{rank}": torch.full((8,), float(step + rank))}
    time.sleep(0.05)  # the snapshot interval (1 ms) has passed on rank 0's clock: a fast box saves in less
    assert ck.maybe_save(lambda: state, step) is False  # a snapshot, not a persistent save
ck.close()
print("held", ck.parts_expected, sorted(ck.snapshot_timings)[-1], flush=True)
dist.destroy_process_group()
"""


_JOB_SCRIPT = """#!/bin/bash
exec {python} - <<'PYEOF'
import torch
from nuro.wrappers.sdk.checkpointer import Checkpointer
ck = Checkpointer()  # team, run, S3 and staging root from the job's environment
state = {{"w": torch.zeros(8)}}
restored = ck.restore(state)
start = 0 if restored is None else restored + 1
for step in range(start, start + 3):
    state["w"] += 1
    ck.save(state, step)
ok = ck.wait_committed(start + 2, 60)
ck.close()
print("RESULT", restored, start + 2, ok, state["w"][0].item(), flush=True)
PYEOF
"""


@pytest.mark.slurm
def test_a_slurm_job_checkpoints_and_its_successor_restores_from_the_node_cache(cluster) -> None:
    """Real Slurm: the prolog makes the staging dir for the job's user, the job saves and commits through the SDK
    (inline upload), rank 0 reports the step to its node agent (which the controller hears), the epilog caches the
    newest copy, and the next job of the run on that node restores it without downloading."""
    from nuro.slurm import JobPhase
    from tests.integration.conftest import controller_progress, wait_until

    table = Path(cluster.env["SLURM_CONF"]).parent / "nuro_policy.lua"
    saved = table.read_bytes() if table.exists() else None
    table.unlink(missing_ok=True)  # bridge in pass-through: this test's record is not a full nuro submission
    from tests.integration.conftest import TEST_ACCOUNT

    team = (
        TEST_ACCOUNT  # the team root trusts is the job's Slurm account (nuro.protocol.jobrecord), nuro-alice's is this
    )
    run = f"e2e-{uuid.uuid4().hex[:6]}"
    store = ObjectStore.from_env(cluster.env)
    script = _JOB_SCRIPT.format(python=sys.executable)
    # job output under the repo, not pytest's tmp: a concurrent pytest session resets /tmp/pytest-of-root to 0700
    shared_tmp = REPO / f".devcluster-test-{PORT_BASE}-e2e" / run
    shared_tmp.mkdir(parents=True)
    shared_tmp.parent.chmod(0o755)
    shared_tmp.chmod(0o777)
    try:
        results = []
        for n in (1, 2):
            out = shared_tmp / f"job{n}.out"
            comment = jobcomment.merge(None, nuro={"v": 1, "name": run, "team": team})
            res = cluster.run(
                ["sbatch", "--parsable", "--nodes=1", "--nodelist=gpu003", f"--output={out}", f"--comment={comment}",
                 f"--export=ALL,NURO_TEAM={team},NURO_RUN_NAME={run}", "--wrap", script],
                user="nuro-alice",
            )  # fmt: skip
            job_id = int(res.stdout.strip())
            job = cluster.wait_job_showing_output(job_id, out, timeout_s=180)
            text = out.read_text() if out.exists() else ""
            assert job.phase is JobPhase.COMPLETED, text
            results.append(next(line for line in text.splitlines() if line.startswith("RESULT")))
            want = 3 * n - 1  # rank 0's report through its node agent reached the controller (issue 30)
            wait_until(lambda j=job_id, w=want: getattr(controller_progress(cluster, j), "commit_step", None) == w, 10,
                       f"commit {want} of job {job_id} at the controller")  # fmt: skip
        assert results == ["RESULT None 2 True 3.0", "RESULT 2 5 True 6.0"]
        # lineage: a parent is an earlier committed step (a lower bound: two nodes' workers may commit out of order)
        # (job 2 restored step 2, then committed 3, 4, 5: step 5's uploads may land before those of 3 and 4)
        assert 2 <= load_manifest(store, team, run, 5).parent < 5
        staging = Path(cluster.env["NURO_STAGING_ROOT"].replace("{node}", "gpu003"))  # the node the jobs ran on
        assert (L.cache_dir(staging, team, run) / L.step_name(5)).is_dir()  # left for the next job on the node
    finally:
        if saved is not None:
            table.write_bytes(saved)
        shutil.rmtree(shared_tmp.parent, ignore_errors=True)


def _epilog_on(cluster, node: Path, job: int, run: str, module: str, team: str, **extra: str) -> str:  # noqa: ANN001
    """Run a hook as slurmd does for ``job`` (a real job of ``cluster``, so the epilog can ask Slurm about it) on
    an emulated node of our own (``node``: its staging root, no agent), with the cluster's S3."""
    s3_env = {k: v for k, v in cluster.env.items() if k.startswith(("NURO_S3_", "AWS_"))}
    settings = {**s3_env, "NURO_STAGING_ROOT": str(node / "staging"), "NURO_CACHE_DIR": str(node / "cache"),
                "NURO_STAGING_MIN_FREE_GB": "0.01", "SLURM_CONF": cluster.env["SLURM_CONF"], **extra}  # fmt: skip
    env_file = node / "nuro.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    comment = jobcomment.merge(None, nuro={"v": 1, "name": run, "team": team})
    env = {
        "PATH": cluster.env.get("PATH", os.environ["PATH"]), "NURO_ENV_FILE": str(env_file),
        "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(NOBODY), "SLURM_JOB_GID": str(NOBODY),
        "SLURM_JOB_COMMENT": comment, "SLURM_JOB_USER": "nobody", "SLURM_JOB_ACCOUNT": team,
        "SLURMD_NODENAME": node.name, "PYTHONPATH": str(REPO), "NURO_HOOK_HEALTHCHECK": "0",
    }  # fmt: skip
    res = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stderr
    return res.stderr


@pytest.mark.slurm
def test_a_finished_jobs_uploads_are_handed_to_the_agent_and_a_requeued_jobs_are_committed_first(
    cluster, tmp_path: Path
) -> None:
    """Issue 15 item 6: the epilog of a job Slurm is not requeueing leaves its pending uploads to the node agent
    (marker, dir and record kept) and returns at once; the agent's worker commits them, caches the newest step and
    cleans up as the epilog would. A job Slurm requeued (its restart count went up since the prolog) is flushed by
    the epilog itself: its next attempt may restore elsewhere, from S3. Real Slurm jobs give the epilog real
    answers; the node is our own, without an agent, so the uploads stay pending until we run the agent's worker."""
    from nuro.slurm import JobPhase
    from tests.integration.conftest import TEST_ACCOUNT

    store = ObjectStore.from_env(cluster.env)
    team = TEST_ACCOUNT

    def real_job(*args: str) -> int:
        job = cluster.backend.submit("#!/bin/bash\ntrue\n", "-o", "/dev/null", *args)
        assert cluster.backend.wait_for_job(job, timeout_s=120).phase is JobPhase.COMPLETED
        return job

    finished = real_job()
    requeue = '[ "${SLURM_RESTART_COUNT:-0}" = 0 ] && scontrol requeue $SLURM_JOB_ID && sleep 60; true'
    requeued = cluster.backend.submit(f"#!/bin/bash\n{requeue}\n", "-o", "/dev/null", "--requeue")
    assert cluster.backend.wait_for_job(requeued, timeout_s=180).phase is JobPhase.COMPLETED
    assert cluster.backend.job_restarts(requeued) == (1, "COMPLETED")  # what the epilog compares with the record

    node = tmp_path / "gpu999"
    node.mkdir()
    root = node / "staging"
    on = {"NURO_EPILOG_HANDOFF": "1"}
    for job, step in ((finished, 3), (requeued, 4)):
        run = f"h-{uuid.uuid4().hex[:8]}"
        _epilog_on(cluster, node, job, run, "nuro.prolog_epilog.prolog", team)
        _train(store, root / str(job), run, (step,), team=team)  # upload="agent": pending, no agent here
        log = _epilog_on(cluster, node, job, run, "nuro.prolog_epilog.epilog", team, **on)
        if job == finished:
            assert f"job={job} pending checkpoint uploads handed to the node agent" in log, log
            assert not store.exists(L.manifest_key(team, run, step))  # not committed by the epilog
            assert (root / str(job)).is_dir() and jobrecord.read(root, job) is not None  # kept for the agent
            assert [h.job_id for h in handoff.handoffs(root)] == [str(job)]
            worker = node_handoff_worker(store, root, on)
            worker.run_once()
            assert worker.finish_handoffs() == [str(job)]
            assert store.exists(L.manifest_key(team, run, step))
            assert not (root / str(job)).exists() and jobrecord.read(root, job) is None
            assert handoff.handoffs(root) == []
            assert (L.cache_dir(root, team, run) / L.step_name(step)).is_dir()  # cached as the epilog caches
        else:
            assert f"job={job} is being requeued" in log, log
            assert store.exists(L.manifest_key(team, run, step))  # committed before the node was released
            assert not (root / str(job)).exists() and handoff.handoffs(root) == []


@pytest.mark.slurm
def test_a_step_whose_writer_node_is_down_is_given_up_at_once(cluster, restore, tmp_path: Path) -> None:
    """Issue 31: the other node of a 2-node step died before uploading its share (Slurm has it DOWN): the epilog of
    the surviving node gives the step up as soon as Slurm says so, instead of waiting for the part until the flush
    timeout; while the writer is up, the same step is waited for (timeout, marked incomplete)."""
    from nuro.checkpoint.lostwriters import node_is_lost
    from nuro.devcluster import manager
    from nuro.slurm import JobPhase
    from tests.integration.conftest import TEST_ACCOUNT, wait_until

    store = ObjectStore.from_env(cluster.env)
    team = TEST_ACCOUNT
    job = cluster.backend.submit("#!/bin/bash\ntrue\n", "-o", "/dev/null")
    assert cluster.backend.wait_for_job(job, timeout_s=120).phase is JobPhase.COMPLETED
    lost = "gpu008"
    node = tmp_path / "gpu999"
    node.mkdir()
    root = node / "staging"
    for step, down in ((6, False), (7, True)):
        run = f"w-{uuid.uuid4().hex[:8]}"
        _epilog_on(cluster, node, job, run, "nuro.prolog_epilog.prolog", team)
        _train(store, root / str(job), run, (step,), team=team)
        step_dir = root / str(job) / "ckpt" / L.step_name(step)
        write_request(
            step_dir, dataclasses.replace(read_request(step_dir), parts_expected=2, writers=(node.name, lost))
        )
        if down:
            # the writer's host crashes: a node merely set DOWN would be returned by its live slurmd (ReturnToService=2)
            # before the epilog asks; the fixture revives it and puts it back in service afterwards
            restore.append(lost)
            manager.kill_node(cluster.layout, lost)
            cluster.run(["scontrol", "update", f"nodename={lost}", "state=down", "reason=nuro-test writer lost"])
            wait_until(lambda: node_is_lost(next(n for n in cluster.backend.nodes() if n.name == lost).flags), 30,
                       f"{lost} lost in Slurm's view")  # fmt: skip
        timeout = "100" if down else "3"
        log = _epilog_on(cluster, node, job, run, "nuro.prolog_epilog.epilog", team,
                         NURO_EPILOG_FLUSH_TIMEOUT_S=timeout)  # fmt: skip
        if down:
            assert f"given up at once, not waited for: its writer node {lost} (part 1) was lost" in log, log
            assert "not committed within" not in log, log
        else:
            assert f"not committed within 3 s, marked incomplete: steps [{step}]" in log, log
        assert store.exists(L.incomplete_key(team, run, step)) and not store.exists(L.manifest_key(team, run, step))

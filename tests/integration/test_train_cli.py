"""nuro-train ls / status / logs / cancel / quota as team members use them, on the real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nuro.datasets.snapshot import snapshot
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment
from nuro.slurm import JobPhase
from tests.integration.conftest import POLICY_USERS, REPO, LiveCluster, cancel_jobs_of, controller_progress, wait_until

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
POLICY = REPO / "examples" / "policy" / "teams.yaml"


@pytest.fixture(scope="module")
def teams(cluster: LiveCluster) -> LiveCluster:
    """The example policy applied, and no job of its members left by earlier tests (the views count them)."""
    cluster.run([str(BIN / "nuro-admin"), "policy", "apply", str(POLICY)])
    cancel_jobs_of(cluster, POLICY_USERS)
    return cluster


def train(cluster: LiveCluster, user: str, *args: str) -> subprocess.CompletedProcess:
    return cluster.run([str(BIN / "nuro-train"), *args], user=user, check=False)


def test_a_member_follows_a_run_from_submit_to_end(teams: LiveCluster, shared_tmp: Path) -> None:
    out, go = shared_tmp / "run.out", shared_tmp / "go"
    # the job runs until the test has looked at it (a fixed sleep ended before the views were read on a busy machine)
    script = (f"#!/bin/bash\necho step-one\n{BIN}/nuro-job ckpt --step 12\n"
              f"for i in $(seq 600); do [ -e {go} ] && break; sleep 0.2; done\necho step-two\n")  # fmt: skip
    res = subprocess.run(
        ["runuser", "-u", "alice", "--", "env", *(f"{k}={v}" for k, v in teams.env.items()), "sbatch", "--parsable",
         "--nodes=1", "--gres=gpu:8", f"--output={out}", "--comment", '{"note":"r1"}'],
        input=script, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    job_id = int(res.stdout.strip())
    try:
        teams.backend.wait_for_job(job_id, {JobPhase.RUNNING}, timeout_s=40)
        listed = json.loads(train(teams, "alice", "ls", "--json").stdout)
        mine = next(r for r in listed if r["job_id"] == job_id)
        assert mine["team"] == "perception" and mine["qos"] == "g-perception" and mine["gpus"] == 8
        bobs = json.loads(train(teams, "bob", "ls", "--json").stdout)  # bob sees only his own by default
        assert all(r["user"] == "bob" for r in bobs) and job_id not in [r["job_id"] for r in bobs]
        team_view = json.loads(train(teams, "bob", "ls", "--team", "perception", "--json").stdout)
        assert [r["job_id"] for r in team_view] == [job_id]
        rows = json.loads(train(teams, "alice", "quota", "--policy", str(POLICY), "--json").stdout)
        perception = next(r for r in rows if r["team"] == "perception")
        assert perception["guaranteed_used_gpus"] == 8 and perception["quota_gpus"] == 24
        assert perception["lendable_gpus"] == 8  # min(lend limit 8, 24 - 8 idle)
        # the job's report reached the controller through the node agent, never through its comment (issue 30);
        # ``status`` shows it from the policy loop's waits file (tests/unit/test_pending.py)
        wait_until(lambda: getattr(controller_progress(teams, job_id), "commit_step", None) == 12, 20,
                   "the checkpoint report at the controller")  # fmt: skip
        refused = train(teams, "bob", "cancel", str(job_id))
        assert refused.returncode == 1 and "error" in refused.stderr
        go.touch()
        followed = train(teams, "alice", "logs", "-f", str(job_id))
        assert followed.returncode == 0 and "step-one" in followed.stdout and "step-two" in followed.stdout
    finally:
        cancel_jobs_of(teams, ("alice",))


def test_cancel_and_unknown_jobs(teams: LiveCluster) -> None:
    res = teams.run(["sbatch", "--parsable", "--hold", "--output=/dev/null", "--wrap", "true"], user="alice")
    job_id = int(res.stdout.strip())
    done = train(teams, "alice", "cancel", str(job_id))
    assert done.returncode == 0 and f"cancelled {job_id}" in done.stdout
    teams.backend.wait_for_job(job_id, {JobPhase.CANCELLED}, timeout_s=20)
    again = train(teams, "alice", "cancel", str(job_id))  # scancel alone is silent and exits 0 here
    assert again.returncode == 0 and f"job {job_id} already ended (CANCELLED" in again.stdout, again.stdout
    unknown = train(teams, "alice", "cancel", "999999")
    assert unknown.returncode == 4 and "no job 999999" in unknown.stderr and "cancelled" not in unknown.stdout
    missing = train(teams, "alice", "status", "999999")
    assert missing.returncode == 4 and "no job 999999" in missing.stderr


def test_lineage_follows_resume_from_to_the_parent_run(teams: LiveCluster, tmp_path: Path) -> None:
    (tmp_path / "roads").mkdir()
    (tmp_path / "roads" / "frames.bin").write_bytes(b"frame" * 1000)
    digest = snapshot(ObjectStore.from_env(teams.env), tmp_path / "roads", "roads").digest  # the prolog verifies it
    pin = {
        "team": "perception",
        "dataset": {"name": "roads", "digest": digest},
        "code": {"repo": "/srv/repo", "commit": "b" * 40},
    }

    def submit(meta: dict) -> int:
        comment = jobcomment.merge(None, nuro=meta)  # compact, sorted: the form the bridge accepts
        res = teams.run(["sbatch", "--parsable", "--output=/dev/null", f"--comment={comment}", "--wrap", "true"],
                        user="alice")  # fmt: skip
        return int(res.stdout.strip())

    parent = submit(pin)
    teams.backend.wait_for_job(parent, timeout_s=30)
    child = submit({**pin, "resume_from": str(parent)})
    teams.backend.wait_for_job(child, timeout_s=30)
    chain = json.loads(train(teams, "alice", "lineage", str(child), "--json").stdout)
    assert [r["job_id"] for r in chain] == [child, parent]
    assert chain[0]["dataset"]["digest"] == digest and chain[0]["code"]["commit"] == "b" * 40
    assert chain[0]["resume_from"] == str(parent) and chain[1]["resume_from"] is None
    human = train(teams, "alice", "lineage", str(child))
    assert human.returncode == 0 and "resumed from" in human.stdout and "roads@sha256:" in human.stdout

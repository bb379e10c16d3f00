"""``nuro-admin policy apply/show`` against the real Slurm 22.05 cluster (no nuro daemon runs here).

The tests run in file order and build on each other: dry run → apply → show → idempotent re-apply → a refusal that
exits 0 → jobs under the team's QOS and hard quota → drift repair → failure path → prune. The module starts and ends
with no nuro-managed objects, so other integration modules sharing the session cluster see the state they expect.

Re-recording the unit-test fixtures (tests/fixtures/slurm/sacctmgr_policy_*.txt) is part of this run when
``NURO_RECORD_POLICY_FIXTURES=1``: the states "empty", "applied" and "drift" are captured as they happen here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from nuro.policy.model import load_policy, parse_policy
from nuro.policy.plan import SACCTMGR, Change, Op, Plan, build_plan
from nuro.policy.sacctmgr import apply_plan
from nuro.policy.slurm_state import READ_ARGVS, read_state
from tests.integration.conftest import (
    POLICY_USERS,
    TEST_ACCOUNT,
    TEST_SLURM,
    LiveCluster,
    cancel_jobs_of,
    wait_accounted,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policy" / "teams.yaml"
FIXTURES = REPO / "tests" / "fixtures" / "slurm"
RECORD = os.environ.get("NURO_RECORD_POLICY_FIXTURES") == "1"
#: Hand-made drift for the "drift" fixture: what an admin's manual sacctmgr edits could leave behind.
DRIFT = (
    ["modify", "qos", "where", "name=g-perception", "set", "GrpTRES=gres/gpu=20,cpu=100", "Priority=5",
     "Preempt=b-prediction"],
    ["modify", "account", "where", "name=perception", "set", "Fairshare=10"],
    ["modify", "user", "where", "name=alice", "account=perception", "set", "QOS=g-perception",
     "DefaultQOS=g-perception"],
    ["add", "user", "chen", "Account=perception"],
)  # fmt: skip


def nuro_admin(cluster: LiveCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (as an admin would), against the test cluster."""
    argv = [sys.executable, "-m", "nuro.admin.admin_cli", *args]
    return subprocess.run(argv, env={**os.environ, **cluster.env}, capture_output=True, text=True, timeout=180)


def apply_json(cluster: LiveCluster, policy_file: Path, *flags: str) -> tuple[int, dict]:
    proc = nuro_admin(cluster, "policy", "apply", str(policy_file), "--json", *flags)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from policy apply rc={proc.returncode}\nstdout={proc.stdout}\nstderr={proc.stderr}")


def variant(tmp_path: Path, name: str, edit) -> Path:
    """A copy of the example policy changed by ``edit(dict)``, written to tmp_path/name."""
    data = yaml.safe_load(EXAMPLE.read_text())
    edit(data)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def record(cluster: LiveCluster, scenario: str) -> None:
    if not RECORD:
        return
    for what, argv in READ_ARGVS.items():
        (FIXTURES / f"sacctmgr_policy_{scenario}_{what}.txt").write_text(cluster.run(list(argv)).stdout)


def remove_managed(cluster: LiveCluster) -> None:
    """Remove every nuro-managed object (prune against a policy with no teams), by nuro's own planner."""
    empty = parse_policy({"cluster_gpus": 64, "teams": {}})
    result = apply_plan(build_plan(empty, read_state(cluster.backend), prune=True), cluster.backend)
    assert result.ok, f"cleanup failed: {result.error}"


@pytest.fixture(scope="module")
def clean(cluster: LiveCluster) -> Iterator[LiveCluster]:
    cancel_jobs_of(cluster, POLICY_USERS)
    remove_managed(cluster)
    lua = Path(cluster.env["SLURM_CONF"]).parent / "nuro_policy.lua"
    lua.unlink(missing_ok=True)
    yield cluster
    cancel_jobs_of(cluster, POLICY_USERS)
    remove_managed(cluster)
    lua.unlink(missing_ok=True)


def test_dry_run_prints_the_plan_and_changes_nothing(clean: LiveCluster) -> None:
    record(clean, "empty")
    rc, out = apply_json(clean, EXAMPLE, "--dry-run")
    assert rc == 0, out
    assert out["counts"] == {"add": 18, "modify": 0, "delete": 0}
    assert out["lua_table"]["state"] == "new" and out["lua_table"]["written"] is False
    assert "g-perception" not in read_state(clean.backend).qos
    text = nuro_admin(clean, "policy", "apply", str(EXAMPLE), "--dry-run")
    assert text.returncode == 0, text.stderr
    assert "$ sacctmgr -i add qos g-perception 'Description=nuro-policy guaranteed perception'" in text.stdout
    assert "18 to add, 0 to change, 0 to remove" in text.stdout


def test_apply_creates_accounts_qos_users_and_the_lua_table(clean: LiveCluster) -> None:
    rc, out = apply_json(clean, EXAMPLE)
    assert rc == 0, out
    assert out["result"]["ok"] and len(out["result"]["applied"]) == 18
    lua = Path(out["lua_table"]["path"])
    assert out["lua_table"]["written"] and lua.parent == Path(clean.env["SLURM_CONF"]).parent and lua.is_file()
    state = read_state(clean.backend)
    assert dict(state.qos["g-perception"].grp_tres) == {"gres/gpu": "24"}
    assert state.qos["b-perception"].grace_s == 60 and state.qos["b-perception"].preempt_mode == "requeue"
    assert not any(q.preempt for q in state.qos.values()), "nuro sets no Preempt= lists"
    assert {q.preempt_exempt_s for q in state.managed_qos} == {120}, "min_run_s as PreemptExemptTime, read back"
    assert state.users["alice"].default_account == "perception"
    assert state.assocs[("priya", "prediction")].qos == {"g-prediction", "b-prediction", "urgent"}
    assert TEST_ACCOUNT in state.accounts and not state.accounts[TEST_ACCOUNT].is_managed
    record(clean, "applied")


def test_show_reads_the_policy_back(clean: LiveCluster) -> None:
    proc = nuro_admin(clean, "policy", "show", "--json")
    assert proc.returncode == 0, proc.stderr
    view = json.loads(proc.stdout)
    teams = {t["name"]: t for t in view["teams"]}
    assert set(teams) == {"perception", "prediction", "controls", "simulation"}
    assert teams["perception"] | {"members": sorted(teams["perception"]["members"])} == {
        "name": "perception", "quota_gpus": 24, "borrow_limit_gpus": 16, "grace_s": 60, "fairshare": "24",
        "default_qos": "g-perception", "members": ["alice", "bob"],
    }  # fmt: skip
    assert view["tiers"] == [
        {"name": "urgent", "priority": 100000, "allowed_accounts": ["perception"], "allowed_users": ["priya"]}
    ]
    table = nuro_admin(clean, "policy", "show")
    assert table.returncode == 0 and "perception" in table.stdout and "urgent" in table.stdout


def test_second_apply_changes_nothing(clean: LiveCluster) -> None:
    rc, out = apply_json(clean, EXAMPLE)
    assert rc == 0, out
    assert out["changes"] == [] and out["kept"] == []
    assert out["lua_table"]["state"] == "unchanged" and not out["lua_table"]["written"]
    text = nuro_admin(clean, "policy", "apply", str(EXAMPLE))
    assert "no changes: Slurm already matches the policy" in text.stdout


def test_a_refusal_with_exit_0_counts_as_failure(clean: LiveCluster) -> None:
    """sacctmgr refuses a QOS list without the association's DefaultQOS; 22.05 says so on stderr yet exits 0
    (24.11+ exit 1): either way the change counts as failed."""
    argv = (*SACCTMGR, "modify", "user", "where", "name=alice", "account=perception", "set", "QOS=g-prediction")
    bad = Change(Op.MODIFY, "association", "alice@perception", (), argv)
    result = apply_plan(Plan((bad,)), clean.backend)
    assert not result.ok and result.applied == () and result.failed is bad
    assert result.error is not None and result.error.returncode == (0 if TEST_SLURM == "22.05" else 1)
    assert "don't have access to their default qos" in result.error.slurm_message
    assert build_plan(load_policy(EXAMPLE), read_state(clean.backend)).is_empty, "nothing changed"


def _state(cluster: LiveCluster, job_id: str) -> tuple[str, str]:
    """(state, reason) of one job through the adapter, the one reader of every version's squeue JSON."""
    job = next((j for j in cluster.backend.jobs() if j.job_id == int(job_id)), None)
    return (job.state, job.reason) if job is not None else ("", "")


def test_member_job_runs_with_the_team_default_qos(clean: LiveCluster) -> None:
    proc = clean.run(["sbatch", "--parsable", "-o", "/dev/null", "--gpus-per-node=1", "--wrap", "sleep 2"],
                     user="alice")  # fmt: skip
    job_id = proc.stdout.strip().split(";")[0]
    job = clean.backend.wait_for_job(int(job_id), timeout_s=60)
    assert (job.account, job.qos, job.user) == ("perception", "g-perception", "alice")
    assert job.phase.value == "COMPLETED", job


def test_hard_quota_holds_without_any_nuro_daemon(clean: LiveCluster) -> None:
    """perception's quota is 24 GPUs: one 16-GPU job runs, the second pends on the QOS limit (QOSGrpGRES)."""
    ids = []
    for _ in range(2):
        proc = clean.run(["sbatch", "--parsable", "-o", "/dev/null", "-N2", "--gpus-per-node=8", "--wrap",
                          "sleep 300"], user="alice")  # fmt: skip
        ids.append(proc.stdout.strip().split(";")[0])
    try:
        wait_until(lambda: _state(clean, ids[0])[0] == "RUNNING", 60, f"job {ids[0]} running")
        wait_until(lambda: _state(clean, ids[1])[1] == "QOSGrpGRES", 60, f"job {ids[1]} QOSGrpGRES")
        assert _state(clean, ids[1])[0] == "PENDING"
    finally:
        clean.run(["scancel", *ids], check=False)


def test_drift_is_repaired_and_stray_members_pruned(clean: LiveCluster, tmp_path: Path) -> None:
    legacy = variant(tmp_path, "legacy.yaml", lambda d: d["teams"].update(
        legacy={"members": ["nuro-bob"], "quota_gpus": 0, "borrow_limit_gpus": 8}))  # fmt: skip
    rc, out = apply_json(clean, legacy)
    assert rc == 0, out
    for argv in DRIFT:
        clean.run(["sacctmgr", "-i", *argv])
    record(clean, "drift")
    rc, out = apply_json(clean, EXAMPLE)
    assert rc == 0, out
    assert {c["name"] for c in out["result"]["applied"]} == {"g-perception", "perception", "alice@perception"}
    assert set(out["kept"]) == {"association chen@perception", "association nuro-bob@legacy", "account legacy",
                                "qos b-legacy", "qos g-legacy"}  # fmt: skip
    rc, out = apply_json(clean, EXAMPLE, "--prune")
    assert rc == 0, out
    state = read_state(clean.backend)
    assert "legacy" not in state.accounts and ("chen", "perception") not in state.assocs
    assert state.users["nuro-bob"].default_account == TEST_ACCOUNT, "a user keeps its unmanaged association"
    assert dict(state.qos["g-perception"].grp_tres) == {"gres/gpu": "24"}
    rc, out = apply_json(clean, EXAMPLE, "--prune")
    assert (rc, out["changes"]) == (0, [])


def test_failure_stops_with_slurms_message(clean: LiveCluster, tmp_path: Path) -> None:
    """Slurm refuses to remove an association with a running job: apply stops there and says what was done."""
    no_controls = variant(tmp_path, "no-controls.yaml", lambda d: d["teams"].pop("controls"))
    proc = clean.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 300"], user="chen")
    job_id = proc.stdout.strip().split(";")[0]
    try:
        wait_until(lambda: _state(clean, job_id)[0] == "RUNNING", 60, f"chen's job {job_id} running")
        wait_accounted(clean, job_id)  # the refusal is slurmdbd's, on its job table (under load: seconds late)
        text = nuro_admin(clean, "policy", "apply", str(no_controls), "--prune")
        assert text.returncode == 1, text.stdout + text.stderr
        assert "Job(s) active, cancel job(s) before remove" in text.stderr
        assert "apply stopped at - user chen" in text.stderr and "policy table was not written" in text.stderr
    finally:
        clean.run(["scancel", job_id], check=False)


def test_prune_removes_a_team_deleted_from_the_policy(clean: LiveCluster, tmp_path: Path) -> None:
    no_controls = variant(tmp_path, "no-controls.yaml", lambda d: d["teams"].pop("controls"))
    cancel_jobs_of(clean, ("chen",))  # the previous test's job: ended in slurmctld and in accounting
    rc, out = apply_json(clean, no_controls)
    assert rc == 0, out
    assert out["changes"] == [] and set(out["kept"]) == {"user chen", "account controls", "qos b-controls",
                                                          "qos g-controls"}  # fmt: skip
    assert "controls" in read_state(clean.backend).accounts, "without --prune nothing is removed"
    rc, out = apply_json(clean, no_controls, "--prune")
    assert rc == 0, out
    assert [(c["op"], c["kind"], c["name"]) for c in out["changes"]] == [
        ("-", "user", "chen"), ("-", "account", "controls"), ("-", "qos", "b-controls"), ("-", "qos", "g-controls"),
    ]  # fmt: skip
    state = read_state(clean.backend)
    assert "controls" not in state.accounts and "chen" not in state.users
    assert not {"g-controls", "b-controls"} & set(state.qos)
    assert {"root", TEST_ACCOUNT} <= set(state.accounts) and "normal" in state.qos, "unmanaged objects untouched"
    assert state.users["nuro-alice"].default_account == TEST_ACCOUNT

"""job_submit.lua on the real cluster: every shared vector through real sbatch, plus the modify hook and fail-open.

The fixture sets up the Slurm side the vectors need with plain sacctmgr (team accounts, users with g-/b-/urgent QOS,
QOS GrpTRES) -- `nuro-admin policy apply` will own that later -- and writes the current job_submit.lua and the
generated table beside slurm.conf. Accepted jobs are submitted with --hold so they never run, read back with
``scontrol show job -o`` and cancelled.

slurmctld 22.05 re-reads job_submit.lua on a submission when its mtime (1 s resolution) is newer than the loaded
copy's (src/lua/slurm_lua.c, slurm_lua_loadscript), and job_submit.lua dofile's the table on every submission, so no
reconfigure is needed; the fixture only makes sure the copied script's mtime moves forward.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from nuro.cluster.description import release_of
from nuro.jobspec.submission import requeue_args
from nuro.policy import load_policy
from nuro.policy.admission import JobRequest, decide
from nuro.policy.luatable import LUA_SEGMENT_SINCE, TABLE_FILE, policy_table, render_lua_table
from nuro.policy.model import Policy
from nuro.policy.slurm_state import SlurmState, read_cluster_facts, read_state
from nuro.protocol import jobcomment
from nuro.slurm.models import EXPEDITED_REQUEUE_SINCE
from nuro.slurm.parse_text import parse_scontrol_show_oneliner
from tests.integration.conftest import TEST_SLURM, TEST_TOPOLOGY, LiveCluster
from tests.luabridge import install_script

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]

REPO = Path(__file__).resolve().parents[2]
VECTORS = json.loads((REPO / "tests/vectors/admission.json").read_text())
POLICY = load_policy(REPO / VECTORS["policy"])
#: What sbatch prints after "Batch job submission failed: " for each code the bridge returns (22.05 slurm_errtab).
STRERROR = {
    "ESLURM_ACCESS_DENIED": "Access/permission denied",
    "ESLURM_ACCOUNTING_POLICY": "Job violates accounting/QOS policy",
    "ESLURM_INVALID_ACCOUNT": "Invalid account or account/partition combination specified",
}


def _sacctmgr(cluster: LiveCluster, *args: str) -> None:
    """Idempotent enough for a shared session: 'add' of an existing entity fails harmlessly, 'modify' re-applies."""
    cluster.run(["sacctmgr", "-i", *args], check=False)


def _setup_slurm_side(cluster: LiveCluster) -> None:
    for tier in POLICY.tiers:
        _sacctmgr(cluster, "add", "qos", tier.name, f"Priority={tier.priority}")
    for team in POLICY.teams:
        for qos, gpus in ((team.guaranteed_qos, team.quota_gpus), (team.borrow_qos, team.borrow_limit_gpus)):
            _sacctmgr(cluster, "add", "qos", qos, f"GrpTRES=gres/gpu={gpus}")
            _sacctmgr(cluster, "modify", "qos", qos, "set", f"GrpTRES=gres/gpu={gpus}")
        _sacctmgr(cluster, "add", "account", team.name, f"Fairshare={team.shares}")
        for user in team.members:
            qos = [team.guaranteed_qos, team.borrow_qos]
            qos += [t.name for t in POLICY.tiers if team.name in t.allowed_accounts or user in t.allowed_users]
            _sacctmgr(cluster, "add", "user", user, f"Account={team.name}", f"DefaultAccount={team.name}")
            _sacctmgr(
                cluster, "modify", "user", user, "where", f"account={team.name}", "set",
                f"QOS={','.join(qos)}", f"DefaultQOS={team.guaranteed_qos}",
            )  # fmt: skip


@pytest.fixture(scope="module")
def bridge(cluster: LiveCluster) -> Iterator[Path]:
    """The team accounts/QOS, the current job_submit.lua and the policy table beside slurm.conf."""
    etc = Path(cluster.env["SLURM_CONF"]).parent
    before = read_state(cluster.backend)
    _setup_slurm_side(cluster)
    install_script(etc, "job_submit.lua", (REPO / "slurm_plugins/job_submit.lua").read_text())
    install_script(etc, TABLE_FILE, render_lua_table(POLICY))
    yield etc
    (etc / TABLE_FILE).unlink(missing_ok=True)
    for name in ("nuro-vec", "nuro-mod", "nuro-open"):  # scancel honours only one --name
        cluster.run(["scancel", f"--name={name}"], check=False)
    _remove_what_setup_added(cluster, before)


def _remove_what_setup_added(cluster: LiveCluster, before: SlurmState) -> None:
    """Leave accounting as the module found it: the QOS and accounts made here carry no nuro-policy mark, and a
    later ``policy apply`` of the same teams would rightly refuse to take them over (seen on every version)."""
    after = read_state(cluster.backend)
    for user, account in sorted(set(after.assocs) - set(before.assocs)):
        _sacctmgr(cluster, "delete", "user", "where", f"name={user}", f"account={account}")
    for account in sorted(set(after.accounts) - set(before.accounts)):
        _sacctmgr(cluster, "delete", "account", "where", f"name={account}")
    for qos in sorted(set(after.qos) - set(before.qos)):
        _sacctmgr(cluster, "delete", "qos", "where", f"name={qos}")


def _sbatch(cluster: LiveCluster, user: str, args: list[str], name: str = "nuro-vec"):
    argv = ["sbatch", "--parsable", "--hold", "-J", name, "-D", "/tmp", "-o", "/dev/null", *args, "--wrap", "true"]
    return cluster.run(argv, user=None if user == "root" else user, check=False)


def _job(cluster: LiveCluster, job_id: str) -> dict[str, str]:
    [record] = parse_scontrol_show_oneliner(cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout)
    return record


def _seconds(hms: str) -> int:
    days, _, rest = hms.rpartition("-")
    h, m, s = (int(p) for p in rest.split(":"))
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def _switches(record: dict[str, str]) -> tuple[int | None, int | None]:
    if "Switches" not in record:
        return None, None
    count, _, wait = record["Switches"].partition("@")
    return int(count), _seconds(wait) if wait else None


def _with(update: dict) -> Policy:
    """The example policy with ``update`` applied (a vector's ``policy_update``), validated again."""
    return Policy.model_validate({**POLICY.model_dump(), **update})


def _segment(record: dict[str, str]) -> int | None:
    """The job's segment size (``scontrol show job``'s ``SegmentSize=``, shown only when one was asked)."""
    size = int(record.get("SegmentSize", "0") or 0)
    return size or None


@contextmanager
def _table(etc: Path, policy: Policy, **facts: object) -> Iterator[None]:
    """``policy``'s table (with ``policy_table``'s cluster ``facts``) installed for the duration (the bridge
    dofile's it on every submission)."""
    install_script(etc, TABLE_FILE, render_lua_table(policy, **facts))
    try:
        yield
    finally:
        install_script(etc, TABLE_FILE, render_lua_table(POLICY))


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=[v["id"] for v in VECTORS["vectors"]])
def test_vector_through_real_sbatch(cluster: LiveCluster, bridge: Path, vector: dict) -> None:
    if "policy_update" in vector:
        with _table(bridge, _with(vector["policy_update"])):
            out = _sbatch(cluster, vector["user"], vector["args"])
    else:
        out = _sbatch(cluster, vector["user"], vector["args"])
    want = vector["expect"]
    if want["verdict"] == "reject":
        assert out.returncode != 0, f"sbatch accepted job {out.stdout.strip()}; expected: {want['message']}"
        assert f"sbatch: error: {want['message']}\n" in out.stderr, out.stderr
        assert f"Batch job submission failed: {STRERROR[want['code']]}" in out.stderr, out.stderr
        return
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    try:
        record = _job(cluster, job_id)
        switches, wait = _switches(record)
        got = {
            "qos": record["QOS"],
            "account": record["Account"],
            "requeue": record["Requeue"] == "1",
            "switches": switches,
            "switch_wait_s": wait,
        }
        expected = {k: want[k] for k in got if k in want}
        assert {k: got[k] for k in expected} == expected, record
    finally:
        cluster.run(["scancel", job_id], check=False)


def _ctld_log(cluster: LiveCluster) -> str:
    return (cluster.layout.log / "slurmctld.log").read_text(errors="replace")


def _held(cluster: LiveCluster, user: str, *args: str) -> str:
    out = _sbatch(cluster, user, list(args), name="nuro-mod")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


#: 23.02+ shows the modify hook's ``slurm.log_user`` message to the user; 22.05 discards it (job_submit.lua's notes).
MODIFY_SPEAKS = tuple(int(part) for part in TEST_SLURM.split(".")) >= (23, 2)


def _refused_on_modify(out, code_text: str, context: object) -> None:
    """An ``scontrol update`` refused with Slurm's text for the code, and with nuro's reason where Slurm shows it."""
    assert out.returncode != 0 and code_text in out.stderr, context
    assert ("nuro: " in out.stderr) == MODIFY_SPEAKS, (f"Slurm {TEST_SLURM}", context)


def _update(cluster: LiveCluster, user: str | None, job_id: str, *settings: str):
    return cluster.run(["scontrol", "update", f"jobid={job_id}", *settings], user=user, check=False)


def test_modify_cannot_switch_to_another_teams_qos(cluster: LiveCluster, bridge: Path) -> None:
    job = _held(cluster, "alice", "-N2", "--gpus-per-node=1")
    out = _update(cluster, "alice", job, "qos=g-prediction")
    _refused_on_modify(out, "Access/permission denied", out.stderr)
    assert _job(cluster, job)["QOS"] == "g-perception"
    assert re.search(rf"nuro: reject job_id={job} uid=\d+ user=alice rule=qos_other_team", _ctld_log(cluster))


def test_modify_cannot_switch_to_a_tier_not_allowed(cluster: LiveCluster, bridge: Path) -> None:
    job = _held(cluster, "chen", "--gpus-per-node=1")
    out = _update(cluster, "chen", job, "qos=urgent")
    _refused_on_modify(out, "Access/permission denied", out.stderr)
    assert _job(cluster, job)["QOS"] == "g-controls"
    assert re.search(rf"nuro: reject job_id={job} uid=\d+ user=chen rule=tier_denied", _ctld_log(cluster))


def test_modify_cannot_raise_gpus_above_the_cap(cluster: LiveCluster, bridge: Path) -> None:
    job = _held(cluster, "alice", "-N6", "--gpus-per-node=4")  # 24 of perception's 40
    out = _update(cluster, "alice", job, "TresPerNode=gres:gpu:8")  # 48
    _refused_on_modify(out, STRERROR["ESLURM_ACCOUNTING_POLICY"], out.stderr)
    assert _job(cluster, job)["TresPerNode"] in ("gres:gpu:4", "gres/gpu:4")  # 22.05 / 24.11+ spelling
    assert f"nuro: reject job_id={job}" in _ctld_log(cluster)


def test_modify_cannot_raise_nodes_above_the_cap(cluster: LiveCluster, bridge: Path) -> None:
    job = _held(cluster, "bob", "-N2", "--gpus-per-node=8")  # 16 of perception's 40
    out = _update(cluster, "bob", job, "NumNodes=6")  # 48
    _refused_on_modify(out, STRERROR["ESLURM_ACCOUNTING_POLICY"], out.stderr)
    assert re.search(rf"nuro: reject job_id={job} uid=\d+ user=bob rule=gpu_cap", _ctld_log(cluster))


def test_modify_requeue_off_is_forced_back_on(cluster: LiveCluster, bridge: Path) -> None:
    job = _held(cluster, "bob", "--gpus-per-node=1")
    out = _update(cluster, "bob", job, "requeue=0")
    assert out.returncode == 0, out.stderr
    assert _job(cluster, job)["Requeue"] == "1"


def test_expedited_requeue_survives_the_bridge_where_slurm_has_it(cluster: LiveCluster, bridge: Path) -> None:
    """What nuro-train/nuro-sbatch add on 25.11+ (``requeue_args``): the bridge forces requeue on team jobs, and must
    leave the expedite flag standing. Older releases get no flag (their sbatch refuses ``--requeue=expedite``)."""
    extra = requeue_args(cluster.backend)
    job = _held(cluster, "bob", "--gpus-per-node=1", *extra)
    assert _job(cluster, job)["Requeue"] == "1"
    jobs = json.loads(cluster.run(["squeue", "--json", "-j", job]).stdout)["jobs"]  # 22.05 ignores -j
    flags = next(j for j in jobs if str(j["job_id"]) == job).get("flags", [])
    assert ("EXPEDITED_REQUEUE" in flags) == bool(extra), (TEST_SLURM, extra, flags)
    assert bool(extra) == (release_of(TEST_SLURM) >= EXPEDITED_REQUEUE_SINCE)


def test_a_small_gang_gets_the_one_leaf_hint_this_cluster_can_honour(cluster: LiveCluster, bridge: Path) -> None:
    """The table ``policy apply`` renders from this cluster (its leaves, plugin and version): topology/tree gets
    ``--switches=1@60``; topology/block gets the whole job as one segment where the Lua can set ``segment_size``
    (25.11.2+), and nothing before (24.11 ignores --switches on block, and has no segment_size in Lua)."""
    facts = read_cluster_facts(cluster.backend)
    with _table(bridge, POLICY, **facts):
        job = _held(cluster, "alice", "-N2", "--gpus-per-node=1")
    record = _job(cluster, job)
    want = decide(JobRequest(user="alice", nodes=2, max_nodes=2, gpus_per_node=1), policy_table(POLICY, **facts))
    block_hint = "segment" if release_of(TEST_SLURM) >= LUA_SEGMENT_SINCE else "none"
    assert facts["hint"] == ("switches" if TEST_TOPOLOGY == "tree" else block_hint), (TEST_SLURM, facts)
    assert (facts["leaf_size"], facts["gpus_per_node"]) == (4, 8), facts
    assert _switches(record) == ((1, 60) if want.switches else (None, None)), record
    assert _segment(record) == want.segment, record


def test_modify_cannot_choose_the_borrow_qos(cluster: LiveCluster, bridge: Path) -> None:
    """b-<team> is the controller's to choose (within the lending limits), on update as at submit."""
    job = _held(cluster, "alice", "-N2", "--gpus-per-node=1")
    out = _update(cluster, "alice", job, "qos=b-perception")
    _refused_on_modify(out, "Access/permission denied", out.stderr)
    assert _job(cluster, job)["QOS"] == "g-perception"
    assert re.search(rf"nuro: reject job_id={job} uid=\d+ user=alice rule=qos_borrow", _ctld_log(cluster))


def test_modify_of_a_borrowed_job_keeps_working(cluster: LiveCluster, bridge: Path) -> None:
    """Once root moved a job to b-<team>, its owner may still update it (the ack path) without choosing a QOS."""
    job = _held(cluster, "alice", "-N2", "--gpus-per-node=1", f"--comment={_record('perception')}")
    assert _update(cluster, None, job, "qos=b-perception").returncode == 0
    ack = jobcomment.merge(_record("perception"), ack={"at": 1700000001, "step": 1})
    out = _update(cluster, "alice", job, f"comment={ack}")
    assert out.returncode == 0, out.stderr
    assert _update(cluster, "alice", job, "qos=b-perception").returncode == 0  # repeating its QOS chooses nothing


def test_modify_cannot_write_the_preempt_mark(cluster: LiveCluster, bridge: Path) -> None:
    """Only the controller (root) writes preempt: a user may not add, change or drop it; ack beside it is fine."""
    job = _held(cluster, "alice", "--gpus-per-node=1", f"--comment={_record('perception')}")
    forged = jobcomment.merge(_record("perception"), preempt={"at": 1700000000, "for": 1, "why": "x"})
    out = _update(cluster, "alice", job, f"comment={forged}")
    _refused_on_modify(out, "Access/permission denied", out.stderr)
    assert re.search(rf"nuro: reject job_id={job} uid=\d+ user=alice rule=preempt_forged", _ctld_log(cluster))
    assert _update(cluster, None, job, f"comment={forged}").returncode == 0  # root (the controller) may
    acked = jobcomment.merge(forged, ack={"at": 1700000003, "step": 2})  # merge keeps preempt byte for byte
    assert _update(cluster, "alice", job, f"comment={acked}").returncode == 0
    for bad in (jobcomment.merge(acked, preempt=None), jobcomment.merge(acked, preempt={"at": 1, "why": "y"})):
        out = _update(cluster, "alice", job, f"comment={bad}")
        assert out.returncode != 0, (bad, out.stderr)
    assert _job(cluster, job)["Comment"] == acked


MODIFY = json.loads((REPO / "tests/vectors/modify.json").read_text())["vectors"]


@pytest.mark.parametrize("vector", MODIFY, ids=[v["id"] for v in MODIFY])
def test_modify_vector_through_real_scontrol(cluster: LiveCluster, bridge: Path, vector: dict) -> None:
    """The shared modify vectors: a held job of the user, root's update first (the controller's part), then the
    user's own ``scontrol update``; accepted or refused with the rule in slurmctld's log."""
    job = _held(cluster, vector["user"], *vector["submit"])
    try:
        if "root_update" in vector:
            out = _update(cluster, None, job, *(f"{k}={v}" for k, v in vector["root_update"].items()))
            assert out.returncode == 0, out.stderr
        out = _update(cluster, vector["user"], job, *(f"{k}={v}" for k, v in vector["update"].items()))
        if vector["expect"]["verdict"] == "accept":
            assert out.returncode == 0, out.stderr
            if "comment" in vector["update"]:
                assert _job(cluster, job)["Comment"] == vector["update"]["comment"]
            return
        assert out.returncode != 0 and "Access/permission denied" in out.stderr, out.stderr
        rule = vector["expect"]["rule"]
        assert re.search(rf"nuro: reject job_id={job} uid=\d+ user={vector['user']} rule={rule} ", _ctld_log(cluster))
        assert _job(cluster, job)["QOS"] == vector["job"]["qos"]
    finally:
        cluster.run(["scancel", job], check=False)


def test_root_may_move_a_job_to_the_borrow_qos(cluster: LiveCluster, bridge: Path) -> None:
    """The controller (root) moves pending jobs to b-<team>; and root is never judged by the bridge."""
    job = _held(cluster, "alice", "-N2", "--gpus-per-node=8")
    out = _update(cluster, None, job, "qos=b-perception")
    assert out.returncode == 0, out.stderr
    assert _job(cluster, job)["QOS"] == "b-perception"


_DIGEST, _COMMIT = "sha256:" + "3f" * 32, "0123456789abcdef0123456789abcdef01234567"


def _record(team: str) -> str:
    meta = {"v": 1, "name": "r", "team": team, "dataset": {"name": "ds", "digest": _DIGEST},
            "code": {"repo": "/srv/repo", "commit": _COMMIT}, "requeue": {"max": 3}}  # fmt: skip
    return jobcomment.merge(None, nuro=meta)


def test_modify_may_update_channel_keys_but_not_the_record(cluster: LiveCluster, bridge: Path) -> None:
    """The job (as its user) writes ack/ckpt beside the record; changing or dropping the record is refused."""
    original = _record("perception")
    job = _held(cluster, "alice", "--gpus-per-node=1", f"--comment={original}")
    with_ack = jobcomment.merge(original, ack={"at": 1700000002, "step": 3})
    assert _update(cluster, "alice", job, f"comment={with_ack}").returncode == 0
    assert _job(cluster, job)["Comment"] == with_ack
    meta = json.loads(original)["nuro"]
    for bad in (
        jobcomment.merge(with_ack, nuro={**meta, "dataset": {"name": "ds", "digest": "latest"}}),
        jobcomment.merge(with_ack, nuro={**meta, "requeue": {"max": 99}}),
        jobcomment.merge(with_ack, nuro=None),
        "",
    ):
        out = _update(cluster, "alice", job, f"comment={bad}")
        _refused_on_modify(out, "Access/permission denied", (bad, out.stderr))
    assert _job(cluster, job)["Comment"] == with_ack
    assert re.search(rf"nuro: reject job_id={job} uid=\d+ user=alice rule=pin_changed", _ctld_log(cluster))


def test_modify_cannot_turn_an_unpinned_cpu_job_into_a_gpu_job(cluster: LiveCluster, bridge: Path) -> None:
    with _table(bridge, _with({"require_pinning": True})):
        job = _held(cluster, "alice", "-n1")
        out = _update(cluster, "alice", job, "TresPerNode=gres:gpu:1")
        _refused_on_modify(out, "Access/permission denied", out.stderr)
        assert re.search(rf"nuro: reject job_id={job} uid=\d+ user=alice rule=pin_required", _ctld_log(cluster))
        assert _update(cluster, "alice", job, "comment=notes").returncode == 0  # no GPUs: comments are free


def test_python_preview_agrees_on_a_modified_policy(cluster: LiveCluster, bridge: Path) -> None:
    """Principle 5 with a table that is not the example: shrink perception's cap, both sides follow the table."""
    small = POLICY.model_copy(
        update={"teams": tuple(t.model_copy(update={"borrow_limit_gpus": 0}) for t in POLICY.teams)}
    )
    preview = decide(JobRequest(user="alice", nodes=4, max_nodes=4, gpus_per_node=8), small)
    assert not preview.accepted
    install_script(bridge, TABLE_FILE, render_lua_table(small))
    try:
        out = _sbatch(cluster, "alice", ["-N4", "--gpus-per-node=8"])
        assert out.returncode != 0
        assert f"sbatch: error: {preview.message}\n" in out.stderr, out.stderr
    finally:
        install_script(bridge, TABLE_FILE, render_lua_table(POLICY))


def test_without_a_table_jobs_pass_unchanged(cluster: LiveCluster, bridge: Path) -> None:
    """Fail operational: no table -> no nuro rule, an error in slurmctld's log, Slurm's own limits still apply."""
    table = bridge / TABLE_FILE
    saved = table.read_text()
    table.unlink()
    try:
        out = _sbatch(cluster, "alice", ["-N6", "--gpus-per-node=8", "--no-requeue"], name="nuro-open")
        assert out.returncode == 0, out.stderr
        record = _job(cluster, out.stdout.strip().split(";")[0])
        assert (record["QOS"], record["Requeue"], "Switches" in record) == ("g-perception", "0", False)
        assert "no usable policy table" in _ctld_log(cluster)
    finally:
        install_script(bridge, TABLE_FILE, saved)


def test_bridge_on_the_cluster_is_this_checkout(cluster: LiveCluster, bridge: Path) -> None:
    assert (bridge / "job_submit.lua").read_text() == (REPO / "slurm_plugins/job_submit.lua").read_text()
    assert shutil.which("sbatch")

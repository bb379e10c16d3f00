"""Submit on the real cluster: pinned code and data reach the job, the preview agrees with the bridge, hostile
values never run.

Set-up: ``nuro-admin policy apply examples/policy/teams.yaml`` (accounts, QOS, associations and the bridge's table),
then a git repository owned by alice (git refuses repositories of other users) in a directory every job user can
reach. Jobs run as alice through the real entry points (``nuro-sbatch``, the ``submit`` command), not the library.
The rendered launch line starts the script on each node through ``nuro-launch --launcher=direct`` (no torch is
needed: the script prints the rank, world and rendezvous address the launcher gave it), exercised as it is.
Teardown removes every nuro-managed Slurm object again (other modules expect none).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from nuro.policy.luatable import TABLE_FILE, render_lua_table
from nuro.policy.model import Policy, load_policy, parse_policy, policy_to_yaml_dict
from nuro.policy.plan import build_plan
from nuro.policy.sacctmgr import apply_plan, write_atomic
from nuro.policy.slurm_state import read_state
from nuro.protocol import jobcomment
from nuro.protocol.contract import ENV_RDZV_PORT_BASE, ENV_RDZV_PORT_SPAN, RDZV_PORT_BASE, RDZV_PORT_SPAN, rdzv_port
from nuro.slurm import JobPhase
from tests.integration.conftest import POLICY_USERS, LiveCluster, cancel_jobs_of, wait_until

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
POLICY = REPO / "examples" / "policy" / "teams.yaml"
VECTORS = json.loads((REPO / "tests" / "vectors" / "admission.json").read_text())
GIT_ID = {"GIT_AUTHOR_NAME": "alice", "GIT_AUTHOR_EMAIL": "a@x", "GIT_COMMITTER_NAME": "alice",
          "GIT_COMMITTER_EMAIL": "a@x"}  # fmt: skip

TRAIN = """import os, sys
restart = os.environ.get("SLURM_RESTART_COUNT", "0")
print(f"train rank={os.environ['RANK']} version={open('VERSION').read().strip()} restart={restart} "
      f"dataset={os.environ['NURO_DATASET_DIGEST']} ckpt={os.environ['NURO_CKPT_INTERVAL_S']} "
      f"world={os.environ['WORLD_SIZE']} master={os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} "
      f"node={os.environ['SLURM_NODEID']} cwd={os.getcwd()}", flush=True)
if "--requeue-once" in sys.argv and restart == "0":
    sys.exit(int(os.environ["NURO_EXIT_REQUEUE"]))
"""
JOB_SH = """#!/bin/bash
echo "job version=$(cat VERSION) commit=$NURO_CODE_COMMIT pwd=$PWD dataset=$NURO_DATASET_DIGEST"
"""


def as_user(cluster: LiveCluster, user: str, argv: list[str], cwd: Path | None = None, **env: str):
    full = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in {**cluster.env, **env}.items()), *argv]
    return subprocess.run(full, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def teams(cluster: LiveCluster) -> Iterator[None]:
    out = subprocess.run([str(VENV_BIN / "nuro-admin"), "policy", "apply", str(POLICY)],
                         env={**os.environ, **cluster.env}, capture_output=True, text=True, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    yield
    cancel_jobs_of(cluster, POLICY_USERS)
    empty = parse_policy({"cluster_gpus": 64, "teams": {}})
    assert apply_plan(build_plan(empty, read_state(cluster.backend), prune=True), cluster.backend).ok
    (Path(cluster.env["SLURM_CONF"]).parent / "nuro_policy.lua").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("submit")
    d.chmod(0o777)
    for parent in d.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    return d


@pytest.fixture(scope="module")
def digest(cluster: LiveCluster, shared: Path) -> str:
    """A real snapshot ``imagenet@<digest>`` in the cluster's S3 (submit checks that the digest exists)."""
    if not cluster.env.get("NURO_S3_ENDPOINT"):
        return "sha256:" + "5e" * 32  # no store: a digest reference is accepted as given
    from nuro.datasets.snapshot import snapshot
    from nuro.objectstore import ObjectStore

    data = shared / "imagenet"
    data.mkdir()
    (data / "part-0.bin").write_bytes(b"\x01" * 1000)
    return snapshot(ObjectStore.from_env(cluster.env), data, "imagenet", tag="v1", force_tag=True).digest


def alice_git(cluster: LiveCluster, repo: Path, *args: str) -> str:
    out = as_user(cluster, "alice", ["git", "-C", str(repo), *args], **GIT_ID)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture(scope="module")
def repo(cluster: LiveCluster, shared: Path) -> Path:
    """alice's repository: VERSION=A at HEAD, a training script and a batch script."""
    r = shared / "vision"
    for rel, text in (("train.py", TRAIN), ("VERSION", "A\n"), ("job.sh", JOB_SH)):
        (r / rel).parent.mkdir(parents=True, exist_ok=True)
        (r / rel).write_text(text)
    subprocess.run(["chown", "-R", "alice", str(r)], check=True)
    alice_git(cluster, r, "init", "-q")
    alice_git(cluster, r, "add", ".")
    alice_git(cluster, r, "commit", "-qm", "A")
    return r


def advance(cluster: LiveCluster, repo: Path, version: str) -> str:
    """Commit a new VERSION (what a user does after submitting); returns the new HEAD."""
    (repo / "VERSION").write_text(version + "\n")
    alice_git(cluster, repo, "commit", "-qam", version)
    return alice_git(cluster, repo, "rev-parse", "HEAD")


def log_text(path: Path, marker: str, timeout_s: float = 20) -> str:
    """The job's output once ``marker`` is in it (the file may trail the job's COMPLETED state a little)."""
    wait_until(lambda: path.exists() and marker in path.read_text(errors="replace"), timeout_s, f"{marker} in {path}")
    return path.read_text(errors="replace")


def finished(cluster: LiveCluster, job_id: int, timeout_s: float = 120):
    return cluster.backend.wait_for_job(job_id, timeout_s=timeout_s)


def test_flag_submitted_job_runs_exactly_the_pinned_commit(cluster, teams, repo, shared, digest) -> None:
    pinned = alice_git(cluster, repo, "rev-parse", "HEAD")
    out = as_user(cluster, "alice", [
        str(VENV_BIN / "nuro-sbatch"), "--team", "perception", f"--dataset=imagenet@{digest}", "--code", ".",
        "--ckpt-interval", "600", "--run-root", str(shared / "runs"), "--hold", "--parsable", "-N2",
        "--gpus-per-node=1", "-t", "5", "-o", str(shared / "flag-%j.out"), "job.sh",
    ], cwd=repo)  # fmt: skip
    assert out.returncode == 0, out.stderr
    job_id = int(out.stdout.strip().split(";")[0])
    moved = advance(cluster, repo, "B")  # HEAD moves while the job waits: the job must still run A
    assert moved != pinned
    record = cluster.backend.job_record(job_id)
    assert (record["Account"], record["QOS"], record["Requeue"]) == ("perception", "g-perception", "1")
    meta = jobcomment.parse(cluster.backend.job_comment(job_id)).raw["nuro"]
    assert meta["code"] == {"repo": str(repo), "commit": pinned} and meta["dataset"]["digest"] == digest
    assert meta["ckpt_policy"]["interval_s"] == 600 and meta["team"] == "perception"
    as_user(cluster, "alice", ["scontrol", "release", str(job_id)])
    job = finished(cluster, job_id)
    text = log_text(shared / f"flag-{job_id}.out", "job version=")
    assert record["JobName"] == "job.sh"  # the user's script name, as plain sbatch would name it
    assert job.phase == JobPhase.COMPLETED, text
    assert f"nuro: checked out commit {pinned} (id verified from the archive)" in text
    code_dir = shared / "runs" / "sbatch" / str(job_id) / "code"
    assert f"job version=A commit={pinned} pwd={code_dir} dataset={digest}" in text


def spec_file(shared: Path, repo: Path, stem: str, digest: str, **extra: object) -> Path:
    spec = {"name": stem, "team": "perception", "nodes": 2, "gpus_per_node": 1, "time_limit": 5,
            "dataset": f"imagenet@{digest}", "code": {"repo": str(repo)},
            "entrypoint": {"script": "train.py", "python": sys.executable}, "checkpoint": {"interval_s": 300},
            "run_root": str(shared / "runs"), **extra}  # fmt: skip
    path = shared / f"{stem}.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    path.chmod(0o644)
    return path


def submit_cmd(cluster: LiveCluster, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    code = "from nuro.login.submit_cli import submit; submit()"
    return as_user(cluster, "alice", [sys.executable, "-c", code, *args], cwd=cwd)


def test_submit_renders_a_two_node_job_on_the_pinned_commit(cluster, teams, repo, shared, digest) -> None:
    pinned = alice_git(cluster, repo, "rev-parse", "HEAD")
    path = spec_file(shared, repo, "ddp", digest)
    dry = submit_cmd(cluster, str(path), "--dry-run", "--policy", str(POLICY))
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --switches=1@0:01:00" in dry.stdout and "accept: team perception, 2 GPU(s)" in dry.stdout
    out = submit_cmd(cluster, str(path), "--json", "--hold")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    job_id = result["job_id"]
    assert json.loads(result["comment"])["nuro"]["code"]["commit"] == pinned
    advance(cluster, repo, "C")
    as_user(cluster, "alice", ["scontrol", "release", str(job_id)])
    job = finished(cluster, job_id)
    log = log_text(shared / "runs" / "ddp" / f"slurm-{job_id}.out", "nuro: run finished")
    assert job.phase == JobPhase.COMPLETED, log
    # the cluster's own rendezvous range (devcluster exports it: its nodes all share 127.0.0.1), else the default
    port = rdzv_port(
        job_id,
        int(cluster.env.get(ENV_RDZV_PORT_BASE, RDZV_PORT_BASE)),
        int(cluster.env.get(ENV_RDZV_PORT_SPAN, RDZV_PORT_SPAN)),
    )
    assert port != rdzv_port(job_id) or ENV_RDZV_PORT_BASE not in cluster.env
    code_dir = shared / "runs" / "ddp" / str(job_id) / "code"
    for node in ("0", "1"):
        assert (f"train rank={node} version=B restart=0 dataset={digest} ckpt=300 world=2 master=127.0.0.1:{port} "
                f"node={node} cwd={code_dir}") in log  # fmt: skip
    assert "nuro: run finished" in log


def test_the_job_requeues_itself_within_its_budget(cluster, teams, repo, shared, digest) -> None:
    path = spec_file(
        shared,
        repo,
        "requeue",
        digest,
        nodes=1,
        max_requeues=1,
        entrypoint={"script": "train.py", "python": sys.executable, "args": ["--requeue-once"]},
    )
    out = submit_cmd(cluster, str(path), "--json")
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["job_id"]
    job = finished(cluster, job_id, 180)  # attempt 1, requeue (cred_expire + 1 s), attempt 2
    log = log_text(shared / "runs" / "requeue" / f"slurm-{job_id}.out", "nuro: run finished")
    assert job.phase == JobPhase.COMPLETED and job.restart_count == 1, log
    assert "nuro: requeue 1 of 1 (exit 75)" in log and "reusing the checkout" in log  # append mode kept attempt 1
    assert "restart=0" in log and "restart=1" in log


def _variant(shared: Path, update: dict) -> Path:
    """The example teams.yaml with a vector's ``policy_update`` applied, written for ``--policy``."""
    policy = load_policy(POLICY)
    path = shared / ("teams-" + "-".join(f"{k}={v}" for k, v in sorted(update.items())) + ".yaml")
    path.write_text(yaml.safe_dump(policy_to_yaml_dict(Policy.model_validate({**policy.model_dump(), **update}))))
    path.chmod(0o644)
    return path


def test_dry_run_agrees_with_the_bridge_on_the_shared_vectors(cluster, teams, shared) -> None:
    """Each vector through nuro-sbatch twice as its user: --dry-run (Python preview) and for real (job_submit.lua).

    A vector with ``policy_update`` runs with that policy on both sides: its table installed beside slurm.conf (the
    bridge reads it on every submission) and its teams.yaml given to the preview. Vectors are grouped by policy (the
    table is installed once per group) and a group's vectors run two at a time: a verdict depends only on the
    request and the table (accepted jobs are held, then cancelled), so the order of submissions cannot change one.
    """
    script = shared / "true.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    script.chmod(0o755)
    table = Path(cluster.env["SLURM_CONF"]).parent / TABLE_FILE
    nuro_sbatch = str(VENV_BIN / "nuro-sbatch")
    base = ["--hold", "--parsable", "-o", "/dev/null", "-J", "nuro-vec-submit"]
    groups: dict[str, list[dict]] = {}
    for vec in VECTORS["vectors"]:
        if vec["user"] != "root":  # both sides let root through unjudged; nothing to compare
            groups.setdefault(json.dumps(vec.get("policy_update"), sort_keys=True), []).append(vec)

    def both(vec: dict, policy: Path) -> tuple[dict, subprocess.CompletedProcess, subprocess.CompletedProcess]:
        user, args = vec["user"], list(vec["args"])
        dry = as_user(cluster, user, [nuro_sbatch, "--dry-run", "--policy", str(policy), *base, *args, str(script)])
        real = as_user(cluster, user, [nuro_sbatch, *base, *args, str(script)])
        return vec, dry, real

    checked = 0
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            for key, vecs in groups.items():
                update = json.loads(key)
                policy = _variant(shared, update) if update is not None else POLICY
                write_atomic(table, render_lua_table(load_policy(policy)))
                for vec, dry, real in pool.map(lambda v, p=policy: both(v, p), vecs):
                    assert "warning: the bridge's table" not in dry.stdout, dry.stdout
                    if vec["expect"]["verdict"] == "accept":
                        assert dry.returncode == 0 and "accept:" in dry.stdout, (vec["id"], dry.stdout, dry.stderr)
                        assert real.returncode == 0, (vec["id"], real.stderr)
                        cluster.run(["scancel", real.stdout.strip().split(";")[0]], check=False)
                    else:
                        message = vec["expect"]["message"]
                        assert dry.returncode == 1 and message in dry.stdout, (vec["id"], dry.stdout)
                        assert real.returncode != 0 and f"sbatch: error: {message}" in real.stderr, (
                            vec["id"],
                            real.stderr,
                        )
                    checked += 1
    finally:
        write_atomic(table, render_lua_table(load_policy(POLICY)))
    assert checked >= len(VECTORS["vectors"]) - 5


def test_with_pinning_required_nuro_records_pass_and_plain_gpu_jobs_are_refused(
    cluster, teams, repo, shared, digest
) -> None:
    table = Path(cluster.env["SLURM_CONF"]).parent / TABLE_FILE
    write_atomic(table, render_lua_table(load_policy(_variant(shared, {"require_pinning": True}))))
    try:
        plain = as_user(cluster, "alice", [str(VENV_BIN / "nuro-sbatch"), "--hold", "--gpus-per-node=1", "job.sh"],
                        cwd=repo)  # fmt: skip
        assert plain.returncode != 0 and "--team perception --dataset NAME@sha256:<digest> --code" in plain.stderr
        flagged = as_user(cluster, "alice", [
            str(VENV_BIN / "nuro-sbatch"), "--team=perception", f"--dataset=imagenet@{digest}", "--code=.",
            f"--run-root={shared / 'runs'}", "--hold", "--parsable", "--gpus-per-node=1", "job.sh",
        ], cwd=repo)  # fmt: skip
        assert flagged.returncode == 0, flagged.stderr
        rendered = submit_cmd(cluster, str(spec_file(shared, repo, "pinned", digest)), "--json", "--hold")
        assert rendered.returncode == 0, rendered.stderr
        for job in (flagged.stdout.strip().split(";")[0], str(json.loads(rendered.stdout)["job_id"])):
            cluster.run(["scancel", job], check=False)
    finally:
        write_atomic(table, render_lua_table(load_policy(POLICY)))


def test_a_tag_resolves_to_its_digest_and_an_unknown_tag_is_refused(cluster, teams, repo, shared, digest) -> None:
    if not cluster.env.get("NURO_S3_ENDPOINT"):
        pytest.fail("the dev cluster exports no S3 store (NURO_S3_ENDPOINT): devcluster up should start SeaweedFS")
    path = spec_file(shared, repo, "tagged", digest, dataset="imagenet@v1")
    out = submit_cmd(cluster, str(path), "--dry-run", "--json", "--policy", str(POLICY))
    assert out.returncode == 0, out.stderr
    record = json.loads(json.loads(out.stdout)["comment"])["nuro"]
    assert record["dataset"] == {"name": "imagenet", "digest": digest}
    assert "imagenet@v1" not in out.stdout  # only the digest travels
    missing = submit_cmd(cluster, str(spec_file(shared, repo, "untagged", digest, dataset="imagenet@v9")), "--dry-run")
    assert missing.returncode == 3 and "has no tag 'v9'" in missing.stderr


def test_hostile_values_never_execute(cluster, teams, repo, shared, digest) -> None:
    marker = shared / "pwned"
    pwned_before = Path("/tmp/pwned").exists()
    jobs_before = {j.job_id for j in cluster.backend.jobs() if j.user == "alice"}
    attempts = [
        ["--dataset", f"x;touch {marker}"], ["--dataset", "x;touch /tmp/pwned"], ["--team", f"$(touch {marker})"],
        ["--code", f"{repo}`touch {marker}`"], ["--run-root", f"{shared}/r\ntouch {marker}"],
        ["--tier", "urgent;touch /tmp/pwned"], ["--resume-from", f"1 && touch {marker}"],
    ]  # fmt: skip
    for flags in attempts:
        out = as_user(cluster, "alice", [str(VENV_BIN / "nuro-sbatch"), "--team=perception", *flags, "--hold",
                                         "job.sh"] if flags[0] != "--team" else
                      [str(VENV_BIN / "nuro-sbatch"), *flags, "--hold", "job.sh"], cwd=repo)  # fmt: skip
        assert out.returncode == 3 and flags[0] in out.stderr, (flags, out.stderr)
    for field, value in (("name", f"x;touch {marker}"), ("entrypoint", {"script": f"$(touch {marker}).py"}),
                         ("env", {"A": f"`touch {marker}`"}), ("run_root", "../../tmp")):  # fmt: skip
        out = submit_cmd(cluster, str(spec_file(shared, repo, "hostile", digest, **{field: value})))
        assert out.returncode == 3 and field in out.stderr, (field, out.stderr)
    assert not marker.exists()
    assert Path("/tmp/pwned").exists() == pwned_before
    # no job was submitted (jobs of earlier tests may have ended and left the list meanwhile)
    assert not {j.job_id for j in cluster.backend.jobs() if j.user == "alice"} - jobs_before


def test_resume_starts_a_new_run_on_the_same_pins(cluster, teams, repo, shared, digest) -> None:
    path = spec_file(shared, repo, "resumable", digest)
    out = submit_cmd(cluster, str(path), "--json", "--hold")
    assert out.returncode == 0, out.stderr
    parent = json.loads(out.stdout)["job_id"]
    parent_meta = json.loads(json.loads(out.stdout)["comment"])["nuro"]
    code = "from nuro.login.resume_cli import resume; resume()"
    res = as_user(cluster, "alice", [sys.executable, "-c", code, str(parent), "--json", "--hold", "--time", "2:00:00",
                                     "--python", sys.executable, "--run-root", str(shared / "runs")])  # fmt: skip
    assert res.returncode == 0, res.stderr
    child = json.loads(res.stdout)
    meta = json.loads(child["comment"])["nuro"]
    assert meta["resume_from"] == str(parent)
    assert meta["dataset"] == parent_meta["dataset"] and meta["code"]["commit"] == parent_meta["code"]["commit"]
    assert meta["team"] == "perception" and meta["entry"] == parent_meta["entry"]
    limit = cluster.run(["squeue", "-h", "-j", str(child["job_id"]), "-o", "%l"]).stdout.strip()
    assert limit == "2:00:00", limit  # --time, as submit and sbatch spell it (--time-limit still works)
    plain = as_user(cluster, "alice", ["sbatch", "--parsable", "--hold", "-o", "/dev/null", "--wrap", "true"])
    refused = as_user(cluster, "alice", [sys.executable, "-c", code, plain.stdout.strip()])
    assert refused.returncode == 3 and "no nuro run record" in refused.stderr
    for job in (parent, child["job_id"], plain.stdout.strip()):
        cluster.run(["scancel", str(job)], check=False)

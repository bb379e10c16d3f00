"""nuro-launch and PreemptionGuard on the real cluster: a 2-node gloo DDP job through the rendered batch script.

The job is ``render_submission`` of a spec whose script is ``tests/fixtures/train/tiny_ddp.py`` (committed to a git
repository owned by the job user, as submit would pin it), submitted with plain sbatch as a test user
(``--account``/``--qos`` on the command line override the rendered team directives: no team policy needed here).
Per node, one srun task runs ``nuro-launch``, which runs torchrun (c10d rendezvous on 127.0.0.1, gloo on ``lo``).

* a node's workers SIGKILLed (found by their environment: this job, this node, a torchrun worker) → the survivor's
  launcher says 75, the batch script requeues (restart count 1), the attempt is never COMPLETED;
* ``scancel --signal=USR1 --full`` → every rank stops at the same step, rank 0 acks in the job comment, 75, requeue;
* an exception in the user's script → the job FAILS with the script's status, no requeue.

Each job costs ~10 s of torch imports (2 workers + 2 agents on 2 shared cores), so the four jobs are submitted
together when the module starts and their start-ups overlap; each test's job is cancelled when the test ends (a
requeued job is not run again, except the killed one's second attempt, which the test waits for).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nuro.jobspec import build_spec
from nuro.jobspec.codepin import pin_code
from nuro.jobspec.pins import DatasetPin
from nuro.jobspec.render import ClusterFacts, Pins, render_submission
from nuro.protocol import adminnote, jobcomment
from nuro.protocol.contract import EXIT_REQUEUE
from nuro.slurm import JobPhase
from nuro.slurm_plugins.controller.apply import apply_decision
from nuro.slurm_plugins.controller.decisions import Preempt
from tests.integration.conftest import TEST_ACCOUNT, TEST_PORT_BASE, LiveCluster, controller_progress, wait_until

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "fixtures" / "train" / "tiny_ddp.py"
USER = "nuro-alice"
DIGEST = "sha256:" + "7e" * 32


def _agent_logs(cluster: LiveCluster) -> str:
    """Every node agent's log: what the agents heard from the jobs (progress reports)."""
    return "".join(p.read_text(errors="replace") for p in sorted(cluster.layout.log.glob("agent-*.log")))


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    """A directory every job user can reach, outside ``/tmp/pytest-of-root``: any pytest session that starts on this
    machine (other engineers run theirs concurrently) chmods that tree back to 0700 and cuts running jobs off."""
    d = Path(tempfile.mkdtemp(prefix="nuro-launch-it-", dir="/tmp"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def code(shared: Path) -> Pins:
    """The training script in a git repository the job user owns (pinned as root first: git refuses others' repos)."""
    return _repo(shared / "tiny")


@pytest.fixture(scope="module")
def long_code(shared: Path) -> Pins:
    """The same script in a repository whose path is 200 characters long (issue 30: a legitimate long record)."""
    repo = shared / "long"
    while len(str(repo)) < 200 - 51:  # components of at most 128 characters (nuro.jobspec.fields.AbsPath)
        repo = repo / ("r" * 50)
    return _repo(repo / ("r" * (200 - len(str(repo)) - 1)))


def _repo(repo: Path) -> Pins:
    repo.mkdir(parents=True)
    shutil.copy(TINY, repo / "tiny_ddp.py")
    ident = ["-c", "user.name=t", "-c", "user.email=t@x"]
    for argv in (["init", "-q"], ["add", "."], [*ident, "commit", "-qm", "tiny"]):
        subprocess.run(["git", "-C", str(repo), *argv], check=True, capture_output=True)
    pins = Pins(pin_code(str(repo)), DatasetPin("imagenet", DIGEST))
    subprocess.run(["chown", "-R", USER, str(repo)], check=True)
    return pins


def submit(
    cluster: LiveCluster, shared: Path, code: Pins, name: str, *args: str, max_requeues: int = 2, record: bool = False
) -> int:
    """Render and submit the tiny job; ``record``: with its run record as the job comment, as nuro-train submits it
    (team = the test account, as the bridge wants the record's team to be the job's account; no dataset pin, so the
    prolog has nothing to verify)."""
    spec = build_spec({
        "name": name, "team": TEST_ACCOUNT if record else "perception", "dataset": f"imagenet@{DIGEST}",
        "code.repo": code.code.repo,
        "entrypoint.script": "tiny_ddp.py", "entrypoint.args": ["--step-sleep", "0.3", *args],
        "entrypoint.python": sys.executable, "nodes": 2, "gpus_per_node": 0, "time_limit": 10,
        "max_requeues": max_requeues, "run_root": str(shared / "runs"),
        "env": {"GLOO_SOCKET_IFNAME": "lo"},  # dev cluster: every node is 127.0.0.1
    })  # fmt: skip
    # rendezvous ports from this cluster's port base, not 29500 + job id: every fresh test cluster starts at job 1,
    # and other sessions' clusters on this machine run torchrun jobs too
    pins = Pins(code.code, None) if record else code
    req = render_submission(spec, pins, ClusterFacts(rdzv_port_base=TEST_PORT_BASE + 500, rdzv_port_span=100))
    Path(req.output_dir).mkdir(parents=True, exist_ok=True)
    Path(req.output_dir).chmod(0o777)
    script = shared / f"{name}.sh"
    script.write_text(req.script)
    script.chmod(0o644)
    comment = [f"--comment={req.comment}"] if record else []
    out = cluster.run(["sbatch", "--parsable", f"--account={TEST_ACCOUNT}", "--qos=normal", *comment, str(script)],
                      user=USER)  # fmt: skip
    return int(out.stdout.strip().split(";")[0])


def log_of(shared: Path, name: str, job_id: int) -> Path:
    return shared / "runs" / name / f"slurm-{job_id}.out"


def text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def wait_steps(path: Path, step: int, timeout_s: float = 120) -> None:
    """Until both ranks logged ``step``."""
    wait_until(
        lambda: all(f"tiny rank={r} restart=0 step={step}\n" in text(path) for r in (0, 1)),
        timeout_s,
        f"both ranks at step {step} in {path}",
    )


def verdicts(shared: Path, name: str, job_id: int, attempt: int = 0) -> dict[int, dict]:
    d = shared / "runs" / name / str(job_id) / "launch" / f"attempt-{attempt}"
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in sorted(d.glob("node-*.json"))}


def restarted(cluster: LiveCluster, job_id: int):
    job = cluster.backend.find_job(job_id)
    return job if job is not None and job.restart_count >= 1 else None


#: The four jobs, by name: the extra arguments of each. All are submitted at once when the module starts (4 × 2 nodes
#: fill the 8-node cluster), so their start-ups (torch imports, rendezvous) overlap instead of adding up. The preempted
#: one is a legitimate run with a long record (issue 30): a 200-character repo path and many arguments.
JOBS = {"kill": (), "preempt": ("--check-every", "1") * 12, "bug": ("--raise-at", "3", "--raise-rank", "1"),
        "timelimit": ()}  # fmt: skip


@pytest.fixture(scope="module")
def started(cluster: LiveCluster, shared: Path, code: Pins, long_code: Pins) -> Iterator[dict[str, int]]:
    """Job id per name in ``JOBS``, submitted together; whatever is left is cancelled when the module ends."""
    ids = {name: submit(cluster, shared, long_code if name == "preempt" else code, name, *args,
                        record=name == "preempt") for name, args in JOBS.items()}  # fmt: skip
    yield ids
    _cancel(cluster, list(ids.values()))


@pytest.fixture
def jobs(cluster: LiveCluster) -> Iterator[list[int]]:
    """The test's jobs, cancelled when it ends (so their nodes are free for the next attempt of another job)."""
    ids: list[int] = []
    yield ids
    _cancel(cluster, ids)


def _cancel(cluster: LiveCluster, ids: list[int]) -> None:
    for job_id in ids:
        cluster.run(["scancel", str(job_id)], check=False)
    wait_until(lambda: all(_ended(cluster, j) for j in ids), 60, f"jobs {ids} to end")


def _ended(cluster: LiveCluster, job_id: int) -> bool:
    job = cluster.backend.find_job(job_id)
    return job is None or job.phase.is_terminal


def workers_of(cluster: LiveCluster, job_id: int, node: str) -> list[psutil.Process]:
    """The torchrun workers of ``job_id`` on ``node`` of this cluster: processes whose environment names this job,
    this node, this cluster's slurm.conf (sbatch exports it) and a torchrun worker rank. Never by name across the
    machine: other clusters run here too, with the same node names and job ids (every test cluster starts at 1)."""
    found = []
    conf = cluster.env["SLURM_CONF"]
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        mine = env.get("SLURM_JOB_ID") == str(job_id) and env.get("SLURMD_NODENAME") == node
        if mine and env.get("SLURM_CONF") == conf and "LOCAL_RANK" in env:
            found.append(proc)
    return found


def test_a_killed_node_requeues_the_gang_and_the_survivor_exits_75(cluster, shared, started, jobs) -> None:
    job_id = started["kill"]
    jobs.append(job_id)
    log = log_of(shared, "kill", job_id)
    wait_steps(log, 3)
    job = cluster.backend.find_job(job_id)
    assert job is not None and len(job.nodes) == 2, job
    victim_node = job.nodes[1]
    victims = workers_of(cluster, job_id, victim_node)
    assert len(victims) == 1, victims  # one worker per node (--nproc-per-node=1)
    killed_at = time.time()
    for proc in victims:
        proc.send_signal(signal.SIGKILL)
    requeued = wait_until(lambda: restarted(cluster, job_id), 90, f"job {job_id} to be requeued")
    requeue_s = time.time() - killed_at
    assert requeued.phase != JobPhase.COMPLETED
    got = verdicts(shared, "kill", job_id)
    assert {v["exit_code"] for v in got.values()} == {EXIT_REQUEUE}, got
    assert any("killed by SIGKILL" in v["why"] for v in got.values()), got
    survivor = [v for v in got.values() if "SIGKILL" not in v["why"]]
    body = text(log)
    assert "nuro: requeue 1 of 2 (exit 75)" in body, body[-3000:]
    assert "not requeued" not in body
    lag = {n: round(v["at"] - killed_at, 1) for n, v in got.items()}
    print(f"\nkill→launcher verdicts (s): {lag}; kill→requeued seen: {requeue_s:.1f} s; survivor: {survivor}")
    wait_until(lambda: "restart=1 started" in text(log), 120, "the second attempt to start")  # SLURM_RESTART_COUNT=1
    print(f"kill→second attempt's first line: {time.time() - killed_at:.1f} s")


def test_usr1_stops_every_rank_at_the_same_step_acks_and_requeues(cluster, shared, started, jobs) -> None:
    """The controller's own preemption (``apply_decision``: the owner's note, then USR1 to every step) of a run
    whose record is long (a 200-character repo path, 24 arguments): it stops, acks through its node agent, is
    requeued and starts again; its comment stays the record it was submitted with."""
    job_id = started["preempt"]
    jobs.append(job_id)
    comment = cluster.backend.job_comment(job_id)
    record = jobcomment.parse(comment).record
    assert len(record["code"]["repo"]) == 200 and len(record["entry"]["args"]) == 26 and len(comment) > 700, comment
    log = log_of(shared, "preempt", job_id)
    wait_steps(log, 3)
    signalled_at = time.time()
    decision = Preempt(job_id=job_id, team="perception", gpus=0, work_lost_gpu_s=0.0, for_job_id=4242,
                       reason="a guaranteed job needs the nodes (test)")  # fmt: skip
    outcome = apply_decision(cluster.backend, decision, int(signalled_at))
    assert outcome.applied and "note not written" not in outcome.message, outcome.message
    assert adminnote.parse(cluster.backend.job_admin_comment(job_id))["preempt"]["for"] == 4242
    requeued = wait_until(lambda: restarted(cluster, job_id), 90, f"job {job_id} to be requeued")
    assert requeued.phase != JobPhase.COMPLETED
    body = text(log)
    stops = {line.split("stopping ")[1].strip() for line in body.splitlines() if "restart=0 stopping step=" in line}
    assert len(stops) == 1 and "reason=preempted" in next(iter(stops)), body[-3000:]  # one step, both ranks
    step = int(next(iter(stops)).split()[0].removeprefix("step="))
    assert sum("restart=0 stopping step=" in line for line in body.splitlines()) == 2
    assert f"tiny rank=0 restart=0 saved step={step}" in body and f"tiny rank=1 restart=0 saved step={step}" in body
    heard = wait_until(lambda: controller_progress(cluster, job_id), 10, "the ack at the controller")
    assert heard.ack_step == step and heard.ack_at is not None, heard  # through the node agent (issue 30)
    assert f"job={job_id} acknowledged its stop at step {step} (preempted)" in _agent_logs(cluster)
    got = verdicts(shared, "preempt", job_id)
    assert len(got) == 2 and {v["exit_code"] for v in got.values()} == {EXIT_REQUEUE}, got
    assert "nuro: requeue 1 of 2 (preempted)" in body
    whys = [v["why"] for v in got.values()]
    print(f"\nUSR1→ack {heard.ack_at - signalled_at:.1f} s (stop step {step}); verdicts {whys}")
    wait_until(lambda: all(f"tiny rank={r} restart=1 started" in text(log) for r in (0, 1)), 120,
               "the requeued run to start again")  # fmt: skip
    assert cluster.backend.job_comment(job_id) == comment  # nuro never wrote into it


def test_an_exception_in_the_script_fails_the_job_with_its_status(cluster, shared, started, jobs) -> None:
    job_id = started["bug"]
    jobs.append(job_id)
    done = cluster.backend.wait_for_job(job_id, timeout_s=180)
    body = text(log_of(shared, "bug", job_id))
    assert done.phase == JobPhase.FAILED and done.exit_code == 1 and done.restart_count == 0, (done, body[-3000:])
    assert "ValueError: tiny_ddp: deliberate bug at step 3 on rank 1" in body
    assert "a failure, not a stop; not requeued" in body
    kinds = sorted(v["kind"] for v in verdicts(shared, "bug", job_id).values())
    assert kinds.count("failure") == 1 and set(kinds) <= {"failure", "stopped", "requeue"}, kinds  # peer: TERMed


def test_the_time_limit_signal_to_the_batch_shell_reaches_every_rank(cluster, shared, started, jobs) -> None:
    """``--signal=B:USR2@N`` as Slurm sends it (to the batch shell only): shell trap → step wrapper → srun → nuro-launch
    → workers; every rank stops at one step and the ack says why."""
    job_id = started["timelimit"]
    jobs.append(job_id)
    log = log_of(shared, "timelimit", job_id)
    wait_steps(log, 3)
    cluster.run(["scancel", "--signal=USR2", "--batch", str(job_id)], user=USER)
    wait_until(lambda: restarted(cluster, job_id), 90, f"job {job_id} to be requeued")
    body = text(log)
    stops = [line.split("stopping ")[1] for line in body.splitlines() if "restart=0 stopping step=" in line]
    assert len(stops) == 2 and len(set(stops)) == 1 and stops[0].endswith("reason=time_limit"), body[-3000:]
    wait_until(lambda: f"job={job_id} acknowledged its stop" in _agent_logs(cluster), 10, "the ack at the agent")
    assert f"job={job_id} acknowledged its stop at step" in _agent_logs(cluster)
    assert "(time_limit)" in _agent_logs(cluster).split(f"job={job_id} acknowledged its stop", 1)[1].splitlines()[0]
    assert "nuro: requeue 1 of 2 (time_limit)" in body

"""Attack: a team member's job fills the node's staging disk. That fails the job, never the node (issue 11, 7).

alice (perception) writes into her job's own staging dir until the disk is below its free-space floor. The health
check (slurmd's HealthCheckProgram, every HealthCheckInterval) attributes the missing space to her job, cancels it
with the reason in its comment and the event log, and leaves the node in service; priya's (prediction) job on the
same node keeps running and ends normally; the node agents report the node healthy all along (no drain).

So that the attack cannot fill the real disk (other clusters share it), the cluster's staging root is a small tmpfs
for this module: the floor (``NURO_STAGING_MIN_FREE_GB`` of the cluster's nuro.env) plus 256 MiB. Everything else
in the staging root is hidden for that time and back afterwards (the mount is removed pass or fail).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro.protocol import adminnote
from nuro.slurm import JobPhase
from tests.integration.conftest import LiveCluster, wait_until
from tests.integration.isolation.conftest import ATTACKER, VICTIM, Guard, as_user

pytestmark = pytest.mark.slurm

NODE = "gpu007"
MIB = 1 << 20
HEADROOM_MIB = 256  # free space above the floor on the small staging fs
FILL_MIB = 384  # what the attack writes: crosses the floor by 128 MiB, all of it in its own staging dir


def _floor_bytes(cluster: LiveCluster) -> int:
    env = dict(line.split("=", 1) for line in cluster.layout.nuro_env.read_text().splitlines() if "=" in line)
    return int(float(env.get("NURO_STAGING_MIN_FREE_GB", "20")) * (1 << 30))


def _staging(cluster: LiveCluster) -> Path:
    return Path(cluster.env["NURO_STAGING_ROOT"].replace("{node}", NODE))


@pytest.fixture(scope="module")
def small_staging(cluster: LiveCluster) -> Iterator[Path]:
    """The staging root as a tmpfs of floor + HEADROOM_MIB, root-owned 0755 like the real one; unmounted after."""
    root = _staging(cluster)
    root.mkdir(parents=True, exist_ok=True)
    size = _floor_bytes(cluster) + HEADROOM_MIB * MIB
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755,uid=0,gid=0", "nuro-test-staging", str(root)],
        check=True,
    )
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def _sbatch(cluster: LiveCluster, user: str, out: Path, script: str) -> int:
    res = as_user(
        cluster, user,
        ["sbatch", "--parsable", "--nodes=1", f"--nodelist={NODE}", "--ntasks=1", "--cpus-per-task=1",
         "--time=10", f"--output={out}", "--wrap", script],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _node_state(cluster: LiveCluster) -> tuple[set[str], str]:
    from nuro.slurm import parse_scontrol_show_oneliner

    row = parse_scontrol_show_oneliner(cluster.run(["scontrol", "show", "-o", "node", NODE]).stdout)[0]
    return set(row["State"].split("+")), row.get("Reason") or ""


def _wait_filled(cluster: LiveCluster, hog: int, out: Path, timeout_s: float, what: str) -> None:
    """Until the hog printed FILLED, or was already cancelled mid-write (a health check that runs while dd writes
    catches it before its echo)."""
    wait_until(lambda: (out.exists() and "FILLED" in out.read_text())
               or cluster.backend.job_state(hog) not in ("RUNNING", "PENDING"), timeout_s, what)  # fmt: skip


def _drained_for_disk(cluster: LiveCluster) -> list[str]:
    """Nodes drained (by the health check or the controller from an agent's beat) with a staging-disk reason."""
    out = cluster.run(["sinfo", "-h", "-R", "-o", "%N|%E"]).stdout
    return [line for line in out.splitlines() if "staging disk" in line]


def test_a_job_that_fills_the_staging_disk_is_cancelled_and_the_node_stays_up(
    cluster: LiveCluster, small_staging: Path, guard: Guard, shared: Path
) -> None:
    flag = shared / "bystander-may-finish"
    bystander = _sbatch(
        cluster, VICTIM, shared / "bystander.out",
        f'echo mine > "{small_staging}/$SLURM_JOB_ID/small"; '
        f'while [ ! -e "{flag}" ]; do sleep 0.5; done; cat "{small_staging}/$SLURM_JOB_ID/small"',
    )  # fmt: skip
    cluster.backend.wait_for_job(bystander, {JobPhase.RUNNING}, timeout_s=60)
    # The attack: fill the job's own staging dir (the only place its quota-less writes land) past the floor.
    hog = _sbatch(
        cluster, ATTACKER, shared / "hog.out",
        f'dd if=/dev/zero of="{small_staging}/$SLURM_JOB_ID/fill" bs=1M count={FILL_MIB} status=none; '
        "echo FILLED; sleep 600",
    )  # fmt: skip
    cluster.backend.wait_for_job(hog, {JobPhase.RUNNING}, timeout_s=60)
    _wait_filled(cluster, hog, shared / "hog.out", 60, "the hog job to fill its staging dir")
    # slurmd runs the health check every HealthCheckInterval (30 s); the next one attributes the space to the hog.
    job = cluster.backend.wait_for_job(hog, timeout_s=120)
    assert job.phase == JobPhase.CANCELLED, job

    refused = adminnote.parse(cluster.backend.job_admin_comment(hog)).get("refused") or {}  # root's note
    assert "staging disk" in refused.get("why", "") and f"/{hog} and what its user wrote" in refused["why"], refused
    events = [json.loads(line) for line in cluster.layout.events_log.read_text().splitlines() if line.strip()]
    (event,) = [e for e in events if e.get("kind") == "job_disk_full" and hog in e.get("jobs", [])][:1]
    assert event["bytes"] >= FILL_MIB * MIB and event["source"] == "nuro-health"

    # The node stays in service, nothing was drained for the disk, and the other team's job is untouched.
    flags, reason = _node_state(cluster)
    assert not flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN"}, (flags, reason)
    assert _drained_for_disk(cluster) == []
    by_id = {j.job_id: j for j in cluster.backend.jobs()}
    assert by_id[bystander].phase == JobPhase.RUNNING, by_id.get(bystander)
    flag.touch()
    done = cluster.backend.wait_for_job(bystander, timeout_s=60)
    assert done.phase == JobPhase.COMPLETED and (shared / "bystander.out").read_text().strip() == "mine", done
    # The epilog removed the hog's dir: the space is back above the floor.
    wait_until(lambda: not (small_staging / str(hog)).exists(), 30, "the hog's staging dir to be removed")
    # And the node still takes work.
    after = _sbatch(cluster, VICTIM, shared / "after.out", "echo ran")
    assert cluster.backend.wait_for_job(after, timeout_s=60).phase == JobPhase.COMPLETED


#: Ways to fill the disk where a walk of the job's own dir cannot see it (issue 30, item 4). Each leaves the bytes
#: hidden and prints FILLED; the health check must still fail that job, never drain the node.
_HIDDEN = {
    # 40 levels below the job dir: deeper than the walk enters (32 open dirs); the unseen space is the job's bound
    "deep_tree": 'd="{root}/$SLURM_JOB_ID"; for i in $(seq 40); do d="$d/d"; done; mkdir -p "$d"; '
    'dd if=/dev/zero of="$d/fill" bs=1M count={mib} status=none; echo FILLED; sleep 600',
    # written, kept open, unlinked: no walk sees it; /proc/<pid>/fd does, owned by the job's user
    "unlinked_open": 'f="{root}/$SLURM_JOB_ID/fill"; exec 3>"$f"; dd if=/dev/zero bs=1M count={mib} status=none >&3; '
    'rm -f "$f"; echo FILLED; sleep 600',
}


@pytest.mark.parametrize("how", sorted(_HIDDEN))
def test_space_a_job_hides_from_the_walk_still_fails_that_job(
    cluster: LiveCluster, small_staging: Path, guard: Guard, shared: Path, how: str
) -> None:
    out = shared / f"hidden-{how}.out"
    flag = shared / f"bystander-{how}-may-finish"
    bystander = _sbatch(
        cluster, VICTIM, shared / f"bystander-{how}.out",
        f'echo mine > "{small_staging}/$SLURM_JOB_ID/small"; while [ ! -e "{flag}" ]; do sleep 0.5; done; echo ok',
    )  # fmt: skip
    cluster.backend.wait_for_job(bystander, {JobPhase.RUNNING}, timeout_s=60)
    hog = _sbatch(cluster, ATTACKER, out, _HIDDEN[how].replace("{root}", str(small_staging)).replace(
        "{mib}", str(FILL_MIB)))  # fmt: skip
    _wait_filled(cluster, hog, out, 90, f"the hog job to fill the disk ({how})")
    job = cluster.backend.wait_for_job(hog, timeout_s=120)
    assert job.phase == JobPhase.CANCELLED, job
    events = [json.loads(line) for line in cluster.layout.events_log.read_text().splitlines() if line.strip()]
    said = [e for e in events if e.get("kind") == "job_disk_full" and hog in e.get("jobs", [])]
    assert said and said[0]["bytes"] >= FILL_MIB * MIB and "staging disk" in said[0]["reason"], said
    flags, reason = _node_state(cluster)
    assert not flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN"}, (flags, reason)
    assert _drained_for_disk(cluster) == []
    by_id = {j.job_id: j for j in cluster.backend.jobs()}
    assert by_id[bystander].phase == JobPhase.RUNNING, by_id.get(bystander)
    flag.touch()
    assert cluster.backend.wait_for_job(bystander, timeout_s=60).phase == JobPhase.COMPLETED
    wait_until(lambda: not (small_staging / str(hog)).exists(), 30, "the hog's staging dir to be removed")

"""Attacks on confinement: a team member's job reaching past what Slurm gave it, on the real (confined) cluster.

The dev cluster runs Slurm's cgroup/v1 plugins as production does (``proctrack/cgroup``, ``task/cgroup``,
cgroup.conf ``ConstrainDevices``/``ConstrainRAMSpace``/``ConstrainSwapSpace``), in its own cgroups
(``nuro.devcluster.cgroups``). Its stand-in GPUs are character devices 120:N listed in gres.conf: no driver answers
them, so a device the cgroup lets through fails to open with ENXIO, and one it denies with EPERM.

Each test is run as alice (team perception) and asserts the attack is refused or harmless, then the shared guard
checks the platform is intact (daemons alive, root-owned files unchanged).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import psutil
import pytest

from nuro.devcluster import cgroups
from tests.integration.conftest import LiveCluster, wait_until
from tests.integration.isolation.conftest import ATTACKER, ATTACKER_TEAM, VICTIM, Guard, as_user

pytestmark = pytest.mark.slurm

NODE = "gpu006"
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "PREEMPTED"}

# Run inside the job as alice: try every stand-in GPU, /dev/null, and the ways out of the job's cgroups.
PROBE = r"""
import errno, json, os, sys
dev, mnt, out = sys.argv[1], sys.argv[2], sys.argv[3]

def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def opener(path):
    return lambda: os.close(os.open(path, os.O_RDWR))

def writer(path, text):
    def write():
        with open(path, "w") as fh:
            fh.write(text)
    return write

own = {}
for line in open("/proc/self/cgroup"):
    _, ctrl, path = line.rstrip("\n").split(":", 2)
    own[ctrl] = path
prefix = own["devices"].split("/slurm_")[0]  # the cluster's own cgroup, seen from the hierarchy's root
my_devices = mnt + "/devices" + own["devices"][len(prefix):]
report = {
    "gpus": os.environ.get("SLURM_JOB_GPUS", ""),
    "open": {f"nvidia{i}": attempt(opener(f"{dev}/nvidia{i}")) for i in range(8)},
    "dev_null": attempt(opener("/dev/null")),
    # widen its own device list, or leave its cgroups for the cluster's or the host's root ones
    "allow_all": attempt(writer(my_devices + "/devices.allow", "a *:* rwm")),
    "escape_cluster_root": attempt(writer(mnt + "/devices/tasks", str(os.getpid()))),
    "escape_host_root": attempt(writer("/sys/fs/cgroup/devices/tasks", str(os.getpid()))),
    "escape_freezer": attempt(writer("/sys/fs/cgroup/freezer/tasks", str(os.getpid()))),
    "cgroups": own,
}
with open(out, "w") as fh:
    json.dump(report, fh)
"""


def _sbatch(cluster: LiveCluster, user: str, out: Path, script: str, *args: str) -> int:
    res = as_user(
        cluster, user,
        ["sbatch", "--parsable", "--nodes=1", f"--nodelist={NODE}", "--ntasks=1", "--time=10", f"--output={out}",
         *args, "--wrap", script],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip().split(";")[0])


def _state(cluster: LiveCluster, job: int) -> str:
    out = cluster.run(["sacct", "-X", "-n", "-P", "-j", str(job), "-o", "State"], check=False).stdout.split()
    return out[0].split()[0] if out else ""


def _wait_ended(cluster: LiveCluster, job: int, timeout_s: float = 90) -> str:
    wait_until(lambda: _state(cluster, job) in ENDED, timeout_s, f"job {job} to end")
    return _state(cluster, job)


def _why(cluster: LiveCluster, job: int, out: Path) -> str:
    """What a job that did not end as expected left behind: its record, its node's state, its output."""
    acct = cluster.run(["sacct", "-X", "-n", "-P", "-j", str(job), "-o", "State,ExitCode,Reason,NodeList"],
                       check=False).stdout.strip()  # fmt: skip
    node = cluster.run(["sinfo", "-h", "-n", NODE, "-o", "%T %E"], check=False).stdout.strip()
    text = out.read_text(errors="replace") if out.exists() else "(no output file: the job never ran its script)"
    return f"sacct: {acct}; {NODE}: {node}; output: {text[-2000:]}"


def _node_ok(cluster: LiveCluster) -> bool:
    state = cluster.run(["sinfo", "-h", "-n", NODE, "-o", "%T"]).stdout.strip().lower()
    return state in {"idle", "mixed", "allocated", "completing"}


def test_a_job_cannot_open_a_gpu_it_was_not_given(cluster: LiveCluster, guard: Guard, shared: Path) -> None:
    probe = shared / "probe.py"
    probe.write_text(PROBE)
    probe.chmod(0o644)
    report = shared / "report.json"
    mnt = cgroups.mountpoint(cluster.layout.root)
    job = _sbatch(
        cluster, ATTACKER, shared / "probe.out",
        f"{sys.executable} {probe} {cluster.layout.dev} {mnt} {report}",
        f"--account={ATTACKER_TEAM}", "--gpus-per-node=2",
    )  # fmt: skip
    assert _wait_ended(cluster, job) == "COMPLETED", _why(cluster, job, shared / "probe.out")
    got = json.loads(report.read_text())
    given = {f"nvidia{i}" for i in got["gpus"].split(",") if i}
    assert len(given) == 2, got
    # its own GPUs pass the cgroup (ENXIO: no driver behind the stand-in); every other one is refused
    assert {d: r for d, r in got["open"].items() if d in given} == dict.fromkeys(sorted(given), "ENXIO"), got
    assert {d: r for d, r in got["open"].items() if d not in given} == {
        f"nvidia{i}": "EPERM" for i in range(8) if f"nvidia{i}" not in given
    }, got
    assert got["dev_null"] == "ok"  # the constraint is by device number, and the stand-ins do not share /dev/null's
    # and the job cannot widen its device list or leave its cgroups
    assert got["allow_all"] in {"EACCES", "EPERM"}, got
    for way in ("escape_cluster_root", "escape_host_root", "escape_freezer"):
        assert got[way] in {"EACCES", "EPERM"}, (way, got)
    assert f"/slurm_{NODE}/uid_" in got["cgroups"]["freezer"] and f"/job_{job}/" in got["cgroups"]["freezer"]
    assert _node_ok(cluster)


def test_a_daemon_left_behind_is_killed_when_the_job_ends(cluster: LiveCluster, guard: Guard, shared: Path) -> None:
    pid_file = shared / "escapee.pid"
    # double fork into a new session, ignoring the signals a polite clean-up sends, then end the job
    script = (
        f"( setsid bash -c 'echo $$ > {pid_file}; trap \"\" TERM HUP INT; exec sleep 600' "
        "</dev/null >/dev/null 2>&1 & ); "
        f"while [ ! -s {pid_file} ]; do sleep 0.1; done; sleep 4"
    )
    job = _sbatch(cluster, ATTACKER, shared / "escapee.out", script, f"--account={ATTACKER_TEAM}")
    wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the escapee's pid file")
    escapee = psutil.Process(int(pid_file.read_text()))
    assert escapee.username() == ATTACKER and escapee.name() == "sleep"
    assert psutil.Process(escapee.ppid()).name() != "slurmstepd"  # re-parented: outside the step's tree
    assert _wait_ended(cluster, job) == "COMPLETED"
    # slurmstepd kills the job's whole cgroup, however far the process moved from its tree
    wait_until(lambda: not escapee.is_running(), 30, "the escapee to be gone after its job ended")
    freezer = cgroups.mountpoint(cluster.layout.root) / "freezer" / f"slurm_{NODE}"
    wait_until(lambda: not list(freezer.glob(f"uid_*/job_{job}")), 30, "the job's cgroups to be removed")
    assert _node_ok(cluster)


def test_a_job_is_held_to_its_memory(cluster: LiveCluster, guard: Guard, shared: Path) -> None:
    hog = shared / "hog.py"
    hog.write_text("b = bytearray(1 << 30)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint('survived')\n")
    hog.chmod(0o644)
    job = _sbatch(
        cluster, ATTACKER, shared / "hog.out", f"{sys.executable} {hog}", f"--account={ATTACKER_TEAM}", "--mem=300"
    )
    assert _wait_ended(cluster, job) == "OUT_OF_MEMORY"
    assert "survived" not in (shared / "hog.out").read_text(errors="replace")
    # the node is fine, and the next job (another team's) runs there
    assert _node_ok(cluster)
    after = _sbatch(cluster, VICTIM, shared / "after.out", "echo ran", "--account=prediction")
    assert _wait_ended(cluster, after) == "COMPLETED"

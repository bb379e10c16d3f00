"""Daemons that survive any input (issue 11, deliverable 8), tried as attacks on the real dev cluster.

- a team member floods the heartbeat port (junk, forged MACs, replayed genuine beats) at full speed for seconds:
  no node is declared lost, and the detector still takes a really killed node down afterwards;
- a beat signed with another node's key (all someone who broke into one node could learn) is refused: the node it
  claims to be is still declared lost when it dies;
- the controller's wall clock steps by +30 s and -30 s (injected through the dev cluster's clock-offset hook, the
  machine's clock is left alone): nobody is declared lost;
- a member's job whose record makes the policy code raise (the dev cluster's fault mark in its comment): only that
  job is skipped, logged once, the other team's job is still handled, the detector unaffected;
- the controller process is killed: the supervisor restarts it, with the new PID in ``status``; so are a killed
  slurmctld and a killed node agent.

Each ends by asserting that the controller, its detector and every agent still run (``guard``: the supervisor's
daemons alive; plus a live detector: beats accepted after the attack).

Numbers (printed, ``-s``): datagrams sent by the flood, the kernel's drops on the heartbeat socket, the receiver's
accepted/rejected counts.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nuro.devcluster import manager
from nuro.devcluster.layout import PortPlan
from nuro.devcluster.record import read_record
from nuro.devcluster.supervisor import FAULT_MARK
from nuro.lifecycle.platform_events import read_events
from nuro.protocol import heartbeat as hb
from nuro.slurm import NodeInfo
from tests.integration.conftest import LiveCluster, wait_until
from tests.integration.isolation.conftest import (
    ATTACKER,
    ATTACKER_TEAM,
    POLICY,
    VICTIM,
    VICTIM_TEAM,
    Guard,
    as_user,
)

pytestmark = pytest.mark.slurm

FLOOD = r"""
import hashlib, os, socket, sys, time
port, seconds, replay_file = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
replayed = [bytes.fromhex(line) for line in open(replay_file).read().split()]
forged = []
for i in range(1, 9):
    node = "gpu%03d" % i
    body = ('{"boot":1,"healthy":true,"node":"%s","problems":[],"seq":99999999,"sent":%.3f,"v":2}'
            % (node, time.time())).encode()
    signed = node.encode() + b" " + body
    forged.append(hashlib.blake2b(signed, key=os.urandom(32), digest_size=32).hexdigest().encode() + b"." + signed)
junk = [os.urandom(n) for n in (8, 100, 700, 1400)] + [b"0" * 64 + b".gpu001 " + os.urandom(200)]
packets = junk + forged + replayed
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
sent = blocked = i = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(2000):
        try:
            s.sendto(packets[i % len(packets)], ("127.0.0.1", port))
            sent += 1
        except BlockingIOError:
            blocked += 1
        i += 1
print(sent, blocked)
"""


#: Beats for gpu007 in nuro's wire format (nuro.protocol.heartbeat, format 2), signed with the key file given: plain
#: Python, as
#: an attacker would write it.
SPOOF = r"""
import hashlib, json, socket, sys, time
key, port = open(sys.argv[1], "rb").read().strip(), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
boot = int(time.time() * 1000) + 10**9
for seq in range(1, 300):
    body = json.dumps({"boot": boot, "healthy": True, "node": "gpu007", "problems": [], "seq": seq,
                       "sent": time.time(), "v": 2}, separators=(",", ":"), sort_keys=True).encode()
    signed = b"gpu007 " + body
    s.sendto(hashlib.blake2b(signed, key=key, digest_size=32).hexdigest().encode() + b"." + signed, ("127.0.0.1", port))
    time.sleep(0.2)
"""


def _node(cluster: LiveCluster, name: str) -> NodeInfo:
    return next(n for n in cluster.backend.nodes() if n.name == name)


def _port(cluster: LiveCluster) -> int:
    return PortPlan(read_record(cluster.layout.record).port_base).heartbeat


def _lost(cluster: LiveCluster, since: float) -> list[str]:
    return [e["node"] for e in read_events(cluster.layout.events_log, since=since, kinds=["node_lost"])]


def _controller(cluster: LiveCluster):
    record = read_record(cluster.layout.record)
    return next(d for d in record.daemons if d.name == "nuro-controller")


def _controller_log(cluster: LiveCluster) -> str:
    return (cluster.layout.log / "controller.log").read_text(errors="replace")


def _stat(cluster: LiveCluster, name: str) -> int:
    """One counter of the receiver's latest stats line in the controller log (0 before there is one)."""
    lines = re.findall(r"heartbeat receiver stats: (.*)", _controller_log(cluster))
    found = re.search(rf"\b{name}=(\d+)", lines[-1]) if lines else None
    return int(found.group(1)) if found else 0


def _kernel_drops(port: int) -> int:
    """Drops of every UDP socket bound to ``port`` (only the controller's here), from /proc/net/udp."""
    total = 0
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[1].endswith(f":{port:04X}"):
            total += int(cols[-1])
    return total


def _key_for(cluster: LiveCluster, node: str) -> Path:
    return cluster.layout.heartbeat_key.parent / "heartbeat-nodes" / f"{node}.key"


def _agent_boot(cluster: LiveCluster, node: str) -> int:
    return json.loads((cluster.layout.agents_dir / f"{node}.json").read_text())["boot"]


def _readable_by(tmp: Path, name: str, data: str) -> Path:
    path = tmp / name
    path.write_text(data)
    path.chmod(0o644)
    return path


def _detector_alive(cluster: LiveCluster, node: str, restore: list[str]) -> None:
    """The detector still works: a node killed now goes DOWN with nuro's reason within seconds."""
    restore.append(node)
    t0 = time.time()
    manager.kill_node(cluster.layout, node)
    down = wait_until(
        lambda: (n := _node(cluster, node)) and "DOWN" in n.flags and (n.reason or "").startswith("nuro:") and n,
        30, f"{node} DOWN by nuro's detector",
    )  # fmt: skip
    print(f"detector after the attack: {node} DOWN in {time.time() - t0:.1f} s ({down.reason})")


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A directory the attacker can read (pytest's own tmp_path sits below a root-only 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="nuro-daemons-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def with_policy(cluster: LiveCluster) -> Iterator[Path]:
    """``etc/teams.yaml`` for the tests that need the policy loop; removed afterwards and the controller restarted
    (by killing it: the supervisor starts it again, detector only), so later modules find the cluster as it was."""
    path = cluster.layout.teams_yaml
    existed = path.exists()
    yield path
    if not existed and path.exists():
        path.unlink()
        old = _controller(cluster)
        psutil.Process(old.pid).kill()
        wait_until(lambda: (c := _controller(cluster)) and c.pid != old.pid and c.is_alive(), 30, "the controller")


def test_a_heartbeat_flood_from_a_member_loses_no_node_and_detection_goes_on(
    cluster: LiveCluster, guard: Guard, restore: list[str], tmp_path: Path
) -> None:
    port = _port(cluster)
    # Replays: genuine beats of gpu001..gpu004, signed with their real keys, as a capture of the wire would hold
    replays = []
    for node in ("gpu001", "gpu002", "gpu003", "gpu004"):
        key, boot = hb.load_key(_key_for(cluster, node)), _agent_boot(cluster, node)
        replays += [hb.encode(hb.Heartbeat(node, boot, seq, time.time()), key).hex() for seq in (1, 2, 3)]
    replay_file = _readable_by(tmp_path, "replay.hex", "\n".join(replays))
    script = _readable_by(tmp_path, "flood.py", FLOOD)
    drops_before, t0 = _kernel_drops(port), time.time()
    res = as_user(cluster, ATTACKER, ["/usr/bin/python3", str(script), str(port), "6", str(replay_file)])
    assert res.returncode == 0, res.stderr
    sent, blocked = map(int, res.stdout.split())
    time.sleep(4)  # more than one timeout (3 s) after the flood: a loss caused by it would show now
    drops = _kernel_drops(port) - drops_before
    stats = wait_until(
        lambda: [m for m in re.findall(r"heartbeat receiver stats: (.*)", _controller_log(cluster))],
        15, "the receiver's stats line",
    )[-1]  # fmt: skip
    print(f"flood: {sent} datagrams in 6 s ({sent / 6:.0f}/s, {blocked} EAGAIN) from {ATTACKER}; kernel drops on "
          f"the heartbeat socket: {drops}; receiver: {stats}")  # fmt: skip
    assert _lost(cluster, t0) == [], "a flood made the detector declare nodes lost"
    assert all(not (n.reason or "").startswith("nuro:") for n in cluster.backend.nodes()), "a node was taken down"
    assert sent > 10_000  # it really was a flood
    assert "rejected_bad_mac=" in stats and "rejected_replay=" in stats
    _detector_alive(cluster, "gpu008", restore)


def test_a_beat_signed_with_another_nodes_key_is_refused(
    cluster: LiveCluster, guard: Guard, restore: list[str], tmp_path: Path
) -> None:
    """Someone learnt gpu006's key; they keep a dead gpu007 'alive' with it: refused, gpu007 still goes down."""
    port = _port(cluster)
    stolen = _readable_by(tmp_path, "gpu006.key", _key_for(cluster, "gpu006").read_text())
    spoof = _readable_by(tmp_path, "spoof.py", SPOOF)
    restore.append("gpu007")
    rejected_before = _stat(cluster, "rejected_bad_mac")
    proc = psutil.Popen(["runuser", "-u", ATTACKER, "--", "/usr/bin/python3", str(spoof), str(stolen), str(port)])
    try:
        wait_until(lambda: _stat(cluster, "rejected_bad_mac") >= rejected_before + 3, 30, "the spoofed beats refused")
        t0 = time.time()
        manager.kill_node(cluster.layout, "gpu007")
        wait_until(lambda: "gpu007" in _lost(cluster, t0), 30, "gpu007 declared lost despite the spoofed beats")
        assert proc.poll() is None, "the spoofer stopped before gpu007 was declared lost"
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode in (0, -signal.SIGTERM)


@pytest.mark.parametrize("step_s", [30.0, -30.0])
def test_a_controller_clock_step_declares_no_node_dead(
    cluster: LiveCluster, guard: Guard, restore: list[str], step_s: float
) -> None:
    offset = cluster.layout.run / "controller-clock-offset"
    t0 = time.time()
    try:
        offset.write_text(f"{step_s}\n")
        time.sleep(8)  # the controller re-reads the offset every 0.5 s; 8 s > two timeouts
    finally:
        offset.unlink(missing_ok=True)
    time.sleep(2)
    assert _lost(cluster, t0) == [], f"a wall-clock step of {step_s:+.0f} s declared nodes lost"
    assert all(not (n.reason or "").startswith("nuro:") for n in cluster.backend.nodes())
    assert "clock_skew" not in "".join(re.findall(r"heartbeat rejected .*", _controller_log(cluster)[-20000:]))


def test_the_controller_killed_is_restarted_by_the_supervisor_with_the_new_pid_in_status(
    cluster: LiveCluster, guard: Guard, with_policy: Path
) -> None:
    # With teams.yaml in place the restarted controller also runs the policy (the next test needs it).
    with_policy.write_text(POLICY.read_text())
    starts = _controller_log(cluster).count("nuro-controller started: policy=")
    old = _controller(cluster)
    psutil.Process(old.pid).kill()
    new = wait_until(
        lambda: (c := _controller(cluster)) and c.pid != old.pid and c.is_alive() and c, 30, "a new controller"
    )
    procs = {p["name"]: p for p in manager.status(cluster.layout)["processes"]}
    assert procs["nuro-controller"]["pid"] == new.pid and procs["nuro-controller"]["alive"]
    record = read_record(cluster.layout.record)
    assert record.restarts["nuro-controller"]["count"] >= 1 and record.restarts["nuro-controller"]["pid"] == new.pid
    wait_until(lambda: _controller_log(cluster).count("nuro-controller started: policy=") > starts, 20,
               "the restarted controller's policy loop")  # fmt: skip


def test_a_job_whose_record_makes_the_policy_raise_costs_only_that_job(
    cluster: LiveCluster, guard: Guard, restore: list[str]
) -> None:
    assert "--policy" in " ".join(psutil.Process(_controller(cluster).pid).cmdline()), "run the restart test first"

    def sbatch(user: str, team: str, comment: str) -> int:
        res = as_user(cluster, user, ["sbatch", "--parsable", f"--account={team}", "--nodes=1",
                                      "--gres=gpu:1", "--output=/dev/null", f"--comment={comment}",
                                      "--wrap", "sleep 60"])  # fmt: skip
        assert res.returncode == 0, res.stderr
        return int(res.stdout.strip().split(";")[0])

    # Both jobs must wait *eligible* (a held job is no queue head: it gets no SiteFactor), so they wait behind a
    # partition that is down for the test's few seconds, with reason PartitionDown.
    partition = cluster.run(["sinfo", "-h", "-o", "%R"]).stdout.split()[0]
    cluster.run(["scontrol", "update", f"partitionname={partition}", "state=down"])
    bad, good = None, None
    try:
        bad = sbatch(ATTACKER, ATTACKER_TEAM, f"please {FAULT_MARK}")
        good = sbatch(VICTIM, VICTIM_TEAM, "plain")
        wait_until(lambda: re.search(rf"decision=SetSiteFactor job={good} applied=True", _controller_log(cluster)),
                   30, f"the controller handling job {good}")  # fmt: skip
        time.sleep(3)  # several more cycles
        log = _controller_log(cluster)
        assert log.count(f"job={bad} skipped") == 1, "the bad job is logged once, not every cycle"
        assert not re.search(rf"decision=\w+ job={bad} ", log), "a decision was applied to the skipped job"
        assert "cycle skipped" not in log.rsplit(f"job={bad} skipped", 1)[-1]
        _detector_alive(cluster, "gpu005", restore)
    finally:
        cluster.run(["scancel", *(str(j) for j in (bad, good) if j is not None)], check=False)
        cluster.run(["scontrol", "update", f"partitionname={partition}", "state=up"], check=False)


def _not_responding(node) -> bool:  # noqa: ANN001 - a NodeInfo
    return "NOT_RESPONDING" in node.flags or (node.reason or "").lower().startswith("not responding")


def _ref(cluster: LiveCluster, name: str):
    return next((d for d in read_record(cluster.layout.record).daemons if d.name == name), None)


@pytest.mark.parametrize("name", ["slurmctld", "agent:gpu003"])
def test_a_crashed_slurmctld_or_agent_is_restarted_like_its_unit(
    cluster: LiveCluster, guard: Guard, restore: list[str], name: str
) -> None:
    """slurmctld: Restart=on-failure; a node agent: Restart=always. Both come back under the supervisor, recorded."""
    if name.startswith("agent:"):
        restore.append(name.removeprefix("agent:"))
    old = _ref(cluster, name)
    psutil.Process(old.pid).kill()
    new = wait_until(lambda: (r := _ref(cluster, name)) and r.pid != old.pid and r.is_alive() and r, 60, f"{name} back")
    procs = {p["name"]: p for p in manager.status(cluster.layout)["processes"]}
    assert procs[name]["pid"] == new.pid and procs[name]["alive"]
    if name == "slurmctld":
        wait_until(lambda: cluster.run(["sinfo", "-h"], check=False).returncode == 0, 60, "slurmctld answering")
        # A restarted slurmctld pings every slurmd; on a loaded box one may answer late and be held DOWN "Not
        # responding" for a moment (ReturnToService=2 takes it back once it answers): Slurm's restart, not a mark of
        # the crash. A node drained or set down for any other reason stays out, and the guard fails on it.
        wait_until(lambda: not [n for n in cluster.backend.nodes() if _not_responding(n)], 60,
                   "every slurmd answering the restarted slurmctld")  # fmt: skip
    else:
        node = name.removeprefix("agent:")
        wait_until(lambda: json.loads((cluster.layout.agents_dir / f"{node}.json").read_text())["pid"] == new.pid,
                   30, f"the new agent of {node} beating")  # fmt: skip

"""The heartbeat failure detector on the real dev cluster: node agents beat, nuro-controller (detector only) judges.

A node is crashed like a host with ``devcluster kill-node`` (slurmd, slurmstepds, job processes, agent: SIGKILL) and
brought back with ``revive-node``. Measured times are printed (``-s`` shows them) and kept in the event log.
Each test uses its own node(s) so the controller's flap history of one test does not leak into another, and every
test leaves its nodes idle and resumed for the rest of the session.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from nuro.cluster.description import release_of
from nuro.devcluster import cgroups, manager
from nuro.lifecycle.platform_events import read_events
from nuro.slurm import JobInfo, NodeInfo
from nuro.slurm.models import EXPEDITED_REQUEUE_SINCE, REISSUE_PURGES_SINCE
from nuro.slurm_plugins.controller.expedite import FIRST_READ_S
from tests.integration.conftest import TEST_SLURM, LiveCluster, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.every_slurm]

SLEEP_JOB = "#!/bin/bash\nsleep 900\n"


def _node(cluster: LiveCluster, name: str) -> NodeInfo:
    return next(n for n in cluster.backend.nodes() if n.name == name)


def test_killed_node_goes_down_and_drained_fast_and_its_requeue_job_runs_elsewhere(
    cluster: LiveCluster, restore: list[str]
) -> None:
    job_id = cluster.backend.submit(SLEEP_JOB, "--requeue", "-N1", "--exclude=gpu007,gpu008", "-o", "/dev/null")
    job = wait_until(
        lambda: (j := cluster.backend.find_job(job_id)) and j.state == "RUNNING" and j.nodes and j, 60, "job running"
    )
    victim = job.nodes[0]
    restore.append(victim)
    # RUNNING in slurmctld comes before the node has started anything (prolog, launch RPC): on a busy machine a kill
    # right away finds no job process. Wait until the job's processes are in the node's cgroups.
    wait_until(lambda: cgroups.node_processes(cluster.layout.root, victim), 30, f"the job's processes on {victim}")
    killed = manager.kill_node(cluster.layout, victim)
    names = {k["name"] for k in killed["killed"]}
    # the job's slurmstepd, or the slurmd child about to become it when the kill lands mid double-fork
    assert names >= {"slurmd", "agent"} and names & {"slurmstepd", "slurmd child"}, killed

    def down_with_our_reason() -> bool:
        n = _node(cluster, victim)
        return "DOWN" in n.flags and n.is_drained and (n.reason or "").startswith("nuro: no heartbeat for")

    # nuro's reason proves the detector acted, not SlurmdTimeout; the speed is bench/detection.py's to measure
    wait_until(down_with_our_reason, 30, f"{victim} DOWN+DRAIN with nuro's reason")
    print(f"\nkill -> DOWN+DRAIN observed after {time.time() - killed['at']:.2f} s")
    lost = [e for e in read_events(cluster.layout.events_log, since=killed["at"] - 1, node=victim)]
    kinds = [e["kind"] for e in lost]
    assert kinds[:4] == ["node_lost", "node_down", "jobs_requeued", "node_drained"], kinds
    assert lost[2]["jobs"] == [job_id]
    print(f"event log: node_lost at +{lost[0]['ts'] - killed['at']:.2f} s, silent_s={lost[0]['silent_s']}")

    elsewhere = wait_until(
        lambda: (
            (j := cluster.backend.find_job(job_id)) and j.state == "RUNNING" and j.nodes and victim not in j.nodes and j
        ),
        60,
        "the requeued job running on another node",
    )
    assert elsewhere.restart_count == 1
    print(f"kill -> running again on {elsewhere.nodes[0]} after {time.time() - killed['at']:.1f} s")
    _check_expedited(cluster, job_id, killed["at"])
    cluster.run(["scancel", str(job_id)])

    revived = manager.revive_node(cluster.layout, victim)
    wait_until(lambda: _node(cluster, victim).state == "IDLE", 20, f"{victim} resumed by the detector")
    print(f"revive -> resumed after {time.time() - revived['at']:.1f} s")
    assert any(e["kind"] == "node_resumed" for e in read_events(cluster.layout.events_log, node=victim))


def test_a_requeued_job_that_restarts_on_a_surviving_node_gets_its_prolog_there(
    cluster: LiveCluster, restore: list[str]
) -> None:
    """Issue 31: the detector's early start (before 25.11) must not bring the new attempt to a surviving node that
    still remembers the old one: slurmd then runs no prolog for it (no job record, no staging dir; the soak's
    DeepSpeed run failed so). A 2-node job among 3 allowed nodes loses its second node; the new attempt must use the
    survivor, and the survivor's prolog runs for it."""
    allowed = ("gpu001", "gpu002", "gpu004")  # one leaf: a 2-node job fits any two of them (topology/block too)
    others = [f"gpu00{i}" for i in range(1, 9) if f"gpu00{i}" not in allowed]
    job_id = cluster.backend.submit(SLEEP_JOB, "--requeue", "-N2", f"--exclude={','.join(others)}", "-o", "/dev/null")
    job = wait_until(lambda: (j := cluster.backend.find_job(job_id)) and j.state == "RUNNING" and j, 60, "running")
    survivor, victim = job.nodes[0], job.nodes[1]
    restore.append(victim)

    def prologs(node: str = survivor) -> int:
        log = cluster.layout.log / f"hooks-{node}.log"  # written by the node's first hook
        text = log.read_text(errors="replace") if log.exists() else ""
        return sum(f"job={job_id} prolog done" in line for line in text.splitlines())

    # the first attempt is under way on both nodes (PrologFlags=Alloc: the prologs ran) before the kill
    wait_until(lambda: prologs() == 1 and prologs(victim) == 1, 30, "the first attempt's prologs")
    killed = manager.kill_node(cluster.layout, victim)
    try:
        again = wait_until(lambda: (j := cluster.backend.find_job(job_id)) and j.restart_count == 1
                           and j.state == "RUNNING" and j, 90, "the requeued job running again")  # fmt: skip
        assert survivor in again.nodes and victim not in again.nodes, again.nodes
        wait_until(lambda: prologs() == 2, 10, f"the prolog of the new attempt on {survivor}")
        _check_expedited(cluster, job_id, killed["at"])
    finally:
        cluster.run(["scancel", str(job_id)], check=False)
        manager.revive_node(cluster.layout, victim)
    wait_until(lambda: _node(cluster, victim).state == "IDLE", 30, f"{victim} resumed by the detector")


def test_a_node_back_from_a_crash_runs_the_prolog_of_a_job_it_ran_before(
    cluster: LiveCluster, restore: list[str]
) -> None:
    """Issue 31 (soak, 22.05): slurmd runs a job's prolog only the first time it sees the job id, and reloads the ids
    it saw from its spool when it starts. A host that crashed while running a job never hears that the job left it,
    so when the job came back to it after running elsewhere, no prolog ran (the root record still named the old
    attempt; the epilog refused its checkpoint uploads). A revive clears the spool's job state from before the
    "boot", as the compute role's ``ExecStartPre`` does on a real host (``nuro.healthcheck.slurmdspool``)."""
    pair = ("gpu005", "gpu006")
    others = ",".join(f"gpu00{i}" for i in range(1, 9) if f"gpu00{i}" not in pair)
    job_id = cluster.backend.submit("#!/bin/bash\nsrun sleep 900\n", "--requeue", "-N1", f"--exclude={others}",
                                    "-o", "/dev/null")  # fmt: skip

    def prologs(node: str) -> int:
        log = cluster.layout.log / f"hooks-{node}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return sum(f"job={job_id} prolog done" in line for line in text.splitlines())

    def running(restart: int) -> JobInfo:
        return wait_until(lambda: (j := cluster.backend.find_job(job_id)) and j.state == "RUNNING"
                          and j.restart_count == restart and j, 90, f"attempt {restart} running")  # fmt: skip

    crashed = running(0).nodes[0]
    elsewhere = next(n for n in pair if n != crashed)
    restore.extend(pair)
    # slurmd saves its job state to the spool on a task launch (the srun step), not at the batch launch
    wait_until(lambda: any(p.name() == "sleep" for p in cgroups.node_processes(cluster.layout.root, crashed)), 30,
               f"the job's step on {crashed}")  # fmt: skip
    assert prologs(crashed) == 1
    manager.kill_node(cluster.layout, crashed)
    try:
        assert running(1).nodes == (elsewhere,)  # the job moved on while the host was down
        manager.revive_node(cluster.layout, crashed)
        wait_until(lambda: _node(cluster, crashed).state == "IDLE", 60, f"{crashed} resumed by the detector")
        # the job comes back to the host that crashed under it
        cluster.run(["scontrol", "requeue", str(job_id)])
        cluster.run(["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={others},{elsewhere}"])
        assert running(2).nodes == (crashed,)
        wait_until(lambda: prologs(crashed) == 2, 30, f"the prolog of attempt 2 on {crashed}")
    finally:
        cluster.run(["scancel", str(job_id)], check=False)


def _check_expedited(cluster: LiveCluster, job_id: int, killed_at: float) -> None:
    """Where the detector started a requeued job itself (before 25.11; on 22.05 only when that came before Slurm's
    own delay), it did so once the requeue was done, and on 22.05 only after cred_expire (5 s on the dev cluster) +
    2 s from the kill; 25.11+ requeues expedited jobs itself and the detector never does."""
    events = read_events(cluster.layout.events_log, since=killed_at - 1)
    fast = [e for e in events if e["kind"] == "requeue_expedited" and e["jobs"] == [job_id]]
    release = release_of(TEST_SLURM)
    if release >= EXPEDITED_REQUEUE_SINCE:
        assert not fast
    for e in fast:
        assert e["ok"] and e["after_kill_s"] >= (FIRST_READ_S if release >= REISSUE_PURGES_SINCE else 5 + 2), fast
    print(f"requeue expedited by the detector: {[e['after_kill_s'] for e in fast] or 'no (Slurm was first)'}")


def test_a_no_kill_job_that_lost_its_batch_host_is_requeued(cluster: LiveCluster, restore: list[str]) -> None:
    """Issue 31: a ``--no-kill`` job (what hot spares use) keeps RUNNING when a node fails: Slurm excises the node.
    When that node is the batch host, the batch script (which would swap in a spare) died with it and nothing would
    end the job until the node registers again. The detector requeues such a job: the requeue path."""
    job_id = cluster.backend.submit(SLEEP_JOB, "--requeue", "--no-kill", "-N2", "--nodelist=gpu003,gpu004",
                                    "-o", "/dev/null")  # fmt: skip
    job = wait_until(lambda: (j := cluster.backend.find_job(job_id)) and j.state == "RUNNING" and j, 60, "running")
    host = job.nodes[0]
    restore.append(host)
    wait_until(lambda: cgroups.node_processes(cluster.layout.root, host), 30, f"the job's processes on {host}")
    killed = manager.kill_node(cluster.layout, host)
    try:
        again = wait_until(lambda: (j := cluster.backend.find_job(job_id)) and j.restart_count == 1 and j, 60,
                           "the job requeued")  # fmt: skip
        assert again.phase.name in ("COMPLETING", "PENDING", "RUNNING"), again  # requeued: not ended
        events = read_events(cluster.layout.events_log, since=killed["at"] - 1, node=host)
        headless = [e for e in events if e["kind"] == "jobs_requeued" and e.get("why") == "batch host lost"]
        assert headless and headless[0]["jobs"] == [job_id], events
    finally:
        cluster.run(["scancel", str(job_id)], check=False)
        manager.revive_node(cluster.layout, host)
    wait_until(lambda: _node(cluster, host).state == "IDLE", 30, f"{host} resumed by the detector")


def test_an_admin_drained_node_is_never_resumed(cluster: LiveCluster, restore: list[str]) -> None:
    node = "gpu007"
    restore.append(node)
    cluster.run(["scontrol", "update", f"nodename={node}", "state=drain", "reason=admin: replace fan"])
    killed = manager.kill_node(cluster.layout, node)
    wait_until(lambda: "DOWN" in _node(cluster, node).flags, 15, f"{node} DOWN")
    reason = _node(cluster, node).reason or ""
    assert reason.startswith("nuro: no heartbeat") and reason.endswith("(admin drain: admin: replace fan)"), reason
    manager.revive_node(cluster.layout, node)
    wait_until(lambda: "DOWN" not in _node(cluster, node).flags, 20, f"{node}'s slurmd registered")
    time.sleep(6)  # > 2 healthy intervals + a node poll: the detector would have resumed it by now
    after = _node(cluster, node)
    assert after.is_drained, f"{node} was resumed although an admin drained it: {after}"
    assert not [e for e in read_events(cluster.layout.events_log, since=killed["at"], node=node)
                if e["kind"] == "node_resumed"]  # fmt: skip


def test_a_flapping_node_is_held_drained(cluster: LiveCluster, restore: list[str]) -> None:
    node = "gpu008"
    restore.append(node)
    # Losses of this node in the flap window before this test (another test's kill, or a loss the detector declared
    # on a CI host stalled for a second) count too: the hold may then come before the 3rd kill, never later.
    earlier = [e for e in read_events(cluster.layout.events_log, since=time.time() - 600, node=node)
               if e["kind"] == "node_lost"]  # fmt: skip
    for loss in range(1, 4):
        killed = manager.kill_node(cluster.layout, node)
        wait_until(lambda: "DOWN" in _node(cluster, node).flags, 15, f"{node} DOWN (loss {loss})")
        manager.revive_node(cluster.layout, node)
        if (_node(cluster, node).reason or "").startswith("nuro: flapping"):
            break
        wait_until(lambda: _node(cluster, node).state == "IDLE", 20, f"{node} resumed after loss {loss}")
    revived = time.time()
    reason = _node(cluster, node).reason or ""
    assert re.match(r"nuro: flapping \(\d+ losses in 600 s\), held 30 s until", reason), reason
    assert loss == 3 or earlier, f"held after {loss} losses, with none before the test: {reason}"
    # beating again: its agent writes its status again (the killed agent's file is still there). Slurm may show it
    # DOWN+DRAIN or DRAIN by then: a slurmd that registers before the agent's first beat is put DOWN again.
    status = cluster.layout.agents_dir / f"{node}.json"
    wait_until(lambda: status.exists() and status.stat().st_mtime >= revived, 30, f"{node}'s agent beating again")
    time.sleep(3)  # > 2 healthy intervals + a node poll: a detector ignoring the hold would have resumed it by now
    held = _node(cluster, node)
    assert held.is_drained and (held.reason or "").startswith("nuro: flapping"), held  # beating healthy, still held
    flaps = [e for e in read_events(cluster.layout.events_log, since=killed["at"] - 1, node=node)]
    assert any(e["kind"] == "node_flapping" and e["hold_s"] >= 29 for e in flaps), flaps
    wait_until(lambda: _node(cluster, node).state == "IDLE", 40, f"{node} resumed when its 30 s hold ended")


def test_an_agent_restart_is_no_node_loss(cluster: LiveCluster, restore: list[str]) -> None:
    """SIGTERM to a node's agent (what systemctl restart or an upgrade does): its last beat announces the silence, the
    supervisor starts it again (1 s back-off, as systemd's RestartSec), and the node is never taken down."""
    node = "gpu005"
    restore.append(node)
    status = cluster.layout.agents_dir / f"{node}.json"
    before = json.loads(status.read_text())
    t0 = time.time()
    os.kill(int(before["pid"]), signal.SIGTERM)
    wait_until(lambda: json.loads(status.read_text())["boot"] != before["boot"], 30, f"{node}'s agent restarted")
    time.sleep(3)  # > the timeout (2 s on test clusters) once more: a detector ignoring the announcement has acted
    after = _node(cluster, node)
    assert "DOWN" not in after.flags and not after.is_drained, after
    events = read_events(cluster.layout.events_log, since=t0, node=node)
    assert any(e["kind"] == "node_agent_stopping" and e["quiet_s"] == 15 for e in events), events  # heard it
    assert not [e for e in events if e["kind"] == "node_lost"], events


def test_nuro_env_and_exports_name_the_agent_dirs_and_event_log(cluster: LiveCluster) -> None:
    env = dict(line.split("=", 1) for line in cluster.layout.nuro_env.read_text().splitlines())
    assert env["NURO_EVENT_LOG"] == str(cluster.layout.events_log)
    assert Path(env["NURO_AGENT_STATUS_DIR"]).is_dir()
    assert env["NURO_STAGING_ROOT"] == str(cluster.layout.staging / "{node}")  # one staging root per emulated node
    assert all(cluster.layout.node_staging(n.name).is_dir() for n in cluster.backend.nodes())
    assert oct(cluster.layout.heartbeat_key.stat().st_mode & 0o777) == "0o600"
    assert cluster.env["NURO_EVENT_LOG"] == env["NURO_EVENT_LOG"]

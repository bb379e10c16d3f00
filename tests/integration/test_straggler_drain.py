"""A straggler report on the real controller: a node is drained ``nuro-straggler:`` only when Slurm says it is the
reporting job's and its own heartbeats say a slowing clock reason holds its GPUs; it is resumed once they no longer do.

The two nodes' real agents are paused (SIGSTOP) and the test beats for them, signed with each node's own key, as
their agents would: the job's rank-0 node carrying the job's report (``stragglers``), the flagged node carrying what
its NVML probe would say (``throttled``). The agent's half (the report socket, ``throttled_gpus``) is unit-tested in
tests/unit/test_peerloss.py. Afterwards the agents are restarted (a new boot) and the nodes put back in service.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest

from nuro.devcluster import manager
from nuro.devcluster.layout import PortPlan
from nuro.lifecycle.platform_events import read_events
from nuro.protocol import heartbeat as hb
from nuro.slurm import NodeInfo
from tests.integration.conftest import LiveCluster, wait_until

pytestmark = [pytest.mark.slurm]

SLOW = ("gpu2: SM 900 MHz (SW thermal slowdown)",)


def _node(cluster: LiveCluster, name: str) -> NodeInfo:
    return next(n for n in cluster.backend.nodes() if n.name == name)


class _Beats:
    """Beats for ``reporter`` and ``flagged`` every 0.25 s, in place of their paused agents; what they carry is set
    while it runs."""

    def __init__(self, cluster: LiveCluster, reporter: str, flagged: str) -> None:
        master = hb.load_key(cluster.layout.heartbeat_key)
        self.keys = {n: hb.node_key(master, n) for n in (reporter, flagged)}
        port = PortPlan(manager.recorded_port_base(cluster.layout)).heartbeat
        self.addr = ("127.0.0.1", port)
        self.reporter, self.flagged = reporter, flagged
        self.boot = int(time.time() * 1000)
        self.report: tuple[tuple[int, str, float], ...] = ()
        self.throttled: tuple[str, ...] = ()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import socket

        seq = 0
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            while not self.stop.is_set():
                seq += 1
                now = time.time()
                for node, extra in ((self.reporter, {"stragglers": self.report}),
                                    (self.flagged, {"throttled": self.throttled})):  # fmt: skip
                    s.sendto(hb.encode(hb.Heartbeat(node, self.boot, seq, now, **extra), self.keys[node]), self.addr)
                self.stop.wait(0.25)


def _agent_pid(cluster: LiveCluster, node: str) -> int:
    return int(json.loads((cluster.layout.agents_dir / f"{node}.json").read_text())["pid"])


def test_a_flagged_node_is_drained_only_when_it_is_the_jobs_and_its_nvml_agrees(
    cluster: LiveCluster, restore: list[str]
) -> None:
    reporter, flagged = "gpu003", "gpu004"
    restore += [reporter, flagged]
    job_id = cluster.backend.submit("#!/bin/bash\nsleep 900\n", "-N2", f"--nodelist={reporter},{flagged}",
                                    "-o", "/dev/null")  # fmt: skip
    beats = _Beats(cluster, reporter, flagged)
    paused = [_agent_pid(cluster, n) for n in (reporter, flagged)]
    try:
        wait_until(lambda: (j := cluster.backend.find_job(job_id)) and j.state == "RUNNING", 60, "the job running")
        t0 = time.time()
        for pid in paused:
            os.kill(pid, signal.SIGSTOP)
        beats.thread.start()
        # 1. the job's word alone: its node's GPUs report nothing slowing -> not acted on, on record
        beats.report = ((job_id, flagged, 1.4),)
        wait_until(lambda: any(e["kind"] == "straggler_unconfirmed" and e["jobs"] == [job_id]
                               for e in read_events(cluster.layout.events_log, since=t0, node=flagged)),
                   15, "the unconfirmed report on record")  # fmt: skip
        assert not _node(cluster, flagged).is_drained
        # 2. its NVML agrees: drained with the straggler reason, on record
        beats.throttled = SLOW
        wait_until(lambda: _node(cluster, flagged).is_drained, 15, f"{flagged} drained as a straggler")
        reason = _node(cluster, flagged).reason or ""
        assert reason == f"nuro-straggler: job {job_id} ran 1.40x slower here; {SLOW[0]}", reason
        events = read_events(cluster.layout.events_log, since=t0, node=flagged)
        assert any(e["kind"] == "node_straggler" for e in events), events
        assert not _node(cluster, reporter).is_drained
        # 3. clocks back: resumed once its beats have said nothing slowing for straggler_clear_s (30 s)
        beats.report, beats.throttled = (), ()
        cleared = time.time()
        wait_until(lambda: not _node(cluster, flagged).is_drained, 60, f"{flagged} resumed when its clocks recovered")
        print(f"\nresumed {time.time() - cleared:.1f} s after its GPUs stopped reporting a slowing reason")
        assert time.time() - cleared >= 29
    finally:
        for pid in paused:  # a new boot: the restarted agents' beats outrank the test's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(Exception):
            for n in (reporter, flagged):
                wait_until(lambda n=n: _agent_pid(cluster, n) not in paused, 30, f"{n}'s agent restarted")
        beats.stop.set()
        cluster.run(["scancel", str(job_id)], check=False)

"""In-band loss reports (issue 16 item 5): the launcher's line watch, the wire, the agent's checks (kernel uid against
the job's root-written record), the beat's ``suspect_jobs``, and the detector's shorter silence for a reported job's
nodes — which never takes down a node that keeps beating."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from nuro.protocol import heartbeat as hb
from nuro.protocol import jobrecord, peerloss
from nuro.protocol.jobrecord import JobRecord
from nuro.slurm.models import NodeInfo
from nuro.slurm_plugins.controller.liveness import Beat, DetectorState, LivenessConfig, NodeActionKind, assess
from nuro.wrappers.launch import _Tail, peer_loss_watch

KEY = b"k" * 32


def test_reports_parse_strictly() -> None:
    assert peerloss.parse(peerloss.encode(4242)) == 4242
    for bad in (b"", b"nuro-peerloss/1 ", b"nuro-peerloss/1 -3", b"nuro-peerloss/1 0", b"nuro-peerloss/1 12x",
                b"nuro-peerloss/2 5", b"nuro-peerloss/1 " + b"9" * 11, b"x" * 100):  # fmt: skip
        assert peerloss.parse(bad) is None, bad


def test_only_the_jobs_own_user_or_root_on_its_node_is_heard() -> None:
    assert peerloss.accept(7, 1001, 1001, "gpu001", "gpu001")
    assert peerloss.accept(7, 0, 1001, "gpu001", "gpu001")
    assert not peerloss.accept(7, 1002, 1001, "gpu001", "gpu001")  # another user
    assert not peerloss.accept(7, 1001, None, None, "gpu001")  # no record of that job here
    assert not peerloss.accept(7, 1001, 1001, "gpu002", "gpu001")  # a record of another node


def test_heartbeats_carry_suspect_jobs_only_when_there_are_some() -> None:
    beat = hb.Heartbeat("gpu001", 1, 2, time.time(), suspect_jobs=(17, 18))
    assert hb.decode(hb.encode(beat, KEY), KEY).suspect_jobs == (17, 18)
    assert b"suspect_jobs" not in hb.encode(hb.Heartbeat("gpu001", 1, 2, time.time()), KEY)
    for bad in ((0,), (True,), tuple(range(1, 11)), (2**40,)):
        with pytest.raises(hb.BadHeartbeat):
            hb.Heartbeat("gpu001", 1, 2, 0.0, suspect_jobs=bad)  # type: ignore[arg-type]


def test_the_launcher_reports_the_first_peer_death_line_to_its_nodes_agent(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "gpu003", "NURO_AGENT_SOCKET_DIR": str(tmp_path)}
    watch = peer_loss_watch(env)
    assert watch is not None and watch.path == tmp_path / "gpu003.report.sock"
    assert peer_loss_watch({"SLURMD_NODENAME": "gpu003"}) is None  # outside a job: nothing to report
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as agent:
        agent.bind(str(watch.path))
        agent.settimeout(2)
        r, w = os.pipe()
        with os.fdopen(r) as src, open(os.devnull, "w") as dst:
            tail = _Tail(src, dst, watch)
            with os.fdopen(w, "w") as out:
                out.write("step 3 loss 0.1\n")
                out.write("RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]\n")
                out.write("RuntimeError: Connection reset by peer\n")  # a second line: no second report
            tail.thread.join(5)
        assert agent.recv(100) == b"nuro-peerloss/1 77"
        agent.settimeout(0.2)
        with pytest.raises(TimeoutError):
            agent.recv(100)
    assert watch.sent is True and "Connection closed by peer" in tail.text()


def test_a_missing_agent_costs_the_report_not_the_job(tmp_path: Path) -> None:
    assert peerloss.send(tmp_path / "none.report.sock", 5) is False


# -- the agent ---------------------------------------------------------------------------------------------------


class _NoProbe:
    def read(self):  # noqa: ANN201
        from nuro.healthcheck.probes import NodeGpuReport

        return NodeGpuReport(gpus=(), driver_error=None)

    def close(self) -> None:
        pass


def _agent(tmp_path: Path, clock: list[float]):  # noqa: ANN202
    from dataclasses import replace

    from nuro.healthcheck.agent import Agent, AgentConfig
    from nuro.healthcheck.run import HealthSettings

    health = replace(HealthSettings(), staging_root=str(tmp_path / "staging"), probe="none")
    cfg = AgentConfig("gpu001", ("127.0.0.1", 9), KEY, status_dir=str(tmp_path / "status"), health=health)
    sent: list[bytes] = []

    class Sock:
        family = socket.AF_INET

        def setblocking(self, _flag: bool) -> None: ...
        def sendto(self, data: bytes, _addr: object) -> None:
            sent.append(data)

        def close(self) -> None: ...

    agent = Agent(cfg, _NoProbe(), sock=Sock(), monotonic=lambda: clock[0])  # type: ignore[arg-type]
    return agent, sent


def _record(tmp_path: Path, job: int, uid: int, node: str = "gpu001") -> None:
    (tmp_path / "staging").mkdir(exist_ok=True)
    jobrecord.write(tmp_path / "staging", JobRecord(job, uid, uid, "alice", "vision", "vision", None, 0, node, None))


@pytest.mark.skipif(os.geteuid() != 0, reason="job records are root's files (the agent refuses others')")
def test_the_agent_takes_a_report_only_from_the_jobs_user_and_beats_it_for_a_while(tmp_path: Path) -> None:
    clock = [100.0]
    agent, _ = _agent(tmp_path, clock)
    _record(tmp_path, 41, 1001)
    _record(tmp_path, 42, 1001, node="gpu009")
    assert not agent.report(40, 1001)  # no such job here
    assert not agent.report(41, 1002)  # not its user
    assert not agent.report(42, 1001)  # a record of another node
    assert agent.report(41, 1001) and agent._kick.is_set()
    assert agent.beat_once().suspect_jobs == (41,)
    clock[0] += peerloss.SUSPECT_TTL_S + 0.1
    assert agent.beat_once().suspect_jobs == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="job records are root's files (the agent refuses others')")
def test_the_agents_socket_hears_the_kernels_uid_and_beats_at_once(tmp_path: Path) -> None:
    clock = [100.0]
    agent, sent = _agent(tmp_path, clock)
    agent.config.interval_s = 30.0  # only a report can make a second beat come soon
    agent.config.probe_interval_s = 0.05
    _record(tmp_path, 43, 0)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    t.start()
    path = peerloss.socket_path(tmp_path / "status", "gpu001")
    deadline = time.monotonic() + 5
    while not (path.exists() and sent) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert peerloss.send(path, 43)
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    agent.wake()
    t.join(5)
    beats = [hb.decode(d, KEY) for d in sent]
    assert beats[1].suspect_jobs == (43,) and agent.reports_accepted == 1


# -- straggler reports (issue 16): rank 0's flag, through its node's agent --------------------------------------------
def test_straggler_reports_parse_strictly() -> None:
    data = peerloss.encode_straggler(7, "gpu002", 1.3)
    assert data == b"nuro-straggler/1 7 gpu002 1.300" and peerloss.parse_straggler(data) == (7, "gpu002", 1.3)
    assert peerloss.parse(data) is None  # one parser per kind: a straggler report is no peer loss
    for junk in (b"nuro-straggler/1 7 gpu002", b"nuro-straggler/1 0 gpu002 1.3", b"nuro-straggler/1 7 ../x 1.3",
                 b"nuro-straggler/1 7 gpu002 0.9", b"nuro-straggler/1 7 gpu002 nan", b"nuro-straggler/1 7 gpu002 1e9",
                 b"nuro-straggler/1 7 gpu002 1.3 x", b"nuro-straggler/1 7 gpu002 " + b"1" * 300):  # fmt: skip
        assert peerloss.parse_straggler(junk) is None, junk
    with pytest.raises(ValueError):
        peerloss.encode_straggler(7, "a b", 1.3)


def test_heartbeats_carry_throttled_gpus_and_straggler_reports_only_when_there_are_some() -> None:
    plain = hb.encode(hb.Heartbeat("gpu001", 1, 1, 1.0), KEY)
    assert b"throttled" not in plain and b"stragglers" not in plain
    beat = hb.Heartbeat("gpu001", 1, 2, 1.0, throttled=("gpu2: SM 900 MHz (SW thermal slowdown)",),
                        stragglers=((7, "gpu002", 1.3),))  # fmt: skip
    back = hb.decode(hb.encode(beat, KEY), KEY)
    assert back.throttled == beat.throttled and back.stragglers == ((7, "gpu002", 1.3),)
    too_many = tuple((j, "gpu002", 1.3) for j in range(1, 6))
    for bad in ({"stragglers": ((7, "../x", 1.3),)}, {"stragglers": ((7, "gpu002", 0.5),)},
                {"throttled": ("x" * 81,)}, {"stragglers": too_many}):  # fmt: skip
        with pytest.raises(hb.BadHeartbeat):
            hb.Heartbeat("gpu001", 1, 3, 1.0, **bad)


def test_the_agent_names_only_gpus_a_slowing_reason_holds_down() -> None:
    from nuro.healthcheck.beats import throttled_gpus
    from nuro.healthcheck.probes import GpuStatus, NodeGpuReport

    report = NodeGpuReport("fake", gpus=(
        GpuStatus(0, sm_clock_mhz=1980, throttle_reasons=("GPU idle",)),
        GpuStatus(2, sm_clock_mhz=900, throttle_reasons=("SW thermal slowdown", "applications clocks setting")),
        GpuStatus(3, throttle_reasons=("HW power brake slowdown",)),
    ))  # fmt: skip
    assert throttled_gpus(report) == ("gpu2: SM 900 MHz (SW thermal slowdown)", "gpu3: (HW power brake slowdown)")
    assert throttled_gpus(None) == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="job records are root's files (the agent refuses others')")
def test_the_agent_carries_a_straggler_report_of_its_own_jobs_user_for_a_while(tmp_path: Path) -> None:
    clock = [100.0]
    agent, _ = _agent(tmp_path, clock)
    _record(tmp_path, 41, 1001)
    assert not agent.report_straggler(41, "gpu002", 1.3, 1002)  # not its user
    assert not agent.report_straggler(40, "gpu002", 1.3, 1001)  # no such job here
    assert agent.report_straggler(41, "gpu002", 1.3, 1001)
    assert agent.beat_once().stragglers == ((41, "gpu002", 1.3),)
    clock[0] += peerloss.STRAGGLER_TTL_S + 0.1
    assert agent.beat_once().stragglers == ()


# -- the detector ------------------------------------------------------------------------------------------------

CFG = LivenessConfig(interval_s=0.25, miss_limit=4)
T0 = 1000.0


def _nodes(*names: str) -> dict[str, NodeInfo]:
    return {n: NodeInfo(name=n, state="ALLOCATED", flags=frozenset({"ALLOCATED"})) for n in names}


def _beat(node: str, seq: int, at: float, jobs: tuple[int, ...] = ()) -> Beat:
    return Beat(node, 1, seq, at, at, suspect_jobs=jobs)


def _run(silent_from: float, report_at: float | None, job_nodes: dict, until: float, beating_b: bool = False):
    """gpu001 and gpu002 beat every 0.25 s; gpu002 stops at ``silent_from`` (unless ``beating_b``); gpu001 reports
    job 9 at ``report_at``. Returns (the first DOWN action, when)."""
    state = DetectorState.fresh(T0)
    slurm = _nodes("gpu001", "gpu002", "gpu003")
    seq, t = 0, T0
    while t < until:
        t = round(t + 0.05, 3)
        beats = []
        if abs(t * 4 - round(t * 4)) < 1e-6:
            seq += 1
            beats.append(_beat("gpu003", seq, t))
            if beating_b or t < silent_from:
                beats.append(_beat("gpu002", seq, t))
            beats.append(_beat("gpu001", seq, t))
        if report_at is not None and abs(t - report_at) < 1e-6:
            beats.append(_beat("gpu001", seq + 1000, t, jobs=(9,)))
        actions, state = assess(state, beats, slurm, t, CFG, job_nodes=job_nodes)
        downs = [a for a in actions if a.kind is NodeActionKind.DOWN]
        if downs:
            return downs[0], t
    return None, t


def test_a_reported_jobs_silent_node_is_lost_after_half_the_timeout() -> None:
    kill = T0 + 5.01
    plain, plain_at = _run(kill, None, {}, T0 + 9)
    reported, rep_at = _run(kill, T0 + 5.2, {9: ("gpu001", "gpu002")}, T0 + 9)
    assert plain is not None and reported is not None and reported.node == plain.node == "gpu002"
    assert plain_at - kill > CFG.timeout_s - 0.25 and "lost a peer" not in plain.reason
    assert rep_at - kill <= CFG.suspect_timeout_s + 0.1 < plain_at - kill
    assert reported.reported_by == "gpu001" and reported.report_job == 9
    assert (
        reported.reason.startswith("nuro: no heartbeat for 0.")
        and "job 9's ranks on gpu001 lost a peer" in reported.reason
    )


def test_a_report_never_takes_down_a_node_that_keeps_beating_nor_the_reporter_nor_other_jobs_nodes() -> None:
    down, _ = _run(T0 + 5, T0 + 5.5, {9: ("gpu001", "gpu002", "gpu003")}, T0 + 9, beating_b=True)
    assert down is None
    # gpu002 silent but not in the reported job: the plain timeout applies
    down, at = _run(T0 + 5.01, T0 + 5.2, {9: ("gpu001", "gpu003")}, T0 + 9)
    assert down is not None and down.node == "gpu002" and not down.reported_by and at - (T0 + 5.01) > 0.9


def test_a_stale_report_no_longer_shortens_the_silence() -> None:
    down, at = _run(T0 + 9.01, T0 + 5.0, {9: ("gpu001", "gpu002")}, T0 + 13)  # reported 4 s before it went silent
    assert down is not None and not down.reported_by and at - (T0 + 9.01) > 0.9


def test_the_shorter_silence_is_half_the_timeout_never_under_two_beats() -> None:
    assert LivenessConfig(interval_s=0.25, miss_limit=4).suspect_timeout_s == 0.5
    assert LivenessConfig(interval_s=0.25, miss_limit=8).suspect_timeout_s == 1.0
    assert LivenessConfig(interval_s=1.0, miss_limit=3).suspect_timeout_s == 2.0


# -- progress reports (issue 30): commits and acks reach the controller through the agent, never the comment --------
@pytest.mark.skipif(os.geteuid() != 0, reason="job records are root's files (the agent refuses others')")
def test_the_agent_carries_its_jobs_progress_from_its_user_and_its_own_upload_worker(tmp_path: Path) -> None:
    clock = [100.0]
    agent, _ = _agent(tmp_path, clock)
    agent.clock = lambda: 1_800_000_000.0 + clock[0]
    _record(tmp_path, 41, 1001)
    _record(tmp_path, 42, 1001)
    assert not agent.report_progress("ack", 41, 9, "preempted", 1002)  # not its user
    assert not agent.report_progress("ckpt", 40, 9, "", 1001)  # no such job here
    assert agent.report_progress("ckpt", 41, 10, "", 1001)
    assert agent.report_progress("ckpt", 41, 5, "", 1001)  # an older step changes nothing
    agent.on_upload_commit(type("Req", (), {"job_id": "42", "step": 7})())  # root's own commit (UploadWorker)
    assert agent.report_progress("ack", 41, 12, "preempted", 1001)
    beat = agent.beat_once()
    assert beat.commits == ((41, 10, 1_800_000_100), (42, 7, 1_800_000_100))
    assert beat.acks == ((41, 12, 1_800_000_100),)
    clock[0] += hb.ACK_TTL_S + 0.1
    jobrecord.remove(tmp_path / "staging", "42")
    beat = agent.beat_once()
    assert beat.acks == () and beat.commits == ((41, 10, 1_800_000_100),)  # job 42 ended here: dropped


@pytest.mark.skipif(os.geteuid() != 0, reason="job records are root's files (the agent refuses others')")
def test_reports_are_rate_limited_per_job_and_uid_and_kick_at_most_one_beat(tmp_path: Path) -> None:
    """Item 4: a flood of reports from one job costs its own reports, and at most one early beat in all."""
    clock = [100.0]
    agent, _ = _agent(tmp_path, clock)
    _record(tmp_path, 41, 1001)
    _record(tmp_path, 43, 1003)
    rate, burst = peerloss.REPORT_RATE["job"]
    heard = sum(agent._within_rate(41, 1001) for _ in range(100))
    assert heard == burst and agent.reports_limited == 100 - burst
    assert agent._within_rate(43, 1003)  # another team's job is not limited by the flood
    clock[0] += 1.0
    assert sum(agent._within_rate(41, 1001) for _ in range(10)) == int(rate)
    kicks = 0
    for job in (41, 43):
        agent._kick.clear()
        agent.report(job, 1001 if job == 41 else 1003)
        kicks += agent._kick.is_set()
    assert kicks == 1  # two reports within KICK_EVERY_S: one early beat


def test_the_limiter_forgets_idle_keys_before_it_grows_past_its_bound() -> None:
    from nuro.healthcheck.reports import RateLimit

    now = [0.0]
    lim = RateLimit(1.0, 2.0, clock=lambda: now[0], max_keys=8)
    for uid in range(100):
        lim.allow(uid)
        now[0] += 10.0
    assert len(lim._buckets) <= 8


def test_progress_in_beats_round_trips_and_bad_entries_are_refused() -> None:
    beat = hb.Heartbeat("gpu001", 1, 2, 1.0, commits=((7, 100, 1_800_000_000),), acks=((7, 101, 1_800_000_005),))
    assert hb.decode(hb.encode(beat, KEY), KEY) == beat
    assert b"commits" not in hb.encode(hb.Heartbeat("gpu001", 1, 3, 1.0), KEY)
    too_many = tuple((j, 1, 1) for j in range(1, hb.MAX_COMMITS + 2))
    for bad in ({"commits": ((0, 1, 1),)}, {"commits": ((7, -1, 1),)}, {"acks": ((7, 1, 1.5),)},
                {"acks": ((7, True, 1),)}, {"commits": too_many}):  # fmt: skip
        with pytest.raises(hb.BadHeartbeat):
            hb.Heartbeat("gpu001", 1, 4, 1.0, **bad)


def test_a_beat_with_every_field_at_its_bound_still_fits_one_datagram() -> None:
    from nuro.healthcheck.beats import build_heartbeat

    beat, data = build_heartbeat(
        "gpu001", 1, 1, 1.0, ("x" * 200,) * 5, KEY, suspect_jobs=tuple(range(4_000_000_000, 4_000_000_008)),
        throttled=("t" * hb.MAX_THROTTLED_TEXT,) * hb.MAX_THROTTLED,
        stragglers=tuple((4_000_000_000 + i, "gpu-long-node-name-x", 99.999) for i in range(hb.MAX_STRAGGLERS)),
        commits=tuple((4_000_000_000 + i, 10**14 + i, 1_800_000_000) for i in range(hb.MAX_COMMITS)),
        acks=tuple((4_000_000_000 + i, 10**14, 1_800_000_000) for i in range(hb.MAX_ACKS)),
    )  # fmt: skip
    assert len(data) <= hb.MAX_DATAGRAM and hb.decode(data, KEY) == beat
    assert len(beat.acks) == hb.MAX_ACKS and not beat.healthy  # acks and health are never the ones dropped


@pytest.mark.skipif(os.geteuid() != 0, reason="job records are root's files (the agent refuses others')")
def test_a_commit_carries_when_its_checkpoint_was_taken_never_later_than_now(tmp_path: Path) -> None:
    """A save already under way when a preemption signal came commits after it; its time is the request's creation
    (before the signal), so the controller never takes it for the checkpoint the signal asked for."""
    clock = [100.0]
    agent, _ = _agent(tmp_path, clock)
    agent.clock = lambda: 1_800_000_100.0
    _record(tmp_path, 41, 1001)
    _record(tmp_path, 42, 1001)
    req = type("Req", (), {"job_id": "41", "step": 7, "created_at": "2027-01-15T08:00:00Z"})()  # 1_800_000_000
    agent.on_upload_commit(req)
    future = type("Req", (), {"job_id": "42", "step": 3, "created_at": "2099-01-01T00:00:00Z"})()  # a job's lie
    agent.on_upload_commit(future)
    assert agent.beat_once().commits == ((41, 7, 1_800_000_000), (42, 3, 1_800_000_100))

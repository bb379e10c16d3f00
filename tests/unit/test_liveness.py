"""The pure failure detector: loss, unhealthy, recovery, flapping back-off, restart grace, admin drains untouched."""

from __future__ import annotations

import pytest

from nuro.slurm.models import NodeInfo
from nuro.slurm_plugins.controller.liveness import (
    Beat,
    Cause,
    DetectorState,
    LivenessConfig,
    NodeActionKind,
    assess,
    held_until,
    is_ours,
)

CFG = LivenessConfig(interval_s=1.0, miss_limit=3)
T0 = 1_800_000_000.0


def node(name: str = "gpu001", state: str = "IDLE", reason: str | None = None) -> NodeInfo:
    return NodeInfo(name=name, state=state, flags=frozenset(state.split("+")), reason=reason)


class Sim:
    """A detector driven by a fake clock and a fake Slurm that takes every action as given."""

    def __init__(self, names: tuple[str, ...] = ("gpu001", "gpu002"), start: float = T0) -> None:
        self.now = start
        self.state = DetectorState.fresh(start)
        self.slurm = {n: node(n) for n in names}
        self.seq: dict[str, int] = {}
        self.log: list = []

    def beat(self, name: str, healthy: bool = True, problems: tuple[str, ...] = ()) -> Beat:
        self.seq[name] = self.seq.get(name, 0) + 1
        return Beat(name, 1, self.seq[name], self.now, self.now, healthy, problems)

    def step(self, beats: list[Beat], dt: float = 0.0, apply: bool = True) -> list:
        self.now += dt
        actions, self.state = assess(self.state, beats, self.slurm, self.now, CFG)
        if apply:
            for a in actions:
                cur = self.slurm[a.node]
                flags = set(cur.flags) - {"IDLE"}
                if a.kind is NodeActionKind.DOWN:
                    flags |= {"DOWN"}
                    reason = a.reason
                elif a.kind is NodeActionKind.DRAIN:
                    flags |= {"DRAIN"}
                    reason = a.reason
                else:
                    flags, reason = {"IDLE"}, None
                base = "DOWN" if "DOWN" in flags else "IDLE"
                state = "+".join([base, *sorted(flags - {base})])
                self.slurm[a.node] = NodeInfo(a.node, state, frozenset(state.split("+")), reason)
        self.log.extend(actions)
        return actions

    def run(self, seconds: float, beating: tuple[str, ...], healthy: bool = True) -> list:
        """Advance in 0.25 s ticks; the given nodes beat every whole second."""
        out = []
        for _ in range(int(seconds * 4)):
            t = self.now + 0.25
            beats = [self.beat(n, healthy) for n in beating] if abs(t - round(t)) < 1e-6 else []
            out += self.step(beats, 0.25)
        return out


def test_silence_for_miss_limit_intervals_takes_the_node_down_then_drains_it_with_our_reason() -> None:
    sim = Sim()
    sim.run(5, ("gpu001", "gpu002"))
    lost_at = sim.now
    acts = sim.run(4, ("gpu002",))
    assert [(a.node, a.kind) for a in acts] == [("gpu001", NodeActionKind.DOWN), ("gpu001", NodeActionKind.DRAIN)]
    down = acts[0]
    assert down.cause is Cause.LOST and down.reason.startswith("nuro: no heartbeat for 3.")
    assert down.reason.endswith(f"(last seq {sim.seq['gpu001']})")
    assert 3.0 < down.silent_s <= 3.25 + 1e-9
    # Detected within one tick after the timeout of the last beat.
    assert down.last_beat + CFG.timeout_s < lost_at + 4


def test_nodes_that_never_beat_are_not_judged() -> None:
    sim = Sim()
    assert sim.run(20, ("gpu002",)) == []


def test_restart_grace_judges_nobody_for_one_timeout_then_rebuilds_from_beats() -> None:
    sim = Sim()
    sim.slurm["gpu001"] = node("gpu001", "IDLE+DRAIN", "nuro: no heartbeat for 3.2 s (last seq 9)")
    # Within the grace: beats are folded in, nothing is decided.
    assert sim.run(2.5, ("gpu001",)) == []
    # After grace: gpu001 beats healthy and the drain is ours → resumed (soft state rebuilt from Slurm's reason).
    acts = sim.run(2, ("gpu001",))
    assert [(a.node, a.kind) for a in acts] == [("gpu001", NodeActionKind.RESUME)]


def test_unhealthy_beat_drains_with_the_agents_problems_and_recovery_resumes() -> None:
    sim = Sim()
    sim.run(4, ("gpu001",))
    acts = sim.step([sim.beat("gpu001", healthy=False, problems=("gpu3: ECC errors", "nvme full"))], 1)
    assert [(a.kind, a.reason) for a in acts] == [
        (NodeActionKind.DRAIN, "nuro: unhealthy: gpu3: ECC errors; nvme full")
    ]
    assert sim.run(3, ("gpu001",), healthy=False) == []  # no repeated drains
    acts = sim.run(3, ("gpu001",))
    assert [a.kind for a in acts] == [NodeActionKind.RESUME]


def test_revived_node_is_resumed_only_after_two_healthy_intervals() -> None:
    sim = Sim()
    sim.run(4, ("gpu001",))
    sim.run(5, ())
    assert "DOWN" in sim.slurm["gpu001"].flags
    acts = sim.run(1, ("gpu001",))
    assert acts == []
    acts = sim.run(2, ("gpu001",))
    assert [a.kind for a in acts] == [NodeActionKind.RESUME]
    assert sim.slurm["gpu001"].state == "IDLE"


@pytest.mark.parametrize(
    "reason",
    ["maintenance: swap PSU", "nuro: no heartbeat for 3.1 s (last seq 4) (admin drain: bad cable)"],
    ids=["admin-reason", "admin-mark-inside-ours"],
)
def test_an_admin_drained_node_is_never_resumed(reason: str) -> None:
    sim = Sim()
    sim.slurm["gpu001"] = node("gpu001", "IDLE+DRAIN", reason)
    acts = sim.run(20, ("gpu001",))
    assert acts == []


def test_admin_drained_node_that_dies_goes_down_with_the_admin_reason_kept_and_is_not_resumed() -> None:
    sim = Sim()
    sim.slurm["gpu001"] = node("gpu001", "MIXED+DRAIN", "swap PSU")
    sim.run(4, ("gpu001",))
    acts = sim.run(4, ())
    assert acts[0].kind is NodeActionKind.DOWN and acts[0].reason.endswith("(admin drain: swap PSU)")
    assert not is_ours(acts[0].reason)
    assert sim.run(10, ("gpu001",)) == []


def test_admin_resumes_our_node_by_hand_and_we_let_go() -> None:
    sim = Sim()
    sim.run(4, ("gpu001",))
    sim.run(4, ())
    sim.slurm["gpu001"] = node("gpu001", "IDLE")  # admin: scontrol update state=resume
    assert sim.run(10, ("gpu001",)) == []


def test_admin_redrains_our_node_with_own_reason_and_it_stays_drained() -> None:
    sim = Sim()
    sim.run(4, ("gpu001",))
    sim.run(4, ())
    sim.slurm["gpu001"] = node("gpu001", "DOWN+DRAIN", "RMA ticket 42")
    assert sim.run(10, ("gpu001",)) == []


def test_flapping_holds_the_node_with_exponential_back_off() -> None:
    sim = Sim(("gpu001",))
    sim.run(4, ("gpu001",))
    holds = []
    for _ in range(5):
        acts = sim.run(4, ())  # lost
        assert acts and acts[0].kind is NodeActionKind.DOWN
        if acts[0].cause is Cause.FLAPPING:
            assert acts[0].reason.startswith("nuro: flapping (")
            holds.append(round(sim.state.nodes["gpu001"].hold_until - sim.now))
            # Beating healthy but held: no resume before the hold ends.
            hold_end = sim.state.nodes["gpu001"].hold_until
            while sim.now < hold_end - 1:
                assert sim.run(1, ("gpu001",)) == []
        acts = sim.run(4, ("gpu001",))
        assert [a.kind for a in acts] == [NodeActionKind.RESUME]
    # Losses 1 and 2 are plain; 3, 4, 5 within 10 min are flaps with 30, 60, 120 s holds (minus the ticks since).
    assert [round(h, -1) for h in holds] == [30, 60, 120]


def test_hold_back_off_is_capped() -> None:
    assert [CFG.hold_s(n) for n in (1, 2, 3, 6, 10)] == [30, 60, 120, 900, 900]


def test_hold_deadline_is_read_back_from_the_reason() -> None:
    reason = "nuro: flapping (3 losses in 600 s), held 60 s until 2027-01-15T08:00:00Z"
    assert held_until(reason) == 1_800_000_000.0
    sim = Sim(("gpu001",))
    sim.slurm["gpu001"] = node("gpu001", "IDLE+DRAIN", reason)
    until = held_until(reason)
    sim.now = until - 30
    sim.state = DetectorState.fresh(sim.now)
    assert sim.run(25, ("gpu001",)) == []  # restarted controller honours the hold it finds in Slurm
    assert [a.kind for a in sim.run(8, ("gpu001",))] == [NodeActionKind.RESUME]


def test_refused_down_is_reissued_after_retry_s() -> None:
    sim = Sim(("gpu001",))
    sim.run(4, ("gpu001",))
    first = []
    for _ in range(16):
        first += sim.step([], 0.25, apply=False)  # Slurm refused: node stays IDLE
    assert [a.kind for a in first] == [NodeActionKind.DOWN, NodeActionKind.DRAIN]
    again = []
    for _ in range(24):
        again += sim.step([], 0.25, apply=False)
    assert [a.kind for a in again[:2]] == [NodeActionKind.DOWN, NodeActionKind.DRAIN]


def test_unknown_node_names_are_ignored() -> None:
    sim = Sim(("gpu001",))
    sim.step([Beat("nosuch", 1, 1, sim.now, sim.now)], 0.25)
    assert sim.run(10, ()) == []


def test_config_refuses_a_miss_limit_of_one() -> None:
    with pytest.raises(ValueError, match="miss_limit"):
        LivenessConfig(miss_limit=1)


def test_mass_loss_guard_declares_nobody_lost_when_most_nodes_fall_silent_together() -> None:
    names = tuple(f"gpu{i:03d}" for i in range(1, 9))
    sim = Sim(names)
    sim.run(4, names)
    assert sim.run(6, names[:3]) == []  # 5 of 8 silent at once: the controller's side, not 5 dead hosts
    assert set(sim.state.suppressed) == set(names[3:])
    sim.run(3, names)  # they were fine all along
    acts = sim.run(4, names[1:])  # one real loss is still caught
    assert [(a.node, a.kind) for a in acts] == [("gpu001", NodeActionKind.DOWN), ("gpu001", NodeActionKind.DRAIN)]


# -- monotonic silence, wall clock only for texts; per-node isolation ------------------------------------------------
def _run_two_clocks(wall_step: float) -> list:
    """Beats every second for 20 s on a monotonic clock while the wall clock steps by ``wall_step`` at 10 s."""
    mono, wall0 = 1000.0, T0
    state = DetectorState.fresh(mono)
    slurm = {"gpu001": node("gpu001"), "gpu002": node("gpu002")}
    actions = []
    for i in range(80):
        mono += 0.25
        wall = wall0 + (mono - 1000.0) + (wall_step if i >= 40 else 0.0)
        beats = [Beat(n, 1, i, wall, mono, received_wall=wall) for n in slurm] if i % 4 == 0 else []
        acts, state = assess(state, beats, slurm, mono, CFG, wall)
        actions += acts
    return actions


@pytest.mark.parametrize("step", [30.0, -30.0, 3600.0])
def test_a_wall_clock_step_declares_nobody_dead(step: float) -> None:
    assert _run_two_clocks(step) == []


def test_silence_on_the_monotonic_clock_still_counts_whatever_the_wall_clock_says() -> None:
    mono = 1000.0
    state = DetectorState.fresh(mono)
    slurm = {"gpu001": node("gpu001")}
    _, state = assess(state, [Beat("gpu001", 1, 1, T0, mono, received_wall=T0)], slurm, mono, CFG, T0)
    acts, state = assess(state, [], slurm, mono + 3.5, CFG, T0 - 600)  # wall went back 10 min: irrelevant
    assert [a.kind for a in acts] == [NodeActionKind.DOWN, NodeActionKind.DRAIN]
    assert acts[0].last_beat == T0  # records carry the wall time of the last beat


def test_the_hold_in_slurms_reason_is_read_as_wall_time_and_kept_in_monotonic_time() -> None:
    reason = "nuro: flapping (3 losses in 600 s), held 60 s until 2027-01-15T08:00:00Z"
    until = held_until(reason)
    mono = 50.0  # a monotonic clock far from Unix time
    state = DetectorState.fresh(mono - 10)
    slurm = {"gpu001": node("gpu001", "IDLE+DRAIN", reason)}
    out = []
    for i in range(40):  # 10 s of healthy beats, ending 20 s before the hold's end
        mono += 0.25
        wall = until - 30 + i * 0.25
        beats = [Beat("gpu001", 1, i, wall, mono, received_wall=wall)] if i % 4 == 0 else []
        acts, state = assess(state, beats, slurm, mono, CFG, wall)
        out += acts
    assert out == []
    assert state.nodes["gpu001"].hold_until == pytest.approx(mono + 20.25, abs=0.5)


def test_a_node_whose_record_makes_a_rule_raise_costs_only_that_node() -> None:
    class Odd(NodeInfo):
        @property
        def is_drained(self) -> bool:  # a state nobody foresaw
            raise RuntimeError("odd node record")

    sim = Sim(("gpu001", "gpu002"))
    sim.run(4, ("gpu001", "gpu002"))
    sim.slurm["gpu002"] = Odd("gpu002", "IDLE", frozenset({"IDLE"}), None)
    actions = sim.run(4, ("gpu002",))  # gpu001 falls silent; gpu002's record raises
    assert {(a.node, a.kind) for a in actions} == {("gpu001", NodeActionKind.DOWN), ("gpu001", NodeActionKind.DRAIN)}
    assert "odd node record" in sim.state.faults["gpu002"]


def test_hold_losses_keeps_silent_nodes_alive_and_lists_them() -> None:
    mono = 0.0
    state = DetectorState.fresh(mono)
    slurm = {"gpu001": node("gpu001"), "gpu002": node("gpu002")}
    _, state = assess(state, [Beat("gpu001", 1, 1, 0, 0.0), Beat("gpu002", 1, 1, 0, 0.0)], slurm, 0.0, CFG)
    acts, state = assess(state, [Beat("gpu002", 1, 2, 5, 5.0)], slurm, 5.0, CFG, hold_losses=True)
    assert acts == [] and state.suppressed == ("gpu001",)
    acts, _ = assess(state, [], slurm, 5.25, CFG)
    assert [a.node for a in acts] == ["gpu001", "gpu001"]  # once the kernel stops dropping, silence counts again


def test_an_agent_that_says_it_is_stopping_is_not_lost_while_it_restarts() -> None:
    """A clean agent stop (an upgrade, systemctl restart) announces its silence; the restarted agent's beats end it."""
    sim = Sim()
    sim.run(5, ("gpu001", "gpu002"))
    sim.seq["gpu001"] += 1
    last = Beat("gpu001", 1, sim.seq["gpu001"], sim.now, sim.now, stopping_s=15.0)
    assert sim.step([last]) == []
    assert sim.run(10, ("gpu002",)) == []  # 10 s of silence, 3 s is the timeout: still not lost
    restarted = Beat("gpu001", 2, 1, sim.now, sim.now)
    assert sim.step([restarted], 0.25) == []
    assert sim.state.nodes["gpu001"].quiet_until == 0.0  # the new agent's beat closed the quiet period
    acts = sim.run(4, ("gpu002",))  # the new agent dies without a word: an ordinary loss again
    assert [(a.node, a.kind) for a in acts] == [("gpu001", NodeActionKind.DOWN), ("gpu001", NodeActionKind.DRAIN)]
    assert "stopping" not in acts[0].reason


def test_an_agent_that_said_it_was_stopping_and_never_came_back_is_lost_after_the_silence_it_announced() -> None:
    sim = Sim()
    sim.run(5, ("gpu001", "gpu002"))
    sim.seq["gpu001"] += 1
    sim.step([Beat("gpu001", 1, sim.seq["gpu001"], sim.now, sim.now, stopping_s=600.0)])  # capped at 60 s
    assert sim.run(59.5, ("gpu002",)) == []
    acts = sim.run(1, ("gpu002",))
    assert [(a.node, a.kind) for a in acts] == [("gpu001", NodeActionKind.DOWN), ("gpu001", NodeActionKind.DRAIN)]
    assert acts[0].reason.endswith("; its agent said it was stopping)"), acts[0].reason


def test_stopping_agents_neither_trip_nor_hide_behind_the_mass_loss_guard() -> None:
    """A rolling restart of 3 agents of 5 and one real death beside it: the dead node is still declared lost."""
    names = tuple(f"gpu00{i}" for i in range(1, 6))
    sim = Sim(names)
    sim.run(5, names)
    stops = []
    for n in names[:3]:
        sim.seq[n] += 1
        stops.append(Beat(n, 1, sim.seq[n], sim.now, sim.now, stopping_s=15.0))
    sim.step(stops)
    acts = sim.run(4, ("gpu005",))  # gpu004 died; gpu001-003 are restarting
    assert [(a.node, a.kind) for a in acts] == [("gpu004", NodeActionKind.DOWN), ("gpu004", NodeActionKind.DRAIN)]
    assert sim.state.suppressed == ()


# -- straggler reports (issue 16): a job's flag, believed only where Slurm and the node's own NVML agree ------------
SLOW = ("gpu2: SM 900 MHz (SW thermal slowdown)",)


def _straggler_step(sim: Sim, jobs: dict[int, tuple[str, ...]], throttled: tuple[str, ...],
                    report: tuple[int, str, float] = (7, "gpu002", 1.4), dt: float = 1.0) -> list:  # fmt: skip
    """One tick: gpu002 beats with ``throttled``; gpu001 (the job's rank 0) beats carrying ``report``."""
    sim.seq["gpu001"] = sim.seq.get("gpu001", 0) + 1
    sim.seq["gpu002"] = sim.seq.get("gpu002", 0) + 1
    t = sim.now + dt
    beats = [Beat("gpu002", 1, sim.seq["gpu002"], t, t, throttled=throttled),
             Beat("gpu001", 1, sim.seq["gpu001"], t, t, stragglers=(report,) if report else ())]  # fmt: skip
    sim.now = t
    actions, sim.state = assess(sim.state, beats, sim.slurm, sim.now, CFG, job_nodes=jobs)
    for a in actions:  # Slurm takes them
        if a.kind is NodeActionKind.DRAIN:
            sim.slurm[a.node] = NodeInfo(a.node, "IDLE+DRAIN", frozenset({"IDLE", "DRAIN"}), a.reason)
        elif a.kind is NodeActionKind.RESUME:
            sim.slurm[a.node] = node(a.node)
    return actions


def test_a_flagged_node_whose_nvml_agrees_is_drained_as_a_straggler_until_its_clocks_recover() -> None:
    sim = Sim()
    sim.run(4, ("gpu001", "gpu002"))
    acts = _straggler_step(sim, {7: ("gpu001", "gpu002")}, SLOW)
    assert [(a.node, a.kind, a.cause) for a in acts] == [("gpu002", NodeActionKind.DRAIN, Cause.STRAGGLER)]
    assert acts[0].reason == "nuro-straggler: job 7 ran 1.40x slower here; gpu2: SM 900 MHz (SW thermal slowdown)"
    assert is_ours(acts[0].reason)
    for _ in range(40):  # still throttled, then clocks back: held until 30 s without a slowing reason
        assert _straggler_step(sim, {}, SLOW, report=None) == []
    quiet = [_straggler_step(sim, {}, (), report=None) for _ in range(int(CFG.straggler_clear_s) + 2)]
    resumed = [a for acts in quiet for a in acts]
    assert [(a.node, a.kind) for a in resumed] == [("gpu002", NodeActionKind.RESUME)]
    assert sum(1 for acts in quiet[:29] for _ in acts) == 0, "not before 30 s without a slowing reason"


def test_a_job_cannot_drain_a_node_that_is_not_its_own_or_whose_gpus_are_fine() -> None:
    sim = Sim(("gpu001", "gpu002", "gpu003"))
    sim.run(4, ("gpu001", "gpu002", "gpu003"))
    # gpu002 throttled but not the job's node (the job runs on gpu001 and gpu003)
    assert _straggler_step(sim, {7: ("gpu001", "gpu003")}, SLOW) == []
    assert sim.state.unconfirmed == ((7, "gpu002", "not a node of that job (Slurm)"),)
    # the job's node, but its NVML reports no slowing reason: the job's word alone drains nothing
    assert _straggler_step(sim, {7: ("gpu001", "gpu002")}, ()) == []
    assert sim.state.unconfirmed == ((7, "gpu002", "its GPUs report no slowing clock reason (NVML)"),)


def test_an_admin_drain_is_kept_over_a_straggler() -> None:
    sim = Sim()
    sim.run(4, ("gpu001", "gpu002"))
    sim.slurm["gpu002"] = node("gpu002", "IDLE+DRAIN", reason="rma ticket 42")
    assert _straggler_step(sim, {7: ("gpu001", "gpu002")}, SLOW) == []
    assert sim.slurm["gpu002"].reason == "rma ticket 42"


def test_a_restarted_controller_keeps_a_straggler_drain_until_the_node_has_been_clear_long_enough() -> None:
    sim = Sim()  # a fresh controller: it never saw the drain set
    reason = f"nuro-straggler: job 7 ran 1.40x slower here; {SLOW[0]}"
    sim.slurm["gpu002"] = NodeInfo("gpu002", "IDLE+DRAIN", frozenset({"IDLE", "DRAIN"}), reason)
    early = sim.run(10, ("gpu001", "gpu002"))
    assert early == [], "not resumed after a mere healthy streak"
    late = sim.run(CFG.straggler_clear_s, ("gpu001", "gpu002"))
    assert [(a.node, a.kind) for a in late] == [("gpu002", NodeActionKind.RESUME)]

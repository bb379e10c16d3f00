"""Gang first (slurm_plugins/controller/gangfirst.py): a team's quota kept for its gang that waits on it."""

from __future__ import annotations

from nuro.slurm.actions import ActionResult, UpdateQosMinGpus, render_argv
from nuro.slurm_plugins.controller import gangfirst
from nuro.slurm_plugins.controller.daemon import Controller
from nuro.slurm_plugins.controller.engine import Borrow, ControllerState, Return
from tests.unit.test_engine_builders import NOW, a_cluster, a_job, a_policy, decide

# team a (opted in) and b, 16 GPUs each on 4 × 8; each may borrow and lend 8
POLICY = (
    a_policy(32).team("a", quota=16, borrow=8, lend=8, gang_first=True).team("b", quota=16, borrow=8, lend=8).build()
)


def jobs_of(*builders):  # noqa: ANN001, ANN202 (test helper)
    return [b.build() for b in builders]


def test_a_gang_waiting_on_its_teams_quota_gets_a_floor_of_its_size_when_the_quota_frees_soon() -> None:
    running = jobs_of(a_job(1).running_on("n01").ends_in(600))  # 8 of 16 used: 16 free in 600 s
    pending = jobs_of(a_job(10).gpus(8, nodes=2).over_quota(), a_job(11).over_quota())
    assert gangfirst.holds(POLICY, pending, running, NOW) == {"g-a": 16}
    late = jobs_of(a_job(1).running_on("n01").ends_in(4000))
    assert gangfirst.holds(POLICY, pending, late, NOW) == {}, "its quota frees after drain_horizon_s: no floor"
    theirs = jobs_of(a_job(20).team("b").gpus(8, nodes=2).over_quota())
    assert gangfirst.holds(POLICY, theirs, (), NOW) == {}, "team b did not opt in"
    too_wide = jobs_of(a_job(12).gpus(8, nodes=3).over_quota())
    assert gangfirst.holds(POLICY, too_wide, (), NOW) == {}, "a gang wider than the quota never fits it"
    # Slurm rewrites a pending job's reason each pass: the floor follows the gang waiting, not one reason (live: a
    # floor cleared on a passing "Priority" let the team's next small job take the quota)
    for reason in ("Priority", "Resources", gangfirst.MIN_REASON):
        assert gangfirst.holds(POLICY, jobs_of(a_job(10).gpus(8, nodes=2).pending(reason)), running, NOW) == {
            "g-a": 16
        }, reason
    held = jobs_of(a_job(10).gpus(8, nodes=2).pending("Dependency"))
    assert gangfirst.holds(POLICY, held, running, NOW) == {}, "a gang that may not start yet keeps no floor"


def test_the_floor_is_rendered_as_sacctmgr_and_planned_only_when_it_changes() -> None:
    assert render_argv(UpdateQosMinGpus("g-a", 16)) == [
        "sacctmgr", "-i", "modify", "qos", "g-a", "set", "MinTRESPerJob=gres/gpu=16"
    ]  # fmt: skip
    assert render_argv(UpdateQosMinGpus("g-a", None))[-1] == "MinTRESPerJob=gres/gpu=-1"
    assert gangfirst.plan(POLICY, {}, None).updates == (UpdateQosMinGpus("g-a", None),), "unknown: cleared"
    assert gangfirst.plan(POLICY, {"g-a": 16}, {}).updates == (UpdateQosMinGpus("g-a", 16),)
    assert gangfirst.plan(POLICY, {"g-a": 16}, {"g-a": 16}).updates == ()


def test_a_small_job_held_by_the_floor_borrows_though_it_fits_the_quota_and_borrowed_ones_stay_out() -> None:
    plain = a_policy(32).team("a", quota=16, borrow=8, lend=8).team("b", quota=16, borrow=8, lend=8).build()
    gang_and = (a_job(1).running_on("n01").ends_in(600), a_job(10).gpus(8, nodes=2).over_quota())  # 8 + 16 > 16
    held = a_cluster().nodes(4).jobs(*gang_and, a_job(11).pending(gangfirst.MIN_REASON)).build()
    d = decide(held, POLICY, ControllerState(), NOW)
    assert [(b.job_id, b.to_qos) for b in d.of(Borrow)] == [(11, "b-a")], "it fits the quota, but the floor holds it"
    borrowed = a_cluster().nodes(4).jobs(*gang_and, a_job(12).borrowed().pending()).build()
    assert decide(borrowed, POLICY, ControllerState(), NOW).of(Return) == (), "the freed quota is the gang's"
    assert [r.job_id for r in decide(borrowed, plain, ControllerState(), NOW).of(Return)] == [12]


class _Recorder:
    def __init__(self) -> None:
        self.applied: list[UpdateQosMinGpus] = []

    def apply(self, action: UpdateQosMinGpus) -> ActionResult:
        self.applied.append(action)
        return ActionResult(action, ok=True)


def test_the_daemon_sets_the_floor_once_clears_it_when_the_gang_runs_and_on_a_clean_stop() -> None:
    backend = _Recorder()
    ctl = Controller(backend, POLICY, clock=lambda: NOW)  # type: ignore[arg-type]
    waiting = jobs_of(a_job(1).running_on("n01").ends_in(600), a_job(10).gpus(8, nodes=2).over_quota())
    assert ctl.refloor(waiting) == 1 and backend.applied == [UpdateQosMinGpus("g-a", 16)]
    assert ctl.refloor(waiting) == 0, "unchanged: nothing sent"
    started = jobs_of(a_job(10).gpus(8, nodes=2).running_on("n02", "n03"))
    assert ctl.refloor(started) == 1 and backend.applied[-1] == UpdateQosMinGpus("g-a", None)
    fresh = Controller(backend, POLICY, clock=lambda: NOW)  # type: ignore[arg-type]
    assert fresh.refloor((), clear=True) == 1 and backend.applied[-1] == UpdateQosMinGpus("g-a", None)
    none_opted = Controller(backend, a_policy(16).team("a", quota=16).build())  # type: ignore[arg-type]
    assert none_opted.refloor(waiting) == 0 and len(backend.applied) == 3

"""Hot spares: which nodes train, what replaces a lost one, how the step command names them (pure code), and the
batch step's swap decision with Slurm's answers scripted."""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.protocol import stopmarkers
from nuro.wrappers import launch, spares
from nuro.wrappers.launch_outcome import Kind, Outcome
from tests.clocks import SleepClock

ALLOC = ["gpu001", "gpu002", "gpu003", "gpu004"]


def test_the_first_nodes_train_and_the_rest_wait() -> None:
    state = spares.SpareState.start(ALLOC, 1)
    assert state.active == ["gpu001", "gpu002", "gpu003"] and state.spares == ["gpu004"]
    with pytest.raises(spares.SpareError, match="no node left to train on"):
        spares.training_nodes(["gpu001"], 1)


def test_a_lost_node_is_replaced_by_a_spare_in_allocation_order() -> None:
    state = spares.SpareState.start(ALLOC, 2)  # trains on 001-002, spares 003-004
    now = ["gpu001", "gpu003", "gpu004"]  # Slurm took gpu002 out of the job
    assert state.gone(now) == ["gpu002"]
    swap = state.replace(["gpu002"], now)
    assert swap is not None and swap.fields() == {
        "swap": 1, "lost": ["gpu002"], "spares": ["gpu003"], "spares_left": 1, "nodes": ["gpu001", "gpu003"],
    }  # fmt: skip
    assert state.active == ["gpu001", "gpu003"] and state.spares == ["gpu004"] and state.lost == ["gpu002"]
    # the second loss takes the last spare; a third finds none and leaves the state alone
    assert state.replace(["gpu003"], ["gpu001", "gpu004"]).nodes == ("gpu001", "gpu004")
    assert state.replace(["gpu004"], ["gpu001"]) is None and state.active == ["gpu001", "gpu004"]


def test_a_spare_that_left_the_allocation_is_not_used() -> None:
    state = spares.SpareState.start(ALLOC, 2)
    assert state.replace(["gpu002"], ["gpu001", "gpu004"]).spares == ("gpu004",)  # gpu003 died while idle
    assert state.replace([], ALLOC) is None


def test_spare_count_is_read_strictly() -> None:
    assert spares.spare_count({}) == 0 and spares.spare_count({"NURO_SPARE_NODES": " 2 "}) == 2
    for bad in ("-1", "two", "65", "1.5"):
        with pytest.raises(spares.SpareError, match="NURO_SPARE_NODES"):
            spares.spare_count({"NURO_SPARE_NODES": bad})
    assert spares.swap_index({"NURO_LAUNCH_SWAP": "3"}) == 3 and spares.swap_index({"NURO_LAUNCH_SWAP": "x"}) == 0


def test_the_step_command_gets_the_nodelist_after_srun() -> None:
    argv = ["srun", "--nodes=2", "--kill-on-bad-exit=1", "python", "-m", "nuro.wrappers.launch", "--", "t.py", "-w"]
    assert spares.with_nodelist(argv, ["gpu001", "gpu003"])[:4] == [
        "srun",
        "--nodelist=gpu001,gpu003",
        "--ntasks=2",
        "--nodes=2",
    ]
    assert spares.with_nodelist(["/usr/bin/srun", "x"], ["a"])[:4] == [
        "/usr/bin/srun",
        "--nodelist=a",
        "--nodes=1",
        "--ntasks=1",
    ]  # a user's bare srun: sized
    assert spares.with_nodelist(["srun", "-N", "2", "-n2", "x"], ["a", "b"])[:3] == ["srun", "--nodelist=a,b", "-N"]
    for own in (["srun", "-w", "gpu001", "x"], ["srun", "--nodelist=gpu001", "x"], ["srun", "-wgpu001", "x"]):
        with pytest.raises(spares.SpareError, match="names its own nodes"):
            spares.with_nodelist(own, ["gpu002"])
    with pytest.raises(spares.SpareError, match="srun command"):
        spares.with_nodelist(["mpirun", "x"], ["a"])


def test_verdicts_of_a_swapped_step_go_to_their_own_directory() -> None:
    base = Path("/j/launch")
    assert launch.attempt_dir(base, {"SLURM_RESTART_COUNT": "1"}) == base / "attempt-1"
    assert launch.attempt_dir(base, {"NURO_LAUNCH_SWAP": "2"}) == base / "attempt-0-swap-2"


def test_the_step_counts_its_own_nodes_not_the_jobs() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "3", "SLURM_STEP_NUM_NODES": "2", "SLURM_NODEID": "1",
           "NURO_RDZV_ADDR": "10.0.0.1", "NURO_RDZV_PORT": "29500"}  # fmt: skip
    plan = launch.plan_torchrun(env, ["t.py"], nproc_per_node=1, python="python3", local_addr="10.0.0.2",
                                error_file="/e", log_dir="/l")  # fmt: skip
    assert plan.num_nodes == 2 and "--nnodes=2" in plan.argv


def _verdict(node: int) -> Outcome:
    return Outcome(Kind.REQUEUE, 75, "lost a peer", node=node, at=1.0)


def test_the_step_swaps_only_once_slurm_took_the_silent_node_out() -> None:
    state = spares.SpareState.start(["gpu001", "gpu002", "gpu003"], 1)
    answers = iter([["gpu001", "gpu002", "gpu003"], ["gpu001", "gpu002", "gpu003"], ["gpu001", "gpu003"]])
    clock = SleepClock()
    lost, swap = launch._swap_for_lost(state, "7", [_verdict(0)], 10, job_nodes=lambda _j: next(answers),
                                       sleep=clock.sleep, clock=clock)  # fmt: skip
    assert lost == ["gpu002"] and swap is not None and swap.lost == ("gpu002",) and state.active == ["gpu001", "gpu003"]


def test_a_silent_node_that_stays_allocated_is_not_swapped(capsys: pytest.CaptureFixture[str]) -> None:
    state = spares.SpareState.start(["gpu001", "gpu002", "gpu003"], 1)
    clock = SleepClock()
    lost, swap = launch._swap_for_lost(state, "7", [_verdict(0)], 2,
                                       job_nodes=lambda _j: ["gpu001", "gpu002", "gpu003"], sleep=clock.sleep,
                                       clock=clock)  # fmt: skip
    assert lost == [] and swap is None and state.active == ["gpu001", "gpu002"] and clock.now >= 2
    assert "a launcher died, not its node" in capsys.readouterr().out


def test_a_lost_node_with_no_spare_left_is_reported_lost_for_the_requeue_path() -> None:
    """The DeepSpeed soak on 22.05: the spare was used by an earlier swap, the next node loss found none, and the
    script took the lost node's SIGKILL (137) for the training's failure: the job ended FAILED, never requeued (a
    --no-kill job is not requeued by Slurm). The lost node is named so the step returns EXIT_REQUEUE."""
    state = spares.SpareState.start(["gpu001", "gpu002", "gpu003"], 1)
    first = state.replace(["gpu002"], ["gpu001", "gpu003"])
    assert first is not None and state.spares == []
    clock = SleepClock()
    lost, swap = launch._swap_for_lost(state, "7", [], 5, job_nodes=lambda _j: ["gpu001"], sleep=clock.sleep,
                                       clock=clock)  # fmt: skip
    assert lost == ["gpu003"] and swap is None


def test_stopped_ranks_are_the_rank_markers_with_ascii_numbers(tmp_path: Path) -> None:
    for name in ("rank-0", "rank-12", "rank-²", "rank-x", "move"):  # "²" passes str.isdigit, then fails int()
        (tmp_path / name).write_text("")
    assert stopmarkers.stopped_ranks(tmp_path) == {0, 12} and stopmarkers.stopped_ranks(None) == frozenset()


def test_a_move_stop_names_the_node_the_step_leaves(tmp_path: Path) -> None:
    (tmp_path / "move").write_text("gpu002\n")
    assert stopmarkers.move_request(tmp_path) == "gpu002"
    (tmp_path / "move").write_text("../etc\n")
    assert stopmarkers.move_request(tmp_path) is None and stopmarkers.move_request(tmp_path / "none") is None
    state = spares.SpareState.start(["gpu001", "gpu002", "gpu003"], 1)
    stopped = [Outcome(Kind.STOPPED, 75, "stop", node=0, at=1.0, details={"move_from": "gpu002"}),
               Outcome(Kind.STOPPED, 75, "stop", node=1, at=1.0)]  # fmt: skip
    assert spares.move_from(stopped, state) == "gpu002"
    # only a node of the step, only from a restart verdict (the guard's stop), never a failure
    assert spares.move_from([Outcome(Kind.STOPPED, 75, "s", node=0, details={"move_from": "gpu003"})], state) is None
    assert spares.move_from([Outcome(Kind.FAILURE, 1, "s", node=0, details={"move_from": "gpu002"})], state) is None


def _v(kind: Kind, node: int, **details: str) -> Outcome:
    return Outcome(kind, 75 if kind is not Kind.FAILURE else 1, "x", node=node, at=1.0, details=details)


@pytest.mark.parametrize(
    ("status", "found", "signalled", "with_spares", "want"),
    [
        (0, [_v(Kind.DONE, 0), _v(Kind.DONE, 1)], False, True, spares.Next.DONE),  # trained to the end
        (75, [_v(Kind.STOPPED, 0, move_from="gpu002")], False, True, spares.Next.MOVE),  # a straggler stop
        (75, [_v(Kind.STOPPED, 0, move_from="gpu002")], True, True, spares.Next.DONE),  # preempted: leave, never swap
        (75, [_v(Kind.REQUEUE, 0)], False, True, spares.Next.FIND_LOST),  # node 1 never reported
        (137, [], False, True, spares.Next.FIND_LOST),  # srun ended the step before any verdict
        (1, [_v(Kind.FAILURE, 0), _v(Kind.REQUEUE, 1)], False, True, spares.Next.DONE),  # the training's own failure
        (75, [_v(Kind.REQUEUE, 0)], False, False, spares.Next.AWAIT_LOSS),  # no spares: Slurm's verdict decides
    ],
)
def test_after_a_step_the_decision_is_pure(status: int, found: list, signalled: bool, with_spares: bool,
                                           want: spares.Next) -> None:  # fmt: skip
    """run_step's choices as one pure decision (issue 33): done, swap a straggler, find a lost node, await Slurm."""
    state = spares.SpareState.start(["gpu001", "gpu002", "gpu003"], 1) if with_spares else None
    got = spares.after_step(status, found, 2, state=state, signalled=signalled, stopping=False, in_job=True,
                            wait_s=5.0)  # fmt: skip
    assert got.next is want, got
    assert (got.node == "gpu002") is (want is spares.Next.MOVE)


def test_a_loss_no_spare_covers_is_the_requeue_path() -> None:
    assert spares.after_lost(137, ["gpu002"]) == 75 and spares.after_lost(137, []) == 137

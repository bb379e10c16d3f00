"""The outcome classifier and the step fold over error texts captured from real torchrun 2.13 runs on this machine.

``tests/fixtures/launch/<case>-node<N>.*`` were captured with two ``torchrun --nnodes=2 --rdzv-backend=c10d`` agents
on 127.0.0.1 running ``tests/fixtures/train/tiny_ddp.py`` (gloo): ``.out`` is the agent's stdout+stderr (frame dumps
and step lines dropped), ``.err.json`` its TORCHELASTIC_ERROR_FILE, ``.worker0.err.json`` the worker's error file,
``.rc`` torchrun's exit status. Cases: ``raise`` (rank 1 raises ValueError at step 3), ``killworker`` (SIGKILL of
node 1's worker), ``killnode`` (SIGKILL of node 1's agent and worker; that agent hosted the c10d store).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.wrappers.launch import collect_evidence
from nuro.wrappers.launch_outcome import (
    EXIT_REQUEUE,
    Evidence,
    Kind,
    Outcome,
    WorkerFailure,
    classify,
    failures_from_summary,
    fold,
    is_comm_error,
    last_exception_line,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "launch"


def captured(case: str, node: int, tmp_path: Path, stop: str | None = None) -> Evidence:
    """Lay the captured files out as torchrun left them and read them the way nuro-launch does."""
    stem = FIX / f"{case}-node{node}"
    logs = tmp_path / "logs"
    worker = logs / "run_x" / "attempt_0" / "0"
    worker.mkdir(parents=True)
    if stem.with_suffix(".worker0.err.json").exists():
        (worker / "error.json").write_text(stem.with_suffix(".worker0.err.json").read_text())
    agent = tmp_path / "agent-error.json"
    if stem.with_suffix(".err.json").exists():
        agent.write_text(stem.with_suffix(".err.json").read_text())
    rc = int(stem.with_suffix(".rc").read_text())
    rc = -(rc - 128) if rc > 128 else rc  # the shell's 137 is Popen's -9
    return collect_evidence(rc, stem.with_suffix(".out").read_text(), agent, logs, stop)


CASES = {
    # (case, node): (kind, exit, text in why)
    ("raise", 0): (Kind.FAILURE, 1, "ValueError: tiny_ddp: deliberate bug at step 3 on rank 1"),
    ("raise", 1): (Kind.REQUEUE, EXIT_REQUEUE, "Connection closed by peer"),
    ("killworker", 0): (Kind.REQUEUE, EXIT_REQUEUE, "Connection closed by peer"),
    ("killworker", 1): (Kind.REQUEUE, EXIT_REQUEUE, "killed by SIGKILL"),
    ("killnode", 0): (Kind.REQUEUE, EXIT_REQUEUE, "RendezvousConnectionError"),
    ("killnode", 1): (Kind.REQUEUE, EXIT_REQUEUE, "torchrun was killed by SIGKILL"),
}


@pytest.mark.parametrize("case,node", sorted(CASES), ids=[f"{c}-node{n}" for c, n in sorted(CASES)])
def test_captured_failures_classify(case: str, node: int, tmp_path: Path) -> None:
    kind, code, text = CASES[(case, node)]
    got = classify(captured(case, node, tmp_path))
    assert (got.kind, got.exit_code) == (kind, code), got
    assert text in got.why


def test_the_summary_parser_reads_rank_exit_code_and_signal(tmp_path: Path) -> None:
    text = (FIX / "killworker-node1.out").read_text()
    assert failures_from_summary(text) == [WorkerFailure(-9, "Signal 9 (SIGKILL) received by PID 28382", 1)]
    raised = failures_from_summary((FIX / "raise-node0.out").read_text())
    assert [(f.rank, f.exitcode) for f in raised] == [(1, 1)]
    assert raised[0].message.startswith("ValueError: tiny_ddp: deliberate bug")


def test_a_stop_signal_beats_secondary_errors_but_not_a_user_bug(tmp_path: Path) -> None:
    stopped = classify(captured("killworker", 0, tmp_path / "a", stop="TERM"))
    assert (stopped.kind, stopped.exit_code) == (Kind.STOPPED, EXIT_REQUEUE)
    bug = classify(captured("raise", 0, tmp_path / "b", stop="TERM"))
    assert (bug.kind, bug.exit_code) == (Kind.FAILURE, 1)


@pytest.mark.parametrize(
    "ev,want",
    [
        (Evidence(0), (Kind.DONE, 0)),
        (Evidence(1, (WorkerFailure(75, "SystemExit: 75", 0),)), (Kind.REQUEUE, 75)),
        (Evidence(1, (WorkerFailure(3, "", 0),)), (Kind.FAILURE, 3)),
        (Evidence(1, (WorkerFailure(-15, "Signal 15 (SIGTERM) received by PID 7", 0),)), (Kind.REQUEUE, 75)),
        (
            Evidence(1, (WorkerFailure(1, "RuntimeError: Timed out waiting 60000ms for recv operation", 0),)),
            (Kind.REQUEUE, 75),
        ),  # fmt: skip
        (
            Evidence(
                1,
                (WorkerFailure(1, "KeyError: 'lr'", 0), WorkerFailure(1, "RuntimeError: Connection reset by peer", 1)),
            ),
            (Kind.FAILURE, 1),
        ),  # fmt: skip
        (Evidence(1, (), tail="torch.distributed.DistNetworkError: Broken pipe"), (Kind.REQUEUE, 75)),
        (Evidence(2), (Kind.FAILURE, 2)),
        (Evidence(75), (Kind.REQUEUE, 75)),  # a stand-in torchrun that passes its worker's status through
        (Evidence(1, (WorkerFailure(-6, "Signal 6 (SIGABRT) received by PID 9", 0),)), (Kind.FAILURE, 134)),
        (
            Evidence(
                1,
                (WorkerFailure(-6, "Signal 6 (SIGABRT) received by PID 9", 0),),
                tail="Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)",
            ),
            (Kind.REQUEUE, 75),
        ),  # fmt: skip
        # captured on the dev cluster: srun's --kill-on-bad-exit TERM reached the agent after node 1's bug
        (Evidence(1, (WorkerFailure(1, "SignalException: Process 13244 got signal: 15"),), "TERM"), (Kind.STOPPED, 75)),
        (Evidence(1, (WorkerFailure(1, "SignalException: Process 13244 got signal: 15"),)), (Kind.STOPPED, 75)),
        (Evidence(-9), (Kind.REQUEUE, 75)),
    ],
    ids=[
        "done",
        "guard-75",
        "user-exit-3",
        "sigterm-worker",
        "gloo-timeout",
        "bug-beats-comm",
        "store-lost",
        "torchrun-usage-error",
        "launched-command-75",
        "abort-is-a-crash",
        "nccl-watchdog-abort",
        "agent-terminated",
        "agent-signalled",
        "torchrun-killed",
    ],  # fmt: skip
)
def test_classify_rules(ev: Evidence, want: tuple[Kind, int]) -> None:
    got = classify(ev)
    assert (got.kind, got.exit_code) == want, got


def test_comm_patterns_do_not_match_ordinary_errors() -> None:
    for text in ("ValueError: bad shape", "KeyError: 'lr'", "RuntimeError: CUDA out of memory", "AssertionError"):
        assert not is_comm_error(text)
    assert is_comm_error("RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:7596")
    assert last_exception_line("Traceback (most recent call last):\n  File x\nValueError: no\n\n") == "ValueError: no"


def V(kind: Kind, code: int, node: int, at: float) -> Outcome:  # noqa: N802 - a builder
    return Outcome(kind, code, f"{kind.value} on {node}", node=node, at=at)


@pytest.mark.parametrize(
    "verdicts,srun_rc,want",
    [
        ([V(Kind.DONE, 0, 0, 1), V(Kind.DONE, 0, 1, 1)], 0, 0),
        ([V(Kind.REQUEUE, 75, 1, 1)], 137, 75),  # survivor killed by --kill-on-bad-exit before it reported
        ([V(Kind.REQUEUE, 75, 1, 1), V(Kind.STOPPED, 75, 0, 2)], 137, 75),
        ([V(Kind.REQUEUE, 75, 1, 1), V(Kind.FAILURE, 1, 0, 2)], 75, 1),  # the user's bug wins over its consequence
        ([V(Kind.FAILURE, 3, 1, 2), V(Kind.FAILURE, 1, 0, 1)], 3, 1),  # the earliest failure is the root cause
        ([V(Kind.DONE, 0, 0, 1)], 137, 75),  # node 1 vanished without a word
        ([], 0, 0),
        ([], 2, 2),  # nuro-launch could not even start: srun's status stands
    ],
    ids=[
        "all-done",
        "requeue-vs-killed",
        "requeue-and-stopped",
        "bug-wins",
        "earliest-failure",
        "silent-node",
        "no-verdicts-ok",
        "no-verdicts-error",
    ],  # fmt: skip
)
def test_fold(verdicts: list[Outcome], srun_rc: int, want: int) -> None:
    assert fold(verdicts, srun_rc, num_nodes=2)[0] == want


def test_outcome_round_trips_through_json() -> None:
    o = Outcome(Kind.REQUEUE, 75, "lost a peer", node=3, at=12.5, details={"torchrun_rc": 1})
    assert Outcome.from_json(o.to_json()) == o


def test_a_worker_that_checkpointed_and_then_aborted_at_teardown_is_restart_me(tmp_path: Path) -> None:
    """Seen in CI: the guard committed, acked and was exiting 75, then gloo's teardown aborted the process (134).
    Its marker in the stop dir makes the node's verdict "restart me"; without one, the same crash is a failure."""
    crash = WorkerFailure(-6, "Signal 6 (SIGABRT) received by PID 77", 1)
    assert classify(Evidence(1, (crash,), stopped_ranks=frozenset({1}))).kind is Kind.REQUEUE
    assert classify(Evidence(1, (crash,), stopped_ranks=frozenset({1}))).exit_code == 75
    assert classify(Evidence(1, (crash,))).kind is Kind.FAILURE  # no marker: a crash like any other
    other = WorkerFailure(-6, "Signal 6 (SIGABRT) received by PID 78", 0)
    assert classify(Evidence(1, (crash, other), stopped_ranks=frozenset({1}))).kind is Kind.FAILURE  # rank 0 did not

    stops = tmp_path / "stops"
    stops.mkdir()
    (stops / "rank-1").write_text("committed\n")
    (stops / "rank-x").write_text("junk\n")
    ev = collect_evidence(1, "", tmp_path / "none.json", tmp_path / "logs", None, stops)
    assert ev.stopped_ranks == frozenset({1})


def test_the_guard_leaves_its_marker_where_the_launcher_looks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from nuro.protocol.stopmarkers import mark_stopped

    monkeypatch.setenv("NURO_LAUNCH_STOP_DIR", str(tmp_path / "stops"))
    mark_stopped(3)
    assert (tmp_path / "stops" / "rank-3").read_text() == "committed\n"
    monkeypatch.delenv("NURO_LAUNCH_STOP_DIR")
    mark_stopped(4)  # outside nuro-launch: nothing to tell, nothing written
    assert not (tmp_path / "stops" / "rank-4").exists()


@pytest.mark.parametrize(
    ("status", "nodes_reported", "num_nodes", "want"),
    [
        (75, [1], 2, True),  # the survivor said "lost a peer", the other node never reported: likely a node loss
        (75, [0, 1], 2, False),  # every node reported: a process died, not a node; the script requeues at once
        (75, [1, 1], 3, True),  # a node reporting twice still leaves one silent
        (1, [1], 2, False),  # a failure is never requeued by anyone
        (0, [0], 2, False),
        (75, [], 1, False),  # one node: the batch script died with it, or it lives and nothing was lost
    ],
)
def test_a_restart_with_a_silent_node_waits_for_slurms_node_verdict(status, nodes_reported, num_nodes, want) -> None:
    from nuro.wrappers.launch_outcome import awaits_node_loss

    verdicts = [V(Kind.REQUEUE, 75, n, 1) for n in nodes_reported]
    assert awaits_node_loss(status, verdicts, num_nodes) is want


def test_a_lost_peer_raised_inside_a_ddp_comm_hook_is_a_restart_not_the_users_failure() -> None:
    # rank 0's stderr in CI (Slurm 26.05, the spare e2e test): gloo's error came out of StragglerWatch's all-reduce
    # hook, every line prefixed "[rank0]: " and followed by torch's "At:" frame lists
    text = (FIX / "hook-peer-loss.stderr").read_text()
    line = last_exception_line(text)
    assert line.startswith("RuntimeError: Got the following error when running the callback") and is_comm_error(line)
    got = classify(Evidence(torchrun_rc=1, failures=(WorkerFailure(1, line, 0),), tail=text))
    assert (got.kind, got.exit_code) == (Kind.REQUEUE, 75), got

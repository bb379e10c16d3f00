"""PreemptionGuard: single process (real signals, no process group), and two real gloo ranks on CPU agreeing on
one stop step when only one of them was signalled. The ack and the exit are injected; nothing touches Slurm."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from nuro.wrappers.sdk.preemption import GuardNotStartedError, PreemptionGuard, StopReason
from nuro.wrappers.sdk.runenv import RunEnv, RunEnvError
from tests.gloo import run_two_ranks


class Exited(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def _exit(code: int) -> None:
    raise Exited(code)


@pytest.fixture
def acks() -> list[tuple[int, StopReason]]:
    return []


@pytest.fixture
def guard(acks):
    g = PreemptionGuard(env=RunEnv(job_id=42), ack_fn=lambda step, why, env: acks.append((step, why)), exit_fn=_exit)
    g.start()
    yield g
    g.close()


def test_a_signal_only_sets_a_flag_and_the_next_check_stops(guard: PreemptionGuard) -> None:
    assert not guard.should_stop(0)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert guard.local_reason == StopReason.PREEMPTED and guard.reason == StopReason.NONE
    assert guard.should_stop(1) and guard.stop_step == 1 and guard.reason == StopReason.PREEMPTED
    assert guard.should_stop(2)  # sticky


def test_the_time_limit_signal_is_a_stop_too_and_preemption_outranks_it(guard: PreemptionGuard) -> None:
    os.kill(os.getpid(), signal.SIGUSR2)
    assert guard.local_reason == StopReason.TIME_LIMIT
    os.kill(os.getpid(), signal.SIGUSR1)
    os.kill(os.getpid(), signal.SIGUSR2)
    assert guard.local_reason == StopReason.PREEMPTED


def test_check_every_defers_the_decision_to_the_next_check_step(acks) -> None:
    with PreemptionGuard(check_every=5, env=RunEnv(), ack_fn=lambda *a: None, exit_fn=_exit) as g:
        g.request_stop(StopReason.TIME_LIMIT)
        assert [g.should_stop(s) for s in range(1, 6)] == [False, False, False, False, True]
        assert g.stop_step == 5


def test_checkpoint_and_exit_acks_once_committed_and_exits_75(guard: PreemptionGuard, acks) -> None:
    guard.request_stop()
    assert guard.should_stop(7)
    with pytest.raises(Exited) as ex:
        guard.checkpoint_and_exit(lambda: True, 7)
    assert ex.value.code == 75 and acks == [(7, StopReason.PREEMPTED)]


@pytest.mark.parametrize("save", [lambda: False, lambda: 1 / 0], ids=["not-committed", "raised"])
def test_an_uncommitted_checkpoint_is_never_acked_but_still_exits_75(guard: PreemptionGuard, acks, save) -> None:
    guard.request_stop()
    guard.should_stop(3)
    with pytest.raises(Exited) as ex:
        guard.checkpoint_and_exit(save, 3)
    assert ex.value.code == 75 and acks == []


def test_only_rank_0_acks_and_a_failed_ack_still_exits(acks) -> None:
    g = PreemptionGuard(env=RunEnv(rank=1, world_size=2), ack_fn=lambda *a: acks.append(a), exit_fn=_exit).start()
    try:
        with pytest.raises(Exited):
            g.checkpoint_and_exit(lambda: True, 1)  # no process group: this rank decides alone
        assert acks == []
    finally:
        g.close()

    def broken(*_: object) -> None:
        raise RuntimeError("scontrol: timed out")

    g0 = PreemptionGuard(env=RunEnv(job_id=1), ack_fn=broken, exit_fn=_exit).start()
    try:
        with pytest.raises(Exited):
            g0.checkpoint_and_exit(lambda: True, 1)
    finally:
        g0.close()


def test_misuse_is_named() -> None:
    g = PreemptionGuard(env=RunEnv())
    with pytest.raises(GuardNotStartedError, match="rank 0 before start"):
        g.should_stop(0)
    with pytest.raises(ValueError, match="check_every=0"):
        PreemptionGuard(check_every=0, env=RunEnv())
    with pytest.raises(ValueError, match="unknown signal 'BOGUS'"):
        PreemptionGuard(env=RunEnv(preempt_signal="BOGUS"))


def test_runenv_reads_slurm_torchrun_and_nuro_variables() -> None:
    env = RunEnv.from_env({
        "NURO_TEAM": "vision", "NURO_RUN_NAME": "r1", "SLURM_JOB_ID": "17", "SLURM_RESTART_COUNT": "2",
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "2", "NURO_STAGING_DIR": "/nvme/17", "NURO_PG_TIMEOUT_S": "30",
        "NURO_PREEMPT_SIGNAL": "SIGUSR1",
    })  # fmt: skip
    assert (env.team, env.run_name, env.job_id, env.restart_count) == ("vision", "r1", 17, 2)
    assert (env.rank, env.world_size, env.local_rank, env.node_rank, env.num_nodes) == (3, 4, 1, 1, 2)
    assert env.staging_dir == "/nvme/17" and env.pg_timeout.total_seconds() == 30 and env.preempt_signal == "USR1"
    assert not env.is_rank0 and env.is_distributed
    bare = RunEnv.from_env({})
    assert (bare.job_id, bare.rank, bare.world_size, bare.pg_timeout_s, bare.exit_requeue) == (None, 0, 1, 60.0, 75)
    with pytest.raises(RunEnvError, match="RANK=5 is outside WORLD_SIZE=2"):
        RunEnv.from_env({"RANK": "5", "WORLD_SIZE": "2"})


TWO_RANKS = textwrap.dedent("""
    import os, signal, sys, time
    import torch.distributed as dist
    from nuro.wrappers.sdk.preemption import PreemptionGuard
    from nuro.wrappers.sdk.runenv import RunEnv
    env = RunEnv.from_env()
    acks = []
    g = PreemptionGuard(env=env, ack_fn=lambda s, why, e: acks.append(s), exit_fn=lambda c: None).start()
    dist.init_process_group("gloo", timeout=env.pg_timeout)
    t0 = time.perf_counter()
    for step in range(200):                      # cost of the agreement with nobody signalled
        g.should_stop(step)
    per_step_us = (time.perf_counter() - t0) / 200 * 1e6
    for step in range(200, 10000):
        if env.rank == 1 and step == 230:
            os.kill(os.getpid(), signal.SIGUSR1)   # only rank 1 is signalled
        if g.should_stop(step):
            break
    try:
        g.checkpoint_and_exit(lambda: True, step)  # destroys the group: exiting with a live gloo group aborts
    except SystemExit:
        pass
    print(f"rank={env.rank} stop={step} reason={g.reason.label} acks={acks} per_step_us={per_step_us:.0f}", flush=True)
""")


def test_two_gloo_ranks_stop_at_the_same_step_when_only_one_was_signalled(tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(TWO_RANKS)
    lines = run_two_ranks(script, timeout_s=120)
    stops = {line.split()[1] for line in lines}
    assert stops == {"stop=230"}, lines  # both ranks, the signalled one's step
    assert "reason=preempted acks=[230]" in lines[0] and "acks=[]" in lines[1]
    print("guard agreement cost per step (gloo, 2 CPU ranks):", [line.split()[-1] for line in lines])

"""Issue 30: a job's progress reaches the controller through the node agents' beats; the reclaim never waits on
room in the job's comment."""

from __future__ import annotations

import os
import time
from pathlib import Path

from nuro.protocol import heartbeat as hb
from nuro.slurm_plugins.controller.cycle import ControllerState
from nuro.slurm_plugins.controller.decisions import Requeue
from nuro.slurm_plugins.controller.engine import decide as engine_decide
from nuro.slurm_plugins.controller.engine import rebuild_state
from nuro.slurm_plugins.controller.heartbeats import HeartbeatReceiver
from nuro.slurm_plugins.controller.progress import Progress, ProgressBook, ProgressFile
from tests.unit.test_engine_builders import NOW, a_cluster, a_job, a_policy, decide

MASTER = b"m" * 32


def test_the_receiver_notes_each_beats_commits_and_acks() -> None:
    book = ProgressBook()
    rx = HeartbeatReceiver("127.0.0.1", 0, MASTER, progress=book)
    try:
        key = hb.node_key(MASTER, "gpu001")
        beat = hb.Heartbeat("gpu001", 1, 1, time.time(), commits=((7, 100, 1_000),), acks=((7, 101, 1_005),))
        assert rx.handle(hb.encode(beat, key), "127.0.0.1") is not None
        later = hb.Heartbeat("gpu002", 1, 1, time.time(), commits=((7, 90, 900),))  # an older step
        rx.handle(hb.encode(later, hb.node_key(MASTER, "gpu002")), "127.0.0.1")
    finally:
        rx._sock.close()
    p = book.view()[7]
    assert (p.commit_step, p.commit_at, p.ack_step, p.ack_at) == (100, 1_000.0, 101, 1_005.0)
    assert p.nodes == {"gpu001", "gpu002"}


def test_the_book_is_published_to_a_root_only_file_a_policy_loop_reads(tmp_path: Path) -> None:
    book = ProgressBook()
    book.note("gpu001", [(7, 100, 1_000)], [])
    out = ProgressFile(tmp_path / "state")
    assert out.publish(book) and not out.publish(book)  # unchanged: not written again
    assert os.stat(out.path).st_mode & 0o777 == 0o600
    back = ProgressFile(tmp_path / "state").view()[7]
    assert (back.commit_step, back.commit_at, back.nodes) == (100, 1_000.0, {"gpu001"}) and back == book.view()[7]
    out.path.write_text("garbage")
    assert ProgressFile(tmp_path / "state").view() == {}


def _victim():
    """Borrower 3 on n01 (signalled 10 s ago for guaranteed job 5) and its claimant."""
    victim = a_job(3).team("a").borrowed().gpus(8).running_on("n01").signalled_s_ago(10, for_job=5)
    claimant = a_job(5).team("b").gpus(8).pending("QOSGrpGRES")
    return victim, claimant


def test_only_the_jobs_own_nodes_are_believed_whatever_another_node_reports() -> None:
    """A node's key speaks for its own jobs: gpu009 (a compromised root, a bug) reporting a fresher commit and an
    ack for a job of gpu001 changes nothing of what the engine believes about it."""
    book = ProgressBook()
    book.note("gpu001", [(7, 100, 1_000)], [])
    book.note("gpu009", [(7, 900, 2_000)], [(7, 900, 2_000)])
    p = book.view()[7]
    own = p.restricted_to(["gpu001", "gpu002"])
    assert (own.commit_step, own.commit_at, own.ack_at) == (100, 1_000.0, None)
    assert p.restricted_to(["gpu003"]) is None


def test_an_ack_from_the_victims_node_requeues_it_at_once_one_from_elsewhere_does_not() -> None:
    policy = a_policy(8).team("a", quota=0, borrow=8).team("b", quota=8).build()
    victim, claimant = _victim()
    snap = a_cluster().nodes(1).jobs(victim, claimant).build()
    state = rebuild_state(snap, {3: NOW - 10})
    acked = {3: Progress(None, None, 120, NOW - 2, frozenset({"n01"}))}
    (req,) = engine_decide(snap, policy, state, NOW, acked).of(Requeue)
    assert req.job_id == 3 and req.acked
    forged = {3: Progress(None, None, 120, NOW - 2, frozenset({"n02"}))}  # a node the job does not run on
    assert not engine_decide(snap, policy, state, NOW, forged).of(Requeue)


def test_a_commit_after_the_signal_is_the_ack_and_a_full_comment_changes_nothing() -> None:
    policy = a_policy(8).team("a", quota=0, borrow=8).team("b", quota=8).build()
    victim, claimant = _victim()
    snap = a_cluster().nodes(1).jobs(victim.ckpt_age_s(3, step=200), claimant).build()
    (req,) = decide(snap, policy, ControllerState(), NOW).of(Requeue)
    assert req.acked and "committed a checkpoint at step 200" in req.reason
    filled = a_job(3).team("a").borrowed().gpus(8).running_on("n01").build()
    assert len(filled.comment) < 1024  # the engine never reads it: its user may fill it to Slurm's cap

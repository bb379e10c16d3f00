"""Models and field decoders: frozen snapshot lookups, node predicates, GRES/TRES/exit-status decoding."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from nuro.slurm import ClusterSnapshot, JobInfo, JobPhase, NodeInfo, PartitionInfo
from nuro.slurm._fields import (
    decode_exit_pair,
    decode_wait_status,
    epoch_to_dt,
    gpu_count_from_gres,
    gpus_from_tres,
    node_state_text,
)


def job(job_id: int, phase: JobPhase = JobPhase.RUNNING) -> JobInfo:
    return JobInfo(job_id=job_id, name=f"j{job_id}", user="u", state=phase.value, phase=phase)


def node(name: str, state: str = "IDLE", gpus: int = 8, alloc: int = 0) -> NodeInfo:
    return NodeInfo(name=name, state=state, flags=frozenset(state.split("+")), gpus_total=gpus, gpus_alloc=alloc)


def test_snapshot_is_frozen_and_indexed() -> None:
    snap = ClusterSnapshot(
        nodes=(node("gpu001"), node("gpu002", "MIXED", alloc=4)),
        jobs=(job(1), job(2, JobPhase.PENDING)),
        partitions=(PartitionInfo(name="gpu", default=True),),
        taken_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert snap.node("gpu002").gpus_free == 4 and snap.job("2").phase is JobPhase.PENDING
    assert snap.job("x") is None and snap.partition("gpu").default
    assert snap.jobs_in(JobPhase.PENDING) == (snap.job(2),)
    assert snap.gpus_total == 16
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.jobs = ()  # type: ignore[misc]
    what_if = snap.without_jobs([1])
    assert what_if.job(1) is None and what_if.job(2) is not None and snap.job(1) is not None


@pytest.mark.parametrize(
    ("state", "drained", "down", "schedulable"),
    [
        ("IDLE", False, False, True),
        ("MIXED", False, False, True),
        ("IDLE+DRAIN", True, False, False),
        ("MIXED+DRAIN", True, False, False),
        ("DOWN+NOT_RESPONDING", False, True, False),
        ("IDLE+NOT_RESPONDING", False, True, False),
        ("IDLE+MAINTENANCE", False, False, False),
    ],
)
def test_node_predicates(state: str, drained: bool, down: bool, schedulable: bool) -> None:
    n = node("n", state)
    assert (n.is_drained, n.is_down, n.is_schedulable) == (drained, down, schedulable)
    assert n.base_state == state.split("+")[0]


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("gpu:8", 8),
        ("gpu:a100:8(S:0-1)", 8),
        ("gres:gpu:8", 8),  # 22.05 tres_per_node
        ("gres/gpu:4", 4),
        ("gres/gpu=2", 2),
        ("gpu:(null):0(IDX:N/A)", 0),
        ("gpu:2(IDX:0-1)", 2),
        ("gpu", 1),
        ("gpu:a100", 1),
        ("gpu:4,shard:8", 4),
        ("shard:8", 0),
        ("", 0),
        ("(null)", 0),
        (None, 0),
    ],
)
def test_gpu_count_from_gres(text: str | None, want: int) -> None:
    assert gpu_count_from_gres(text) == want


def test_gpus_from_tres() -> None:
    assert gpus_from_tres("cpu=2,mem=125G,node=2,billing=2,gres/gpu=16") == 16
    assert gpus_from_tres("cpu=1,gres/gpu:a100=4") == 4
    assert gpus_from_tres("cpu=1") == 0 and gpus_from_tres(None) == 0


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        (0, (0, None)),
        (768, (3, None)),
        (15, (None, 15)),
        (9, (None, 9)),
        (None, (None, None)),
        (0xFFFFFFFE, (None, None)),
    ],
)
def test_decode_wait_status(raw: int | None, want: tuple[int | None, int | None]) -> None:
    assert decode_wait_status(raw) == want


def test_decode_exit_pair_and_times() -> None:
    assert decode_exit_pair("3:0") == (3, None) and decode_exit_pair("0:15") == (0, 15)
    assert decode_exit_pair("") == (None, None)
    assert epoch_to_dt(0) is None and epoch_to_dt(None) is None and epoch_to_dt(0xFFFFFFFF) is None
    assert epoch_to_dt(1796015378) == datetime.fromtimestamp(1796015378, tz=UTC)
    assert epoch_to_dt({"set": True, "infinite": False, "number": 10}) == datetime.fromtimestamp(10, tz=UTC)
    assert node_state_text("mixed", ["DRAIN"]) == "MIXED+DRAIN" and node_state_text("idle", []) == "IDLE"

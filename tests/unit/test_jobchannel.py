"""The job's side of the progress channel (``nuro-job``): reports reach this node's agent socket, never the comment."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nuro.protocol import peerloss
from nuro.wrappers import jobchannel


@pytest.fixture
def agent_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A datagram socket where this node's agent would listen (``peerloss.socket_path``)."""
    monkeypatch.setenv("NURO_AGENT_SOCKET_DIR", str(tmp_path))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu001")
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(peerloss.socket_path(tmp_path, "gpu001")))
    sock.settimeout(2)
    yield sock
    sock.close()


def test_ckpt_and_ack_are_reports_to_the_node_agent(agent_socket: socket.socket) -> None:
    jobchannel.record_checkpoint(58)
    jobchannel.acknowledge_preemption(58, why="preempted")
    got = [peerloss.parse_progress(agent_socket.recv(512)) for _ in range(2)]
    assert got == [("ckpt", 8, 58, ""), ("ack", 8, 58, "preempted")]


def test_without_an_agent_the_job_is_told_what_that_costs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NURO_AGENT_SOCKET_DIR", str(tmp_path))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu001")
    with pytest.raises(jobchannel.JobChannelError, match="no node agent answers .* requeues at grace end"):
        jobchannel.acknowledge_preemption(3, job_id=8)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(jobchannel.JobChannelError, match="SLURM_JOB_ID is not set"):
        jobchannel.record_checkpoint(3)


@pytest.mark.parametrize(
    "data",
    [b"nuro-progress/1 ckpt 0 1", b"nuro-progress/1 ack 1 2 Preempted", b"nuro-progress/1 ckpt 1 2 x",
     b"nuro-progress/1 ckpt 1 -2", b"nuro-progress/1 flush 1 2", b"nuro-progress/1 ckpt 1 " + b"9" * 16,
     b"nuro-progress/1 ckpt 1 2" + b" " * 100],
)  # fmt: skip
def test_malformed_progress_reports_are_not_reports(data: bytes) -> None:
    assert peerloss.parse_progress(data) is None

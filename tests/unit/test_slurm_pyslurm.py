"""make_backend: pyslurm only when it imports AND matches the running Slurm's major.minor; never required.

pyslurm is not installed here (nothing on PyPI matches 22.05), so a stand-in module object plays it; the running
Slurm's version comes from a fake ``sinfo --version`` that prints the real captured text.
"""

from __future__ import annotations

import logging
import stat
import sys
import types
from pathlib import Path

import pytest

from nuro.slurm import CliBackend, JobPhase, PyslurmBackend, make_backend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


@pytest.fixture
def bin_dir(tmp_path: Path) -> str:
    """Fake Slurm commands: sinfo --version (real text) and scontrol show topology (real capture)."""
    for name, fixture in (("sinfo", "sinfo_version.txt"), ("scontrol", "scontrol_show_topology.txt")):
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\ncat '{FIXTURES / fixture}'\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(tmp_path)


def fake_pyslurm(version: str) -> types.ModuleType:
    module = types.ModuleType("pyslurm")
    module.__version__ = version  # type: ignore[attr-defined]

    class Loader:
        def __init__(self, items: dict[object, object]) -> None:
            self.items = items

        def load(self) -> dict[object, object]:
            return self.items

    job = types.SimpleNamespace(
        id=7,
        name="train",
        user_name="alice",
        state="RUNNING",
        state_reason="None",
        account="vision",
        qos="g-vision",
        partition="gpu",
        priority=100,
        nodes="gpu[001-002]",
        num_nodes=2,
        gres_per_node={"gpu": 8},
        comment="{}",
        is_requeueable=True,
        submit_time=1796015378,
        start_time=1796015379,
        end_time=0,
    )
    node = types.SimpleNamespace(
        name="gpu001",
        state="MIXED",
        reason=None,
        configured_gres={"gpu": 8},
        allocated_gres={"gpu": 8},
        total_cpus=16,
        allocated_cpus=1,
        partitions=["gpu"],
    )
    part = types.SimpleNamespace(
        name="gpu", nodes="gpu[001-008]", state="UP", total_cpus=128, total_nodes=8, is_default=True
    )
    module.Jobs = Loader({7: job})  # type: ignore[attr-defined]
    module.Nodes = Loader({"gpu001": node})  # type: ignore[attr-defined]
    module.Partitions = Loader({"gpu": part})  # type: ignore[attr-defined]
    return module


def test_cli_when_pyslurm_is_absent(
    monkeypatch: pytest.MonkeyPatch, bin_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # makes `import pyslurm` raise ImportError
    with caplog.at_level(logging.INFO, logger="nuro.slurm.pyslurm_backend"):
        backend = make_backend(bin_dir=bin_dir)
    assert type(backend) is CliBackend
    assert any("backend=cli" in r.getMessage() and "not importable" in r.getMessage() for r in caplog.records)


def test_cli_when_pyslurm_version_does_not_match(
    monkeypatch: pytest.MonkeyPatch, bin_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("25.11.0"))
    with caplog.at_level(logging.WARNING, logger="nuro.slurm.pyslurm_backend"):
        backend = make_backend(prefer="pyslurm", bin_dir=bin_dir)
    assert type(backend) is CliBackend
    assert any("25.11.0" in r.getMessage() and "22.05.8" in r.getMessage() for r in caplog.records)


def test_pyslurm_when_major_minor_match(monkeypatch: pytest.MonkeyPatch, bin_dir: str) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("22.5.1"))  # pyslurm spells 22.05 as 22.5
    backend = make_backend(bin_dir=bin_dir)
    assert isinstance(backend, PyslurmBackend)
    snap = backend.read_snapshot()
    (job,) = snap.jobs
    assert job.phase is JobPhase.RUNNING and job.nodes == ("gpu001", "gpu002") and job.gpus_total == 16
    assert job.end_time is None and job.requeue
    assert snap.node("gpu001").switch == "leaf01" and snap.node("gpu001").gpus_free == 0
    assert snap.partition("gpu").default and snap.source == "pyslurm"


def test_prefer_cli_never_imports_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm("22.5.1"))
    assert type(make_backend(prefer="cli", bin_dir="/nonexistent")) is CliBackend
    with pytest.raises(ValueError):
        make_backend(prefer="slurmrestd")

"""slurm.conf per Slurm release: what each newer one adds is used, and no older one is given a key it refuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nuro.cluster.slurmconf import render_slurm_conf
from nuro.devcluster.layout import Layout, describe
from nuro.jobspec.submission import requeue_args
from nuro.slurm.models import SlurmVersion

NEW_KEYS = ("PrologTimeout=", "EpilogTimeout=", "SlurmctldParameters=enable_expedited_requeue", "MetricsType=")


@pytest.fixture
def desc(tmp_path: Path):
    return describe(Layout(tmp_path / "dc"), 2, 22800)


def _keys(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_before_25_05_one_shared_hook_deadline_and_no_newer_key(desc, version: str) -> None:
    lines = _keys(render_slurm_conf(replace(desc, slurm_version=version)))
    assert "PrologEpilogTimeout=300" in lines
    assert not [line for line in lines if line.startswith(NEW_KEYS)], "24.11 dies parsing MetricsType (captured)"


def test_26_05_gets_separate_deadlines_expedited_requeue_and_openmetrics(desc) -> None:
    lines = _keys(render_slurm_conf(replace(desc, slurm_version="26.05")))
    assert {"PrologTimeout=300", "EpilogTimeout=300", "SlurmctldParameters=enable_expedited_requeue",
            "MetricsType=metrics/openmetrics"} <= set(lines)  # fmt: skip
    assert not [line for line in lines if line.startswith("PrologEpilogTimeout=")]


def test_the_default_is_22_05_and_a_bad_version_is_refused(desc) -> None:
    assert desc.slurm_version == "22.05" and desc.slurm_release == (22, 5)
    with pytest.raises(ValueError, match="slurm_version must look like 22.05, got '26'"):
        replace(desc, slurm_version="26")


class _Versioned:
    """The one Backend method requeue_args calls."""

    def __init__(self, version: SlurmVersion) -> None:
        self._version = version

    def version(self) -> SlurmVersion:
        return self._version


@pytest.mark.parametrize(
    ("version", "args"),
    [
        (SlurmVersion(22, 5, 8), []),
        (SlurmVersion(24, 11, 5), []),
        (SlurmVersion(25, 11, 0), ["--requeue=expedite"]),
        (SlurmVersion(26, 5, 5), ["--requeue=expedite"]),
    ],
)
def test_training_jobs_ask_for_expedited_requeue_where_slurm_has_it(version: SlurmVersion, args: list[str]) -> None:
    assert requeue_args(_Versioned(version)) == args  # type: ignore[arg-type]

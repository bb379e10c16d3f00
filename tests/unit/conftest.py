"""Unit tests see the environment CI gives them, whatever the shell exported.

A developer who ran ``eval "$(nuro-admin devcluster env)"`` has the dev cluster's Slurm, S3, metrics and MLflow
settings in the environment; a ``nuro-sbatch --dry-run`` a test starts would then ask that S3 for a snapshot the test
made up, and fail where CI passes. Pure tests take no site settings from outside: each test runs without them
(``NURO_TEST_*``, the suite's own knobs, stay)."""

from __future__ import annotations

import os

import pytest

#: The prefixes of site settings: nuro's own, Slurm's client variables, boto3's credentials, MLflow's server.
SITE_PREFIXES = ("NURO_", "SLURM_", "AWS_", "MLFLOW_")


@pytest.fixture(autouse=True)
def _no_site_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith(SITE_PREFIXES) and not n.startswith("NURO_TEST_")]:
        monkeypatch.delenv(name)

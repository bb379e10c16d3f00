"""What the e2e modules share: the example's dataset snapshot and code repository, made once per module."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from nuro.devcluster import scenario
from tests.integration.conftest import LiveCluster


@pytest.fixture(scope="module")
def prepared(cluster: LiveCluster) -> tuple[Path, str, Path]:
    work = Path(tempfile.mkdtemp(prefix="nuro-e2e-", dir="/tmp"))
    work.chmod(0o755)
    dataset, repo = scenario.prepare(cluster.env, work)
    return work, dataset, repo

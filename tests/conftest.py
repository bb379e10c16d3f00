"""Shared pytest options and fixtures: ``--update-golden`` rewrites the recorded files under tests/golden/; the one
real cluster of the session (``cluster``) serves both tests/integration and tests/e2e, so it is defined here once."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro.devcluster import manager
from nuro.devcluster.layout import Layout
from nuro.devcluster.sshhosts import SSHHosts
from nuro.slurm import CliBackend
from tests.integration.conftest import (
    TEST_NODES,
    TEST_PORT_BASE,
    TEST_SLURM,
    TEST_STATE_DIR,
    TEST_TOPOLOGY,
    LiveCluster,
    ensure_test_users,
)

GOLDEN_DIR = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from the current code")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Unit tests first, then the tests on the real cluster (in their own order): the pure tests need no daemons, so
    they run before the session's cluster exists instead of sharing the 2 CI cores with its 8 slurmd and agents."""
    unit = Path(__file__).parent / "unit"
    items.sort(key=lambda item: not item.path.is_relative_to(unit))  # stable: each group keeps its order


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """Compare a rendered text with tests/golden/<name>, whole text, with a unified diff on mismatch."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN_DIR / name
        if update or not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if not update:
                pytest.fail(f"recorded new golden file {path}; review it and commit it")
            return
        expected = path.read_text()
        if text != expected:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(keepends=True), text.splitlines(keepends=True), str(path), "rendered"
                )
            )
            pytest.fail(f"{name} differs from the recorded file:\n{diff}\nIf this is intended: pytest --update-golden")

    return check


@pytest.fixture(scope="session")
def cluster() -> Iterator[LiveCluster]:
    """The session's real cluster (8 nodes, own state dir and ports, agents and failure detector included)."""
    if os.geteuid() != 0:
        pytest.fail("integration tests need root: they start a real Slurm cluster (run 'make test' as root)")
    layout = Layout(TEST_STATE_DIR.absolute())
    manager.down(layout, purge=True)
    try:  # up inside the try: a cluster that came up half-way is stopped too (up also stops it when it fails)
        manager.up(layout, TEST_NODES, TEST_PORT_BASE, slurm=TEST_SLURM, topology=TEST_TOPOLOGY)
        env = manager.env_exports(layout)
        tc = LiveCluster(layout=layout, backend=CliBackend(env=env), env=env)
        ensure_test_users(tc)
        yield tc
    finally:
        manager.down(layout)


@pytest.fixture(scope="session")
def ssh_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SSHHosts]:
    """4 SSH test hosts (network namespaces with their own sshd; ``nuro.devcluster.sshhosts``) for the session.

    ``ssh_hosts.hosts`` are the ``Host`` records; ``write_inventory`` makes an Ansible inventory of them. Shared by
    every test: do not stop or re-key these hosts (make a private ``SSHHosts`` for destructive tests).
    """
    if os.geteuid() != 0:
        pytest.fail("SSH test hosts need root: they create network namespaces and run sshd (run as root)")
    with SSHHosts.running(4, tmp_path_factory.mktemp("sshhosts")) as hosts:
        yield hosts


@pytest.fixture
def shared_tmp(tmp_path: Path) -> Path:
    """A directory every job user can write (job output files land here)."""
    tmp_path.chmod(0o777)
    for parent in tmp_path.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)  # traversable by the job users
    return tmp_path

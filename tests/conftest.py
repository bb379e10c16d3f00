"""Shared pytest options: ``--update-golden`` rewrites the recorded files under tests/golden/."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from the current code")


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

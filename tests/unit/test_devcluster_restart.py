"""The dev supervisor's restart rules mirror the systemd units: on-failure vs always, back-off, start limit."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from nuro.devcluster.restart import RestartBook, Rule, failed, nice_for, rule_for


@pytest.mark.parametrize(
    ("rc", "want"),
    [(0, False), (1, True), (3, True), (-signal.SIGKILL, True), (-signal.SIGSEGV, True), (-signal.SIGTERM, False)],
)
def test_failure_is_what_systemd_calls_failure(rc: int, want: bool) -> None:
    assert failed(rc) is want


def test_rules_by_name_and_family() -> None:
    assert rule_for("nuro-controller").mode == "on-failure"
    assert rule_for("slurmctld").mode == "on-failure"
    assert rule_for("agent:gpu001").mode == "always"
    assert rule_for("slurmd:gpu001") is None and rule_for("mariadbd") is None


def test_controller_restarts_with_doubling_back_off() -> None:
    book = RestartBook()
    now = 0.0
    book.started("nuro-controller", now)
    delays = []
    for _ in range(4):
        delay, _ = book.plan("nuro-controller", -signal.SIGKILL, now)
        assert delay is not None
        delays.append(delay)
        now += delay
        book.started("nuro-controller", now)
    assert delays == [2.0, 4.0, 8.0, 16.0]


def test_the_start_limit_leaves_a_crash_looping_daemon_down_until_the_window_passed() -> None:
    book = RestartBook(rules={"slurmctld": Rule(delay_s=0.1, burst=3, interval_s=60)})
    now = 0.0
    book.started("slurmctld", now)
    for _ in range(2):
        delay, _ = book.plan("slurmctld", 1, now)
        assert delay is not None
        now += delay
        book.started("slurmctld", now)
    delay, why = book.plan("slurmctld", 1, now)
    assert delay is None and "start limit" in why
    assert book.plan("slurmctld", 1, now + 61)[0] == 0.1


def test_a_clean_exit_is_not_restarted_but_an_agent_always_is() -> None:
    book = RestartBook()
    book.started("nuro-controller", 0)
    book.started("agent:gpu001", 0)
    assert book.plan("nuro-controller", 0, 1)[0] is None
    assert book.plan("agent:gpu001", 0, 1)[0] == 1.0
    for t in range(100):  # an agent is never given up on
        book.started("agent:gpu001", float(t))
    assert book.plan("agent:gpu001", 2, 100)[0] is not None


def test_the_supervisors_nice_is_the_units_nice() -> None:
    """The dev cluster runs the controller and the agents at their systemd units' Nice= (read from the units)."""
    root = Path(__file__).resolve().parents[2]
    units = {
        "nuro-controller": root / "ansible" / "files" / "nuro-controller.service",
        "agent:gpu003": root / "healthcheck" / "systemd" / "nuro-nodeagent.service",
    }
    for name, unit in units.items():
        m = re.search(r"^Nice=(-?\d+)$", unit.read_text(), re.M)
        assert m and nice_for(name) == int(m.group(1)), name
    assert nice_for("slurmctld") == 0 and nice_for("slurmd:gpu001") == 0

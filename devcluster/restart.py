"""Restart rules of the dev cluster's supervisor, as the systemd units of a real site have them.

Why: on a real controller host systemd restarts a crashed ``nuro-controller`` (``Restart=on-failure``,
``RestartSec=2``, at most 10 starts a minute: ansible/files/nuro-controller.service), a crashed slurmctld, and node
agents always (healthcheck/systemd/nuro-nodeagent.service). The dev cluster must behave the same, or a test that
crashes a daemon proves nothing about production. Pure: the supervisor asks ``RestartBook.plan`` what to do when a
child exits and ``started`` when it (re)started one; time is whatever monotonic clock the caller passes.

- ``on-failure``: restart unless the exit was clean (status 0, or killed by SIGTERM/SIGINT/SIGHUP/SIGPIPE, which
  systemd counts as clean too); ``always``: restart on any exit.
- back-off: the n-th restart inside ``interval_s`` waits ``delay_s`` × 2^(n-1), capped at ``max_delay_s``.
- start limit: ``burst`` starts inside ``interval_s`` and the next exit is final (the daemon stays down, logged and
  recorded, like systemd's "start request repeated too quickly"); ``burst=None`` never gives up.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from enum import StrEnum

CLEAN_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE})


class Mode(StrEnum):
    ON_FAILURE = "on-failure"
    ALWAYS = "always"


@dataclass(frozen=True)
class Rule:
    mode: Mode = Mode.ON_FAILURE
    delay_s: float = 2.0
    max_delay_s: float = 30.0
    burst: int | None = 10
    interval_s: float = 60.0


#: name (or "prefix:" for a family such as agent:<node>) → rule; daemons not listed are never restarted.
RULES: dict[str, Rule] = {
    "nuro-controller": Rule(Mode.ON_FAILURE, delay_s=2.0, burst=10, interval_s=60.0),
    "slurmctld": Rule(Mode.ON_FAILURE, delay_s=2.0, burst=5, interval_s=60.0),
    "agent:": Rule(Mode.ALWAYS, delay_s=1.0, burst=None),
}


#: The units' ``Nice=`` (nuro-controller.service, nuro-nodeagent.service): heartbeats and their judge must get the CPU
#: before training, data loaders and tests do. Without it, on the 2-core CI machine running three clusters, an agent
#: starved for 2 s was declared lost (a false node loss, seen in CI).
NICE: dict[str, int] = {"nuro-controller": -5, "agent:": -5}


def rule_for(name: str, rules: dict[str, Rule] = RULES) -> Rule | None:
    if name in rules:
        return rules[name]
    family = name.split(":", 1)[0] + ":"
    return rules.get(family) if ":" in name else None


def nice_for(name: str) -> int:
    """The ``Nice=`` of ``name``'s unit (0 when its unit sets none), looked up like ``rule_for``."""
    return NICE.get(name, NICE.get(name.split(":", 1)[0] + ":", 0) if ":" in name else 0)


def failed(returncode: int | None) -> bool:
    """systemd's view of an exit: a non-zero status or an unclean signal (``returncode`` as Popen gives it)."""
    if returncode is None or returncode == 0:
        return False
    if returncode < 0:
        try:
            return signal.Signals(-returncode) not in CLEAN_SIGNALS
        except ValueError:
            return True
    return True


@dataclass
class RestartBook:
    """Start times per daemon name, and the plan for an exit."""

    rules: dict[str, Rule] = field(default_factory=lambda: dict(RULES))
    _starts: dict[str, list[float]] = field(default_factory=dict)

    def started(self, name: str, now: float) -> None:
        rule = rule_for(name, self.rules)
        window = rule.interval_s if rule else 0.0
        self._starts[name] = [t for t in self._starts.get(name, []) if now - t <= window] + [now]

    def plan(self, name: str, returncode: int | None, now: float) -> tuple[float | None, str]:
        """(seconds to wait before restarting, or None for no restart; why)."""
        rule = rule_for(name, self.rules)
        if rule is None:
            return None, "not restarted (no rule)"
        if rule.mode is Mode.ON_FAILURE and not failed(returncode):
            return None, f"exited cleanly ({returncode}): not restarted (Restart=on-failure)"
        recent = [t for t in self._starts.get(name, []) if now - t <= rule.interval_s]
        if rule.burst is not None and len(recent) >= rule.burst:
            return None, f"start limit hit ({len(recent)} starts in {rule.interval_s:.0f} s): left down"
        restarts = max(len(recent) - 1, 0)  # the first start is not a restart
        return min(rule.delay_s * 2**restarts, rule.max_delay_s), f"exit {returncode}: restart #{restarts + 1}"


__all__ = ["RULES", "Mode", "RestartBook", "Rule", "failed", "rule_for"]

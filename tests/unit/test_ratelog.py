"""Rate-limited logging of the controller's loops: one line per key per interval, bounded keys, once-only mode."""

from __future__ import annotations

import pytest

from nuro.slurm_plugins.controller.ratelog import RateLog, once


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_one_line_per_key_per_interval_with_the_count_suppressed_between() -> None:
    clock = Clock()
    rl = RateLog(every_s=60, clock=clock)
    assert rl.allow(("10.0.0.1", "bad_mac")) == (True, 0)
    assert [rl.allow(("10.0.0.1", "bad_mac"))[0] for _ in range(1000)] == [False] * 1000
    assert rl.allow(("10.0.0.2", "bad_mac")) == (True, 0)  # another source has its own line
    clock.t = 60
    assert rl.allow(("10.0.0.1", "bad_mac")) == (True, 1000)


def test_a_flood_of_distinct_keys_costs_bounded_memory() -> None:
    rl = RateLog(every_s=60, max_keys=100, clock=Clock())
    for i in range(100_000):
        rl.allow(f"10.{i}")
    assert len(rl) == 100


def test_once_logs_a_key_until_it_is_forgotten() -> None:
    rl = once()
    assert rl.allow((7, "KeyError: x"))[0] and not rl.allow((7, "KeyError: x"))[0]
    rl.forget((7, "KeyError: x"))
    assert rl.allow((7, "KeyError: x"))[0]


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        RateLog(every_s=0)

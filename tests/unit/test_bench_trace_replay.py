"""The sharing bench's verdicts (bench/bench_trace_replay.py): headroom to the bound, the sharing incentive."""

from __future__ import annotations

import math

import pytest

from bench.bench_trace_replay import headroom_used, incentive_misses, longer_waits


def row(base_good: float, nuro_good: float, bound: float, team_base: float, team_nuro: float,
        p95_base: float, p95_nuro: float, lent_nuro: float = 0.0, lent_gpu_s: float = 0.0) -> dict:  # fmt: skip
    def variant(good: float, team: float, p95: float, lent: float, gpu_s: float = 0.0) -> dict:
        return {
            "goodput": good,
            "team_guaranteed_goodput_gpu_s": {"a": team},
            "team_lent_wait_p95_s": {"a": lent},
            "team_lent_gpu_s": {"a": gpu_s},
            "queue_wait": {"guaranteed:a": {"p95_s": p95}},
        }

    return {
        "baseline": variant(base_good, team_base, p95_base, 0.0),
        "nuro": variant(nuro_good, team_nuro, p95_nuro, lent_nuro, lent_gpu_s),
        "bound": {"fraction": bound},
    }


def test_headroom_is_the_share_of_the_gap_to_the_bound_nuro_took() -> None:
    assert headroom_used(row(0.70, 0.85, 0.90, 1, 1, 0, 0)) == pytest.approx(0.75)
    assert math.isnan(headroom_used(row(0.90, 0.90, 0.90, 1, 1, 0, 0))), "no gap: nothing to take"


def test_sharing_incentive_allows_one_reclaim_and_no_more() -> None:
    slack, quotas = 120.0, {"a": 10}
    assert incentive_misses(row(0.7, 0.8, 0.9, 1e6, 1e6 - 1200, 30, 150, 120), slack, quotas) == []
    assert incentive_misses(row(0.7, 0.8, 0.9, 1e6, 1e6 - 1201, 30, 150), slack, quotas) == ["a goodput 0.9988x"]
    assert incentive_misses(row(0.7, 0.8, 0.9, 1e6, 1e6, 30, 151, 121), slack, quotas) == ["a lent wait p95 121 s"]


def test_a_longer_wait_is_listed_with_what_lending_cost() -> None:
    assert longer_waits(row(0.7, 0.8, 0.9, 1, 1, 30, 150), 120.0) == []
    assert longer_waits(row(0.7, 0.8, 0.9, 1, 1, 30, 151, 5.0, 360.0), 120.0) == [("a", 30, 151, 5.0, 360.0)]
    assert incentive_misses(row(0.7, 0.8, 0.9, 1, 1, 30, 151, 5.0, 360.0), 120.0, {"a": 10}) == [], "own work"

"""nuro-train status's spare summary: swaps and the idle spares' cost, from the swap run events (pure)."""

from __future__ import annotations

from nuro.lifecycle.run_events import RunEvent
from nuro.runs.spares import spare_lines, spare_summary


def _swap(ts: float, lost: str, spare: str) -> RunEvent:
    return RunEvent(ts, "spare_swap", 7, 0, "gpu001", {"lost": [lost], "spares": [spare], "swap": 1})


def test_a_spare_is_idle_until_a_swap_puts_it_to_work() -> None:
    # 2 training nodes + 2 spares of 8 GPUs, 1 h: one spare used after 30 min, the other idle throughout
    s = spare_summary(2, 4, 8, 0.0, 3600.0, [_swap(1800.0, "gpu002", "gpu003")])
    assert s["spares_left"] == 1 and s["swaps"] == [{"at": 1800.0, "lost": ["gpu002"], "spares": ["gpu003"]}]
    assert s["idle_node_hours"] == 1.5 and s["idle_gpu_hours"] == 12.0
    assert s["overhead_pct"] == 37.5  # 1.5 node-h idle of 4 node-h allocated
    assert spare_lines(s) == ["2 allocated, 1 left; idle 12 GPU-h (1.5 node-h, 37.5 % of the allocation)",
                              "swap 1: gpu002 lost -> gpu003"]  # fmt: skip


def test_a_pending_job_has_no_idle_time_and_hostile_fields_are_dropped() -> None:
    assert spare_summary(1, 3, 8, None, 100.0, [])["idle_gpu_hours"] == 0
    bad = RunEvent(10.0, "spare_swap", 7, 0, "gpu001", {"lost": "gpu002", "spares": [1, "gpu003"]})
    s = spare_summary(1, 3, 8, 0.0, 20.0, [bad])
    assert s["swaps"] == [{"at": 10.0, "lost": [], "spares": ["gpu003"]}] and s["spares_left"] == 0

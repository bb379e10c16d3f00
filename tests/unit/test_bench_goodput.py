"""The goodput soak's accounting (bench/bench_goodput.py), on hand-built timelines and step logs: no cluster.

The main story: rank 0 runs steps 0..99 at 0.1 s each from t=100, a node is killed at t=110, the controller notices
at 111, the job is requeued, its epilog takes 2 s, the new attempt is allocated at 120 (prolog 1.5 s), the training
processes are up at 125, the checkpoint of step 79 is restored (0.5 s) and the first step (80) runs at 130: 20
steps done twice. The soak ends at 137.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from bench.bench_goodput import (
    PHASES,
    Segment,
    account,
    attempt_starts,
    hook_windows,
    markdown,
    overlap,
    percentile,
    plan_disturbances,
    recovery,
    segments,
    spread,
    useful_seconds,
    useful_steps,
)


def _steps(first_step: int, last_step: int, t0: float, step_s: float = 0.1) -> list[tuple[float, int]]:
    return [(round(t0 + i * step_s, 3), s) for i, s in enumerate(range(first_step, last_step + 1))]


def _ev(ts: float, kind: str, source: str = "run", attempt: int | None = 0, node: str = "", detail: str = "") -> dict:
    return {"ts": ts, "kind": kind, "source": source, "attempt": attempt, "step": None, "detail": detail or kind,
            "node": node or None}  # fmt: skip


STEPS = _steps(0, 99, 100.0) + _steps(80, 149, 130.0)
EVENTS = [
    _ev(98.0, "started", "slurm"),
    _ev(99.0, "process_started"),
    _ev(100.0, "first_step"),
    _ev(111.0, "node_lost", "controller", node="gpu002", detail="gpu002: no heartbeat for 1.0 s"),
    _ev(111.5, "requeued", "slurm"),
    _ev(120.0, "restarted", "slurm", attempt=1),
    _ev(125.0, "process_started", attempt=1),
    _ev(128.0, "resumed", attempt=1, detail="step 79, seconds=0.5"),
    _ev(130.0, "first_step", attempt=1),
]
HOOKS = [
    {"node": "gpu001", "hook": "epilog", "start": 112.0, "end": 114.0},
    {"node": "gpu003", "hook": "prolog", "start": 120.2, "end": 121.7},
    {"node": "gpu001", "hook": "prolog", "start": 97.0, "end": 97.8},  # the first attempt's: not this recovery's
]
KILL = {"kind": "kill", "at": 110.0, "node": "gpu002"}


def test_segments_split_at_a_resume_and_at_a_pause() -> None:
    segs = segments(STEPS)
    assert [(s.first_step, s.last_step) for s in segs] == [(0, 99), (80, 149)]
    assert segs[0].step_s() == pytest.approx(0.1)
    paused = segments(_steps(0, 9, 0.0) + _steps(10, 19, 20.0))  # contiguous steps, a 19 s pause between
    assert [(s.first_step, s.last_step) for s in paused] == [(0, 9), (10, 19)]
    assert useful_steps(paused) == [10, 10]


def test_useful_steps_are_those_never_done_again() -> None:
    segs = segments(STEPS)
    assert useful_steps(segs) == [80, 70]  # steps 80..99 of the first attempt were redone
    assert useful_seconds(segs) == pytest.approx(15.0)
    # a later restart from scratch makes everything before it redone
    again = [Segment(0, 10, 0, 100), Segment(20, 25, 50, 99), Segment(30, 40, 0, 10)]
    assert useful_steps(again) == [40, 50, 11]  # 11..49 and 100 kept of the first


def test_a_single_step_segment_takes_the_typical_rate() -> None:
    segs = [Segment(0.0, 9.9, 0, 99), Segment(20.0, 20.0, 100, 100)]
    assert segs[1].step_s() is None
    assert useful_seconds(segs) == pytest.approx(101 * 0.1)


def test_recovery_phases_add_up_to_the_recovery_time() -> None:
    row = recovery(EVENTS, 110.0, 137.0, segments(STEPS), HOOKS, node="gpu002")
    assert row["via"] == "requeue" and row["recovered"] and row["detected_by"] == "node_lost"
    assert row["phases"] == {"detect": 1.0, "requeue_wait": 7.0, "epilog": 2.0, "prolog": 1.5, "startup": 8.0,
                             "restore": 0.5, "redone": 2.0}  # fmt: skip
    assert row["recovery_s"] == 20.0 and row["resumed_step"] == 80 and row["redone_steps"] == 20
    assert row["lost_s"] == pytest.approx(sum(row["phases"].values()))


def test_slurm_alone_detects_at_the_requeue() -> None:
    events = [e for e in EVENTS if e["kind"] != "node_lost"]
    events = [dict(e, ts=124.0) if e["kind"] == "requeued" else e for e in events]
    events = [dict(e, ts=e["ts"] + 14) if e.get("attempt") == 1 else e for e in events]
    steps = _steps(0, 99, 100.0) + _steps(80, 149, 144.0)
    row = recovery(events, 110.0, 160.0, segments(steps), [], node="gpu002")
    assert row["detected_by"] == "requeued" and row["phases"]["detect"] == 14.0
    assert row["phases"]["requeue_wait"] == 10.0 and row["recovery_s"] == 34.0


def test_a_spare_swap_has_no_requeue_epilog_or_prolog() -> None:
    events = [
        _ev(111.0, "node_lost", "controller", node="gpu002"),
        _ev(113.0, "spare_swap", detail="lost=['gpu002'], nodes=['gpu001', 'gpu003']"),
        _ev(115.0, "process_started"),
        _ev(116.5, "resumed", detail="step 95, seconds=0.3"),
        _ev(117.0, "first_step"),
    ]
    steps = _steps(0, 99, 100.0) + _steps(96, 120, 117.0)
    row = recovery(events, 110.0, 150.0, segments(steps), HOOKS, node="gpu002")
    assert row["via"] == "spare" and row["recovery_s"] == 7.0 and row["redone_steps"] == 4
    assert row["phases"]["epilog"] == row["phases"]["prolog"] == 0.0
    assert row["phases"]["requeue_wait"] == 2.0 and row["phases"]["startup"] == pytest.approx(3.7)


def test_account_ettr_and_where_the_time_went() -> None:
    res = account(STEPS, EVENTS, [KILL, {"kind": "restart", "at": 133.0, "node": None}], 98.0, 137.0, HOOKS)
    assert res["wall_s"] == 39.0 and res["useful_s"] == 15.0 and res["ettr"] == pytest.approx(15 / 39, abs=1e-4)
    assert res["failures"] == 1 and res["unplanned"] == 0 and res["preemptions"] == 0
    assert res["steps_kept"] == 150 and res["steps_run"] == 170
    assert res["recovery_s"] == {"n": 1, "p50": 20.0, "p99": 20.0, "worst": 20.0, "worst_over_p50": 1.0}
    assert res["redone_steps"]["p50"] == 20
    assert res["phases_per_failure"]["epilog"]["worst"] == 2.0
    lost = res["lost_s"]
    assert lost["first_startup"] == 2.0 and lost["redone"] == 2.0 and lost["unrecovered"] == 0.0
    # every second of the wall time is useful or in a named bucket (the rest is the 0.1 s tails)
    assert res["useful_s"] + sum(lost.values()) == pytest.approx(res["wall_s"], abs=0.01)
    assert abs(lost["other"]) <= 0.3


def test_a_run_that_ends_mid_recovery() -> None:
    """The soak ends at 118, before the new attempt is allocated: the failure counts, its time runs to the end."""
    res = account(_steps(0, 99, 100.0), EVENTS, [KILL], 98.0, 118.0, HOOKS)
    (row,) = res["recoveries"]
    assert not row["recovered"] and row["recovery_s"] is None and row["lost_s"] == 8.0
    assert row["phases"]["detect"] == 1.0
    assert res["failures"] == 1 and res["recovery_s"]["n"] == 0
    assert res["lost_s"]["unrecovered"] == 7.0  # 8 s lost, 1 of them detection
    assert res["useful_s"] == pytest.approx(10.0) and res["ettr"] == pytest.approx(0.5, abs=1e-3)


def test_a_restart_nobody_caused_is_an_unplanned_failure() -> None:
    events = [*EVENTS, _ev(150.0, "requeued", "slurm", attempt=1), _ev(158.0, "restarted", "slurm", attempt=2),
              _ev(161.0, "process_started", attempt=2), _ev(163.0, "first_step", attempt=2)]  # fmt: skip
    steps = STEPS + _steps(150, 160, 163.0)
    res = account(steps, events, [KILL], 98.0, 170.0, HOOKS)
    assert res["failures"] == 2 and res["unplanned"] == 1
    unplanned = res["recoveries"][-1]
    assert unplanned["kind"] == "unplanned" and unplanned["at"] == 136.9 and unplanned["recovery_s"] == 26.1
    assert unplanned["redone_steps"] == 0


def test_a_preemption_is_timed_from_the_last_step_and_is_no_failure() -> None:
    events = [
        _ev(98.0, "started", "slurm"),
        _ev(110.5, "preempted", detail="step 99, acked=True"),
        _ev(111.0, "requeued", "slurm"),
        _ev(125.0, "restarted", "slurm", attempt=1),
        _ev(129.0, "process_started", attempt=1),
        _ev(130.0, "first_step", attempt=1),
    ]
    steps = _steps(0, 99, 100.0) + _steps(100, 120, 130.0)
    res = account(steps, events, [{"kind": "preempt", "at": 105.0, "node": None}], 98.0, 140.0)
    (row,) = res["recoveries"]
    assert row["kind"] == "preempt" and row["at"] == pytest.approx(109.9) and row["redone_steps"] == 0
    assert row["detected_by"] == "preempted" and row["recovery_s"] == pytest.approx(20.1)
    assert res["failures"] == 0 and res["preemptions"] == 1 and res["recovery_s"]["n"] == 0


def test_percentiles_and_spread() -> None:
    assert percentile([], 50) is None
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert spread([1.0, None, 2.0, 3.0, 10.0]) == {"n": 4, "p50": 2.5, "p99": 9.79, "worst": 10.0,
                                                   "worst_over_p50": 4.0}  # fmt: skip
    assert spread([None])["p50"] is None


def test_overlap_counts_each_second_once() -> None:
    assert overlap([(0.0, 2.0), (1.0, 3.0), (10.0, 11.0)], 0.5, 10.5) == pytest.approx(3.0)
    assert overlap([], 0.0, 5.0) == 0.0


def test_hook_windows_from_the_nodes_hook_logs() -> None:
    lines = [
        "2026-12-05 07:01:02,345 gpu002 nuro-epilog INFO job=7 epilog checkpoints flushed in 0.84 s",
        "2026-12-05 07:01:09,000 gpu003 nuro-prolog INFO job=7 prolog done in 1.20 s",
        "2026-12-05 07:01:09,500 gpu004 nuro-prolog INFO job=8 prolog done in 9.00 s",
        "2026-12-05 07:01:10,000 gpu003 nuro-prolog WARNING job=7 team=perception run=r checkpoint skipped: x",
    ]
    got = hook_windows(lines, 7, tz_offset_s=0)
    end = datetime(2026, 12, 5, 7, 1, 2, 345000, tzinfo=UTC).timestamp()
    assert [(w["node"], w["hook"]) for w in got] == [("gpu002", "epilog"), ("gpu003", "prolog")]
    assert got[0]["end"] == pytest.approx(end) and got[0]["start"] == pytest.approx(end - 0.84)
    assert got[1]["end"] - got[1]["start"] == pytest.approx(1.2)


def test_plan_disturbances_is_seeded_and_within_the_soak() -> None:
    a = plan_disturbances(random.Random(1), 1200, 270, 0.45, 0.7)
    assert a == plan_disturbances(random.Random(1), 1200, 270, 0.45, 0.7)
    kills = [t for t, k in a if k == "kill"]
    assert 3 <= len(kills) <= 5 and all(t < 1200 for t in kills)
    gaps = [b - a for a, b in zip([0.0, *kills], kills, strict=False)]
    assert all(0.8 * 270 - 0.1 <= g <= 1.2 * 270 + 0.1 for g in gaps)
    assert (540.0, "preempt") in a and (840.0, "restart") in a and a == sorted(a)
    assert [k for _, k in plan_disturbances(random.Random(1), 240, 90, None, None)] == ["kill", "kill"]


def test_markdown_has_a_column_per_run() -> None:
    res = account(STEPS, EVENTS, [KILL], 98.0, 137.0, HOOKS)
    table = markdown([{"variant": "nuro", "job": "ddp", **res}, {"variant": "slurm", "job": "ddp", **res}])
    lines = table.splitlines()
    assert lines[0] == "| | nuro (ddp) | slurm (ddp) |" and lines[1] == "|---|---|---|"
    assert any(line.startswith("| ETTR | 38.5 % |") for line in lines)
    assert sum(1 for line in lines if "per failure" in line) == len(PHASES)


def test_the_controllers_detection_wins_over_accountings_whole_seconds() -> None:
    """sacct's end time is truncated to the second, so it can precede the node_lost event that caused it."""
    events = sorted([*EVENTS, _ev(110.0, "node_fail", "slurm")], key=lambda e: e["ts"])
    row = recovery(events, 110.0, 137.0, segments(STEPS), HOOKS, node="gpu002")
    assert row["detected_by"] == "node_lost" and row["phases"]["detect"] == 1.0


def test_steps_redone_by_a_later_attempt_count_against_the_failure_that_lost_them() -> None:
    """No checkpoint (Slurm alone, 600 s interval): each attempt starts from step 0 again. The second attempt's 50
    steps are lost to the unplanned requeue at 136, though the third attempt redoes them, not the second."""
    steps = _steps(0, 99, 100.0) + _steps(0, 49, 130.0) + _steps(0, 150, 150.0)
    events = [
        _ev(98.0, "started", "slurm"),
        _ev(110.0, "node_fail", "slurm"),
        _ev(120.0, "restarted", "slurm", attempt=1),
        _ev(130.0, "first_step", attempt=1),
        _ev(136.0, "requeued", "slurm", attempt=1),
        _ev(145.0, "restarted", "slurm", attempt=2),
        _ev(150.0, "first_step", attempt=2),
    ]
    res = account(steps, events, [KILL], 98.0, 165.1, [])
    kill, unplanned = res["recoveries"]
    assert kill["redone_steps"] == 100 and kill["resumed_step"] == 0 and kill["phases"]["restore"] == 0.0
    assert unplanned["kind"] == "unplanned" and unplanned["redone_steps"] == 50 and unplanned["at"] == 134.9
    assert unplanned["phases"]["detect"] == 1.1 and unplanned["detected_by"] == "requeued"
    assert res["steps_run"] - res["steps_kept"] == 150 and res["lost_s"]["redone"] == pytest.approx(15.0)
    assert abs(res["lost_s"]["other"]) <= 0.5


def test_an_attempt_accounting_kept_no_start_for_is_timed_from_its_first_prolog() -> None:
    """Slurm accounting's one record per job: an attempt requeued soon after it began may leave no ``restarted``
    entry, or one stamped after its processes were up (22.05 soak: a kill 40 s after the preemption's restart); the
    first prolog of the burst before its processes stands for the allocation, instead of the recovery being counted
    lost up to the next disturbance."""
    hooks = [*HOOKS, {"node": "gpu004", "hook": "prolog", "start": 120.6, "end": 122.0}]
    missing = [e for e in EVENTS if e["kind"] != "restarted"]
    late = [*missing, _ev(126.0, "restarted", "slurm", attempt=1)]
    for events in (missing, late):
        fixed = attempt_starts(events, hooks)
        assert [(e["ts"], e["attempt"]) for e in fixed if e["kind"] == "restarted"] == [(120.2, 1)]
        row = recovery(fixed, 110.0, 137.0, segments(STEPS), hooks, node="gpu002")
        assert row["recovered"] and row["via"] == "requeue" and row["recovery_s"] == 20.0
        assert row["phases"]["requeue_wait"] == pytest.approx(7.2) and row["phases"]["prolog"] == pytest.approx(1.8)
    # a record before the processes is kept; no prolog logged: the processes' start
    assert attempt_starts(EVENTS, hooks) == sorted(EVENTS, key=lambda e: e["ts"])
    assert [e["ts"] for e in attempt_starts(missing, []) if e["kind"] == "restarted"] == [125.0]
    # through account: no unplanned failure is made of the late record
    acc = account(STEPS, late, [KILL], 98.0, 137.0, hooks)
    assert acc["unplanned"] == 0 and acc["recoveries"][0]["recovery_s"] == 20.0

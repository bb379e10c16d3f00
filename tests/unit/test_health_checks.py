"""The pure health rules: one named scenario per reason, with the exact message operators will see."""

from __future__ import annotations

import math

import pytest

from nuro.healthcheck.checks import (
    MAX_REASON_CHARS,
    REASON_PREFIX,
    Limits,
    Problem,
    drain_reason,
    evaluate,
    is_our_reason,
)
from nuro.healthcheck.probes import FakeProbe, GpuStatus, ProbeFailure, decode_throttle_reasons

GIB = 1 << 30


def _eval(probe: FakeProbe | None, expected: int | None = 8, free: int | None = 100 * GIB, age: float | None = None):
    report = probe.read() if probe is not None else None
    return [p.message for p in evaluate(report, expected, free, 20 * GIB, age, Limits(), staging_root="/stage")]


CASES = {
    "healthy": (FakeProbe.healthy(8), []),
    "hot": (FakeProbe.healthy(8).with_gpu(1, temperature_c=93), ["gpu1: temperature 93 C ≥ 90 C"]),
    "at-limit": (FakeProbe.healthy(8).with_gpu(1, temperature_c=90), ["gpu1: temperature 90 C ≥ 90 C"]),
    "just-below": (FakeProbe.healthy(8).with_gpu(1, temperature_c=89), []),
    "ecc": (
        FakeProbe.healthy(8).with_gpu(3, ecc_volatile_uncorrected=2),
        ["gpu3: 2 volatile uncorrectable ECC errors"],
    ),
    "ecc-one": (
        FakeProbe.healthy(8).with_gpu(3, ecc_volatile_uncorrected=1),
        ["gpu3: 1 volatile uncorrectable ECC error"],
    ),
    "no-ecc-support": (FakeProbe.healthy(8).with_gpu(3, ecc_volatile_uncorrected=None), []),
    "missing-gpu": (FakeProbe.healthy(7), ["gpu count 7, expected 8"]),
    "retired": (
        FakeProbe.healthy(8).with_gpu(0, retired_pages_pending=True),
        ["gpu0: retired pages pending (reset needed)"],
    ),
    "remap-pending": (
        FakeProbe.healthy(8).with_gpu(0, remapped_rows_pending=True),
        ["gpu0: row remapping pending (reset needed)"],
    ),
    "remap-failed": (
        FakeProbe.healthy(8).with_gpu(0, remapped_rows_pending=True, remapped_rows_failure=True),
        ["gpu0: row remapping failed"],
    ),
    "hw-throttle": (
        FakeProbe.healthy(8).with_gpu(2, throttle_reasons=decode_throttle_reasons(0x48 | 0x4)),
        ["gpu2: clocks throttled (HW slowdown, HW thermal slowdown)"],
    ),
    "power-cap-is-fine": (FakeProbe.healthy(8).with_gpu(2, throttle_reasons=("SW power cap", "GPU idle")), []),
    "xid": (FakeProbe.healthy(8).with_gpu(0, xid_errors=(79, 48)), ["gpu0: XID 79, 48"]),
    "lost": (FakeProbe.healthy(8).with_gpu(5, error="GPU is lost", temperature_c=None), ["gpu5: GPU is lost"]),
    "driver": (
        FakeProbe(failure=ProbeFailure.DRIVER_NOT_LOADED, error="NVML: driver not loaded"),
        ["NVML: driver not loaded"],
    ),
    "no-library": (
        FakeProbe(failure=ProbeFailure.LIBRARY_NOT_FOUND, error="NVML library not found (libnvidia-ml.so.1)"),
        ["NVML library not found (libnvidia-ml.so.1)"],
    ),
    "timeout": (
        FakeProbe(failure=ProbeFailure.TIMEOUT, error="NVML did not answer within 5 s"),
        ["NVML did not answer within 5 s"],
    ),
    "two-problems-in-order": (
        FakeProbe.healthy(8).with_gpu(1, temperature_c=95, ecc_volatile_uncorrected=4),
        ["gpu1: 4 volatile uncorrectable ECC errors", "gpu1: temperature 95 C ≥ 90 C"],
    ),
}


@pytest.mark.parametrize("probe,want", CASES.values(), ids=CASES.keys())
def test_gpu_rules(probe: FakeProbe, want: list[str]) -> None:
    assert _eval(probe) == want


@pytest.mark.parametrize("expected", [None, 0])
@pytest.mark.parametrize("failure", [ProbeFailure.LIBRARY_NOT_FOUND, ProbeFailure.DRIVER_NOT_LOADED])
def test_cpu_node_without_nvidia_stack_is_healthy(expected: int | None, failure: ProbeFailure) -> None:
    assert _eval(FakeProbe(failure=failure, error="x"), expected=expected) == []


def test_other_probe_failures_count_even_without_expectation() -> None:
    assert _eval(FakeProbe(failure=ProbeFailure.TIMEOUT, error="NVML hung"), expected=None) == ["NVML hung"]


def test_gpu_count_not_checked_without_expectation() -> None:
    assert _eval(FakeProbe.healthy(3), expected=None) == []


def test_disk() -> None:
    assert _eval(FakeProbe.healthy(8), free=int(1.2 * GIB)) == ["staging disk /stage: 1.2 GiB free < 20 GiB"]
    assert _eval(FakeProbe.healthy(8), free=20 * GIB) == []
    assert _eval(FakeProbe.healthy(8), free=None) == []


def test_agent_liveness() -> None:
    assert _eval(FakeProbe.healthy(8), age=12.4) == ["node agent silent for 12 s"]
    assert _eval(FakeProbe.healthy(8), age=math.inf) == ["node agent never reported"]
    assert _eval(FakeProbe.healthy(8), age=3.0) == []


def test_no_probe_report_checks_only_disk_and_agent() -> None:
    assert _eval(None, free=GIB, age=30) == ["staging disk /stage: 1.0 GiB free < 20 GiB", "node agent silent for 30 s"]


def test_custom_limits() -> None:
    report = FakeProbe.healthy(1).with_gpu(0, temperature_c=80, xid_errors=(13, 79)).read()
    limits = Limits(max_temperature_c=75, critical_xids=frozenset({79}))
    got = [p.message for p in evaluate(report, 1, None, 0, None, limits)]
    assert got == ["gpu0: temperature 80 C ≥ 75 C", "gpu0: XID 79"]


def test_limits_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="thresholds"):
        Limits(max_temperature_c=0)


def test_drain_reason_prefix_and_join() -> None:
    problems = [Problem("temperature", "gpu1: temperature 93 C ≥ 90 C"), Problem("ecc", "gpu3: 2 volatile ...")]
    reason = drain_reason(problems)
    assert reason == "nuro-health: gpu1: temperature 93 C ≥ 90 C; gpu3: 2 volatile ..."
    assert is_our_reason(reason)


def test_drain_reason_is_capped_with_a_count() -> None:
    problems = [Problem("ecc", f"gpu{i}: {i + 10} volatile uncorrectable ECC errors") for i in range(8)]
    reason = drain_reason(problems)
    assert len(reason) <= MAX_REASON_CHARS
    assert reason.startswith(REASON_PREFIX + "gpu0:") and reason.endswith("more)")


def test_drain_reason_needs_problems() -> None:
    with pytest.raises(ValueError):
        drain_reason([])


@pytest.mark.parametrize("reason", [None, "", "admin: bad fan", "maintenance nuro-health: x"])
def test_foreign_reasons_are_not_ours(reason: str | None) -> None:
    assert not is_our_reason(reason)


def test_decode_throttle_reasons() -> None:
    assert decode_throttle_reasons(0) == ()
    assert decode_throttle_reasons(0x80) == ("HW power brake slowdown",)
    assert decode_throttle_reasons(0x1000 | 0x1) == ("GPU idle", "0x1000")


def test_report_to_dict_is_json_ready() -> None:
    import json

    report = FakeProbe(gpus=[GpuStatus(0, throttle_reasons=("HW slowdown",))], failure=ProbeFailure.TIMEOUT).read()
    data = json.loads(json.dumps(report.to_dict()))
    assert data["failure"] == "timeout" and data["gpus"][0]["throttle_reasons"] == ["HW slowdown"]


@pytest.mark.parametrize(
    "uptime,age,want",
    [
        (5.0, math.inf, []),  # slurmd just started: the agent is not up yet
        (5.0, 3600.0, []),  # a status file left by an earlier run
        (31.0, math.inf, ["node agent never reported"]),
        (31.0, 12.0, ["node agent silent for 12 s"]),
        (None, math.inf, ["node agent never reported"]),  # not run by slurmd: no grace
    ],
)
def test_agent_start_grace(uptime: float | None, age: float, want: list[str]) -> None:
    report = FakeProbe.healthy(8).read()
    got = evaluate(report, 8, None, 0, age, Limits(), slurmd_uptime_s=uptime)
    assert [p.message for p in got] == want


def test_application_xids_do_not_drain_by_default() -> None:
    report = FakeProbe.healthy(2).with_gpu(0, xid_errors=(13, 31, 43)).with_gpu(1, xid_errors=(13, 79)).read()
    assert [p.message for p in evaluate(report, 2, None, 0, None)] == ["gpu1: XID 79"]


# --- the staging disk: a shortfall running jobs account for is theirs, not the node's (issue 11, deliverable 7) ---

GIB = 1 << 30


def _use(job: int, gib: float, complete: bool = True):
    from nuro.healthcheck.checks import JobDiskUse

    return JobDiskUse(job, int(gib * GIB), complete)


def test_disk_verdict_not_low_or_not_measured_is_nothing() -> None:
    from nuro.healthcheck.checks import disk_verdict

    assert disk_verdict(30 * GIB, 20 * GIB, [_use(1, 50)]) == disk_verdict(None, 20 * GIB, None)
    assert not disk_verdict(20 * GIB, 20 * GIB, []).low  # exactly at the floor is fine


def test_disk_verdict_fails_the_largest_jobs_until_the_floor_is_met() -> None:
    from nuro.healthcheck.checks import disk_verdict

    usage = [_use(7, 1), _use(3, 6), _use(9, 4), _use(5, 0.5)]
    v = disk_verdict(12 * GIB, 20 * GIB, usage)  # 8 GiB short: the 6 GiB job, then the 4 GiB one
    assert v.low and not v.node_problem and v.shortfall == 8 * GIB
    assert [u.job_id for u in v.jobs_to_fail] == [3, 9]
    v = disk_verdict(15 * GIB, 20 * GIB, usage)  # 5 GiB short: the largest alone covers it
    assert [u.job_id for u in v.jobs_to_fail] == [3]
    v = disk_verdict(14 * GIB, 20 * GIB, [_use(2, 6), _use(1, 6)])  # ties: the lower job id first, stable
    assert [u.job_id for u in v.jobs_to_fail] == [1]


def test_disk_verdict_space_the_jobs_do_not_hold_drains_the_node_and_fails_no_job() -> None:
    from nuro.healthcheck.checks import disk_verdict

    v = disk_verdict(5 * GIB, 20 * GIB, [_use(1, 4), _use(2, 3)])  # 15 GiB short, jobs hold 7: not theirs
    assert v.node_problem and v.jobs_to_fail == ()
    assert disk_verdict(5 * GIB, 20 * GIB, []).node_problem
    assert disk_verdict(5 * GIB, 20 * GIB, None).node_problem  # not measured: the node's, as before
    v = disk_verdict(15 * GIB, 20 * GIB, [_use(4, 6, complete=False)])  # a lower bound that already covers it
    assert [u.job_id for u in v.jobs_to_fail] == [4]


def test_evaluate_reports_disk_only_when_no_job_accounts_for_it() -> None:
    low = 2 * GIB
    assert evaluate(None, None, low, 20 * GIB, None, job_disk_use=[_use(11, 30)]) == []
    (p,) = evaluate(None, None, low, 20 * GIB, None, job_disk_use=[_use(11, 3)])
    assert p.code == "disk" and "2.0 GiB free < 20 GiB" in p.message
    assert [p.code for p in evaluate(None, None, low, 20 * GIB, None)] == ["disk"]  # unmeasured callers


def test_disk_verdict_never_blames_a_job_holding_a_sliver_of_the_floor() -> None:
    from nuro.healthcheck.checks import disk_verdict

    # 4 KiB short of a 20 GiB floor, and the only running job holds 8 KiB: the job is not the cause (< 1 GiB).
    v = disk_verdict(20 * GIB - 4096, 20 * GIB, [_use(1, 8192 / GIB)])
    assert v.node_problem and v.jobs_to_fail == ()
    assert disk_verdict(20 * GIB - 4096, 20 * GIB, [_use(1, 8192 / GIB)], min_job_bytes=0).jobs_to_fail != ()

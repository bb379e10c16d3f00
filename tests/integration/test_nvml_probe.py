"""NvmlProbe through the real pynvml against the fake libnvidia-ml.so.1, one subprocess per scenario.

pynvml loads the library once per process and the fake reads its scenario at nvmlInit, so each scenario runs in a
fresh interpreter (see tests/fake_nvml.py). No cluster needed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fake_nvml

# Reads twice (XIDs are delivered once; a hung call makes the second read fail fast) and prints both reports.
READER = """
import json, sys, time
from nuro.healthcheck.nvml import NvmlProbe
from nuro.healthcheck.checks import evaluate
probe = NvmlProbe(timeout_s=float(sys.argv[1]))
out = []
for _ in range(2):
    t0 = time.monotonic()
    report = probe.read()
    problems = [p.message for p in evaluate(report, 8, None, 0, None)]
    out.append({"report": report.to_dict(), "problems": problems, "wall_s": time.monotonic() - t0})
probe.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake_nvml"))


def _read(lib_dir: Path, tmp_path: Path, scenario: dict[str, object] | None, timeout_s: float = 5.0) -> list[dict]:
    path = fake_nvml.write_scenario(tmp_path / "scenario.txt", scenario) if scenario is not None else None
    proc = subprocess.run(
        [sys.executable, "-c", READER, str(timeout_s)],
        env=fake_nvml.env_for(lib_dir, path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


SCENARIOS = {
    "healthy": ({"gpus": 8}, []),
    "hot": ({"gpus": 8, "gpu1.temp": 93}, ["gpu1: temperature 93 C ≥ 90 C"]),
    "ecc": ({"gpus": 8, "gpu3.ecc_unc": 2}, ["gpu3: 2 volatile uncorrectable ECC errors"]),
    "missing-gpu": ({"gpus": 7}, ["gpu count 7, expected 8"]),
    "driver-not-loaded": ({"driver_not_loaded": 1}, ["NVML: driver not loaded"]),
    "lost-gpu": ({"gpus": 8, "gpu5.lost": 1}, ["gpu5: GPU is lost"]),
    "throttled": (
        {"gpus": 8, "gpu2.throttle": "0x88"},
        ["gpu2: clocks throttled (HW slowdown, HW power brake slowdown)"],
    ),
    "retired-and-remap": (
        {"gpus": 8, "gpu0.retired_pending": 1, "gpu4.remap_pending": 1},
        ["gpu0: retired pages pending (reset needed)", "gpu4: row remapping pending (reset needed)"],
    ),
    "no-ecc-support": ({"gpus": 8, "gpu0.ecc": 0}, []),
    "old-driver-throttle-fallback": (
        {"gpus": 8, "no_event_reasons": 1, "gpu6.throttle": "0x40"},
        ["gpu6: clocks throttled (HW thermal slowdown)"],
    ),
}


@pytest.mark.parametrize("scenario,want", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_scenario(lib_dir: Path, tmp_path: Path, scenario: dict, want: list[str]) -> None:
    first, _second = _read(lib_dir, tmp_path, scenario)
    assert first["problems"] == want


def test_healthy_report_carries_telemetry(lib_dir: Path, tmp_path: Path) -> None:
    scenario = {"gpus": 2, "gpu1.util": 55, "gpu1.mem_used_mib": 1024, "gpu1.power_mw": 350000}
    report = _read(lib_dir, tmp_path, scenario)[0]["report"]
    assert report["probe"] == "nvml" and report["failure"] is None and report["driver_version"] == "535.104.05"
    gpu = report["gpus"][1]
    assert gpu["uuid"] == "GPU-fa4e0000-0000-4000-8000-000000000001" and gpu["name"].startswith("Fake NVIDIA")
    assert (gpu["utilization_pct"], gpu["memory_used_bytes"], gpu["power_w"]) == (55, 1 << 30, 350.0)
    assert (gpu["temperature_c"], gpu["sm_clock_mhz"], gpu["mem_clock_mhz"]) == (40, 1980, 2619)
    assert gpu["ecc_volatile_uncorrected"] == 0 and gpu["retired_pages_pending"] is False


def test_xid_events_are_kept_across_reads(lib_dir: Path, tmp_path: Path) -> None:
    first, second = _read(lib_dir, tmp_path, {"gpus": 8, "gpu0.xid": "79,48"})
    assert first["report"]["gpus"][0]["xid_errors"] == [79, 48]
    assert second["report"]["gpus"][0]["xid_errors"] == [79, 48]  # delivered once by NVML, remembered by the probe
    assert first["problems"] == ["gpu0: XID 79, 48"]


def test_library_not_found(tmp_path: Path) -> None:
    first, _ = _read(tmp_path, tmp_path, None)  # an empty dir on LD_LIBRARY_PATH: no libnvidia-ml on this box
    assert first["report"]["failure"] == "library_not_found"
    assert first["problems"] == ["NVML library not found (libnvidia-ml.so.1)"]


def test_hung_call_is_bounded_and_fails_fast_after(lib_dir: Path, tmp_path: Path) -> None:
    """The call hangs 30 s; the read returns at its 0.5 s timeout (an unbounded read would take the 30 s), and the
    next read does not call NVML again while that call is still stuck (it would wait another full timeout)."""
    first, second = _read(lib_dir, tmp_path, {"gpus": 2, "gpu1.hang_ms": 30000}, timeout_s=0.5)
    assert first["report"]["failure"] == "timeout" and first["problems"] == ["NVML did not answer within 0.5 s"]
    assert 0.4 < first["wall_s"] < 15
    assert second["report"]["failure"] == "timeout"
    assert second["problems"][0].startswith("NVML call hung for ")

"""nuro-healthcheck's pure parts: settings from the node env, the drain/resume plan, disk and agent-age readers."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from nuro.healthcheck.agent import write_status
from nuro.healthcheck.checks import Problem
from nuro.healthcheck.cli import HealthSettings, Outcome, agent_age_s, disk_free_bytes, plan_node_action
from nuro.slurm import DrainNode, ResumeNode

GIB = 1 << 30


def test_settings_defaults() -> None:
    s = HealthSettings.from_env({})
    assert (s.expected_gpus, s.probe, s.staging_root, s.agent_status_dir) == (
        None,
        "auto",
        "/var/tmp/nuro-staging",
        None,
    )
    assert s.staging_min_free_bytes == 20 * GIB
    assert s.limits.max_temperature_c == 90


def test_settings_from_env() -> None:
    s = HealthSettings.from_env(
        {
            "NURO_EXPECT_GPUS": "8",
            "NURO_HEALTH_PROBE": "none",
            "NURO_STAGING_ROOT": "/nvme/stage",
            "NURO_STAGING_MIN_FREE_GB": "0.5",
            "NURO_AGENT_STATUS_DIR": "/run/nuro-agent",
            "NURO_HEALTH_MAX_TEMPERATURE_C": "85",
            "NURO_AGENT_SILENT_S": "4",
        }
    )
    assert s.expected_gpus == 8 and s.probe == "none" and s.staging_root == "/nvme/stage"
    assert s.staging_min_free_bytes == GIB // 2 and s.agent_status_dir == "/run/nuro-agent"
    assert s.limits.max_temperature_c == 85 and s.limits.agent_silent_s == 4.0


@pytest.mark.parametrize("name,value", [("NURO_EXPECT_GPUS", "eight"), ("NURO_STAGING_MIN_FREE_GB", "-1")])
def test_bad_settings_name_the_variable(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=name):
        HealthSettings.from_env({name: value})


def _outcome(*messages: str) -> Outcome:
    return Outcome("gpu003", "periodic", tuple(Problem("x", m) for m in messages), None, None, None)


HOT = "gpu1: temperature 93 C ≥ 90 C"
PLANS = {
    "unhealthy, not drained -> drain": (
        _outcome(HOT),
        False,
        None,
        "drained",
        DrainNode("gpu003", f"nuro-health: {HOT}"),
    ),
    "unhealthy, our other reason -> update": (
        _outcome(HOT),
        True,
        "nuro-health: gpu count 7, expected 8",
        "drained",
        DrainNode("gpu003", f"nuro-health: {HOT}"),
    ),
    "unhealthy, our same reason -> nothing": (_outcome(HOT), True, f"nuro-health: {HOT}", "none", None),
    "unhealthy, admin drain -> keep": (_outcome(HOT), True, "fan replaced, testing", "kept-admin-drain", None),
    "healthy, our drain -> resume": (_outcome(), True, f"nuro-health: {HOT}", "resumed", ResumeNode("gpu003")),
    "healthy, admin drain -> keep": (_outcome(), True, "maintenance", "none", None),
    "healthy, not drained -> nothing": (_outcome(), False, None, "none", None),
}


@pytest.mark.parametrize("outcome,drained,reason,want_name,want_action", PLANS.values(), ids=PLANS.keys())
def test_plan_node_action(outcome, drained, reason, want_name, want_action) -> None:  # noqa: ANN001
    name, action, _detail = plan_node_action(outcome, drained, reason)
    assert (name, action) == (want_name, want_action)


def test_disk_free_of_a_dir_not_created_yet(tmp_path: Path) -> None:
    free = disk_free_bytes(str(tmp_path / "not" / "yet"))
    st = os.statvfs(tmp_path)
    assert abs(free - st.f_bavail * st.f_frsize) < 64 * 1024 * 1024


def test_agent_age_from_status_file(tmp_path: Path) -> None:
    assert agent_age_s(str(tmp_path), "gpu001", 1000.0) == math.inf
    write_status(tmp_path, "gpu001", {"last_beat": 990.0})
    assert agent_age_s(str(tmp_path), "gpu001", 1000.0) == 10.0
    (tmp_path / "gpu001.json").write_text("{torn")
    assert agent_age_s(str(tmp_path), "gpu001", 1000.0) == math.inf


def test_agent_xids_join_the_one_shot_report(tmp_path: Path) -> None:
    from nuro.healthcheck.cli import with_agent_xids
    from nuro.healthcheck.probes import FakeProbe

    agent_report = FakeProbe.healthy(2).with_gpu(1, xid_errors=(79,)).read()
    write_status(tmp_path, "gpu001", {"last_beat": 1.0, "gpu_report": agent_report.to_dict()})
    own = FakeProbe.healthy(2).with_gpu(1, xid_errors=(79, 48)).read()
    merged = with_agent_xids(own, str(tmp_path), "gpu001")
    assert [g.xid_errors for g in merged.gpus] == [(), (79, 48)]
    assert with_agent_xids(own, str(tmp_path), "other") == own

"""GPU claims (``nuro.protocol.gpujobs``): what the prolog records, the epilog forgets and the agent tags its points
with."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from nuro.healthcheck.beats import gpu_points
from nuro.healthcheck.probes import FakeProbe, NodeGpuReport
from nuro.protocol.gpujobs import DIR, forget, gpu_tags, parse_gpu_ids, record
from tests.unit.test_metrics_sdk_nodeagent import MemoryWriter, _agent


@pytest.mark.parametrize(
    ("text", "want"),
    [("0,1", (0, 1)), ("3", (3,)), ("0-3,6", (0, 1, 2, 3, 6)), (" 5,2 ", (2, 5)), ("", ()), (None, ())],
)
def test_slurm_job_gpus_is_parsed(text: str | None, want: tuple[int, ...]) -> None:
    assert parse_gpu_ids(text) == want


@pytest.mark.parametrize("text", ["gpu0", "0;1", "1-", "3-1", "-1", "0,,1"])
def test_bad_slurm_job_gpus_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="SLURM_JOB_GPUS"):
        parse_gpu_ids(text)


def test_record_read_forget(tmp_path: Path) -> None:
    path = record(tmp_path, "gpu003", "41", (0, 1), {"team": "perception", "run": "bev", "user": "ignored"})
    assert path == tmp_path / DIR / "gpu003" / "41.json"
    record(tmp_path, "gpu003", "42", (5,), {"team": "controls", "run": ""})
    record(tmp_path, "gpu004", "43", (0,), {})  # another node's claim, same shared root (the dev cluster)
    assert gpu_tags(tmp_path, "gpu003") == {
        0: {"job": "41", "team": "perception", "run": "bev"},
        1: {"job": "41", "team": "perception", "run": "bev"},
        5: {"job": "42", "team": "controls"},
    }
    assert forget(tmp_path, "gpu003", "41") and not forget(tmp_path, "gpu003", "41")
    assert gpu_tags(tmp_path, "gpu003") == {5: {"job": "42", "team": "controls"}}
    assert gpu_tags(tmp_path, "gpu009") == {}  # no claims at all


def test_no_gpus_no_file_and_names_are_checked(tmp_path: Path) -> None:
    assert record(tmp_path, "gpu001", "7", (), {}) is None and not (tmp_path / DIR).exists()
    with pytest.raises(ValueError, match="job id"):
        record(tmp_path, "gpu001", "../7", (0,), {})
    with pytest.raises(ValueError, match="node name"):
        record(tmp_path, "../etc", "7", (0,), {})


def test_a_stale_claim_loses_to_the_newer_one_and_junk_is_skipped(tmp_path: Path) -> None:
    old = record(tmp_path, "n1", "10", (0, 1), {})  # its epilog never ran (the node crashed)
    assert old is not None
    os.utime(old, ns=(time.time_ns() - 10**10,) * 2)
    record(tmp_path, "n1", "11", (1,), {})
    (tmp_path / DIR / "n1" / "12.json").write_text("{half")
    assert gpu_tags(tmp_path, "n1") == {0: {"job": "10"}, 1: {"job": "11"}}


def test_points_of_claimed_gpus_carry_the_job(tmp_path: Path) -> None:
    record(tmp_path, "gpu007", "99", (2,), {"team": "perception", "run": "bev"})
    report = replace(FakeProbe.healthy(4).read(), taken_at=1.0)
    points = gpu_points(report, "gpu007", jobs=gpu_tags(tmp_path, "gpu007"))
    tagged = {p.tags["gpu"]: p.tags.get("job") for p in points}
    assert tagged == {"0": None, "1": None, "2": "99", "3": None}
    assert points[2].tags["team"] == "perception" and points[2].tags["node"] == "gpu007"
    assert gpu_points(NodeGpuReport(probe="none", taken_at=1.0), "gpu007", jobs={0: {"job": "1"}}) == []


def test_the_agent_reads_the_claims_under_its_staging_root(tmp_path: Path) -> None:
    writer = MemoryWriter()
    agent = _agent(FakeProbe.healthy(2), writer)
    agent.config = replace(agent.config, health=replace(agent.config.health, staging_root=str(tmp_path)))
    agent.probe_once()
    assert all("job" not in p.tags for p in writer.points)
    record(tmp_path, "gpu007", "5", (1,), {"team": "controls"})
    agent.probe_once()
    assert [p.tags.get("job") for p in writer.points[2:]] == [None, "5"]


def test_a_claim_takes_team_and_run_from_the_job_record_only(tmp_path: Path) -> None:
    from nuro.protocol import jobrecord
    from nuro.protocol.gpujobs import claim

    comment = '{"nuro":{"name":"their-run","team":"nlp"}}'  # names another team than the job's account
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "1000", "SLURM_JOB_USER": "alice",
           "SLURM_JOB_ACCOUNT": "vision", "SLURMD_NODENAME": "gpu001", "SLURM_JOB_COMMENT": comment}  # fmt: skip
    claim(tmp_path, jobrecord.from_prolog_env(env), (0, 1))
    assert gpu_tags(tmp_path, "gpu001") == {0: {"job": "12", "team": "vision"}, 1: {"job": "12", "team": "vision"}}

"""nuro-controller's config: typos and inconsistent timeouts fail at start with every problem listed."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nuro.slurm import ClusterSnapshot, JobInfo, JobPhase
from nuro.slurm_plugins.controller.config import ConfigError, load_config


def test_relative_policy_path_is_resolved_beside_the_config(tmp_path: Path) -> None:
    cfg_file = tmp_path / "controller.yaml"
    cfg_file.write_text("policy: teams.yaml\ninterval_s: 0.5\nlog_format: json\n")
    cfg = load_config(cfg_file)
    assert cfg.policy == tmp_path / "teams.yaml" and cfg.interval_s == 0.5 and cfg.log_format == "json"


def test_unknown_keys_and_bad_values_are_all_reported(tmp_path: Path) -> None:
    cfg_file = tmp_path / "controller.yaml"
    cfg_file.write_text("policy: t.yaml\nintervall_s: 1\nlog_format: xml\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg_file)
    msg = str(err.value)
    assert "intervall_s: unknown key" in msg and "log_format" in msg and "valid keys: policy, slurm_conf" in msg


def test_a_slurm_timeout_shorter_than_a_cycle_is_refused(tmp_path: Path) -> None:
    cfg_file = tmp_path / "controller.yaml"
    cfg_file.write_text("policy: t.yaml\ninterval_s: 10\nslurm_timeout_s: 2\n")
    with pytest.raises(ConfigError, match="raise slurm_timeout_s"):
        load_config(cfg_file)


def test_missing_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_in_flight_preemptions_are_rebuilt_from_job_comments() -> None:
    from nuro.slurm_plugins.controller.engine import rebuild_state

    def job(jid: int, state: str, comment: str) -> JobInfo:
        return JobInfo(job_id=jid, name="j", user="u", state=state, phase=JobPhase(state), comment=comment)

    from nuro.protocol import jobcomment, marks

    def signed(jid: int, at: int) -> str:
        return jobcomment.canonical({"preempt": marks.sign(jid, at, 9, "reclaim")})

    snap = ClusterSnapshot(
        nodes=(),
        jobs=(
            job(1, "RUNNING", signed(1, 100)),
            job(2, "RUNNING", '{"ckpt":{"at":5,"step":1}}'),
            job(3, "PENDING", signed(3, 50)),  # requeued already: not in flight
            job(4, "RUNNING", '{"preempt":{"at":100,"for":9}}'),  # written by the job's user: unsigned
            job(5, "RUNNING", signed(1, 100)),  # job 1's mark copied into job 5: signed for another job
        ),
        partitions=(),
        taken_at=datetime.now(UTC),
    )
    assert dict(rebuild_state(snap).preempting) == {1: 100.0}


# -- the daemon's clocks and loops --------------------------------------------------------------------------------
def test_the_clock_offset_hook_steps_the_wall_clock_only_when_set(tmp_path: Path) -> None:
    from nuro.slurm_plugins.controller.daemon import CLOCK_OFFSET_ENV, OffsetClock, wall_clock_from_env

    assert wall_clock_from_env({}) is time.time  # production: the plain system clock
    path = tmp_path / "offset"
    clock = wall_clock_from_env({CLOCK_OFFSET_ENV: str(path)})
    assert isinstance(clock, OffsetClock) and abs(clock() - time.time()) < 1  # no file: no offset
    path.write_text("-30\n")
    clock._read_at = float("-inf")
    assert abs(clock() - (time.time() - 30)) < 1
    path.write_text("x" * 1000)  # garbage (and more than it reads): offset 0, never an error
    clock._read_at = float("-inf")
    assert abs(clock() - time.time()) < 1


def test_the_policy_loop_outlives_a_cycle_that_raises() -> None:
    import threading

    from nuro.slurm_plugins.controller.daemon import Controller
    from tests.unit.test_engine_builders import a_policy

    class Broken:
        calls = 0

        def read_snapshot(self) -> ClusterSnapshot:
            Broken.calls += 1
            raise RuntimeError("a parser bug")

    stop = threading.Event()
    ctl = Controller(Broken(), a_policy(8).team("a", quota=8).build())  # type: ignore[arg-type]
    t = threading.Thread(target=ctl.run, args=(0.05, stop))
    t.start()
    time.sleep(0.5)
    stop.set()
    t.join(5)
    assert not t.is_alive() and Broken.calls >= 3  # it kept cycling

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


def test_in_flight_preemptions_come_back_from_the_ledger_whatever_the_comments_say(tmp_path: Path) -> None:
    """Issue 30: a restarted controller finishes the preemptions its own ledger holds; a job's comment (which its
    user writes, up to Slurm's 1,024 bytes) neither adds nor hides one."""
    from nuro.slurm_plugins.controller.engine import rebuild_state
    from nuro.slurm_plugins.controller.ledger import Ledger

    def job(jid: int, state: str, comment: str = "", started: float = 50.0) -> JobInfo:
        return JobInfo(job_id=jid, name="j", user="u", state=state, phase=JobPhase(state), comment=comment,
                       start_time=datetime.fromtimestamp(started, UTC))  # fmt: skip

    ledger = Ledger(tmp_path / "state")
    assert ledger.load() == {}  # no file yet: nothing in flight
    assert ledger.save({1: 100.4, 3: 50.0, 6: 100.0}, {1: 9, 3: 9}) is True
    assert ledger.save({1: 100.4, 3: 50.0, 6: 100.0}, {1: 9, 3: 9}) is False  # unchanged: not written again
    assert (tmp_path / "state" / "preemptions.json").stat().st_mode & 0o777 == 0o600
    entries = Ledger(tmp_path / "state").load()
    assert entries == {1: (100.0, 9), 3: (50.0, 9), 6: (100.0, None)}
    snap = ClusterSnapshot(
        nodes=(),
        jobs=(
            job(1, "RUNNING", "x" * 1024),  # its user filled the comment: still in flight
            job(2, "RUNNING", '{"preempt":{"at":100,"for":9}}'),  # a user's own "mark": means nothing
            job(3, "PENDING"),  # requeued already: not in flight
            job(6, "RUNNING", started=200.0),  # started again after the signal: a new run, not a victim
        ),
        partitions=(),
        taken_at=datetime.now(UTC),
    )
    assert dict(rebuild_state(snap, {j: at for j, (at, _) in entries.items()}).preempting) == {1: 100.0}


def test_a_malformed_or_oversized_ledger_is_no_reason_not_to_start(tmp_path: Path) -> None:
    from nuro.slurm_plugins.controller.ledger import MAX_BYTES, Ledger

    d = tmp_path / "state"
    d.mkdir()
    for body in (b"{not json", b'{"format":"other"}', b'{"format":"nuro.preemptions/v1","preempting":{"x":{}}}',
                 b" " * (MAX_BYTES + 1)):  # fmt: skip
        (d / "preemptions.json").write_bytes(body)
        assert Ledger(d).load() == {}
    (d / "preemptions.json").unlink()
    (d / "preemptions.json").symlink_to(tmp_path / "elsewhere")
    assert Ledger(d).load() == {}  # a link is never followed


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


def test_a_reader_beside_the_controller_rereads_the_ledger_only_when_it_changed(tmp_path: Path) -> None:
    from nuro.slurm_plugins.controller.ledger import Ledger
    from nuro.slurm_plugins.mlflow_bridge import controller_marks

    assert Ledger(tmp_path).current() == {}
    Ledger(tmp_path).save({7: 100.0}, {7: 9})
    marks = controller_marks(str(tmp_path))
    assert marks(7, ("gpu001",)).preempted_at == 100.0 and marks(8, ()).preempted_at is None
    Ledger(tmp_path).save({}, {})
    assert marks(7, ("gpu001",)).preempted_at is None

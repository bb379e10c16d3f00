"""nuro-controller with the failure detector: policy optional, heartbeat settings validated up front."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from nuro.slurm_plugins.controller.config import ConfigError, load_config
from nuro.slurm_plugins.controller.daemon import main


def test_detector_only_config_resolves_key_and_event_log_beside_it(tmp_path: Path) -> None:
    cfg_file = tmp_path / "controller.yaml"
    cfg_file.write_text("heartbeat_port: 6820\nheartbeat_key_file: hb.key\nevent_log: log/events.jsonl\n")
    cfg = load_config(cfg_file)
    assert cfg.policy is None and cfg.detector_on
    assert cfg.heartbeat_key_file == tmp_path / "hb.key" and cfg.event_log == tmp_path / "log" / "events.jsonl"
    assert (
        cfg.heartbeat_bind == "127.0.0.1"
        and cfg.miss_limit == 4
        and cfg.heartbeat_interval_s == 0.25
        and cfg.detector_tick_s == 0.25
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slurm_timeout_s: 15\n", "nothing to run"),
        ("heartbeat_port: 6820\n", "needs heartbeat_key_file"),
        ("heartbeat_port: 6820\nheartbeat_key_file: k\nmiss_limit: 1\n", "miss_limit"),
        ("heartbeat_port: 6820\nheartbeat_key_file: k\nheartbeat_interval_s: 0.1\n", "lower detector_tick_s"),
    ],
    ids=["neither-policy-nor-port", "port-without-key", "miss-limit-1", "tick-slower-than-beats"],
)
def test_inconsistent_detector_settings_are_refused(tmp_path: Path, text: str, message: str) -> None:
    cfg_file = tmp_path / "controller.yaml"
    cfg_file.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(cfg_file)


def test_cli_refuses_a_key_others_can_read_and_once_without_policy(tmp_path: Path) -> None:
    key = tmp_path / "hb.key"
    key.write_text("x" * 64)
    key.chmod(0o644)
    res = CliRunner().invoke(main, ["--heartbeat-port", "6820", "--heartbeat-key", str(key)])
    assert res.exit_code == 3 and "chmod 600" in res.stderr
    key.chmod(0o600)
    res = CliRunner().invoke(main, ["--heartbeat-port", "6820", "--heartbeat-key", str(key), "--once"])
    assert res.exit_code == 2 and "give --policy" in res.stderr
    assert CliRunner().invoke(main, []).exit_code == 2

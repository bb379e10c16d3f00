"""nuro.metrics.identities: a member's metrics credential is their team's file, picked the way the S3 key is."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from nuro.devcluster.tsdb import influx_config
from nuro.metrics import identities
from nuro.metrics.identities import MetricsCredentialsError, resolve
from nuro.metrics.sink import MetricsConfigError, sink_from_env


def _team_file(d: Path, team: str, mode: int = 0o600) -> Path:
    p = d / f"{team}.env"
    p.write_text(
        f"# {team}\nNURO_METRICS_URL=influx1://127.0.0.1:1/nuro_{team}\n"
        f"export NURO_METRICS_USER=team_{team}\nNURO_METRICS_TOKEN='pw-{team}'\nOTHER=ignored\n"
    )
    p.chmod(mode)
    return p


def test_the_team_file_supplies_url_user_and_token(tmp_path: Path) -> None:
    _team_file(tmp_path, "perception")
    env = resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path), "NURO_METRICS_URL": "influx1://x:1/nuro"})
    assert env["NURO_METRICS_URL"] == "influx1://127.0.0.1:1/nuro_perception"
    assert (env["NURO_METRICS_USER"], env["NURO_METRICS_TOKEN"]) == ("team_perception", "pw-perception")
    assert "OTHER" not in env


def test_nuro_team_picks_among_several_files_and_none_is_an_error(tmp_path: Path) -> None:
    _team_file(tmp_path, "perception")
    _team_file(tmp_path, "prediction")
    env = resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path), "NURO_TEAM": "prediction"})
    assert env["NURO_METRICS_USER"] == "team_prediction"
    with pytest.raises(MetricsCredentialsError, match="set NURO_TEAM"):
        resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path)})
    with pytest.raises(MetricsCredentialsError, match="not a team name"):
        resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path), "NURO_TEAM": "../etc"})
    with pytest.raises(MetricsCredentialsError, match="No such file"):
        resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path), "NURO_TEAM": "ranking"})


def test_a_direct_token_wins_and_no_credentials_change_nothing(tmp_path: Path) -> None:
    _team_file(tmp_path, "perception")
    root = {"NURO_METRICS_CREDENTIALS": str(tmp_path), "NURO_METRICS_TOKEN": "admin", "NURO_METRICS_URL": "u"}
    assert resolve(root) == root
    assert resolve({}) == {}
    assert type(sink_from_env({"NURO_METRICS_DB": str(tmp_path / "m.sqlite")})).__name__ == "SQLiteSink"


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "short.env").write_text("NURO_METRICS_URL=influx1://h:1/db\n")
    with pytest.raises(MetricsCredentialsError, match="lacks NURO_METRICS_USER, NURO_METRICS_TOKEN"):
        resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path / "short.env")})
    os.mkfifo(tmp_path / "fifo.env")
    with pytest.raises(MetricsCredentialsError, match="not a regular file"):
        resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path / "fifo.env")})
    (tmp_path / "big.env").write_bytes(b"#" * (70 * 1024))
    with pytest.raises(MetricsCredentialsError, match="larger than"):
        resolve({"NURO_METRICS_CREDENTIALS": str(tmp_path / "big.env")})
    assert issubclass(MetricsCredentialsError, MetricsConfigError)  # the CLIs report it as a config error


def test_influx1_user_means_basic_auth_else_token_header(tmp_path: Path) -> None:
    sink = sink_from_env({"NURO_METRICS_URL": "influx1://127.0.0.1:1/nuro_a", "NURO_METRICS_USER": "team_a",
                          "NURO_METRICS_TOKEN": "p:w"})  # fmt: skip
    assert sink._headers["Authorization"] == "Basic " + base64.b64encode(b"team_a:p:w").decode()
    sink = sink_from_env({"NURO_METRICS_URL": "influx1://127.0.0.1:1/nuro", "NURO_METRICS_TOKEN": "tok"})
    assert sink._headers["Authorization"] == "Token tok"


def test_identities_are_kept_across_calls_and_root_only(tmp_path: Path) -> None:
    first = identities.ensure_identities(tmp_path, ["b", "a"])
    assert first["teams"] == ["a", "b"] and set(first["users"]) == {"nuro_admin", "nuro_node", "team_a", "team_b"}
    assert (tmp_path / "users.json").stat().st_mode & 0o777 == 0o600
    again = identities.ensure_identities(tmp_path, ["a"])
    assert again["users"] == {k: v for k, v in first["users"].items() if k != "team_b"}
    assert identities.admin_env(tmp_path)["NURO_METRICS_TOKEN"] == first["users"]["nuro_admin"]
    assert identities.admin_env(tmp_path / "absent") == {}


def test_influxd_config_auth_flag() -> None:
    assert "auth-enabled = false" in influx_config(Path("/x"), 1, 2)
    assert "auth-enabled = true" in influx_config(Path("/x"), 1, 2, auth=True)


def test_a_team_database_reads_gpus_from_the_platform_database_with_the_same_credential() -> None:
    sink = sink_from_env({"NURO_METRICS_URL": "influx1://127.0.0.1:1/nuro_a", "NURO_METRICS_USER": "team_a",
                          "NURO_METRICS_TOKEN": "pw"})  # fmt: skip
    gpu = identities.platform_view(sink)
    assert gpu is not sink and gpu.db == "nuro" and gpu._headers == sink._headers
    platform = sink_from_env({"NURO_METRICS_URL": "influx1://127.0.0.1:1/nuro"})
    assert identities.platform_view(platform) is platform

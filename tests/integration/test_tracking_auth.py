"""Team boundaries in MLflow (issue 18): on a real MLflow 3.17 server with its basic-auth app (nothing visible
unless granted), ``nuro-admin tracking access`` gives each team an account that reads its own experiment and
nothing else; the bridge's admin account writes everywhere; nobody gets in without an account."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nuro.devcluster.tracking import standalone_mlflow
from nuro.tracking import mirror
from nuro.tracking.mlflow import MlflowClient, MlflowRejected
from tests.integration.conftest import REPO

PORT = int(os.environ.get("NURO_TEST_MLFLOW_AUTH_PORT", "9465"))
BIN = Path(sys.executable).parent
ADMIN_PASSWORD = "nuro-admin-test-password-1"


def _creds(path: Path) -> tuple[str, str]:
    values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return values["MLFLOW_TRACKING_USERNAME"], values["MLFLOW_TRACKING_PASSWORD"]


def test_each_team_account_reads_only_its_own_experiment(tmp_path: Path) -> None:
    state = tmp_path / "mlflow"
    creds = tmp_path / "creds"
    policy = tmp_path / "teams.yaml"
    raw = yaml.safe_load((REPO / "examples" / "policy" / "teams.yaml").read_text())
    policy.write_text(yaml.safe_dump(raw))
    try:
        with standalone_mlflow(state, PORT, admin_password=ADMIN_PASSWORD) as server:
            env = {**os.environ, "MLFLOW_TRACKING_URI": server.url, "MLFLOW_TRACKING_USERNAME": "admin",
                   "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD}  # fmt: skip
            argv = [str(BIN / "nuro-admin"), "tracking", "access", str(policy), "--credentials-dir", str(creds)]
            first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            assert first.returncode == 0, first.stderr
            again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
            assert again.returncode == 0 and "(kept)" in again.stdout and "(created)" not in again.stdout, again
            files = sorted(p.name for p in creds.glob("*.env"))
            assert files == ["controls.env", "perception.env", "prediction.env", "simulation.env"]
            for f in creds.glob("*.env"):
                mode = stat.S_IMODE(f.stat().st_mode)
                assert mode in (0o600, 0o640) and not mode & 0o007, (f, oct(mode))  # never world-readable

            admin = MlflowClient(server.url, user="admin", password=ADMIN_PASSWORD)  # the bridge's account
            runs = {}
            for team in ("perception", "prediction"):
                exp = admin.experiment_id(mirror.experiment_name(team))
                runs[team] = (exp, admin.create_run(exp, f"{team}-run", tags={mirror.TAG_JOB: "1"}))
            user, password = _creds(creds / "perception.env")
            assert user == "team-perception"
            mine = MlflowClient(server.url, user=user, password=password)
            assert mine.get_run(runs["perception"][1])["info"]["run_name"] == "perception-run"
            found, _ = mine.search_runs([runs["perception"][0]])
            assert [r["info"]["run_id"] for r in found] == [runs["perception"][1]]
            with pytest.raises(MlflowRejected, match="403|PERMISSION_DENIED"):
                mine.get_run(runs["prediction"][1])  # another team's run
            assert mine.search_runs([runs["prediction"][0]])[0] == []  # searches are filtered: nothing to see
            with pytest.raises(MlflowRejected, match="403|PERMISSION_DENIED"):
                mine.create_run(runs["perception"][0], "forged")  # READ only: only the bridge writes
            with pytest.raises(MlflowRejected, match="401"):
                MlflowClient(server.url).get_run(runs["perception"][1])  # no account, nothing
            with pytest.raises(MlflowRejected, match="401"):
                MlflowClient(server.url, user=user, password="wrong").get_run(runs["perception"][1])
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)

"""No secret on a command line (issue 30): every user of a host sees every process's argv in ``ps``.

The shipped systemd units and the environment files Ansible renders for them are checked together: each unit's
ExecStart is expanded the way systemd expands it (``${VAR}`` and ``$VAR`` from its EnvironmentFile) with a rendered
file full of known secrets, and none of them may land in the resulting argv. The dev cluster's own commands
(MLflow, the MariaDB user for slurmdbd) are checked the same way.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from nuro.devcluster import supervisor, tracking
from nuro.devcluster.layout import DB_PASSWORD

REPO = Path(__file__).resolve().parents[2]
UNITS = [
    *sorted((REPO / "ansible" / "files").glob("*.service")),
    REPO / "healthcheck" / "systemd" / "nuro-nodeagent.service",
]
DB_URI = "postgresql://mlflow:db-Pa55-word@db.internal/mlflow"
SECRETS = {
    "nuro_mlflow_backend_store_uri": DB_URI,
    "nuro_mlflow_admin_password": "admin-Pa55-word-123",
    "nuro_mlflow_secret_key": "f" * 64,
    "nuro_metrics_token": "metrics-t0ken",
}
#: What a variable named on a command line may never be called
_SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|CREDENTIAL|BACKEND_STORE|_KEY\b", re.I)


def _exec_lines(unit: Path) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.read_text().splitlines() if re.match(r"ExecStart(Pre|Post)?=", line)]


def _render_env_files() -> dict[str, str]:
    """The controller role's root-only env files, rendered as Ansible would with basic-auth on."""
    tasks = yaml.safe_load((REPO / "ansible" / "roles" / "slurm_controller" / "tasks" / "main.yml").read_text())
    (task,) = [t for t in tasks if t.get("name") == "MLflow and bridge settings (root only)"]
    env = jinja2.Environment()  # variables this test does not set render empty (other settings of the role)
    env.filters["bool"] = lambda v: v in (True, "true", "True", "yes", 1)
    values: dict[str, Any] = {
        **SECRETS, "nuro_mlflow_state_dir": "/var/lib/nuro/mlflow", "nuro_mlflow_bind": "127.0.0.1",
        "nuro_mlflow_port": 5000, "nuro_mlflow_basic_auth": True, "nuro_mlflow_url": "http://127.0.0.1:5000",
        "nuro_metrics_url": "http://tsdb:8086", "nuro_controller_waits_file": "/var/lib/nuro/waits.json",
    }  # fmt: skip
    return {item["name"]: env.from_string(item["content"]).render(**values) for item in task["loop"]}


def _parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def _expand(command: str, env: dict[str, str]) -> list[str]:
    """systemd's ExecStart expansion: ``${VAR}`` is one word, ``$VAR`` is split on white space."""
    out: list[str] = []
    for word in shlex.split(command):
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            out += env.get(word[1:], "").split()
        else:
            out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return out


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_no_shipped_unit_names_a_secret_on_its_command_line(unit: Path) -> None:
    for command in _exec_lines(unit):
        named = re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", command)
        assert not [n for n in named if _SECRET_NAME.search(n)], (unit.name, command)
        assert "--backend-store-uri" not in command and "--password" not in command, (unit.name, command)


def test_the_mlflow_units_expanded_with_the_rendered_env_files_hold_no_secret() -> None:
    files = _render_env_files()
    mlflow_env = _parse_env(files["mlflow.env"])
    assert mlflow_env["MLFLOW_BACKEND_STORE_URI"] == DB_URI  # mlflow server's own variable for --backend-store-uri
    assert mlflow_env["MLFLOW_AUTH_ADMIN_PASSWORD"] == SECRETS["nuro_mlflow_admin_password"]
    bridge_env = _parse_env(files["mlflow-bridge.env"])
    for unit, env in (("nuro-mlflow.service", mlflow_env), ("nuro-mlflow-bridge.service", bridge_env)):
        for command in _exec_lines(REPO / "ansible" / "files" / unit):
            argv = " ".join(_expand(command, env))
            assert not [s for s in SECRETS.values() if s in argv], (unit, argv)
    argv = _expand(_exec_lines(REPO / "ansible" / "files" / "nuro-mlflow.service")[0], mlflow_env)
    assert argv[1:2] == ["server"] and "--app-name" in argv and "127.0.0.1" in argv  # the rest still arrives


def test_the_dev_clusters_commands_hold_no_secret(tmp_path: Path) -> None:
    argv = tracking.mlflow_argv(Path("/x/mlflow"), tmp_path, 5000, auth=True)
    assert "--backend-store-uri" in argv and argv[argv.index("--backend-store-uri") + 1].startswith("sqlite:///")
    argv, stdin = supervisor.db_setup_command(tmp_path / "mysql.sock")
    assert DB_PASSWORD not in " ".join(argv) and "-e" not in argv
    assert f"IDENTIFIED BY '{DB_PASSWORD}'" in stdin

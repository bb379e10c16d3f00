"""The dev cluster's tracking UI: an MLflow server of our own, embedded and lean (issue 18).

Installed once per machine into its own venv, ``/var/cache/nuro/mlflow-<version>`` (root-owned, ~850 MB: pandas,
pyarrow, scipy, scikit-learn come with it), never into nuro's: nuro talks to it over REST
(``nuro.tracking.mlflow``). Measured here: the default server is ~15 processes and
~3.1 GB; with ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`` and ``--workers 1`` it is 2 processes, ~400 MB, up in ~4 s.

What is pinned and why: SQLite backend store and a local artifact root in the state dir (no extra service);
``127.0.0.1`` only; telemetry off (``MLFLOW_DISABLE_TELEMETRY``); one worker, no job execution. Started as our child
and stopped by PID (``LocalServer``), never by name.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import urllib3

from nuro.devcluster.install import machine_lock
from nuro.devcluster.tsdb import LocalServer

MLFLOW_VERSION = "3.17.2"
CACHE_ROOT = Path("/var/cache/nuro")
_HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=0.5, read=5.0))
#: the lean server's environment (see the module docstring)
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
              "DO_NOT_TRACK": "true"}  # fmt: skip


#: ``0`` leaves the dev cluster without MLflow (the test suite's clusters: the tracking test runs its own server)
ENV_ENABLED = "NURO_DEVCLUSTER_MLFLOW"


def enabled(env: dict[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get(ENV_ENABLED, "1") != "0"


class TrackingError(RuntimeError):
    """MLflow could not be installed or started; the message says which step and why."""


def venv_dir(root: Path = CACHE_ROOT, version: str = MLFLOW_VERSION) -> Path:
    return root / f"mlflow-{version}"


def ensure_mlflow(root: Path = CACHE_ROOT, version: str = MLFLOW_VERSION) -> Path:
    """The ``mlflow`` executable of the cached venv, installed first when missing (pip, one builder per machine;
    ``mlflow[auth]``: the basic-auth app too).

    A venv's scripts name its own path, so it is built in place, not renamed: a marker file written last names what
    was installed; a directory without it (a crashed install) is removed and built again, one with another spec
    (an older nuro's) gets the new one installed into it."""
    final = venv_dir(root, version)
    exe, done = final / "bin" / "mlflow", final / ".nuro-complete"
    spec = f"mlflow[auth]=={version}"
    if done.exists() and done.read_text().strip() == spec:
        return exe
    root.mkdir(parents=True, exist_ok=True)
    with machine_lock(f"mlflow-{version}"):
        if done.exists() and done.read_text().strip() == spec:
            return exe
        steps = [[str(final / "bin" / "pip"), "install", "-q", spec]]
        if not done.exists():
            shutil.rmtree(final, ignore_errors=True)
            python = "/usr/bin/python3.11" if Path("/usr/bin/python3.11").exists() else sys.executable
            steps.insert(0, [python, "-m", "venv", str(final)])
        for argv in steps:
            res = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if res.returncode != 0:
                if not done.exists():
                    shutil.rmtree(final, ignore_errors=True)
                raise TrackingError(f"installing MLflow {version}: {' '.join(argv[:4])} failed:\n{res.stderr[-2000:]}")
        done.write_text(spec + "\n")
    return exe


def mlflow_argv(exe: Path, state_dir: Path, port: int, auth: bool = False) -> list[str]:
    """``auth``: MLflow's basic-auth app (users, per-experiment permissions; ``auth_config``)."""
    return [
        str(exe), "server", "--backend-store-uri", f"sqlite:///{state_dir / 'mlflow.db'}",
        "--artifacts-destination", str(state_dir / "artifacts"), "--serve-artifacts",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        *(["--app-name", "basic-auth"] if auth else []),
    ]  # fmt: skip


def auth_config(state_dir: Path) -> Path:
    """basic-auth's settings for a server where nobody sees anything not granted (``NO_PERMISSIONS`` by default:
    team boundaries, ``nuro.tracking.access``); users in ``auth.db`` beside the runs."""
    path = state_dir / "basic_auth.ini"
    path.write_text(
        "[mlflow]\ndefault_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{state_dir / 'auth.db'}\nadmin_username = admin\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        "grant_default_workspace_access = false\n"
    )
    return path


def mlflow_ready(base_url: str) -> bool:
    try:
        return _HTTP.request("GET", f"{base_url}/health").status == 200
    except urllib3.exceptions.HTTPError:
        return False


def _csrf_secret(state_dir: Path) -> str:
    """The basic-auth app's CSRF key, made once per state dir (a restarted server keeps its sessions valid)."""
    path = state_dir / "flask-secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return path.read_text().strip()


def mlflow_server(state_dir: Path, port: int, admin_password: str | None = None) -> LocalServer:
    """An MLflow server on ``port`` with its SQLite store and artifacts in ``state_dir`` (not started);
    ``admin_password``: with the basic-auth app, its admin ``admin`` having this password."""
    state_dir.mkdir(parents=True, exist_ok=True)
    exe = ensure_mlflow()
    env = {**os.environ, **SERVER_ENV}
    if admin_password is not None:
        env.update(MLFLOW_AUTH_CONFIG_PATH=str(auth_config(state_dir)), MLFLOW_AUTH_ADMIN_PASSWORD=admin_password,
                   MLFLOW_FLASK_SERVER_SECRET_KEY=_csrf_secret(state_dir))  # fmt: skip
    argv = mlflow_argv(exe, state_dir, port, auth=admin_password is not None)
    return LocalServer("mlflow", argv, port, state_dir / "mlflow.log", mlflow_ready, env=env)


@contextmanager
def standalone_mlflow(state_dir: Path, port: int, admin_password: str | None = None) -> Iterator[LocalServer]:
    """An MLflow server of our own for tests and benches; stopped by PID on exit (its data stays in ``state_dir``).
    ``admin_password``: with the basic-auth app (``mlflow_server``)."""
    server = mlflow_server(state_dir, port, admin_password)
    server.start(timeout_s=120)
    try:
        yield server
    finally:
        server.stop()

"""Team boundaries in MLflow: one experiment and one account per team, each account reaching only its own.

MLflow's open-source server enforces permissions only with its basic-auth app (``mlflow server --app-name
basic-auth``, ``default_permission = NO_PERMISSIONS`` in its ``basic_auth.ini``). On such a server this module gives
each team of ``teams.yaml`` the account ``team-<team>`` with ``READ`` on its experiment ``nuro/<team>`` and nothing
else, the way each team has its own S3 key: the account's password lives in ``<credentials dir>/<team>.env``
(``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``), mode 0640 ``root:nuro-<team>``, so only the team's
members read it (in the browser it is the login; ``nuro-train open`` and MLflow's own clients read the variables).
The bridge writes as the server's admin, the only account with ``EDIT``. Kept idempotent: run it after every
policy change (``nuro-admin tracking access``); a password is generated once and kept.
"""

from __future__ import annotations

import grp
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from nuro.safeio.atomic import write_atomic
from nuro.tracking import mirror
from nuro.tracking.mlflow import MlflowClient

TEAM_USER_PREFIX = "team-"
TEAM_GROUP_PREFIX = "nuro-"


def team_user(team: str) -> str:
    return f"{TEAM_USER_PREFIX}{team}"


def _read_password(path: Path) -> str | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "MLFLOW_TRACKING_PASSWORD" and value:
                return value
    except OSError:
        return None
    return None


def team_credentials(creds_dir: Path, team: str) -> str:
    """The team account's password: the one in ``<creds_dir>/<team>.env``, else a new one written there (0640
    ``root:nuro-<team>`` when that group exists, else 0600 root)."""
    path = creds_dir / f"{team}.env"
    password = _read_password(path)
    if password:
        return password
    password = secrets.token_urlsafe(24)
    creds_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    try:
        gid = grp.getgrnam(f"{TEAM_GROUP_PREFIX}{team}").gr_gid
    except KeyError:
        gid = None
    shared = gid is not None and os.geteuid() == 0
    body = f"MLFLOW_TRACKING_USERNAME={team_user(team)}\nMLFLOW_TRACKING_PASSWORD={password}\n"
    write_atomic(path, body, 0o640 if shared else 0o600, owner=(0, gid) if shared and gid is not None else None)
    return password


def apply_access(client: MlflowClient, teams: Iterable[str], creds_dir: Path, permission: str = "READ") -> dict:
    """Every team's experiment and account, the account granted ``permission`` on its experiment only; what was
    done, by team (``{"experiment_id", "user", "created"}``). ``client`` must be the server's admin."""
    done = {}
    for team in sorted(set(teams)):
        exp = client.experiment_id(mirror.experiment_name(team), tags=mirror.experiment_tags(team))
        assert exp is not None
        user = team_user(team)
        created = client.ensure_user(user, team_credentials(creds_dir, team))
        client.grant(user, exp, permission)
        done[team] = {"experiment_id": exp, "user": user, "created": created}
    return done


__all__ = ["TEAM_USER_PREFIX", "apply_access", "team_credentials", "team_user"]

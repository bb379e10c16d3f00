"""Who may write which metrics: per-team InfluxDB 1.x users and databases, and the files that carry their passwords.

Why databases and not tags (docs/security.md, "Metrics"): influxd 1.x grants are per database and cannot look at a
point's tags, so one shared database lets any writer tag a point ``team=<another team>``. Each team therefore
writes its own database ``nuro_<team>`` as its own user ``team_<team>`` (WRITE+READ there, nothing else); a point
in ``nuro_<team>`` was written by a member of that team by construction, whatever its ``team`` tag says. The
platform database ``nuro`` holds the node agents' ``gpu`` points, written by ``nuro_node``; the admin
``nuro_admin`` (root's shells, tests, demo) has all privileges. Team users may also READ ``nuro`` (the GPUs of
their jobs in ``nuro-train metrics``; ``platform_view``).

Passwords live in ``<influx_dir>/users.json`` (root 0600, reused across down/up, like the S3 secrets). A team's
credential reaches its members the way its S3 key does: ``<etc>/metrics/<team>.env`` (0640 root:``nuro-<team>``)
with ``NURO_METRICS_URL``, ``NURO_METRICS_USER`` and ``NURO_METRICS_TOKEN``. ``NURO_METRICS_CREDENTIALS`` names that
directory (or one file); ``sink_from_env`` reads it when no token is given directly, picking ``<team>.env`` by
``NURO_TEAM`` or the one file the user can read (``nuro.safeio.credfile.pick_team_file``).
"""

from __future__ import annotations

import grp
import json
import secrets
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path

import urllib3

from nuro.metrics.base import ENV_TOKEN, ENV_URL, MetricsConfigError
from nuro.metrics.influx import InfluxV1Sink, basic_auth, quote_ident, quote_str
from nuro.protocol.envnames import NURO_TEAM
from nuro.safeio import credfile
from nuro.safeio.atomic import write_atomic
from nuro.safeio.credfile import team_group

ENV_CREDENTIALS = "NURO_METRICS_CREDENTIALS"
ENV_USER = "NURO_METRICS_USER"
ADMIN_USER = "nuro_admin"
NODE_USER = "nuro_node"
PLATFORM_DB = "nuro"
USERS_FILE = "users.json"
_KEYS = (ENV_URL, ENV_USER, ENV_TOKEN)
_HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=1.0, read=10.0))


class MetricsCredentialsError(MetricsConfigError):
    """``NURO_METRICS_CREDENTIALS`` names no file this user can use; the message says which and why."""


class ProvisionError(RuntimeError):
    """influxd refused a user/database statement; the message names the statement and the answer."""


def team_user(team: str) -> str:
    return f"team_{team}"


def team_db(team: str) -> str:
    return f"nuro_{team}"


# -- passwords ------------------------------------------------------------------------------------------------------
def read_identities(influx_dir: Path) -> dict:
    """``{"users": {user: password}, "teams": [...]}`` of ``users.json``; ``{}`` when absent or unreadable (a user
    who is not root, an old state dir)."""
    try:
        data = json.loads((influx_dir / USERS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("users"), dict) else {}


def ensure_identities(influx_dir: Path, teams: Iterable[str]) -> dict:
    """Passwords for the admin, the node and each team (old ones kept, new ones random); ``users.json`` rewritten
    root 0600. Teams no longer listed lose their entry (their influxd user stays, with no file to reach it)."""
    old = read_identities(influx_dir).get("users", {})
    teams = sorted(set(teams))
    names = [ADMIN_USER, NODE_USER, *(team_user(t) for t in teams)]
    users = {n: old.get(n) or secrets.token_urlsafe(24) for n in names}
    data = {"users": users, "teams": teams}
    influx_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(influx_dir / USERS_FILE, json.dumps(data, indent=1), 0o600)
    return data


def admin_env(influx_dir: Path) -> dict[str, str]:
    """``NURO_METRICS_USER``/``TOKEN`` of the admin, for root's ``devcluster env``; ``{}`` if unreadable here."""
    pw = read_identities(influx_dir).get("users", {}).get(ADMIN_USER)
    return {ENV_USER: ADMIN_USER, ENV_TOKEN: pw} if pw else {}


def node_env(identities: Mapping) -> dict[str, str]:
    """The node agents' metrics identity (nuro.env, root 0600): write the platform database only."""
    return {ENV_USER: NODE_USER, ENV_TOKEN: identities["users"][NODE_USER]}


def write_team_files(identities: Mapping, creds_dir: Path, base_url_of_db) -> None:  # noqa: ANN001
    """``<creds_dir>/<team>.env`` per team, 0640 root:``nuro-<team>`` (the group the S3 provisioning made);
    ``base_url_of_db(db)`` gives the ``NURO_METRICS_URL`` for a database. Files of dropped teams are removed."""
    creds_dir.mkdir(parents=True, exist_ok=True)
    creds_dir.chmod(0o755)
    teams = list(identities.get("teams", []))
    for team in teams:
        user = team_user(team)
        body = (
            f"{ENV_URL}={base_url_of_db(team_db(team))}\n{ENV_USER}={user}\n{ENV_TOKEN}={identities['users'][user]}\n"
        )
        write_atomic(creds_dir / f"{team}.env", body, 0o640, owner=(0, grp.getgrnam(team_group(team)).gr_gid))
    for stale in creds_dir.glob("*.env"):
        if stale.name.removesuffix(".env") not in teams:
            stale.unlink()


# -- influxd users, databases, grants --------------------------------------------------------------------------------
def _query(base_url: str, stmt: str, auth: tuple[str, str] | None) -> tuple[int, str]:
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    if auth:
        headers["Authorization"] = basic_auth(*auth)
    try:
        resp = _HTTP.request("POST", f"{base_url}/query", body=urllib.parse.urlencode({"q": stmt}), headers=headers)
    except urllib3.exceptions.HTTPError as exc:
        raise ProvisionError(f"influxd {base_url}: {stmt.split(' WITH ')[0]}: {exc}") from exc
    return resp.status, resp.data.decode(errors="replace")


def _must(base_url: str, stmt: str, auth: tuple[str, str]) -> str:
    status, text = _query(base_url, stmt, auth)
    if status != 200 or '"error"' in text:
        shown = stmt.split(" WITH PASSWORD")[0].split(" = '")[0]  # never log a password
        raise ProvisionError(f"influxd {base_url}: {shown} answered {status}: {text[:300]}")
    return text


def provision_auth(base_url: str, identities: Mapping) -> None:
    """Users, databases and grants on an ``auth-enabled`` influxd (idempotent; passwords reset to ``identities``).

    The first admin can be created without credentials only while no user exists (influxd's bootstrap rule);
    afterwards every statement runs as that admin.
    """
    users = identities["users"]
    admin = (ADMIN_USER, users[ADMIN_USER])
    _query(
        base_url, f"CREATE USER {quote_ident(ADMIN_USER)} WITH PASSWORD {quote_str(admin[1])} WITH ALL PRIVILEGES", None
    )

    def user(name: str) -> None:
        stmt = f"CREATE USER {quote_ident(name)} WITH PASSWORD {quote_str(users[name])}"
        status, text = _query(base_url, stmt, admin)
        if "already exists" in text:
            _must(base_url, f"SET PASSWORD FOR {quote_ident(name)} = {quote_str(users[name])}", admin)
        elif status != 200 or '"error"' in text:
            raise ProvisionError(f"influxd {base_url}: CREATE USER {name} answered {status}: {text[:300]}")

    user(ADMIN_USER)
    _must(base_url, f"GRANT ALL PRIVILEGES TO {quote_ident(ADMIN_USER)}", admin)
    _must(base_url, f"CREATE DATABASE {quote_ident(PLATFORM_DB)}", admin)
    user(NODE_USER)
    _must(base_url, f"GRANT ALL ON {quote_ident(PLATFORM_DB)} TO {quote_ident(NODE_USER)}", admin)
    for team in identities.get("teams", []):
        name, db = team_user(team), team_db(team)
        _must(base_url, f"CREATE DATABASE {quote_ident(db)}", admin)
        user(name)
        _must(base_url, f"GRANT ALL ON {quote_ident(db)} TO {quote_ident(name)}", admin)
        _must(base_url, f"GRANT READ ON {quote_ident(PLATFORM_DB)} TO {quote_ident(name)}", admin)


def platform_view(sink: object) -> object:
    """The sink holding the agents' ``gpu`` points for a reader of ``sink``: the platform database beside a
    team's InfluxDB 1.x database (team users may read it), else ``sink`` itself."""
    if isinstance(sink, InfluxV1Sink) and sink.db.startswith("nuro_"):
        return sink.sibling(PLATFORM_DB)
    return sink


# -- a member's credential -----------------------------------------------------------------------------------------
def _read_env_file(path: Path) -> dict[str, str]:
    try:
        values = credfile.read_env_file(path, "metrics credentials")
    except credfile.CredentialFileError as exc:
        raise MetricsCredentialsError(str(exc)) from None
    missing = [k for k in _KEYS if not values.get(k)]
    if missing:
        raise MetricsCredentialsError(f"metrics credentials {path} lacks {', '.join(missing)}")
    return {k: values[k] for k in _KEYS}


def resolve(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with the team's URL/user/token from ``NURO_METRICS_CREDENTIALS`` when no token is set directly
    (root and the nodes set one; a member's shell and jobs do not). Unchanged otherwise."""
    spec = env.get(ENV_CREDENTIALS, "").strip()
    if not spec or env.get(ENV_TOKEN):
        return env
    try:
        path, _team = credfile.pick_team_file(spec, env.get(NURO_TEAM) or None, "metrics credentials")
    except credfile.CredentialFileError as exc:
        raise MetricsCredentialsError(f"{ENV_CREDENTIALS}={spec}: {exc}") from None
    return {**env, **_read_env_file(path)}

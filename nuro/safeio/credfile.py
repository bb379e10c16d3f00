"""Team credential files (``<dir>/<team>.env``, mode 0640 root:nuro-<team>): how a member's tools find and read
theirs. One reader for the S3 keys (``nuro.objectstore``) and the metrics login (``nuro.metrics.identities``), and
the one name of the Unix group that may read them (``team_group``: the dev cluster's S3 and metrics provisioning
both chown to it; Ansible's ``nuro_team_group_prefix`` is the same ``nuro-``).

A file is ``KEY=VALUE`` lines (blank lines, ``#`` comments and a leading ``export`` allowed), read at most 64 KiB,
regular files only and without blocking (a FIFO planted in its place must not hang a login shell's tools).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from nuro.names import validate_team

MAX_BYTES = 64 * 1024
SUFFIX = ".env"
TEAM_GROUP_PREFIX = "nuro-"  # the Unix group whose members may read team T's credential files: nuro-T


class CredentialFileError(Exception):
    """The credentials file cannot be used; the message says which file and why (and what to do)."""


def team_group(team: str) -> str:
    """The Unix group of team ``team``'s members: only they may read the team's S3 key and metrics login."""
    name = TEAM_GROUP_PREFIX + validate_team(team)
    if len(name) > 32:
        raise ValueError(f"team {team!r} is too long for a Unix group name {name!r} (32 characters at most)")
    return name


def read_env_file(path: str | Path, what: str) -> dict[str, str]:
    """Every ``KEY=VALUE`` of ``path``; ``what`` names the file's kind in messages ("S3 credentials")."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except PermissionError:
        raise CredentialFileError(
            f"cannot read {what} {path}: permission denied. Team credentials are readable only by the "
            "team's Unix group (check 'ls -l' and 'id'); use your own team's file"
        ) from None
    except OSError as exc:
        raise CredentialFileError(f"cannot read {what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a directory with its own error
        os.close(fd)
        raise CredentialFileError(f"{what} {path} is not a regular file")
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise CredentialFileError(f"{what} {path} is larger than {MAX_BYTES} bytes: not one")
    values: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if sep:
            values[key.strip()] = value.strip().strip("'\"")
    return values


def pick_team_file(spec: str | Path, team: str | None, what: str) -> tuple[Path, str | None]:
    """The file ``spec`` means, and the team it is for (its ``<team>.env`` name).

    A directory holds one ``<team>.env`` per team: ``team`` (``NURO_TEAM``) picks one; without it the one file
    this user may read is used (a member of one team), and several or none is an error that says what to set.
    """
    path = Path(spec)
    if not path.is_dir():
        return path, path.name.removesuffix(SUFFIX) if path.name.endswith(SUFFIX) else None
    if team:
        if "/" in team or team.startswith("."):
            raise CredentialFileError(f"NURO_TEAM={team!r} is not a team name")
        return path / f"{team}{SUFFIX}", team
    readable = sorted(p for p in path.glob(f"*{SUFFIX}") if os.access(p, os.R_OK))
    if len(readable) == 1:
        return readable[0], readable[0].name.removesuffix(SUFFIX)
    if not readable:
        raise CredentialFileError(
            f"no team {what} in {path} are readable by this user: you are in no team's Unix group "
            "(ask the platform admin to add you to your team)"
        )
    teams = ", ".join(p.name.removesuffix(SUFFIX) for p in readable)
    raise CredentialFileError(f"several team {what} in {path} are readable here ({teams}): set NURO_TEAM")

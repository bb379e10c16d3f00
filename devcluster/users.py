"""Real Unix users for the dev cluster's team members: jobs run as them, so they must exist (tests, demo, bench)."""

from __future__ import annotations

import pwd
import subprocess

from nuro.devcluster.install import machine_lock

#: Members named in examples/policy/teams.yaml.
POLICY_USERS = ("alice", "bob", "priya", "chen", "sam")


def ensure_unix_users(users: tuple[str, ...]) -> None:
    """``useradd`` each missing user (no home directory); existing users are left as they are. Needs root.
    Under a machine-wide lock: a second useradd while the first holds /etc/passwd's lock fails instead of waiting."""
    if all(_exists(u) for u in users):
        return
    with machine_lock("useradd"):
        for user in users:
            if not _exists(user):
                subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", user], check=True, timeout=30)


def _exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True

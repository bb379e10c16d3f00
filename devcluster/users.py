"""Real Unix users for the dev cluster's team members: jobs run as them, so they must exist (tests, demo, bench)."""

from __future__ import annotations

import pwd
import subprocess

#: Members named in examples/policy/teams.yaml.
POLICY_USERS = ("alice", "bob", "priya", "chen", "sam")


def ensure_unix_users(users: tuple[str, ...]) -> None:
    """``useradd`` each missing user (no home directory); existing users are left as they are. Needs root."""
    for user in users:
        try:
            pwd.getpwnam(user)
        except KeyError:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/bash", user], check=True, timeout=30)

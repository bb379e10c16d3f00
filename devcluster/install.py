"""Install the Debian packages the dev cluster runs (Slurm 22.05, munge, MariaDB), only when missing.

Idempotent and quiet when everything is present: one ``dpkg-query`` call decides. Installing needs root and the
Debian mirror; ``apt-get update`` runs first because a new machine can have empty package lists.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

#: What the dev cluster needs, and the binary each package provides (checked after install).
PACKAGES: dict[str, str] = {
    "slurmctld": "/usr/sbin/slurmctld",
    "slurmd": "/usr/sbin/slurmd",
    "slurmdbd": "/usr/sbin/slurmdbd",
    "slurm-client": "/usr/bin/sbatch",
    "slurm-wlm-basic-plugins": "/usr/lib/x86_64-linux-gnu/slurm-wlm/job_submit_lua.so",
    "munge": "/usr/sbin/munged",
    "mariadb-server": "/usr/sbin/mariadbd",
    "mariadb-client": "/usr/bin/mariadb-admin",
    "lua5.1": "/usr/bin/lua5.1",
    "influxdb": "/usr/bin/influxd",  # 1.6.7, v1 API: the dev cluster's metrics store (nuro.devcluster.tsdb)
}


class InstallError(RuntimeError):
    """Packages are missing and could not be installed; the message says which and what to run."""


def missing_packages(packages: list[str] | None = None) -> list[str]:
    """Packages not installed (``dpkg-query`` status other than 'install ok installed')."""
    names = packages or list(PACKAGES)
    proc = subprocess.run(
        ["dpkg-query", "-W", "-f", "${Package} ${Status}\n", *names],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    installed = {line.split()[0] for line in proc.stdout.splitlines() if line.endswith("install ok installed")}
    return [n for n in names if n not in installed]


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """An exclusive lock held by one process of this machine at a time (``flock`` on ``/run/lock/nuro-<name>.lock``).

    Why: two clusters brought up at once (two test shards, two engineers) would otherwise run apt-get side by side
    (the second fails on dpkg's lock) or useradd side by side (the second fails on /etc/passwd's lock)."""
    path = Path("/run/lock") / f"nuro-{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_packages(timeout_s: float = 900.0, packages: dict[str, str] | None = None) -> list[str]:
    """Install what is missing of ``packages`` (default: the dev cluster's); return what was installed."""
    names = list(packages or PACKAGES)
    if not missing_packages(names):
        log.debug("devcluster packages present")
        return []
    with machine_lock("apt"):
        return _install(names, timeout_s)


def _install(names: list[str], timeout_s: float) -> list[str]:
    missing = missing_packages(names)  # again, under the lock: another process may have installed them meanwhile
    if not missing:
        return []
    if os.geteuid() != 0:
        raise InstallError(
            f"missing Debian packages: {' '.join(missing)}. Run as root (nuro installs them with apt-get), "
            f"or install them first: apt-get install --no-install-recommends {' '.join(missing)}"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
    ):
        log.info("running %s", " ".join(argv))
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
        if proc.returncode != 0:
            raise InstallError(
                f"{' '.join(argv)} failed (exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}\n"
                "Check that the Debian mirror is reachable and no other apt/dpkg is running."
            )
    still = missing_packages(names)
    if still:
        raise InstallError(f"apt-get reported success but these are still missing: {' '.join(still)}")
    return missing

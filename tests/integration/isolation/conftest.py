"""Shared fixtures of the isolation tests: each test is an attack a team member runs against the real cluster.

Every attack test states, besides its own claim, the three things issue 11 asks of all of them:

- the other team's work is unchanged (``guard.watch_s3(prefix)``: every object under the prefix, byte for byte);
- no root-owned file changed owner or content (``guard`` records root-owned files of the cluster's state dir and a
  root-owned canary file outside it, ``guard.canary``, that attacks aim their symlinks at);
- the platform still runs (every daemon the supervisor started, nuro-controller with its failure detector and the
  node agents included, is alive afterwards, except nodes a test killed on purpose), and no node was drained or set
  down by the attack (issue 30: when something fails, the tenant who caused it loses, never a node or a team).

Teams and members come from examples/policy/teams.yaml, applied once per module: the attacker is alice of
perception, the victim team is prediction (priya).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nuro.devcluster.record import read_record
from nuro.objectstore import ObjectStore
from tests.integration.conftest import REPO, LiveCluster, cancel_jobs_of

BIN = Path(sys.executable).parent
POLICY = REPO / "examples" / "policy" / "teams.yaml"
ATTACKER, ATTACKER_TEAM = "alice", "perception"
VICTIM, VICTIM_TEAM = "priya", "prediction"
MEMBERS = ("alice", "bob", "priya", "chen", "sam")

#: Files under the state dir that root legitimately rewrites while the cluster runs (logs, records, databases).
_VOLATILE_PARTS = ("log", "mysql", "s3", "influxdb", "slurmctld", "run", "munge", "slurmd", "cgroup")


@pytest.fixture(scope="module")
def teams(cluster: LiveCluster) -> Iterator[Path]:
    """examples/policy/teams.yaml applied (accounts, QOS, the bridge's table); no member job before or after."""
    cluster.run([str(BIN / "nuro-admin"), "policy", "apply", str(POLICY)])
    cancel_jobs_of(cluster, MEMBERS)
    yield POLICY
    cancel_jobs_of(cluster, MEMBERS)


@pytest.fixture(scope="module")
def passthrough(cluster: LiveCluster, teams: Path) -> Iterator[None]:
    """The job_submit bridge without its table (jobs pass unchanged): the attacks on root's node-side code must not
    depend on the bridge, the first line of defence, having stopped them already."""
    table = Path(cluster.env["SLURM_CONF"]).parent / "nuro_policy.lua"
    saved = table.read_bytes() if table.exists() else None
    table.unlink(missing_ok=True)
    yield
    if saved is not None:
        table.write_bytes(saved)


@pytest.fixture
def shared(cluster: LiveCluster) -> Iterator[Path]:
    """A directory members' jobs can read their programs from and write their output to (pytest's tmp is root-only),
    inside the cluster's state dir, removed afterwards."""
    d = cluster.layout.root / f"iso-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _root_files(top: Path) -> dict[str, tuple[int, int, str]]:
    """Root-owned regular files below ``top`` (volatile daemon state skipped): path → (uid, gid, sha256)."""
    out: dict[str, tuple[int, int, str]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        rel = Path(dirpath).relative_to(top).parts
        if rel and rel[0] in _VOLATILE_PARTS:
            dirnames[:] = []
            continue
        for name in filenames:
            path = Path(dirpath) / name
            try:
                st = path.lstat()
                if st.st_uid != 0 or not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
                    continue
                out[str(path)] = (st.st_uid, st.st_gid, _digest(path.read_bytes()))
            except OSError:
                continue
    return out


@dataclass
class Guard:
    """What an attack must leave as it was; ``check()`` runs after the test (see the module docstring)."""

    cluster: LiveCluster
    canary: Path
    store: ObjectStore
    s3_before: dict[str, dict[str, str]] = field(default_factory=dict)
    files_before: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    killed_ok: set[str] = field(default_factory=set)
    #: nodes drained or down before the attack (not its doing), and nodes a test takes down on purpose
    out_before: set[str] = field(default_factory=set)
    out_ok: set[str] = field(default_factory=set)

    def objects(self, prefix: str) -> dict[str, str]:
        """key → sha256 of its bytes, for every object under ``prefix`` (read with the admin key)."""
        return {info.key: _digest(self.store.get(info.key)[0]) for info in self.store.list(prefix)}

    def watch_s3(self, prefix: str) -> dict[str, str]:
        """Remember every object under ``prefix`` now; ``check`` asserts they are byte-identical afterwards and
        that nothing was added under it. Returns what was there."""
        self.s3_before[prefix] = self.objects(prefix)
        return self.s3_before[prefix]

    def check(self) -> None:
        problems: list[str] = []
        for prefix, before in self.s3_before.items():
            after = self.objects(prefix)
            if after != before:
                changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                problems.append(f"objects under s3://{prefix} changed: {changed[:10]}")
        st = self.canary.lstat()
        if (st.st_uid, st.st_gid) != (0, 0) or not stat.S_ISREG(st.st_mode) or self.canary.read_bytes() != CANARY:
            problems.append(f"the root-owned canary {self.canary} changed (uid={st.st_uid} mode={st.st_mode:o})")
        after_files = _root_files(self.cluster.layout.root)
        etc = str(self.cluster.layout.etc) + os.sep
        for path, (uid, gid, sha) in self.files_before.items():
            now = after_files.get(path)
            if now is None and Path(path).exists():
                now = (Path(path).lstat().st_uid, Path(path).lstat().st_gid, "?")
            if now is not None and now[:2] != (uid, gid):
                problems.append(f"root-owned {path} now belongs to uid={now[0]} gid={now[1]}")
            elif path.startswith(etc) and now is not None and now[2] != sha:
                problems.append(f"root-owned config {path} changed content")  # etc/ changes only by `up`
        problems.extend(dead_daemons(self.cluster, self.killed_ok))
        out = nodes_out(self.cluster) - self.out_before - self.out_ok - self.killed_ok
        if out:  # the attacker loses, not a node; state and reason say who set it out
            nodes = [n for n in self.cluster.backend.nodes() if n.name in out]
            why = {n.name: f"{n.state} ({n.reason or 'no reason'})" for n in nodes}
            problems.append(f"nodes drained or set down by the attack: {dict(sorted(why.items()))}")
        assert not problems, "the attack left marks:\n  " + "\n  ".join(problems)


CANARY = b"root-owned canary: an attack must never change me\n"


def nodes_out(cluster: LiveCluster) -> set[str]:
    """Nodes slurmctld holds drained, draining or down now."""
    return {n.name for n in cluster.backend.nodes() if n.flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN"}}


def dead_daemons(cluster: LiveCluster, killed_ok: set[str] = frozenset()) -> list[str]:
    """Daemons the supervisor started that are no longer alive (nodes killed on purpose excepted)."""
    record = read_record(cluster.layout.record)
    if record is None:
        return ["the dev cluster's run record is gone"]
    killed = set(record.killed_nodes) | set(killed_ok)
    return [
        f"daemon {ref.name} (pid {ref.pid}) is not running"
        for ref in ([record.supervisor] if record.supervisor else []) + record.daemons
        if not ref.is_alive() and not any(ref.name.endswith(node) for node in killed)
    ]


@pytest.fixture
def guard(cluster: LiveCluster, teams: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guard]:
    """The after-attack checks; the test adds what else it must protect (``guard.watch_s3(...)``)."""
    canary_dir = tmp_path_factory.mktemp("canary")
    canary_dir.chmod(0o755)
    canary = canary_dir / "canary"
    canary.write_bytes(CANARY)
    canary.chmod(0o644)
    g = Guard(cluster=cluster, canary=canary, store=ObjectStore.from_env(cluster.env))
    g.files_before = _root_files(cluster.layout.root)
    g.out_before = nodes_out(cluster)
    yield g
    g.check()


#: What root's ``devcluster env`` adds and a member's shell never has: the admin S3 key and metrics login.
ADMIN_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "NURO_METRICS_USER", "NURO_METRICS_TOKEN")


def member_env(cluster: LiveCluster) -> dict[str, str]:
    """The cluster's settings as a member's shell has them: no admin key, so their team's credential files are
    used (``NURO_S3_CREDENTIALS``, ``NURO_METRICS_CREDENTIALS``); a plain PATH with the venv's tools."""
    env = {k: v for k, v in cluster.env.items() if k not in ADMIN_KEYS}
    return {**env, "PATH": f"{BIN}:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8"}


def as_user(cluster: LiveCluster, user: str, argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` in a member's environment (``member_env``: nothing of root's, no admin key);
    never raises on a non-zero exit. Jobs it submits inherit that environment (sbatch exports it)."""
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in member_env(cluster).items()), *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

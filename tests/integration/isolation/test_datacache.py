"""The node's dataset shard cache across teams, as members on the real cluster: a team shares one copy of each
shard, and no other team can read, list, plant or remove anything in it.

The prolog makes ``NURO_DATA_CACHE_DIR/<account>`` ``root:nuro-<team>`` 2770 for a job of that team (a real job
here); members then read a shared snapshot through ``SnapshotDataset`` as their own Unix users with their team's S3
key (``member_env``: no admin key).
"""

from __future__ import annotations

import grp
import json
import os
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from nuro.datasets.snapshot import snapshot
from nuro.objectstore import ObjectStore
from nuro.protocol import jobcomment
from tests.integration.conftest import LiveCluster, wait_until
from tests.integration.isolation.conftest import ATTACKER, ATTACKER_TEAM, VICTIM, VICTIM_TEAM, as_user

pytestmark = pytest.mark.usefixtures("teams", "passthrough")

_READ = """
import json, sys
from nuro.wrappers.sdk.data import SnapshotDataset
name, digest, team = sys.argv[1:4]
try:
    ds = SnapshotDataset(name, digest, team=team)
    n = sum(len(b) for i in range(len(ds)) for b in ds[i].values())
    print(json.dumps({"bytes": n, "fetches": ds.cache.stats.fetches, "hits": ds.cache.stats.hits}))
except PermissionError as exc:
    print(json.dumps({"denied": str(exc)}))
"""


def _read(cluster: LiveCluster, user: str, snap: tuple[str, str], team: str) -> dict:
    res = as_user(cluster, user, [sys.executable, "-c", _READ, *snap, team])
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_teams_cache_is_shared_by_its_members_and_closed_to_other_teams(cluster: LiveCluster, shared: Path) -> None:
    base = Path(cluster.env["NURO_DATA_CACHE_DIR"])
    # a real job of the victim's team: its prolog makes the team's dir, its TaskProlog tells the job where it is
    out = shared / "job.out"
    job = cluster.sbatch_as(VICTIM, ["--nodes=1", f"--output={out}"], "#!/bin/bash\n"
                            'stat -c "%U %G %a" "$NURO_DATA_CACHE_DIR/$SLURM_JOB_ACCOUNT"\n')  # fmt: skip
    info = cluster.wait_job_showing_output(job, out, timeout_s=120)
    assert info.phase.name == "COMPLETED" and out.read_text().split() == ["root", f"nuro-{VICTIM_TEAM}", "2770"]

    # a shared snapshot (admin-written, every team may read it)
    tree = shared / "tree"
    for i in range(24):
        (tree / f"d{i % 3}").mkdir(parents=True, exist_ok=True)
        (tree / f"d{i % 3}" / f"{i:03d}.bin").write_bytes(os.urandom(2000 + i))
    res = snapshot(ObjectStore.from_env(cluster.env), tree, f"cache-{uuid.uuid4().hex[:6]}", target_bytes=8192)
    snap = (res.name, res.digest)
    from nuro.datasets.cache import ensure_team_dir

    ensure_team_dir(base, ATTACKER_TEAM)  # what the prolog does for a job of the attacker's team

    first = _read(cluster, ATTACKER, snap, ATTACKER_TEAM)
    assert first["fetches"] == res.shards and first["bytes"] == res.total_bytes
    again = _read(cluster, "bob", snap, ATTACKER_TEAM)  # another member of the same team: the copy is shared
    assert again["fetches"] == 0 and again["hits"] == res.shards
    mine = base / ATTACKER_TEAM / "sha256"
    gid = grp.getgrnam(f"nuro-{ATTACKER_TEAM}").gr_gid
    assert all(p.stat().st_gid == gid and not p.stat().st_mode & stat.S_IRWXO for p in mine.iterdir())

    # the victim team cannot read the attacker's cache, nor the attacker the victim's: each fetches its own copy
    denied = _read(cluster, VICTIM, snap, ATTACKER_TEAM)
    assert "NURO_DATA_CACHE_DIR" in denied["denied"] or "Permission denied" in denied["denied"], denied
    theirs = _read(cluster, VICTIM, snap, VICTIM_TEAM)
    assert theirs["fetches"] == res.shards
    victim_dir = base / VICTIM_TEAM / "sha256"
    before = {p.name: p.read_bytes() for p in victim_dir.iterdir()}
    attack = textwrap.dedent(f"""
        import os, sys
        d = {str(victim_dir)!r}
        for what, fn in (("list", lambda: os.listdir(d)), ("plant", lambda: open(d + "/" + "0" * 64, "wb")),
                         ("remove", lambda: os.unlink(d + "/" + {sorted(before)[0]!r}))):
            try:
                fn()
                print(what, "ok")
            except PermissionError:
                print(what, "denied")
    """)  # fmt: skip
    res_attack = as_user(cluster, ATTACKER, [sys.executable, "-c", attack])
    assert res_attack.stdout.split() == ["list", "denied", "plant", "denied", "remove", "denied"], res_attack
    assert {p.name: p.read_bytes() for p in victim_dir.iterdir()} == before


def _pinned_job(cluster: LiveCluster, user: str, out: Path, name: str, digest: str, seed: int) -> int:
    meta = {"v": 1, "dataset": {"name": name, "digest": digest}, "data": {"seed": seed}}
    comment = jobcomment.merge(None, nuro=meta)
    return cluster.sbatch_as(user, ["--nodes=1", f"--output={out}", f"--comment={comment}"], "#!/bin/bash\nsleep 60\n")


def _running_node(cluster: LiveCluster, job: int) -> str:
    def node() -> str | None:
        info = cluster.backend.find_job(job)
        return info.nodes[0] if info is not None and info.phase.name == "RUNNING" and info.nodes else None

    return wait_until(node, 120, f"job {job} to run")


def test_the_prolog_prefetches_a_runs_first_shards_as_its_user_and_never_another_teams(
    cluster: LiveCluster, shared: Path
) -> None:
    from nuro.datasets.manifest import shard_key
    from nuro.datasets.prefetch import first_shards
    from nuro.datasets.refs import load_manifest

    store = ObjectStore.from_env(cluster.env)
    tree = shared / "prefetch-tree"
    for i in range(40):
        (tree / f"p{i % 5}").mkdir(parents=True, exist_ok=True)
        (tree / f"p{i % 5}" / f"{i:03d}.bin").write_bytes(os.urandom(3000 + i))
    shared_snap = snapshot(store, tree, f"prefetch-{uuid.uuid4().hex[:6]}", target_bytes=12_000)
    manifest = load_manifest(store, shared_snap.name, shared_snap.digest)[0]
    expected = first_shards(manifest, seed=7, count=4)
    assert len(expected) == 4 and shared_snap.shards > 4

    job = _pinned_job(cluster, VICTIM, shared / "prefetch.out", shared_snap.name, shared_snap.digest, seed=7)
    try:
        node = _running_node(cluster, job)
        report_path = cluster.layout.node_staging(node) / str(job) / "prefetch.json"
        report = json.loads(wait_until(lambda: report_path.exists() and report_path.read_text(), 60, "the report"))
        assert "error" not in report, report
        assert report["shards"] == expected and report["seed"] == 7
        team_dir = Path(cluster.env["NURO_DATA_CACHE_DIR"]) / VICTIM_TEAM / "sha256"
        gid = grp.getgrnam(f"nuro-{VICTIM_TEAM}").gr_gid
        uid = int(subprocess.run(["id", "-u", VICTIM], capture_output=True, text=True, check=True).stdout)
        for digest in expected:  # written by the job's user into the team's dir, as its own loader would
            st = (team_dir / digest.removeprefix("sha256:")).stat()
            assert (st.st_uid, st.st_gid) == (uid, gid) and not st.st_mode & stat.S_IRWXO
            assert store.get(shard_key(digest, shared_snap.name))[0] == (team_dir / digest[7:]).read_bytes()
        assert report_path.stat().st_uid == uid  # the report too: root wrote nothing the job's user can steer
    finally:
        cluster.backend.cancel(job)

    # a dataset of the victim's team, pinned by a member of another team: the prolog prefetches nothing of it
    own = shared / "own-tree"
    own.mkdir()
    (own / "secret.bin").write_bytes(os.urandom(5000))
    theirs = snapshot(store, own, f"{VICTIM_TEAM}.prefetch-{uuid.uuid4().hex[:6]}")
    job = _pinned_job(cluster, ATTACKER, shared / "prefetch-attacker.out", theirs.name, theirs.digest, seed=0)
    try:
        node = _running_node(cluster, job)
        hooks = cluster.layout.log / f"hooks-{node}.log"
        line = f"job={job} team={ATTACKER_TEAM} dataset {theirs.name} is another team's: not prefetched"
        wait_until(lambda: hooks.exists() and line in hooks.read_text(), 60, "the prolog's refusal to prefetch")
        assert not (cluster.layout.node_staging(node) / str(job) / "prefetch.json").exists()
        attacker_dir = Path(cluster.env["NURO_DATA_CACHE_DIR"]) / ATTACKER_TEAM / "sha256"
        for shard in load_manifest(store, theirs.name, theirs.digest)[0].shards:
            assert not (attacker_dir / shard.digest.removeprefix("sha256:")).exists()
    finally:
        cluster.backend.cancel(job)

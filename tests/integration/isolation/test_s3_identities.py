"""Attacks with S3 keys: a member of one team, holding their team's key, against another team's objects.

The dev cluster's SeaweedFS knows one identity per team, one for the node daemons and one admin
(``nuro.devcluster.s3``); each team's key is in ``etc/s3/<team>.env``, readable by the team's Unix group only,
and ``nuro.objectstore`` picks it through ``NURO_S3_CREDENTIALS`` when the shell has no ``AWS_*`` keys. Here alice
(perception) runs, as her own Unix user with her team's key, everything she could try against prediction's
checkpoints, datasets and tags, and against the keys themselves; every try must be refused, prediction's objects
must be byte-identical afterwards, and her own team's flows (dataset snapshot and tag, checkpoint writes, reading a
shared dataset) must still work.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from nuro.checkpoint import layout as L
from nuro.datasets.snapshot import snapshot
from nuro.devcluster import s3
from nuro.devcluster.layout import S3_ACCESS_KEY, S3_SECRET_KEY, PortPlan
from nuro.objectstore import ObjectStore, StoreConfig
from tests.integration.conftest import TEST_PORT_BASE, LiveCluster
from tests.integration.isolation.conftest import ATTACKER, ATTACKER_TEAM, VICTIM, VICTIM_TEAM, Guard, member_env

pytestmark = pytest.mark.usefixtures("teams")


# The attacker's toolbox: every call is tried, and its outcome recorded as "ok" or the error's class and code.
_PRELUDE = """
    import json, sys
    from nuro.objectstore import ObjectStore, ObjectStoreError
    from botocore.exceptions import ClientError
    store = ObjectStore.from_env(max_attempts=1)
    client = store.client
    out = {"team": store.config.team, "key": store.config.access_key}
    def t(name, fn):
        try:
            r = fn()
            errors = r.get("Errors") if isinstance(r, dict) else None  # DeleteObjects answers 200 with per-key errors
            out[name] = "denied:" + errors[0]["Code"] if errors else "ok"
        except ObjectStoreError as e:
            out[name] = f"denied:{type(e).__name__}:{e.code}"
        except ClientError as e:
            out[name] = "denied:" + e.response["Error"]["Code"]
        except PermissionError:
            out[name] = "denied:PermissionError"
        except Exception as e:
            out[name] = f"error:{type(e).__name__}:{e}"
"""


def readable_by_all(top: Path) -> Path:
    """Let the team users read ``top`` (a pytest temp dir, below root-only parents) and everything in it."""
    for path in [top, *top.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    for parent in top.parents:
        if parent == Path("/"):
            break
        parent.chmod(parent.stat().st_mode | 0o011)
    return top


def run_as(cluster: LiveCluster, user: str, script: str, *args: str) -> dict:
    """Run ``_PRELUDE`` + a Python script as ``user`` with a member's environment (``env -i``: nothing of root's
    leaks in); the script prints one JSON object on its last line."""
    argv = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in member_env(cluster).items())]
    res = subprocess.run(
        [*argv, sys.executable, "-c", textwrap.dedent(_PRELUDE) + textwrap.dedent(script), *args],
        capture_output=True, text=True, timeout=180, check=False, cwd="/tmp",
    )  # fmt: skip
    assert res.returncode == 0, f"script as {user} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def victim(cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """prediction's work, written by priya with her team's key: a checkpoint and a team dataset with a tag."""
    data = tmp_path_factory.mktemp("victim-data")
    (data / "labels.txt").write_bytes(b"prediction's secret labels\n" * 100)
    (data / "sub").mkdir()
    (data / "sub" / "w.bin").write_bytes(os.urandom(4096))
    readable_by_all(data)
    run = f"forecast-{uuid.uuid4().hex[:8]}"
    name = f"{VICTIM_TEAM}.secret-{uuid.uuid4().hex[:8]}"
    out = run_as(
        cluster, VICTIM, """
        from pathlib import Path
        from nuro.checkpoint import layout as L
        from nuro.datasets.snapshot import snapshot
        team, run, name, data = sys.argv[1:5]
        res = snapshot(store, Path(data), name, tag="v1")
        out["digest"] = res.digest
        t("ckpt-shard", lambda: store.put_if_absent(L.shard_key(team, run, 1, "model.bin"), b"weights" * 100))
        t("ckpt-manifest", lambda: store.put_if_absent(L.manifest_key(team, run, 1), b'{"step": 1}'))
        t("ckpt-tag", lambda: store.put(L.tag_key(team, run, "best"), b'{"step": 1}'))
        t("own-patch", lambda: store.put_if_absent(f"code-diffs/{team}/sha256/{'a' * 64}.patch", b"a patch"))
        print(json.dumps(out))
        """, VICTIM_TEAM, run, name, str(data),
    )  # fmt: skip
    assert out["team"] == VICTIM_TEAM and out["key"] == s3.team_access_key(VICTIM_TEAM)
    assert {k: v for k, v in out.items() if k.startswith("ckpt-")} == dict.fromkeys(
        ("ckpt-shard", "ckpt-manifest", "ckpt-tag"), "ok"
    )  # a team writes its own checkpoints
    assert out["own-patch"] == "ok"  # and its own code patches (nuro-train submit --allow-dirty)
    return {"run": run, "name": name, "digest": out["digest"], "team": VICTIM_TEAM}


@pytest.fixture(scope="module")
def shared(cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A shared dataset the platform (admin) published: every team reads it, none writes it."""
    data = tmp_path_factory.mktemp("shared-data")
    (data / "common.txt").write_bytes(b"shared corpus\n" * 50)
    name = f"shared-{uuid.uuid4().hex[:8]}"
    res = snapshot(ObjectStore.from_env(cluster.env), data, name, tag="v1")
    return {"name": name, "digest": res.digest}


def test_team_key_cannot_touch_another_teams_checkpoints_datasets_or_tags(
    cluster: LiveCluster, guard: Guard, victim: dict, shared: dict, tmp_path: Path
) -> None:
    team, run, name, digest = victim["team"], victim["run"], victim["name"], victim["digest"]
    before = {
        **guard.watch_s3(f"{L.PREFIX}{team}/"),
        **guard.watch_s3(f"team-datasets/{team}/"),
        **guard.watch_s3(f"datasets/{shared['name']}/"),
        **guard.watch_s3(f"code-diffs/{team}/"),
    }
    assert any("/manifests/" in k for k in before) and any(k.endswith("/tags/v1") for k in before)
    assert L.manifest_key(team, run, 1) in before
    guard.watch_s3("datasets/shards/")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "x.bin").write_bytes(b"alice's bytes")
    readable_by_all(tmp_path)

    out = run_as(
        cluster, ATTACKER, """
        from pathlib import Path
        from nuro.checkpoint import layout as L
        from nuro.datasets import manifest as M
        from nuro.datasets.refs import get_tag, list_tags, load_manifest, resolve, set_tag
        from nuro.datasets.snapshot import snapshot
        team, run, name, digest, shared, shared_digest, mine = sys.argv[1:8]
        B = store.bucket
        ck, mk = L.shard_key(team, run, 1, "model.bin"), L.manifest_key(team, run, 1)
        # checkpoints: read, list, overwrite, delete, copy out, multipart, tags
        t("get-ckpt", lambda: store.get(mk))
        t("head-ckpt", lambda: store.head(ck))
        t("list-ckpt", lambda: list(store.list(L.run_prefix(team, run))))
        t("list-team-ckpts", lambda: list(store.list(f"{L.PREFIX}{team}/")))
        t("list-all-ckpts", lambda: list(store.list(L.PREFIX)))
        t("list-bucket", lambda: list(store.list("")))
        t("put-ckpt", lambda: store.put(mk, b"forged"))
        t("put-new-step", lambda: store.put(L.manifest_key(team, run, 2), b"forged"))
        t("delete-ckpt", lambda: store.delete(ck))
        t("delete-objects", lambda: client.delete_objects(Bucket=B, Delete={"Objects": [{"Key": ck}, {"Key": mk}]}))
        t("copy-out", lambda: client.copy_object(Bucket=B, Key=L.shard_key("perception", "stolen", 1, "m"),
                                                 CopySource={"Bucket": B, "Key": ck}))
        t("multipart-in", lambda: client.create_multipart_upload(Bucket=B, Key=L.shard_key(team, run, 3, "m")))
        t("move-ckpt-tag", lambda: store.put(L.tag_key(team, run, "best"), b'{"step": 2}'))
        t("object-tagging", lambda: client.put_object_tagging(Bucket=B, Key=mk, Tagging={"TagSet": []}))
        t("acl", lambda: client.put_object_acl(Bucket=B, Key=mk, ACL="public-read"))
        t("bucket-policy", lambda: client.put_bucket_policy(Bucket=B, Policy='{"Statement": []}'))
        t("delete-bucket", lambda: client.delete_bucket(Bucket=B))
        # the other team's dataset: manifest, shards, listing, tags (through nuro and raw)
        t("resolve-ds", lambda: resolve(store, f"{name}@v1"))
        t("load-manifest", lambda: load_manifest(store, name, digest))
        t("list-ds-tags", lambda: list_tags(store, name))
        t("list-team-ds", lambda: list(store.list(f"team-datasets/{team}/")))
        t("get-ds-shards", lambda: list(store.list(M.shards_root(name))))
        t("snapshot-as-them", lambda: snapshot(store, Path(mine), f"{team}.planted", tag="v1"))
        t("move-ds-tag", lambda: set_tag(store, name, "v1", digest, force=True))
        t("raw-move-ds-tag", lambda: store.put(M.tag_key(name, "v1"), b'{"digest": "sha256:' + b"0" * 64 + b'"}'))
        t("raw-new-ds-tag", lambda: store.put_if_absent(M.tag_key(name, "latest"), b"{}"))
        t("delete-ds-tag", lambda: store.delete(M.tag_key(name, "v1")))
        t("delete-ds-manifest", lambda: store.delete(M.manifest_key(name, digest)))
        # the shared dataset: readable, but neither its tag, manifest nor shards are writable
        t("shared-move-tag", lambda: store.put(M.tag_key(shared, "v1"), b'{"digest": "sha256:' + b"0" * 64 + b'"}'))
        t("shared-new-tag", lambda: store.put_if_absent(M.tag_key(shared, "planted"), b"{}"))
        t("shared-shard", lambda: store.put(M.shard_key("sha256:" + "0" * 64), b"planted"))
        t("shared-delete", lambda: store.delete(M.manifest_key(shared, shared_digest)))
        # the other team's code patches (their runs' lineage): neither deleted nor planted
        t("delete-patch", lambda: store.delete(f"code-diffs/{team}/sha256/{'a' * 64}.patch"))
        t("plant-patch", lambda: store.put_if_absent(f"code-diffs/{team}/sha256/{'b' * 64}.patch", b"planted"))
        print(json.dumps(out))
        """, team, run, name, digest, shared["name"], shared["digest"], str(mine),
    )  # fmt: skip

    assert out["team"] == ATTACKER_TEAM and out["key"] == s3.team_access_key(ATTACKER_TEAM)
    tried = {k: v for k, v in out.items() if k not in ("team", "key")}
    allowed = {k: v for k, v in tried.items() if not v.startswith("denied:")}
    assert not allowed, f"alice, with perception's key, got through: {allowed}"
    assert len(tried) == 34
    # the store's own refusal (403), not a crash or a missing object
    assert tried["get-ckpt"] == "denied:AccessDenied:AccessDenied" and tried["delete-objects"] == "denied:AccessDenied"
    assert tried["move-ds-tag"].startswith("denied:AccessDenied")  # HEAD of their manifest is already refused
    # guard.check (after the test) asserts prediction's and the shared dataset's objects are byte-identical


def test_a_member_cannot_read_another_teams_key_the_node_key_or_the_admin_key(
    cluster: LiveCluster, guard: Guard
) -> None:
    lay = cluster.layout
    secret_files = {
        "other-team": lay.s3_credentials / f"{VICTIM_TEAM}.env",
        "node-env": lay.nuro_env,
        "identities": lay.s3_data / s3.IDENTITIES_FILE,
        "env-sh": lay.env_sh,
    }
    for path in secret_files.values():
        assert path.is_file(), path
    out = run_as(
        cluster, ATTACKER, """
        import os
        files = json.loads(sys.argv[1])
        for what, path in files.items():
            t("read-" + what, lambda: open(path, "rb").read())
        t("list-s3-data", lambda: os.listdir(sys.argv[2]))  # weed's volume files: every object's bytes
        t("read-own", lambda: open(sys.argv[3]).read())
        print(json.dumps(out))
        """,
        json.dumps({k: str(v) for k, v in secret_files.items()}), str(lay.s3_data),
        str(lay.s3_credentials / f"{ATTACKER_TEAM}.env"),
    )  # fmt: skip
    assert out.pop("read-own") == "ok"
    assert {k: v for k, v in out.items() if k.startswith(("read-", "list-"))} == {
        **{f"read-{k}": "denied:PermissionError" for k in secret_files},
        "list-s3-data": "denied:PermissionError",
    }
    # `devcluster env` run by a member exports the cluster's settings and the team directory, no admin key
    argv = ["runuser", "-u", ATTACKER, "--", str(Path(sys.executable).parent / "nuro-admin"), "devcluster", "env",
            "--state-dir", str(lay.root)]  # fmt: skip
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd="/tmp")
    assert res.returncode == 0, res.stderr
    assert f"NURO_S3_CREDENTIALS={lay.s3_credentials}" in res.stdout and "AWS_" not in res.stdout
    # Guessing does not help either: the admin key in the source is not the running cluster's, and a team's
    # access key id is public but useless without its secret.
    ports = PortPlan(TEST_PORT_BASE)
    for access, secret in ((S3_ACCESS_KEY, S3_SECRET_KEY), (s3.team_access_key(VICTIM_TEAM), "guess")):
        probe = ObjectStore(StoreConfig(s3.endpoint(ports), access_key=access, secret_key=secret, max_attempts=1))
        with pytest.raises(Exception, match="HTTP 403"):
            probe.get(L.manifest_key(VICTIM_TEAM, "x", 1))
    assert not s3.is_ready(ports) and s3.is_ready(ports, lay.s3_data)


def test_own_team_flows_still_work_with_the_team_key(
    cluster: LiveCluster, guard: Guard, shared: dict, victim: dict, tmp_path: Path
) -> None:
    """Snapshot, tag, list, resolve, read and verify a team dataset; write, list and prune checkpoints; read a
    shared dataset: all as alice with perception's key. The CLI's listing shows hers and the shared ones only."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_bytes(b"perception data\n" * 64)
    readable_by_all(tmp_path)
    name = f"{ATTACKER_TEAM}.own-{uuid.uuid4().hex[:8]}"
    run = f"own-{uuid.uuid4().hex[:8]}"
    out = run_as(
        cluster, ATTACKER, """
        from pathlib import Path
        from nuro.checkpoint import layout as L
        from nuro.datasets.reader import PinnedDataset
        from nuro.datasets.refs import list_datasets, resolve, set_tag
        from nuro.datasets.snapshot import snapshot
        from nuro.datasets.verify import verify
        name, data, run, shared, shared_digest = sys.argv[1:6]
        res = snapshot(store, Path(data), name, tag="v1")
        t("resolve", lambda: resolve(store, f"{name}@v1") == res.digest or 1 / 0)
        t("retag", lambda: set_tag(store, name, "latest", res.digest))
        t("read", lambda: PinnedDataset(store, name, res.digest).read("a.txt") == b"perception data\\n" * 64 or 1 / 0)
        t("verify", lambda: verify(store, name, res.digest).ok or 1 / 0)
        t("list", lambda: name in list_datasets(store, ["perception"]) or 1 / 0)
        t("read-shared", lambda: PinnedDataset(store, shared, shared_digest).read("common.txt"))
        t("ckpt-put", lambda: store.put_if_absent(L.shard_key("perception", run, 5, "m.bin"), b"w"))
        t("ckpt-commit", lambda: store.put_if_absent(L.manifest_key("perception", run, 5), b"{}"))
        t("ckpt-list", lambda: len(store.list_prefixes(L.run_prefix("perception", run))) == 1 or 1 / 0)
        t("ckpt-prune", lambda: store.delete(L.shard_key("perception", run, 5, "m.bin")))
        print(json.dumps(out))
        """, name, str(data), run, shared["name"], shared["digest"],
    )  # fmt: skip
    assert out.pop("team") == ATTACKER_TEAM
    out.pop("key")
    assert out == dict.fromkeys(out, "ok") and len(out) == 10, out
    argv = ["runuser", "-u", ATTACKER, "--", "env", "-i", *(f"{k}={v}" for k, v in member_env(cluster).items())]
    res = subprocess.run(
        [*argv, str(Path(sys.executable).parent / "nuro-train"), "dataset", "ls", "--json"],
        capture_output=True, text=True, timeout=120, check=False, cwd="/tmp",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    listed = {row["name"] for row in json.loads(res.stdout)}
    assert {name, shared["name"]} <= listed and victim["name"] not in listed


def test_node_key_reaches_every_teams_checkpoints_but_writes_no_dataset(
    cluster: LiveCluster, guard: Guard, victim: dict, shared: dict
) -> None:
    """The root daemons' identity (nuro.env): the upload worker, retention and restore of every team; datasets
    are read-only to it (the prolog verifies pins)."""
    env = dict(line.split("=", 1) for line in cluster.layout.nuro_env.read_text().splitlines() if "=" in line)
    assert env["AWS_ACCESS_KEY_ID"] == "nuro-node"
    node = ObjectStore.from_env(env, max_attempts=1)
    team, run = victim["team"], victim["run"]
    assert node.get(L.manifest_key(team, run, 1))[0] == b'{"step": 1}'
    probe = L.shard_key(team, f"{run}-node", 1, "probe")
    assert node.put_if_absent(probe, b"node")
    node.delete(probe)
    from nuro.datasets.verify import verify

    assert verify(node, victim["name"], victim["digest"]).ok and verify(node, shared["name"], shared["digest"]).ok
    from nuro.objectstore import AccessDenied

    for key in (f"datasets/{shared['name']}/tags/v1", f"team-datasets/{team}/{victim['name']}/tags/v1"):
        with pytest.raises(AccessDenied):
            node.put(key, b"{}")

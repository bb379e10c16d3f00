"""Attack: a team member writes metrics points as another team (issue 11, deliverable 3, metrics part).

The dev cluster's influxd runs with ``auth-enabled``; each team writes its own database ``nuro_<team>`` as its own
user, whose password is in ``etc/metrics/<team>.env`` (0640 root:nuro-<team>), found through
``NURO_METRICS_CREDENTIALS`` like the S3 key (``nuro.metrics.identities``). alice of perception tries, with her
team's credential, to write into prediction's database and the platform database; without credentials; and to
read the node's, the admin's and prediction's credentials. Each is refused; her own points still work; priya's
points are unchanged; the platform still runs (``guard``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from nuro.metrics.identities import team_db
from nuro.metrics.model import Query
from nuro.metrics.sink import sink_from_env
from tests.integration.conftest import LiveCluster
from tests.integration.isolation.conftest import ATTACKER, ATTACKER_TEAM, VICTIM, VICTIM_TEAM, Guard, member_env

pytestmark = pytest.mark.slurm

#: Run as the member: argv[1] is a JSON dict of env overrides for sink_from_env, argv[2] the run tag. Prints
#: {"ok": true} or {"error": "<type>: <message>"}.
_WRITE = """
import json, os, sys, time
from nuro.metrics.model import Point
from nuro.metrics.sink import sink_from_env
from nuro.metrics.model import Query
env = {**os.environ, **json.loads(sys.argv[1])}
try:
    sink = sink_from_env(env)
    if sys.argv[2] == "--read":
        print(json.dumps({"ok": True, "rows": len(sink.query(Query(sys.argv[3])))}))
        sys.exit(0)
    sink.write([Point("train", {"team": sys.argv[3], "run": sys.argv[2]}, {"loss": 0.5}, time.time_ns())])
    print(json.dumps({"ok": True, "sink": sink.name}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def write_as(cluster: LiveCluster, user: str, overrides: dict[str, str], run: str, team_tag: str) -> dict:
    argv = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in member_env(cluster).items())]
    argv += [sys.executable, "-c", _WRITE, json.dumps(overrides), run, team_tag]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def admin_rows(cluster: LiveCluster, db: str) -> list[tuple]:
    """Every ``train`` point of ``db``, read as the admin (the cluster env's token)."""
    env = {**cluster.env, "NURO_METRICS_URL": cluster.env["NURO_METRICS_URL"].rsplit("/", 1)[0] + f"/{db}"}
    sink = sink_from_env(env)
    try:
        return [
            (r.ts_ns, tuple(sorted(r.tags.items())), tuple(sorted(r.fields.items())))
            for r in sink.query(Query("train"))
        ]
    finally:
        sink.close()


def test_a_member_cannot_write_metrics_as_another_team(cluster: LiveCluster, guard: Guard) -> None:
    lay = cluster.layout
    assert "auth-enabled = true" in (lay.influx_dir / "influxdb.conf").read_text()
    run = f"mid-{time.time_ns()}"
    own = write_as(cluster, VICTIM, {}, f"{run}-victim", VICTIM_TEAM)  # priya's own point, with her file
    assert own.get("ok"), own
    assert own["sink"].endswith(f"/{team_db(VICTIM_TEAM)}")
    victim_before = admin_rows(cluster, team_db(VICTIM_TEAM))
    assert any(dict(tags).get("run") == f"{run}-victim" for _, tags, _ in victim_before)

    # alice's own credential (her team's file, picked as the one she can read)
    creds = dict(line.split("=", 1) for line in (lay.etc / "metrics" / f"{ATTACKER_TEAM}.env").read_text().splitlines())
    base = creds["NURO_METRICS_URL"].rsplit("/", 1)[0]
    mine = {"NURO_METRICS_USER": creds["NURO_METRICS_USER"], "NURO_METRICS_TOKEN": creds["NURO_METRICS_TOKEN"]}
    # 1. her credential aimed at prediction's database and at the platform database: 403
    for db in (team_db(VICTIM_TEAM), "nuro"):
        res = write_as(cluster, ATTACKER, {**mine, "NURO_METRICS_URL": f"{base}/{db}"}, run, VICTIM_TEAM)
        assert "SinkRejected" in res.get("error", "") and "403" in res["error"], (db, res)
    # ... and reading prediction's database with it: 403 too; the platform database (GPUs) is readable
    res = write_as(cluster, ATTACKER, {**mine, "NURO_METRICS_URL": f"{base}/{team_db(VICTIM_TEAM)}"}, "--read", "train")
    assert "403" in res.get("error", ""), res
    res = write_as(cluster, ATTACKER, {**mine, "NURO_METRICS_URL": f"{base}/nuro"}, "--read", "gpu")
    assert res.get("ok"), res
    # 2. no credential at all (the shared URL of before): 401
    for db in (team_db(VICTIM_TEAM), "nuro"):
        res = write_as(
            cluster, ATTACKER, {"NURO_METRICS_URL": f"{base}/{db}", "NURO_METRICS_CREDENTIALS": ""}, run, VICTIM_TEAM
        )
        assert "SinkRejected" in res.get("error", "") and "401" in res["error"], (db, res)
    # 3. another team's, the node's and the admin's credentials cannot be read
    for path in (lay.etc / "metrics" / f"{VICTIM_TEAM}.env", lay.nuro_env, lay.env_sh, lay.influx_dir / "users.json"):
        res = subprocess.run(["runuser", "-u", ATTACKER, "--", "cat", str(path)], capture_output=True, text=True)
        assert res.returncode != 0 and "Permission denied" in res.stderr, path
    res = write_as(cluster, ATTACKER, {"NURO_TEAM": VICTIM_TEAM}, run, VICTIM_TEAM)
    assert "MetricsCredentialsError" in res.get("error", "") and "permission denied" in res["error"], res
    # 4. her own points still work, into her team's database; a forged team tag stays inside her own database
    res = write_as(cluster, ATTACKER, {}, run, ATTACKER_TEAM)
    assert res.get("ok") and res["sink"].endswith(f"/{team_db(ATTACKER_TEAM)}"), res
    assert any(dict(tags).get("run") == run for _, tags, _ in admin_rows(cluster, team_db(ATTACKER_TEAM)))
    # priya's points are exactly as before
    assert admin_rows(cluster, team_db(VICTIM_TEAM)) == victim_before

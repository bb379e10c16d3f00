"""What a run logs is what ``nuro-train metrics`` shows: a real 2-rank Slurm job logs through MetricsLogger into a
real sink (the embedded SQLite file, and influxd 1.6.7), and ``nuro-train metrics JOB --json`` returns exactly those
values; GPU telemetry comes from a real ``nuro-nodeagent`` reading the fake libnvidia-ml through pynvml.

Why a tiny loop instead of the torch example: torch costs ~5 s of CPU per process on these 2 cores, and the
MetricsLogger path is the same. The loop tees what it hands the BufferedWriter into a JSON file per rank, so the
test compares the CLI's output with exactly what was logged (timestamps and measured step times included).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro.datasets.snapshot import snapshot
from nuro.devcluster.tsdb import influx1_url, standalone_influx
from nuro.objectstore import ObjectStore
from nuro.protocol import gpujobs, jobcomment
from nuro.protocol import heartbeat as hb
from nuro.slurm import JobPhase
from tests import fake_nvml
from tests.integration.conftest import REPO, TEST_PORT_BASE, LiveCluster, wait_until

pytestmark = pytest.mark.slurm

BIN = Path(sys.executable).parent
STEPS = 15

LOOP = """
import json, sys, time
from pathlib import Path
from nuro.lifecycle import run_events
from nuro.metrics.buffer import BufferedWriter
from nuro.metrics.sink import sink_from_env
from nuro.wrappers.sdk.metrics import MetricsLogger, self_tags
from nuro.wrappers.sdk.runenv import RunEnv


class Tee:
    def __init__(self, inner):
        self.inner, self.points = inner, []

    def add(self, p):
        self.points.append(p)
        return self.inner.add(p)

    def flush(self, t):
        return self.inner.flush(t)

    def close(self, t):
        return self.inner.close(t)

    @property
    def stats(self):
        return self.inner.stats


env = RunEnv.from_env()
sink = sink_from_env()
tee = Tee(BufferedWriter(sink, self_tags=self_tags(env, "test")))
metrics = MetricsLogger(env=env, writer=tee)
run_events.record("started", world=env.world_size)
for step in range(int(sys.argv[2])):
    time.sleep(0.05)
    metrics.log(step, loss=round(1.0 / (step + 1) + env.rank, 6), samples=32, lr=0.1)
metrics.close(timeout_s=10)
sink.close()
dump = [{"ts_ns": p.ts_ns, "tags": dict(p.tags), "fields": dict(p.fields)} for p in tee.points]
Path(sys.argv[1], f"rank{env.rank}.json").write_text(json.dumps({"stats": metrics.stats, "points": dump}))
"""


def _free_port(lo: int, hi: int) -> int:
    for port in range(lo + os.getpid() % 20, hi):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.fail(f"no free port in {lo}-{hi}")


@pytest.fixture(scope="module")
def influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """influxd 1.6.7 of this module, on ports above the test cluster's (base + 150 …)."""
    http = _free_port(TEST_PORT_BASE + 150, TEST_PORT_BASE + 175)
    rpc = _free_port(TEST_PORT_BASE + 175, TEST_PORT_BASE + 199)
    with standalone_influx(tmp_path_factory.mktemp("influx"), http, db="nuro", rpc_port=rpc) as server:
        yield influx1_url(server, "nuro")


@pytest.fixture(scope="module")
def dataset_digest(cluster: LiveCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example team policy (alice is in perception) and a dataset snapshot for the jobs' nuro record."""
    cluster.run([str(BIN / "nuro-admin"), "policy", "apply", str(REPO / "examples" / "policy" / "teams.yaml")])
    data = tmp_path_factory.mktemp("data")
    (data / "x.bin").write_bytes(b"metrics" * 100)
    return snapshot(ObjectStore.from_env(cluster.env), data, "metrics-test").digest  # the prolog verifies it


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fake_nvml.build(tmp_path_factory.mktemp("fake_nvml"))


def _submit(cluster: LiveCluster, work: Path, url: str, run: str, digest: str) -> int:
    (work / "loop.py").write_text(LOOP)
    meta = {"team": "perception", "name": run, "dataset": {"name": "metrics-test", "digest": digest},
            "code": {"repo": "/srv/repo", "commit": "b" * 40},
            "entry": {"launcher": "python", "script": "loop.py", "args": [str(STEPS)]}}  # fmt: skip
    script = (
        "#!/bin/bash\n"
        f"srun bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec {sys.executable} {work}/loop.py {work} "
        f"{STEPS}'\n"
    )
    env = {"NURO_METRICS_URL": url, "NURO_TEAM": "perception", "NURO_RUN_NAME": run}
    res = subprocess.run(
        ["runuser", "-u", "alice", "--", "env", *(f"{k}={v}" for k, v in {**cluster.env, **env}.items()),
         "sbatch", "--parsable", "-N2", "--ntasks-per-node=1", f"--output={work}/job.out",
         f"--comment={jobcomment.merge(None, nuro=meta)}"],
        input=script, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    return int(res.stdout.strip())


TWO_GPUS = {"gpus": 2, "gpu0.util": 55, "gpu1.util": 66, "gpu0.temp": 61, "gpu0.power_mw": 350000,
            "gpu0.sm_clock": 1980, "gpu0.mem_used_mib": 1024, "gpu0.mem_total_mib": 81920}  # fmt: skip


def node_metrics_identity() -> dict[str, str]:
    """The nodes' metrics user and token from the test cluster's nuro.env (what the real agents use); ``{}`` when
    no cluster wrote one (the standalone influxd of this module runs without auth)."""
    from tests.integration.conftest import TEST_STATE_DIR

    try:
        text = (TEST_STATE_DIR / "etc" / "nuro.env").read_text()
    except OSError:
        return {}
    env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k: env[k] for k in ("NURO_METRICS_USER", "NURO_METRICS_TOKEN") if k in env}


def _start_agent(
    lib_dir: Path, work: Path, node: str, url: str, scenario: dict = TWO_GPUS, staging_root: str | None = None
) -> subprocess.Popen:
    """A real node agent on ``node`` reading the fake NVML (default: 2 GPUs, util 55/66 %), writing gpu points to
    ``url``; with ``staging_root`` it reads the GPU claims the cluster's prologs write there (no upload worker)."""
    key = work / "hb.key"
    hb.write_key(key)
    env = fake_nvml.env_for(lib_dir, fake_nvml.write_scenario(work / "nvml.txt", scenario))
    env.pop("NURO_ENV_FILE", None)
    env.pop("NURO_AGENT_STATUS_DIR", None)  # never the cluster's: its health checks read the real agents' files
    env["NURO_METRICS_URL"] = url
    env.update(node_metrics_identity())  # the dev cluster's influxd runs auth-enabled: write as the nodes do
    env["NURO_STAGING_ROOT"] = staging_root or str(work / "no-staging")
    argv = [sys.executable, "-m", "nuro.healthcheck.agent", "--node", node, "--controller", "127.0.0.1:9",
            "--key-file", str(key), "--interval-s", "0.5", "--probe", "nvml", "--expect-gpus", str(scenario["gpus"]),
            "--status-dir", str(work / "agent-status"), "--log-file", str(work / "agent.log")]  # fmt: skip
    return subprocess.Popen(argv, env=env)


def _train(cluster: LiveCluster, url: str, *args: str) -> dict:
    res = subprocess.run([str(BIN / "nuro-train"), *args], env={**os.environ, **cluster.env, "NURO_METRICS_URL": url},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("kind", ["sqlite", "influx1"])
def test_what_a_run_logs_is_what_metrics_shows(
    kind: str, cluster: LiveCluster, shared_tmp: Path, lib_dir: Path, dataset_digest: str,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    if kind == "sqlite":
        url = f"sqlite://{shared_tmp}/metrics.sqlite"
    else:  # the dev cluster's own influxd when it runs one (devcluster env exports it), else one of our own
        url = cluster.env.get("NURO_METRICS_URL", "")
        url = url if url.startswith("influx1://") else request.getfixturevalue("influx")
    run = f"metrics-{kind}-{int(time.time()) % 100000}"
    job_id = _submit(cluster, shared_tmp, url, run, dataset_digest)
    follow = None
    if kind == "sqlite":  # --follow from submit to the end: it must return by itself once the job ended
        # As alice, like a user following their run: a root reader would create the SQLite file root-owned
        # before the job's first write, and the job (alice) could then not open it.
        env = {**cluster.env, "NURO_METRICS_URL": url}
        follow = subprocess.Popen(
            ["runuser", "-u", "alice", "--", "env", *(f"{k}={v}" for k, v in env.items()), str(BIN / "nuro-train"),
             "metrics", str(job_id), "--follow", "--interval-s", "0.5"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    final = cluster.backend.wait_for_job(job_id, timeout_s=120)
    if follow is not None:
        stdout, stderr = follow.communicate(timeout=30)
        assert follow.returncode == 0 and "latest per rank" in stdout, stderr
        assert f"{STEPS - 1}" in stdout.split("latest per rank")[-1]  # its last view has the last step
    out = shared_tmp / "job.out"
    assert final.phase == JobPhase.COMPLETED, (final.state, final.reason, out.exists() and out.read_text())

    logged = {r: json.loads((shared_tmp / f"rank{r}.json").read_text()) for r in (0, 1)}
    for r in (0, 1):
        assert logged[r]["stats"]["dropped"] == 0 and logged[r]["stats"]["written"] >= STEPS
    want = sorted(
        ({"ts_ns": p["ts_ns"], "rank": int(p["tags"]["rank"]), "restart": 0, **p["fields"]}
         for r in (0, 1) for p in logged[r]["points"]),
        key=lambda h: (h["ts_ns"], h["rank"]),
    )  # fmt: skip
    assert {p["tags"]["job"] for r in (0, 1) for p in logged[r]["points"]} == {str(job_id)}

    agent = _start_agent(lib_dir, shared_tmp, final.nodes[0], url)
    try:
        deadline = time.monotonic() + 20
        while True:
            shown = _train(cluster, url, "metrics", str(job_id), "--json", "--plot")
            if shown["gpus"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)

    assert (shown["team"], shown["run"], shown["job_id"]) == ("perception", run, job_id)
    assert shown["history"] == want  # every value, every timestamp, exactly as logged
    assert [r["rank"] for r in shown["ranks"]] == [0, 1]
    assert shown["ranks"][1]["step"] == STEPS - 1 and shown["ranks"][1]["loss"] == round(1.0 / STEPS + 1, 6)
    assert shown["plot"]["loss_steps"] == list(range(STEPS))
    gpus = {(g["node"], g["gpu"]): g for g in shown["gpus"]}
    assert set(gpus) == {(final.nodes[0], 0), (final.nodes[0], 1)}, shown["gpus"]
    g0 = gpus[(final.nodes[0], 0)]
    assert (g0["util_pct"], g0["temp_c"], g0["power_w"], g0["sm_clock_mhz"]) == (55.0, 61.0, 350.0, 1980.0)
    assert g0["mem_used_bytes"] == 1024 * 2**20 and gpus[(final.nodes[0], 1)]["util_pct"] == 66.0

    if kind == "sqlite":  # the S3 and Slurm views, once
        arts = _train(cluster, url, "artifacts", str(job_id), "--json")
        assert arts["checkpoints"] == [] and "run event started" in {o["kind"] for o in arts["objects"]}
        cmp = _train(cluster, url, "compare", str(job_id), str(job_id), "--json")
        assert all(r["same"] for r in cmp["rows"])
        assert cmp["a"]["metrics"]["last_step"] == STEPS - 1 and cmp["a"]["params"]["nodes"] == 2
        assert cmp["a"]["checkpoints"]["committed"] == 0
        human = subprocess.run([str(BIN / "nuro-train"), "metrics", str(job_id)], capture_output=True, text=True,
                               env={**os.environ, **cluster.env, "NURO_METRICS_URL": url}, timeout=60)  # fmt: skip
        assert human.returncode == 0 and "latest per rank" in human.stdout, human.stderr


def test_lineage_and_artifacts_read_checkpoints_from_s3_manifests(cluster: LiveCluster, dataset_digest: str) -> None:
    """A run resumed by a second job: lineage shows which job committed which step with which parent, read from the
    manifests in S3 (written here as the upload worker writes them: manifest last, under the step's prefix)."""
    from nuro.checkpoint import layout as L
    from nuro.checkpoint.manifest import FileEntry, Manifest

    run = f"lineage-{int(time.time()) % 100000}"
    meta = {"team": "perception", "name": run, "dataset": {"name": "metrics-test", "digest": dataset_digest},
            "code": {"repo": "/srv/repo", "commit": "b" * 40}}  # fmt: skip

    def submit(m: dict) -> int:
        res = cluster.run(["sbatch", "--parsable", "--output=/dev/null", f"--comment={jobcomment.merge(None, nuro=m)}",
                           "--wrap", "true"], user="alice")  # fmt: skip
        job_id = int(res.stdout.strip())
        assert cluster.backend.wait_for_job(job_id, timeout_s=60).phase == JobPhase.COMPLETED
        return job_id

    parent = submit(meta)
    child = submit({**meta, "resume_from": str(parent)})
    store = ObjectStore.from_env(cluster.env)
    for step, job, restart, prev in ((10, parent, 0, None), (20, child, 0, 10), (30, child, 1, 20)):
        data = f"weights of step {step}".encode()
        store.put(L.shard_key("perception", run, step, "model.bin"), data)
        shard = FileEntry("model.bin", len(data), hashlib.sha256(data).hexdigest())
        manifest = Manifest(team="perception", run=run, step=step, job_id=str(job), restart=restart,
                            created_at=f"2026-01-01T00:00:{step}Z", parent=prev, world_size=2, parts=1,
                            shards=(shard,), total_bytes=len(data))  # fmt: skip
        store.put(L.manifest_key("perception", run, step), manifest.to_bytes())
    store.put(L.shard_key("perception", run, 40, "model.bin"), b"torn")  # shards, no manifest: not committed

    url = f"sqlite:///tmp/nuro-test-metrics-{os.getpid()}.sqlite"  # lineage/artifacts never read metrics
    chain = _train(cluster, url, "lineage", str(child), "--json")
    assert [r["job_id"] for r in chain] == [child, parent]
    assert [(c["step"], c["parent"], c["job_id"], c["restart"]) for c in chain[0]["checkpoints"]] == [
        (20, 10, child, 0), (30, 20, child, 1)]  # fmt: skip
    assert [(c["step"], c["parent"], c["job_id"]) for c in chain[1]["checkpoints"]] == [(10, None, parent)]
    human = subprocess.run([str(BIN / "nuro-train"), "lineage", str(child)], capture_output=True, text=True,
                           env={**os.environ, **cluster.env}, timeout=60)  # fmt: skip
    assert "checkpoints in S3 (2 committed):" in human.stdout and "parent step 20" in human.stdout, human.stderr

    arts = _train(cluster, url, "artifacts", str(child), "--json")
    assert [(c["step"], c["job_id"]) for c in arts["checkpoints"]] == [(10, parent), (20, child), (30, child)]
    assert arts["uncommitted"] == [{"step": 40, "status": "torn", "bytes": 4}]


def test_each_job_sees_its_own_gpus_on_a_shared_node(cluster: LiveCluster, shared_tmp: Path, lib_dir: Path) -> None:
    """Two jobs share one node (2 + 6 GPUs): each prolog claims the job's GPUs, the node agent tags its ``gpu``
    points with the job, ``nuro-train metrics`` shows each job exactly its own GPUs, and the epilogs drop the
    claims."""
    node = "gpu006"
    url = f"sqlite://{shared_tmp}/gpus.sqlite"
    root = Path(cluster.env["NURO_STAGING_ROOT"].replace("{node}", node))
    jobs = [cluster.backend.submit("#!/bin/bash\nsleep 300\n", f"--gres=gpu:{n}", "-w", node, "-o", "/dev/null")
            for n in (2, 6)]  # fmt: skip
    agent = None
    try:
        for job in jobs:
            cluster.backend.wait_for_job(job, {JobPhase.RUNNING}, timeout_s=60)
        paths = {job: root / gpujobs.DIR / node / f"{job}.json" for job in jobs}
        wait_until(lambda: all(p.exists() for p in paths.values()), 30, "the prologs' GPU claims")  # after RUNNING
        claims = {job: json.loads(path.read_text()) for job, path in paths.items()}
        for job in jobs:  # the prolog's claim is what Slurm allocated
            detail = cluster.run(["scontrol", "show", "job", "-d", str(job)]).stdout
            idx = re.search(r"GRES=gpu(?::\w+)?:\d+\(IDX:([0-9,-]+)\)", detail)
            assert idx and tuple(claims[job]["gpus"]) == gpujobs.parse_gpu_ids(idx[1]), (claims[job], detail)
        assert sorted(claims[jobs[0]]["gpus"] + claims[jobs[1]]["gpus"]) == list(range(8))

        scenario = {"gpus": 8, **{f"gpu{g}.util": 10 + g for g in range(8)}}
        agent = _start_agent(lib_dir, shared_tmp, node, url, scenario, staging_root=str(root))
        for job in jobs:
            shown = wait_until(
                lambda job=job: (v := _train(cluster, url, "metrics", str(job), "--json"))["gpus_of"] == "job" and v,
                30, f"gpu points tagged with job {job}",
            )  # fmt: skip
            assert [g["gpu"] for g in shown["gpus"]] == claims[job]["gpus"], shown["gpus"]
            assert all(g["node"] == node and g["util_pct"] == 10 + g["gpu"] for g in shown["gpus"])
    finally:
        for job in jobs:
            cluster.run(["scancel", str(job)], check=False)
        if agent is not None:
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=10)
    wait_until(lambda: not list((root / gpujobs.DIR / node).glob("*.json")), 30, "the epilogs to drop the claims")

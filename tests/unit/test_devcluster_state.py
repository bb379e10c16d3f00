"""Pure parts of the dev cluster: run record round trip and atomic write, process identity, env, CLI when down."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from nuro.devcluster import manager
from nuro.devcluster.layout import Layout
from nuro.devcluster.procs import ProcRef
from nuro.devcluster.record import Phase, RunRecord, read_record, write_record
from nuro.slurm_plugins.admin_cli import main as admin


def test_record_round_trips_and_replaces_atomically(tmp_path: Path) -> None:
    path = tmp_path / "run" / "cluster.json"
    rec = RunRecord(
        state_dir=str(tmp_path), nodes=8, port_base=16800, phase=Phase.RUNNING,
        supervisor=ProcRef("supervisor", 10, 1.5), daemons=[ProcRef("slurmctld", 11, 2.5)],
    )  # fmt: skip
    write_record(path, rec)
    assert read_record(path) == rec
    assert [p.name for p in path.parent.iterdir()] == ["cluster.json"]  # no temp file left behind


def test_unreadable_record_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text("{not json")
    with pytest.raises(RuntimeError, match="delete it"):
        read_record(path)
    assert read_record(tmp_path / "missing.json") is None


def test_procref_matches_only_the_same_process() -> None:
    me = ProcRef.of("me", os.getpid())
    assert me.is_alive()
    assert not ProcRef("me", os.getpid(), me.create_time - 100).is_alive()  # same PID, other start time
    done = subprocess.Popen(["true"])
    done.wait()
    assert not ProcRef("gone", done.pid, 0.0).is_alive()


def test_env_exports_point_plain_slurm_tools_and_s3_clients_at_the_cluster(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    slurm = (
        f"export SLURM_CONF={tmp_path}/etc/slurm.conf\nexport NURO_DEVCLUSTER_DIR={tmp_path}\n"
        f"export NURO_AGENT_STATUS_DIR={tmp_path}/run/agents\nexport NURO_STAGING_ROOT={tmp_path}/staging\n"
        f"export NURO_EVENT_LOG={tmp_path}/log/events.jsonl\n"
    )
    assert manager.render_env_sh(layout) == slurm  # never started: no port base, so no S3 endpoint is guessed
    layout.etc.mkdir()
    layout.ports_file.write_text('{"port_base": 10800}')
    assert manager.render_env_sh(layout) == slurm + (
        "export NURO_S3_ENDPOINT=http://127.0.0.1:10833\n"
        "export NURO_S3_BUCKET=nuro\n"
        "export AWS_ACCESS_KEY_ID=nuro-dev\n"
        "export AWS_SECRET_ACCESS_KEY=nuro-devcluster-s3\n"
        "export NURO_METRICS_URL=influx1://127.0.0.1:10886/nuro\n"
    )


def test_cli_env_and_status_when_down(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(admin, ["devcluster", "env", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0 and f"SLURM_CONF={tmp_path}/etc/slurm.conf" in res.stdout
    res = runner.invoke(admin, ["devcluster", "status", "--json", "--state-dir", str(tmp_path)])
    assert res.exit_code == 1
    assert json.loads(res.stdout)["phase"] == "down"
    res = runner.invoke(admin, ["devcluster", "down", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0 and "nothing was running" in res.stdout


def test_cli_rejects_bad_node_counts(tmp_path: Path) -> None:
    res = CliRunner().invoke(admin, ["devcluster", "up", "--nodes", "0", "--state-dir", str(tmp_path)])
    assert res.exit_code == 2 and "--nodes" in res.stderr


def test_port_plans_inside_the_ephemeral_range_are_refused() -> None:
    from nuro.devcluster.layout import PortPlan

    low, high = manager.ephemeral_range()
    manager.check_port_plan(PortPlan(16800), 500)  # the default leaves room for 500 nodes below 32768
    with pytest.raises(manager.DevClusterError, match=f"ephemeral range {low}-{high}.*--port-base between 1024"):
        manager.check_port_plan(PortPlan(low - 1000), 8)

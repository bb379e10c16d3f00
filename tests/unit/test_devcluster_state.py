"""Pure parts of the dev cluster: run record round trip and atomic write, process identity, env, CLI when down."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from nuro.admin.admin_cli import main as admin
from nuro.devcluster import manager
from nuro.devcluster.layout import Layout
from nuro.devcluster.procs import ProcRef
from nuro.devcluster.record import Phase, RunRecord, read_record, write_record


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
        f"export NURO_AGENT_STATUS_DIR={tmp_path}/run/agents\nexport NURO_AGENT_SOCKET_DIR={layout.agent_sockets}\n"
        f"export NURO_STAGING_ROOT='{tmp_path}/staging/{{node}}'\n"
        f"export NURO_SNAPSHOT_ROOT='{tmp_path}/snapshots/{{node}}'\n"
        f"export NURO_DATA_CACHE_DIR={tmp_path}/datacache\nexport NURO_EVENT_LOG={tmp_path}/log/events.jsonl\n"
        f"export NURO_CONTROLLER_WAITS={tmp_path}/controller-waits.json\n"
    )
    assert manager.render_env_sh(layout) == slurm  # never started: no port base, so no S3 endpoint is guessed
    layout.etc.mkdir()
    layout.ports_file.write_text('{"port_base": 10800}')
    assert manager.render_env_sh(layout) == slurm + (
        "export NURO_S3_ENDPOINT=http://127.0.0.1:10833\n"
        "export NURO_S3_BUCKET=nuro\n"
        "export AWS_ACCESS_KEY_ID=nuro-dev\n"
        "export AWS_SECRET_ACCESS_KEY=nuro-devcluster-s3\n"
        f"export NURO_S3_CREDENTIALS={tmp_path}/etc/s3\n"
        "export NURO_METRICS_URL=influx1://127.0.0.1:10886/nuro\n"
        "export NURO_RDZV_PORT_BASE=11300\n"  # the cluster's own rendezvous ports (base+500, span 400)
        "export NURO_RDZV_PORT_SPAN=400\n"
        f"export NURO_METRICS_CREDENTIALS={tmp_path}/etc/metrics\n"  # no admin metrics token: no users.json yet
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


def _conf_value(conf: str, key: str) -> str:
    (line,) = [ln for ln in conf.splitlines() if ln.startswith(f"{key}=")]
    return line.split("=", 1)[1]


def test_socket_paths_stay_short_for_a_200_character_state_dir(tmp_path: Path) -> None:
    """sun_path holds 108 bytes: a deep checkout must not push any socket past it (issue 11, deliverable 9)."""
    from nuro.cluster.slurmconf import render_slurm_conf
    from nuro.devcluster.layout import SUN_PATH_MAX, describe, longest_socket_path

    deep = tmp_path / ("d" * (200 - len(str(tmp_path)) - 1))
    assert len(str(deep)) == 200
    layout = Layout(deep)
    conf = render_slurm_conf(describe(layout, 8, 16800))
    spool = _conf_value(conf, "SlurmdSpoolDir").replace("%n", "gpu001")
    step_socket = f"{spool}/gpu001_4294967295.4294967295"  # slurmstepd's <node>_<job>.<step>, both ids at max
    munge = _conf_value(conf, "AccountingStoragePass")
    assert munge == str(layout.munge_socket) and f"AuthInfo=socket={munge}," in conf
    for path in (step_socket, munge + ".lock", str(layout.mysql_socket) + ".lock", str(layout.weed_filer_socket)):
        assert len(os.fsencode(path)) <= SUN_PATH_MAX, path
        assert not path.startswith(str(deep)), path  # none of them under the state dir
    assert len(os.fsencode(longest_socket_path(layout))) <= SUN_PATH_MAX
    # Everything else stays in the state dir, and the runtime dir is named by a hash of it: same dir, same name.
    assert layout.slurm_conf.is_relative_to(deep) and layout.record.is_relative_to(deep)
    assert Layout(deep).sockets == layout.sockets != Layout(tmp_path / "other").sockets


def test_sockets_dir_is_made_private_and_foreign_ones_are_refused(tmp_path: Path) -> None:
    from nuro.devcluster.layout import SocketsDirError, ensure_sockets_dir, sockets_dir_for

    state = tmp_path / "state"
    sockets = sockets_dir_for(state, parent=tmp_path)
    ensure_sockets_dir(sockets, state)
    assert sockets.stat().st_mode & 0o777 == 0o755
    assert (sockets / "state-dir").read_text() == f"{state}\n"
    ensure_sockets_dir(sockets, state)  # a second up reuses it
    with pytest.raises(SocketsDirError, match="hash collision"):
        ensure_sockets_dir(sockets, tmp_path / "another-state")
    sockets.chmod(0o777)
    with pytest.raises(SocketsDirError, match="writable only by it"):
        ensure_sockets_dir(sockets, state)
    planted = sockets_dir_for(tmp_path / "s2", parent=tmp_path)
    planted.symlink_to(tmp_path / "elsewhere", target_is_directory=True)  # a dir planted first under /tmp
    with pytest.raises(SocketsDirError, match="not a directory"):
        ensure_sockets_dir(planted, tmp_path / "s2")


def test_down_purge_removes_the_sockets_dir(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "state")
    from nuro.devcluster.layout import ensure_sockets_dir

    layout.root.mkdir()
    ensure_sockets_dir(layout.sockets, layout.root)
    (layout.sockets / "slurmd").mkdir()
    assert manager.down(layout, purge=True) == []
    assert not layout.sockets.exists() and not layout.root.exists()


@pytest.fixture
def fresh_layout(tmp_path: Path) -> Iterator[Layout]:
    """A state dir whose runtime dir (``/run/nuro-dc-<hash of the path>``) starts and ends empty: a rerun with the
    same ``--basetemp`` maps to the same runtime dir, and what a previous run parked there must not be found."""
    lay = Layout(tmp_path / "state")
    shutil.rmtree(lay.sockets, ignore_errors=True)
    yield lay
    shutil.rmtree(lay.sockets, ignore_errors=True)


def test_each_slurm_version_gets_its_own_state_and_the_others_wait_beside(fresh_layout: Layout) -> None:
    """``up --slurm 26.05`` after 22.05 ran in the same state dir (and back): slurmctld's state and slurmd's spool
    of the version that ran are parked, the starting version's come back, and each has its own accounting
    database (22.05 reading 26.05's state stopped on "CLUSTER NAME MISMATCH" before)."""
    from nuro.devcluster.layout import DB_NAME, db_name, describe

    lay = fresh_layout
    lay.ctld_state.mkdir(parents=True)
    (lay.ctld_state / "clustername").write_text("nuro")  # a 22.05 state dir from before the version marker
    lay.ports_file.parent.mkdir(parents=True)
    lay.ports_file.write_text(json.dumps({"port_base": 16800, "slurm": "22.05"}))
    lay.slurmd_spool.mkdir(parents=True)
    (lay.slurmd_spool / "cred_state").write_text("22.05")
    assert manager.own_slurm_state(lay, "22.05") is None and lay.ctld_state_owner.read_text() == "22.05\n"
    assert manager.own_slurm_state(lay, "26.05") == "22.05"
    assert not lay.ctld_state.exists() and not lay.slurmd_spool.exists()
    assert (lay.parked_ctld_state("22.05") / "clustername").read_text() == "nuro"
    assert (lay.parked_slurmd_spool("22.05") / "cred_state").read_text() == "22.05"
    lay.ctld_state.mkdir()
    (lay.ctld_state / "clustername").write_text("nuro|307")  # what 26.05 writes
    assert manager.own_slurm_state(lay, "22.05") == "26.05"
    assert (lay.ctld_state / "clustername").read_text() == "nuro"
    assert (lay.slurmd_spool / "cred_state").read_text() == "22.05"
    assert (lay.parked_ctld_state("26.05") / "clustername").read_text() == "nuro|307"
    assert db_name("22.05") == DB_NAME and db_name("26.05") == f"{DB_NAME}_26_05" != db_name("24.11")
    assert describe(lay, 1, 16800, slurm_version="24.11").db_name == f"{DB_NAME}_24_11"


def test_a_parked_state_in_the_way_is_refused_with_what_to_remove(fresh_layout: Layout) -> None:
    lay = fresh_layout
    lay.ctld_state.mkdir(parents=True)
    lay.ctld_state_owner.write_text("22.05\n")
    lay.parked_ctld_state("22.05").mkdir()
    with pytest.raises(manager.DevClusterError, match="exists already. Remove one of"):
        manager.own_slurm_state(lay, "26.05")
    assert lay.ctld_state.is_dir() and lay.ctld_state_owner.read_text() == "22.05\n", "nothing moved"

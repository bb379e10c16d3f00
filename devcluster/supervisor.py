"""The dev cluster's supervisor: parent and reaper of every daemon it starts.

PID 1 on these machines does not reap orphans, so daemonised slurmctld/slurmd/slurmstepd leave zombies. The
supervisor marks itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``), runs every daemon in the foreground
as its own child, adopts the slurmstepd processes slurmd double-forks, and reaps them all. On SIGTERM it stops what
it started in reverse order: slurmd, then whatever job processes it adopted, then slurmctld, slurmdbd, MariaDB,
InfluxDB, SeaweedFS and munge. Start order and readiness checks are the ones measured to work (munge → MariaDB →
slurmdbd → cluster row → slurmctld → slurmd); SeaweedFS (the S3 store, ``nuro.devcluster.s3``) starts right after munge,
before anything that could run a job whose prolog reads datasets; influxd (metrics, ``nuro.devcluster.tsdb``)
right after it, so the agents and the first job find their metrics store. After the slurmds come nuro's own
daemons: ``nuro-controller`` (failure detector; plus the policy when ``STATE/etc/teams.yaml`` exists) and one node
agent per node. Run as
``python -m nuro.devcluster.supervisor``; ``nuro-admin devcluster up`` does that.

Crashed daemons are restarted as their systemd units would be (``nuro.devcluster.restart``): ``nuro-controller``
and slurmctld on failure, the node agents always, each with a back-off and a start limit; the new PID replaces the
old one in the run record, so ``status`` and ``down`` see it. A node killed on purpose (``kill-node``) is not
restarted: its slurmd and agent have left the record.

Heartbeat keys: the supervisor derives each node's key from the cluster's master key
(``nuro.protocol.heartbeat.write_node_key``: ``etc/heartbeat-nodes/<node>.key``, mode 600) and gives each agent only its
own node's file; the controller reads the master. The controller also gets two test hooks (``controller_env``):
``NURO_CONTROLLER_CLOCK_OFFSET_FILE`` offsets its wall clock (a clock step without touching the machine's clock)
and ``NURO_CONTROLLER_TEST_FAULT_MARK`` makes its policy code raise for a job whose comment carries the mark.

Crashing and reviving a node (``devcluster kill-node/revive-node``) is done *here*, on request: the manager drops a
JSON request into ``run/control/`` and the supervisor, which is the parent (or subreaper) of every process involved,
kills or restarts them and answers with a JSON file. Why here: only the supervisor can restart a child it will then
reap and stop on ``down``, and only it knows which adopted slurmstepd belongs to which node. It knows that because
each slurmd is started with ``NURO_DEVCLUSTER_NODE=<node>`` in its environment, which slurmstepd inherits (slurmd
double-forks it, so it is re-parented to us, not a descendant of slurmd).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

import nuro
from nuro.cluster.description import release_of
from nuro.cluster.slurmconf import OPENMETRICS_SINCE
from nuro.devcluster import cgroups, s3, slurmroot, tracking, tsdb
from nuro.devcluster.layout import (
    CLUSTER_NAME,
    DB_NAME,
    DB_PASSWORD,
    DB_USER,
    METRICS_DB,
    Layout,
    PortPlan,
    bin_dir,
    db_name,
    metrics_url,
    node_names,
)
from nuro.devcluster.procs import (
    ProcRef,
    descendants,
    port_open,
    set_child_subreaper,
    stop_processes,
    wait_for,
)
from nuro.devcluster.record import Phase, RunRecord, write_record
from nuro.devcluster.restart import RestartBook, nice_for
from nuro.healthcheck import slurmdspool
from nuro.metrics import identities
from nuro.metrics.base import ENV_URL as ENV_METRICS_URL
from nuro.protocol.heartbeat import DEFAULT_INTERVAL_S, load_key, write_node_key
from nuro.runs.pending import ENV_WAITS
from nuro.slurm_plugins.controller.config import ENV_STATE_DIR

log = logging.getLogger("nuro.devcluster.supervisor")

NODE_TAG = "NURO_DEVCLUSTER_NODE"  # in each slurmd's environment, inherited by its slurmstepds
CLOCK_OFFSET_ENV = "NURO_CONTROLLER_CLOCK_OFFSET_FILE"  # read by nuro-controller (daemon.wall_clock_from_env)
FAULT_MARK_ENV = "NURO_CONTROLLER_TEST_FAULT_MARK"  # read by nuro-controller (engine.FAULT_MARK)
BIG_CLUSTER_NODES = 64  # above this many nodes the agents beat at 1 s (see Supervisor.beat_s)
FAULT_MARK = "nuro-test-fault-3b7e"  # a job comment containing this makes the dev controller's decide raise


class StartError(RuntimeError):
    """A daemon did not become ready; the message names it and its log file."""


def _quiet(
    argv: list[str], env: dict[str, str], timeout_s: float = 15.0, stdin: str | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False)


def db_setup_command(socket: Path, database: str = DB_NAME) -> tuple[list[str], str]:
    """The ``mariadb`` client's argv and the SQL for its stdin that make slurmdbd's user and database.

    Why stdin: the SQL holds the user's password, and a process's argv is visible to every user in ``ps``; the
    dev cluster runs team users' jobs on this very host."""
    sql = (
        f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{DB_PASSWORD}';"
        f"GRANT ALL ON *.* TO '{DB_USER}'@'127.0.0.1';FLUSH PRIVILEGES;"
    )
    # The database first: slurmdbd 24.11+ (MariaDB Connector/C 3.4) fails every query on the handle it reuses
    # after its own "Unknown database" reconnect (docs/slurm-versions.md); made here, it never reconnects.
    sql += f"CREATE DATABASE IF NOT EXISTS {database};"
    return ["mariadb", "--no-defaults", f"--socket={socket}", "-uroot"], sql


def _node_tag(pid: int) -> str | None:
    """The dev-cluster node a slurmstepd belongs to.

    ``NURO_DEVCLUSTER_NODE`` from /proc/PID/environ, read raw: slurmstepd's setproctitle zeroes the start of that
    area, and psutil's ``environ()`` then returns {} although the variable is still there (22.05). Slurm 24.11+
    leaves nothing readable there at all; their slurmstepd keeps the node's log open instead (``SlurmdLogFile=
    .../slurmd-%n.log``, seen through the chroot as ``<root>/<path>``), so the name of that file says the node.
    """
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = NODE_TAG.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return None
    for fd in fds:
        try:
            name = os.readlink(fd).rsplit("/", 1)[-1]
        except OSError:
            continue
        if name.startswith("slurmd-") and name.endswith(".log"):
            return name.removeprefix("slurmd-").removesuffix(".log")
    return None


ENV_MISS_LIMIT = "NURO_DEVCLUSTER_MISS_LIMIT"


def _miss_limit(raw: str | None) -> int | None:
    """``NURO_DEVCLUSTER_MISS_LIMIT`` as the controller's ``--miss-limit`` (None: unset, the product's default)."""
    if not raw:
        return None
    if not raw.isdigit() or not 2 <= int(raw) <= 100:
        raise ValueError(f"{ENV_MISS_LIMIT}={raw!r}: give a whole number of heartbeat intervals from 2 to 100")
    return int(raw)


class Supervisor:
    def __init__(self, layout: Layout, n_nodes: int, port_base: int, slurm: str = slurmroot.HOST_VERSION) -> None:
        self.layout = layout
        self.slurm = slurm
        self.ports = PortPlan(port_base)
        self.nodes = node_names(n_nodes)
        install = slurmroot.resolve(slurm, build=False)  # built by `up` before it started us
        #: 25.11+ serves OpenMetrics on slurmctld's port (the renderer enables it): the controller reads them.
        self.openmetrics = release_of(slurm) >= OPENMETRICS_SINCE
        # Agents beat at the product's interval, except on the big emulated clusters of the benches: 500 agent
        # processes waking 4 times a second would take a good part of this box's 2 cores from what is measured.
        self.beat_s = DEFAULT_INTERVAL_S if n_nodes <= BIG_CLUSTER_NODES else 1.0
        #: ``NURO_DEVCLUSTER_MISS_LIMIT`` (the test suite's clusters: 8): silent intervals before the controller
        #: declares a node lost. Unset: the product's default. All agents of a dev cluster share this machine's
        #: cores; under CI's three clusters a few agents stalled together for ~1 s and their nodes (and a test's job)
        #: were taken down. Tests prove behaviour, the benches measure speed with the product's settings.
        self.miss_limit = _miss_limit(os.environ.get(ENV_MISS_LIMIT))
        #: The Slurm daemons' root (None: the host's Slurm); clients then run through layout.slurm_bin.
        self.root_plan = (
            slurmroot.plan_root(
                install, layout.root, layout.sockets, Path(sys.prefix), Path(nuro.__file__).resolve().parents[1]
            )
            if install.chrooted
            else None
        )
        path = slurmroot.SYSTEM_PATH
        self.env = {
            "PATH": slurmroot.path_with(layout.slurm_bin, path) if install.chrooted else path,
            "SLURM_CONF": str(layout.slurm_conf),
            "LANG": "C.UTF-8",
        }
        self.children: dict[int, subprocess.Popen] = {}
        self.restarts = RestartBook()
        self._respawn: dict[str, object] = {}  # daemon name → zero-argument function that starts it again
        self._due: dict[str, float] = {}  # daemon name → monotonic time its restart is due
        self.record = RunRecord(
            state_dir=str(layout.root),
            nodes=n_nodes,
            port_base=port_base,
            supervisor=ProcRef.of("supervisor", os.getpid()),
            started_at=time.time(),
        )
        self.stopping = False
        #: MLflow and its bridge (``NURO_DEVCLUSTER_MLFLOW=0``: without them)
        self.tracking = tracking.enabled()

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def _save(self) -> None:
        write_record(self.layout.record, self.record)

    def _spawn(
        self,
        name: str,
        argv: list[str],
        log_name: str,
        save: bool = True,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen:
        """Start a daemon in the foreground as our child and record it (``save=False`` when a batch saves once)."""
        log.info("start %s: %s", name, " ".join(argv))
        with open(self.layout.log / log_name, "ab") as out:
            proc = subprocess.Popen(
                argv, env=env or self.env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        self.children[proc.pid] = proc
        if nice := nice_for(name):  # the unit's Nice=; threads the daemon starts later inherit it from its main thread
            try:
                os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
            except OSError as exc:
                log.warning("nice %d for %s not set (%s)", nice, name, exc)
        self.record.daemons = [d for d in self.record.daemons if d.name != name] + [ProcRef.of(name, proc.pid)]
        self.restarts.started(name, time.monotonic())
        self._respawn[name] = lambda: self._spawn(name, argv, log_name, env=env, cwd=cwd)
        if save:
            self._save()
        return proc

    def _ready(self, name: str, proc: subprocess.Popen, check, timeout_s: float, log_name: str) -> None:
        def ok() -> bool:
            if proc.poll() is not None:
                raise StartError(
                    f"{name} exited with status {proc.returncode} during start-up; see {self.layout.log / log_name}"
                )
            return bool(check())

        if not wait_for(ok, timeout_s):
            raise StartError(f"{name} was not ready after {timeout_s:.0f} s; see {self.layout.log / log_name}")
        log.info("%s ready", name)

    # -- daemons ----------------------------------------------------------------------------------------------
    def _slurm(self, argv: list[str]) -> list[str]:
        """A Slurm daemon's argv: as is for the host's Slurm, under chroot in the cluster's root otherwise."""
        return slurmroot.daemon_argv(self.root_plan, argv)

    def start_munge(self) -> None:
        lay = self.layout
        argv = [
            "munged", "--foreground", "--force", f"--socket={lay.munge_socket}", f"--key-file={lay.munge_key}",
            f"--log-file={lay.log / 'munged.log'}", f"--pid-file={lay.run / 'munged.pid'}",
            f"--seed-file={lay.root / 'munged.seed'}", "--num-threads=4",
        ]  # fmt: skip
        proc = self._spawn("munged", argv, "munged.out")
        check = ["munge", "-n", f"--socket={lay.munge_socket}"]
        self._ready("munged", proc, lambda: _quiet(check, self.env, 5).returncode == 0, 15, "munged.log")
        os.chmod(lay.munge_dir, 0o711)  # non-root clients must reach the socket

    def start_seaweedfs(self) -> None:
        """SeaweedFS ``weed mini`` as the S3 store; ready when a signed HEAD on the default bucket answers."""
        lay = self.layout
        s3.prepare(lay.s3_data)
        argv = s3.weed_argv(s3.require_weed(), lay.s3_data, lay.sockets, self.ports)  # short socket paths
        # cwd = its data dir: weed also reads master.toml/security.toml from the working directory.
        proc = self._spawn("seaweedfs", argv, "seaweedfs.log", env=s3.weed_env(self.env, lay.s3_data), cwd=lay.s3_data)
        self._ready("seaweedfs", proc, lambda: s3.is_ready(self.ports, lay.s3_data), 60, "seaweedfs.log")

    def start_influxdb(self) -> None:
        """influxd 1.6.7 (metrics store, ``nuro.devcluster.tsdb``): HTTP and RPC on loopback only, data in
        ``influxdb/``; ready when ``/ping`` answers 204, then database ``nuro`` is created (idempotent)."""
        lay = self.layout
        ids = identities.read_identities(lay.influx_dir)  # per-team users (manager._write_hooks made them)
        config = tsdb.write_influx_config(lay.influx_dir, self.ports.influx, self.ports.influx_rpc, auth=bool(ids))
        argv = tsdb.influx_argv(tsdb.ensure_influxd(), config)
        proc = self._spawn("influxd", argv, "influxd.log", cwd=lay.influx_dir)
        url = f"http://127.0.0.1:{self.ports.influx}"
        self._ready("influxd", proc, lambda: tsdb.influx_ready(url), 30, "influxd.log")
        if ids:
            identities.provision_auth(url, ids)
        else:
            tsdb.create_database(url, METRICS_DB)

    def start_mlflow(self) -> None:
        """The MLflow tracking server (``nuro.devcluster.tracking``: SQLite store, loopback, one worker, telemetry
        off; installed by ``up`` before we start); ready when ``/health`` answers."""
        lay = self.layout
        lay.mlflow_dir.mkdir(parents=True, exist_ok=True)
        argv = tracking.mlflow_argv(tracking.ensure_mlflow(), lay.mlflow_dir, self.ports.mlflow)
        proc = self._spawn("mlflow", argv, "mlflow.log", env={**self.env, **tracking.SERVER_ENV}, cwd=lay.mlflow_dir)
        url = f"http://127.0.0.1:{self.ports.mlflow}"
        self._ready("mlflow", proc, lambda: tracking.mlflow_ready(url), 120, "mlflow.log")

    def start_mlflow_bridge(self) -> None:
        """``nuro-mlflow-bridge``: nuro's runs into the cluster's MLflow, every 2 s, with the platform's metrics
        login (it reads every team's database) and the Slurm client's environment."""
        env = {**self.env, ENV_METRICS_URL: metrics_url(self.ports), **identities.admin_env(self.layout.influx_dir),
               **s3.s3_env(self.ports, self.layout.s3_data)}  # fmt: skip
        env["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{self.ports.mlflow}"
        env[ENV_WAITS] = str(self.layout.controller_waits)
        env[ENV_STATE_DIR] = str(self.layout.controller_state)  # jobs' progress, as the controller has it
        argv = [sys.executable, "-m", "nuro.slurm_plugins.mlflow_bridge", "--interval-s", "2"]
        self._spawn("mlflow-bridge", argv, "mlflow-bridge.log", env=env)

    def start_mariadb(self) -> None:
        lay = self.layout
        # Each cluster's MariaDB keeps its temporary tables in its own dir: a mariadbd starting up deletes every
        # "#sql*" file in its tmpdir (mysql_rm_tmp_tables), so with the default /tmp one cluster's start removed the
        # temporary tables of another cluster's mariadb-install-db running at the same moment (CI's shards start
        # together: "Unknown table 'mysql.tmp_user_sys'").
        tmpdir = lay.run / "mysql-tmp"
        tmpdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not (lay.mysql_data / "mysql").is_dir():
            argv = [
                "mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={lay.mysql_data}",
                "--auth-root-authentication-method=normal", "--skip-test-db", f"--tmpdir={tmpdir}",
            ]  # fmt: skip
            log.info("initialise MariaDB: %s", " ".join(argv))
            res = _quiet(argv, self.env, 120)
            if res.returncode != 0:
                raise StartError(f"mariadb-install-db failed: {res.stderr.strip()[-1500:]}")
        argv = [
            "mariadbd", "--no-defaults", "--user=root", f"--datadir={lay.mysql_data}",
            f"--socket={lay.mysql_socket}", f"--port={self.ports.mariadb}", "--bind-address=127.0.0.1",
            f"--pid-file={lay.run / 'mariadbd.pid'}", f"--log-error={lay.log / 'mariadbd.log'}", f"--tmpdir={tmpdir}",
            "--skip-name-resolve", "--skip-log-bin", "--innodb-buffer-pool-size=128M",
            "--innodb-flush-log-at-trx-commit=2", "--innodb-lock-wait-timeout=900",
        ]  # fmt: skip
        proc = self._spawn("mariadbd", argv, "mariadbd.out")
        ping = ["mariadb-admin", "--no-defaults", f"--socket={lay.mysql_socket}", "-uroot", "ping"]
        self._ready("mariadbd", proc, lambda: _quiet(ping, self.env, 5).returncode == 0, 60, "mariadbd.log")
        argv, sql = db_setup_command(lay.mysql_socket, db_name(self.slurm))
        res = _quiet(argv, self.env, stdin=sql)
        if res.returncode != 0:
            raise StartError(f"creating the slurmdbd database user failed: {res.stderr.strip()}")

    def start_slurmdbd(self) -> None:
        proc = self._spawn("slurmdbd", self._slurm(["slurmdbd", "-D"]), "slurmdbd.out")
        self._ready("slurmdbd", proc, lambda: port_open(self.ports.slurmdbd), 60, "slurmdbd.log")
        listed = _quiet(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], self.env, 30)
        if CLUSTER_NAME not in listed.stdout.split():
            res = _quiet(["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME], self.env, 30)
            if res.returncode != 0:
                raise StartError(f"sacctmgr add cluster {CLUSTER_NAME} failed: {res.stderr.strip()}")

    def start_slurmctld(self) -> None:
        proc = self._spawn("slurmctld", self._slurm(["slurmctld", "-D", "-i"]), "slurmctld.out")
        self._ready("slurmctld", proc, lambda: port_open(self.ports.slurmctld), 60, "slurmctld.log")

    def _spawn_slurmd(self, name: str, save: bool) -> subprocess.Popen:
        env = {**self.env, NODE_TAG: name}
        argv = self._slurm(["slurmd", "-D", "-N", name])
        return self._spawn(f"slurmd:{name}", argv, "slurmd.out", save=save, env=env)

    def start_slurmds(self) -> None:
        for name in self.nodes:
            (self.layout.slurmd_spool / name).mkdir(parents=True, exist_ok=True)
        try:
            for name in self.nodes:
                # One record write for the batch: a write (fsync) per slurmd made 500 nodes take 15 s.
                self._spawn_slurmd(name, save=False)
        finally:
            self._save()

    def controller_argv(self) -> list[str]:
        """``nuro-controller`` with the detector on; with the policy too when ``etc/teams.yaml`` exists."""
        lay = self.layout
        argv = [
            sys.executable, "-m", "nuro.slurm_plugins.controller.daemon",
            "--heartbeat-port", str(self.ports.heartbeat), "--heartbeat-key", str(lay.heartbeat_key),
            "--event-log", str(lay.events_log), "--heartbeat-interval-s", str(self.beat_s),
            "--state-dir", str(lay.controller_state),
        ]  # fmt: skip
        if self.miss_limit is not None:
            argv += ["--miss-limit", str(self.miss_limit)]
        if lay.teams_yaml.exists():
            argv += ["--policy", str(lay.teams_yaml)]
        if self.openmetrics:
            argv += ["--slurm-metrics-url", f"http://127.0.0.1:{self.ports.slurmctld}"]
        return argv

    def agent_argv(self, node: str) -> list[str]:
        """The node agent's command line (fixed CLI); the stand-in beacon until ``nuro-nodeagent`` is installed."""
        lay = self.layout
        real = importlib.util.find_spec("nuro.healthcheck.agent") is not None
        head = [str(bin_dir() / "nuro-nodeagent")] if real else [sys.executable, "-m", "nuro.devcluster.beacon"]
        if real and not (bin_dir() / "nuro-nodeagent").exists():
            head = [sys.executable, "-m", "nuro.healthcheck.agent"]
        return head + [
            "--node", node, "--controller", f"127.0.0.1:{self.ports.heartbeat}",
            "--key-file", str(self.node_key_file(node)), "--interval-s", str(self.beat_s), "--probe", "none",
            "--status-dir", str(lay.agents_dir), "--env-file", str(lay.nuro_env),
            "--staging-root", str(lay.node_staging(node)), "--log-file", str(lay.log / f"agent-{node}.log"),
        ]  # fmt: skip

    def node_key_file(self, node: str) -> Path:
        """Where ``node``'s derived heartbeat key lives (only its agent is given this path)."""
        return self.layout.heartbeat_key.parent / "heartbeat-nodes" / f"{node}.key"

    def write_node_keys(self) -> None:
        """Every node's key from the master (rewritten each start: a new master reaches every node)."""
        master = load_key(self.layout.heartbeat_key)
        for node in self.nodes:
            write_node_key(self.node_key_file(node), master, node)

    def controller_env(self) -> dict[str, str]:
        """The controller's environment with the dev cluster's test hooks: a wall-clock offset file
        (``daemon.OffsetClock``) and the fault mark (``engine.FAULT_MARK``). Production sets neither."""
        env = {**self.env, CLOCK_OFFSET_ENV: str(self.clock_offset_file()), FAULT_MARK_ENV: FAULT_MARK,
               ENV_WAITS: str(self.layout.controller_waits)}  # fmt: skip
        if self.openmetrics:  # slurmctld's metrics go to the cluster's influxd, as the nodes' identity (write only)
            ids = identities.read_identities(self.layout.influx_dir)
            env[ENV_METRICS_URL] = metrics_url(self.ports)
            env.update(identities.node_env(ids) if ids else {})
        return env

    def clock_offset_file(self) -> Path:
        return self.layout.run / "controller-clock-offset"

    def _spawn_controller(self) -> subprocess.Popen:
        # argv is rebuilt on each (re)start: a teams.yaml written since turns the policy loop on
        proc = self._spawn("nuro-controller", self.controller_argv(), "controller.log", env=self.controller_env())
        self._respawn["nuro-controller"] = self._spawn_controller
        return proc

    def start_controller(self) -> None:
        proc = self._spawn_controller()
        time.sleep(0.3)  # it binds its socket at once; a bad key or busy port makes it exit right away
        if proc.poll() is not None:
            raise StartError(f"nuro-controller exited with {proc.returncode}; see {self.layout.log / 'controller.log'}")

    def _spawn_agent(self, node: str, save: bool) -> subprocess.Popen:
        return self._spawn(f"agent:{node}", self.agent_argv(node), "agents.out", save=save)

    def start_agents(self) -> None:
        self.layout.agents_dir.mkdir(parents=True, exist_ok=True)
        self.write_node_keys()
        try:
            for node in self.nodes:
                self._spawn_agent(node, save=False)
        finally:
            self._save()

    # -- crash and revive a node on request (devcluster kill-node / revive-node) ------------------------------
    def _ref(self, name: str) -> ProcRef | None:
        return next((d for d in self.record.daemons if d.name == name), None)

    def _stepds_of(self, node: str) -> list[psutil.Process]:
        """Adopted slurmstepds of this node: our direct children outside the record whose slurmd tagged them."""
        core = {d.pid for d in self.record.daemons}
        found = []
        for proc in psutil.Process().children():
            if proc.pid in core:
                continue
            if _node_tag(proc.pid) == node:
                found.append(proc)
        return found

    def kill_node(self, node: str) -> dict:
        """Crash a host: SIGKILL its slurmd, its slurmstepds and their job processes, and its agent. By PID only."""
        if node not in self.nodes:
            raise ValueError(f"no node {node!r} in this cluster ({self.nodes[0]}..{self.nodes[-1]})")
        if node in self.record.killed_nodes:
            raise ValueError(f"{node} is already killed; run 'devcluster revive-node {node}'")
        killed: list[dict] = []

        def kill(procs: list[psutil.Process], what: str) -> None:
            for p in procs:
                try:
                    p.kill()
                    killed.append({"name": what, "pid": p.pid})
                except psutil.NoSuchProcess:
                    continue

        at = time.time()
        slurmd_ref, agent_ref = self._ref(f"slurmd:{node}"), self._ref(f"agent:{node}")
        slurmd = slurmd_ref.process() if slurmd_ref else None
        if slurmd is not None:
            inflight = descendants(slurmd)  # a slurmstepd caught mid double-fork
            kill([slurmd], "slurmd")  # first, so it cannot start another step while we look
            kill(inflight, "slurmd child")
        stepds = self._stepds_of(node)
        for p in stepds:  # freeze the trees so no job process escapes between listing and killing
            try:
                p.suspend()
            except psutil.NoSuchProcess:
                continue
        jobs = [c for p in stepds for c in descendants(p)]
        kill(stepds, "slurmstepd")
        kill(jobs, "job process")
        # and those that left the stepd's tree (setsid, double fork): the node's cgroups still hold them
        seen = {k["pid"] for k in killed}
        kill([p for p in cgroups.node_processes(self.layout.root, node) if p.pid not in seen], "job process")
        agent = agent_ref.process() if agent_ref else None
        if agent is not None:
            kill([agent], "agent")
        self.record.daemons = [d for d in self.record.daemons if d.name not in (f"slurmd:{node}", f"agent:{node}")]
        self.record.killed_nodes[node] = {"at": at, "killed": killed}
        self._save()
        log.warning("kill-node %s: SIGKILLed %d processes: %s", node, len(killed), killed)
        return {"node": node, "at": at, "killed": killed}

    def revive_node(self, node: str) -> dict:
        """Restart a killed node's slurmd and agent as our children (recorded, reaped, stopped on down)."""
        if node not in self.nodes:
            raise ValueError(f"no node {node!r} in this cluster ({self.nodes[0]}..{self.nodes[-1]})")
        started = []
        if self._ref(f"slurmd:{node}") is None or not self._ref(f"slurmd:{node}").is_alive():
            self.record.daemons = [d for d in self.record.daemons if d.name != f"slurmd:{node}"]
            # the host "reboots": what the compute role's ExecStartPre does on a real one (a crashed node's slurmd
            # would otherwise reload the jobs it ran and skip their next attempts' prologs)
            slurmdspool.clear_stale(self.layout.slurmd_spool / node, time.time())
            started.append({"name": "slurmd", "pid": self._spawn_slurmd(node, save=False).pid})
        if self._ref(f"agent:{node}") is None or not self._ref(f"agent:{node}").is_alive():
            self.record.daemons = [d for d in self.record.daemons if d.name != f"agent:{node}"]
            started.append({"name": "agent", "pid": self._spawn_agent(node, save=False).pid})
        self.record.killed_nodes.pop(node, None)
        self._save()
        log.info("revive-node %s: started %s", node, started)
        return {"node": node, "at": time.time(), "started": started}

    def serve_requests(self) -> None:
        """Answer the manager's requests in ``run/control/`` (``<id>.req.json`` → ``<id>.resp.json``)."""
        ctl = self.layout.control_dir
        try:
            reqs = sorted(ctl.glob("*.req.json"))
        except OSError:
            return
        for req in reqs:
            rid = req.name.removesuffix(".req.json")
            try:
                body = json.loads(req.read_text())
                op, node = body["op"], str(body["node"])
                if op == "kill-node":
                    answer = {"ok": True, **self.kill_node(node)}
                elif op == "revive-node":
                    answer = {"ok": True, **self.revive_node(node)}
                else:
                    answer = {"ok": False, "error": f"unknown op {op!r}"}
            except (ValueError, KeyError, OSError) as exc:
                answer = {"ok": False, "error": str(exc)}
            tmp = ctl / f".{rid}.resp.tmp"
            tmp.write_text(json.dumps(answer))
            os.replace(tmp, ctl / f"{rid}.resp.json")
            req.unlink(missing_ok=True)

    def start(self) -> None:
        if self.root_plan is not None:  # our own mount namespace with the overlay: gone when we all are
            slurmroot.enter_root(self.root_plan)
        self.start_munge()
        self.start_seaweedfs()
        self.start_influxdb()
        self.start_mariadb()
        self.start_slurmdbd()
        self.start_slurmctld()
        self.start_slurmds()
        self.start_controller()
        self.start_agents()
        if self.tracking:
            self.start_mlflow()
            self.start_mlflow_bridge()
        self.record.phase = Phase.RUNNING
        self.record.running_at = time.time()
        self._save()
        log.info("all daemons started (%d slurmd)", len(self.nodes))

    # -- run and stop -----------------------------------------------------------------------------------------
    def reap(self) -> None:
        """Collect every exited child, ours or adopted; log the daemons that died and plan their restart."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            proc = self.children.pop(pid, None)
            if proc is not None:
                proc.returncode = os.waitstatus_to_exitcode(status)
                name = next((d.name for d in self.record.daemons if d.pid == pid), None)
                if not self.stopping:
                    log.warning("%s pid=%d exited with %s", name or pid, pid, proc.returncode)
                    if name is not None:
                        self._plan_restart(name, proc.returncode)

    def _plan_restart(self, name: str, returncode: int) -> None:
        delay, why = self.restarts.plan(name, returncode, time.monotonic())
        entry = self.record.restarts.setdefault(name, {"count": 0})
        entry.update(last_exit=returncode, last_exit_at=time.time(), last=why)
        if delay is None or name not in self._respawn:
            entry["gave_up"] = "limit" in why
            log.log(logging.ERROR if entry["gave_up"] else logging.INFO, "%s %s", name, why)
        else:
            log.warning("%s %s in %.1f s", name, why, delay)
            self._due[name] = time.monotonic() + delay
        self._save()

    def restart_due(self) -> None:
        """Start again the daemons whose back-off has passed (each recorded under its name with its new PID)."""
        now = time.monotonic()
        for name, due in sorted(self._due.items(), key=lambda kv: kv[1]):
            if due > now or self.stopping:
                continue
            del self._due[name]
            if name.startswith("agent:") and name.removeprefix("agent:") in self.record.killed_nodes:
                continue  # crashed on purpose since: revive-node starts it
            ref = self._ref(name)
            if ref is not None and ref.is_alive():
                continue  # started again meanwhile (revive-node)
            try:
                proc = self._respawn[name]()  # type: ignore[operator]
            except Exception as exc:  # noqa: BLE001 - a failed start is an exit: plan the next try
                log.error("restart of %s failed: %s", name, exc)
                self._plan_restart(name, 1)
                continue
            entry = self.record.restarts.setdefault(name, {"count": 0})
            entry.update(count=int(entry.get("count", 0)) + 1, pid=proc.pid, at=time.time(), gave_up=False)
            log.warning("%s restarted: pid=%d", name, proc.pid)
            self._save()

    def stop(self) -> None:
        """Stop in reverse dependency order, then anything adopted (slurmstepd, job tasks). By PID only."""
        self.stopping = True
        self.record.phase = Phase.STOPPING
        self._save()
        me = psutil.Process()
        by_name = {d.name: d for d in self.record.daemons}

        def live(names: list[str]) -> list[psutil.Process]:
            procs = [by_name[n].process() for n in names if n in by_name]
            return [p for p in procs if p is not None]

        stop_processes(live([n for n in by_name if n.startswith("agent:")] + ["nuro-controller"]), 5, "nuro daemon")
        slurmds = [n for n in by_name if n.startswith("slurmd:")]
        stop_processes(live(slurmds), 10, "slurmd")
        # Orphans re-parented to us (slurmstepd, which slurmd double-forks) and their job processes. Children of
        # the core daemons (slurmctld's slurmscriptd) are left to the daemon that owns them.
        core = {d.pid for d in self.record.daemons}
        orphans = [p for p in me.children() if p.pid not in core]
        adopted = orphans + [c for p in orphans for c in descendants(p)]
        if adopted:
            log.info("stopping %d adopted job processes: %s", len(adopted), [p.pid for p in adopted])
            stop_processes(adopted, 5, "job process")
        for name in ("slurmctld", "slurmdbd", "mariadbd", "influxd", "seaweedfs", "munged"):
            stop_processes(live([name]), 20, name)
        leftovers = me.children(recursive=True)
        if leftovers:
            stop_processes(leftovers, 2, "leftover")
        self.reap()
        self.record.phase = Phase.STOPPED
        self.record.daemons = []
        self._save()
        log.info("stopped")

    def run(self) -> int:
        def on_term(signum: int, _frame) -> None:
            log.info("received signal %d: stopping", signum)
            self.stopping = True

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        self._save()
        try:
            self.start()
        except Exception as exc:  # record why, then stop what was started: nothing is left half-up
            log.error("start failed: %s", exc)
            self.stop()
            self.record.phase = Phase.FAILED
            self.record.error = str(exc)
            self._save()
            return 1
        self.layout.control_dir.mkdir(parents=True, exist_ok=True)
        while not self.stopping:
            self.reap()
            self.restart_due()
            self.serve_requests()
            time.sleep(0.1)
        self.stop()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nuro-devcluster-supervisor")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--nodes", required=True, type=int)
    parser.add_argument("--port-base", required=True, type=int)
    parser.add_argument("--slurm", default=slurmroot.HOST_VERSION, choices=slurmroot.SUPPORTED)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    set_child_subreaper()
    return Supervisor(Layout(args.state_dir), args.nodes, args.port_base, args.slurm).run()


if __name__ == "__main__":
    sys.exit(main())

"""Where the dev cluster keeps everything, and the cluster description it runs.

One state directory holds config, daemon state, logs and the run record; the Unix sockets (and the slurmd spool,
where slurmstepd makes one socket per step) live in a short runtime dir named after a hash of the state dir
(``Layout.sockets``), because ``sun_path`` holds at most 108 bytes and a state dir inside a deep checkout is longer
than that alone. ``down --purge`` removes both, and two clusters with different state dirs and port bases coexist.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nuro.cluster.description import ClusterDescription, NodeSpec, Paths, Ports, Timers, leaf_spine
from nuro.devcluster import cgroups

DEFAULT_NODES = 8
DEFAULT_PORT_BASE = 16800
GPUS_PER_NODE = 8
LEAF_SIZE = 4
CLUSTER_NAME = "nuro"
DB_USER = "slurm"
DB_PASSWORD = "nuro-devcluster"  # local loopback-only MariaDB of a throwaway cluster
DB_NAME = "slurm_acct_db"  # ClusterDescription.db_name's default: what slurmdbd.conf names
#: The Slurm version whose accounting database keeps the plain ``DB_NAME`` (the host's, which state dirs made
#: before per-version state used): every other version has its own (``db_name``).
PLAIN_DB_VERSION = "22.05"


def db_name(slurm_version: str) -> str:
    """The accounting database of ``slurm_version`` in the dev cluster's MariaDB: one per version, because a
    slurmdbd refuses another major version's schema ("Database schema is too old ... to upgrade") and an older one
    cannot read a newer one's."""
    if slurm_version == PLAIN_DB_VERSION:
        return DB_NAME
    return f"{DB_NAME}_{slurm_version.replace('.', '_')}"


# The dev cluster's S3 (SeaweedFS) identity: a loopback-only throwaway store, like the MariaDB password above.
S3_ACCESS_KEY = "nuro-dev"
S3_SECRET_KEY = "nuro-devcluster-s3"
S3_BUCKET = "nuro"
# Beside that admin identity (tests, demo setup, root's `devcluster env`), SeaweedFS gets one identity for the node
# daemons and one per team, with random secrets kept in the S3 data dir (nuro.devcluster.s3.provision).
S3_NODE_ACCESS_KEY = "nuro-node"
S3_TEAM_ACCESS_KEY_PREFIX = "nuro-team-"
METRICS_DB = "nuro"  # the InfluxDB database the dev cluster creates and exports in NURO_METRICS_URL


# sun_path is 108 bytes including the terminating NUL (unix(7)): the longest socket path is 107 bytes.
SUN_PATH_MAX = 107
# Where the short runtime dirs go: /run is root-only writable (no one can plant a directory there first); /tmp
# stands in on machines without a usable /run, with the ownership check of ensure_sockets_dir.
RUNTIME_PARENTS = (Path("/run"), Path("/tmp"))
RUNTIME_PREFIX = "nuro-dc-"
# The longest socket name under the runtime dir: slurmstepd's <node>_<job>.<step> in the per-node spool, with a
# 6-character node name and both ids at their 32-bit maximum (extern/batch steps are 0xfffffffa..0xfffffffe).
LONGEST_SOCKET_TAIL = "/slurmd/gpu001/gpu001_4294967295.4294967295"


def runtime_parent() -> Path:
    """``/run`` when it is a directory, else ``/tmp``. Not "when writable": a non-root ``status`` or ``env`` must
    compute the same paths as root's ``up`` did."""
    for parent in RUNTIME_PARENTS:
        if parent.is_dir():
            return parent
    return RUNTIME_PARENTS[-1]


def sockets_dir_for(state_dir: Path, parent: Path | None = None) -> Path:
    """The short runtime dir of one state dir: ``/run/nuro-dc-<12 hex of sha256(abs state dir)>``.

    Deterministic (``up``, the supervisor and ``down`` all find it from the state dir alone) and independent of
    how deep the state dir is; 48 bits of hash make two state dirs sharing one vanishingly unlikely, and
    ``ensure_sockets_dir`` refuses if it happens anyway (the dir records its state dir).
    """
    digest = hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:12]
    return (parent or runtime_parent()) / f"{RUNTIME_PREFIX}{digest}"


class SocketsDirError(RuntimeError):
    """The runtime dir exists but is not ours (another owner, a symlink, another state dir's)."""


def ensure_sockets_dir(sockets: Path, state_dir: Path) -> None:
    """Create the runtime dir root-owned 0755 (job users must reach the munge socket inside), or check the one
    that is there: a real directory (not a symlink) owned by us, not writable by group/others, made for this
    state dir. Anything else is refused rather than used: under /tmp another user could have made it first."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(sockets, 0o755)
    st = os.lstat(sockets)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SocketsDirError(
            f"{sockets} (the dev cluster's socket dir for {state_dir}) is not a directory owned by uid "
            f"{os.geteuid()} and writable only by it (mode {stat.filemode(st.st_mode)}, uid {st.st_uid}); "
            "remove it and run 'devcluster up' again"
        )
    os.chmod(sockets, 0o755)
    owner = sockets / "state-dir"
    want = os.path.abspath(state_dir) + "\n"
    try:
        have = owner.read_text()
    except FileNotFoundError:
        owner.write_text(want)
        return
    if have != want:
        raise SocketsDirError(
            f"{sockets} belongs to the dev cluster in {have.strip()!r}, not {state_dir} (hash collision); "
            f"remove it if that cluster is gone, or use another --state-dir"
        )


def longest_socket_path(layout: Layout) -> str:
    """The longest Unix socket path this layout makes (checked by ``up`` and the unit tests)."""
    candidates = [
        str(layout.munge_socket) + ".lock",
        str(layout.mysql_socket) + ".lock",
        str(layout.weed_filer_socket),
        str(layout.weed_s3_socket),
        str(layout.sockets) + LONGEST_SOCKET_TAIL,
        str(layout.agent_sockets / "gpu-0000000000.report.sock"),  # nuro.protocol.peerloss, a long node name
    ]
    return max(candidates, key=lambda p: len(os.fsencode(p)))


def default_state_dir() -> Path:
    """``$NURO_DEVCLUSTER_DIR`` or ``./.devcluster``: per checkout, so parallel clones do not share a cluster."""
    return Path(os.environ.get("NURO_DEVCLUSTER_DIR", ".devcluster")).absolute()


def bin_dir() -> Path:
    """The directory of nuro's console scripts (the venv's bin), used for Prolog/Epilog/HealthCheckProgram."""
    return Path(sys.executable).parent


def metrics_url(ports: PortPlan) -> str:
    """``NURO_METRICS_URL`` for the dev cluster's influxd (read by ``nuro.metrics.sink.sink_from_env``)."""
    return f"influx1://127.0.0.1:{ports.influx}/{METRICS_DB}"


#: How many rendezvous ports a dev cluster reserves (:attr:`PortPlan.rdzv_base`): jobs use base + job id mod this.
RDZV_SPAN = 400


@dataclass(frozen=True)
class PortPlan:
    """Loopback ports, all derived from one base so a clash is fixed with one flag (``--port-base``)."""

    base: int

    @property
    def mariadb(self) -> int:
        return self.base + 6

    @property
    def slurmctld(self) -> int:
        return self.base + 17

    @property
    def slurmdbd(self) -> int:
        return self.base + 19

    def slurmd(self, index: int) -> int:
        return self.base + 1000 + index

    @property
    def s3(self) -> int:
        """The S3 endpoint (SeaweedFS gateway): base+33, an echo of weed's default 8333."""
        return self.base + 33

    def weed(self) -> dict[str, int]:
        """Every TCP port ``weed mini`` opens, by its flag, at base+33..+43.

        weed would otherwise pick defaults (8333, 9333, 8888, 23646, …) or http+10000 for gRPC, so two clusters
        would collide and gRPC ports would land in the ephemeral range. WebDAV is disabled but its port is still
        reserved: weed checks it at start-up and refuses a busy one. Not listed (not opened): metrics (0 = off),
        debug (only with -debug), iceberg/lance (set to 0), https (unset).
        """
        flags = (
            "s3.port", "s3.port.grpc", "master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
            "filer.port", "filer.port.grpc", "webdav.port", "admin.port", "admin.port.grpc",
        )  # fmt: skip
        return {flag: self.s3 + i for i, flag in enumerate(flags)}

    @property
    def heartbeat(self) -> int:
        """The controller's UDP heartbeat port (base+50; UDP, so it is checked apart from the TCP ports)."""
        return self.base + 50

    @property
    def influx(self) -> int:
        """influxd's HTTP API (the metrics store): base+86, an echo of InfluxDB's default 8086."""
        return self.base + 86

    @property
    def influx_rpc(self) -> int:
        """influxd's RPC/backup listener (base+88, echo of 8088): it cannot be disabled, only moved to loopback."""
        return self.base + 88

    @property
    def mlflow(self) -> int:
        """The MLflow tracking server's HTTP port (base+92; ``nuro.devcluster.tracking``)."""
        return self.base + 92

    @property
    def rdzv_base(self) -> int:
        """torchrun rendezvous ports of this cluster's jobs: base+500 .. base+899 (``RDZV_SPAN``), exported as
        ``NURO_RDZV_PORT_BASE``/``SPAN``. Every emulated node is 127.0.0.1, so two dev clusters side by side (the
        test shards) would otherwise give their job 1 the same port and join each other's rendezvous."""
        return self.base + 500

    def all(self, n_nodes: int) -> dict[str, int]:
        ports = {"mariadb": self.mariadb, "slurmctld": self.slurmctld, "slurmdbd": self.slurmdbd}
        ports.update({f"seaweedfs -{flag}": port for flag, port in self.weed().items()})
        ports.update({"influxd http": self.influx, "influxd rpc": self.influx_rpc, "mlflow": self.mlflow})
        ports.update({f"slurmd gpu{i + 1:03d}": self.slurmd(i) for i in range(n_nodes)})
        return ports


@dataclass(frozen=True)
class Layout:
    """Paths inside the state dir, and the sockets in its short runtime dir (``sockets``)."""

    root: Path

    @property
    def sockets(self) -> Path:
        """The short runtime dir (``sockets_dir_for``): munge and MariaDB sockets, weed's local sockets and the
        slurmd spool (step sockets), so no socket path grows with the state dir. Removed by ``down --purge``."""
        return sockets_dir_for(self.root)

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    @property
    def slurmdbd_conf(self) -> Path:
        return self.etc / "slurmdbd.conf"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "log"

    @property
    def munge_dir(self) -> Path:
        return self.sockets / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def munge_key(self) -> Path:
        return self.root / "munge.key"

    @property
    def mysql_data(self) -> Path:
        return self.root / "mysql"

    @property
    def mysql_socket(self) -> Path:
        return self.sockets / "mysqld.sock"

    @property
    def weed_filer_socket(self) -> Path:
        return self.sockets / "weed-filer.sock"

    @property
    def weed_s3_socket(self) -> Path:
        return self.sockets / "weed-s3.sock"

    @property
    def ctld_state(self) -> Path:
        return self.root / "slurmctld"

    @property
    def ctld_state_owner(self) -> Path:
        """Which Slurm version's state ``ctld_state`` and ``slurmd_spool`` hold (``manager.own_slurm_state``)."""
        return self.root / "slurmctld.version"

    def parked_ctld_state(self, slurm_version: str) -> Path:
        """Where ``slurm_version``'s slurmctld state waits while another version runs in this state dir."""
        return self.root / f"slurmctld-{slurm_version}"

    def parked_slurmd_spool(self, slurm_version: str) -> Path:
        return self.sockets / f"slurmd-{slurm_version}"

    @property
    def slurmd_spool(self) -> Path:
        """SlurmdSpoolDir (``%n`` appended per node): slurmstepd puts each step's socket here."""
        return self.sockets / "slurmd"

    @property
    def dev(self) -> Path:
        return self.root / "dev"

    @property
    def s3_data(self) -> Path:
        """SeaweedFS's data dir (volumes, filer metadata, IAM identity): survives down/up, removed by --purge."""
        return self.root / "s3"

    @property
    def controller_waits(self) -> Path:
        """The controller's reasons for pending jobs, rewritten every cycle (``nuro.runs.pending``)."""
        return self.root / "controller-waits.json"

    @property
    def controller_state(self) -> Path:
        """The controller's own state (root only): the preemption ledger and the agents' progress
        (``slurm_plugins/controller/ledger.py``, ``progress.py``); survives down/up like a real host's /var/lib."""
        return self.root / "controller-state"

    @property
    def mlflow_dir(self) -> Path:
        """The MLflow server's SQLite store, artifacts and log (``nuro.devcluster.tracking``): removed by --purge."""
        return self.root / "mlflow"

    @property
    def influx_dir(self) -> Path:
        """influxd's config, meta, data and WAL (``nuro.devcluster.tsdb``): survives down/up, removed by --purge."""
        return self.root / "influxdb"

    @property
    def slurm_bin(self) -> Path:
        """Wrappers that run a root filesystem's Slurm clients from the host (``nuro.devcluster.slurmroot``)."""
        return self.root / "bin"

    @property
    def ports_file(self) -> Path:
        """The port base this state dir was last started with, so ``env`` can name the S3 endpoint while down."""
        return self.etc / "ports.json"

    @property
    def record(self) -> Path:
        """The run record: supervisor and daemon PIDs (JSON), written atomically by the supervisor."""
        return self.run / "cluster.json"

    @property
    def s3_credentials(self) -> Path:
        """One ``<team>.env`` per team (its S3 key), 0640 root:nuro-<team>: ``NURO_S3_CREDENTIALS`` points here."""
        return self.etc / "s3"

    @property
    def nuro_env(self) -> Path:
        """KEY=VALUE settings for the node-side entry points (S3 endpoint and key: mode 600, root only)."""
        return self.etc / "nuro.env"

    @property
    def cache(self) -> Path:
        """The node-local cache (datasets verified on this node); one per dev cluster since nodes share a disk."""
        return self.root / "cache"

    @property
    def heartbeat_key(self) -> Path:
        """The HMAC key agents and the controller share (``nuro.protocol.heartbeat.write_key``, mode 600)."""
        return self.etc / "heartbeat.key"

    @property
    def agent_sockets(self) -> Path:
        """The node agents' in-band report sockets (``NURO_AGENT_SOCKET_DIR``), in the short runtime dir."""
        return self.sockets / "agents"

    @property
    def agents_dir(self) -> Path:
        """Where node agents write their status files (``--status-dir``)."""
        return self.run / "agents"

    @property
    def staging(self) -> Path:
        """Where the emulated nodes' NVMe staging roots live: ``staging/<node>``, one per node as real nodes have
        (``NURO_STAGING_ROOT`` is ``staging/{node}``; shared, they hid that a multi-node restore or a hand-off must
        work with each node seeing only its own files)."""
        return self.root / "staging"

    @property
    def snapshots(self) -> Path:
        """The emulated nodes' in-memory snapshot roots, ``snapshots/<node>``. Real nodes use tmpfs
        (``/dev/shm/nuro-snapshots``); here they sit beside the staging roots, so ``down --purge`` removes them and
        two dev clusters on one machine never share one."""
        return self.root / "snapshots"

    def node_staging(self, node: str) -> Path:
        """One emulated node's staging root (its agent's ``--staging-root``)."""
        return self.staging / node

    @property
    def datacache(self) -> Path:
        """The node-local dataset shard cache stand-in (``NURO_DATA_CACHE_DIR``): one dir per team below it."""
        return self.root / "datacache"

    @property
    def events_log(self) -> Path:
        """nuro's event log (``nuro.lifecycle.platform_events``): node_lost, node_down, jobs_requeued, …"""
        return self.log / "events.jsonl"

    @property
    def control_dir(self) -> Path:
        """Requests to the running supervisor (kill-node, revive-node) and its answers, one JSON file each."""
        return self.run / "control"

    @property
    def teams_yaml(self) -> Path:
        """When this file exists the dev cluster's controller also runs the policy; else detector only."""
        return self.etc / "teams.yaml"

    @property
    def env_sh(self) -> Path:
        return self.root / "env.sh"

    @property
    def supervisor_log(self) -> Path:
        return self.log / "supervisor.log"


def node_names(n_nodes: int) -> list[str]:
    return [f"gpu{i + 1:03d}" for i in range(n_nodes)]


def emulated_nodes(names: list[str], slurmd_port: Callable[[int], int], dev_dir: Path) -> tuple[NodeSpec, ...]:
    """``slurmd -N`` nodes on this host (127.0.0.1, the i-th on ``slurmd_port(i)``), each with ``GPUS_PER_NODE``
    fake GPUs (character devices under ``dev_dir``)."""
    host = socket.gethostname()
    return tuple(
        NodeSpec(
            name=name,
            addr="127.0.0.1",
            hostname=host,
            port=slurmd_port(i),
            gpus=GPUS_PER_NODE,
            gpu_files=f"{dev_dir}/nvidia[0-{GPUS_PER_NODE - 1}]",
        )
        for i, name in enumerate(names)
    )


def describe(
    layout: Layout,
    n_nodes: int,
    port_base: int,
    plugin_dir: str | None = None,
    slurm_version: str = "22.05",
    topology: str = "tree",
) -> ClusterDescription:
    """The dev cluster: N emulated nodes on 127.0.0.1, 8 fake GPUs each, leaves of 4 under a spine.
    ``plugin_dir``: a root filesystem's Slurm plugins (``SlurmInstall.plugin_dir``), None for the host's.
    ``topology``: ``tree`` (topology/tree) or ``block`` (topology/block, 24.11+: the leaves are the blocks)."""
    if n_nodes < 1:
        raise ValueError(f"--nodes must be at least 1, got {n_nodes}")
    ports = PortPlan(port_base)
    host = socket.gethostname()
    names = node_names(n_nodes)
    nodes = emulated_nodes(names, ports.slurmd, layout.dev)
    return ClusterDescription(
        cluster_name=CLUSTER_NAME,
        controller_host=host,
        controller_addr="127.0.0.1",
        nodes=nodes,
        switches=leaf_spine(names, LEAF_SIZE),
        timers=Timers.for_node_count(n_nodes),
        paths=Paths(
            etc_dir=str(layout.etc),
            state_save=str(layout.ctld_state),
            slurmd_spool=str(layout.slurmd_spool),
            run_dir=str(layout.run),
            log_dir=str(layout.log),
            munge_socket=str(layout.munge_socket),
            # Wrappers in etc/ that point the entry points at this cluster's nuro.env (see manager._prepare):
            # slurmd runs them with a job-only environment (no SLURM_CONF, no S3 settings).
            prolog=str(layout.etc / "nuro-prolog"),
            epilog=str(layout.etc / "nuro-epilog"),
            healthcheck=str(layout.etc / "nuro-healthcheck"),
            plugin_dir=plugin_dir,
        ),
        ports=Ports(slurmctld=ports.slurmctld, slurmdbd=ports.slurmdbd, mariadb=ports.mariadb),
        confinement=cgroups.confinement(layout.root),  # its own cgroups (nuro.devcluster.cgroups)
        slurm_user="root",
        db_user=DB_USER,
        db_password=DB_PASSWORD,
        db_name=db_name(slurm_version),
        slurm_version=slurm_version,
        topology=topology,
    )

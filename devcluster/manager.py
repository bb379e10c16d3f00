"""``devcluster up | down | status | env | kill-node | revive-node``: preflight, render, hand over to the
supervisor, wait, report.

Every refusal says what is wrong and what to do. Nothing here ever signals a process it did not start: stopping
goes through the run record (PID + start time) and the supervisor.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psutil

from nuro.cluster.slurmconf import (
    render_cgroup_conf,
    render_gres_conf,
    render_hook_wrapper,
    render_slurm_conf,
    render_slurmdbd_conf,
    render_topology,
    topology_file,
)
from nuro.devcluster import cgroups, rootfs, s3, slurmroot, tracking
from nuro.devcluster.install import ensure_packages
from nuro.devcluster.layout import (
    DEFAULT_PORT_BASE,
    GPUS_PER_NODE,
    RDZV_SPAN,
    SUN_PATH_MAX,
    Layout,
    PortPlan,
    SocketsDirError,
    bin_dir,
    describe,
    ensure_sockets_dir,
    longest_socket_path,
    metrics_url,
    node_names,
)
from nuro.devcluster.procs import stop_child, stop_processes, wait_for
from nuro.devcluster.record import Phase, RunRecord, read_record
from nuro.healthcheck.statusfile import read_status
from nuro.metrics import identities as metrics_identities
from nuro.metrics.base import ENV_URL as ENV_METRICS_URL
from nuro.objectstore import ENV_CREDENTIALS as ENV_S3_CREDENTIALS
from nuro.protocol.contract import ENV_RDZV_PORT_BASE, ENV_RDZV_PORT_SPAN
from nuro.protocol.heartbeat import write_key
from nuro.runs.pending import ENV_WAITS
from nuro.slurm import CliBackend

log = logging.getLogger(__name__)


class DevClusterError(RuntimeError):
    """A refusal or failure with a message that says what to do."""


@dataclass(frozen=True)
class UpResult:
    state_dir: Path
    nodes: int
    already_running: bool
    installed: list[str]
    seconds_to_daemons: float
    seconds_to_idle: float


def _ports_record(layout: Layout) -> dict | None:
    try:
        record = json.loads(layout.ports_file.read_text())
        int(record["port_base"])
        return record
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(
            f"{layout.ports_file} is unreadable ({exc}); run 'devcluster up' again to rewrite it"
        ) from exc


def recorded_port_base(layout: Layout) -> int | None:
    """The port base ``up`` last used for this state dir (``etc/ports.json``), None if it never ran."""
    record = _ports_record(layout)
    return None if record is None else int(record["port_base"])


def recorded_topology(layout: Layout) -> str:
    """The topology plugin kind the cluster in ``layout`` was brought up with (``tree`` when none was recorded)."""
    return str((_ports_record(layout) or {}).get("topology", "tree"))


def recorded_slurm(layout: Layout) -> str:
    """The Slurm version ``up`` last started in this state dir (``etc/ports.json``; the host's if never)."""
    record = _ports_record(layout)
    return str((record or {}).get("slurm", slurmroot.HOST_VERSION))


def env_exports(layout: Layout) -> dict[str, str]:
    """What a shell needs so plain sbatch/squeue/sinfo/sacctmgr and nuro's S3 clients talk to this cluster.

    The S3 variables (``NURO_S3_ENDPOINT``, ``NURO_S3_BUCKET``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``)
    and ``NURO_METRICS_URL`` (the cluster's influxd) need the port base, recorded by ``up``: a state dir that
    never ran exports only the Slurm ones rather than
    guess an endpoint.
    """
    env = {
        "SLURM_CONF": str(layout.slurm_conf),
        "NURO_DEVCLUSTER_DIR": str(layout.root),
        "NURO_AGENT_STATUS_DIR": str(layout.agents_dir),
        # the agents' in-band report sockets (nuro.protocol.peerloss) in the short runtime dir: sun_path is 108 bytes
        "NURO_AGENT_SOCKET_DIR": str(layout.agent_sockets),
        "NURO_STAGING_ROOT": str(layout.staging / "{node}"),  # one root per emulated node (Layout.node_staging)
        "NURO_SNAPSHOT_ROOT": str(layout.snapshots / "{node}"),  # in-memory snapshots (nuro.checkpoint.promote)
        "NURO_DATA_CACHE_DIR": str(layout.datacache),
        "NURO_EVENT_LOG": str(layout.events_log),
        ENV_WAITS: str(layout.controller_waits),  # why pending jobs wait, as the controller saw it last cycle
    }
    if recorded_slurm(layout) != slurmroot.HOST_VERSION:
        # the root filesystem's clients first (slurmroot.write_wrappers)
        env["PATH"] = slurmroot.path_with(layout.slurm_bin, os.environ.get("PATH", slurmroot.SYSTEM_PATH))
    base = recorded_port_base(layout)
    if base is not None:
        env.update(s3.s3_env(PortPlan(base), layout.s3_data))  # admin key: root's flows (members drop AWS_*)
        env[ENV_S3_CREDENTIALS] = str(layout.s3_credentials)  # without AWS_*: the user's team key (docs/security.md)
        env[ENV_METRICS_URL] = metrics_url(PortPlan(base))
        # the cluster's own torchrun rendezvous ports (PortPlan.rdzv_base): its nodes all share 127.0.0.1
        env[ENV_RDZV_PORT_BASE] = str(PortPlan(base).rdzv_base)
        env[ENV_RDZV_PORT_SPAN] = str(RDZV_SPAN)
        env.update(metrics_identities.admin_env(layout.influx_dir))  # admin: root only (members use their team's)
        env[metrics_identities.ENV_CREDENTIALS] = str(layout.etc / "metrics")  # <team>.env, as etc/s3
        if (_ports_record(layout) or {}).get("mlflow"):
            env["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{PortPlan(base).mlflow}"  # MLflow's own variable
    return env


def render_env_sh(layout: Layout) -> str:
    """``export`` lines; ``PATH`` is prepended to the shell's own, not replaced by this process's."""
    lines = []
    for key, value in env_exports(layout).items():
        if key == "PATH":
            lines.append(f'export PATH={shlex.quote(str(layout.slurm_bin))}:"$PATH"\n')
        else:
            lines.append(f"export {key}={shlex.quote(value)}\n")
    return "".join(lines)


def slurm_env(layout: Layout) -> dict[str, str]:
    return {**os.environ, **env_exports(layout)}


def _port_owner(port: int) -> str:
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.NoSuchProcess:
                    return f"pid {conn.pid}"
    except psutil.AccessDenied:
        pass
    return "another process"


def busy_ports(plan: PortPlan, n_nodes: int) -> list[tuple[str, int]]:
    """Ports of the plan that cannot be bound on 127.0.0.1 right now."""
    busy = []
    for what, port in plan.all(n_nodes).items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    busy.append((what, port))
                else:
                    raise
    return busy


def udp_port_busy(port: int) -> bool:
    """The controller's heartbeat port is UDP: a TCP bind test says nothing about it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (``net.ipv4.ip_local_port_range``)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux default


def check_port_plan(plan: PortPlan, n_nodes: int) -> None:
    """Refuse a plan that overlaps the ephemeral range: any outgoing connection could take one of its ports at
    any moment, so ``up`` would fail at random (seen with 500 slurmd ports at base 46800)."""
    low, high = ephemeral_range()
    ports = [*plan.all(n_nodes).values(), plan.heartbeat]
    if min(ports) <= high and max(ports) >= low:
        top = low - 1 - 1000 - n_nodes
        raise DevClusterError(
            f"--port-base {plan.base} puts ports {min(ports)}..{max(ports)} inside the kernel's ephemeral range "
            f"{low}-{high}, where outgoing connections take ports at random. Choose --port-base between 1024 and "
            f"{top} (default {DEFAULT_PORT_BASE})."
        )


def own_slurm_state(layout: Layout, slurm: str) -> str | None:
    """Give ``slurm`` its own Slurm state in this state dir before it starts; returns the version whose state was
    put aside, or None.

    Why: slurmctld's StateSaveLocation and slurmd's spool are one version's (22.05 reading 26.05's stops on
    "CLUSTER NAME MISMATCH"; 26.05 will not upgrade 22.05's accounting), so ``up --slurm 26.05`` followed by
    ``make demo`` (22.05) used to fail until ``down --purge``. Each version keeps its own: the other's state is
    parked beside (``slurmctld-<version>``), a parked one of ``slurm`` comes back, and each has its own accounting
    database (``layout.db_name``); S3, metrics, MLflow and the munge key are shared. Only a stopped cluster gets
    here (``up`` refuses to switch a running one)."""
    owner_file = layout.ctld_state_owner
    if owner_file.exists():
        owner: str | None = owner_file.read_text().strip() or None
    else:  # a state dir from before the marker: its state is the version ``up`` last recorded
        owner = recorded_slurm(layout) if layout.ctld_state.exists() else None
    if owner == slurm:
        owner_file.write_text(slurm + "\n")  # a state dir from before the marker gets one
        return None
    pairs = ((layout.ctld_state, layout.parked_ctld_state), (layout.slurmd_spool, layout.parked_slurmd_spool))
    if owner is not None:
        for live, parked in pairs:
            if live.exists():
                if parked(owner).exists():
                    raise DevClusterError(
                        f"cannot put Slurm {owner}'s state aside: {parked(owner)} exists already. Remove one of "
                        f"{live} and {parked(owner)} (or run 'nuro-admin devcluster down --purge --state-dir "
                        f"{layout.root}', which deletes every version's jobs and accounting)."
                    )
                live.rename(parked(owner))
    for live, parked in pairs:
        if parked(slurm).exists() and not live.exists():
            parked(slurm).rename(live)
    layout.root.mkdir(parents=True, exist_ok=True)
    owner_file.write_text(slurm + "\n")
    return owner


def _check_previous(layout: Layout, n_nodes: int) -> RunRecord | None:
    """Returns the record of a healthy running cluster of the same size, None if the dir is free; else refuses."""
    record = read_record(layout.record)
    if record is None:
        return None
    live = record.live_processes()
    sup_alive = record.supervisor is not None and record.supervisor.is_alive()
    if sup_alive and record.phase == Phase.RUNNING:
        if record.nodes != n_nodes:
            raise DevClusterError(
                f"a dev cluster with {record.nodes} nodes already runs from {layout.root}. "
                f"Run 'nuro-admin devcluster down --state-dir {layout.root}' first to start one with {n_nodes}."
            )
        return record
    if live:
        pids = ", ".join(f"{r.name}={r.pid}" for r in live)
        raise DevClusterError(
            f"an earlier dev cluster in {layout.root} is half-started or was left behind "
            f"(phase {record.phase}, still running: {pids}). Run "
            f"'nuro-admin devcluster down --state-dir {layout.root}' to stop exactly those processes, then 'up'."
        )
    return None  # stale record: nothing of it runs any more


def _write_hooks(layout: Layout) -> None:
    """nuro.env (the settings node-side hooks need) and the Prolog/Epilog/HealthCheckProgram wrappers."""
    # Per-team S3 keys (etc/s3/<team>.env, group-readable by the team) and the nodes' own key, which replaces
    # the admin key in nuro.env: root daemons act with the node identity only. First: env_exports reads the admin key.
    node_key = s3.provision(layout.s3_data, layout.s3_credentials, s3.dev_teams(layout.teams_yaml))
    # Per-team metrics users and databases (etc/metrics/<team>.env, same groups); the nodes write as nuro_node.
    influx_ids = metrics_identities.ensure_identities(layout.influx_dir, s3.dev_teams(layout.teams_yaml))
    base = recorded_port_base(layout)
    if base is not None:
        ports = PortPlan(base)
        metrics_identities.write_team_files(
            influx_ids, layout.etc / "metrics", lambda db: f"influx1://127.0.0.1:{ports.influx}/{db}"
        )
    exports = {k: v for k, v in env_exports(layout).items() if k != "PATH"}  # hooks keep slurmd's own PATH
    env = {
        **exports,
        **node_key,
        **metrics_identities.node_env(influx_ids),
        "NURO_CACHE_DIR": str(layout.cache),
        # The emulated nodes share one disk: production's 20 GiB staging floor would drain them all on a small box.
        "NURO_STAGING_MIN_FREE_GB": "1",
        # Bounded prolog staging and epilog upload flush, well inside one resume budget (production defaults: 120 s).
        "NURO_PROLOG_STAGE_TIMEOUT_S": "60",
        "NURO_EPILOG_FLUSH_TIMEOUT_S": "60",
        # every emulated node runs an agent with an upload worker: a finished job's epilog hands its uploads over
        "NURO_EPILOG_HANDOFF": "1",
        # the hooks' own log, one per emulated node (slurmd discards their stderr); collect-logs fetches it
        "NURO_HOOK_LOG": str(layout.log / "hooks-%n.log"),
        # cgroup.conf's CgroupMountpoint (the cluster's own binds): the prolog's prefetch joins the job's cgroups there
        "NURO_CGROUP_MOUNTPOINT": str(cgroups.mountpoint(layout.root)),
    }
    layout.cache.mkdir(exist_ok=True)
    layout.staging.mkdir(exist_ok=True)
    layout.datacache.mkdir(mode=0o755, exist_ok=True)
    layout.agents_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(layout.nuro_env, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(f"{k}={v}\n" for k, v in env.items()))
    for name in ("nuro-prolog", "nuro-epilog", "nuro-healthcheck"):
        wrapper = layout.etc / name
        wrapper.write_text(render_hook_wrapper(str(bin_dir() / name), str(layout.nuro_env)))
        wrapper.chmod(0o755)


def check_socket_paths(layout: Layout) -> None:
    """Refuse a layout whose longest Unix socket path would not fit ``sun_path`` (the daemons would fail later with
    "too long" deep in a log). With the hashed runtime dir this holds for any state dir; the check guards it."""
    longest = longest_socket_path(layout)
    if len(os.fsencode(longest)) > SUN_PATH_MAX:
        raise DevClusterError(
            f"socket path {longest} is {len(os.fsencode(longest))} bytes; Unix sockets allow {SUN_PATH_MAX}"
        )


def _prepare(
    layout: Layout, n_nodes: int, port_base: int, slurm: slurmroot.SlurmInstall, topology: str = "tree"
) -> None:
    """Directories, fake GPU device files, munge key, the rendered config files and the client wrappers."""
    try:
        desc = describe(
            layout, n_nodes, port_base, plugin_dir=slurm.plugin_dir(), slurm_version=slurm.version, topology=topology
        )
    except ValueError as exc:  # e.g. topology=block on 22.05
        raise DevClusterError(str(exc)) from exc
    check_socket_paths(layout)
    layout.root.mkdir(parents=True, exist_ok=True)
    try:
        ensure_sockets_dir(layout.sockets, layout.root)
    except SocketsDirError as exc:
        raise DevClusterError(str(exc)) from exc
    for d in (layout.root, layout.etc, layout.run, layout.log, layout.dev, layout.ctld_state, layout.slurmd_spool):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o755)  # jobs run as team users: they read slurm.conf and reach the munge socket
    layout.s3_data.mkdir(exist_ok=True)
    for name in node_names(n_nodes):  # root's, 0755 (as open_root makes it): the health check measures its disk
        layout.node_staging(name).mkdir(parents=True, exist_ok=True)
    layout.ports_file.write_text(
        json.dumps({"port_base": port_base, "slurm": slurm.version, "topology": topology, "mlflow": tracking.enabled()})
        + "\n"
    )
    slurmroot.write_wrappers(slurm, layout.slurm_bin, layout.slurm_conf)
    layout.munge_dir.mkdir(exist_ok=True)
    layout.munge_dir.chmod(0o711)
    write_key(layout.heartbeat_key)  # agents ↔ controller HMAC key, mode 600, kept across down/up
    layout.mysql_data.mkdir(exist_ok=True)
    for i in range(GPUS_PER_NODE):
        dev = layout.dev / f"nvidia{i}"
        # Slurm drops file-less GPUs ("Removing file-less GPU"): a char device stands in for /dev/nvidiaN, with
        # its own device number (cgroups.fake_gpu_rdev): ConstrainDevices denies a job the numbers of GPUs it
        # was not given, so a stand-in that reused /dev/null's 1:3 would deny /dev/null too.
        if dev.is_symlink() or (dev.exists() and dev.stat().st_rdev != cgroups.fake_gpu_rdev(i)):
            dev.unlink()
        if not dev.exists():
            os.mknod(dev, 0o666 | stat.S_IFCHR, cgroups.fake_gpu_rdev(i))
            dev.chmod(0o666)  # as /dev/nvidiaN: any job user may open it, the devices cgroup decides
    if not layout.munge_key.exists():
        fd = os.open(layout.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(1024))
    try:  # the cluster's own cgroups, bound where its cgroup.conf says (nuro.devcluster.cgroups)
        cgroups.prepare(layout.root)
    except cgroups.CgroupError as exc:
        raise DevClusterError(str(exc)) from exc
    files = {
        layout.slurm_conf: render_slurm_conf(desc),
        layout.etc / "cgroup.conf": render_cgroup_conf(desc),
        layout.etc / topology_file(desc): render_topology(desc),
        layout.etc / "gres.conf": render_gres_conf(desc),
    }
    for path, text in files.items():
        path.write_text(text)
        path.chmod(0o644)
    for stale in {"topology.conf", "topology.yaml"} - {topology_file(desc)}:  # another version's (yaml wins if left)
        (layout.etc / stale).unlink(missing_ok=True)
    layout.slurmdbd_conf.write_text(
        render_slurmdbd_conf(desc, str(layout.run / "slurmdbd.pid"), str(layout.log / "slurmdbd.log"))
    )
    layout.slurmdbd_conf.chmod(0o600)
    lua = resources.files("nuro.slurm_plugins").joinpath("job_submit.lua").read_text()
    (layout.etc / "job_submit.lua").write_text(lua)
    _write_hooks(layout)  # first: it makes the S3 identities env.sh exports the admin key of
    fd = os.open(layout.env_sh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the admin S3 key
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(render_env_sh(layout))


def node_states(layout: Layout, timeout_s: float = 10.0) -> dict[str, str]:
    """Node → state from sinfo, via the Slurm adapter (the one place Slurm output is parsed)."""
    backend = CliBackend(env=env_exports(layout), timeout_s=timeout_s)
    return {n.name: n.state for n in backend.nodes()}


def _all_idle(layout: Layout, n_nodes: int) -> bool:
    try:
        states = node_states(layout, timeout_s=5)
    except Exception:  # controller still starting: keep waiting
        return False
    return len(states) == n_nodes and all(s.upper() == "IDLE" for s in states.values())


def _agents_not_reported(layout: Layout, n_nodes: int, since: float) -> list[str]:
    """Nodes whose agent has not beaten since ``since`` (Unix s; a status file left by an earlier run does not
    count)."""

    def fresh(node: str) -> bool:
        status = read_status(layout.agents_dir, node)
        try:
            return status is not None and float(status.get("last_beat", 0.0)) >= since
        except (TypeError, ValueError):
            return False

    return [n for n in node_names(n_nodes) if not fresh(n)]


def up(
    layout: Layout,
    n_nodes: int,
    port_base: int,
    timeout_s: float = 120.0,
    slurm: str = slurmroot.HOST_VERSION,
    topology: str = "tree",
) -> UpResult:
    if os.geteuid() != 0:
        raise DevClusterError(
            "devcluster up needs root: it installs Debian packages and starts slurmd, which runs jobs as other "
            "users. Run it as root (e.g. sudo .venv/bin/nuro-admin devcluster up)."
        )
    t0 = time.monotonic()
    try:
        slurmroot.check_version(slurm)
    except slurmroot.SlurmRootError as exc:
        raise DevClusterError(str(exc)) from exc
    running = _check_previous(layout, n_nodes)
    if running is not None:
        if (recorded_slurm(layout), recorded_topology(layout)) != (slurm, topology):
            raise DevClusterError(
                f"a dev cluster of Slurm {recorded_slurm(layout)} (topology/{recorded_topology(layout)}) already "
                f"runs from {layout.root}. Run 'nuro-admin devcluster down --state-dir {layout.root}' first to "
                f"start Slurm {slurm} (topology/{topology}) there."
            )
        return UpResult(layout.root, n_nodes, True, [], 0.0, 0.0)
    check_port_plan(PortPlan(port_base), n_nodes)
    if s3.find_weed() is None:
        raise DevClusterError(s3.WEED_MISSING)
    installed = ensure_packages()
    if tracking.enabled():  # MLflow's own venv (~30 s once per machine), before the supervisor's start-up clock
        try:
            tracking.ensure_mlflow()
        except tracking.TrackingError as exc:
            raise DevClusterError(f"{exc}; or start without it: {tracking.ENV_ENABLED}=0") from exc
    busy = busy_ports(PortPlan(port_base), n_nodes)
    if udp_port_busy(PortPlan(port_base).heartbeat):
        busy.append(("nuro-controller heartbeats (udp)", PortPlan(port_base).heartbeat))
    if busy:
        what = ", ".join(f"{port} ({name}, held by {_port_owner(port)})" for name, port in busy[:5])
        raise DevClusterError(
            f"ports in use: {what}{' …' if len(busy) > 5 else ''}. The dev cluster uses {port_base}+6, +17, +19, "
            f"+33..+43 (SeaweedFS), +86/+88 (InfluxDB), +92 (MLflow), udp +50 (heartbeats) and "
            f"{port_base + 1000}..{port_base + 999 + n_nodes}: "
            "choose free ones with --port-base (e.g. --port-base 20800) or stop the process holding them."
        )
    try:  # the root filesystem of a newer Slurm: built once (~1 min), then cached
        install = slurmroot.resolve(slurm)
    except (slurmroot.SlurmRootError, rootfs.RootfsError) as exc:
        raise DevClusterError(f"cannot provide Slurm {slurm}: {exc}") from exc
    parked = own_slurm_state(layout, slurm)
    if parked is not None:
        log.warning("Slurm %s's state in %s is kept aside for its next up; Slurm %s starts on its own", parked,
                    layout.root, slurm)  # fmt: skip
    _prepare(layout, n_nodes, port_base, install, topology)
    layout.record.unlink(missing_ok=True)
    t_daemons = time.monotonic()
    argv = [
        sys.executable, "-m", "nuro.devcluster.supervisor",
        "--state-dir", str(layout.root), "--nodes", str(n_nodes), "--port-base", str(port_base), "--slurm", slurm,
    ]  # fmt: skip
    with open(layout.supervisor_log, "ab") as out:
        sup = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    try:
        return _wait_up(layout, n_nodes, timeout_s, t0, t_daemons, installed)
    except BaseException:
        # Whatever went wrong (a daemon that did not start, nodes that never became idle, Ctrl-C): stop what this
        # call started, so a failed up never leaves a cluster holding the ports for the next try.
        _abort_up(layout, sup)
        raise


def _abort_up(layout: Layout, sup: subprocess.Popen) -> None:
    """Stop the supervisor this ``up`` started (via the run record, as ``down`` does) and every daemon it
    recorded; if it never wrote its record, stop it by the handle we hold. Errors here are logged, not raised:
    the caller re-raises the reason up failed.

    ``down`` runs again once the supervisor is gone: a supervisor slow to start (a loaded machine) can write its
    record after the first ``down`` looked, and then stops on our signal with a ``stopped`` record left behind."""
    try:
        down(layout)
    except Exception as exc:  # keep the original error; say what may be left
        log.error("stopping the half-started dev cluster in %s failed: %s", layout.root, exc)
    stop_child(sup, 90)
    try:
        down(layout)
    except Exception as exc:
        log.error("removing the record of the half-started dev cluster in %s failed: %s", layout.root, exc)


def _wait_up(
    layout: Layout, n_nodes: int, timeout_s: float, t0: float, t_daemons: float, installed: list[str]
) -> UpResult:
    """Wait for the supervisor to report RUNNING and for every node to be idle; raise with the reason if not."""

    def settled() -> bool:
        rec = read_record(layout.record)
        return rec is not None and rec.phase in (Phase.RUNNING, Phase.FAILED, Phase.STOPPED)

    if not wait_for(settled, timeout_s, 0.1):
        raise DevClusterError(
            f"the supervisor did not finish starting within {timeout_s:.0f} s; see {layout.supervisor_log}. "
            "What it started has been stopped."
        )
    rec = read_record(layout.record)
    if rec is None or rec.phase != Phase.RUNNING:
        why = (rec.error or rec.phase) if rec else "the run record vanished"
        raise DevClusterError(f"dev cluster failed to start: {why}; see {layout.log}/")
    seconds_to_daemons = time.monotonic() - t_daemons
    if not wait_for(lambda: _all_idle(layout, n_nodes), timeout_s, 0.25):
        raise DevClusterError(
            f"not all {n_nodes} nodes became idle within {timeout_s:.0f} s "
            f"(states: {node_states(layout)}); see {layout.log}/slurmctld.log and slurmd-*.log"
        )
    # Ready means every node agent has reported too: on a loaded machine an agent can take longer to start than
    # the health check's start grace, and a job's prolog would then drain its node ("node agent never reported").
    since = rec.started_at or 0.0
    if not wait_for(lambda: not _agents_not_reported(layout, n_nodes, since), timeout_s, 0.25):
        raise DevClusterError(
            f"node agents of {', '.join(_agents_not_reported(layout, n_nodes, since)[:5])} did not report within "
            f"{timeout_s:.0f} s; see {layout.log}/agent-*.log and agents.out"
        )
    return UpResult(layout.root, n_nodes, False, installed, seconds_to_daemons, time.monotonic() - t0)


def down(layout: Layout, purge: bool = False, timeout_s: float = 90.0) -> list[str]:
    """Stop what ``up`` started, by recorded PID (+ start time). Returns the names of what was stopped."""
    record = read_record(layout.record)
    stopped: list[str] = []
    if record is not None:
        live = record.live_processes()
        stopped = [r.name for r in live]
        sup = record.supervisor.process() if record.supervisor else None
        if sup is not None:
            sup.terminate()
            try:
                sup.wait(timeout=timeout_s)
            except psutil.TimeoutExpired as exc:
                raise DevClusterError(
                    f"the supervisor (pid {sup.pid}) did not stop within {timeout_s:.0f} s; see {layout.supervisor_log}"
                ) from exc
        # Supervisor gone (crashed, killed, or just stopped): stop any recorded daemon still alive.
        record = read_record(layout.record) or record
        leftovers = [p for p in (r.process() for r in record.daemons) if p is not None]
        if leftovers:
            stop_processes(leftovers, 10, "daemon")
        layout.record.unlink(missing_ok=True)
    cgroups.release(layout.root)  # after every daemon: kills job processes left in its cgroups, unmounts
    if purge:
        if layout.root.exists():
            shutil.rmtree(layout.root)
        if layout.sockets.is_dir() and not layout.sockets.is_symlink():
            shutil.rmtree(layout.sockets)
    return stopped


def status(layout: Layout) -> dict:
    """What runs (PIDs) and node states, as a JSON-able dict."""
    record = read_record(layout.record)
    if record is None:
        return {"state_dir": str(layout.root), "phase": "down", "processes": [], "nodes": {}}
    procs = [
        {"name": r.name, "pid": r.pid, "alive": r.is_alive()}
        for r in ([record.supervisor] if record.supervisor else []) + record.daemons
    ]
    nodes: dict[str, str] = {}
    error = record.error
    if record.phase == Phase.RUNNING:
        try:
            nodes = node_states(layout)
        except Exception as exc:  # report, do not crash: status is what you run when things are broken
            error = f"could not read node states: {exc}"
    return {
        "state_dir": str(layout.root),
        "slurm": recorded_slurm(layout),
        "topology": recorded_topology(layout),
        "phase": str(record.phase),
        "nodes_configured": record.nodes,
        "port_base": record.port_base,
        "s3_endpoint": s3.endpoint(PortPlan(record.port_base)),
        "metrics_url": metrics_url(PortPlan(record.port_base)),
        "error": error,
        "processes": procs,
        "nodes": nodes,
        "killed_nodes": record.killed_nodes,
        "heartbeat_port": PortPlan(record.port_base).heartbeat,
        "event_log": str(layout.events_log),
    }


def _request(layout: Layout, op: str, node: str, timeout_s: float = 30.0) -> dict:
    """Ask the running supervisor to do ``op`` on ``node`` (see supervisor.serve_requests); return its answer."""
    record = read_record(layout.record)
    if record is None or record.phase != Phase.RUNNING or not (record.supervisor and record.supervisor.is_alive()):
        raise DevClusterError(
            f"no running dev cluster in {layout.root}: start one with 'nuro-admin devcluster up --state-dir "
            f"{layout.root}'"
        )
    layout.control_dir.mkdir(parents=True, exist_ok=True)
    rid = uuid.uuid4().hex
    tmp = layout.control_dir / f".{rid}.tmp"
    tmp.write_text(json.dumps({"op": op, "node": node}))
    os.replace(tmp, layout.control_dir / f"{rid}.req.json")  # the supervisor never sees half a request
    resp = layout.control_dir / f"{rid}.resp.json"
    if not wait_for(resp.exists, timeout_s, 0.02):
        (layout.control_dir / f"{rid}.req.json").unlink(missing_ok=True)
        raise DevClusterError(
            f"the supervisor did not answer {op} {node} within {timeout_s:.0f} s; see {layout.supervisor_log}"
        )
    answer = json.loads(resp.read_text())
    resp.unlink(missing_ok=True)
    if not answer.get("ok"):
        raise DevClusterError(f"{op} {node} refused: {answer.get('error')}")
    return answer


def kill_node(layout: Layout, node: str) -> dict:
    """Crash ``node`` like a host: SIGKILL its slurmd, slurmstepds, job processes and agent (by the supervisor).

    Returns ``{"node", "at" (Unix s), "killed": [{"name", "pid"}]}``.
    """
    return _request(layout, "kill-node", node)


def revive_node(layout: Layout, node: str) -> dict:
    """Restart a killed node's slurmd and agent under the supervisor. Returns ``{"node", "at", "started"}``."""
    return _request(layout, "revive-node", node)

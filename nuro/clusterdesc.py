"""A cluster description: the one input from which slurm.conf, topology.conf and gres.conf are rendered.

The same description serves the local dev cluster (many ``slurmd -N`` on 127.0.0.1, fake GPU device files) and,
later, the Ansible roles (one slurmd per real host, ``/dev/nvidia*``). Keeping it a plain frozen value means the
renderer in :mod:`nuro.slurmconf` stays a pure function that golden tests can pin.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeSpec:
    """One Slurm node. ``port`` is set only when several slurmd share a host (dev cluster)."""

    name: str
    addr: str
    hostname: str | None = None
    port: int | None = None
    cpus: int = 16
    memory_mb: int = 64000
    gpus: int = 8
    #: Device-file pattern for gres.conf, e.g. ``/dev/nvidia[0-7]``. Slurm drops file-less GPUs.
    gpu_files: str = "/dev/nvidia[0-7]"
    #: GPU model as a gres Type (``a100``, ``h100``): ``Gres=gpu:<type>:<n>`` and ``Type=`` in gres.conf, so jobs
    #: may ask for ``--gpus=h100:8``. None (the dev cluster) renders untyped GPUs, as before this field existed.
    gpu_type: str | None = None


@dataclass(frozen=True)
class Switch:
    """A switch of topology/tree: a leaf lists nodes, a spine lists switches."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


@dataclass(frozen=True)
class Timers:
    """Slurm timers, in seconds. Defaults are tuned for fast tests; see docs/devcluster.md for why each value.

    Attributes:
        slurmd_timeout_s: SlurmdTimeout: a silent slurmd is set DOWN after this (backstop to nuro's agent).
        message_timeout_s: MessageTimeout: RPC round trip limit.
        cred_expire_s: AuthInfo cred_expire: a requeued job is eligible after this + 1 s (22.05's floor is 5).
        sched_interval_s: SchedulerParameters sched_interval: full scheduling pass (preemption waits for it).
        bf_interval_s: SchedulerParameters bf_interval: backfill pass.
        kill_wait_s: KillWait: SIGTERM → SIGKILL at job end.
        health_check_interval_s: HealthCheckInterval (0 disables the program).
        min_job_age_s: MinJobAge: finished jobs stay visible to squeue this long.
    """

    slurmd_timeout_s: int = 6
    message_timeout_s: int = 5
    cred_expire_s: int = 10
    sched_interval_s: int = 5
    bf_interval_s: int = 5
    kill_wait_s: int = 5
    health_check_interval_s: int = 30
    min_job_age_s: int = 300

    def __post_init__(self) -> None:
        if self.cred_expire_s < 5:
            raise ValueError(
                f"cred_expire_s={self.cred_expire_s}: Slurm 22.05 refuses values below 5 and silently falls back "
                "to 120 s; use 5 or more"
            )
        if self.message_timeout_s >= self.slurmd_timeout_s * 2:
            raise ValueError(
                f"message_timeout_s={self.message_timeout_s} must be well below slurmd_timeout_s="
                f"{self.slurmd_timeout_s}, or one slow RPC marks nodes NOT_RESPONDING"
            )

    @classmethod
    def for_node_count(cls, n_nodes: int) -> Timers:
        """Fast timers for small test clusters; relaxed ones when hundreds of slurmd share two cores.

        cred_expire=5 (22.05's floor; requeued jobs eligible 6 s after the requeue instead of 11) for up to 64 nodes:
        measured safe on the 8-node dev cluster (12 requeues of a 2-node srun job back onto the same nodes, and
        node-kill requeues: every step launched, slurmd only logged "reissued job credential", never "expired" or
        "revoked"; docs/failure-detection.md). Not measured at 500 nodes, where slurmd answers slowly (MessageTimeout
        20 s) and a launch RPC could outlive a 5 s credential: those keep 10.
        """
        if n_nodes <= 64:
            return cls(cred_expire_s=5)
        return cls(slurmd_timeout_s=120, message_timeout_s=20, health_check_interval_s=600)


@dataclass(frozen=True)
class Paths:
    """Where each daemon keeps its files. Real hosts use Debian's defaults; the dev cluster one state dir."""

    etc_dir: str = "/etc/slurm"
    state_save: str = "/var/spool/slurmctld"
    slurmd_spool: str = "/var/spool/slurmd"
    run_dir: str = "/run/slurm"
    log_dir: str = "/var/log/slurm"
    munge_socket: str = "/run/munge/munge.socket.2"
    prolog: str = "/usr/local/bin/nuro-prolog"
    epilog: str = "/usr/local/bin/nuro-epilog"
    healthcheck: str = "/usr/local/bin/nuro-healthcheck"


@dataclass(frozen=True)
class Ports:
    slurmctld: int = 6817
    slurmdbd: int = 6819
    slurmd: int = 6818
    mariadb: int = 3306


@dataclass(frozen=True)
class ClusterDescription:
    """Everything the renderer needs. ``nodes`` order is the order nodes appear in slurm.conf."""

    cluster_name: str
    controller_host: str
    controller_addr: str
    nodes: tuple[NodeSpec, ...]
    switches: tuple[Switch, ...] = ()
    partition: str = "gpu"
    timers: Timers = field(default_factory=Timers)
    paths: Paths = field(default_factory=Paths)
    ports: Ports = field(default_factory=Ports)
    slurm_user: str = "slurm"
    db_user: str = "slurm"
    db_password: str = ""
    db_name: str = "slurm_acct_db"

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if not names:
            raise ValueError("a cluster needs at least one node")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate node names: {', '.join(dupes)}")
        known = set(names)
        for sw in self.switches:
            unknown = [n for n in sw.nodes if n not in known]
            if unknown:
                raise ValueError(f"switch {sw.name} lists unknown nodes: {', '.join(unknown)}")

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


def leaf_spine(node_names: list[str], leaf_size: int = 4, spine: str = "spine") -> tuple[Switch, ...]:
    """Leaf switches of ``leaf_size`` consecutive nodes under one spine (the dev cluster's topology/tree)."""
    if leaf_size < 1:
        raise ValueError(f"leaf_size must be >= 1, got {leaf_size}")
    n_leaves = (len(node_names) + leaf_size - 1) // leaf_size
    width = max(2, len(str(n_leaves)))
    leaves = tuple(
        Switch(name=f"leaf{i + 1:0{width}d}", nodes=tuple(node_names[i * leaf_size : (i + 1) * leaf_size]))
        for i in range(n_leaves)
    )
    return (*leaves, Switch(name=spine, switches=tuple(s.name for s in leaves)))

"""A cluster description: the one input from which slurm.conf, topology.conf and gres.conf are rendered.

The same description serves the local dev cluster (many ``slurmd -N`` on 127.0.0.1, fake GPU device files) and,
later, the Ansible roles (one slurmd per real host, ``/dev/nvidia*``). Keeping it a plain frozen value means the
renderer in :mod:`nuro.cluster.slurmconf` stays a pure function that golden tests can pin.
"""

from __future__ import annotations

import itertools
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


#: The deadlines nuro's own root hooks set themselves: prolog checkpoint staging (``NURO_PROLOG_STAGE_TIMEOUT_S``)
#: and epilog upload flush (``NURO_EPILOG_FLUSH_TIMEOUT_S``), both 120 s by default (``prolog_epilog/prolog.py``,
#: ``epilog.py``; the epilog's whole checkpoint part, flush plus clean-up, is bounded 30 s later). Slurm's
#: PrologEpilogTimeout must leave room above them.
HOOK_DEADLINE_S = 120
#: Room above :data:`HOOK_DEADLINE_S` for the rest of a hook: the epilog's clean-up after the flush (30 s), the node
#: health check (its Slurm calls time out after 15 s), a refusal's ``scontrol`` calls (20 s each).
HOOK_MARGIN_S = 60

CGROUP_PLUGINS = ("autodetect", "cgroup/v1", "cgroup/v2")


def release_of(version: str) -> tuple[int, int]:
    """A Slurm release ``"24.11"`` as ``(24, 11)``, for comparisons; ValueError unless it is MAJOR.MINOR."""
    major, minor = version.split(".")
    return int(major), int(minor)


#: How Slurm places a multi-node job (``TopologyPlugin``): ``tree`` (topology/tree: ``--switches=1`` keeps a job on
#: one leaf switch) or ``block`` (topology/block: ``--segment=N`` keeps every N nodes of a job inside one block; the
#: leaves are the blocks). Block needs Slurm 24.11+ here (topology.conf ``BlockName``; 25.05+ topology.yaml).
TOPOLOGIES = ("tree", "block")


@dataclass(frozen=True)
class Confinement:
    """How slurmd fences every job: cgroup process tracking and device, memory and core limits.

    Rendered as ``ProctrackType=proctrack/cgroup``, ``TaskPlugin=task/cgroup[,task/affinity]`` and
    ``SelectTypeParameters=CR_Core_Memory`` (with default memory per GPU and per CPU) in slurm.conf, and as
    cgroup.conf (:func:`nuro.cluster.slurmconf.render_cgroup_conf`): a job opens only the GPU device files it was
    given (``ConstrainDevices``), uses no more RAM (and no swap beyond it) than it was allocated, and no process
    of it outlives the job (the job's cgroup is killed as a whole). Only keys that Slurm 22.05 through 26.05
    all read are written.

    Attributes:
        cgroup_plugin: cgroup.conf ``CgroupPlugin``: ``autodetect`` (the host's v1 or v2, Slurm's default),
            ``cgroup/v1`` or ``cgroup/v2``.
        cgroup_mountpoint: ``CgroupMountpoint``; None leaves Slurm's ``/sys/fs/cgroup``. The dev cluster points
            it at per-cluster bind mounts (``nuro.devcluster.cgroups``) so clusters sharing a host do not share
            ``slurm_<node>`` cgroups.
        constrain_cores: ``ConstrainCores``: tasks run only on their allocated cores. Needs the node's CPUs to
            exist (off on the dev cluster, whose emulated nodes claim 16 CPUs on a 2-core box).
        task_affinity: stack ``task/affinity`` after ``task/cgroup`` (binds tasks to their cores; Slurm's
            recommended pair). Off where the CPUs are emulated, for the same reason.
        constrain_swap: ``ConstrainSwapSpace=yes`` with ``AllowedSwapSpace=0``: the RAM limit is also the limit
            of RAM plus swap, so a job cannot page its way past it.
    """

    cgroup_plugin: str = "autodetect"
    cgroup_mountpoint: str | None = None
    constrain_cores: bool = True
    task_affinity: bool = True
    constrain_swap: bool = True

    def __post_init__(self) -> None:
        if self.cgroup_plugin not in CGROUP_PLUGINS:
            raise ValueError(f"cgroup_plugin={self.cgroup_plugin!r}: choose one of {', '.join(CGROUP_PLUGINS)}")
        mnt = self.cgroup_mountpoint
        if mnt is not None and (not isinstance(mnt, str) or not mnt.startswith("/") or any(c in mnt for c in " \t\n#")):
            raise ValueError(f"cgroup_mountpoint={mnt!r} must be an absolute path without spaces or '#'")
        for name in ("constrain_cores", "task_affinity", "constrain_swap"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")


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
        prolog_epilog_timeout_s: PrologEpilogTimeout: slurmd kills a Prolog/Epilog still running after this
            (a timed-out prolog requeues the job and drains the node, a timed-out epilog drains the node). It
            must stay above nuro's own hook deadlines (:data:`HOOK_DEADLINE_S`) plus the health check, so
            nuro's bounds always fire first and the node is drained only when a hook truly hangs.
    """

    slurmd_timeout_s: int = 6
    message_timeout_s: int = 5
    cred_expire_s: int = 10
    sched_interval_s: int = 5
    bf_interval_s: int = 5
    kill_wait_s: int = 5
    health_check_interval_s: int = 30
    min_job_age_s: int = 300
    prolog_epilog_timeout_s: int = 300

    def __post_init__(self) -> None:
        if self.prolog_epilog_timeout_s < HOOK_DEADLINE_S + HOOK_MARGIN_S:
            raise ValueError(
                f"prolog_epilog_timeout_s={self.prolog_epilog_timeout_s} must be at least "
                f"{HOOK_DEADLINE_S + HOOK_MARGIN_S}: nuro's prolog stages for up to {HOOK_DEADLINE_S} s and its "
                f"epilog flushes uploads for up to {HOOK_DEADLINE_S} s, plus the node health check; a shorter "
                "Slurm timeout kills the hook first and drains the node"
            )
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
    #: ``PluginDir``; None leaves Slurm's built-in default (a host package). The dev cluster's newer Slurm names its
    #: root filesystem's plugin dir, so clients on the host and daemons in the chroot load the same plugins.
    plugin_dir: str | None = None


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
    confinement: Confinement = field(default_factory=Confinement)
    slurm_user: str = "slurm"
    db_user: str = "slurm"
    db_password: str = ""
    db_name: str = "slurm_acct_db"
    #: The Slurm release the files are for ("22.05", "24.11", "26.05"): the renderer uses what each adds and never
    #: writes a key an older one refuses (24.11 dies parsing ``MetricsType``).
    slurm_version: str = "22.05"
    #: One of :data:`TOPOLOGIES`.
    topology: str = "tree"
    #: topology/block's BlockSizes (empty: :attr:`effective_block_sizes` derives them from the leaves).
    block_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        try:
            _ = self.slurm_release
        except ValueError:
            raise ValueError(f"slurm_version must look like 22.05, got {self.slurm_version!r}") from None
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology={self.topology!r}: choose one of {', '.join(TOPOLOGIES)}")
        if self.topology == "block":
            self._check_blocks()
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

    def _check_blocks(self) -> None:
        if self.slurm_release < (24, 11):
            raise ValueError(
                f"topology=block needs Slurm 24.11 or newer (topology/block with --segment); this cluster runs "
                f"{self.slurm_version}: use topology=tree (--switches) there"
            )
        leaves = self.leaves
        if not leaves:
            raise ValueError("topology=block needs leaf switches (the blocks): the description has none")
        sizes = self.effective_block_sizes
        smallest = min(len(sw.nodes) for sw in leaves)
        if sizes[0] < 1 or sizes[0] > smallest:
            raise ValueError(
                f"block_sizes={list(sizes)}: the base block size must be 1..{smallest} (the smallest leaf's nodes)"
            )
        for low, high in itertools.pairwise(sizes):
            if high <= low or high % low or (high // low) & (high // low - 1):
                raise ValueError(
                    f"block_sizes={list(sizes)}: each size must be the one before times a power of two "
                    f"(Slurm's BlockSizes rule), {high} after {low} is not"
                )

    @property
    def leaves(self) -> tuple[Switch, ...]:
        """The switches that hold nodes (topology/tree's leaves, topology/block's blocks)."""
        return tuple(sw for sw in self.switches if sw.nodes)

    @property
    def effective_block_sizes(self) -> tuple[int, ...]:
        """``block_sizes``, or the smallest leaf's node count doubled while the leaves together still hold it
        (8 nodes in leaves of 4: ``(4, 8)``, so a job of up to 8 nodes spans two neighbouring blocks)."""
        if self.block_sizes:
            return self.block_sizes
        leaves = self.leaves
        if not leaves:
            return ()
        sizes = [min(len(sw.nodes) for sw in leaves)]
        total = sum(len(sw.nodes) for sw in leaves)
        while sizes[-1] * 2 <= total:
            sizes.append(sizes[-1] * 2)
        return tuple(sizes)

    @property
    def slurm_release(self) -> tuple[int, int]:
        """``slurm_version`` as (major, minor), for comparisons: (24, 11)."""
        return release_of(self.slurm_version)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def def_mem_per_gpu_mb(self) -> int:
        """DefMemPerGPU: the smallest GPU node's memory share per GPU (0 when no node has GPUs).

        A GPU job that does not ask for memory gets this much per GPU, so eight 1-GPU jobs fit a node and a job
        with every GPU of a node gets (nearly) all of its memory. Without it, memory as a consumable resource
        would give such a job the whole node's memory (Slurm's default, "unlimited").
        """
        shares = [n.memory_mb // n.gpus for n in self.nodes if n.gpus]
        return min(shares) if shares else 0

    @property
    def def_mem_per_cpu_mb(self) -> int:
        """DefMemPerCPU: the smallest node's memory share per CPU, for jobs that hold no GPU (CPU-only jobs)."""
        return min(n.memory_mb // max(n.cpus, 1) for n in self.nodes)


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

"""Render slurm.conf, cgroup.conf, topology.conf, gres.conf and slurmdbd.conf from a :class:`ClusterDescription`.

Pure functions: a description in, text out. The dev cluster writes the text to its state dir; the Ansible roles
template the same text onto real hosts; ``tests/golden/`` pins it so every change to what reaches Slurm is a diff.
The settings every nuro cluster needs (gres/gpu accounting, multifactor priority, QOS preemption with requeue,
job_submit/lua, prolog/epilog with ``PrologFlags=Alloc`` and a ``PrologEpilogTimeout``, topology/tree, cgroup
confinement with memory as a consumable resource) are fixed here, not options; the description only says how
confinement fits the hosts (:class:`~nuro.cluster.description.Confinement`).
"""

from __future__ import annotations

from itertools import groupby

from nuro.cluster.description import ClusterDescription, NodeSpec
from nuro.slurm.hostlist import compress as compress_hostlist

#: slurmctld serves OpenMetrics on its own port from this release (``MetricsType=metrics/openmetrics``), and
#: expedited requeue arrives with it; 24.11 dies parsing ``MetricsType``.
OPENMETRICS_SINCE = (25, 11)

#: Byte-identical since the first release (the module was nuro.slurmconf then): a changed header would change every
#: deployed file, and the Ansible rollout would drain every node for a comment.
HEADER = "# Rendered by nuro (nuro.slurmconf). Edit the cluster description, not this file.\n"


def _node_runs(nodes: tuple[NodeSpec, ...]) -> list[list[NodeSpec]]:
    """Split nodes into runs that one ``NodeName=`` line can describe: same attributes, ports consecutive."""

    def attrs(n: NodeSpec) -> tuple:
        return (n.addr, n.hostname, n.cpus, n.memory_mb, n.gpus, n.gpu_files, n.gpu_type, n.port is None)

    runs: list[list[NodeSpec]] = []
    for _, group in groupby(nodes, key=attrs):
        for node in group:
            last = runs[-1] if runs else None
            if (
                last is not None
                and attrs(last[-1]) == attrs(node)
                and (node.port is None or node.port == last[-1].port + 1)  # type: ignore[operator]
            ):
                last.append(node)
            else:
                runs.append([node])
    return runs


def _node_line(run: list[NodeSpec]) -> str:
    first = run[0]
    parts = [f"NodeName={compress_hostlist([n.name for n in run])}"]
    if first.hostname:
        parts.append(f"NodeHostname={first.hostname}")
    parts.append(f"NodeAddr={first.addr}")
    if first.port is not None:
        parts.append(f"Port={first.port}" if len(run) == 1 else f"Port=[{first.port}-{run[-1].port}]")
    parts += [f"CPUs={first.cpus}", f"RealMemory={first.memory_mb}"]
    if first.gpus:
        parts.append(f"Gres=gpu:{first.gpu_type}:{first.gpus}" if first.gpu_type else f"Gres=gpu:{first.gpus}")
    parts.append("State=UNKNOWN")
    return " ".join(parts)


def render_slurm_conf(desc: ClusterDescription) -> str:
    """The complete slurm.conf. Emulated clusters (nodes with ports) get ``SlurmdParameters=config_overrides``."""
    t, p, ports = desc.timers, desc.paths, desc.ports
    emulated = any(n.port is not None for n in desc.nodes)
    new_release = desc.slurm_release
    lines = [
        f"ClusterName={desc.cluster_name}",
        f"SlurmctldHost={desc.controller_host}({desc.controller_addr})",
        f"SlurmctldPort={ports.slurmctld}",
        *([] if emulated else [f"SlurmdPort={ports.slurmd}"]),
        f"SlurmUser={desc.slurm_user}",
        "SlurmdUser=root",
        *([f"PluginDir={p.plugin_dir}"] if p.plugin_dir else []),
        f"StateSaveLocation={p.state_save}",
        f"SlurmdSpoolDir={p.slurmd_spool}/%n" if emulated else f"SlurmdSpoolDir={p.slurmd_spool}",
        f"SlurmctldPidFile={p.run_dir}/slurmctld.pid",
        f"SlurmdPidFile={p.run_dir}/slurmd-%n.pid" if emulated else f"SlurmdPidFile={p.run_dir}/slurmd.pid",
        f"SlurmctldLogFile={p.log_dir}/slurmctld.log",
        f"SlurmdLogFile={p.log_dir}/slurmd-%n.log" if emulated else f"SlurmdLogFile={p.log_dir}/slurmd.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "",
        "# Authentication: munge on an explicit socket; cred_expire sets the requeue delay (EligibleTime = +N+1 s)",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={p.munge_socket},cred_expire={t.cred_expire_s}",
        "",
        "# Accounting through slurmdbd; GPUs are a tracked TRES so QOS GrpTRES=gres/gpu=N can hold team quotas.",
        "# AccountingStoragePass carries the munge socket: slurmctld -> slurmdbd ignores AuthInfo's socket.",
        "AccountingStorageType=accounting_storage/slurmdbd",
        f"AccountingStorageHost={desc.controller_addr}",
        f"AccountingStoragePort={ports.slurmdbd}",
        f"AccountingStoragePass={p.munge_socket}",
        "AccountingStorageTRES=gres/gpu",
        "AccountingStorageEnforce=associations,limits,qos",
        "AccountingStoreFlags=job_comment",  # nuro's run metadata rides in the comment: keep it in sacct too
        "JobAcctGatherType=jobacct_gather/none",
        "",
        "# Resources: whole-GPU gres, cons_tres so --gpus-per-node works; memory is allocated too, so every job",
        "# has a memory limit (DefMemPerGPU for GPU jobs, DefMemPerCPU for the rest, unless it asks with --mem)",
        "GresTypes=gpu",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        *([f"DefMemPerGPU={desc.def_mem_per_gpu_mb}"] if desc.def_mem_per_gpu_mb else []),
        f"DefMemPerCPU={desc.def_mem_per_cpu_mb}",
        "",
        "# Confinement (cgroup.conf beside this file): a job's processes live in its cgroup, so none outlives the",
        "# job, and it opens only its own GPUs (ConstrainDevices) within its memory (ConstrainRAMSpace)",
        "ProctrackType=proctrack/cgroup",
        f"TaskPlugin={'task/cgroup,task/affinity' if desc.confinement.task_affinity else 'task/cgroup'}",
        "MpiDefault=none",
        "",
        *_topology_lines(desc),
        "",
        "# Priority (fair share across team accounts) and QOS preemption that requeues, never kills",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
        "PriorityWeightQOS=10000",
        "PriorityWeightAge=1000",
        "PriorityWeightJobSize=0",
        "PriorityDecayHalfLife=7-0",
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
        "EnforcePartLimits=ALL",  # a job that can never fit is refused at sbatch time, not left pending forever
        f"SchedulerParameters=bf_interval={t.bf_interval_s},sched_interval={t.sched_interval_s}",
        *(
            [
                "# 25.11+: a job submitted with --requeue=expedite (nuro's training jobs) is requeued at once when its",
                "# node fails, without the cred_expire wait; slurmctld serves OpenMetrics gauges on its own port",
                "SlurmctldParameters=enable_expedited_requeue",
                "MetricsType=metrics/openmetrics",
            ]
            if new_release >= OPENMETRICS_SINCE
            else []
        ),
        "",
        "# nuro's hooks: admission bridge (job_submit.lua beside this file), prolog/epilog, node health",
        "JobSubmitPlugins=lua",
        "PrologFlags=Alloc",
        "# Above nuro's own hook deadlines (120 s staging / upload flush, plus the health check): those fire first.",
        *(
            [
                "# 25.05+: one deadline each (the prolog stages data, the epilog flushes uploads)",
                f"PrologTimeout={t.prolog_epilog_timeout_s}",
                f"EpilogTimeout={t.prolog_epilog_timeout_s}",
            ]
            if new_release >= (25, 5)
            else [
                "# Slurm 25.05+ also reads PrologTimeout/EpilogTimeout; both default to this value.",
                f"PrologEpilogTimeout={t.prolog_epilog_timeout_s}",
            ]
        ),
        "# slurmctld counts a batch job whose prolog runs longer than this as missing and requeues it (node failure)",
        f"BatchStartTimeout={t.prolog_epilog_timeout_s}",
        f"Prolog={p.prolog}",
        f"Epilog={p.epilog}",
        *(
            [
                f"HealthCheckProgram={p.healthcheck}",
                f"HealthCheckInterval={t.health_check_interval_s}",
                "HealthCheckNodeState=ANY,CYCLE",
            ]
            if t.health_check_interval_s > 0
            else []
        ),
        "",
        "# Timers (seconds)",
        f"SlurmdTimeout={t.slurmd_timeout_s}",
        f"MessageTimeout={t.message_timeout_s}",
        f"KillWait={t.kill_wait_s}",
        f"MinJobAge={t.min_job_age_s}",
        "InactiveLimit=0",
        "Waittime=0",
        "ReturnToService=2",
        "MailProg=/bin/true",
        *(["SlurmdParameters=config_overrides"] if emulated else []),
        "",
        "# Nodes",
        *(_node_line(run) for run in _node_runs(desc.nodes)),
        "",
        f"PartitionName={desc.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
    ]
    return HEADER + "\n".join(lines) + "\n"


def render_cgroup_conf(desc: ClusterDescription) -> str:
    """cgroup.conf for proctrack/cgroup and task/cgroup: what each job's cgroup constrains.

    Only keys every Slurm from 22.05 to 26.05 reads (``CgroupAutomount`` is defunct from 23.x, ``ConstrainKmemSpace``
    gone in 24.11, so neither is written). ``AllowedRAMSpace=100``: a job gets exactly its allocation.
    """
    c = desc.confinement
    lines = [
        f"CgroupPlugin={c.cgroup_plugin}",
        *([f"CgroupMountpoint={c.cgroup_mountpoint}"] if c.cgroup_mountpoint else []),
        "ConstrainDevices=yes",
        "ConstrainRAMSpace=yes",
        "AllowedRAMSpace=100",
        *(["ConstrainSwapSpace=yes", "AllowedSwapSpace=0"] if c.constrain_swap else ["ConstrainSwapSpace=no"]),
        f"ConstrainCores={'yes' if c.constrain_cores else 'no'}",
    ]
    return HEADER + "\n".join(lines) + "\n"


#: The one topology the rendered topology.yaml defines (25.05+), the cluster default every partition uses.
TOPOLOGY_NAME = "nuro"


def topology_file(desc: ClusterDescription) -> str:
    """The file Slurm reads the topology from: ``topology.yaml`` from 25.05 (it wins over topology.conf there, and
    is the form the newer features are documented in), ``topology.conf`` before."""
    return "topology.yaml" if desc.slurm_release >= (25, 5) else "topology.conf"


def _topology_lines(desc: ClusterDescription) -> list[str]:
    """slurm.conf's placement lines. With topology.yaml (25.05+) the file names the plugin, so no TopologyPlugin."""
    why = {
        "tree": "topology/tree makes --switches=1 keep a job on one leaf",
        "block": "topology/block makes --segment=N keep every N nodes of a job inside one block (a leaf)",
    }[desc.topology]
    lines = [f"# Placement: gang allocation is Slurm's own; {why}"]
    if topology_file(desc) == "topology.yaml":
        return [*lines, f"# The topology ({desc.topology}) is in topology.yaml beside this file"]
    return [*lines, f"TopologyPlugin=topology/{desc.topology}"]


def render_topology(desc: ClusterDescription) -> str:
    """The text of :func:`topology_file`: the leaf/spine tree or the blocks (leaves), in the version's format."""
    if topology_file(desc) == "topology.yaml":
        return HEADER + _topology_yaml(desc)
    if desc.topology == "block":
        lines = [f"BlockName={sw.name} Nodes={compress_hostlist(list(sw.nodes))}" for sw in desc.leaves]
        lines.append(f"BlockSizes={','.join(str(n) for n in desc.effective_block_sizes)}")
        return HEADER + "\n".join(lines) + "\n"
    lines = []
    for sw in desc.switches:
        parts = [f"SwitchName={sw.name}"]
        if sw.nodes:
            parts.append(f"Nodes={compress_hostlist(list(sw.nodes))}")
        if sw.switches:
            parts.append(f"Switches={compress_hostlist(list(sw.switches))}")
        lines.append(" ".join(parts))
    return HEADER + "\n".join(lines) + "\n"


def _topology_yaml(desc: ClusterDescription) -> str:
    """topology.yaml (topology.yaml(5)): one topology, the cluster default, of the description's kind."""
    head = [f"- topology: {TOPOLOGY_NAME}", "  cluster_default: true"]
    if desc.topology == "block":
        body = ["  block:", "    block_sizes:", *(f"      - {n}" for n in desc.effective_block_sizes), "    blocks:"]
        for sw in desc.leaves:
            body += [f"    - block: {sw.name}", f"      nodes: {compress_hostlist(list(sw.nodes))}"]
    else:
        body = ["  tree:", "    switches:"]
        for sw in desc.switches:
            body.append(f"    - switch: {sw.name}")
            if sw.switches:
                body.append(f"      children: {compress_hostlist(list(sw.switches))}")
            if sw.nodes:
                body.append(f"      nodes: {compress_hostlist(list(sw.nodes))}")
    return "\n".join(head + body) + "\n"


def render_gres_conf(desc: ClusterDescription) -> str:
    """gres.conf: one line per run of nodes that share a GPU device-file pattern."""
    lines = []
    gpu_nodes = [n for n in desc.nodes if n.gpus]
    for (files, count, gpu_type), group in groupby(gpu_nodes, key=lambda n: (n.gpu_files, n.gpus, n.gpu_type)):
        names = [n.name for n in group]
        typed = f" Type={gpu_type}" if gpu_type else ""
        lines.append(f"NodeName={compress_hostlist(names)} Name=gpu{typed} Count={count} File={files}")
    return HEADER + "\n".join(lines) + "\n"


def render_slurmdbd_conf(desc: ClusterDescription, pid_file: str, log_file: str) -> str:
    """slurmdbd.conf (must be mode 600: it holds the database password)."""
    lines = [
        "AuthType=auth/munge",
        f"AuthInfo=socket={desc.paths.munge_socket}",
        f"DbdHost={desc.controller_host}",
        f"DbdAddr={desc.controller_addr}",
        f"DbdPort={desc.ports.slurmdbd}",
        f"SlurmUser={desc.slurm_user}",
        f"PidFile={pid_file}",
        f"LogFile={log_file}",
        "DebugLevel=info",
        "StorageType=accounting_storage/mysql",
        f"StorageHost={desc.controller_addr}",
        f"StoragePort={desc.ports.mariadb}",
        f"StorageUser={desc.db_user}",
        f"StoragePass={desc.db_password}",
        f"StorageLoc={desc.db_name}",
    ]
    return HEADER + "\n".join(lines) + "\n"


#: characters a path written into a script or unit line may not hold (quoting, expansion, word splitting)
_UNSAFE_IN_PATH = "\n\0'\"$`\\ "


def _plain_paths(what: str, *paths: str, unsafe: str = _UNSAFE_IN_PATH) -> None:
    """Raise ValueError unless every path is absolute and free of ``unsafe`` characters: they are the admin's paths,
    written verbatim into a file root runs."""
    for path in paths:
        if not path.startswith("/") or any(c in path for c in unsafe):
            raise ValueError(f"{what} paths must be absolute and plain, got {path!r}")


def render_slurmd_dropin(python: str, spool: str) -> str:
    """A systemd drop-in for ``slurmd.service``: before slurmd starts, clear its job-state cache from before the
    host booted (``nuro.healthcheck.slurmdspool``), so a host back from a crash runs the prolog of a job it ran
    before. ``-`` in front: a failure of the clean-up never keeps slurmd from starting."""
    _plain_paths("slurmd drop-in", python, spool, unsafe=_UNSAFE_IN_PATH + "%")  # % is a systemd specifier
    return (
        "# nuro: a host back from a crash forgets the jobs its slurmd ran before (their next attempts get prologs)\n"
        "[Service]\n"
        f"ExecStartPre=-{python} -m nuro.healthcheck.slurmdspool --spool {spool}\n"
    )


def render_hook_wrapper(entry_point: str, env_file: str) -> str:
    """A tiny executable for Prolog/Epilog/HealthCheckProgram that tells nuro's entry point where its settings are.

    slurmd runs these hooks with a job-only environment (no SLURM_CONF, no S3 settings), and they take no
    arguments, so the settings file is named here. Both paths are the admin's, never a user's.
    """
    _plain_paths("hook", entry_point, env_file)
    return f'#!/bin/sh\nNURO_ENV_FILE={env_file} exec {entry_point} "$@"\n'

"""The config renderer is a pure function of a cluster description: pinned by golden files, checked for shape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nuro.cluster.description import (
    HOOK_DEADLINE_S,
    HOOK_MARGIN_S,
    ClusterDescription,
    Confinement,
    NodeSpec,
    Paths,
    Ports,
    Timers,
    leaf_spine,
)
from nuro.cluster.slurmconf import (
    render_cgroup_conf,
    render_gres_conf,
    render_slurm_conf,
    render_slurmdbd_conf,
    render_topology,
)


def _emulated(n: int) -> ClusterDescription:
    names = [f"gpu{i + 1:03d}" for i in range(n)]
    nodes = tuple(
        NodeSpec(name=nm, addr="127.0.0.1", hostname="box", port=17800 + i, gpu_files="/s/dev/nvidia[0-7]")
        for i, nm in enumerate(names)
    )
    return ClusterDescription(
        cluster_name="nuro",
        controller_host="box",
        controller_addr="127.0.0.1",
        nodes=nodes,
        switches=leaf_spine(names, 4),
        timers=Timers.for_node_count(n),
        paths=Paths(
            etc_dir="/s/etc", state_save="/s/slurmctld", slurmd_spool="/s/slurmd", run_dir="/s/run",
            log_dir="/s/log", munge_socket="/s/munge/munge.socket", prolog="/v/bin/nuro-prolog",
            epilog="/v/bin/nuro-epilog", healthcheck="/v/bin/nuro-healthcheck",
        ),
        ports=Ports(slurmctld=16817, slurmdbd=16819, mariadb=16806),
        slurm_user="root",
        db_password="pw",
    )  # fmt: skip


def _real_hosts() -> ClusterDescription:
    nodes = tuple(NodeSpec(name=f"dgx{i:02d}", addr=f"10.0.0.{i}", cpus=128, memory_mb=2_000_000) for i in (1, 2, 3))
    return ClusterDescription(
        cluster_name="prod", controller_host="ctl", controller_addr="10.0.0.254", nodes=nodes,
        switches=leaf_spine([n.name for n in nodes], 2),
    )  # fmt: skip


@pytest.mark.parametrize("name,desc", [("emulated8", _emulated(8)), ("real3", _real_hosts())])
def test_rendered_configs_match_golden(golden, name: str, desc: ClusterDescription) -> None:
    golden(f"{name}.slurm.conf", render_slurm_conf(desc))
    golden(f"{name}.cgroup.conf", render_cgroup_conf(desc))
    golden(f"{name}.topology.conf", render_topology(desc))
    golden(f"{name}.gres.conf", render_gres_conf(desc))
    golden(f"{name}.slurmdbd.conf", render_slurmdbd_conf(desc, "/run/slurmdbd.pid", "/var/log/slurmdbd.log"))


def test_emulated_nodes_collapse_into_one_line_with_a_port_range() -> None:
    text = render_slurm_conf(_emulated(500))
    node_lines = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    assert node_lines == [
        "NodeName=gpu[001-500] NodeHostname=box NodeAddr=127.0.0.1 Port=[17800-18299] CPUs=16 RealMemory=64000 "
        "Gres=gpu:8 State=UNKNOWN"
    ]
    assert "SlurmdParameters=config_overrides" in text
    assert "SlurmdTimeout=120" in text  # relaxed timers when hundreds of slurmd share two cores


def test_topology_for_500_nodes_has_125_leaves_under_one_spine() -> None:
    lines = render_topology(_emulated(500)).splitlines()[1:]
    assert len(lines) == 126
    assert lines[0] == "SwitchName=leaf001 Nodes=gpu[001-004]"
    assert lines[-1] == "SwitchName=spine Switches=leaf[001-125]"


def test_real_hosts_differ_in_address_so_each_gets_its_own_line() -> None:
    text = render_slurm_conf(_real_hosts())
    assert text.count("\nNodeName=") == 3
    assert "SlurmdParameters" not in text and "SlurmdPort=6818" in text


def test_each_required_setting_is_present() -> None:
    text = render_slurm_conf(_emulated(8))
    for line in (
        "AccountingStorageTRES=gres/gpu", "PriorityType=priority/multifactor", "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE", "JobSubmitPlugins=lua", "PrologFlags=Alloc", "JobRequeue=1",
        "TopologyPlugin=topology/tree", "Prolog=/v/bin/nuro-prolog", "HealthCheckProgram=/v/bin/nuro-healthcheck",
        "AuthInfo=socket=/s/munge/munge.socket,cred_expire=5", "AccountingStoragePass=/s/munge/munge.socket",
    ):  # fmt: skip
        assert f"\n{line}\n" in text, line


def test_description_refuses_inconsistent_input() -> None:
    node = NodeSpec(name="a", addr="1.2.3.4")
    with pytest.raises(ValueError, match="duplicate node names: a"):
        ClusterDescription("c", "h", "1.1.1.1", (node, node))
    with pytest.raises(ValueError, match="unknown nodes: zz"):
        ClusterDescription("c", "h", "1.1.1.1", (node,), switches=leaf_spine(["zz"]))
    with pytest.raises(ValueError, match="below 5"):
        Timers(cred_expire_s=2)
    with pytest.raises(ValueError, match="leaf_size"):
        leaf_spine(["a"], 0)


def test_health_check_interval_zero_leaves_the_program_out() -> None:
    desc = _emulated(2)
    text = render_slurm_conf(ClusterDescription(**{**desc.__dict__, "timers": Timers(health_check_interval_s=0)}))
    assert "HealthCheckProgram" not in text


def test_devcluster_layout_renders_into_its_state_dir(tmp_path: Path) -> None:
    from nuro.devcluster.layout import Layout, PortPlan, describe

    desc = describe(Layout(tmp_path), 8, 16800)
    assert [n.port for n in desc.nodes] == list(range(17800, 17808))
    assert desc.paths.munge_socket == str(Layout(tmp_path).sockets / "munge" / "munge.socket")  # short dir
    assert desc.total_gpus == 64
    plan = PortPlan(16800).all(2)
    assert plan == {"mariadb": 16806, "slurmctld": 16817, "slurmdbd": 16819,
                    **{f"seaweedfs -{f}": 16833 + i for i, f in enumerate(PortPlan(16800).weed())},
                    "influxd http": 16886, "influxd rpc": 16888, "mlflow": 16892,
                    "slurmd gpu001": 17800, "slurmd gpu002": 17801}  # fmt: skip


# cgroup.conf keys each Slurm reads (src/common/cgroup.c, 22.05.8 as Debian 12 ships it; src/interfaces/cgroup.c,
# 24.11.6 and 26.05.3): a key one of them does not know is fatal or ignored there, so only common ones are written.
CGROUP_KEYS_22_05 = {
    "CgroupAutomount", "CgroupMountpoint", "CgroupReleaseAgentDir", "ConstrainCores", "ConstrainRAMSpace",
    "AllowedRAMSpace", "MaxRAMPercent", "MinRAMSpace", "ConstrainSwapSpace", "ConstrainKmemSpace", "AllowedKmemSpace",
    "MaxKmemPercent", "MinKmemSpace", "AllowedSwapSpace", "MaxSwapPercent", "MemoryLimitEnforcement",
    "MemoryLimitThreshold", "ConstrainDevices", "AllowedDevicesFile", "MemorySwappiness", "CgroupPlugin",
    "IgnoreSystemd", "IgnoreSystemdOnFailure",
}  # fmt: skip
CGROUP_KEYS_26_05 = {
    "CgroupAutomount", "CgroupJobIdPaths", "CgroupMountpoint", "CgroupSlice", "ConstrainCores", "ConstrainRAMSpace",
    "AllowedRAMSpace", "MaxRAMPercent", "MinRAMSpace", "ConstrainSwapSpace", "AllowedSwapSpace", "MaxSwapPercent",
    "MemoryLimitEnforcement", "MemoryLimitThreshold", "ConstrainDevices", "AllowedDevicesFile", "MemorySwappiness",
    "CgroupPlugin", "IgnoreSystemd", "IgnoreSystemdOnFailure", "EnableControllers", "EnableExtraControllers",
    "SignalChildrenProcesses", "SystemdTimeout",
}  # fmt: skip
DEFUNCT_OR_GONE = {"CgroupAutomount", "ConstrainKmemSpace", "AllowedKmemSpace", "MaxKmemPercent", "MinKmemSpace"}


def _settings(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if ln and not ln.startswith("#"))


@pytest.mark.parametrize("desc", [_real_hosts(), _emulated(8)], ids=["real3", "emulated8"])
def test_cgroup_conf_uses_only_keys_every_supported_slurm_reads(desc: ClusterDescription) -> None:
    keys = set(_settings(render_cgroup_conf(desc)))
    assert keys <= (CGROUP_KEYS_22_05 & CGROUP_KEYS_26_05) - DEFUNCT_OR_GONE
    assert {"ConstrainDevices", "ConstrainRAMSpace", "ConstrainSwapSpace", "CgroupPlugin"} <= keys


def test_production_confines_jobs_with_cgroups_and_memory_limits() -> None:
    conf = _settings(render_slurm_conf(_real_hosts()))
    assert conf["ProctrackType"] == "proctrack/cgroup"  # no process outlives its job
    assert conf["TaskPlugin"] == "task/cgroup,task/affinity"  # Slurm's recommended pair: fence, then bind
    assert conf["SelectTypeParameters"] == "CR_Core_Memory"  # memory is allocated, so every job has a limit
    assert conf["DefMemPerGPU"] == str(2_000_000 // 8) and conf["DefMemPerCPU"] == str(2_000_000 // 128)
    cgroup = _settings(render_cgroup_conf(_real_hosts()))
    assert cgroup["CgroupPlugin"] == "autodetect" and "CgroupMountpoint" not in cgroup  # the host's v1 or v2
    assert cgroup["ConstrainDevices"] == cgroup["ConstrainRAMSpace"] == cgroup["ConstrainCores"] == "yes"
    assert cgroup["ConstrainSwapSpace"] == "yes" and cgroup["AllowedSwapSpace"] == "0"  # no paging past the limit


def test_dev_cluster_confinement_is_cgroup_v1_in_its_own_cgroups(tmp_path: Path) -> None:
    from nuro.devcluster.cgroups import cluster_cgroup_name, fake_gpu_rdev
    from nuro.devcluster.layout import Layout, describe

    desc = describe(Layout(tmp_path), 8, 16800)
    cgroup = _settings(render_cgroup_conf(desc))
    assert cgroup["CgroupPlugin"] == "cgroup/v1"
    assert cgroup["CgroupMountpoint"] == str(tmp_path / "cgroup")
    assert cgroup["ConstrainDevices"] == "yes" and cgroup["ConstrainCores"] == "no"  # 16 CPUs claimed on 2 cores
    assert _settings(render_slurm_conf(desc))["TaskPlugin"] == "task/cgroup"
    name = cluster_cgroup_name(tmp_path)
    assert name == cluster_cgroup_name(tmp_path / ".") and name != cluster_cgroup_name(tmp_path / "other")
    assert name.startswith("nuro-dc-") and len(name) == len("nuro-dc-") + 12
    # stand-in GPUs have their own device numbers: ConstrainDevices denies by number, and 1:3 is /dev/null
    assert {os.major(fake_gpu_rdev(i)) for i in range(8)} == {120}
    assert [os.minor(fake_gpu_rdev(i)) for i in range(8)] == list(range(8))


def test_cluster_without_gpus_gets_no_gpu_memory_default() -> None:
    node = NodeSpec(name="c1", addr="10.0.0.9", cpus=32, memory_mb=128000, gpus=0)
    conf = _settings(render_slurm_conf(ClusterDescription("c", "h", "10.0.0.1", (node,))))
    assert "DefMemPerGPU" not in conf and conf["DefMemPerCPU"] == "4000"


def test_mixed_nodes_take_the_smallest_share() -> None:
    big = NodeSpec(name="a", addr="10.0.0.1", cpus=128, memory_mb=2_000_000, gpus=8)
    small = NodeSpec(name="b", addr="10.0.0.2", cpus=64, memory_mb=1_000_000, gpus=4)
    desc = ClusterDescription("c", "h", "10.0.0.254", (big, small))
    assert (desc.def_mem_per_gpu_mb, desc.def_mem_per_cpu_mb) == (250_000, 15_625)


def test_prolog_epilog_timeout_is_above_the_hooks_own_deadlines() -> None:
    from nuro.prolog_epilog import epilog

    text = render_slurm_conf(_real_hosts())
    assert "\nPrologEpilogTimeout=300\n" in text
    # the epilog's own bound on its checkpoint part (flush + clean-up), when it has one; else the flush timeout
    epilog_bound = epilog.deadline_s({}) if hasattr(epilog, "deadline_s") else HOOK_DEADLINE_S
    for bound in (HOOK_DEADLINE_S, epilog_bound):  # prolog staging 120 s; epilog 120 s flush (+ clean-up)
        assert Timers().prolog_epilog_timeout_s >= bound + HOOK_MARGIN_S
    with pytest.raises(ValueError, match="prolog_epilog_timeout_s=120 must be at least 180"):
        Timers(prolog_epilog_timeout_s=120)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cgroup_plugin": "v2"}, "cgroup_plugin='v2': choose one of autodetect, cgroup/v1, cgroup/v2"),
        ({"cgroup_mountpoint": "cgroup"}, "must be an absolute path"),
        ({"cgroup_mountpoint": "/a b"}, "must be an absolute path"),
        ({"constrain_cores": "yes"}, "constrain_cores='yes' must be true or false"),
    ],
)
def test_confinement_refuses_what_slurm_would_misread(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Confinement(**kwargs)

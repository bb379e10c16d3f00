"""The config renderer is a pure function of a cluster description: pinned by golden files, checked for shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.clusterdesc import ClusterDescription, NodeSpec, Paths, Ports, Timers, leaf_spine
from nuro.slurmconf import render_gres_conf, render_slurm_conf, render_slurmdbd_conf, render_topology_conf


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
    golden(f"{name}.topology.conf", render_topology_conf(desc))
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
    lines = render_topology_conf(_emulated(500)).splitlines()[1:]
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
                    "influxd http": 16886, "influxd rpc": 16888,
                    "slurmd gpu001": 17800, "slurmd gpu002": 17801}  # fmt: skip

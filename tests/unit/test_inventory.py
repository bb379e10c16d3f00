"""nuro.cluster.inventory: the Ansible inventory is the topology, mapped to the same ClusterDescription the renderer
takes.

The round trip from the dev cluster's own description is the pure half of the integration test's byte-for-byte
comparison; the example inventory is read through ansible-core's own inventory loader, so group-var inheritance is
Ansible's, not a re-implementation.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nuro.cluster import slurmconf
from nuro.cluster.description import Switch
from nuro.cluster.inventory import (
    InventoryError,
    describe_inventory,
    inventory_from_description,
    render_file,
)
from nuro.devcluster.layout import Layout, describe

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "ansible" / "inventory" / "example.yml"


def _flatten(inv: dict) -> tuple[dict[str, dict], dict[str, list[str]]]:
    """hostvars/groups of an inventory_from_description() dict (hosts directly under their group, no group vars)."""
    hostvars: dict[str, dict] = {}
    groups: dict[str, list[str]] = {}
    for group, body in inv["all"]["children"].items():
        groups[group] = list(body["hosts"])
        for host, hv in body["hosts"].items():
            hostvars.setdefault(host, {}).update(hv)
    return hostvars, groups


def _ansible_inventory(path: Path) -> tuple[dict[str, dict], dict[str, list[str]]]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    vm = VariableManager(loader=loader, inventory=inv)
    hostvars = {h.name: vm.get_vars(host=h, include_hostvars=False) for h in inv.get_hosts()}
    groups = {name: [h.name for h in g.get_hosts()] for name, g in inv.groups.items()}
    return hostvars, groups


@pytest.mark.parametrize("n_nodes", [1, 8, 10])
def test_dev_cluster_description_round_trips(tmp_path: Path, n_nodes: int) -> None:
    desc = describe(Layout(tmp_path), n_nodes, 16800)
    back = describe_inventory(*_flatten(inventory_from_description(desc)))
    # The database password is slurmdbd.conf's, not the inventory's business (it comes from the vault there).
    assert replace(back, db_password=desc.db_password) == desc
    for name, render in (
        ("slurm.conf", slurmconf.render_slurm_conf),
        ("cgroup.conf", slurmconf.render_cgroup_conf),
        ("topology.conf", slurmconf.render_topology),
        ("gres.conf", slurmconf.render_gres_conf),
    ):
        assert render_file(back, name) == render(desc)


def test_example_inventory_is_the_topology() -> None:
    desc = describe_inventory(*_ansible_inventory(EXAMPLE))
    assert [n.name for n in desc.nodes][:2] == ["gpu001", "gpu002"]
    assert desc.controller_addr == "10.10.0.2"
    assert desc.switches == (
        Switch("leaf-r01", nodes=("gpu001", "gpu002", "gpu003", "gpu004")),
        Switch("leaf-r02", nodes=("gpu005", "gpu006", "gpu007", "gpu008")),
        Switch("leaf-r03", nodes=("gpu101", "gpu102")),
        Switch("spine-a", switches=("leaf-r01", "leaf-r02")),
        Switch("spine-b", switches=("leaf-r03",)),
        Switch("core", switches=("spine-a", "spine-b")),
    )
    gres = render_file(desc, "gres.conf").splitlines()[1:]
    assert gres == [
        "NodeName=gpu[001-008] Name=gpu Type=h100 Count=8 File=/dev/nvidia[0-7]",
        "NodeName=gpu[101-102] Name=gpu Type=a100 Count=4 File=/dev/nvidia[0-3]",
    ]
    conf = render_file(desc, "slurm.conf")
    assert "NodeName=gpu101 NodeAddr=10.10.3.1 CPUs=64 RealMemory=1000000 Gres=gpu:a100:4 State=UNKNOWN" in conf
    assert "SlurmctldHost=ctl01(10.10.0.2)" in conf
    assert "SlurmdParameters=config_overrides" not in conf  # real hosts: one slurmd each, no emulation


def _minimal(**node_vars: object) -> tuple[dict[str, dict], dict[str, list[str]]]:
    hv = {"ctl": {"ansible_host": "10.0.0.1"}, "n1": {"nuro_gpu_count": 8, **node_vars}, "n2": {"nuro_gpu_count": 8}}
    return hv, {"slurm_controller": ["ctl"], "compute": ["n2", "n1"]}


def test_nodes_sorted_by_name_and_defaults() -> None:
    desc = describe_inventory(*_minimal())
    assert [n.name for n in desc.nodes] == ["n1", "n2"]
    assert desc.nodes[0].gpu_files == "/dev/nvidia[0-7]"
    assert desc.nodes[0].addr == "n1"
    assert desc.switches == ()


@pytest.mark.parametrize(
    ("hostvars_patch", "groups_patch", "message"),
    [
        ({"n2": {}}, {}, "host n2: nuro_gpu_count is not set"),
        ({"n1": {"nuro_gpu_count": 8, "nuro_rack": "r1"}}, {}, "hosts without nuro_leaf_switch/nuro_rack: n2"),
        ({"ctl": {"nuro_slurm_timers": {"slurmd_timeout": 5}}}, {}, "unknown keys slurmd_timeout"),
        ({"n1": {"nuro_gpu_count": "eight"}}, {}, "nuro_gpu_count='eight' is not an integer"),
        ({"n1": {"nuro_gpu_count": 8, "nuro_gpu_model": "h100; rm"}}, {}, "must be a plain word"),
        ({}, {"slurm_controller": []}, "no host in group slurm_controller"),
        ({"n1": {"nuro_gpu_count": 8, "nuro_node_name": "n2"}}, {}, "duplicate node names: n2"),
        ({"ctl": {"nuro_slurm_confinement": {"cgroup": "v1"}}}, {}, "unknown keys cgroup"),
        ({"ctl": {"nuro_slurm_confinement": {"cgroup_plugin": "v1"}}}, {}, "cgroup_plugin='v1': choose one of"),
    ],
    ids=[
        "no-gpu-count",
        "half-topology",
        "unknown-timer",
        "bad-int",
        "bad-model",
        "no-controller",
        "dupe",
        "unknown-confinement",
        "bad-cgroup-plugin",
    ],
)
def test_inventory_errors_name_what_to_fix(hostvars_patch: dict, groups_patch: dict, message: str) -> None:
    hostvars, groups = _minimal()
    hostvars.update(hostvars_patch)
    groups.update(groups_patch)
    with pytest.raises(InventoryError, match=message.replace("[", r"\[")):
        describe_inventory(hostvars, groups)


def test_unknown_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        InventoryError, match="nuro renders slurm.conf, cgroup.conf, topology.conf, topology.yaml, gres.conf"
    ):
        render_file(describe(Layout(tmp_path), 1, 16800), "slurmdbd.conf")  # holds the db password: not here

"""slurm.conf per Slurm release: what each newer one adds is used, and no older one is given a key it refuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from nuro.cluster.inventory import InventoryError, describe_inventory, inventory_from_description, render_file
from nuro.cluster.slurmconf import TOPOLOGY_NAME, render_slurm_conf, render_topology, topology_file
from nuro.devcluster.layout import Layout, describe
from nuro.jobspec.sbatch_args import SbatchArgError, parse_options
from nuro.jobspec.submission import requeue_args
from nuro.login.sbatch_cli import expedited_requeue
from nuro.policy.admission import parse_sbatch_args
from nuro.slurm import SlurmCommandNotFound
from nuro.slurm.models import SlurmVersion
from tests.unit.test_inventory import _flatten

NEW_KEYS = ("PrologTimeout=", "EpilogTimeout=", "SlurmctldParameters=enable_expedited_requeue", "MetricsType=")


@pytest.fixture
def desc(tmp_path: Path):
    return describe(Layout(tmp_path / "dc"), 2, 22800)


def _keys(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#")]


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_before_25_05_one_shared_hook_deadline_and_no_newer_key(desc, version: str) -> None:
    lines = _keys(render_slurm_conf(replace(desc, slurm_version=version)))
    assert "PrologEpilogTimeout=300" in lines
    assert not [line for line in lines if line.startswith(NEW_KEYS)], "24.11 dies parsing MetricsType (captured)"


def test_26_05_gets_separate_deadlines_expedited_requeue_and_openmetrics(desc) -> None:
    lines = _keys(render_slurm_conf(replace(desc, slurm_version="26.05")))
    assert {"PrologTimeout=300", "EpilogTimeout=300", "SlurmctldParameters=enable_expedited_requeue",
            "MetricsType=metrics/openmetrics"} <= set(lines)  # fmt: skip
    assert not [line for line in lines if line.startswith("PrologEpilogTimeout=")]


def test_the_default_is_22_05_and_a_bad_version_is_refused(desc) -> None:
    assert desc.slurm_version == "22.05" and desc.slurm_release == (22, 5)
    with pytest.raises(ValueError, match="slurm_version must look like 22.05, got '26'"):
        replace(desc, slurm_version="26")


class _Versioned:
    """The one Backend method requeue_args calls."""

    def __init__(self, version: SlurmVersion) -> None:
        self._version = version

    def version(self) -> SlurmVersion:
        return self._version


@pytest.mark.parametrize(
    ("version", "args"),
    [
        (SlurmVersion(22, 5, 8), []),
        (SlurmVersion(24, 11, 5), []),
        (SlurmVersion(25, 11, 0), ["--requeue=expedite"]),
        (SlurmVersion(26, 5, 5), ["--requeue=expedite"]),
    ],
)
def test_training_jobs_ask_for_expedited_requeue_where_slurm_has_it(version: SlurmVersion, args: list[str]) -> None:
    assert requeue_args(_Versioned(version)) == args  # type: ignore[arg-type]


def test_the_expedite_flag_is_a_requeue_to_the_preview_and_the_option_reader() -> None:
    """What nuro-sbatch puts before the user's words must parse like the requeue it is (26.05's sbatch takes
    ``--requeue[=expedite]``), in the admission preview and in the option reader."""
    assert parse_sbatch_args("alice", ["--requeue=expedite", "--gpus=1"]).requeue is True
    assert parse_sbatch_args("alice", ["--requeue=expedite", "--no-requeue"]).requeue is False  # the user's wins
    assert [(w.name, w.value) for w in parse_options(["--requeue=expedite", "--requeue"])] == [
        ("requeue", "expedite"), ("requeue", None)]  # fmt: skip
    with pytest.raises(SbatchArgError, match="--no-requeue takes no value"):
        parse_options(["--no-requeue=x"])


def test_nuro_sbatch_asks_slurm_and_adds_nothing_without_it() -> None:
    class _NoSlurm:
        def version(self) -> SlurmVersion:
            raise SlurmCommandNotFound("'sinfo' not found", argv=["sinfo"])

    assert expedited_requeue(_NoSlurm()) == []  # type: ignore[arg-type]
    assert expedited_requeue(_Versioned(SlurmVersion(26, 5, 5))) == ["--requeue=expedite"]  # type: ignore[arg-type]


# ---- topology: tree or block, topology.conf before 25.05 and topology.yaml from it ------------------------------


def test_topology_file_follows_the_release(desc) -> None:
    assert topology_file(replace(desc, slurm_version="24.11")) == "topology.conf"
    assert topology_file(replace(desc, slurm_version="26.05")) == "topology.yaml"


def test_yaml_tree_is_the_same_leaves_and_spine_as_topology_conf(tmp_path: Path) -> None:
    eight = describe(Layout(tmp_path / "dc8"), 8, 22800)
    conf = render_topology(replace(eight, slurm_version="24.11"))
    assert "SwitchName=leaf01 Nodes=gpu[001-004]" in conf
    doc = yaml.safe_load(render_topology(replace(eight, slurm_version="26.05")))
    assert doc == [{"topology": TOPOLOGY_NAME, "cluster_default": True, "tree": {"switches": [
        {"switch": "leaf01", "nodes": "gpu[001-004]"},
        {"switch": "leaf02", "nodes": "gpu[005-008]"},
        {"switch": "spine", "children": "leaf[01-02]"},
    ]}}]  # fmt: skip
    lines = _keys(render_slurm_conf(replace(eight, slurm_version="26.05")))
    assert not [line for line in lines if line.startswith("TopologyPlugin=")], "topology.yaml names the plugin"
    assert "TopologyPlugin=topology/tree" in _keys(render_slurm_conf(replace(eight, slurm_version="24.11")))


def test_block_topology_makes_the_leaves_blocks_with_doubling_sizes(tmp_path: Path) -> None:
    eight = describe(Layout(tmp_path / "dc8"), 8, 22800, slurm_version="26.05", topology="block")
    assert eight.effective_block_sizes == (4, 8)
    doc = yaml.safe_load(render_topology(eight))
    assert doc[0]["block"] == {"block_sizes": [4, 8], "blocks": [
        {"block": "leaf01", "nodes": "gpu[001-004]"}, {"block": "leaf02", "nodes": "gpu[005-008]"}]}  # fmt: skip
    conf = render_topology(replace(eight, slurm_version="24.11"))
    assert conf.splitlines()[1:] == ["BlockName=leaf01 Nodes=gpu[001-004]", "BlockName=leaf02 Nodes=gpu[005-008]",
                                     "BlockSizes=4,8"]  # fmt: skip
    assert "TopologyPlugin=topology/block" in _keys(render_slurm_conf(replace(eight, slurm_version="24.11")))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"slurm_version": "22.05"}, "topology=block needs Slurm 24.11 or newer"),
        ({"block_sizes": (8,)}, r"base block size must be 1\.\.4"),
        ({"block_sizes": (4, 12)}, "times a power of two"),
        ({"block_sizes": (2, 2)}, "times a power of two"),
        ({"topology": "fat-tree"}, "choose one of tree, block"),
    ],
)
def test_bad_topology_is_refused_with_what_to_fix(tmp_path: Path, changes: dict, message: str) -> None:
    base = describe(Layout(tmp_path / "dc8"), 8, 22800, slurm_version="26.05", topology="block")
    with pytest.raises(ValueError, match=message):
        replace(base, **changes)


def test_inventory_names_only_the_topology_file_the_release_reads(tmp_path: Path) -> None:
    block = describe(Layout(tmp_path / "dc8"), 8, 22800, slurm_version="26.05", topology="block")
    back = describe_inventory(*_flatten(inventory_from_description(block)))
    # the inventory carries no database settings (the site's slurmdbd.conf has them): the dev cluster's per-version
    # accounting database is the dev cluster's
    assert replace(back, db_password=block.db_password, db_name=block.db_name) == block
    assert render_file(back, "topology.yaml") == render_topology(block)
    with pytest.raises(InventoryError, match="its topology goes in topology.yaml"):
        render_file(back, "topology.conf")


def test_ansible_lookup_renders_the_release_and_topology_the_controller_names(tmp_path: Path) -> None:
    """The roles' lookup passes nuro_slurm_version/nuro_topology through (it dropped them before: every release
    rendered as 22.05), and names topology.yaml for 25.05+ as the role's nuro_topology_file does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "nuro_slurm_config", Path(__file__).resolve().parents[2] / "ansible/plugins/lookup/nuro_slurm_config.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    block = describe(Layout(tmp_path / "dc8"), 8, 22800, slurm_version="26.05", topology="block")
    hostvars, groups = _flatten(inventory_from_description(block))
    conf, topo = module.LookupModule().run(
        ["slurm.conf", "topology.yaml"], variables={"hostvars": hostvars, "groups": groups}
    )
    assert "SlurmctldParameters=enable_expedited_requeue" in conf
    assert topo == render_topology(block)

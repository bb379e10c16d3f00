"""nuro.cluster.inventory.parse_inventory_text: the one reader of inventory files (YAML and INI) outside Ansible.

``nuro-admin nodes`` reads SSH hosts through it; the same hostvars/groups feed ``describe_inventory``, so a file
the nodes tool reads describes the same cluster the Ansible lookup plugin renders.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from nuro.cluster.inventory import InventoryError, describe_inventory, inventory_from_description, parse_inventory_text
from nuro.devcluster.layout import Layout, describe


def test_yaml_nested_children_and_host_order() -> None:
    text = """
all:
  hosts:
    login1: {ansible_host: 10.0.0.9}
  children:
    gpu:
      hosts:
        gpu001: {ansible_host: 10.0.0.1}
        gpu002:
      children:
        rack2:
          hosts:
            gpu003: {nuro_slurm_node: n3}
"""
    hostvars, groups = parse_inventory_text(text)
    assert list(hostvars) == ["login1", "gpu001", "gpu002", "gpu003"]
    assert hostvars["gpu001"] == {"ansible_host": "10.0.0.1"} and hostvars["gpu002"] == {}
    assert groups["gpu"] == ["gpu001", "gpu002", "gpu003"] and groups["rack2"] == ["gpu003"]
    assert groups["all"] == ["login1", "gpu001", "gpu002", "gpu003"]


def test_ini_groups_and_vars() -> None:
    hostvars, groups = parse_inventory_text("# c\n[gpu]\ngpu001 ansible_host=10.0.0.1 ansible_port=2222\ngpu002\n")
    assert hostvars == {"gpu001": {"ansible_host": "10.0.0.1", "ansible_port": "2222"}, "gpu002": {}}
    assert groups == {"gpu": ["gpu001", "gpu002"], "all": ["gpu001", "gpu002"]}


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[gpu:vars]\nx=1\n", "section [gpu:vars] is not supported"),
        ("[gpu]\ngpu001 novalue\n", "expected key=value"),
        ("all: [unclosed\n", "neither INI"),
    ],
)
def test_malformed_inventory_is_refused(text: str, words: str) -> None:
    with pytest.raises(InventoryError, match=words.replace("[", r"\[")):
        parse_inventory_text(text)


def test_a_yaml_file_describes_the_cluster(tmp_path: Path) -> None:
    desc = describe(Layout(tmp_path), 4, 16800)
    back = describe_inventory(*parse_inventory_text(yaml.safe_dump(inventory_from_description(desc))))
    assert replace(back, db_password=desc.db_password) == desc

"""Ansible inventory ⇄ :class:`~nuro.cluster.description.ClusterDescription`: the inventory is the cluster's topology.

Why a pure module: the Ansible lookup plugin (``ansible/plugins/lookup/nuro_slurm_config.py``) only gathers the
inventory's ``hostvars`` and ``groups`` and calls :func:`describe_inventory`; the text then comes from
:mod:`nuro.cluster.slurmconf`, the same renderer the dev cluster uses. So there is no Jinja copy of slurm.conf that
could drift, and the mapping is unit-tested here without Ansible.

Inventory contract (variables are ordinary host or group vars; group vars are how a node group sets them once):

=========================  ============  =====================================================================
variable                   where         meaning / default
=========================  ============  =====================================================================
``nuro_gpu_count``         compute       GPUs per node (required, 0 for a CPU node)
``nuro_gpu_model``         compute       gres Type (``h100``); unset = untyped GPUs
``nuro_gpu_files``         compute       device files; default ``/dev/nvidia[0-N-1]``
``nuro_cpus``              compute       CPUs (default 16)
``nuro_memory_mb``         compute       RealMemory (default 64000)
``nuro_node_name``         compute       Slurm node name; default the inventory host name
``nuro_node_addr``         compute       NodeAddr; default ``ansible_host``, else the node name
``nuro_node_hostname``     compute       NodeHostname; unset = not written (name is the host name)
``nuro_slurmd_port``       compute       per-node slurmd port (only when several slurmd share a host)
``nuro_leaf_switch``       compute       leaf switch of topology/tree; default ``nuro_rack``
``nuro_spine_switch``      compute       switch above the leaf (default ``spine``)
``nuro_cluster_name``      controller    ClusterName (default ``nuro``)
``nuro_controller_*``      controller    ``hostname`` (default inventory name), ``addr`` (default ansible_host)
``nuro_slurm_paths``       controller    overrides of :class:`~nuro.cluster.description.Paths` fields
``nuro_slurm_ports``       controller    overrides of :class:`~nuro.cluster.description.Ports` fields
``nuro_slurm_timers``      controller    overrides of :class:`~nuro.cluster.description.Timers` (default: by node count)
``nuro_slurm_confinement`` controller    overrides of :class:`~nuro.cluster.description.Confinement` (cgroup.conf)
``nuro_slurm_user``        controller    SlurmUser (default ``slurm``); ``nuro_partition`` (default ``gpu``)
``nuro_slurm_version``     controller    the Slurm release installed (default ``22.05``): 25.05+ get PrologTimeout/
                                         EpilogTimeout, 25.11+ expedited requeue and OpenMetrics
``nuro_topology``          controller    ``tree`` (default; ``--switches``) or ``block`` (24.11+; ``--segment``,
                                         the leaves are the blocks); ``nuro_block_sizes``: BlockSizes list
=========================  ============  =====================================================================

Leaves are written in the order their first node appears; nodes are sorted by name so the output does not depend
on how the inventory is laid out. More than one spine gets a top switch (``nuro_topology_root``, default ``core``).

Outside Ansible (``nuro-admin nodes``), :func:`parse_inventory_text` reads an inventory file into the same
``hostvars``/``groups`` pair: the one parser of the YAML and INI forms.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace
from typing import Any

import yaml

from nuro.cluster import slurmconf
from nuro.cluster.description import ClusterDescription, Confinement, NodeSpec, Paths, Ports, Switch, Timers

COMPUTE_GROUP = "compute"
CONTROLLER_GROUP = "slurm_controller"

#: The node-level inventory variables :func:`describe_inventory` reads (anything else nuro_* is a role setting).
NODE_VARS = (
    "nuro_gpu_count", "nuro_gpu_model", "nuro_gpu_files", "nuro_cpus", "nuro_memory_mb", "nuro_node_name",
    "nuro_node_addr", "nuro_node_hostname", "nuro_slurmd_port", "nuro_leaf_switch", "nuro_rack", "nuro_spine_switch",
)  # fmt: skip


class InventoryError(ValueError):
    """The inventory cannot describe a cluster; the message names the host and the variable to set."""


def _natural_key(name: str) -> tuple:
    """gpu2 before gpu10: node names sort as people read them."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def _int(host: str, hv: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    value = hv.get(key, default)
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise InventoryError(f"host {host}: {key}={value!r} is not an integer") from None


def default_gpu_files(count: int) -> str:
    """``/dev/nvidia0`` for one GPU, ``/dev/nvidia[0-7]`` for eight."""
    return "/dev/nvidia0" if count == 1 else f"/dev/nvidia[0-{count - 1}]"


def node_from_hostvars(host: str, hv: Mapping[str, Any]) -> NodeSpec:
    """One compute host's :class:`NodeSpec`; ``nuro_gpu_count`` is required so a forgotten group var fails loudly."""
    if "nuro_gpu_count" not in hv:
        raise InventoryError(
            f"host {host}: nuro_gpu_count is not set; set it (0 for CPU nodes) in the vars of its node group"
        )
    gpus = _int(host, hv, "nuro_gpu_count") or 0
    name = str(hv.get("nuro_node_name") or host)
    model = hv.get("nuro_gpu_model")
    if model is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", str(model)):
        raise InventoryError(f"host {host}: nuro_gpu_model={model!r} must be a plain word such as h100")
    return NodeSpec(
        name=name,
        addr=str(hv.get("nuro_node_addr") or hv.get("ansible_host") or name),
        hostname=hv.get("nuro_node_hostname") or None,
        port=_int(host, hv, "nuro_slurmd_port"),
        cpus=_int(host, hv, "nuro_cpus", 16) or 16,
        memory_mb=_int(host, hv, "nuro_memory_mb", 64000) or 64000,
        gpus=gpus,
        gpu_files=str(hv.get("nuro_gpu_files") or default_gpu_files(max(gpus, 1))),
        gpu_type=str(model) if model else None,
    )


def switches_from_hostvars(
    nodes: Sequence[tuple[NodeSpec, Mapping[str, Any]]], root: str = "core"
) -> tuple[Switch, ...]:
    """topology/tree switches: leaves from ``nuro_leaf_switch`` (or ``nuro_rack``), spines above them.

    All compute hosts name a leaf or none does (then there is no topology.conf content): a half-described tree
    would make ``--switches=1`` place jobs on a leaf Slurm believes is complete.
    """
    leaves: dict[str, list[str]] = {}
    spines: dict[str, list[str]] = {}
    missing = []
    for node, hv in nodes:
        leaf = hv.get("nuro_leaf_switch") or hv.get("nuro_rack")
        if not leaf:
            missing.append(node.name)
            continue
        leaf = str(leaf)
        leaves.setdefault(leaf, []).append(node.name)
        spine = str(hv.get("nuro_spine_switch") or "spine")
        if leaf not in spines.setdefault(spine, []):
            spines[spine].append(leaf)
    if not leaves:
        return ()
    if missing:
        raise InventoryError(
            f"hosts without nuro_leaf_switch/nuro_rack: {', '.join(missing)}; every compute host needs one "
            "once any has one (set it on the rack's group)"
        )
    twice = sorted({leaf for leaf in leaves if sum(leaf in ls for ls in spines.values()) > 1})
    if twice:
        raise InventoryError(f"leaf switches under more than one spine: {', '.join(twice)}")
    out = [Switch(name=leaf, nodes=tuple(names)) for leaf, names in leaves.items()]
    out += [Switch(name=spine, switches=tuple(ls)) for spine, ls in spines.items()]
    if len(spines) > 1:
        out.append(Switch(name=root, switches=tuple(spines)))
    return tuple(out)


def _overrides(cls: type, given: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    given = dict(given or {})
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise InventoryError(f"{what}: unknown keys {', '.join(unknown)}; valid: {', '.join(sorted(known))}")
    return given


def describe_inventory(
    hostvars: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Sequence[str]]
) -> ClusterDescription:
    """The cluster an inventory describes: compute hosts → nodes and switches, the controller's vars → the rest.

    Args:
        hostvars: Ansible's ``hostvars`` (host → its merged variables).
        groups: Ansible's ``groups`` (group → host names); ``compute`` and ``slurm_controller`` are read.

    Raises:
        InventoryError: with the host and variable to fix.
    """
    controllers = list(groups.get(CONTROLLER_GROUP) or [])
    if not controllers:
        raise InventoryError(f"the inventory has no host in group {CONTROLLER_GROUP}; add the Slurm controller host")
    computes = list(groups.get(COMPUTE_GROUP) or [])
    if not computes:
        raise InventoryError(f"the inventory has no host in group {COMPUTE_GROUP}")
    ctl = controllers[0]
    cv = hostvars[ctl]
    pairs = sorted(
        ((node_from_hostvars(h, hostvars[h]), hostvars[h]) for h in computes), key=lambda p: _natural_key(p[0].name)
    )
    nodes = tuple(n for n, _ in pairs)
    timers_given = _overrides(Timers, cv.get("nuro_slurm_timers"), "nuro_slurm_timers")
    timers = replace(Timers.for_node_count(len(nodes)), **{k: int(v) for k, v in timers_given.items()})
    ports = Ports(**{k: int(v) for k, v in _overrides(Ports, cv.get("nuro_slurm_ports"), "nuro_slurm_ports").items()})
    paths = Paths(**{k: str(v) for k, v in _overrides(Paths, cv.get("nuro_slurm_paths"), "nuro_slurm_paths").items()})
    confinement_given = _overrides(Confinement, cv.get("nuro_slurm_confinement"), "nuro_slurm_confinement")
    try:
        return ClusterDescription(
            cluster_name=str(cv.get("nuro_cluster_name") or "nuro"),
            controller_host=str(cv.get("nuro_controller_hostname") or ctl),
            controller_addr=str(cv.get("nuro_controller_addr") or cv.get("ansible_host") or ctl),
            nodes=nodes,
            switches=switches_from_hostvars(pairs, str(cv.get("nuro_topology_root") or "core")),
            partition=str(cv.get("nuro_partition") or "gpu"),
            timers=timers,
            paths=paths,
            ports=ports,
            confinement=Confinement(**confinement_given),  # its own checks: plugin name, absolute mountpoint
            slurm_user=str(cv.get("nuro_slurm_user") or "slurm"),
            slurm_version=str(cv.get("nuro_slurm_version") or "22.05"),
            topology=str(cv.get("nuro_topology") or "tree"),
            block_sizes=tuple(int(n) for n in cv.get("nuro_block_sizes") or ()),
        )
    except ValueError as exc:  # the description's own checks (duplicate names, bad timers)
        raise InventoryError(f"the inventory describes an invalid cluster: {exc}") from exc


def inventory_from_description(desc: ClusterDescription, controller: str = "ctl") -> dict[str, Any]:
    """A YAML-ready inventory that :func:`describe_inventory` maps back to ``desc`` (slurm.conf byte for byte).

    Used to prove the Ansible path renders exactly what the dev cluster runs: build the inventory from the dev
    cluster's own description, render through the plugin, compare. Leaves and spines come back as host vars.
    """
    leaf_of = {n: sw.name for sw in desc.switches for n in sw.nodes}
    spine_of = {leaf: sw.name for sw in desc.switches for leaf in sw.switches}
    hosts: dict[str, dict[str, Any]] = {}
    for n in desc.nodes:
        hv: dict[str, Any] = {"nuro_gpu_count": n.gpus, "nuro_node_addr": n.addr, "nuro_cpus": n.cpus}
        hv["nuro_memory_mb"] = n.memory_mb
        hv["nuro_gpu_files"] = n.gpu_files
        for key, value in (
            ("nuro_node_hostname", n.hostname),
            ("nuro_slurmd_port", n.port),
            ("nuro_gpu_model", n.gpu_type),
            ("nuro_leaf_switch", leaf_of.get(n.name)),
            ("nuro_spine_switch", spine_of.get(leaf_of.get(n.name, ""))),
        ):
            if value is not None:
                hv[key] = value
        hosts[n.name] = hv
    controller_vars = {
        "nuro_cluster_name": desc.cluster_name,
        "nuro_controller_hostname": desc.controller_host,
        "nuro_controller_addr": desc.controller_addr,
        "nuro_partition": desc.partition,
        "nuro_slurm_user": desc.slurm_user,
        "nuro_slurm_version": desc.slurm_version,
        "nuro_topology": desc.topology,
        **({"nuro_block_sizes": list(desc.block_sizes)} if desc.block_sizes else {}),
        "nuro_slurm_paths": {f.name: v for f in fields(Paths) if (v := getattr(desc.paths, f.name)) is not None},
        "nuro_slurm_ports": {f.name: getattr(desc.ports, f.name) for f in fields(Ports)},
        "nuro_slurm_timers": {f.name: getattr(desc.timers, f.name) for f in fields(Timers)},
        "nuro_slurm_confinement": {f.name: getattr(desc.confinement, f.name) for f in fields(Confinement)},
    }
    return {
        "all": {
            "children": {
                CONTROLLER_GROUP: {"hosts": {controller: controller_vars}},
                COMPUTE_GROUP: {"hosts": hosts},
            }
        }
    }


#: topology.conf up to 24.11, topology.yaml from 25.05 (:func:`nuro.cluster.slurmconf.topology_file`): both are
#: named; asking for the one the version does not read is an error that names the right one.
RENDERED_FILES = ("slurm.conf", "cgroup.conf", "topology.conf", "topology.yaml", "gres.conf")


def render_file(desc: ClusterDescription, name: str) -> str:
    """One of :data:`RENDERED_FILES` through :mod:`nuro.cluster.slurmconf` (the dev cluster's renderer)."""
    renderers = {
        "slurm.conf": slurmconf.render_slurm_conf,
        "cgroup.conf": slurmconf.render_cgroup_conf,
        "topology.conf": slurmconf.render_topology,
        "topology.yaml": slurmconf.render_topology,
        "gres.conf": slurmconf.render_gres_conf,
    }
    if name not in renderers:
        raise InventoryError(f"unknown file {name!r}; nuro renders {', '.join(RENDERED_FILES)}")
    if name.startswith("topology.") and name != slurmconf.topology_file(desc):
        raise InventoryError(
            f"{name} is not read by Slurm {desc.slurm_version}: its topology goes in {slurmconf.topology_file(desc)}"
        )
    return renderers[name](desc)


# ---- inventory files (YAML or INI), for tools that run outside Ansible ----------------------------------------------


def parse_inventory_text(text: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """``(hostvars, groups)`` of an inventory file: YAML (``all: {hosts, children}``, nested children) or INI
    (``[group]`` lines, ``host key=value ...``). Hosts keep the order they first appear in; a group lists its own
    hosts and its children's. Group vars are not read (nodes tools need host vars only).

    Raises:
        InventoryError: the text is neither form, or an INI line is malformed or uses an unsupported section.
    """
    meaningful = [x.strip() for x in text.splitlines() if x.strip() and not x.strip().startswith(("#", ";"))]
    if not meaningful or meaningful[0].startswith("["):  # INI starts with a [group] header
        return _parse_ini(text)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InventoryError(f"inventory is neither INI ([group] lines) nor valid YAML: {exc}") from None
    if not isinstance(data, dict):
        return _parse_ini(text)
    hostvars: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[str]] = {}

    def walk(group: str, node: dict | None) -> list[str]:
        node = node or {}
        members: list[str] = []
        for hname, hv in (node.get("hosts") or {}).items():
            hostvars.setdefault(str(hname), {}).update(hv or {})
            members.append(str(hname))
        for child, sub in (node.get("children") or {}).items():
            members.extend(walk(str(child), sub))
        groups[group] = list(dict.fromkeys(groups.get(group, []) + members))
        return members

    for group, node in data.items():
        walk(str(group), node)
    return hostvars, groups


def _parse_ini(text: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    group = "ungrouped"
    hostvars: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[str]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith(";"):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1]
            if ":" in group:  # [g:vars] / [g:children] are not supported: say so rather than misread them
                raise InventoryError(f"inventory line {lineno}: section {line} is not supported; use the YAML form")
            continue
        words = shlex.split(line)
        hv: dict[str, str] = {}
        for word in words[1:]:
            if "=" not in word:
                raise InventoryError(f"inventory line {lineno}: expected key=value after the host name, got {word!r}")
            k, v = word.split("=", 1)
            hv[k] = v
        hostvars.setdefault(words[0], {}).update(hv)
        groups.setdefault(group, []).append(words[0])
        groups.setdefault("all", []).append(words[0])
    return hostvars, groups

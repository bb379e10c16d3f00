"""Lookup ``nuro_slurm_config``: slurm.conf / cgroup.conf / topology.conf / gres.conf / job_submit.lua, by nuro.

Why a lookup (run on the admin workstation) and not a Jinja template: the text comes from
``nuro.cluster.slurmconf``, the renderer the dev cluster runs and the golden tests pin, fed by
``nuro.cluster.inventory.describe_inventory`` over this inventory. Paired with ``ansible.builtin.copy: content=...``
it gets ``--check --diff`` and idempotence for free. The targets need nothing installed for it; the workstation runs
Ansible from a venv with nuro installed.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from ansible.errors import AnsibleError

from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: nuro_slurm_config
author: nuro
short_description: Render nuro's Slurm config files from the inventory
description:
  - Builds a nuro ClusterDescription from the inventory (groups C(compute) and C(slurm_controller) and
    their nuro_* variables) and renders the named file with nuro.cluster.slurmconf.
  - C(job_submit.lua) returns the job_submit bridge shipped in the installed nuro package.
options:
  _terms:
    description:
      - File names, C(slurm.conf), C(cgroup.conf), C(topology.conf), C(gres.conf), C(job_submit.lua), or
        C(hook_wrapper)
        (with the keywords entry_point= and env_file=), or C(slurmd_dropin) (with python=, the slurmd drop-in
        whose ExecStartPre clears the job-state cache of before a crash).
    required: true
"""

EXAMPLES = r"""
- name: Slurm config from the inventory
  ansible.builtin.copy:
    content: "{{ lookup('nuro_slurm_config', 'slurm.conf') }}"
    dest: /etc/slurm/slurm.conf
    mode: "0644"
"""

RETURN = r"""
_raw:
  description: The rendered file text, one per term.
  type: list
  elements: str
"""

CONTROLLER_KEYS = (
    "ansible_host", "nuro_cluster_name", "nuro_controller_hostname", "nuro_controller_addr", "nuro_partition",
    "nuro_slurm_user", "nuro_slurm_paths", "nuro_slurm_ports", "nuro_slurm_timers", "nuro_topology_root",
    "nuro_slurm_confinement", "nuro_slurm_version", "nuro_topology", "nuro_block_sizes",
)  # fmt: skip


def _plain(hostvars: Any, host: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """Only the variables the mapping reads, templated: hostvars are lazy and may hold vault values elsewhere."""
    hv = hostvars[host]
    out = {}
    for key in keys:
        if key in hv:
            out[key] = hv[key]
    return out


class LookupModule(LookupBase):
    """See DOCUMENTATION."""

    def run(self, terms: list[str], variables: dict[str, Any] | None = None, **kwargs: Any) -> list[str]:
        try:
            from nuro.cluster import inventory
        except ImportError as exc:
            raise AnsibleError(
                f"nuro_slurm_config needs the nuro package on the machine running ansible-playbook ({exc}); "
                "run Ansible from nuro's venv (.venv/bin/ansible-playbook)"
            ) from exc
        variables = variables or {}
        out = []
        desc = None
        for term in terms:
            # the dev cluster's own wrapper text (nuro.cluster.slurmconf.render_hook_wrapper)
            if term == "hook_wrapper":
                from nuro.cluster.slurmconf import render_hook_wrapper

                try:
                    out.append(render_hook_wrapper(kwargs["entry_point"], kwargs["env_file"]))
                except (KeyError, ValueError) as exc:
                    raise AnsibleError(
                        f"nuro_slurm_config hook_wrapper needs entry_point= and env_file=: {exc}"
                    ) from exc
                continue
            if term == "job_submit.lua":
                out.append(resources.files("nuro.slurm_plugins").joinpath("job_submit.lua").read_text())
                continue
            if desc is None:
                hostvars, groups = variables["hostvars"], variables["groups"]
                node_keys = (*inventory.NODE_VARS, "ansible_host")
                plain = {h: _plain(hostvars, h, node_keys) for h in groups.get(inventory.COMPUTE_GROUP, [])}
                for h in groups.get(inventory.CONTROLLER_GROUP, [])[:1]:
                    plain[h] = {**plain.get(h, {}), **_plain(hostvars, h, CONTROLLER_KEYS)}
                try:
                    desc = inventory.describe_inventory(plain, {k: list(v) for k, v in groups.items()})
                except inventory.InventoryError as exc:
                    raise AnsibleError(f"nuro_slurm_config: {exc}") from exc
            if term == "slurmd_dropin":
                from nuro.cluster.slurmconf import render_slurmd_dropin

                try:
                    out.append(render_slurmd_dropin(kwargs["python"], desc.paths.slurmd_spool))
                except (KeyError, ValueError) as exc:
                    raise AnsibleError(f"nuro_slurm_config slurmd_dropin needs python=: {exc}") from exc
                continue
            try:
                out.append(inventory.render_file(desc, term))
            except inventory.InventoryError as exc:
                raise AnsibleError(f"nuro_slurm_config: {exc}") from exc
        return out

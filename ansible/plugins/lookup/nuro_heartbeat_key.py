"""Lookup ``nuro_heartbeat_key``: a node's own heartbeat key, derived from the controller's master key by nuro.

Why: each node agent must hold only its own node's key (``nuro.protocol.heartbeat.node_key`` = HMAC-SHA256(master,
label ‖ node:<name>)), so a key read on one node cannot forge another node's beats; only the controller holds the
master. Jinja has no HMAC, and the derivation must be byte-identical to the controller's: hence nuro's own function,
run on the admin workstation like ``nuro_slurm_config``.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleError

from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: nuro_heartbeat_key
author: nuro
short_description: A node's heartbeat key derived from the master heartbeat key
description:
  - Returns nuro.protocol.heartbeat.node_key(master, node) for each node name given (64 hex characters).
options:
  _terms:
    description: Slurm node names.
    required: true
  master:
    description: The controller's master heartbeat key (the vault's nuro_heartbeat_key).
    required: true
"""

EXAMPLES = r"""
- name: This node's heartbeat key
  ansible.builtin.copy:
    content: "{{ lookup('nuro_heartbeat_key', inventory_hostname, master=nuro_heartbeat_key) }}"
    dest: /etc/nuro/heartbeat-node.key
    mode: "0600"
  no_log: true
"""


class LookupModule(LookupBase):
    def run(self, terms: list[Any], variables: dict | None = None, **kwargs: Any) -> list[str]:
        try:
            from nuro.protocol.heartbeat import BadHeartbeat, node_key
        except ImportError as exc:  # the workstation's Ansible must run from a venv with nuro installed
            raise AnsibleError(f"nuro_heartbeat_key needs the nuro package on the Ansible controller: {exc}") from exc
        master = str(kwargs.get("master") or "").strip().encode()
        if len(master) < 16:
            raise AnsibleError("nuro_heartbeat_key: master= must be the master heartbeat key (16 bytes or more)")
        try:
            return [node_key(master, str(t)).decode() for t in terms]
        except BadHeartbeat as exc:
            raise AnsibleError(f"nuro_heartbeat_key: {exc}") from exc

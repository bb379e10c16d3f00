"""The admission preview for ``--dry-run``: what job_submit.lua will decide, from the same policy table.

The bridge reads ``nuro_policy.lua`` beside slurm.conf. That file is Lua; the preview instead builds the same table
from the teams.yaml it was generated from (``--policy PATH`` or ``NURO_POLICY``) with
``nuro.policy.luatable.policy_table`` and runs ``nuro.policy.admission.decide`` on it: one rule set, one data file
(architecture principle 5). When the Lua table beside ``$SLURM_CONF`` is readable, the preview takes the cluster
facts ``policy apply`` read from Slurm (leaf size, GPUs per node, the topology hint: ``CLUSTER_FACTS``) from it, and
its ``digest`` line is compared with the preview's, so a stale teams.yaml is reported instead of silently previewing
another policy.

The preview reads the job the way sbatch sends it: the script's ``#SBATCH`` lines first, then the command line
(later wins). ``SBATCH_*`` input environment variables are not read (documented limitation).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nuro.jobspec.sbatch_args import Word, admission_args
from nuro.protocol.envnames import NURO_POLICY

_LUA_DIGEST = re.compile(r'^\s*digest = "(sha256:[0-9a-f]{64})",\s*$', re.MULTILINE)
#: The table's top-level cluster facts → ``nuro.policy.luatable.policy_table``'s keyword for each; the table is
#: rendered two spaces deep at the top level, one key per line.
CLUSTER_FACTS = {"leaf_nodes": "leaf_size", "gpus_per_node": "gpus_per_node", "switch_wait_s": "switch_wait_s",
                 "topology_hint": "hint"}  # fmt: skip
_LUA_FACT = re.compile(r"^  (" + "|".join(CLUSTER_FACTS) + r') = (?:(\d+)|"(switches|segment|none)"),$', re.MULTILINE)


@dataclass(frozen=True)
class PolicySource:
    """A policy table for the preview, where it came from, and whether it matches the bridge's table."""

    table: Mapping[str, Any]
    path: str
    bridge_digest: str | None

    @property
    def digest(self) -> str:
        return str(self.table["digest"])

    @property
    def matches_bridge(self) -> bool | None:
        """True/False when the bridge's table was readable, None when it was not."""
        return None if self.bridge_digest is None else self.bridge_digest == self.digest


class PreviewError(ValueError):
    """The policy cannot be loaded for the preview."""


@dataclass(frozen=True)
class BridgeTable:
    """What the preview reads from the bridge's ``nuro_policy.lua``: its digest and the cluster facts in it
    (``policy_table`` keyword → value; only those found)."""

    digest: str | None
    facts: Mapping[str, Any]


def read_bridge_table(env: Mapping[str, str] | None = None) -> BridgeTable | None:
    """The ``nuro_policy.lua`` beside ``$SLURM_CONF`` (digest and cluster facts), or None when unreadable."""
    from nuro.policy.luatable import TABLE_FILE  # lazy: nuro.policy loads pydantic (~0.25 s); only previews need it

    conf = (env if env is not None else os.environ).get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    try:
        text = (Path(conf).resolve().parent / TABLE_FILE).read_text(errors="replace")
    except OSError:
        return None
    m = _LUA_DIGEST.search(text)
    facts: dict[str, Any] = {
        CLUSTER_FACTS[key]: int(number) if number else word for key, number, word in _LUA_FACT.findall(text)
    }
    return BridgeTable(digest=m.group(1) if m else None, facts=facts)


def load_policy_source(path: str | None, env: Mapping[str, str] | None = None) -> PolicySource | None:
    """The preview's policy: ``path``, else ``$NURO_POLICY``, else None (no preview).

    Raises:
        PreviewError: the file is missing or invalid.
    """
    env = env if env is not None else os.environ
    chosen = path or env.get(NURO_POLICY)
    if not chosen:
        return None
    # lazy: nuro.policy loads pydantic (~0.25 s); nuro-sbatch without a policy (its plain path) must start fast
    from nuro.policy.luatable import policy_table
    from nuro.policy.model import PolicyError, load_policy

    try:
        policy = load_policy(chosen)
    except (OSError, PolicyError) as exc:
        raise PreviewError(f"cannot load the policy {chosen} for the preview: {exc}") from exc
    bridge = read_bridge_table(env)
    facts = bridge.facts if bridge is not None else {}
    return PolicySource(
        table=policy_table(policy, **facts), path=chosen, bridge_digest=None if bridge is None else bridge.digest
    )


def user_team(source: PolicySource | None, user: str) -> str | None:
    """The user's team in the policy (None without a policy or for a user in no team)."""
    return None if source is None else source.table["users"].get(user)


def decide_words(words: Sequence[Word], user: str, source: PolicySource) -> Any:
    """``nuro.policy.admission.decide`` for the job these option words describe.

    Returns:
        The Admission; raises ValueError (from the admission parser) for values it cannot read.
    """
    from nuro.policy.admission import decide, parse_sbatch_args  # lazy: pydantic (~0.25 s), only with a policy

    return decide(parse_sbatch_args(user, admission_args(words)), source.table)


def describe(admission: Any, source: PolicySource, user: str | None = None) -> list[str]:
    """Human lines for an Admission (the same words the bridge would log or show)."""
    from nuro.policy.admission import ROOT_USER  # lazy: pydantic (~0.25 s), only with a policy

    head = f"bridge preview (policy {source.path}, table {source.digest[:19]}):"
    if user == ROOT_USER:
        return [f"{head} accept: root is let through unjudged (submit as the team member to see their decision)"]
    lines = []
    if source.matches_bridge is False:
        bridge = (source.bridge_digest or "?")[:19]
        lines.append(
            f"warning: the bridge's table beside $SLURM_CONF is {bridge}, not this policy's {source.digest[:19]}: "
            "run `nuro-admin policy apply` or point --policy at the applied teams.yaml"
        )
    if admission.accepted:
        changes = ", ".join(admission.changes) or "nothing"
        lines.append(
            f"{head} accept: team {admission.team or '-'}, {admission.gpus} GPU(s), qos {admission.qos or '(default)'}"
            f", account {admission.account or '(default)'}; the bridge sets: {changes}"
        )
    else:
        lines.append(f"{head} REJECT ({admission.code}, rule {admission.reason}): {admission.message}")
    return lines


def admission_dict(admission: Any) -> dict[str, Any]:
    """An Admission as JSON-able data (``--json``)."""
    return {
        "accepted": admission.accepted,
        "team": admission.team,
        "gpus": admission.gpus,
        "qos": admission.qos,
        "account": admission.account,
        "requeue": admission.requeue,
        "switches": admission.switches,
        "switch_wait_s": admission.switch_wait_s,
        "changes": list(admission.changes),
        "reason": admission.reason.value if admission.reason else None,
        "code": admission.code,
        "message": admission.message,
    }


__all__ = [
    "PolicySource",
    "PreviewError",
    "admission_dict",
    "BridgeTable",
    "read_bridge_table",
    "decide_words",
    "describe",
    "load_policy_source",
    "user_team",
]

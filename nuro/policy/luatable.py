"""The job_submit policy table: one generated data file that drives both admission implementations.

``policy_table(policy)`` builds the table as plain data (dicts, str, int, bool); ``render_lua_table(policy)`` writes
the same data as a Lua 5.1 chunk (``return { ... }``) that ``slurm_plugins/job_submit.lua`` reads with ``dofile``
on every submission, and ``nuro.policy.admission.decide`` reads the dict directly (architecture principle 5: one
implementation per rule, two languages, one data file, shared test vectors).

The user-facing rejection messages and their ``ESLURM_*`` codes live here too, in ``RULES``, so the Lua bridge and the
Python preview cannot drift apart on wording: both format the same template with the same arguments.

Table layout (``format`` = 1; job_submit.lua refuses to use any other format and lets jobs through unchanged):

| key | value |
|---|---|
| ``format`` | ``TABLE_FORMAT``; bump it on any incompatible change of this layout |
| ``digest`` | ``sha256:<hex>`` of the canonical JSON of everything else: which policy judged a job (logged) |
| ``cluster_gpus``, ``grace_s`` | from teams.yaml |
| ``leaf_nodes``, ``gpus_per_node``, ``leaf_gpus`` | leaf-switch capacity (topology/tree) |
| ``switch_wait_s`` | the wait bound of the ``--switches=1`` hint (``job_desc.wait4switch``) |
| ``topology_hint`` | how a job of 2..leaf_nodes nodes is kept in one leaf (``topology_hint``) |
| ``users`` | user name → team name |
| ``teams`` | team → ``quota_gpus``, ``borrow_limit_gpus``, ``max_gpus`` (sum), ``guaranteed_qos``, ``borrow_qos`` |
| ``qos_team`` | QOS name (``g-<team>``, ``b-<team>``) → team: O(1) "whose QOS is this" |
| ``tiers`` | tier QOS → ``accounts`` (set), ``users`` (set), ``who`` (the allowed list as text, for messages) |
| ``require_pinning`` | bool: team GPU jobs must carry a pinned nuro record in the comment |
| ``pin_fields`` | nuro record field → what a valid value looks like (the ``pin_invalid`` message names both) |
| ``rules`` | rule → ``code`` (a ``slurm.ESLURM_*`` constant's name), ``message`` (a ``string.format`` template) |

Deterministic: maps are emitted in sorted key order, so the same teams.yaml always renders the same bytes (golden
tested in ``tests/unit/test_admission.py``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from nuro.policy.model import Policy

#: The file name job_submit.lua looks for, beside itself (= beside slurm.conf).
TABLE_FILE = "nuro_policy.lua"
TABLE_FORMAT = 1
#: How long a job with the automatic ``--switches=1`` hint waits for a single leaf before Slurm places it anyway.
DEFAULT_SWITCH_WAIT_S = 60
#: The topology hints the bridge can add (see ``topology_hint``).
TOPOLOGY_HINTS = ("switches", "segment", "none")
#: The first Slurm whose job_submit/lua can set ``job_desc.segment_size`` (CHANGELOG/slurm-25.11.md, 25.11.2:
#: "job_submit/lua - Expose the job_desc's segment_size in lua"; 24.11's plugin has no such field).
LUA_SEGMENT_SINCE = (25, 11, 2)


def topology_hint(kind: str, version: tuple[int, ...]) -> str:
    """Which hint keeps a small gang in one leaf on this cluster: ``kind`` is ``scontrol show topology``'s
    (``tree``, ``block`` or ``none``; ``nuro.slurm.parse_text.topology_kind``), ``version`` Slurm's (major, minor,
    micro).

    Why not ``--switches`` everywhere: topology/block ignores it (its placement knows only segments), so on a block
    cluster the old hint promised a single leaf and gave none.
    """
    if kind == "tree":
        return "switches"
    if kind == "block" and tuple(version) >= LUA_SEGMENT_SINCE:
        return "segment"
    return "none"


#: Rule name → (Slurm error code constant, message template). Codes are constants the 22.05 Lua plugin exports
#: (src/lua/slurm_lua.c: ESLURM_ACCESS_DENIED, ESLURM_ACCOUNTING_POLICY, ESLURM_INVALID_ACCOUNT, ...); there is no
#: ESLURM_INVALID_QOS among them. Templates take only %s/%d so Python's ``%`` and Lua's ``string.format`` agree.
RULES: dict[str, tuple[str, str]] = {
    "account_other_team": (
        "ESLURM_INVALID_ACCOUNT",
        "nuro: user %s belongs to team %s, not %s. Drop --account or use --account=%s.",
    ),
    "qos_other_team": (
        "ESLURM_ACCESS_DENIED",
        "nuro: QOS %s belongs to team %s, not to this job's team %s. Drop --qos (team %s defaults to %s).",
    ),
    "qos_no_team": (
        "ESLURM_ACCESS_DENIED",
        "nuro: QOS %s belongs to team %s and user %s is not in it. "
        "Drop --qos, or ask an admin to add %s to team %s in teams.yaml.",
    ),
    "qos_borrow": (
        "ESLURM_ACCESS_DENIED",
        "nuro: QOS %s is team %s's borrowing QOS: only the nuro controller moves jobs there, within the teams' "
        "lending limits. Submit with the default QOS (drop --qos; team %s defaults to %s): when the quota is full "
        "the controller lends the job idle GPUs.",
    ),
    "tier_denied": (
        "ESLURM_ACCESS_DENIED",
        "nuro: QOS %s is only for %s; user %s (%s) may not use it. "
        "Drop --qos=%s, or ask an admin to allow you under tiers.%s in teams.yaml.",
    ),
    "gpu_cap": (
        "ESLURM_ACCOUNTING_POLICY",
        "nuro: team %s may use at most %d GPUs (quota %d + borrow %d); this job asks %d. "
        "Ask for fewer GPUs (--gpus-per-node / --nodes).",
    ),
    "comment_not_canonical": (
        "ESLURM_ACCESS_DENIED",
        "nuro: the job comment looks like a nuro record but is not in the exact form nuro writes (%s), so no nuro "
        "component would read it. Resubmit with 'nuro-train submit SPEC.yaml' or nuro-sbatch (they write the "
        'record), or use a plain-text comment that does not start with { or contain "nuro":.',
    ),
    "preempt_forged": (
        "ESLURM_ACCESS_DENIED",
        "nuro: only the nuro controller writes the preempt key of a job comment; a submission may not carry one and "
        "an update may not add, change or remove it. Drop the preempt key (nuro-job ack / ckpt update the comment "
        "safely).",
    ),
    "pin_changed": (
        "ESLURM_ACCESS_DENIED",
        "nuro: the nuro record in a job's comment (dataset, code, run settings) cannot be changed or removed after "
        "submit; update only the other comment keys (ckpt, preempt, ack, refused), or cancel and resubmit.",
    ),
    "pin_invalid": (
        "ESLURM_ACCESS_DENIED",
        "nuro: the nuro record in the job comment has no valid %s: it must be %s. Jobs record immutable references "
        "only. Submit with 'nuro-train submit SPEC.yaml' or nuro-sbatch --team %s --dataset NAME@sha256:<digest> "
        "--code REPO@COMMIT (a tag is resolved to its digest at submit); do not write the nuro record by hand.",
    ),
    "pin_team": (
        "ESLURM_INVALID_ACCOUNT",
        "nuro: the nuro record in the job comment is for team %s, but the job is charged to %s. "
        "Submit for one team: nuro-sbatch --team %s (it sets --account too), or drop --account.",
    ),
    "pin_required": (
        "ESLURM_ACCESS_DENIED",
        "nuro: team jobs that use GPUs must pin a dataset snapshot and a code commit (team %s). "
        "Submit with 'nuro-train submit SPEC.yaml', or use nuro-sbatch instead of sbatch and add: "
        "--team %s --dataset NAME@sha256:<digest> --code REPO@COMMIT (NAME@TAG is resolved to its digest).",
    ),
}

#: nuro record field → what a valid value is; the ``pin_invalid`` message says "has no valid <field>: it must be
#: <text>". Checked in this order, the first bad one is named (job_submit.lua ``read_nuro``, admission.read_nuro).
PIN_FIELDS: dict[str, str] = {
    "nuro": "one JSON object under the comment's top-level key nuro, in the compact form nuro-train/nuro-sbatch write",
    "nuro.dataset": 'exactly {"digest":...,"name":...} (compact, sorted keys)',
    "nuro.dataset.digest": "sha256: and 64 lower-case hex digits (a digest, not a tag such as latest)",
    "nuro.dataset.name": "a dataset name: 1-63 of a-z 0-9 . _ - starting with a letter or digit",
    "nuro.code.commit": "a full 40-digit lower-case hex commit id (not a branch, a tag or a short id)",
    "nuro.team": "a team name",
}

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LUA_KEYWORDS = frozenset(
    {"and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local", "nil", "not",
     "or", "repeat", "return", "then", "true", "until", "while"}
)  # fmt: skip


def _who(accounts: tuple[str, ...], users: tuple[str, ...]) -> str:
    parts = []
    if accounts:
        parts.append("accounts " + ", ".join(sorted(accounts)))
    if users:
        parts.append("users " + ", ".join(sorted(users)))
    return " and ".join(parts)


def cluster_facts(
    node_switches: Sequence[str | None], gpus_per_node: Sequence[int], kind: str, version: tuple[int, ...]
) -> dict[str, Any]:
    """``policy_table``'s cluster keyword arguments from what Slurm says (pure; ``policy apply`` reads the inputs).

    Args:
        node_switches: each node's leaf switch or base block (None: in no leaf).
        gpus_per_node: each node's configured GPUs.
        kind: ``tree``, ``block`` or ``none`` (``nuro.slurm.parse_text.topology_kind``).
        version: Slurm's (major, minor, micro).

    Returns:
        ``leaf_size`` (the largest leaf, 1 without any: then no job gets a hint), ``gpus_per_node`` (the most any
        node has, at least 1) and ``hint`` (``topology_hint``).
    """
    leaves = Counter(switch for switch in node_switches if switch)
    return {
        "leaf_size": max(leaves.values(), default=1),
        "gpus_per_node": max(max(gpus_per_node, default=0), 1),
        "hint": topology_hint(kind, version) if leaves else "none",
    }


def policy_table(
    policy: Policy,
    leaf_size: int = 4,
    gpus_per_node: int = 8,
    switch_wait_s: int = DEFAULT_SWITCH_WAIT_S,
    hint: str = "switches",
) -> dict[str, Any]:
    """The policy table as plain data: exactly what ``render_lua_table`` writes and ``decide`` reads.

    Args:
        policy: the validated teams.yaml.
        leaf_size: nodes per leaf switch (topology/tree); a job on at most this many nodes gets the switch hint.
        gpus_per_node: GPUs per node (only recorded: leaf capacity in GPUs).
        switch_wait_s: seconds a hinted job waits for one leaf before Slurm places it across leaves.
        hint: the topology hint (``topology_hint``): ``switches``, ``segment`` or ``none``.

    Raises:
        ValueError: a non-positive leaf_size, gpus_per_node or switch_wait_s, or an unknown hint.
    """
    if hint not in TOPOLOGY_HINTS:
        raise ValueError(f"hint must be one of {TOPOLOGY_HINTS}, got {hint!r}")
    for name, value in (("leaf_size", leaf_size), ("gpus_per_node", gpus_per_node), ("switch_wait_s", switch_wait_s)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    users = {user: team.name for team in policy.teams for user in team.members}
    teams = {
        t.name: {
            "quota_gpus": t.quota_gpus,
            "borrow_limit_gpus": t.borrow_limit_gpus,
            "max_gpus": t.quota_gpus + t.borrow_limit_gpus,
            "guaranteed_qos": t.guaranteed_qos,
            "borrow_qos": t.borrow_qos,
        }
        for t in policy.teams
    }
    qos_team = {}
    for t in policy.teams:
        qos_team[t.guaranteed_qos] = t.name
        qos_team[t.borrow_qos] = t.name
    tiers = {
        tier.name: {
            "accounts": dict.fromkeys(sorted(tier.allowed_accounts), True),
            "users": dict.fromkeys(sorted(tier.allowed_users), True),
            "who": _who(tier.allowed_accounts, tier.allowed_users),
        }
        for tier in policy.tiers
    }
    body: dict[str, Any] = {
        "format": TABLE_FORMAT,
        "cluster_gpus": policy.cluster_gpus,
        "grace_s": policy.grace_s,
        "leaf_nodes": leaf_size,
        "gpus_per_node": gpus_per_node,
        "leaf_gpus": leaf_size * gpus_per_node,
        "switch_wait_s": switch_wait_s,
        "topology_hint": hint,
        "users": dict(sorted(users.items())),
        "teams": dict(sorted(teams.items())),
        "qos_team": dict(sorted(qos_team.items())),
        "tiers": dict(sorted(tiers.items())),
        "require_pinning": policy.require_pinning,
        "pin_fields": dict(sorted(PIN_FIELDS.items())),
        "rules": {name: {"code": code, "message": message} for name, (code, message) in sorted(RULES.items())},
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return {"format": TABLE_FORMAT, "digest": "sha256:" + hashlib.sha256(canonical).hexdigest(), **body}


def lua_string(text: str) -> str:
    """A Lua 5.1 string literal for ``text``: printable ASCII as is, everything else as 3-digit ``\\ddd`` bytes."""
    out = ['"']
    for byte in text.encode("utf-8"):
        ch = chr(byte)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= byte < 127:
            out.append(ch)
        else:
            out.append(f"\\{byte:03d}")  # always 3 digits: a following digit cannot extend the escape
    out.append('"')
    return "".join(out)


def _lua_key(key: str) -> str:
    if _IDENT.match(key) and key not in _LUA_KEYWORDS:
        return key
    return f"[{lua_string(key)}]"


def _lua_value(value: Any, indent: int) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, dict):
        if not value:
            return "{}"
        pad = "  " * (indent + 1)
        lines = [f"{pad}{_lua_key(str(k))} = {_lua_value(v, indent + 1)}," for k, v in value.items()]
        return "{\n" + "\n".join(lines) + "\n" + "  " * indent + "}"
    raise TypeError(f"cannot render {type(value).__name__} into the Lua policy table: {value!r}")


def render_lua_table(
    policy: Policy,
    leaf_size: int = 4,
    gpus_per_node: int = 8,
    switch_wait_s: int = DEFAULT_SWITCH_WAIT_S,
    hint: str = "switches",
) -> str:
    """The Lua 5.1 chunk for ``nuro_policy.lua`` (see the module docstring for the layout).

    Write it atomically (temp file + ``os.replace``) beside slurm.conf: job_submit.lua re-reads it on every
    submission, so a half-written file would be seen.
    """
    table = policy_table(policy, leaf_size, gpus_per_node, switch_wait_s, hint)
    header = (
        "-- nuro job_submit policy table. Generated by nuro.policy.luatable from teams.yaml: do not edit,\n"
        "-- run `nuro-admin policy apply`. job_submit.lua reads it with dofile on every submission (Lua 5.1);\n"
        "-- nuro.policy.admission (the Python preview) uses the same data.\n"
    )
    return header + "return " + _lua_value(table, 0) + "\n"


__all__ = [
    "DEFAULT_SWITCH_WAIT_S",
    "LUA_SEGMENT_SINCE",
    "PIN_FIELDS",
    "RULES",
    "TABLE_FILE",
    "TABLE_FORMAT",
    "TOPOLOGY_HINTS",
    "cluster_facts",
    "lua_string",
    "policy_table",
    "topology_hint",
    "render_lua_table",
]

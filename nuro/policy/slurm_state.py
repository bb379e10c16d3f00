"""The accounting state a team policy maps onto: QOS, accounts, associations and users, as sacctmgr reports them.

Why one value type for both sides: ``desired_state(policy)`` (in ``nuro.policy.plan``) builds a ``SlurmState`` from
teams.yaml and ``read_state(backend)`` builds one from slurmdbd, so the planner compares like with like and is a pure
function of two values. Reading uses ``sacctmgr -P -n show ... format=...`` because 22.05's sacctmgr has no JSON;
the rows are split by the adapter's one parser (``parse_sacctmgr_parsable``).

Normalisation, so that a value read back equals the value written (else a second apply would never be empty):

| field | as written | as read back (22.05) | stored as |
|---|---|---|---|
| Description, Organization | any case | lower-cased by sacctmgr | lower case |
| GraceTime | seconds (``GraceTime=60``) | ``00:01:00`` | int seconds |
| PreemptExemptTime | ``00:02:00``, ``1-00:00:00`` (``slurm_duration``) | the same; ``""`` if unset | seconds / None |
| PreemptMode | ``requeue`` | ``requeue`` / ``cluster`` (unset) | lower case |
| GrpTRES | ``gres/gpu=24`` | ``gres/gpu=24`` (several: sorted, comma-separated) | sorted (key, value) pairs |
| QOS list | ``QOS=b-x,g-x`` | ``b-x,g-x`` (sorted; inherited lists look the same) | frozenset |
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from nuro.policy.luatable import cluster_facts
from nuro.slurm import CliReads
from nuro.slurm._fields import tres_to_dict
from nuro.slurm.parse_text import parse_sacctmgr_parsable, parse_slurm_duration_s

log = logging.getLogger(__name__)

#: Marks what nuro manages: accounts carry it as Organization, QOS start their Description with it. Anything
#: without the mark (root, normal, other tools' accounts) is never modified or removed.
MANAGED_MARK = "nuro-policy"

QOS_FIELDS = ("Name", "Priority", "GraceTime", "Preempt", "PreemptMode", "GrpTRES", "PreemptExemptTime", "Description")
ACCOUNT_FIELDS = ("Account", "Organization", "Description")
ASSOC_FIELDS = ("Cluster", "Account", "User", "Partition", "Fairshare", "QOS", "DefaultQOS")
USER_FIELDS = ("User", "DefaultAccount")

#: The read commands, in the order ``read_state`` runs them (Description last: it is the only free-text field).
READ_ARGVS: Mapping[str, tuple[str, ...]] = {
    "qos": ("sacctmgr", "-P", "-n", "show", "qos", "format=" + ",".join(QOS_FIELDS)),
    "account": ("sacctmgr", "-P", "-n", "show", "account", "format=" + ",".join(ACCOUNT_FIELDS)),
    "assoc": ("sacctmgr", "-P", "-n", "show", "assoc", "format=" + ",".join(ASSOC_FIELDS)),
    "user": ("sacctmgr", "-P", "-n", "show", "user", "format=" + ",".join(USER_FIELDS)),
}

Tres = tuple[tuple[str, str], ...]


def tres_pairs(text: str) -> Tres:
    """ "cpu=10,gres/gpu=8" → (("cpu", "10"), ("gres/gpu", "8")), sorted so equal limits compare equal."""
    return tuple(sorted(tres_to_dict(text).items()))


def tres_text(pairs: Tres) -> str:
    """The sacctmgr spelling of a TRES limit ("" when there is none)."""
    return ",".join(f"{k}={v}" for k, v in pairs)


def slurm_duration(seconds: int | None) -> str:
    """Seconds → the ``[D-]HH:MM:SS`` that sacctmgr 22.05 prints back (``""`` for unset), so that what nuro writes
    reads back identically and a second apply plans nothing (120 → "00:02:00", 86400 → "1-00:00:00")."""
    if seconds is None:
        return ""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    clock = f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


@dataclass(frozen=True)
class QosState:
    """One QOS. Defaults are Slurm's values for an unset field, so a desired QOS only names what it sets."""

    name: str
    description: str = ""
    priority: int = 0
    grace_s: int = 0
    preempt: frozenset[str] = frozenset()
    preempt_mode: str = "cluster"
    grp_tres: Tres = ()
    #: ``PreemptExemptTime`` in seconds; None = unset (Slurm then falls back to the global slurm.conf value).
    preempt_exempt_s: int | None = None

    @property
    def is_managed(self) -> bool:
        return self.description.lower().startswith(MANAGED_MARK)


@dataclass(frozen=True)
class AccountState:
    """An account and its account-level association (``User`` empty, no partition)."""

    name: str
    description: str = ""
    organization: str = ""
    fairshare: str = "1"
    qos: frozenset[str] = frozenset()
    default_qos: str = ""

    @property
    def is_managed(self) -> bool:
        return self.organization.lower() == MANAGED_MARK


@dataclass(frozen=True)
class AssocState:
    """A user's association with one account (cluster-wide, no partition)."""

    user: str
    account: str
    qos: frozenset[str] = frozenset()
    default_qos: str = ""


@dataclass(frozen=True)
class UserState:
    name: str
    default_account: str = ""


@dataclass(frozen=True)
class SlurmState:
    """QOS, accounts, user associations and users, keyed by name ((user, account) for associations)."""

    qos: Mapping[str, QosState] = field(default_factory=dict)
    accounts: Mapping[str, AccountState] = field(default_factory=dict)
    assocs: Mapping[tuple[str, str], AssocState] = field(default_factory=dict)
    users: Mapping[str, UserState] = field(default_factory=dict)

    def assocs_of_user(self, user: str) -> list[AssocState]:
        return [a for (u, _), a in sorted(self.assocs.items()) if u == user]

    def assocs_in_account(self, account: str) -> list[AssocState]:
        return [a for (_, acct), a in sorted(self.assocs.items()) if acct == account]

    @property
    def managed_accounts(self) -> list[AccountState]:
        return [a for _, a in sorted(self.accounts.items()) if a.is_managed]

    @property
    def managed_qos(self) -> list[QosState]:
        return [q for _, q in sorted(self.qos.items()) if q.is_managed]


def _qos_set(text: str) -> frozenset[str]:
    return frozenset(q.strip() for q in text.split(",") if q.strip())


def parse_state(qos_text: str, account_text: str, assoc_text: str, user_text: str) -> SlurmState:
    """Build a ``SlurmState`` from the stdout of the four ``READ_ARGVS`` commands (pure; used with fixtures).

    Partition-specific associations are skipped with a warning: nuro writes none, and the policy cannot express
    them. Raises ``SlurmParseError`` if a line does not have the expected number of fields (e.g. a '|' inside
    some other tool's Description, which ``-P`` output cannot escape).
    """
    qos = {}
    for row in parse_sacctmgr_parsable(qos_text, QOS_FIELDS):
        qos[row["Name"]] = QosState(
            name=row["Name"],
            description=row["Description"].lower(),
            priority=int(row["Priority"] or 0),
            grace_s=parse_slurm_duration_s(row["GraceTime"]) or 0,
            preempt=_qos_set(row["Preempt"]),
            preempt_mode=(row["PreemptMode"] or "cluster").lower(),
            grp_tres=tres_pairs(row["GrpTRES"]),
            preempt_exempt_s=parse_slurm_duration_s(row["PreemptExemptTime"]),
        )
    org = {r["Account"]: r for r in parse_sacctmgr_parsable(account_text, ACCOUNT_FIELDS)}
    accounts: dict[str, AccountState] = {}
    assocs: dict[tuple[str, str], AssocState] = {}
    for row in parse_sacctmgr_parsable(assoc_text, ASSOC_FIELDS):
        if row["Partition"]:
            log.warning(
                "skipping partition association account=%s user=%s partition=%s: nuro policy does not manage them",
                row["Account"],
                row["User"],
                row["Partition"],
            )
            continue
        qos_list, default_qos = _qos_set(row["QOS"]), row["DefaultQOS"]
        if not row["User"]:
            meta = org.get(row["Account"], {})
            accounts[row["Account"]] = AccountState(
                name=row["Account"],
                description=meta.get("Description", "").lower(),
                organization=meta.get("Organization", "").lower(),
                fairshare=row["Fairshare"],
                qos=qos_list,
                default_qos=default_qos,
            )
        else:
            key = (row["User"], row["Account"])
            assocs[key] = AssocState(user=row["User"], account=row["Account"], qos=qos_list, default_qos=default_qos)
    users = {
        r["User"]: UserState(name=r["User"], default_account=r["DefaultAccount"])
        for r in parse_sacctmgr_parsable(user_text, USER_FIELDS)
    }
    return SlurmState(qos=qos, accounts=accounts, assocs=assocs, users=users)


def read_state(backend: CliReads) -> SlurmState:
    """Read the current state from slurmdbd: four ``sacctmgr -P -n show`` calls (raises ``SlurmError``)."""
    texts = {what: backend.run(list(argv)).stdout for what, argv in READ_ARGVS.items()}
    state = parse_state(texts["qos"], texts["account"], texts["assoc"], texts["user"])
    log.debug(
        "policy state read qos=%d accounts=%d assocs=%d users=%d",
        len(state.qos),
        len(state.accounts),
        len(state.assocs),
        len(state.users),
    )
    return state


def read_cluster_facts(backend: CliReads) -> dict:
    """The policy table's cluster facts (``luatable.cluster_facts``: leaf size, GPUs per node, topology hint) as Slurm
    has them now. Why read, not assume: the bridge's switch or segment hint must fit this cluster's leaves and
    topology plugin, and a table rendered for 4-node leaves on a cluster of 16-node leaves hints the wrong gangs."""
    nodes = backend.nodes()
    version = backend.version()
    return cluster_facts(
        [n.switch for n in nodes],
        [n.gpus_total for n in nodes],
        backend.topology_kind(),
        (version.major, version.minor, version.micro),
    )


def _gpu_limit(q: QosState | None) -> int | None:
    if q is None:
        return None
    value = dict(q.grp_tres).get("gres/gpu")
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def policy_in_force(state: SlurmState) -> dict:
    """What the cluster enforces now, in teams.yaml terms, from nuro-managed objects only (for ``policy show``).

    Lending limits are not in Slurm (the controller enforces them), so they cannot be shown from here. A tier's
    ``allowed_accounts`` are the managed accounts whose association lists it; ``allowed_users`` the users who have
    it on their own association but not through their account.
    """
    teams = []
    for acct in state.managed_accounts:
        g, b = state.qos.get(f"g-{acct.name}"), state.qos.get(f"b-{acct.name}")
        teams.append(
            {
                "name": acct.name,
                "quota_gpus": _gpu_limit(g),
                "borrow_limit_gpus": _gpu_limit(b),
                "grace_s": b.grace_s if b is not None else None,
                "fairshare": acct.fairshare,
                "default_qos": acct.default_qos,
                "members": [a.user for a in state.assocs_in_account(acct.name)],
            }
        )
    tiers = []
    for q in state.managed_qos:
        if not q.description.startswith(f"{MANAGED_MARK} tier"):
            continue
        accounts = [a.name for a in state.managed_accounts if q.name in a.qos]
        users = sorted({a.user for a in state.assocs.values() if q.name in a.qos and a.account not in accounts})
        tiers.append({"name": q.name, "priority": q.priority, "allowed_accounts": accounts, "allowed_users": users})
    return {"teams": teams, "tiers": tiers}

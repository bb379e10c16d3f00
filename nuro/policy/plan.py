"""Policy → sacctmgr: the desired accounting state, and the ordered, frozen list of commands that reaches it.

Pure (architecture principle 3): ``build_plan(policy, current, prune)`` takes the state read from slurmdbd
as a value and returns a ``Plan``; nothing here runs a command, so it is golden-tested from captured sacctmgr output.

What nuro writes (a pure function of the policy, ``desired_state``):

| object | settings |
|---|---|
| QOS ``g-<team>`` | ``GrpTRES=gres/gpu=<quota_gpus>``, Description ``nuro-policy guaranteed <team>`` |
| QOS ``b-<team>`` | ``GrpTRES=gres/gpu=<borrow_limit_gpus>``, ``PreemptMode=requeue``, ``GraceTime=<grace_s>`` |
| QOS ``<tier>`` | ``Priority=<priority>``, Description ``nuro-policy tier <tier>`` |
| each QOS above | ``PreemptExemptTime=<min_run_s>``: g-/b- the team's, a tier QOS the tier's (else the policy's) |
| account ``<team>`` | ``Fairshare=<shares>``, ``Organization=nuro-policy``, Description ``nuro team <team>`` |
| its association | ``QOS=g-<team>,b-<team>[,tiers allowing the account]``, ``DefaultQOS=g-<team>`` |
| member (user) | ``DefaultAccount=<team>``; association: the account's QOS + tiers allowing the user, DefaultQOS |

No QOS gets a ``Preempt=`` list (a leftover one is cleared): nuro-controller picks victims and runs
checkpoint-confirmed preemption itself, because Slurm 22.05's preempt/qos victim choice cannot be steered by job
priority. ``PreemptExemptTime`` (the team's ``min_run_s`` on g-/b-, the tier's or the policy's on a tier QOS) is a
backstop only: the controller enforces min_run_s itself, and Slurm honours the QOS value only where a site turns
Slurm preemption on (the QOS value then wins over slurm.conf's global one). It is written as sacctmgr prints it
(``00:02:00``) so a re-apply is empty. The account association carries the team's QOS too, so a user added to the
account by hand inherits ``g-<team>``/``b-<team>`` (quota-limited) instead of ``normal`` (unlimited).

Order of commands: QOS (added/changed) → accounts → user associations → users' default account → with ``prune``
only: user associations, users, accounts, QOS removed last (Slurm refuses to delete a QOS that is an association's
default, and a QOS must exist before an association names it). Every change to an association's QOS list also sets
its DefaultQOS: sacctmgr 22.05 silently ignores (rc 0) a QOS list that no longer contains the association's default.

Ownership: nuro touches only what it marks (accounts with ``Organization=nuro-policy``, QOS whose Description starts
with ``nuro-policy``) and the associations of users in those accounts. A policy name that already exists unmarked
(``root``, ``normal``, another tool's account) raises ``PlanConflict`` instead of being taken over.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from enum import StrEnum

from nuro.policy.model import Policy, borrow_qos, guaranteed_qos
from nuro.policy.slurm_state import (
    MANAGED_MARK,
    AccountState,
    AssocState,
    QosState,
    SlurmState,
    UserState,
    slurm_duration,
    tres_text,
)

SACCTMGR = ("sacctmgr", "-i")  # -i: no "Would you like to commit changes?" prompt


class PlanConflict(ValueError):
    """The policy names an account or QOS that exists but is not nuro's; ``problems`` says which and what to do."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            "refusing to take over objects nuro does not manage:\n" + "\n".join(f"  - {p}" for p in problems)
        )


class Op(StrEnum):
    ADD = "+"
    MODIFY = "~"
    DELETE = "-"


@dataclass(frozen=True)
class Change:
    """One object's change and the one sacctmgr command that makes it.

    ``details`` are "Key=value" for an addition and "Key: old -> new" for a modification.
    """

    op: Op
    kind: str  # "qos" | "account" | "association" | "user"
    name: str  # association names are "user@account"
    details: tuple[str, ...]
    argv: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"op": self.op.value, "kind": self.kind, "name": self.name, "details": list(self.details),
                "argv": list(self.argv)}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    """The ordered changes; ``kept`` names nuro-managed objects absent from the policy that only --prune removes."""

    changes: tuple[Change, ...]
    kept: tuple[str, ...] = ()
    prune: bool = False

    @property
    def is_empty(self) -> bool:
        return not self.changes

    @property
    def commands(self) -> tuple[tuple[str, ...], ...]:
        return tuple(c.argv for c in self.changes)

    def counts(self) -> dict[str, int]:
        return {op.name.lower(): sum(c.op is op for c in self.changes) for op in Op}

    def render(self) -> str:
        """Human-readable diff: one ``+``/``~``/``-`` line per object (with old -> new for changes), then the exact
        command, then what --prune would remove and the totals."""
        lines: list[str] = []
        for c in self.changes:
            # An addition's settings are its command; a modification lists "Key: old -> new".
            shown = "" if c.op is Op.ADD or not c.details else "  " + "; ".join(c.details)
            lines.append(f"{c.op.value} {c.kind} {c.name}{shown}")
            lines.append(f"    $ {shlex.join(c.argv)}")
        if self.kept:
            lines.append("kept (nuro-managed but not in the policy; --prune removes them): " + ", ".join(self.kept))
        n = self.counts()
        lines.append(
            f"{n['add']} to add, {n['modify']} to change, {n['delete']} to remove"
            if self.changes
            else "no changes: Slurm already matches the policy"
        )
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict:
        return {"changes": [c.to_dict() for c in self.changes], "kept": list(self.kept), "prune": self.prune,
                "counts": self.counts()}  # fmt: skip


# -- desired state ---------------------------------------------------------------------------------------------
def _gpus(n: int) -> tuple[tuple[str, str], ...]:
    return (("gres/gpu", str(n)),)


def desired_state(policy: Policy) -> SlurmState:
    """The accounting objects the policy asks for (see the module table); insertion order is policy order."""
    qos: dict[str, QosState] = {}
    accounts: dict[str, AccountState] = {}
    assocs: dict[tuple[str, str], AssocState] = {}
    users: dict[str, UserState] = {}
    for team in policy.teams:
        g, b = guaranteed_qos(team.name), borrow_qos(team.name)
        min_run = policy.min_run_of(team=team.name)
        qos[g] = QosState(
            g, f"{MANAGED_MARK} guaranteed {team.name}", grp_tres=_gpus(team.quota_gpus), preempt_exempt_s=min_run
        )
        qos[b] = QosState(
            b,
            f"{MANAGED_MARK} borrow {team.name}",
            grace_s=policy.grace_s,
            preempt_mode="requeue",
            grp_tres=_gpus(team.borrow_limit_gpus),
            preempt_exempt_s=min_run,
        )
    for tier in policy.tiers:
        qos[tier.name] = QosState(
            tier.name,
            f"{MANAGED_MARK} tier {tier.name}",
            priority=tier.priority,
            preempt_exempt_s=policy.min_run_of(team=None, tier=tier.name),
        )
    for team in policy.teams:
        base = {guaranteed_qos(team.name), borrow_qos(team.name)}
        team_tiers = {t.name for t in policy.tiers if team.name in t.allowed_accounts}
        accounts[team.name] = AccountState(
            team.name,
            description=f"nuro team {team.name}",
            organization=MANAGED_MARK,
            fairshare=str(team.shares),
            qos=frozenset(base | team_tiers),
            default_qos=guaranteed_qos(team.name),
        )
        for user in team.members:
            user_tiers = {t.name for t in policy.tiers if user in t.allowed_users}
            assocs[(user, team.name)] = AssocState(
                user, team.name, frozenset(base | team_tiers | user_tiers), guaranteed_qos(team.name)
            )
            users[user] = UserState(user, default_account=team.name)
    return SlurmState(qos=qos, accounts=accounts, assocs=assocs, users=users)


# -- rendering helpers ---------------------------------------------------------------------------------------------
def _qos_fields(q: QosState) -> dict[str, str]:
    return {
        "Description": q.description,
        "Priority": str(q.priority),
        "GrpTRES": tres_text(q.grp_tres),
        "PreemptMode": q.preempt_mode,
        "GraceTime": str(q.grace_s),
        "Preempt": ",".join(sorted(q.preempt)),
        "PreemptExemptTime": slurm_duration(q.preempt_exempt_s),
    }


def _account_fields(a: AccountState) -> dict[str, str]:
    return {"Description": a.description, "Organization": a.organization, "Fairshare": a.fairshare,
            "QOS": ",".join(sorted(a.qos)), "DefaultQOS": a.default_qos}  # fmt: skip


def _assoc_fields(a: AssocState) -> dict[str, str]:
    return {"QOS": ",".join(sorted(a.qos)), "DefaultQOS": a.default_qos}


def _settings(fields: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in fields.items()]


def _changed(want: dict[str, str], have: dict[str, str]) -> dict[str, str]:
    """The fields to set; a QOS list and its default always travel together (see the module docstring)."""
    diff = {k: v for k, v in want.items() if have.get(k) != v}
    if "QOS" in diff or "DefaultQOS" in diff:
        diff.update({k: want[k] for k in ("QOS", "DefaultQOS") if k in want})
    return {k: want[k] for k in want if k in diff}


def _transitions(diff: dict[str, str], have: dict[str, str]) -> tuple[str, ...]:
    """ "Key: old -> new" for the fields that really change (a DefaultQOS sent along unchanged is not shown)."""
    return tuple(f"{k}: {have.get(k) or '(unset)'} -> {v or '(unset)'}" for k, v in diff.items() if have.get(k) != v)


def _tres_setting(want: QosState, have: QosState) -> str:
    """GrpTRES to set: the wanted limits plus ``-1`` (clear) for any TRES limit nuro does not want."""
    wanted = dict(want.grp_tres)
    extra = [(k, "-1") for k, _ in have.grp_tres if k not in wanted]
    return tres_text(tuple(sorted([*wanted.items(), *extra])))


# -- the diff --------------------------------------------------------------------------------------------------
def _plan_qos(want: SlurmState, have: SlurmState) -> list[Change]:
    out = []
    default = _qos_fields(QosState(""))
    for name, q in want.qos.items():
        fields = _qos_fields(q)
        cur = have.qos.get(name)
        if cur is None:
            # Only what differs from Slurm's defaults, so the command says what the policy sets.
            sets = {k: v for k, v in fields.items() if k == "Description" or v != default[k]}
            argv = (*SACCTMGR, "add", "qos", name, *_settings(sets))
            out.append(Change(Op.ADD, "qos", name, tuple(_settings(sets)), argv))
            continue
        have_fields = _qos_fields(cur)
        diff = _changed(fields, have_fields)
        if diff:
            sets = {**diff, **({"GrpTRES": _tres_setting(q, cur)} if "GrpTRES" in diff else {})}
            argv = (*SACCTMGR, "modify", "qos", "where", f"name={name}", "set", *_settings(sets))
            out.append(Change(Op.MODIFY, "qos", name, _transitions(diff, have_fields), argv))
    return out


def _plan_accounts(want: SlurmState, have: SlurmState) -> list[Change]:
    out = []
    for name, a in want.accounts.items():
        fields = _account_fields(a)
        cur = have.accounts.get(name)
        if cur is None:
            argv = (*SACCTMGR, "add", "account", name, *_settings(fields))
            out.append(Change(Op.ADD, "account", name, tuple(_settings(fields)), argv))
            continue
        have_fields = _account_fields(cur)
        diff = _changed(fields, have_fields)
        if diff:
            argv = (*SACCTMGR, "modify", "account", "where", f"name={name}", "set", *_settings(diff))
            out.append(Change(Op.MODIFY, "account", name, _transitions(diff, have_fields), argv))
    return out


def _plan_members(want: SlurmState, have: SlurmState) -> list[Change]:
    out, defaults = [], []
    for (user, account), a in want.assocs.items():
        fields = _assoc_fields(a)
        cur, cur_user = have.assocs.get((user, account)), have.users.get(user)
        name = f"{user}@{account}"
        if cur is None:
            # add user with DefaultAccount also switches an existing user's default (22.05), in the same command.
            switch = cur_user is None or cur_user.default_account != account
            sets = {**({"DefaultAccount": account} if switch else {}), **fields}
            argv = (*SACCTMGR, "add", "user", user, f"Account={account}", *_settings(sets))
            details = list(_settings(sets))
            if cur_user is not None and switch:
                details[0] = f"DefaultAccount: {cur_user.default_account or '(unset)'} -> {account}"
            kind, obj = ("user", user) if cur_user is None else ("association", name)
            out.append(Change(Op.ADD, kind, obj, tuple(details), argv))
            continue
        diff = _changed(fields, _assoc_fields(cur))
        if diff:
            argv = (*SACCTMGR, "modify", "user", "where", f"name={user}", f"account={account}", "set",
                    *_settings(diff))  # fmt: skip
            out.append(Change(Op.MODIFY, "association", name, _transitions(diff, _assoc_fields(cur)), argv))
        if cur_user is not None and cur_user.default_account != account:
            defaults.append(_set_default(user, cur_user.default_account, account))
    return out + defaults


def _set_default(user: str, old: str, new: str) -> Change:
    argv = (*SACCTMGR, "modify", "user", "where", f"name={user}", "set", f"DefaultAccount={new}")
    return Change(Op.MODIFY, "user", user, (f"DefaultAccount: {old or '(unset)'} -> {new}",), argv)


def _plan_removals(want: SlurmState, have: SlurmState) -> tuple[list[Change], list[str]]:
    """Managed objects absent from the policy: (the deletions, their display names). Callers drop the
    deletions unless pruning. Users whose every association goes are deleted whole; a user left with only
    unmanaged associations gets one of those as default first (22.05 would leave the default empty)."""
    managed = {a.name for a in have.managed_accounts}
    stale = [a for a in have.assocs.values() if a.account in managed and (a.user, a.account) not in want.assocs]
    gone_accounts = sorted(managed - set(want.accounts))
    gone_qos = sorted(q.name for q in have.managed_qos if q.name not in want.qos)
    fixes: list[Change] = []  # default-account moves, before any deletion
    changes: list[Change] = []
    for user in sorted({a.user for a in stale}):
        leaving = {a.account for a in stale if a.user == user}
        remaining = {a.account for a in have.assocs_of_user(user)} - leaving
        remaining |= {acct for (u, acct) in want.assocs if u == user}
        if not remaining:
            argv = (*SACCTMGR, "delete", "user", "where", f"name={user}")
            details = tuple(f"with association {user}@{a}" for a in sorted(leaving))
            changes.append(Change(Op.DELETE, "user", user, details, argv))
            continue
        cur_user = have.users.get(user)
        if user not in want.users and cur_user is not None and cur_user.default_account in leaving:
            fixes.append(_set_default(user, cur_user.default_account, sorted(remaining)[0]))
        for account in sorted(leaving):
            argv = (*SACCTMGR, "delete", "user", "where", f"name={user}", f"account={account}")
            changes.append(Change(Op.DELETE, "association", f"{user}@{account}", (), argv))
    for name in gone_accounts:
        changes.append(
            Change(Op.DELETE, "account", name, (), (*SACCTMGR, "delete", "account", "where", f"name={name}"))
        )
    for name in gone_qos:
        changes.append(Change(Op.DELETE, "qos", name, (), (*SACCTMGR, "delete", "qos", "where", f"name={name}")))
    return fixes + changes, [f"{c.kind} {c.name}" for c in changes]


def _conflicts(want: SlurmState, have: SlurmState) -> list[str]:
    problems = []
    for name in want.qos:
        cur = have.qos.get(name)
        if cur is not None and not cur.is_managed:
            problems.append(
                f"QOS '{name}' exists with Description '{cur.description}', not marked '{MANAGED_MARK}': rename the "
                f"team/tier, or adopt it with: sacctmgr modify qos where name={name} set "
                f"Description='{MANAGED_MARK} adopted'"
            )
    for name in want.accounts:
        cur = have.accounts.get(name)
        if cur is not None and not cur.is_managed:
            problems.append(
                f"account '{name}' exists with Organization '{cur.organization}', not '{MANAGED_MARK}': rename the "
                f"team, or adopt it with: sacctmgr modify account where name={name} set Organization={MANAGED_MARK}"
            )
    return problems


def build_plan(policy: Policy, current: SlurmState, prune: bool = False) -> Plan:
    """Diff ``desired_state(policy)`` against ``current`` → the ordered commands (see the module docstring).

    Raises:
        PlanConflict: the policy names an existing account/QOS that nuro does not manage.
    """
    want = desired_state(policy)
    problems = _conflicts(want, current)
    if problems:
        raise PlanConflict(problems)
    changes = [*_plan_qos(want, current), *_plan_accounts(want, current), *_plan_members(want, current)]
    removals, removal_names = _plan_removals(want, current)
    if prune:
        return Plan(tuple(changes + removals), (), prune=True)
    return Plan(tuple(changes), tuple(removal_names), prune=False)


__all__ = ["SACCTMGR", "Change", "Op", "Plan", "PlanConflict", "build_plan", "desired_state"]

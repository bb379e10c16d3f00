"""Team policy as code: the validated content of ``teams.yaml``.

Admins describe teams once; everything downstream is derived from this one value: the sacctmgr state
(``nuro-admin policy apply``), the job_submit.lua policy table, the controller's borrowing and reclaim decisions.

Mapping onto Slurm (docs/policy.md has the whole mapping):

| policy | Slurm |
|---|---|
| team | account ``<team>`` with ``Fairshare=<fairshare>``; members are users with DefaultAccount ``<team>`` |
| quota_gpus | QOS ``g-<team>`` ``GrpTRES=gres/gpu=<quota>``: hard, enforced by slurmctld even with nuro down |
| borrow_limit_gpus | QOS ``b-<team>`` ``GrpTRES=gres/gpu=<limit>``: the most the team may hold above its quota |
| lend_limit_gpus | controller only: the most of the team's idle quota others may borrow |
| lend_buffer_gpus | controller only: of the team's idle quota, this many are never lent (its next jobs start at once) |
| gang_first | controller only: a gang waiting on the team's quota gets it first (``MinTRESPerJob`` on ``g-<team>``) |
| tier (e.g. urgent) | QOS ``<tier>`` with ``Priority=<priority>``, usable only by the listed accounts/users |
| grace_s | how long a preempted job has to commit a checkpoint and acknowledge before it is requeued anyway |
| min_run_s | no run younger than this is preempted (controller rule; QOS ``PreemptExemptTime``: Slurm's backstop) |
| restart_cost_s | staging + start-up a requeued job pays before it trains again; part of a victim's cost |
| usage_half_life_s | half-life of each team's decayed GPU usage (borrow order, who yields first, SiteFactor) |
| lend_hysteresis_s | half-life of a lender's peak guaranteed demand; only GPUs idle at that peak are lent |
| ending_soon_s | the most a claimant waits for a job that ends by itself when waiting is cheaper than preempting it |
| drain_horizon_s | a gang no victim set can place gets the nodes whole soonest drained, if whole within this |
| require_pinning | job_submit.lua refuses team GPU jobs without a dataset digest + code commit in the comment |
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nuro import names
from nuro.console import problem_list

NAME = rf"^{names.TEAM}$"  # Slurm account/QOS names: lower case, no dashes (the QOS prefix adds one)
USER = rf"^{names.USER}$"  # POSIX user names as useradd accepts them

NonNegInt = Annotated[int, Field(ge=0, strict=True)]
#: Seconds of a run (minimum run time); a day at most: a longer exemption is a reservation, not a preemption rule.
RunSeconds = Annotated[int, Field(ge=0, le=86400, strict=True)]


class PolicyError(ValueError):
    """teams.yaml is invalid. ``problems`` lists every problem as 'where: what is wrong (how to fix)'."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(problem_list(source, problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Team(_Strict):
    """One team = one Slurm account."""

    name: str = Field(pattern=NAME)
    members: tuple[Annotated[str, Field(pattern=USER)], ...] = ()
    quota_gpus: NonNegInt
    borrow_limit_gpus: NonNegInt = 0
    lend_limit_gpus: NonNegInt = 0
    #: GPUs of the team's idle quota kept unlent, so that its next jobs start at once instead of waiting for a reclaim
    #: (the sharing incentive bought with utilisation: docs/trace-replay.md "The sharing incentive").
    lend_buffer_gpus: NonNegInt = 0
    #: Keep the team's quota for its gang: while one of its multi-node jobs waits on the quota, its smaller jobs wait
    #: (or borrow) instead of taking the GPUs that free up (slurm_plugins/controller/gangfirst.py). Off by default:
    #: the team trades its small jobs' waits for its gangs' starts.
    gang_first: Annotated[bool, Field(strict=True)] = False
    #: Slurm fair-share shares; default: the quota (shares proportional to entitlement).
    fairshare: Annotated[int, Field(ge=1, strict=True)] | None = None
    #: This team's jobs are never preempted before their current run is this old (default: the policy's).
    min_run_s: RunSeconds | None = None

    @property
    def shares(self) -> int:
        return self.fairshare if self.fairshare is not None else max(1, self.quota_gpus)

    @property
    def guaranteed_qos(self) -> str:
        return guaranteed_qos(self.name)

    @property
    def borrow_qos(self) -> str:
        return borrow_qos(self.name)

    @model_validator(mode="after")
    def _lend_within_quota(self) -> Team:
        if self.lend_limit_gpus > self.quota_gpus:
            raise ValueError(
                f"lend_limit_gpus={self.lend_limit_gpus} is above quota_gpus={self.quota_gpus}: a team can only "
                "lend GPUs of its own quota; lower lend_limit_gpus"
            )
        if self.lend_buffer_gpus > self.quota_gpus:
            raise ValueError(
                f"lend_buffer_gpus={self.lend_buffer_gpus} is above quota_gpus={self.quota_gpus}: the buffer is the "
                "part of the team's own quota it keeps unlent; lower lend_buffer_gpus"
            )
        return self


class Tier(_Strict):
    """A priority tier above the teams' guaranteed QOS, e.g. ``urgent`` for production retraining."""

    name: str = Field(pattern=NAME)
    priority: Annotated[int, Field(ge=1, strict=True)]
    allowed_accounts: tuple[Annotated[str, Field(pattern=NAME)], ...] = ()
    allowed_users: tuple[Annotated[str, Field(pattern=USER)], ...] = ()
    #: Also preempt guaranteed (within-quota) jobs of other teams once no borrower is left to preempt.
    preempts_guaranteed: bool = True
    #: Jobs of this tier are never preempted (by a higher tier) before their current run is this old.
    min_run_s: RunSeconds | None = None


class Policy(_Strict):
    cluster_gpus: Annotated[int, Field(ge=1, strict=True)]
    grace_s: Annotated[int, Field(ge=1, le=3600, strict=True)] = 60
    #: No job is preempted before its current run is this old (Slurm's ``PreemptExemptTime``): a restarted victim is
    #: not the cheapest victim again at once, so reclaim cannot thrash. Teams and tiers may override it.
    min_run_s: RunSeconds = 600
    #: Seconds a requeued job spends staging and starting before it trains again (lost GPU time of every
    #: preemption, on top of the work since its last checkpoint); counted in each victim's cost.
    restart_cost_s: Annotated[int, Field(ge=0, le=3600, strict=True)] = 120
    #: Half-life of each team's decayed GPU usage: a team that borrowed heavily in the last hours yields first and
    #: borrows last (Slurm's PriorityDecayHalfLife, Kueue's admission fair sharing).
    usage_half_life_s: Annotated[int, Field(ge=60, le=30 * 86400, strict=True)] = 3600
    #: Lending hysteresis: a team lends only what its guaranteed demand left idle at its recent peak, a peak that
    #: decays with this half-life. GPUs a lender used a few minutes ago are likely wanted back soon; lending them
    #: means a reclaim (a preemption) when they are. 0 lends whatever is idle this cycle.
    lend_hysteresis_s: Annotated[int, Field(ge=0, le=86400, strict=True)] = 900
    #: The most a pending job waits for a running job to end by itself (its time limit) instead of preempting it. Within
    #: this, a job that ends before ``grace_s + restart_cost_s + its seconds since its last checkpoint`` is waited for
    #: (preempting it would cost it more than waiting costs the claimant) and its GPUs are not lent meanwhile.
    #: 0: never wait, preempt at once (as before issue 13).
    ending_soon_s: Annotated[int, Field(ge=0, le=86400, strict=True)] = 600
    #: A pending job within its quota that needs whole nodes no victim set can free now (each also holds jobs that may
    #: not be preempted) gets the preemptible jobs on the nodes that will be whole soonest preempted, when those nodes
    #: are whole within this many seconds; the nodes are then kept for it (slurm_plugins/controller/drain.py).
    #: 0 turns draining off: such a job waits until nodes happen to be whole.
    drain_horizon_s: Annotated[int, Field(ge=0, le=86400, strict=True)] = 3600
    teams: tuple[Team, ...]
    tiers: tuple[Tier, ...] = ()
    #: Refuse team GPU jobs whose comment carries no pinned nuro record (docs/job_submit.md "Pinning"). Off by default
    #: so plain sbatch keeps working on dev/test clusters; production should set it to true.
    require_pinning: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        problems: list[str] = []
        names = [t.name for t in self.teams]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"teams: '{dup}' is defined twice")
        tier_names = [t.name for t in self.tiers]
        for clash in sorted(set(tier_names) & {"normal", *names}):
            problems.append(f"tiers.{clash}: the name is taken (by a team or Slurm's 'normal' QOS); rename the tier")
        total = sum(t.quota_gpus for t in self.teams)
        if total > self.cluster_gpus:
            problems.append(
                f"teams: quotas add up to {total} GPUs but cluster_gpus is {self.cluster_gpus}; "
                "lower quotas or raise cluster_gpus (guarantees cannot exceed the cluster)"
            )
        for team in self.teams:
            if team.quota_gpus + team.borrow_limit_gpus > self.cluster_gpus:
                problems.append(
                    f"teams.{team.name}: quota_gpus + borrow_limit_gpus = "
                    f"{team.quota_gpus + team.borrow_limit_gpus} exceeds cluster_gpus={self.cluster_gpus}"
                )
        seen: dict[str, str] = {}
        for team in self.teams:
            for user in team.members:
                if user in seen and seen[user] != team.name:
                    problems.append(
                        f"teams.{team.name}.members: '{user}' is already a member of '{seen[user]}'; "
                        "a user belongs to one team (their default account)"
                    )
                seen.setdefault(user, team.name)
        for tier in self.tiers:
            if not tier.allowed_accounts and not tier.allowed_users:
                problems.append(
                    f"tiers.{tier.name}: no one may use this tier; list allowed_accounts or allowed_users, "
                    "or remove the tier"
                )
            for acct in tier.allowed_accounts:
                if acct not in names:
                    problems.append(f"tiers.{tier.name}.allowed_accounts: '{acct}' is not a team")
            for user in tier.allowed_users:
                if user not in seen:
                    problems.append(
                        f"tiers.{tier.name}.allowed_users: '{user}' is not a member of any team; add them to a team"
                    )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def team(self, name: str) -> Team:
        for t in self.teams:
            if t.name == name:
                return t
        raise KeyError(f"no team '{name}' in the policy (teams: {', '.join(t.name for t in self.teams)})")

    def team_of_user(self, user: str) -> Team | None:
        return next((t for t in self.teams if user in t.members), None)

    def tier(self, name: str) -> Tier | None:
        return next((t for t in self.tiers if t.name == name), None)

    def min_run_of(self, team: str | None = None, tier: str | None = None) -> int:
        """The minimum run time of a job: its tier's when it runs in a tier, else its team's, else the policy's."""
        if tier is not None and (t := self.tier(tier)) is not None and t.min_run_s is not None:
            return t.min_run_s
        if tier is None and team is not None:
            found = next((t for t in self.teams if t.name == team), None)
            if found is not None and found.min_run_s is not None:
                return found.min_run_s
        return self.min_run_s


def guaranteed_qos(team: str) -> str:
    return f"g-{team}"


def borrow_qos(team: str) -> str:
    return f"b-{team}"


def _where(loc: tuple, data: dict) -> str:
    """'teams.perception.quota_gpus', not 'teams.0.quota_gpus': name list items as teams.yaml does."""
    parts = [str(p) for p in loc]
    if len(loc) >= 2 and loc[0] in ("teams", "tiers") and isinstance(loc[1], int):
        items = data.get(loc[0])
        if isinstance(items, list) and loc[1] < len(items) and isinstance(items[loc[1]], dict):
            parts[1] = str(items[loc[1]].get("name", loc[1]))
    return ".".join(parts) or "(top level)"


def _format_errors(exc: ValidationError, data: dict) -> list[str]:
    problems = []
    for err in exc.errors():
        where = _where(err["loc"], data)
        if err["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown key; check the spelling (see examples/policy/teams.yaml)")
        elif err["type"] == "missing":  # its "input" is the mapping that lacks it, reshaped: no help to the reader
            problems.append(f"{where}: required, and missing (see examples/policy/teams.yaml)")
        elif err["type"] == "value_error":
            msg = str(err["ctx"]["error"]) if "ctx" in err else err["msg"]
            problems.extend(f"{where + ': ' if err['loc'] else ''}{line}" for line in msg.splitlines())
        else:
            problems.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return problems


def _teams_as_list(raw: dict) -> dict:
    """teams.yaml writes teams (and tiers) as mappings keyed by name; the model wants lists with a name field."""
    out = dict(raw)
    for key in ("teams", "tiers"):
        value = raw.get(key)
        if isinstance(value, dict):
            items = []
            for name, body in value.items():
                if not isinstance(body, dict):
                    raise PolicyError("teams.yaml", [f"{key}.{name}: expected a mapping of settings, got {body!r}"])
                if "name" in body:
                    raise PolicyError("teams.yaml", [f"{key}.{name}.name: unknown key (the mapping key is the name)"])
                items.append({"name": str(name), **body})
            out[key] = items
    return out


def parse_policy(raw: object, source: str = "teams.yaml") -> Policy:
    """Validate already-parsed YAML/JSON; raises PolicyError listing every problem."""
    if not isinstance(raw, dict):
        raise PolicyError(source, [f"expected a mapping at the top level, got {type(raw).__name__}"])
    try:
        data = _teams_as_list(raw)
        return Policy.model_validate(data)
    except PolicyError as exc:
        raise PolicyError(source, exc.problems) from None
    except ValidationError as exc:
        raise PolicyError(source, _format_errors(exc, data)) from None


def load_policy(path: str | Path) -> Policy:
    """Read and validate a teams.yaml."""
    path = Path(path)
    try:
        with open(path) as fh:  # a named stream: a YAML error says '"teams.yaml", line 3', not '"<unicode string>"'
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise PolicyError(str(path), ["file not found"]) from None
    except OSError as exc:  # unreadable, a directory, ...: said, never a traceback
        raise PolicyError(str(path), [f"cannot read the file: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise PolicyError(str(path), [f"not valid YAML: {exc}"]) from None
    return parse_policy(raw, str(path))


def policy_to_yaml_dict(policy: Policy) -> dict:
    """The inverse of the teams.yaml shape (teams/tiers keyed by name); used by ``policy show``."""
    data = policy.model_dump(exclude_none=True)
    data["teams"] = {t.pop("name"): t for t in data["teams"]}
    data["tiers"] = {t.pop("name"): t for t in data["tiers"]}
    return data


__all__ = [
    "Policy",
    "PolicyError",
    "Team",
    "Tier",
    "borrow_qos",
    "guaranteed_qos",
    "load_policy",
    "parse_policy",
    "policy_to_yaml_dict",
]

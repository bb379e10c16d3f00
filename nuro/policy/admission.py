"""Admission rules in Python: the preview of what ``slurm_plugins/job_submit.lua`` does to a submission.

``decide(request, policy)`` is pure. It reads the same generated policy table as the Lua bridge
(``nuro.policy.luatable.policy_table``), takes the rejection messages and codes from it, and mirrors the Lua code
rule by rule, in the same order. ``tests/vectors/admission.json`` holds the shared cases: the unit test runs them
through this module (and through the Lua file under a stub ``slurm``), the integration test through real ``sbatch``.
``nuro-train submit --dry-run`` shows this result; the Lua bridge is the one that enforces.

Rules (first failing check wins; root is let through unchanged, see docs/job_submit.md):

| # | rule | when | outcome |
|---|---|---|---|
| 1 | account_other_team | a team member names another team's account | reject, ESLURM_INVALID_ACCOUNT |
| 2 | qos_other_team, qos_no_team | QOS ``g-``/``b-`` of a team that is not the job's | reject, ESLURM_ACCESS_DENIED |
| 2b | qos_borrow | ``b-<team>`` chosen by the user (only the controller moves jobs there) | reject, ACCESS_DENIED |
| 3 | tier_denied | tier QOS (``urgent``) and neither user nor account allowed | reject, ESLURM_ACCESS_DENIED |
| 4 | gpu_cap | more GPUs than the team's quota + borrowing limit | reject, ESLURM_ACCOUNTING_POLICY |
| 4x | comment_not_canonical | comment looks like a record, is not canonical (``jobcomment``) | reject, ACCESS_DENIED |
| 4y | preempt_forged | the comment carries a ``preempt`` key (only the controller writes it) | reject, ACCESS_DENIED |
| 4a | pin_invalid | a ``nuro`` record in the comment without a valid pin (tag, short commit) | reject, ACCESS_DENIED |
| 4b | pin_team | the record's ``nuro.team`` is not the account the job is charged to | reject, INVALID_ACCOUNT |
| 4c | pin_required | ``require_pinning``, a team job asks for GPUs, no ``nuro`` record | reject, ACCESS_DENIED |
| 5 | team defaults | team job without ``--qos`` / ``--account`` | QOS ``g-<team>``, account ``<team>`` |
| 6 | requeue | team job | requeue forced on |
| 7 | topology hint | 2..leaf_nodes nodes, no ``--switches``/``--segment`` | see below |

Rule 7 follows the table's ``topology_hint``: ``switches`` (topology/tree) adds ``--switches=1@<switch_wait_s>``;
``segment`` (topology/block, Slurm 25.11.2+) adds ``--segment=<nodes>`` to a job of a fixed node count; ``none``
adds nothing.

(``pin_changed``, a modify-only rule of the bridge, has no preview: ``decide`` judges submissions.) The comment is read
by ``read_comment`` through the one parser ``nuro.protocol.jobcomment`` (canonical form only; its scanner mirrors the
Lua's), so both sides judge every comment alike.

The job's team is the team of ``--account`` when given (None if that account is not a team), else the user's team.
GPUs are counted as Slurm 22.05 receives them: ``max(per_job, per_node × nodes, per_task × tasks,
per_socket × sockets × nodes)`` where nodes is the upper end of ``--nodes`` (1 if not given) and tasks is ``--ntasks``,
else ``--ntasks-per-node`` × nodes, else one per node.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from nuro import names
from nuro.policy.luatable import DEFAULT_SWITCH_WAIT_S, policy_table
from nuro.policy.model import Policy
from nuro.protocol import jobcomment

ROOT_USER = "root"


class Reason(StrEnum):
    """Why a submission is refused; the value is the rule name in the policy table's ``rules``."""

    ACCOUNT_OTHER_TEAM = "account_other_team"
    QOS_OTHER_TEAM = "qos_other_team"
    QOS_NO_TEAM = "qos_no_team"
    QOS_BORROW = "qos_borrow"
    TIER_DENIED = "tier_denied"
    GPU_CAP = "gpu_cap"
    COMMENT_NOT_CANONICAL = "comment_not_canonical"
    PREEMPT_FORGED = "preempt_forged"
    PIN_INVALID = "pin_invalid"
    PIN_TEAM = "pin_team"
    PIN_REQUIRED = "pin_required"


@dataclass(frozen=True)
class JobRequest:
    """What a submission asks for, in the terms Slurm 22.05's job_desc carries them.

    None means "not given" (Slurm's NO_VAL): Slurm or the association supplies the default.
    """

    user: str
    account: str | None = None
    qos: str | None = None
    #: ``--nodes`` lower and upper end (``-N 2`` gives 2 and 2; ``-N 2-6`` gives 2 and 6).
    nodes: int | None = None
    max_nodes: int | None = None
    tasks: int | None = None
    tasks_per_node: int | None = None
    sockets_per_node: int | None = None
    gpus_per_node: int = 0
    gpus_per_job: int = 0
    gpus_per_task: int = 0
    gpus_per_socket: int = 0
    #: ``--requeue`` (True) / ``--no-requeue`` (False); None: the cluster default (JobRequeue).
    requeue: bool | None = None
    #: ``--switches=<count>[@<wait>]``; None: not given.
    switches: int | None = None
    switch_wait_s: int | None = None
    #: ``--segment=<nodes>`` (topology/block); None: not given.
    segment: int | None = None
    #: ``--comment``: nuro's run record (compact JSON with a ``nuro`` key) or any other text; None: not given.
    comment: str | None = None

    @property
    def node_count(self) -> int:
        """The node count the GPU cap and the switch hint use: the upper end of ``--nodes``, at least 1."""
        n = self.max_nodes if self.max_nodes is not None else self.nodes if self.nodes is not None else 1
        return max(n, 1)

    @property
    def fixed_nodes(self) -> bool:
        """``--nodes=N`` (or ``N-N``): one node count, the only kind a whole-job segment fits."""
        return self.nodes is not None and (self.max_nodes is None or self.max_nodes == self.nodes)

    @property
    def total_gpus(self) -> int:
        nodes = self.node_count
        if self.tasks is not None:
            tasks = self.tasks
        elif self.tasks_per_node is not None:
            tasks = self.tasks_per_node * nodes
        else:
            tasks = nodes
        sockets = self.sockets_per_node if self.sockets_per_node is not None else 1
        return max(
            self.gpus_per_job,
            self.gpus_per_node * nodes,
            self.gpus_per_task * tasks,
            self.gpus_per_socket * sockets * nodes,
        )

    @classmethod
    def from_sbatch_args(cls, user: str, argv: Sequence[str]) -> JobRequest:
        """Read the sbatch options that matter for admission; see ``parse_sbatch_args``."""
        return parse_sbatch_args(user, argv)


@dataclass(frozen=True)
class Admission:
    """The outcome: accepted with the final values, or rejected with the user's message.

    For accepted jobs ``qos``/``account``/``requeue`` are the final values when nuro or the user set them, and None
    when Slurm supplies its default (association default account/QOS, JobRequeue). ``switches`` is None when the job
    has no switch requirement.
    """

    accepted: bool
    qos: str | None = None
    account: str | None = None
    requeue: bool | None = None
    switches: int | None = None
    switch_wait_s: int | None = None
    segment: int | None = None
    team: str | None = None
    gpus: int = 0
    reason: Reason | None = None
    #: The message sbatch shows (``sbatch: error: <message>``); empty when accepted.
    message: str = ""
    #: Name of the ``slurm.ESLURM_*`` code the Lua returns on rejection.
    code: str | None = None
    #: What nuro changed, e.g. ``("qos=g-perception", "requeue=1")``.
    changes: tuple[str, ...] = field(default_factory=tuple)


# --- the nuro record in the comment (mirror of read_comment in job_submit.lua) ------------------------------------

_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class NuroRecord:
    """The pins read from a comment's ``nuro`` record. ``bad``: the first invalid field (a ``PIN_FIELDS`` key).

    ``raw`` is ``"nuro":`` + the record's canonical text, the bytes an update must keep (``pin_changed``)."""

    raw: str
    bad: str | None = None
    team: str | None = None
    digest: str | None = None
    name: str | None = None
    commit: str | None = None


@dataclass(frozen=True)
class CommentView:
    """What the admission rules read from a comment.

    ``why``: the comment looks like a record (starts with ``{`` or holds ``"nuro":``) but is not canonical, and this
    is the first problem (``comment_not_canonical``). ``preempt``: ``"preempt":`` + the canonical value, if any."""

    why: str | None = None
    nuro: NuroRecord | None = None
    preempt: str | None = None


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _pins(nuro: Any) -> NuroRecord:
    raw = '"nuro":' + jobcomment.canonical(nuro)
    if not isinstance(nuro, dict):
        return NuroRecord(raw=raw, bad="nuro")
    dataset, code = nuro.get("dataset"), nuro.get("code")
    digest = name = None
    if (
        isinstance(dataset, dict)
        and set(dataset) == {"digest", "name"}
        and _str(dataset["digest"]) is not None
        and _str(dataset["name"]) is not None
    ):
        digest, name = dataset["digest"], dataset["name"]
    commit = _str(code.get("commit")) if isinstance(code, dict) else None
    team = _str(nuro.get("team"))
    if digest is None or name is None:
        bad: str | None = "nuro.dataset"
    elif not names.is_digest(digest):
        bad = "nuro.dataset.digest"
    elif not names.is_dataset(name):
        bad = "nuro.dataset.name"
    elif commit is None or not _COMMIT.fullmatch(commit):
        bad = "nuro.code.commit"
    elif team is None or not names.is_team(team):
        bad = "nuro.team"
    else:
        bad = None
    return NuroRecord(raw=raw, bad=bad, team=team, digest=digest, name=name, commit=commit)


def read_comment(comment: str | None) -> CommentView | None:
    """The comment as job_submit.lua's ``read_comment`` sees it: None without a comment or for plain text.

    Reads through the one parser (``nuro.protocol.jobcomment.record``): only the canonical form is a record, so the
    bridge, this preview and every other reader see the same record or none."""
    if not comment:
        return None
    obj = jobcomment.record(comment)
    if obj is None:
        if comment.startswith("{") or '"nuro":' in comment:
            return CommentView(why=jobcomment.scan(comment) or "not in canonical form")
        return None
    preempt = '"preempt":' + jobcomment.canonical(obj["preempt"]) if "preempt" in obj else None
    return CommentView(nuro=_pins(obj["nuro"]) if "nuro" in obj else None, preempt=preempt)


def read_nuro(comment: str | None) -> NuroRecord | None:
    """The ``nuro`` record of a canonical comment (pins checked), or None when there is none."""
    view = read_comment(comment)
    return view.nuro if view is not None else None


def _reject(table: Mapping[str, Any], reason: Reason, team: str | None, gpus: int, *args: object) -> Admission:
    rule = table["rules"][reason.value]
    return Admission(
        accepted=False, team=team, gpus=gpus, reason=reason, message=rule["message"] % args, code=rule["code"]
    )


def decide(
    request: JobRequest,
    policy: Policy | Mapping[str, Any],
    *,
    leaf_size: int = 4,
    gpus_per_node: int = 8,
    switch_wait_s: int = DEFAULT_SWITCH_WAIT_S,
) -> Admission:
    """What job_submit.lua does with ``request``: pure, no cluster access.

    Args:
        request: the submission.
        policy: the validated policy, or an already built policy table (``policy_table(...)``); the keyword
            arguments only apply to a Policy.

    Returns:
        An accepted Admission with the final values, or a rejected one with the exact message sbatch will show.
    """
    table = policy_table(policy, leaf_size, gpus_per_node, switch_wait_s) if isinstance(policy, Policy) else policy
    if request.user == ROOT_USER:  # job_submit.lua: submit_uid 0 is let through first
        return Admission(
            accepted=True,
            qos=request.qos,
            account=request.account,
            requeue=request.requeue,
            switches=request.switches,
            switch_wait_s=request.switch_wait_s,
            segment=request.segment,
        )
    users, teams = table["users"], table["teams"]
    own_team = users.get(request.user)
    # The job's team: the team of --account when given (None for a non-team account), else the user's team.
    team = own_team if request.account is None else request.account if request.account in teams else None
    gpus = request.total_gpus
    nodes = request.node_count

    # 1. account of another team
    if own_team is not None and request.account is not None and request.account != own_team and team is not None:
        return _reject(table, Reason.ACCOUNT_OTHER_TEAM, team, gpus, request.user, own_team, request.account, own_team)
    # 2. g-/b- QOS of a team that is not the job's
    owner = table["qos_team"].get(request.qos) if request.qos is not None else None
    if owner is not None and owner != team:
        if team is not None:
            return _reject(
                table, Reason.QOS_OTHER_TEAM, team, gpus, request.qos, owner, team, team,
                teams[team]["guaranteed_qos"],
            )  # fmt: skip
        return _reject(table, Reason.QOS_NO_TEAM, team, gpus, request.qos, owner, request.user, request.user, owner)
    # 2b. b-<team>: only the controller (root) moves jobs there
    if owner is not None and teams[owner]["borrow_qos"] == request.qos and "qos_borrow" in table["rules"]:
        return _reject(table, Reason.QOS_BORROW, team, gpus, request.qos, owner, owner, teams[owner]["guaranteed_qos"])
    # 3. tier QOS (urgent, ...) only for the allowed accounts/users
    tier = table["tiers"].get(request.qos) if request.qos is not None else None
    account = request.account if request.account is not None else team
    if tier is not None and not (
        request.user in tier["users"] or (account is not None and account in tier["accounts"])
    ):
        account_text = f"account {account}" if account is not None else "no account given"
        return _reject(
            table, Reason.TIER_DENIED, team, gpus, request.qos, tier["who"], request.user, account_text,
            request.qos, request.qos,
        )  # fmt: skip
    # 4. GPUs above quota + borrowing limit
    if team is not None and gpus > teams[team]["max_gpus"]:
        t = teams[team]
        return _reject(
            table, Reason.GPU_CAP, team, gpus, team, t["max_gpus"], t["quota_gpus"], t["borrow_limit_gpus"], gpus
        )

    # 4a-4c. the nuro record: valid pins, for the job's team; required for team GPU jobs with require_pinning
    view = read_comment(request.comment)
    if "comment_not_canonical" in table["rules"]:
        # 5a/5b. a comment that looks like a record must be one; preempt marks are the controller's alone
        if view is not None and view.why is not None:
            return _reject(table, Reason.COMMENT_NOT_CANONICAL, team, gpus, view.why)
        if view is not None and view.preempt is not None:
            return _reject(table, Reason.PREEMPT_FORGED, team, gpus)
    if "pin_fields" in table:
        rec = view.nuro if view is not None else None
        if rec is not None and rec.bad is not None:
            fields = table["pin_fields"]
            return _reject(table, Reason.PIN_INVALID, team, gpus, rec.bad, fields[rec.bad], team or "<team>")
        charged = request.account if request.account is not None else team
        if rec is not None and rec.team != charged:
            text = f"account {charged}" if charged is not None else "your default account, which is no team"
            return _reject(table, Reason.PIN_TEAM, team, gpus, rec.team, text, rec.team)
        if table["require_pinning"] and rec is None and team is not None and gpus > 0:
            return _reject(table, Reason.PIN_REQUIRED, team, gpus, team, team)

    result = Admission(
        accepted=True,
        qos=request.qos,
        account=request.account,
        requeue=request.requeue,
        switches=request.switches,
        switch_wait_s=request.switch_wait_s,
        segment=request.segment,
        team=team,
        gpus=gpus,
    )
    changes: list[str] = []
    # 5./6. team defaults and requeue
    if team is not None:
        if request.qos is None:
            result = replace(result, qos=teams[team]["guaranteed_qos"])
            changes.append(f"qos={result.qos}")
        if request.account is None:
            result = replace(result, account=team)
            changes.append(f"account={team}")
        if request.requeue is not True:
            result = replace(result, requeue=True)
            changes.append("requeue=1")
    # 7. topology hint: keep a job that fits one leaf on one leaf. topology/tree: --switches=1, never waiting longer
    # than switch_wait_s; topology/block: the whole job one segment (a fixed node count only: Slurm refuses a
    # segment that does not divide the job). No hint when the job chose its own placement.
    hint = table.get("topology_hint", "switches")
    if request.switches is None and request.segment is None and 2 <= nodes <= table["leaf_nodes"]:
        if hint == "switches":
            result = replace(result, switches=1, switch_wait_s=table["switch_wait_s"])
            changes.append(f"switches=1@{table['switch_wait_s']}s")
        elif hint == "segment" and request.fixed_nodes:
            result = replace(result, segment=nodes)
            changes.append(f"segment={nodes}")
    return replace(result, changes=tuple(changes))


# --- sbatch arguments → JobRequest -------------------------------------------------------------------------------

_GPU_ITEM = re.compile(r"^(?:gres[:/])?([^:=]+)(.*)$")
_COUNT = re.compile(r"[:=](\d+)$")


def gpu_count(spec: str | None) -> int:
    """GPUs in a TRES/GRES list as Slurm stores it ("gres:gpu:8", "gpu:a100:2", "gres:gpu:2,gres:mps:100").

    Mirrors ``gpus_in`` in job_submit.lua: a ``gpu`` entry without a count means 1; other GRES are ignored.
    """
    total = 0
    for item in (spec or "").split(","):
        m = _GPU_ITEM.match(item)
        if m and m.group(1) == "gpu":
            count = _COUNT.search(m.group(2))
            total += int(count.group(1)) if count else 1
    return total


def _time_s(text: str) -> int:
    """Slurm's time_str2secs for the formats sbatch accepts: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(p) for p in text.split(":")]
        h, m, s = (parts + [0, 0])[:3]
        return days * 86400 + h * 3600 + m * 60 + s
    parts = [int(p) for p in text.split(":")]
    if len(parts) == 1:
        return parts[0] * 60
    if len(parts) == 2:
        return parts[0] * 60 + parts[1]
    if len(parts) == 3:
        return parts[0] * 3600 + parts[1] * 60 + parts[2]
    raise ValueError(f"not a Slurm time: {text!r}")


#: sbatch options read for admission: (short, long) → field handler name.
_VALUED = {
    "-N": "nodes", "--nodes": "nodes", "-n": "tasks", "--ntasks": "tasks", "--ntasks-per-node": "tasks_per_node",
    "--sockets-per-node": "sockets_per_node", "-A": "account", "--account": "account", "-q": "qos", "--qos": "qos",
    "-G": "gpus", "--gpus": "gpus", "--gpus-per-node": "gpus_per_node", "--gpus-per-task": "gpus_per_task",
    "--gpus-per-socket": "gpus_per_socket", "--gres": "gres", "--switches": "switches", "--segment": "segment",
    "--comment": "comment",
}  # fmt: skip
#: Options that do not change admission but are fine to pass (value taken from the next word when not given with =).
_IGNORED_VALUED = {"-J", "--job-name", "-o", "--output", "-e", "--error", "-t", "--time", "--wrap", "-c",
                   "--cpus-per-task", "--mem", "-p", "--partition", "-D", "--chdir"}  # fmt: skip
_IGNORED_FLAGS = {"-H", "--hold", "--parsable"}
_SHORT_VALUED = {o for o in (*_VALUED, *_IGNORED_VALUED) if len(o) == 2}


def parse_sbatch_args(user: str, argv: Sequence[str]) -> JobRequest:
    """A JobRequest from sbatch options, read the way sbatch 22.05 turns them into a job_desc.

    Only the options that matter for admission are understood (plus a few harmless ones); anything else raises, so a
    vector or a wrapper cannot silently disagree with what sbatch would send.

    Raises:
        ValueError: an unknown option or a malformed value.
    """
    values: dict[str, Any] = {}
    per_node_specs: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("--requeue", "--no-requeue", "--requeue=expedite"):  # =expedite: 25.11+ (requeue, sooner)
            values["requeue"] = arg != "--no-requeue"
            continue
        if arg in _IGNORED_FLAGS:
            continue
        name, value = arg, None
        if arg.startswith("--") and "=" in arg:
            name, value = arg.split("=", 1)
        elif not arg.startswith("--") and len(arg) > 2 and arg[:2] in _SHORT_VALUED:
            name, value = arg[:2], arg[2:]
        if name not in _VALUED and name not in _IGNORED_VALUED:
            known = sorted(set(_VALUED) | _IGNORED_VALUED | _IGNORED_FLAGS | {"--requeue", "--no-requeue"})
            raise ValueError(f"sbatch option {arg!r} is not understood by the admission preview; known: {known}")
        if value is None:
            if i >= len(args):
                raise ValueError(f"sbatch option {name} needs a value")
            value = args[i]
            i += 1
        key = _VALUED.get(name)
        if key is None:
            continue
        if key == "nodes":
            lo, _, hi = value.partition("-")
            values["nodes"], values["max_nodes"] = int(lo), int(hi or lo)
        elif key in ("tasks", "tasks_per_node", "sockets_per_node", "segment"):
            values[key] = int(value)
        elif key in ("account", "qos", "comment"):
            values[key] = value
        elif key == "gpus":
            values["gpus_per_job"] = gpu_count("gpu:" + value)
        elif key in ("gpus_per_node", "gpus_per_task", "gpus_per_socket"):
            if key == "gpus_per_node":
                per_node_specs.insert(0, "gpu:" + value)
            else:
                values[key] = gpu_count("gpu:" + value)
        elif key == "gres":
            per_node_specs.append(value)
        elif key == "switches":
            count, _, wait = value.partition("@")
            values["switches"] = int(count)
            if wait:
                values["switch_wait_s"] = _time_s(wait)
    if per_node_specs:  # sbatch joins --gpus-per-node and --gres into one tres_per_node list
        values["gpus_per_node"] = gpu_count(",".join(per_node_specs))
    fixed_nodes = "nodes" in values and values["nodes"] == values["max_nodes"]
    if values.get("tasks") is None and values.get("tasks_per_node") is not None and fixed_nodes:
        values["tasks"] = values["nodes"] * values["tasks_per_node"]  # as sbatch does: ntasks = nodes × per node
    return JobRequest(user=user, **values)


__all__ = [
    "Admission",
    "CommentView",
    "JobRequest",
    "NuroRecord",
    "Reason",
    "decide",
    "gpu_count",
    "parse_sbatch_args",
    "read_comment",
    "read_nuro",
]

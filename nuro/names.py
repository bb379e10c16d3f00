"""The names nuro accepts, defined once: teams, users, runs, tags, job ids, node names, dataset names and digests.

Why one home: the same name is checked by the submit commands, the job_submit bridge's Python twin, root's prolog and
epilog, the controller and the S3 key builders, and a name one of them accepts and another refuses is a job that
passes admission and fails on the node (or the reverse). Every Python check uses these patterns; the Lua bridge's
are held to them by the shared vectors (tests/unit/test_names.py). The bottom floor of the core: standard library
only, imported by every layer above it and importing none of them.

Each pattern is the bare regular expression (no anchors): ``re.fullmatch`` it, or anchor it where a library wants
``^...$`` (pydantic's ``pattern``).
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: A team: a Slurm account (and the ``g-``/``b-`` QOS names built from it): lower case, digits and '_', no dashes.
TEAM = r"[a-z][a-z0-9_]{0,30}"
#: A team member: a POSIX user name as useradd accepts it.
USER = r"[a-z_][a-z0-9_.-]{0,31}"
#: A run (the job spec's ``name``): what checkpoints, events and metrics are filed under.
RUN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
#: A checkpoint tag or a dataset tag.
TAG = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
#: A Slurm job id as nuro writes it into paths and keys (``1234``, ``1234_5`` for an array task).
JOB_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
#: A Slurm node name (slurm.conf ``NodeName``: a host name; '_' allowed for emulated nodes).
NODE = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
#: A dataset name (``<team>.<name>`` for a team-owned one).
DATASET = r"[a-z0-9][a-z0-9._-]{0,62}"
#: A content digest: sha256 in lower-case hex.
DIGEST = r"sha256:[0-9a-f]{64}"
#: A whole number as Slurm, a user or a job writes it (a job id, a count, a rank): ASCII digits only. Not
#: ``str.isdigit``: it passes "²" and other digits ``int()`` then refuses with a ValueError.
DECIMAL = r"[0-9]+"

_TEAM = re.compile(TEAM, re.ASCII)
_USER = re.compile(USER, re.ASCII)
_RUN = re.compile(RUN, re.ASCII)
_TAG = re.compile(TAG, re.ASCII)
_JOB_ID = re.compile(JOB_ID, re.ASCII)
_NODE = re.compile(NODE, re.ASCII)
_DATASET = re.compile(DATASET, re.ASCII)
_DIGEST = re.compile(DIGEST, re.ASCII)
_DECIMAL = re.compile(DECIMAL, re.ASCII)


class InvalidName(ValueError):
    """A name nuro refuses; the message says what a valid one looks like."""


def _matcher(rx: re.Pattern[str]) -> Callable[[object], bool]:
    def matches(value: object) -> bool:
        return isinstance(value, str) and rx.fullmatch(value) is not None

    return matches


is_team = _matcher(_TEAM)
is_user = _matcher(_USER)
is_run = _matcher(_RUN)
is_tag = _matcher(_TAG)
is_job_id = _matcher(_JOB_ID)
is_node = _matcher(_NODE)
is_dataset = _matcher(_DATASET)
is_digest = _matcher(_DIGEST)
is_decimal = _matcher(_DECIMAL)


def validate_team(team: object) -> str:
    if not is_team(team):
        raise InvalidName(
            f"bad team {team!r}: use 1-31 lower-case letters, digits or '_', starting with a letter (the Slurm account)"
        )
    return team  # type: ignore[return-value]  # is_team: a str


def validate_run(run: object) -> str:
    if not is_run(run):
        raise InvalidName(
            f"bad run name {run!r}: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return run  # type: ignore[return-value]


def validate_tag(tag: object) -> str:
    if not is_tag(tag):
        raise InvalidName(f"bad tag {tag!r}: use 1-128 letters, digits, '.', '_' or '-'")
    return tag  # type: ignore[return-value]


def validate_job_id(job_id: object) -> str:
    if not is_job_id(job_id):
        raise InvalidName(f"bad job id {job_id!r}: expected letters, digits, '.', '_' or '-' (e.g. 1234)")
    return job_id  # type: ignore[return-value]


def validate_node(node: object) -> str:
    if not is_node(node):
        raise InvalidName(f"bad node name {node!r}: expected a Slurm node name (letters, digits, '._-')")
    return node  # type: ignore[return-value]


__all__ = [
    "DATASET", "DECIMAL", "DIGEST", "JOB_ID", "NODE", "RUN", "TAG", "TEAM", "USER", "InvalidName", "is_dataset",
    "is_decimal", "is_digest", "is_job_id", "is_node", "is_run", "is_tag", "is_team", "is_user", "validate_job_id",
    "validate_node", "validate_run", "validate_tag", "validate_team",
]  # fmt: skip

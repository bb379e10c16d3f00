"""Parsing of Slurm's text outputs: ``scontrol show -o``, topology, ``sacctmgr -P -n``, ``sacct -P``, one-job
``squeue -o`` reads, ``sbatch --parsable``, ``--version`` lines and the ``squeue -o`` fallback. Pure functions;
re-exported by ``nuro.slurm.parse``.

Why text at all: in 22.05 ``scontrol`` and ``sacctmgr`` have no ``--json``, topology is only in
``scontrol show topology``, 22.05's ``squeue --json`` ignores ``-j`` (a one-job read would list every job), and
22.05's ``sacct --json`` loses exit codes.

The rule (issue 11): no user-chosen value (job name, comment, work dir, std paths, command, mail user, ...) may add
or change a field. Slurm's text never escapes values, so a value can contain `` Key=``, ``|``, the 0x1f separator
and newlines. Each text read below is safe for its own reason:

Per call site (command: why no user value can move a field):

* ``CliBackend.job_comment`` / ``job_state`` / ``job_record``: ``squeue -h -t all -j ID -O 'JobArrayID:0|,F:0'``,
  one call per user-chosen field F (Name, Comment, WorkDir, Command, STDOUT, STDERR, STDIN). One job, one value,
  and it is last: the prefix must be exactly the job's own id (never holds '|'), and everything after the first '|'
  up to the final newline is the value (``parse_squeue_one_field``). The record's other fields come in one call of
  fields no user chooses, each followed by '|', whose count is checked (``parse_squeue_fixed_fields``). An array or
  het record (id "ID_n" / "ID+n", possibly with more records) goes to the JSON read instead.
* ``CliBackend.site_factors``: ``sprio -h -o '%i|%S'``. A job id and a number; no user-chosen field.
* ``CliBackend.partitions``: ``scontrol show -o partition``. A partition record holds admin config only.
* ``CliBackend.topology``: ``scontrol show topology``. Admin config only.
* ``healthcheck.act.node_drain_state``: ``scontrol show -o node``. A node record holds no user-chosen value; its
  free text (OS, Reason, Comment, Extra: host and admin) ends only at a key Slurm prints after it (``_FREE_TEXT``),
  so a reason cannot set State.
* ``parse_node_addr`` (``wrappers.launch.node_addr``): the ``NodeAddr`` of ``scontrol show node -o NAME``: Slurm
  prints it before any free text, which cannot set it (``_FREE_TEXT``). (``nuro.jobspec.render``'s job-script
  ``sed`` takes the last one: only an admin's reason could hold one.)
* ``CliBackend.finished_jobs`` (exit codes): ``sacct -n -P -X -o JobIDRaw,ExitCode,State``. None of the three can
  hold '|' or a newline (digits, "N:M", a state word or "CANCELLED by UID"); each line must have exactly 3 values.
* ``nuro.policy.slurm_state``: ``sacctmgr -P -n show qos/account/assoc/user``. Names and limits an admin set (a
  user picks none of them); the value count is checked per line.
* ``CliBackend.submit``: ``sbatch --parsable``. The job id (and cluster) only.
* fallback jobs (Slurm < 21.08 only): ``squeue -o`` of fixed fields. Names and comments are NOT read (two free
  fields cannot be split safely); each line must have exactly the fixed fields.

What nuro never parses as text: job records (``scontrol show job -o``). With two or more free fields (JobName, Comment,
WorkDir, StdOut, Command, ... and 26.05's SubmitLine) the split is ambiguous whatever parser is used, and a name with
a newline prints a second "JobId=..." line. ``parse_scontrol_show_oneliner`` still reads such text for tests and
tools on trusted jobs; nuro's own job reads are JSON (``squeue --json``, ``sacct --json``) or the one-field reads.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from nuro.slurm import hostlist
from nuro.slurm._fields import as_int, decode_exit_pair, gpu_count_from_gres, text_to_dt
from nuro.slurm.errors import SlurmParseError
from nuro.slurm.models import JobInfo, NodeInfo, PartitionInfo, SlurmVersion
from nuro.slurm.states import to_phase

log = logging.getLogger(__name__)

# A Slurm key: CamelCase starting upper-case; may hold '/', ':' and '_' ("CPUs/Task", "AllocNode:Sid",
# "MCS_label", "ReqB:S:C:T").
_KEY = re.compile(r"^([A-Z][A-Za-z0-9_/:.]*)=(.*)$", re.DOTALL)


#: Free-text values of records nuro reads as text, by record kind (its first key), and the keys Slurm prints after
#: each (``slurm_sprint_node_table`` in src/api/node_info.c, 22.05 to 26.05). Inside such a value a `` Key=`` token
#: starts a new field only if Key is one of those followers, so the text cannot set a field printed before it
#: (State, NodeAddr, ...) nor an unknown one.
_FREE_TEXT: dict[str, dict[str, frozenset[str]]] = {
    "NodeName": {
        "OS": frozenset({"RealMemory"}),
        "Reason": frozenset({"Comment", "Extra", "InstanceId", "InstanceType", "ReservationName"}),
        "Comment": frozenset({"Extra", "InstanceId", "InstanceType", "ReservationName"}),
        "Extra": frozenset({"InstanceId", "InstanceType", "ReservationName"}),
    },
}


def _parse_record(line: str) -> dict[str, str]:
    """One ``Key=value Key=value`` record whose values may contain spaces.

    A space-separated token starts a new field only if it looks like ``Key=`` (upper-case first letter), that key
    has not been seen in this record and, inside a known free-text value (``_FREE_TEXT``), the key is one Slurm
    prints after that value; otherwise it belongs to the previous value. That keeps
    ``Reason=nuro test State=IDLE [root@2024-05-01T10:00:00]``, ``OS=Linux 6.1.0 #1 SMP ...`` and
    ``Comment={"run": "x"}`` whole. Job records stay ambiguous (see the module docstring): nuro does not read them.
    """
    record: dict[str, str] = {}
    current: str | None = None
    free: dict[str, frozenset[str]] = {}
    for token in line.split(" "):
        match = _KEY.match(token)
        key = match.group(1) if match else None
        if key is not None and not record:
            free = _FREE_TEXT.get(key, {})
        if key is not None and key not in record and (current not in free or key in free[current]):
            current = key
            record[current] = match.group(2)  # type: ignore[union-attr]
        elif current is not None:
            record[current] += " " + token
        elif token:
            log.debug("scontrol text: ignoring token before the first key token=%r", token)
    return {k: v.rstrip() for k, v in record.items()}


def parse_scontrol_show_oneliner(text: str) -> list[dict[str, str]]:
    """Parse ``scontrol show -o node|partition|topology`` into one dict per record (values raw strings).

    Also accepts the multi-line form (without ``-o``): an indented line continues the record above it.
    Lines such as "No jobs in the system" are skipped. Job records parse too, but only trust them for jobs whose
    names and comments you chose: a user's job name can add fields and records (module docstring).
    """
    logical: list[str] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        if raw[:1].isspace() and logical:
            logical[-1] += " " + raw.strip()
        else:
            logical.append(raw.strip())
    records = []
    for line in logical:
        record = _parse_record(line)
        if record:
            records.append(record)
    return records


def parse_scontrol_show_topology(text: str) -> dict[str, str]:
    """Map node name → its lowest-level switch or block from ``scontrol show topology``.

    topology/tree lines look like ``SwitchName=leaf01 Level=0 LinkSpeed=1 Nodes=gpu[001-004] Switches=(null)``; a
    spine also lists every node below it, so the switch with the lowest Level wins. topology/block (24.11+) lines
    look like ``BlockName=leaf01 BlockIndex=0 Nodes=gpu[001-004] BlockSize=4``, plus ``AggregatedBlock=leaf[01-02]``
    lines for the higher block sizes, which are not a node's own block. Empty output (topology/none or flat, or
    "No topology information available") gives an empty map.
    """
    best: dict[str, tuple[int, str]] = {}
    for rec in parse_scontrol_show_oneliner(text):
        name = rec.get("SwitchName") or rec.get("BlockName")
        if not name:
            continue
        level = as_int(rec.get("Level"), default=0)
        for node in hostlist.expand(rec.get("Nodes")):
            if node not in best or level < best[node][0]:
                best[node] = (level, name)
    return {node: switch for node, (_, switch) in best.items()}


def topology_kind(text: str) -> str:
    """``tree`` (``SwitchName=`` lines), ``block`` (``BlockName=`` lines) or ``none``, from ``scontrol show topology``
    (the same records ``parse_scontrol_show_topology`` reads)."""
    records = parse_scontrol_show_oneliner(text)
    if any("BlockName" in rec for rec in records):
        return "block"
    if any("SwitchName" in rec for rec in records):
        return "tree"
    return "none"


def parse_node_addr(text: str) -> str | None:
    """The first node's ``NodeAddr`` in ``scontrol show node -o NAME`` output; None when there is none (no such node,
    or an empty address)."""
    records = parse_scontrol_show_oneliner(text)
    return (records[0].get("NodeAddr") or None) if records else None


def attach_switches(nodes: Iterable[NodeInfo], switch_of: dict[str, str]) -> list[NodeInfo]:
    """Copies of ``nodes`` with ``switch`` set from a ``parse_scontrol_show_topology`` map (None if absent)."""
    return [replace(n, switch=switch_of.get(n.name)) for n in nodes]


def parse_scontrol_partitions(text: str) -> list[PartitionInfo]:
    """Partitions from ``scontrol show -o partition`` (22.05's ``sinfo --json`` has no partition list)."""
    parts = []
    for rec in parse_scontrol_show_oneliner(text):
        if "PartitionName" not in rec:
            continue
        parts.append(
            PartitionInfo(
                name=rec["PartitionName"],
                nodes=tuple(hostlist.expand(rec.get("Nodes"))),
                state=rec.get("State", "UNKNOWN").upper(),
                total_cpus=as_int(rec.get("TotalCPUs")),
                total_nodes=as_int(rec.get("TotalNodes")),
                default=rec.get("Default", "NO").upper() == "YES",
            )
        )
    return parts


def parse_sacct_exitcodes(text: str) -> dict[int, tuple[int | None, int | None]]:
    """``sacct -n -P -X -o JobIDRaw,ExitCode,State`` → {job id: (exit code, signal)}.

    Why: 22.05's ``sacct --json`` reports every normal exit as success (see ``parse._exit_of``); the text
    form "3:0" is right. Lines for steps ("123.batch") and array/het ids that are not plain integers are skipped.
    Only these three fields: none can hold '|' or a newline, so a job's name or comment (never asked for) cannot
    shift a value, and a line with another count raises.
    """
    out: dict[int, tuple[int | None, int | None]] = {}
    for row in parse_sacctmgr_parsable(text, ("JobIDRaw", "ExitCode", "State")):
        if row["JobIDRaw"].isdigit():
            out[int(row["JobIDRaw"])] = decode_exit_pair(row["ExitCode"])
    return out


def parse_sacctmgr_parsable(text: str, fields: Sequence[str]) -> list[dict[str, str]]:
    """Parse ``sacctmgr -P -n show ... format=<fields>`` ('|' separated, no header) into dicts keyed by ``fields``.

    Also accepts ``-p`` output (a trailing '|'). Raises ``SlurmParseError`` when a line has a different number of
    values than ``fields`` (which happens if the format= list and ``fields`` disagree).
    """
    names = [f.strip() for f in fields]
    rows: list[dict[str, str]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        values = line.split("|")
        if len(values) == len(names) + 1 and values[-1] == "":
            values = values[:-1]
        if len(values) != len(names):
            raise SlurmParseError(
                f"sacctmgr line {lineno} has {len(values)} values for {len(names)} fields {names}: {line!r}; "
                "make the format= list match the fields passed to parse_sacctmgr_parsable"
            )
        rows.append(dict(zip(names, values, strict=True)))
    return rows


_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$")


#: Slurm's AuthInfo cred_expire when slurm.conf sets none: how long a job's launch credential, and slurmd's memory of
#: the job, outlive the job's end.
DEFAULT_CRED_EXPIRE_S = 120


def parse_cred_expire(text: str) -> int:
    """``cred_expire`` from ``scontrol show config``'s ``AuthInfo`` line (admin config), else Slurm's default."""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AuthInfo":
            m = re.search(r"(?:^|,)\s*cred_expire=(\d+)", value.strip())
            if m:
                return int(m.group(1))
    return DEFAULT_CRED_EXPIRE_S


def parse_slurm_duration_s(text: str) -> int | None:
    """A Slurm duration as printed by ``sacctmgr``/``scontrol`` ("00:01:00", "1-02:03:04", "05:00") → seconds.

    Why here: ``sacctmgr show qos format=GraceTime`` prints ``[D-]HH:MM:SS`` even though ``GraceTime=`` is set in
    seconds, and 22.05 has no raw form. "", "UNLIMITED", "INVALID" and "Partition_Limit" give None.
    """
    value = (text or "").strip()
    if value.upper() in ("", "UNLIMITED", "INVALID", "PARTITION_LIMIT", "N/A"):
        return None
    match = _DURATION.match(value)
    if not match:
        raise SlurmParseError(f"not a Slurm duration: {value!r} (expected [D-]HH:MM:SS or MM:SS)")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


_PER_JOB_ERROR = re.compile(r"^(?P<message>.+?) for job (?P<job>\d+)\s*$")


def parse_per_job_errors(text: str) -> dict[int, str]:
    """The jobs a list update refused, from scontrol's stderr: one ``<message> for job <id>`` line each
    (22.05: "Job is no longer pending execution for job 4", "Invalid job id specified for job 99999"). Lines of
    another shape are ignored; the caller treats an rc ≠ 0 with none of these lines as every job failing."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        m = _PER_JOB_ERROR.match(line.strip())
        if m:
            out[int(m.group("job"))] = m.group("message")
    return out


#: ``sprio -h -o`` format of ``CliBackend.site_factors``: job id and site factor, neither ever chosen by a user.
SPRIO_SITE_FACTOR_FORMAT = "%i|%S"


def parse_sprio_site_factors(text: str) -> dict[int, int]:
    """Pending jobs' SiteFactor from ``sprio -h -o '%i|%S'`` (job id, weighted admin priority). Lines that are not
    exactly "<integer id>|<integer>" (an array task "123_4", a header) are skipped: the controller then sets that job's
    value again, which costs one update, never a wrong decision."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].lstrip("-").isdigit():
            out[int(parts[0])] = int(parts[1])
    return out


def parse_sbatch_parsable(text: str) -> int:
    """The job id from ``sbatch --parsable`` stdout: "123" or "123;cluster"."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    head = lines[-1].split(";", 1)[0] if lines else ""
    if not head.isdigit():
        raise SlurmParseError(f"sbatch --parsable printed no job id: {text[:200]!r}")
    return int(head)


_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


_DATA_PARSER = re.compile(r"^\s*data_parser/(v(\d+)\.(\d+)\.(\d+))\s*$", re.MULTILINE)


def newest_data_parser(text: str) -> str | None:
    """The newest ``data_parser/vX.Y.Z`` in ``squeue --json=list`` output (as ``vX.Y.Z``), None when it lists none
    (a Slurm that does not know ``--json=list``, or an error text)."""
    found = [(tuple(int(g) for g in m.groups()[1:]), m.group(1)) for m in _DATA_PARSER.finditer(text or "")]
    return max(found)[1] if found else None


def parse_version(text: str) -> SlurmVersion:
    """Parse "slurm 22.05.8" / "slurm-wlm 22.05.8" / "22.05.8" → SlurmVersion(22, 5, 8)."""
    match = _VERSION.search(text or "")
    if not match:
        raise SlurmParseError(f"no Slurm version in {text[:120]!r}")
    return SlurmVersion(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))


#: ``squeue -O`` for one field of one job: the record's own id (``JobArrayID``: "123", or "123_4" / "123+0"), '|',
#: then the value, alone and last (width 0: never cut, never padded).
ONE_FIELD_FORMAT = "JobArrayID:0|,{field}:0"


def fixed_fields_format(fields: Sequence[str]) -> str:
    """``squeue -O`` for fields no user chooses, each followed by '|', after the record's id."""
    return ",".join(f"{f}:0|" for f in ("JobArrayID", *fields))


def _head_is(text: str, job_id: int) -> bool:
    return text.split("\n", 1)[0].split("|", 1)[0] == str(job_id)


def parse_squeue_one_field(text: str, job_id: int) -> str | None:
    """The value from ``squeue -h -t all -j JOB_ID -O ONE_FIELD_FORMAT`` stdout; None when it is not one plain job.

    Why this is exact whatever the value holds (spaces, ``Key=``, '|', newlines): the output is "<id>|<value>\n" for
    one record, the id never holds '|', so the value is everything after the first '|' up to the last newline squeue
    adds. An id equal to ``job_id`` means a plain job, which ``-j`` matches alone; an array ("ID_3", "ID_[1-9]") or
    het ("ID+0") record can come with others, so None sends the caller to the JSON read. Slurm prints an unset value
    as "(null)", read as "".

    Raises:
        SlurmParseError: no output (the job vanished between the checks) or no final newline (cut off).
    """
    head, sep, rest = text.partition("|")
    if not sep:
        raise SlurmParseError(f"squeue printed no record for job {job_id}: {text[:120]!r}")
    if head != str(job_id):
        return None
    if not rest.endswith("\n"):
        raise SlurmParseError(f"squeue output for job {job_id} is cut off (no final newline): {text[-120:]!r}")
    value = rest[:-1]
    return "" if value == "(null)" else value


def parse_squeue_fixed_fields(text: str, job_id: int, fields: Sequence[str]) -> dict[str, str] | None:
    """``squeue -h -t all -j JOB_ID -O fixed_fields_format(fields)`` → {field: value}; None when not one plain job.

    Only for fields whose values no user chooses (states, ids, numbers, names an admin made): one line, exactly one
    '|' after each value, or ``SlurmParseError`` (fail closed rather than guess, should one ever hold '|').
    """
    if text and not _head_is(text, job_id):
        return None
    values = text.removesuffix("\n").split("|")
    if not text.endswith("\n") or "\n" in text[:-1] or len(values) != len(fields) + 2 or values[-1]:
        raise SlurmParseError(f"squeue -O line for job {job_id} is not {len(fields) + 1} fields: {text[:200]!r}")
    return {f: ("" if v == "(null)" else v) for f, v in zip(fields, values[1:-1], strict=True)}


# Fallback for Slurm without ``squeue --json`` (before 21.08): fixed fields only, separated by the ASCII unit
# separator. No job name or comment: with two free-text fields no separator is safe (both can hold it and newlines),
# so those are left empty on such a Slurm (nuro records and preempt marks are not seen there). None of the fields
# below is free text: ids, Slurm's own state and reason words, names an admin created, numbers, times, hostlists.
_SEP = "\x1f"
_FALLBACK_FIELDS = (
    "%A",
    "%u",
    "%T",
    "%r",
    "%a",
    "%q",
    "%P",
    "%Q",
    "%D",
    "%b",
    "%V",
    "%S",
    "%e",
    "%N",
)
SQUEUE_FALLBACK_FORMAT = _SEP.join(_FALLBACK_FIELDS)


def _none_if_na(value: str) -> str:
    return "" if value.strip() in ("N/A", "(null)") else value.strip()


def parse_squeue_format(text: str) -> list[JobInfo]:
    """Parse ``squeue -h -o SQUEUE_FALLBACK_FORMAT`` output.

    Less than the JSON path: no name or comment (see ``SQUEUE_FALLBACK_FORMAT``), no restart count, requeue flag or
    exit code (defaults), GPUs only from ``%b``, and times are the client's local time converted to UTC.

    Raises:
        SlurmParseError: a line without exactly the fixed fields.
    """
    jobs: list[JobInfo] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(_SEP)
        if len(parts) != len(_FALLBACK_FIELDS):
            raise SlurmParseError(f"squeue -o line has {len(parts)} fields, expected {len(_FALLBACK_FIELDS)}")
        jid, user, state, reason, acct, qos, part, prio, nnodes, gres, sub, start, end, nodes = parts
        node_count = as_int(nnodes)
        gres = _none_if_na(gres)
        per_node = gpu_count_from_gres(gres)
        jobs.append(
            JobInfo(
                job_id=as_int(jid),
                name="",
                user=user,
                state=state,
                phase=to_phase(state),
                reason=reason,
                account=acct,
                qos=qos,
                partition=part,
                priority=as_int(prio),
                nodes=tuple(hostlist.expand(_none_if_na(nodes))),
                node_count=node_count,
                gres_per_node=gres,
                gpus_per_node=per_node,
                gpus_total=per_node * node_count,
                comment="",
                submit_time=text_to_dt(sub),
                start_time=text_to_dt(start),
                end_time=text_to_dt(end),
            )
        )
    return jobs

"""All parsing of Slurm JSON output (squeue, sinfo, sacct ``--json``) into nuro's models. Pure functions.

Text outputs (scontrol -o, topology, sacctmgr -P, sbatch --parsable, versions, squeue -o) are parsed in
``parse_text``; both are re-exported here, so ``nuro.slurm.parse`` is the one place to look.

Shapes are Slurm 22.05's, which prints the REST API's v0.0.38 documents from the command line (squeue via
``src/plugins/openapi/v0.0.38/jobs.c``, sinfo via ``nodes.c``/``partitions.c``, sacct via
``src/plugins/openapi/dbv0.0.38``). Things to know about them, checked against that source:

* times are integer epoch seconds, 0 when unset; squeue's ``exit_code`` is a raw wait(2) status (768 = exit 3,
  15 = killed by SIGTERM); sacct's is a dict ``{"status": ..., "return_code": n, "signal": {...}}`` that loses
  non-zero exit codes (a 22.05 bug, see ``_exit_of``);
* a node's ``state`` is the lower-case base state ("idle", "mixed") and its flags are separate
  (``state_flags: ["DRAIN"]``); we compose Slurm's usual "IDLE+DRAIN" / "MIXED+DRAIN" (draining);
* ``sinfo --json`` has NO partitions in 22.05, only each node's partition names;
* GPUs per job are only in strings: ``tres_per_node`` ("gres:gpu:8", also for --gpus-per-node),
  ``tres_alloc_str`` ("...,gres/gpu=16");
* 22.05's ``squeue --json`` ignores squeue's filters (-j, -u, -t) and lists every job slurmctld holds, including
  ones finished within MinJobAge; filter client-side;
* with slurmctld unreachable, ``squeue --json``/``sinfo --json`` exit 0 with an empty list and an ``errors``
  entry: every reported error raises here (``_reported_error``), so "no answer" never reads as "no jobs";
* no topology switch is reported anywhere in JSON; it is attached from ``scontrol show topology``;
* ``standard_output``/``standard_error`` are the raw ``--output`` patterns ("" for the default), not the expanded
  paths scontrol prints (``_fields.expand_std_path``).

Why JSON for every job read (issue 11): JSON strings are escaped, so a job name or comment holding `` Comment=...``,
'|' or a newline stays one value of one job; Slurm's job text (``scontrol show job -o``) cannot be split safely (see
``parse_text``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from nuro.slurm import hostlist
from nuro.slurm._fields import (
    as_int,
    as_str,
    decode_wait_status,
    epoch_to_dt,
    expand_std_path,
    gpu_count_from_gres,
    gpus_from_tres,
    node_state_text,
)
from nuro.slurm.errors import SlurmError, SlurmParseError, SlurmUnavailable, classify_error
from nuro.slurm.models import JobInfo, NodeInfo, PartitionInfo
from nuro.slurm.parse_text import (
    SPRIO_SITE_FACTOR_FORMAT,
    SQUEUE_FALLBACK_FORMAT,
    attach_switches,
    newest_data_parser,
    parse_node_addr,
    parse_per_job_errors,
    parse_sacct_exitcodes,
    parse_sacctmgr_parsable,
    parse_sbatch_parsable,
    parse_scontrol_partitions,
    parse_scontrol_show_oneliner,
    parse_scontrol_show_topology,
    parse_sprio_site_factors,
    parse_squeue_fixed_fields,
    parse_squeue_format,
    parse_squeue_one_field,
    parse_version,
    topology_kind,
)
from nuro.slurm.states import JobPhase, to_phase

log = logging.getLogger(__name__)

__all__ = [
    "SPRIO_SITE_FACTOR_FORMAT",
    "SQUEUE_FALLBACK_FORMAT",
    "attach_switches",
    "parse_sacct_exitcodes",
    "parse_sacct_json",
    "parse_sacctmgr_parsable",
    "parse_node_addr",
    "parse_per_job_errors",
    "parse_sbatch_parsable",
    "parse_scontrol_partitions",
    "parse_scontrol_show_oneliner",
    "newest_data_parser",
    "parse_scontrol_show_topology",
    "topology_kind",
    "parse_sinfo_json",
    "parse_squeue_fixed_fields",
    "parse_squeue_format",
    "parse_squeue_json",
    "parse_squeue_job_record",
    "parse_sprio_site_factors",
    "parse_squeue_one_field",
    "parse_version",
    "partitions_from_nodes",
]

_NOT_ARRAY = {0, 0xFFFFFFFE, 0xFFFFFFFF}
_SACCT_NOTHING_FOUND = frozenset({9003})  # ESLURM_REST_EMPTY_RESULT: "Nothing found with query"


def _reported_error(what: str, errors: list[Any]) -> SlurmError:
    """The exception for Slurm errors carried inside a JSON document (the command itself exited 0).

    22.05 quirk: with slurmctld unreachable, ``squeue --json`` and ``sinfo --json`` exit 0 and print an empty list
    plus ``"errors": [{"error": "Unspecified error", "errno"/"error_number": -1, ...}]``. Reading that as "no jobs"
    would be wrong, so any reported error raises. An unspecific -1 from a full listing (no filter can be invalid)
    is a communication failure in practice: ``SlurmUnavailable``.
    """
    texts = []
    for err in errors:
        if isinstance(err, Mapping):
            parts = [as_str(err.get(k)) for k in ("source", "description", "error") if err.get(k)]
            texts.append(": ".join(parts))
        else:
            texts.append(str(err))
    message = f"{what} reported: " + "; ".join(texts)
    exc = classify_error((), 0, message)
    if type(exc) is SlurmError and any(
        isinstance(e, Mapping) and as_int(e.get("error_number", e.get("errno")), default=0) == -1 for e in errors
    ):
        exc = SlurmUnavailable(message + " (slurmctld unreachable?)", slurm_message=message)
    return exc


def _load(
    text: str, what: str, key: str | tuple[str, ...], benign_errors: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """Decode a Slurm JSON document, check it has ``key`` (or one of several layouts' keys) and raise on Slurm's own
    ``errors``.

    Errors whose number is in ``benign_errors`` (e.g. sacct's 9003 "Nothing found") mean an empty result.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"{what}: output is not JSON ({exc}); first bytes: {text[:120]!r}") from exc
    if not isinstance(doc, dict):
        raise SlurmParseError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    errors = [
        e
        for e in doc.get("errors") or []
        if e
        and not (isinstance(e, Mapping) and as_int(e.get("error_number", e.get("errno")), default=0) in benign_errors)
    ]
    if errors:
        raise _reported_error(what, errors)
    keys = (key,) if isinstance(key, str) else key
    if not any(k in doc for k in keys):
        raise SlurmParseError(f"{what}: no {' or '.join(map(repr, keys))} in the document (keys: {sorted(doc)})")
    return doc


def _array_id(value: object) -> int | None:
    number = as_int(value, default=0)
    return None if number in _NOT_ARRAY else number


def _job_from_squeue(d: Mapping[str, Any]) -> JobInfo:
    """One entry of squeue's ``jobs`` list (v0.0.38 ``dump_job_info``)."""
    state = _state_text(d.get("job_state"))
    phase = to_phase(state)
    node_count = as_int(d.get("node_count"))
    tres_per_node = as_str(d.get("tres_per_node"))
    gpus_per_node = gpu_count_from_gres(tres_per_node)
    gpus_total = gpus_from_tres(as_str(d.get("tres_alloc_str"))) or gpus_from_tres(as_str(d.get("tres_req_str")))
    if not gpus_total:
        gpus_total = (
            gpus_per_node * max(node_count, 1) if gpus_per_node else gpu_count_from_gres(as_str(d.get("tres_per_job")))
        )
    if not gpus_per_node and gpus_total and node_count:
        gpus_per_node = gpus_total // node_count
    exit_code, exit_signal = _exit_of(d.get("exit_code"), phase) if phase.is_terminal else (None, None)
    # 22.05: a PENDING job carries leftovers here (a requeued job: the requeue time as start_time and an end_time
    # in the 22nd century), so they are dropped; eligible_time is the meaningful "may start after" time.
    pending = phase is JobPhase.PENDING
    return JobInfo(
        job_id=as_int(d.get("job_id")),
        name=as_str(d.get("name")),
        user=as_str(d.get("user_name")) or str(as_int(d.get("user_id"))),
        state=state,
        phase=phase,
        reason=as_str(d.get("state_reason")),
        account=as_str(d.get("account")),
        qos=as_str(d.get("qos")),
        partition=as_str(d.get("partition")),
        priority=as_int(d.get("priority")),
        nodes=tuple(hostlist.expand(as_str(d.get("nodes")))),
        node_count=node_count,
        gres_per_node=tres_per_node,
        gpus_per_node=gpus_per_node,
        gpus_total=gpus_total,
        restart_count=as_int(d.get("restart_cnt")),
        comment=as_str(d.get("comment")),
        requeue=bool(d.get("requeue")),
        submit_time=epoch_to_dt(d.get("submit_time")),
        eligible_time=epoch_to_dt(d.get("eligible_time")),
        start_time=None if pending else epoch_to_dt(d.get("start_time")),
        end_time=None if pending else epoch_to_dt(d.get("end_time")),
        exit_code=exit_code,
        exit_signal=exit_signal,
        array_job_id=_array_id(d.get("array_job_id")),
        array_task_id=_array_id(d.get("array_task_id")) if _array_id(d.get("array_job_id")) else None,
    )


def parse_squeue_json(text: str) -> list[JobInfo]:
    """Parse ``squeue --json`` (22.05: the v0.0.38 jobs document) into jobs, in Slurm's order.

    Raises:
        SlurmParseError: not JSON, or no ``jobs`` list (e.g. slurmctld unreachable: Slurm's errors are quoted).
    """
    doc = _load(text, "squeue --json", "jobs")
    return [_job_from_squeue(j) for j in doc["jobs"] or []]


def _state_text(value: object) -> str:
    """A job state: 22.05's "RUNNING", or newer Slurm's ["RUNNING", "COMPLETING"] as "RUNNING+COMPLETING"."""
    if isinstance(value, list):
        return "+".join(as_str(v) for v in value)
    return as_str(value)


def _job_record(d: Mapping[str, Any]) -> dict[str, str]:
    """One squeue JSON job as the ``Key=value`` fields ``scontrol show job`` names them (values from the JSON)."""
    job_id = as_int(d.get("job_id"))
    user = as_str(d.get("user_name")) or str(as_int(d.get("user_id")))
    name = as_str(d.get("name"))
    work_dir = as_str(d.get("current_working_directory"))
    array_job = _array_id(d.get("array_job_id"))
    array_task = _array_id(d.get("array_task_id")) if array_job else None

    def std(key: str, expanded: str, default: str) -> str:
        if as_str(d.get(expanded)):  # 26.05: stdout_expanded / stderr_expanded
            return as_str(d.get(expanded))
        raw = as_str(d.get(key)) or default
        return expand_std_path(
            raw,
            job_id=job_id,
            user=user,
            name=name,
            work_dir=work_dir,
            array_job_id=array_job,
            array_task_id=array_task,
        )

    stdout = std("standard_output", "stdout_expanded", "")
    return {
        "JobId": str(job_id),
        "JobName": name,
        "UserId": f"{user}({as_int(d.get('user_id'))})",
        "GroupId": f"{as_str(d.get('group_name'))}({as_int(d.get('group_id'))})",
        "Account": as_str(d.get("account")),
        "QOS": as_str(d.get("qos")),
        "JobState": _state_text(d.get("job_state")),
        "Reason": as_str(d.get("state_reason")),
        "Requeue": "1" if d.get("requeue") else "0",
        "Restarts": str(as_int(d.get("restart_cnt"))),
        "Partition": as_str(d.get("partition")),
        "NodeList": as_str(d.get("nodes")),
        "BatchHost": as_str(d.get("batch_host")),
        "WorkDir": work_dir,
        "Command": as_str(d.get("command")),
        "Comment": as_str(d.get("comment")),
        "AdminComment": as_str(d.get("admin_comment")),
        "StdOut": stdout,
        "StdErr": std("standard_error", "stderr_expanded", as_str(d.get("standard_output"))),
        "StdIn": as_str(d.get("standard_input")) or "/dev/null",
    }


def parse_squeue_job_record(text: str, job_id: int) -> dict[str, str] | None:
    """The job ``job_id`` from ``squeue --json`` as scontrol-named fields (``_job_record``); None if not listed.

    Why not ``scontrol show job -o``: its text cannot be split safely (module docstring). 22.05's squeue lists
    every job whatever ``-j`` says, so the job is picked here by its id.
    """
    doc = _load(text, "squeue --json", "jobs")
    for entry in doc["jobs"] or []:
        if isinstance(entry, Mapping) and as_int(entry.get("job_id")) == job_id:
            return _job_record(entry)
    return None


def _node_from_json(d: Mapping[str, Any]) -> NodeInfo:
    """One entry of sinfo's ``nodes`` list (v0.0.38 ``_dump_node``)."""
    raw_state = d.get("state")
    if isinstance(raw_state, list):  # newer Slurm: ["IDLE", "DRAIN"]
        base, flags = (raw_state[0] if raw_state else "UNKNOWN"), list(raw_state[1:])
    else:
        base, flags = as_str(raw_state) or "UNKNOWN", list(d.get("state_flags") or [])
    state = node_state_text(base, flags)
    gres = as_str(d.get("gres"))
    tres_used = as_str(d.get("tres_used"))
    gpus_alloc = gpus_from_tres(tres_used) if tres_used else gpu_count_from_gres(as_str(d.get("gres_used")))
    return NodeInfo(
        name=as_str(d.get("name")),
        state=state,
        flags=frozenset(state.split("+")),
        reason=as_str(d.get("reason")) or None,
        gres=gres,
        gpus_total=gpu_count_from_gres(gres),
        gpus_alloc=gpus_alloc,
        cpus=as_int(d.get("cpus")),
        cpus_alloc=as_int(d.get("alloc_cpus")),
        partitions=tuple(d.get("partitions") or ()),
        switch=None,
        weight=_weight(d.get("weight")),
    )


def _weight(value: object) -> int | None:
    """A node's ``weight``: a number (22.05's sinfo, 24.11+'s scontrol) or ``{"minimum", "maximum"}`` over a
    24.11+ sinfo record's nodes (taken only when both agree); None when absent."""
    if isinstance(value, Mapping) and "minimum" in value:
        if value.get("minimum") != value.get("maximum"):
            return None
        value = value.get("minimum")
    weight = as_int(value, default=-1)
    return weight if weight >= 0 else None


def _nodes_from_sinfo_records(records: list[Any]) -> list[NodeInfo]:
    """24.11+'s ``sinfo --json``: records of alike nodes (``nodes.nodes`` their names, ``node.state`` like
    ``["IDLE", "DRAIN"]``, ``gres.total``/``gres.used`` per node, CPU counts summed over the record) → one NodeInfo
    per node. Captured (tests/fixtures/slurm/v24.11, v26.05): nodes with different GPU use are in different records,
    so a record's ``gres.used`` is each of its nodes'. A node in several partitions is in one record per partition:
    its partitions are merged."""
    by_name: dict[str, NodeInfo] = {}
    for r in records:
        if not isinstance(r, Mapping):
            continue
        names = [as_str(n) for n in (r.get("nodes") or {}).get("nodes") or []]
        raw = (r.get("node") or {}).get("state") or []
        raw = raw if isinstance(raw, list) else [raw]
        state = node_state_text(as_str(raw[0]) if raw else "UNKNOWN", [as_str(f) for f in raw[1:]])
        gres = r.get("gres") or {}
        cpus = r.get("cpus") or {}
        reason = r.get("reason")
        reason_text = as_str(reason.get("description")) if isinstance(reason, Mapping) else as_str(reason)
        partition = as_str((r.get("partition") or {}).get("name"))
        count = max(1, len(names))
        for name in names:
            seen = by_name.get(name)
            if seen is not None:
                if partition and partition not in seen.partitions:
                    by_name[name] = replace(seen, partitions=(*seen.partitions, partition))
                continue
            by_name[name] = NodeInfo(
                name=name,
                state=state,
                flags=frozenset(state.split("+")),
                reason=reason_text or None,
                gres=as_str(gres.get("total")),
                gpus_total=gpu_count_from_gres(as_str(gres.get("total"))),
                gpus_alloc=gpu_count_from_gres(as_str(gres.get("used"))),
                cpus=as_int(cpus.get("total")) // count,
                cpus_alloc=as_int(cpus.get("allocated")) // count,
                partitions=(partition,) if partition else (),
                switch=None,
                weight=_weight(r.get("weight")),
            )
    return sorted(by_name.values(), key=lambda n: n.name)


def _partition_from_json(d: Mapping[str, Any]) -> PartitionInfo:
    """One entry of a v0.0.38 ``partitions`` list (``_dump_part``)."""
    flags = {str(f).lower() for f in d.get("flags") or ()}
    state = d.get("state")
    if isinstance(state, list):
        state = state[0] if state else "UNKNOWN"
    nodes = d.get("nodes")
    if isinstance(nodes, dict):  # newer Slurm: {"configured": "gpu[001-008]", ...}
        nodes = nodes.get("configured")
    return PartitionInfo(
        name=as_str(d.get("name")),
        nodes=tuple(hostlist.expand(as_str(nodes))),
        state=as_str(state).upper() or "UNKNOWN",
        total_cpus=as_int(d.get("total_cpus")),
        total_nodes=as_int(d.get("total_nodes")),
        default="default" in flags,
    )


def partitions_from_nodes(nodes: list[NodeInfo]) -> list[PartitionInfo]:
    """Partitions as seen through the nodes' ``partitions`` lists (used when the document has none).

    State and the default flag are not knowable from nodes: state is "UNKNOWN" and default False.
    """
    members: dict[str, list[NodeInfo]] = {}
    for node in nodes:
        for part in node.partitions:
            members.setdefault(part, []).append(node)
    return [
        PartitionInfo(
            name=name,
            nodes=tuple(n.name for n in group),
            total_cpus=sum(n.cpus for n in group),
            total_nodes=len(group),
        )
        for name, group in members.items()
    ]


def parse_sinfo_json(text: str) -> tuple[list[NodeInfo], list[PartitionInfo]]:
    """Parse ``sinfo --json`` into (nodes, partitions).

    22.05 prints the v0.0.38 ``nodes`` document only; without a ``partitions`` list (always, on 22.05) partitions
    are derived from the nodes' memberships, with state "UNKNOWN" and default False: only
    ``scontrol show -o partition`` (``parse_scontrol_partitions``) knows those. 24.11 and later print
    ``{"sinfo": [...]}`` instead, one record per group of alike nodes (``_nodes_from_sinfo_records``); partitions
    are derived the same way. Switches are None here; see ``attach_switches``.
    """
    doc = _load(text, "sinfo --json", ("sinfo", "nodes"))
    if "sinfo" in doc:  # 24.11+
        nodes = _nodes_from_sinfo_records(doc["sinfo"] or [])
        return nodes, partitions_from_nodes(nodes)
    nodes = [_node_from_json(n) for n in doc["nodes"] or []]
    if "partitions" in doc:
        partitions = [_partition_from_json(p) for p in doc["partitions"] or []]
    else:
        partitions = partitions_from_nodes(nodes)
    return nodes, partitions


def _exit_of(value: object, phase: JobPhase) -> tuple[int | None, int | None]:
    """A job's exit code as squeue or sacct print it → (return code, signal); None where Slurm does not know.

    Three shapes: 22.05 squeue's raw wait(2) status (a number); 22.05 sacct's dbv0.0.38 dict
    ``{"status": "SUCCESS", "return_code": 0, "signal": {"signal_id": n}}``; and 24.11+'s dict, in squeue and sacct
    alike, ``{"status": ["ERROR"], "return_code": {"set", "number": 3}, "signal": {"id": {"set", "number"}}}``.

    22.05 bug (``_dump_job_exit_code`` in src/plugins/openapi/dbv0.0.38/parse.c): every normal exit is dumped as
    ``{"status": "SUCCESS", "return_code": 0}``, so ``exit 3`` reads as success. We trust "SUCCESS" only for a
    COMPLETED job and otherwise return None; ``CliBackend.finished_jobs`` fills those from sacct's text output.
    Newer versions say "ERROR" with the real code (captured: tests/fixtures/slurm/v24.11, v26.05), and a job stopped
    by scancel still says "SUCCESS" with 0, which is read the same way (None: not knowable from here).
    """
    if not isinstance(value, Mapping):
        return decode_wait_status(value)
    raw_status = value.get("status")
    if isinstance(raw_status, list):  # 24.11+: ["ERROR"], ["SIGNALED", ...]
        raw_status = raw_status[0] if raw_status else ""
    status = as_str(raw_status).upper()
    signal = value.get("signal") or {}
    sig = as_int(signal.get("signal_id", signal.get("id")), default=0) if isinstance(signal, Mapping) else 0
    if status == "SIGNALED" and sig:
        return None, sig
    if status == "SUCCESS":
        return (0, None) if phase is JobPhase.COMPLETED else (None, None)
    if status in ("", "PENDING"):
        return None, None
    return as_int(value.get("return_code"), default=0), (sig or None)


def _gpus_in_tres_list(items: object) -> int:
    """GPU count in a dbv0.0.38 TRES list: [{"type": "gres", "name": "gpu", "count": 16}, ...]."""
    total = typed = 0
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, Mapping) or as_str(item.get("type")) != "gres":
            continue
        name = as_str(item.get("name"))
        if name == "gpu":
            total += as_int(item.get("count"))
        elif name.startswith("gpu:"):
            typed += as_int(item.get("count"))
    return total or typed


def _job_from_sacct(d: Mapping[str, Any]) -> JobInfo:
    """One entry of sacct's ``jobs`` list (dbv0.0.38 ``parse_job``)."""
    state_obj = d.get("state") or {}
    state = as_str(state_obj.get("current")) if isinstance(state_obj, Mapping) else as_str(state_obj)
    if isinstance(state_obj, Mapping) and isinstance(state_obj.get("current"), list):
        state = "+".join(state_obj["current"])  # newer Slurm
    phase = to_phase(state)
    times = d.get("time") or {}
    tres = d.get("tres") or {}
    node_count = as_int(d.get("allocation_nodes"))
    gpus_total = _gpus_in_tres_list(tres.get("allocated")) or _gpus_in_tres_list(tres.get("requested"))
    comment = d.get("comment") or {}
    exit_code, exit_signal = _exit_of(d.get("exit_code"), phase) if phase.is_terminal else (None, None)
    array = d.get("array") or {}
    qos = d.get("qos")
    return JobInfo(
        job_id=as_int(d.get("job_id")),
        name=as_str(d.get("name")),
        user=as_str(d.get("user")),
        state=state,
        phase=phase,
        reason=as_str(state_obj.get("reason")) if isinstance(state_obj, Mapping) else "",
        account=as_str(d.get("account")),
        qos=as_str(qos.get("name") if isinstance(qos, Mapping) else qos),
        partition=as_str(d.get("partition")),
        priority=as_int(d.get("priority")),
        nodes=tuple(hostlist.expand(as_str(d.get("nodes")))),
        node_count=node_count,
        gpus_per_node=gpus_total // node_count if node_count else 0,
        gpus_total=gpus_total,
        comment=as_str(comment.get("job")) if isinstance(comment, Mapping) else as_str(comment),
        submit_time=epoch_to_dt(times.get("submission")),
        eligible_time=epoch_to_dt(times.get("eligible")),
        start_time=epoch_to_dt(times.get("start")),
        end_time=epoch_to_dt(times.get("end")),
        exit_code=exit_code,
        exit_signal=exit_signal,
        array_job_id=_array_id(array.get("job_id")),
        array_task_id=_array_id(array.get("task_id")) if _array_id(array.get("job_id")) else None,
    )


def merge_resized(records: Sequence[JobInfo]) -> list[JobInfo]:
    """Fold sacct's resize records into the attempt they belong to. When a ``--no-kill`` job loses a node, Slurm
    closes its accounting record as RESIZING and opens a new one for the same attempt (no requeue: the restart
    count stays); the attempt is one: its start from the first record, its nodes from all of them, the rest (state,
    end) from the last."""
    out: list[JobInfo] = []
    for rec in records:
        prev = out[-1] if out else None
        # 22.05 writes the closed record as RESIZING, 26.05 as PENDING+RESIZING
        if prev is not None and prev.job_id == rec.job_id and "RESIZING" in prev.state.split()[0].split("+"):
            out[-1] = replace(rec, start_time=prev.start_time or rec.start_time,
                              nodes=tuple(dict.fromkeys((*prev.nodes, *rec.nodes))))  # fmt: skip
        else:
            out.append(rec)
    return out


def parse_sacct_json(text: str) -> list[JobInfo]:
    """Parse ``sacct --json`` (22.05: the dbv0.0.38 jobs document) into jobs.

    sacct has no restart count nor requeue flag (both default), and its ``comment.job`` is only filled when
    slurm.conf has ``AccountingStoreFlags=job_comment``. A requeued job may appear once per run when sacct is
    called with ``--duplicates``; otherwise the latest run only.
    """
    doc = _load(text, "sacct --json", "jobs", benign_errors=_SACCT_NOTHING_FOUND)
    return [_job_from_sacct(j) for j in doc["jobs"] or []]

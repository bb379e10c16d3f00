"""The CLI backend's reads: jobs, nodes, partitions, topology, one job's fields, accounting, version.

Fallbacks of ``CliBackend``, each logged when taken:

* jobs: ``squeue --json`` (Slurm ≥ 21.08; 22.05 here); from 24.11 ``squeue --json=<newest data_parser>+complex``
  (``jobs_json_option``): plain numbers instead of ``{set, infinite, number}`` objects, half the bytes, 0.37 s
  instead of 0.63 s for 1,000 jobs at 500 nodes on 26.05, the same parsed jobs. If squeue rejects ``--json`` as an
  unknown option (older Slurm), the backend switches for good to ``squeue -h -a -t all -o <fixed format>``
  (``parse_squeue_format``), which lacks restart counts, requeue flags and exit codes.
* switches: ``scontrol show topology``, read once per backend and cached (topology only changes with a slurmctld
  restart; ``refresh_topology()`` forgets it). If it fails for a reason other than an unreachable controller or
  a timeout (e.g. topology/none), nodes get ``switch=None`` and one warning is logged.
* partitions: ``scontrol show -o partition`` (22.05's ``sinfo --json`` has none); on failure, derived from nodes.
* finished jobs: ``sacct --json -j a,b,...`` (one call for many jobs), plus one text ``sacct`` call
  for exit codes when 22.05's JSON lost them.

Job reads never parse ``scontrol show job`` text (issue 11: a job name with `` Comment=...`` or a newline added
fields and records there): the snapshot is JSON, ``job_comment``/``job_state``/``job_record`` read each user-chosen
value alone (``squeue -O 'JobArrayID:0|,Comment:0'``), array and het records from JSON. Which text reads remain
and why each is safe: ``nuro.slurm.parse_text``.
Why not ``scontrol show job --json ID`` for one job: it exists from 24.11 only, and 22.05's ``squeue --json`` lists
every job whatever ``-j`` says (a one-job read would cost a full listing). The one-field reads are exact on every
version and cost the same at any queue size; switching to scontrol's JSON on >= 24.11 waits for a capture from
that version to test it against.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from nuro.slurm._fields import expand_std_path
from nuro.slurm.cli_runner import CliRunner, in_daemon_thread, is_unknown_option, plain_job_id
from nuro.slurm.errors import InvalidJobId, SlurmError, SlurmTimeout, SlurmUnavailable
from nuro.slurm.hostlist import expand as expand_hostlist
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo, PartitionInfo, SlurmVersion
from nuro.slurm.parse import (
    SPRIO_SITE_FACTOR_FORMAT,
    SQUEUE_FALLBACK_FORMAT,
    attach_switches,
    merge_resized,
    newest_data_parser,
    parse_sacct_exitcodes,
    parse_sacct_json,
    parse_scontrol_partitions,
    parse_scontrol_show_topology,
    parse_sinfo_json,
    parse_sprio_site_factors,
    parse_squeue_format,
    parse_squeue_job_record,
    parse_squeue_json,
    parse_squeue_one_field,
    parse_version,
    partitions_from_nodes,
    topology_kind,
)
from nuro.slurm.parse_text import (
    ONE_FIELD_FORMAT,
    fixed_fields_format,
    parse_cred_expire,
    parse_squeue_fixed_fields,
)

log = logging.getLogger(__name__)


#: How old a partition list ``read_snapshot`` may reuse (``CliBackend.partitions``), seconds.
SNAPSHOT_PARTITIONS_MAX_AGE_S = 30.0
#: The first Slurm whose squeue the bulk job read asks for ``--json=<parser>+complex`` (measured on 24.11 and 26.05).
COMPLEX_JSON_SINCE = (24, 11)

#: ``job_record``'s fields no user chooses: (scontrol's name, squeue -O field). States, ids, numbers, names an admin
#: made (accounts, QOS, partitions, nodes), Slurm's reason words: none holds '|' or a newline.
RECORD_FIXED = (
    ("JobState", "State"),
    ("UserName", "UserName"),
    ("UserID", "UserID"),
    ("GroupName", "GroupName"),
    ("GroupID", "GroupID"),
    ("Account", "Account"),
    ("QOS", "QOS"),
    ("Reason", "Reason"),
    ("Requeue", "Requeue"),
    ("Restarts", "RestartCnt"),
    ("Partition", "Partition"),
    ("NodeList", "NodeList"),
    ("BatchHost", "BatchHost"),
)
#: ``job_record``'s user-chosen fields, each read alone (``parse_squeue_one_field``).
RECORD_FREE = (
    ("JobName", "Name"),
    ("WorkDir", "WorkDir"),
    ("Command", "Command"),
    ("Comment", "Comment"),
    ("StdOut", "STDOUT"),
    ("StdErr", "STDERR"),
    ("StdIn", "STDIN"),
)


class CliReads(CliRunner):
    """Every read of the CLI backend over ``CliRunner.run``, with what it caches per backend (topology, the JSON
    option, version, cred_expire, recent partitions)."""

    name = "cli"

    def __init__(
        self, env: Mapping[str, str] | None = None, timeout_s: float = 30.0, bin_dir: str | None = None
    ) -> None:
        super().__init__(env, timeout_s, bin_dir)
        self._topology: dict[str, str] | None = None
        self._topology_kind = "none"
        self._jobs_json: str | None = None
        self._version: SlurmVersion | None = None
        self._cred_expire: int | None = None
        self._squeue_json: bool = True
        self._partitions: tuple[float, list[PartitionInfo]] | None = None  # (read at, monotonic), scontrol's answer

    # -- reads ---------------------------------------------------------------------------------------------
    def jobs(self) -> list[JobInfo]:
        """One ``squeue --json -t all`` (or the ``-o`` fallback, see the module docstring).

        ``-t all``: 24.11 and later list ended jobs (still held by slurmctld, within MinJobAge) only when asked, as
        22.05 always did (it ignores squeue's filters with ``--json``); waiting for a job to end reads them here."""
        if self._squeue_json:
            try:
                return parse_squeue_json(self.run(["squeue", self.jobs_json_option(), "-t", "all"]).stdout)
            except SlurmError as exc:
                if not is_unknown_option(exc, "json"):
                    raise
                log.warning(
                    "squeue has no --json (Slurm < 21.08): using 'squeue -o' from now on; "
                    "restart counts, requeue flags and exit codes will be missing"
                )
                self._squeue_json = False
        log.debug("jobs path=squeue-format")
        return parse_squeue_format(self.run(["squeue", "-h", "-a", "-t", "all", "-o", SQUEUE_FALLBACK_FORMAT]).stdout)

    def jobs_json_option(self) -> str:
        """squeue's JSON option for the bulk job read, chosen once per backend: ``--json`` up to 23.11; from 24.11
        ``--json=<newest data_parser>+complex`` (``squeue --json=list``).

        Why: newer data_parsers wrap every number in ``{set, infinite, number}``; rendering 1,000 such jobs cost
        squeue 0.63 s of its own CPU on 26.05 at 500 nodes (docs/benchmarks.md), ``+complex`` writes plain numbers
        (infinite as "Infinity", unset as null, as 22.05 did) in half the bytes and 0.37 s. The parser reads both
        shapes; a Slurm that lists no parser, or fails to, keeps plain ``--json``.
        """
        if self._jobs_json is None:
            found = None
            try:
                if self._newer_json():
                    found = newest_data_parser(self.run(["squeue", "--json=list"]).stdout)
            except (SlurmUnavailable, SlurmTimeout):
                return "--json"  # transient: decide again on the next read
            except SlurmError as exc:
                log.warning("no data_parser list (%s): plain --json for job reads", exc)
            self._jobs_json = f"--json={found}+complex" if found else "--json"
            log.debug("jobs read option=%s", self._jobs_json)
        return self._jobs_json

    def topology(self) -> dict[str, str]:
        """Node → leaf switch (or base block), read once from ``scontrol show topology`` and cached."""
        if self._topology is None:
            try:
                text = self.run(["scontrol", "show", "topology"]).stdout
            except (SlurmUnavailable, SlurmTimeout):
                raise  # transient: do not cache an empty topology
            except SlurmError as exc:
                log.warning("scontrol show topology failed: nodes will have switch=None error=%s", exc)
                text = ""
            self._topology = parse_scontrol_show_topology(text)
            self._topology_kind = topology_kind(text)
        return self._topology

    def topology_kind(self) -> str:
        """``tree``, ``block`` or ``none`` (no topology plugin, or it could not be read); cached with ``topology``."""
        self.topology()
        return self._topology_kind

    def _job_entry(self, job_id: int) -> dict[str, str]:
        """One job from ``squeue --json`` as scontrol-named fields; raises ``InvalidJobId`` if slurmctld has none.

        For array and het records, whose one-field reads are ambiguous (``-j`` matches several records).

        ``-j`` is passed for the Slurm versions that honour it; 22.05 ignores it (the whole list, picked here).
        """
        record = parse_squeue_job_record(self.run(["squeue", "--json", "-t", "all", "-j", str(job_id)]).stdout, job_id)
        if record is None:
            raise InvalidJobId(f"slurmctld lists no job {job_id}", argv=["squeue", "--json"])
        return record

    def _one_job_output(self, argv: list[str], job_id: int) -> str:
        """stdout of a one-job squeue read; no record at all (the job just left slurmctld) is ``InvalidJobId``."""
        out = self.run(argv).stdout
        if not out.strip():
            raise InvalidJobId(f"slurmctld lists no job {job_id}", argv=argv)
        return out

    def _job_field(self, job_id: int | str, field: str, key: str) -> str:
        """One value of one job, exact whatever it holds: ``squeue -j ID -O 'JobArrayID:0|,<field>:0'`` (see
        ``parse_squeue_one_field``); an array or het record falls back to the JSON read (scontrol name ``key``)."""
        jid = plain_job_id(job_id)
        argv = ["squeue", "-h", "-t", "all", "-j", str(jid), "-O", ONE_FIELD_FORMAT.format(field=field)]
        value = parse_squeue_one_field(self._one_job_output(argv, jid), jid)
        if value is None:
            log.debug("job=%d is an array or het record: reading %s from squeue --json", jid, key)
            return self._job_entry(jid)[key]
        return value

    def job_record(self, job_id: int | str) -> dict[str, str]:
        """One job's fields named as ``scontrol show job`` names them (JobState, StdOut, Comment, Account, ...).

        Never from scontrol's text: a job name or comment holding `` Comment=...`` or a newline would add or change
        fields there (issue 11). One ``squeue -O`` call reads the fields no user chooses (``RECORD_FIXED``), then
        one call per user-chosen field (``RECORD_FREE``), each alone; that costs the same on a queue of 10 jobs or
        10,000 (22.05's ``squeue --json`` would list them all). Array and het records come from ``squeue --json``.
        StdOut/StdErr are expanded as scontrol expands them.
        """
        jid = plain_job_id(job_id)
        names = [f for _, f in RECORD_FIXED]
        argv = ["squeue", "-h", "-t", "all", "-j", str(jid), "-O", fixed_fields_format(names)]
        fixed = parse_squeue_fixed_fields(self._one_job_output(argv, jid), jid, names)
        if fixed is None:
            return self._job_entry(jid)
        values = {key: fixed[f] for key, f in RECORD_FIXED}
        values.update({key: self._job_field(jid, f, key) for key, f in RECORD_FREE})
        record = {
            "JobId": str(jid),
            "JobName": values["JobName"],
            "UserId": f"{values['UserName']}({values['UserID']})",
            "GroupId": f"{values['GroupName']}({values['GroupID']})",
            **{k: values[k] for k in ("Account", "QOS", "JobState", "Reason", "Requeue", "Restarts", "Partition")},
            "NodeList": values["NodeList"],
            "BatchHost": "" if values["BatchHost"].lower() == "n/a" else values["BatchHost"],
            **{k: values[k] for k in ("WorkDir", "Command", "Comment", "StdIn")},
        }
        for key in ("StdOut", "StdErr"):
            record[key] = expand_std_path(
                values[key], job_id=jid, user=values["UserName"], name=values["JobName"], work_dir=values["WorkDir"]
            )
        return record

    def job_restarts(self, job_id: int | str) -> tuple[int, str]:
        """(restart count, state) of one job in one ``squeue -O RestartCnt,State`` call: the epilog's "is this job
        being requeued?" (Slurm counts a requeue when it happens). Raises SlurmError (and SlurmParseError)."""
        jid = plain_job_id(job_id)
        names = ["RestartCnt", "State"]
        argv = ["squeue", "-h", "-t", "all", "-j", str(jid), "-O", fixed_fields_format(names)]
        fixed = parse_squeue_fixed_fields(self._one_job_output(argv, jid), jid, names)
        if fixed is None:
            entry = self._job_entry(jid)
            return int(entry["Restarts"]), entry["JobState"]
        return int(fixed["RestartCnt"]), fixed["State"]

    def job_nodes(self, job_id: int | str) -> list[str]:
        """The nodes one job holds, cheaply: one ``squeue -j ID -O NodeList`` line, expanded; empty when slurmctld
        lists no such job (the detector's look-up of an in-band report's job)."""
        try:
            value = self._job_field(job_id, "NodeList", "NodeList")
        except InvalidJobId:
            return []
        value = value.strip()
        return [] if not value or value.lower() in ("(null)", "n/a", "none") else expand_hostlist(value)

    def job_state(self, job_id: int | str) -> str:
        """One job's state ("RUNNING", "COMPLETED", ...), cheaply: one ``squeue -j`` line."""
        return self._job_field(job_id, "State", "JobState")

    def job_comment(self, job_id: int | str) -> str:
        """One job's current comment (nuro's job record; see nuro.protocol.jobcomment), exactly as the job holds it.

        Read alone with ``squeue -j ID -O 'JobArrayID:0|,Comment:0'`` (``parse_squeue_one_field``): the
        readers must see the job's own comment, never one a job name or another field made up; ``scontrol show job
        -o`` could not guarantee that.
        """
        return self._job_field(job_id, "Comment", "Comment")

    def job_admin_comment(self, job_id: int | str) -> str:
        """One job's admin comment (root's note to its owner; see nuro.protocol.adminnote), from ``squeue --json``:
        22.05's ``squeue -O`` has no such field ("Invalid job format specification: AdminComment", measured)."""
        return self._job_entry(plain_job_id(job_id)).get("AdminComment", "")

    def refresh_topology(self) -> None:
        """Forget the cached topology (after a slurmctld restart with a new topology.conf)."""
        self._topology = None

    def nodes(self) -> list[NodeInfo]:
        """One node read (``nodes_argv``), with switches attached from the cached topology."""
        nodes, _ = parse_sinfo_json(self.run(self.nodes_argv()).stdout)
        return attach_switches(nodes, self.topology())

    def nodes_argv(self) -> list[str]:
        """The node read: ``sinfo --json`` on 22.05 (one record per node); from 24.11 ``scontrol --json show nodes``
        (with the jobs read's ``+complex`` parser).

        Why not sinfo there: 24.11+'s ``sinfo --json`` groups alike nodes into one record, and "alike" ignores the
        drain reason, the allocated CPUs and the configured GRES (sinfo/opts.c's default match keys): five drained
        nodes with two different reasons all read as the first one's reason (measured on a 26.05 dev cluster), and
        an admin's drain could pass for nuro's own. ``scontrol``'s JSON is one record per node, in the same
        ``nodes`` document 22.05's sinfo prints; 0.105 s at 500 nodes on 26.05 (sinfo's grouped answer: 0.02 s).
        """
        return ["scontrol", self.jobs_json_option(), "show", "nodes"] if self._newer_json() else ["sinfo", "--json"]

    def _newer_json(self) -> bool:
        """Slurm ≥ ``COMPLEX_JSON_SINCE`` (the reads above change there); False when even ``sinfo --version`` (local)
        fails: the read itself will then say why."""
        try:
            return self.version().major_minor >= COMPLEX_JSON_SINCE
        except SlurmError as exc:
            log.debug("no Slurm version (%s): the 22.05 reads", exc)
            return False

    def site_factors(self) -> dict[int, int]:
        """One ``sprio -h -o '%i|%S'``: every pending job's SiteFactor. {} when sprio cannot tell (e.g. the
        priority/basic plugin): a restarted controller then sets its values again, as before."""
        try:
            return parse_sprio_site_factors(self.run(["sprio", "-h", "-o", SPRIO_SITE_FACTOR_FORMAT]).stdout)
        except (SlurmUnavailable, SlurmTimeout):
            raise
        except SlurmError as exc:
            log.warning("sprio failed: site factors are set again rather than read error=%s", exc)
            return {}

    def partitions(self, nodes: list[NodeInfo], max_age_s: float = 0.0) -> list[PartitionInfo]:
        """``scontrol show -o partition``; if that fails (other than an unreachable controller), the partitions
        seen through the nodes' memberships (state "UNKNOWN", no default flag). ``max_age_s``: an answer read
        that recently is returned without a call (partitions are admin configuration: they change rarely)."""
        if self._partitions is not None and time.monotonic() - self._partitions[0] <= max_age_s:
            return list(self._partitions[1])
        try:
            parts = parse_scontrol_partitions(self.run(["scontrol", "show", "-o", "partition"]).stdout)
            self._partitions = (time.monotonic(), parts)
            return parts
        except (SlurmUnavailable, SlurmTimeout):
            raise
        except SlurmError as exc:
            log.warning("scontrol show partition failed: partitions derived from nodes error=%s", exc)
            return partitions_from_nodes(nodes)

    def read_snapshot(self) -> ClusterSnapshot:
        """``squeue --json`` and ``sinfo --json`` side by side, + ``scontrol show -o partition`` at most every
        ``SNAPSHOT_PARTITIONS_MAX_AGE_S`` (+ topology the first time).

        Side by side because each waits mostly on slurmctld's answer, not on this host's CPU: a burst of submissions
        that makes each RPC slow then costs the cycle the slower of the two, not their sum. The partition call exists
        because 22.05's ``sinfo --json`` prints nodes only, no partitions; nothing the controller decides depends on
        partition state, so a recent answer is reused.
        """
        taken_at = datetime.now(UTC)
        start = time.monotonic()
        node_read = in_daemon_thread(self.run, self.nodes_argv())
        jobs = self.jobs()
        nodes, _ = parse_sinfo_json(node_read.result().stdout)
        partitions = self.partitions(nodes, max_age_s=SNAPSHOT_PARTITIONS_MAX_AGE_S)
        nodes = attach_switches(nodes, self.topology())
        log.debug(
            "snapshot jobs=%d nodes=%d partitions=%d duration_s=%.3f",
            len(jobs),
            len(nodes),
            len(partitions),
            time.monotonic() - start,
        )
        return ClusterSnapshot(
            nodes=tuple(nodes),
            jobs=tuple(jobs),
            partitions=tuple(partitions),
            taken_at=taken_at,
            source=self.name,
        )

    def finished_jobs(self, job_ids: Iterable[int | str]) -> list[JobInfo]:
        """One ``sacct --json -D -j a,b,...``: the latest attempt per job id, in the order asked for, with its restart
        count: the attempts before it (sacct keeps no restart count, so a requeued job that slurmctld had forgotten
        read as "0 restarts" in ``nuro-train lineage``; ``-D`` lists every attempt, ``merge_resized`` folds a
        ``--no-kill`` job's resize records into theirs).

        Because 22.05's sacct JSON loses non-zero exit codes (see ``parse._exit_of``), records that finished
        without a known exit code get it from one more call, ``sacct -n -P -X -o JobIDRaw,ExitCode,State``.
        """
        wanted = list(dict.fromkeys(str(j).strip() for j in job_ids if str(j).strip()))
        if not wanted:
            return []
        records = parse_sacct_json(self.run(["sacct", "--json", "-D", "-j", ",".join(wanted)]).stdout)
        runs: dict[str, list[JobInfo]] = {}
        for rec in merge_resized(sorted(records, key=lambda r: r.job_id)):  # stable: each job's attempts in order
            runs.setdefault(str(rec.job_id), []).append(rec)
        latest = {j: replace(rs[-1], restart_count=max(rs[-1].restart_count, len(rs) - 1)) for j, rs in runs.items()}
        unknown = [j for j, r in latest.items() if r.is_finished and r.exit_code is None and r.exit_signal is None]
        if unknown:
            argv = ["sacct", "-n", "-P", "-X", "-o", "JobIDRaw,ExitCode,State", "-j", ",".join(unknown)]
            codes = parse_sacct_exitcodes(self.run(argv).stdout)
            for j in unknown:
                code, sig = codes.get(int(j), (None, None)) if j.isdigit() else (None, None)
                latest[j] = replace(latest[j], exit_code=code, exit_signal=sig)
        return [latest[j] for j in wanted if j in latest]

    def attempts(self, job_id: int | str) -> list[JobInfo]:
        """Every attempt of one job from accounting, oldest first (``sacct -D``: a requeued job keeps its id and
        each run before a requeue stays as its own record, state REQUEUED, with its nodes and start/end). A job that
        shrank while running (``--no-kill``: a lost node left it, hot spares carried on) is one attempt
        (``merge_resized``)."""
        return merge_resized(parse_sacct_json(self.run(["sacct", "--json", "-D", "-j", str(job_id)]).stdout))

    def version(self) -> SlurmVersion:
        """``sinfo --version``, once per backend."""
        if self._version is None:
            self._version = parse_version(self.run(["sinfo", "--version"]).stdout)
            log.debug("slurm version=%s", self._version)
        return self._version

    def cred_expire_s(self) -> int:
        """``scontrol show config``'s AuthInfo ``cred_expire``, once per backend."""
        if self._cred_expire is None:
            self._cred_expire = parse_cred_expire(self.run(["scontrol", "show", "config"]).stdout)
        return self._cred_expire

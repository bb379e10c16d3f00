"""The Slurm adapter: an abstract ``Backend`` (read a snapshot, apply an action) and the default ``CliBackend``.

Why this shape: the abstract surface is small: ``read_snapshot`` and ``apply``, plus the two reads that
do not fit a snapshot (``finished_jobs`` from accounting, ``version``). Parsing and rendering are shared pure
functions (``nuro.slurm.parse``, ``nuro.slurm.actions``), so a backend is a short class.

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

import abc
import contextlib
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from datetime import UTC, datetime
from typing import TypeVar

from nuro.slurm._fields import expand_std_path
from nuro.slurm.actions import (
    Action,
    ActionResult,
    Cancel,
    DrainNode,
    Hold,
    Release,
    Requeue,
    ResumeNode,
    Signal,
    Submit,
    SubmitCommand,
    UpdateAdminComment,
    UpdateComment,
    UpdateJobs,
    UpdateQos,
    UpdateSiteFactor,
    render_argv,
    render_stdin,
)
from nuro.slurm.errors import (
    InvalidJobId,
    JobWaitTimeout,
    SlurmCommandNotFound,
    SlurmConfigMissing,
    SlurmError,
    SlurmTimeout,
    SlurmUnavailable,
    classify_error,
)
from nuro.slurm.hostlist import expand as expand_hostlist
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo, PartitionInfo, SlurmVersion
from nuro.slurm.parse import (
    SPRIO_SITE_FACTOR_FORMAT,
    SQUEUE_FALLBACK_FORMAT,
    attach_switches,
    merge_resized,
    newest_data_parser,
    parse_per_job_errors,
    parse_sacct_exitcodes,
    parse_sacct_json,
    parse_sbatch_parsable,
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
    DEFAULT_CRED_EXPIRE_S,
    ONE_FIELD_FORMAT,
    fixed_fields_format,
    parse_cred_expire,
    parse_squeue_fixed_fields,
)
from nuro.slurm.states import JobPhase

log = logging.getLogger(__name__)

#: The shortest limit ``call_timeout`` sets: starting a Slurm command and getting its munge credential take tens of
#: milliseconds before slurmctld is even asked, so a shorter limit would cut calls an idle slurmctld answers.
CALL_TIMEOUT_MIN_S = 0.1

#: How old a partition list ``read_snapshot`` may reuse (``CliBackend.partitions``), seconds.
SNAPSHOT_PARTITIONS_MAX_AGE_S = 30.0
#: The first Slurm whose squeue the bulk job read asks for ``--json=<parser>+complex`` (measured on 24.11 and 26.05).
COMPLEX_JSON_SINCE = (24, 11)


class Backend(abc.ABC):
    """Reads cluster state and applies actions. Implementations: ``CliBackend`` (default), ``PyslurmBackend``.

    ``apply`` never raises for a Slurm-side failure: it returns ``ActionResult(ok=False, error=...)`` so a
    controller applying many actions can carry on; the convenience methods below raise instead (via
    ``raise_for_error``). Nothing here retries a state-changing call: a retried sbatch would submit twice.
    """

    @abc.abstractmethod
    def read_snapshot(self) -> ClusterSnapshot:
        """Jobs, nodes (with switches) and partitions as of now. Raises ``SlurmError`` subclasses."""

    @abc.abstractmethod
    def apply(self, action: Action) -> ActionResult:
        """Carry out one action; see the class docstring for the error contract."""

    @abc.abstractmethod
    def finished_jobs(self, job_ids: Iterable[int | str]) -> list[JobInfo]:
        """Accounting records (sacct) for these jobs, one per job id, in one query. Unknown ids are absent."""

    @abc.abstractmethod
    def version(self) -> SlurmVersion:
        """The running Slurm's version (parsed once per backend)."""

    # Reads; backends may override with cheaper calls.
    def jobs(self) -> list[JobInfo]:
        """Jobs slurmctld knows now (pending, running, and finished within MinJobAge)."""
        return list(self.read_snapshot().jobs)

    def nodes(self) -> list[NodeInfo]:
        """All nodes, with switches."""
        return list(self.read_snapshot().nodes)

    def job_comment(self, job_id: int | str) -> str:
        """One job's current comment; backends override with a cheaper single-job read."""
        job = self.find_job(int(job_id))
        if job is None:
            raise InvalidJobId(f"no job {job_id}", argv=())
        return job.comment or ""

    def job_admin_comment(self, job_id: int | str) -> str:
        """One job's admin comment (root's note to its owner); "" where a backend cannot read it."""
        return ""

    def site_factors(self) -> dict[int, int]:
        """Pending jobs' SiteFactor as slurmctld holds it now; {} where a backend cannot tell (the controller then
        sets every value it wants once)."""
        return {}

    @contextlib.contextmanager
    def call_timeout(self, seconds: float) -> Iterator[None]:
        """Within the block, this thread's Slurm calls give up after ``seconds`` (``SlurmTimeout``) when sooner than
        the backend's own limit; for updates a caller can simply decide again (the controller's apply budget).
        Backends without a per-call limit ignore it."""
        yield

    def job_state(self, job_id: int | str) -> str:
        """One job's state ("RUNNING", ...); backends override with a cheaper single-job read."""
        job = self.find_job(int(job_id))
        if job is None:
            raise InvalidJobId(f"no job {job_id}", argv=())
        return job.state

    def cred_expire_s(self) -> int:
        """slurm.conf's AuthInfo ``cred_expire``: how long a job's launch credential, and slurmd's memory of the job
        (a node that still remembers it runs no prolog for it), outlive its end. Slurm's default where a backend
        cannot tell."""
        return DEFAULT_CRED_EXPIRE_S

    def job_nodes(self, job_id: int | str) -> list[str]:
        """The nodes one job holds (empty when Slurm knows no such job); adapters read only that field."""
        job = self.find_job(int(job_id))
        return list(job.nodes) if job is not None else []

    def find_job(self, job_id: int) -> JobInfo | None:
        """One job: squeue first (it remembers finished jobs for MinJobAge), then accounting; None if neither knows
        it."""
        job = next((j for j in self.jobs() if j.job_id == job_id), None)
        return job if job is not None else next(iter(self.finished_jobs([job_id])), None)

    def wait_for_job(
        self,
        job_id: int,
        phases: Iterable[JobPhase] | None = None,
        timeout_s: float = 60.0,
        poll_s: float = 0.25,
    ) -> JobInfo:
        """Poll until the job is in one of ``phases`` (default: any terminal phase) and return it.

        squeue answers first (it remembers finished jobs for MinJobAge); a job it no longer lists is looked up in
        accounting. Raises ``JobWaitTimeout`` with the last state seen when ``timeout_s`` passes.
        """
        wanted = frozenset(phases) if phases is not None else None
        deadline = time.monotonic() + timeout_s
        last: JobInfo | None = None
        while True:
            job = self.find_job(job_id)
            if job is not None:
                last = job
                if (job.phase in wanted) if wanted is not None else job.is_finished:
                    return job
            if time.monotonic() >= deadline:
                want = sorted(p.value for p in wanted) if wanted is not None else "a terminal state"
                raise JobWaitTimeout(
                    f"job {job_id} did not reach {want} within {timeout_s:.0f} s "
                    f"(last seen: {last.state if last else 'not found'}, reason {last.reason if last else '-'})"
                )
            time.sleep(poll_s)

    # Actions; each raises the classified SlurmError on failure.
    def submit(self, script: str, *args: str, cwd: str | None = None) -> int:
        """Submit ``script`` with sbatch options ``args``; returns the job id. Raises ``SubmissionRejected``."""
        result = self.apply(Submit(script=script, extra_args=tuple(args), cwd=cwd)).raise_for_error()
        if result.job_id is None:
            raise SlurmError(f"sbatch succeeded but printed no job id: {result.message!r}", argv=result.argv)
        return result.job_id

    def cancel(self, job_id: int | str, signal: str | None = None) -> ActionResult:
        """scancel the job (see ``Cancel`` for what ``signal`` means)."""
        return self.apply(Cancel(job_id, signal)).raise_for_error()

    def signal(self, job_id: int | str, signal: str, batch_only: bool = False, full: bool = False) -> ActionResult:
        """Send ``signal`` without cancelling (see ``Signal`` for batch_only/full)."""
        return self.apply(Signal(job_id, signal, batch_only=batch_only, full=full)).raise_for_error()

    def requeue(self, job_id: int | str, hold: bool = False) -> ActionResult:
        """Requeue (optionally held)."""
        return self.apply(Requeue(job_id, hold)).raise_for_error()

    def hold(self, job_id: int | str) -> ActionResult:
        """Hold a pending job."""
        return self.apply(Hold(job_id)).raise_for_error()

    def release(self, job_id: int | str) -> ActionResult:
        """Release a held job."""
        return self.apply(Release(job_id)).raise_for_error()

    def update_qos(self, job_id: int | str, qos: str) -> ActionResult:
        """Move a (pending) job to another QOS."""
        return self.apply(UpdateQos(job_id, qos)).raise_for_error()

    def update_site_factor(self, job_id: int | str, value: int) -> ActionResult:
        """Set the job's SiteFactor (admin only)."""
        return self.apply(UpdateSiteFactor(job_id, value)).raise_for_error()

    def update_jobs(
        self, job_ids: Iterable[int | str], *, qos: str | None = None, site_factor: int | None = None
    ) -> dict[int, str]:
        """Set one QOS or SiteFactor on many jobs in one command; returns the jobs Slurm refused (id → its message).

        Raises ``SlurmUnavailable`` / ``SlurmTimeout`` (nothing was updated, or not knowably so). A failure whose
        stderr names no job counts as every job refused.
        """
        ids = tuple(job_ids)
        result = self.apply(UpdateJobs(ids, qos=qos, site_factor=site_factor))
        if result.ok:
            return {}
        if isinstance(result.error, SlurmUnavailable | SlurmTimeout):
            raise result.error
        return parse_per_job_errors(result.message) or {int(j): result.message for j in ids}

    def update_comment(self, job_id: int | str, comment: str) -> ActionResult:
        """Replace the job's comment (nuro's job record; see nuro.protocol.jobcomment)."""
        return self.apply(UpdateComment(job_id, comment)).raise_for_error()

    def update_admin_comment(self, job_id: int | str, text: str) -> ActionResult:
        """Replace the job's admin comment (root's note to its owner; see nuro.protocol.adminnote)."""
        return self.apply(UpdateAdminComment(job_id, text)).raise_for_error()

    def drain(self, node: str, reason: str) -> ActionResult:
        """Drain a node (or hostlist) with a reason."""
        return self.apply(DrainNode(node, reason)).raise_for_error()

    def resume(self, node: str) -> ActionResult:
        """Resume a drained/down node. Raises ``InvalidState`` if it is neither."""
        return self.apply(ResumeNode(node)).raise_for_error()


#: ``job_record``'s fields no user chooses: (scontrol's name, squeue -O field). States, ids, numbers, names an admin
#: made (accounts, QOS, partitions, nodes), Slurm's reason words: none holds '|' or a newline.
_RECORD_FIXED = (
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
_RECORD_FREE = (
    ("JobName", "Name"),
    ("WorkDir", "WorkDir"),
    ("Command", "Command"),
    ("Comment", "Comment"),
    ("StdOut", "STDOUT"),
    ("StdErr", "STDERR"),
    ("StdIn", "STDIN"),
)


def _job_id(job_id: int | str) -> int:
    """A plain job id as an int; anything else (a name, "123_4", "1;rm") is refused before Slurm sees it."""
    text = str(job_id).strip()
    if not text.isdigit():
        raise InvalidJobId(f"not a plain Slurm job id: {str(job_id)[:40]!r}", argv=())
    return int(text)


def _is_unknown_option(exc: SlurmError, option: str) -> bool:
    text = exc.slurm_message.lower()
    return option in text and ("unrecognized option" in text or "invalid option" in text or "unknown option" in text)


T = TypeVar("T")


def in_daemon_thread(fn: Callable[..., T], *args: object) -> Future[T]:
    """``fn(*args)`` in a daemon thread, its result as a future. Not a thread pool: the interpreter joins a pool's
    workers at exit, so a stopping daemon would wait out a slow Slurm call (up to ``timeout_s``)."""
    future: Future[T] = Future()

    def call() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the result
            future.set_exception(exc)

    threading.Thread(target=call, name=getattr(fn, "__name__", "call"), daemon=True).start()
    return future


class CliBackend(Backend):
    """Runs Slurm's client commands with argument lists (never a shell) and an explicit timeout.

    Args:
        env: variables added to ``os.environ`` for every command (e.g. {"SLURM_CONF": ...}); never logged.
        timeout_s: wall-clock limit per command, in seconds; a hung command raises ``SlurmTimeout``.
        bin_dir: directory holding squeue/sinfo/...; None means look them up on PATH.
    """

    name = "cli"

    def __init__(
        self, env: Mapping[str, str] | None = None, timeout_s: float = 30.0, bin_dir: str | None = None
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"CliBackend timeout_s must be > 0, got {timeout_s}")
        self._env_overrides = dict(env or {})
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir
        self._topology: dict[str, str] | None = None
        self._topology_kind = "none"
        self._jobs_json: str | None = None
        self._version: SlurmVersion | None = None
        self._cred_expire: int | None = None
        self._squeue_json: bool = True
        self._calls = 0
        self._partitions: tuple[float, list[PartitionInfo]] | None = None  # (read at, monotonic), scontrol's answer
        self._local = threading.local()  # call_timeout's limit, per thread: other threads keep timeout_s

    # -- running -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def call_timeout(self, seconds: float) -> Iterator[None]:
        before = getattr(self._local, "timeout_s", None)
        self._local.timeout_s = min(self.timeout_s, max(CALL_TIMEOUT_MIN_S, seconds), before or self.timeout_s)
        try:
            yield
        finally:
            self._local.timeout_s = before

    def _resolve(self, argv: Sequence[str]) -> list[str]:
        full = list(argv)
        if self.bin_dir:
            full[0] = os.path.join(self.bin_dir, full[0])
        return full

    def run(
        self, argv: Sequence[str], stdin: str | None = None, cwd: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; return the completed process on rc 0, raise the classified error otherwise."""
        full = self._resolve(argv)
        self._calls += 1
        log.debug("slurm call n=%d argv=%s", self._calls, shlex.join(full))
        env = {**os.environ, **self._env_overrides}
        conf = env.get("SLURM_CONF")
        if conf and not os.path.exists(conf):
            raise SlurmConfigMissing(f"SLURM_CONF={conf} does not exist", argv=full)
        start = time.monotonic()
        timeout_s = getattr(self._local, "timeout_s", None) or self.timeout_s
        try:
            proc = subprocess.run(
                full,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                env=env,
                cwd=cwd,
                timeout=timeout_s,
                check=False,
            )
        except FileNotFoundError as exc:
            if cwd is not None and not os.path.isdir(cwd):
                raise SlurmError(f"working directory {cwd!r} does not exist", argv=full) from exc
            raise SlurmCommandNotFound(f"{full[0]!r} not found", argv=full) from exc
        except subprocess.TimeoutExpired as exc:
            raise SlurmTimeout(f"no answer within timeout_s={timeout_s}", argv=full) from exc
        duration_s = time.monotonic() - start
        log.debug("slurm call n=%d rc=%d duration_s=%.3f", self._calls, proc.returncode, duration_s)
        if proc.returncode != 0:
            raise classify_error(full, proc.returncode, proc.stderr or proc.stdout)
        return proc

    def submit_command(self, command: SubmitCommand) -> int:
        """Run a user's own sbatch command line as given (see ``SubmitCommand``); returns sbatch's exit status.

        sbatch's stdout and stderr stay this process's (the user's terminal): nothing is captured or re-printed, so
        its messages, their format and their order are sbatch's own, and a refusal is its exit status, not an
        exception. No timeout: ``sbatch --wait`` blocks until the job ends. The ``env`` overrides apply as for every
        command; the SLURM_CONF check does not (sbatch reports a missing configuration itself, as the user expects).

        Raises:
            SlurmCommandNotFound: sbatch is not on PATH (or in ``bin_dir``).
        """
        full = self._resolve(render_argv(command))
        self._calls += 1
        log.debug("slurm call n=%d argv=%s", self._calls, shlex.join(full))
        try:
            proc = subprocess.run(full, input=command.stdin, env={**os.environ, **self._env_overrides}, check=False)
        except FileNotFoundError as exc:
            raise SlurmCommandNotFound(f"{full[0]!r} not found", argv=full) from exc
        log.debug("slurm call n=%d rc=%d", self._calls, proc.returncode)
        return proc.returncode

    # -- reads ---------------------------------------------------------------------------------------------
    def jobs(self) -> list[JobInfo]:
        """One ``squeue --json -t all`` (or the ``-o`` fallback, see the module docstring).

        ``-t all``: 24.11 and later list ended jobs (still held by slurmctld, within MinJobAge) only when asked, as
        22.05 always did (it ignores squeue's filters with ``--json``); waiting for a job to end reads them here."""
        if self._squeue_json:
            try:
                return parse_squeue_json(self.run(["squeue", self.jobs_json_option(), "-t", "all"]).stdout)
            except SlurmError as exc:
                if not _is_unknown_option(exc, "json"):
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
        jid = _job_id(job_id)
        argv = ["squeue", "-h", "-t", "all", "-j", str(jid), "-O", ONE_FIELD_FORMAT.format(field=field)]
        value = parse_squeue_one_field(self._one_job_output(argv, jid), jid)
        if value is None:
            log.debug("job=%d is an array or het record: reading %s from squeue --json", jid, key)
            return self._job_entry(jid)[key]
        return value

    def job_record(self, job_id: int | str) -> dict[str, str]:
        """One job's fields named as ``scontrol show job`` names them (JobState, StdOut, Comment, Account, ...).

        Never from scontrol's text: a job name or comment holding `` Comment=...`` or a newline would add or change
        fields there (issue 11). One ``squeue -O`` call reads the fields no user chooses (``_RECORD_FIXED``), then
        one call per user-chosen field (``_RECORD_FREE``), each alone; that costs the same on a queue of 10 jobs or
        10,000 (22.05's ``squeue --json`` would list them all). Array and het records come from ``squeue --json``.
        StdOut/StdErr are expanded as scontrol expands them.
        """
        jid = _job_id(job_id)
        names = [f for _, f in _RECORD_FIXED]
        argv = ["squeue", "-h", "-t", "all", "-j", str(jid), "-O", fixed_fields_format(names)]
        fixed = parse_squeue_fixed_fields(self._one_job_output(argv, jid), jid, names)
        if fixed is None:
            return self._job_entry(jid)
        values = {key: fixed[f] for key, f in _RECORD_FIXED}
        values.update({key: self._job_field(jid, f, key) for key, f in _RECORD_FREE})
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
        jid = _job_id(job_id)
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
        return self._job_entry(_job_id(job_id)).get("AdminComment", "")

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
        """One ``sacct --json -j a,b,...``: the latest record per job id, in the order asked for.

        Because 22.05's sacct JSON loses non-zero exit codes (see ``parse._exit_of``), records that finished
        without a known exit code get it from one more call, ``sacct -n -P -X -o JobIDRaw,ExitCode,State``.
        """
        wanted = list(dict.fromkeys(str(j).strip() for j in job_ids if str(j).strip()))
        if not wanted:
            return []
        records = parse_sacct_json(self.run(["sacct", "--json", "-j", ",".join(wanted)]).stdout)
        latest = {str(r.job_id): r for r in records}
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

    # -- actions -------------------------------------------------------------------------------------------
    def apply(self, action: Action) -> ActionResult:
        """Render ``action``, run it once, return the result (``ok=False`` with ``error`` on Slurm failure).

        Raises:
            ValueError / TypeError: the action is malformed (nothing ran).
        """
        argv = render_argv(action)
        cwd = action.cwd if isinstance(action, Submit) else None
        start = time.monotonic()
        kind = type(action).__name__
        try:
            proc = self.run(argv, stdin=render_stdin(action), cwd=cwd)
        except SlurmError as exc:
            duration_s = time.monotonic() - start
            log.warning(
                "slurm action failed action=%s error=%s message=%s",
                kind,
                type(exc).__name__,
                exc.slurm_message or exc.message,
            )
            return ActionResult(
                action,
                ok=False,
                message=exc.slurm_message or exc.message,
                duration_s=duration_s,
                error=exc,
                argv=tuple(exc.argv or self._resolve(argv)),
            )
        duration_s = time.monotonic() - start
        job_id = None
        if isinstance(action, Submit):
            try:
                job_id = parse_sbatch_parsable(proc.stdout)
            except SlurmError as exc:  # submitted, but the id is unreadable: report it, do not resubmit
                log.error("sbatch succeeded but its job id is unreadable error=%s", exc)
        message = "\n".join(s for s in (proc.stdout.strip(), proc.stderr.strip()) if s)
        log.info("slurm action applied action=%s job_id=%s duration_s=%.3f", kind, job_id, duration_s)
        return ActionResult(
            action,
            ok=True,
            job_id=job_id,
            message=message,
            duration_s=duration_s,
            argv=tuple(self._resolve(argv)),
        )

"""The Slurm adapter: an abstract ``Backend`` (read a snapshot, apply an action) and the default ``CliBackend``.

Why this shape: the abstract surface is small: ``read_snapshot`` and ``apply``, plus the two reads that
do not fit a snapshot (``finished_jobs`` from accounting, ``version``). Parsing and rendering are shared pure
functions (``nuro.slurm.parse``, ``nuro.slurm.actions``), so a backend is a short class.

``CliBackend`` is three rooms put together: ``cli_runner`` (running a command: argv, timeout, typed errors),
``cli_reads`` (every read, its fallbacks and caches) and ``cli_writes`` (an action rendered and run once, a user's
sbatch line run as given). Code that only runs commands (sacctmgr) names ``CliRunner``; code that needs the reads
only the CLI offers (one job's record, accounting attempts) names ``CliReads``; the rest names ``Backend``.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections.abc import Iterable, Iterator

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
    UpdateAdminComment,
    UpdateComment,
    UpdateJobs,
    UpdateQos,
    UpdateSiteFactor,
)
from nuro.slurm.cli_reads import CliReads
from nuro.slurm.cli_writes import CliWrites
from nuro.slurm.errors import (
    InvalidJobId,
    JobWaitTimeout,
    SlurmError,
    SlurmTimeout,
    SlurmUnavailable,
)
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo, SlurmVersion
from nuro.slurm.parse import (
    parse_per_job_errors,
)
from nuro.slurm.parse_text import (
    DEFAULT_CRED_EXPIRE_S,
)
from nuro.slurm.states import JobPhase


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
        return self._known_job(job_id).state

    def job_restarts(self, job_id: int | str) -> tuple[int, str]:
        """(restart count, state) of one job: the detector's "has Slurm requeued it yet?"; backends override with a
        cheaper single-job read. Raises ``InvalidJobId`` when no one knows the job."""
        job = self._known_job(job_id)
        return job.restart_count, job.state

    def _known_job(self, job_id: int | str) -> JobInfo:
        """``find_job``, or ``InvalidJobId`` when neither slurmctld nor accounting knows the job."""
        job = self.find_job(int(job_id))
        if job is None:
            raise InvalidJobId(f"no job {job_id}", argv=())
        return job

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


class CliBackend(CliReads, CliWrites, Backend):
    """The default backend: Slurm's own client commands (``CliReads`` + ``CliWrites`` over ``CliRunner``, whose
    arguments it takes: ``env``, ``timeout_s``, ``bin_dir``)."""

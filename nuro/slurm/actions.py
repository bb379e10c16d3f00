"""State-changing Slurm operations as frozen values, and the pure function that renders each to an exact argv.

Why: what will reach Slurm is a value you can print, diff and test before anything runs; rendering never
touches the cluster, and executing (``Backend.apply``) builds a fresh argv each time, so a retry can never
accumulate arguments. Every argv is a list for ``subprocess`` without a shell: values such as a drain reason with
spaces travel as one argument, never re-split or interpreted.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

_SIGNAL = re.compile(r"^(SIG)?[A-Z][A-Z0-9+]*$|^\d+$")
_NODE = re.compile(r"^[A-Za-z0-9_.\-\[\],]+$")


def _check_job_id(job_id: int | str) -> str:
    """Job ids as Slurm accepts them: "123", "123_4" (array task), "123+1" (het component)."""
    text = str(job_id).strip()
    if not re.fullmatch(r"\d+(?:[_+]\d+)?", text):
        raise ValueError(f"invalid Slurm job id {job_id!r}: expected digits, e.g. 123, 123_4 or 123+1")
    return text


def _check_signal(signal: str) -> str:
    """Signal names as scancel takes them: "USR1", "SIGUSR1", "TERM", "9"."""
    text = signal.strip().upper()
    if not _SIGNAL.fullmatch(text):
        raise ValueError(f"invalid signal {signal!r}: use a name such as USR1/TERM or a number")
    return text


def _check_qos(qos: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", qos):
        raise ValueError(f"invalid QOS name {qos!r}")
    return qos


def _check_node(node: str) -> str:
    if not node or not _NODE.fullmatch(node):
        raise ValueError(f"invalid node name or hostlist {node!r}: letters, digits, '-', '_', '.', '[', ']', ','")
    return node


@dataclass(frozen=True)
class Submit:
    """Submit a batch script through ``sbatch --parsable``; the script goes on stdin, never to a temp file.

    Attributes:
        script: the full batch script text, "#!/bin/bash" line included.
        extra_args: sbatch options, each one argv element (e.g. ("--nodes=2", "--gres=gpu:8")).
        cwd: the job's working directory (rendered as --chdir and used as the sbatch process's cwd);
            None means the caller's current directory.
    """

    script: str
    extra_args: tuple[str, ...] = ()
    cwd: str | None = None

    def __post_init__(self) -> None:
        if not self.script.startswith("#!"):
            raise ValueError("Submit.script must start with an interpreter line such as '#!/bin/bash'")
        object.__setattr__(self, "extra_args", tuple(self.extra_args))


@dataclass(frozen=True)
class SubmitCommand:
    """A user's own sbatch command line (``nuro-sbatch``): ``sbatch <args>`` exactly as given, nothing added.

    Unlike ``Submit`` there is no ``--parsable``: options, the script path and the script's arguments stay the user's,
    and sbatch speaks to the user directly (its output in the format the user asked for, its exit status), so the
    adapter reads no job id (``Backend.submit_command``).

    Attributes:
        args: everything after ``sbatch``, each one argv element, in order.
        stdin: the script's bytes when the user piped it to sbatch (as read, undecoded); None when the script is a
            path in ``args`` or ``--wrap`` (sbatch then reads no stdin).
    """

    args: tuple[str, ...]
    stdin: bytes | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))


@dataclass(frozen=True)
class Cancel:
    """``scancel <id>``. Idempotent on 22.05: scancel of an unknown or finished job exits 0 without a message.

    With ``signal`` this is scancel's own meaning: the signal is sent to the steps and the job ends only if the
    signal ends it (prefer ``Signal`` for that).
    """

    job_id: int | str
    signal: str | None = None


@dataclass(frozen=True)
class Signal:
    """``scancel --signal=<sig>``: deliver a signal without cancelling.

    Attributes:
        batch_only: only the batch shell (``--batch``), not the steps.
        full: the batch shell and every step (``--full``); without either flag, Slurm signals the steps only,
            which is why a batch script without srun does not see it (measured on 22.05, with GraceTime).
    """

    job_id: int | str
    signal: str
    batch_only: bool = False
    full: bool = False

    def __post_init__(self) -> None:
        if self.batch_only and self.full:
            raise ValueError("Signal: choose batch_only or full, not both (scancel --batch vs --full)")


@dataclass(frozen=True)
class Requeue:
    """``scontrol requeue <id>`` (or ``requeuehold`` when ``hold``): back to PENDING, restart count + 1."""

    job_id: int | str
    hold: bool = False


@dataclass(frozen=True)
class Hold:
    """``scontrol hold <id>``: keep a pending job from starting."""

    job_id: int | str


@dataclass(frozen=True)
class Release:
    """``scontrol release <id>``: undo Hold / requeuehold."""

    job_id: int | str


@dataclass(frozen=True)
class UpdateQos:
    """``scontrol update jobid=<id> qos=<qos>`` (pending jobs; a user cannot change a running job's QOS)."""

    job_id: int | str
    qos: str


@dataclass(frozen=True)
class UpdateSiteFactor:
    """``scontrol update jobid=<id> sitefactor=<value>`` (admin/operator only; adds to multifactor priority)."""

    job_id: int | str
    value: int


@dataclass(frozen=True)
class UpdateStartTime:
    """``scontrol update jobid=<id> StartTime=now``: a pending job may start at the next scheduling pass (root; the
    detector's expedited start of a job it requeued, ``nuro.slurm_plugins.controller.expedite``)."""

    job_id: int | str


@dataclass(frozen=True)
class UpdateJobs:
    """``scontrol update jobid=<id>,<id>,... qos=<qos> | sitefactor=<value>``: one command for many pending jobs.

    Why: a burst of submissions asks for hundreds of moves in one cycle, and a process per job costs ~7 ms where
    an id in a list costs ~1 ms (scontrol still sends one update RPC per id). Measured on 22.05: a job
    the update does not fit (running, ended, unknown) fails alone, with one ``<message> for job <id>`` line on
    stderr and rc 1; the others are updated (``parse_text.parse_per_job_errors``).
    """

    job_ids: tuple[int | str, ...]
    qos: str | None = None
    site_factor: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "job_ids", tuple(self.job_ids))
        if not self.job_ids:
            raise ValueError("UpdateJobs: no job ids")
        if (self.qos is None) == (self.site_factor is None):
            raise ValueError("UpdateJobs: set exactly one of qos and site_factor")


@dataclass(frozen=True)
class UpdateComment:
    """``scontrol update jobid=<id> comment=<text>``: the job owner or an admin; carries nuro's job record."""

    job_id: int | str
    comment: str

    def __post_init__(self) -> None:
        if "\n" in self.comment or "\r" in self.comment:
            raise ValueError(f"UpdateComment({self.job_id}): a job comment must be one line")


@dataclass(frozen=True)
class UpdateAdminComment:
    """``scontrol update jobid=<id> admincomment=<text>``: root or SlurmUser only (a user's update of it is refused);
    carries root's note to the job's owner (``nuro.protocol.adminnote``), never state."""

    job_id: int | str
    text: str

    def __post_init__(self) -> None:
        if "\n" in self.text or "\r" in self.text:
            raise ValueError(f"UpdateAdminComment({self.job_id}): an admin comment must be one line")


@dataclass(frozen=True)
class DrainNode:
    """``scontrol update nodename=<node> state=drain reason=<reason>``; running jobs finish, no new ones start."""

    node: str
    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError(f"DrainNode({self.node!r}): Slurm requires a reason to drain a node")


@dataclass(frozen=True)
class DownNode:
    """``scontrol update nodename=<node> state=down reason=<reason>``: the node's jobs end at once, and slurmctld
    requeues the ``--requeue`` ones (JobRequeue=1) without waiting for SlurmdTimeout. Pair it with DrainNode so
    that ReturnToService=2 does not return the node by itself when its slurmd re-registers."""

    node: str
    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError(f"DownNode({self.node!r}): Slurm requires a reason to set a node down")


@dataclass(frozen=True)
class UpdateNodeWeight:
    """``scontrol update nodename=<hostlist> weight=<n>``: Slurm prefers the lowest weight that satisfies a request
    (the controller's packing weights, ``nuro.slurm_plugins.controller.weights``). Live until slurmctld restarts
    or reconfigures, which revert it to slurm.conf's."""

    node: str
    weight: int

    def __post_init__(self) -> None:
        if not 0 <= self.weight < 2**32 - 1:
            raise ValueError(f"UpdateNodeWeight({self.node!r}): weight {self.weight} outside Slurm's 0..4294967294")


@dataclass(frozen=True)
class UpdateQosMinGpus:
    """``sacctmgr -i modify qos <qos> set MinTRESPerJob=gres/gpu=<n>`` (``None``: ``-1``, no floor): a job of the QOS
    asking fewer GPUs waits with reason ``QOSMinGRES`` (accepted, never refused; running jobs untouched). The
    controller's gang-first floor (``nuro.slurm_plugins.controller.gangfirst``); an accounting change, so it lasts
    across slurmctld restarts until cleared."""

    qos: str
    gpus: int | None

    def __post_init__(self) -> None:
        if self.gpus is not None and not 1 <= self.gpus < 2**31:
            raise ValueError(f"UpdateQosMinGpus({self.qos!r}): {self.gpus} GPUs is not a positive count")


@dataclass(frozen=True)
class ResumeNode:
    """``scontrol update nodename=<node> state=resume``; Slurm refuses it for a node that is not drained/down."""

    node: str


Action = (
    Submit
    | Cancel
    | Signal
    | Requeue
    | Hold
    | Release
    | UpdateQos
    | UpdateSiteFactor
    | UpdateStartTime
    | UpdateJobs
    | UpdateComment
    | UpdateAdminComment
    | DrainNode
    | DownNode
    | ResumeNode
    | UpdateNodeWeight
    | UpdateQosMinGpus
)


def render_argv(action: Action | SubmitCommand) -> list[str]:
    """The exact argv that carries out ``action``; pure, validates identifiers, touches nothing.

    >>> render_argv(UpdateQos(42, "g-vision"))
    ['scontrol', 'update', 'jobid=42', 'qos=g-vision']

    Raises:
        ValueError: for a malformed job id, node or signal (before anything runs).
        TypeError: for something that is not an Action.
    """
    match action:
        case Submit(extra_args=extra, cwd=cwd):
            argv = ["sbatch", "--parsable"]
            if cwd is not None:
                argv.append(f"--chdir={cwd}")
            return argv + list(extra)
        case SubmitCommand(args=args):
            return ["sbatch", *args]
        case Cancel(job_id=jid, signal=sig):
            return ["scancel", *([f"--signal={_check_signal(sig)}"] if sig else []), _check_job_id(jid)]
        case Signal(job_id=jid, signal=sig, batch_only=batch_only, full=full):
            flags = ["--batch"] if batch_only else (["--full"] if full else [])
            return ["scancel", f"--signal={_check_signal(sig)}", *flags, _check_job_id(jid)]
        case Requeue(job_id=jid, hold=hold):
            return ["scontrol", "requeuehold" if hold else "requeue", _check_job_id(jid)]
        case Hold(job_id=jid):
            return ["scontrol", "hold", _check_job_id(jid)]
        case Release(job_id=jid):
            return ["scontrol", "release", _check_job_id(jid)]
        case UpdateQos(job_id=jid, qos=qos):
            return ["scontrol", "update", f"jobid={_check_job_id(jid)}", f"qos={_check_qos(qos)}"]
        case UpdateJobs(job_ids=ids, qos=qos, site_factor=value):
            what = f"qos={_check_qos(qos)}" if qos is not None else f"sitefactor={int(value or 0)}"
            return ["scontrol", "update", "jobid=" + ",".join(_check_job_id(j) for j in ids), what]
        case UpdateSiteFactor(job_id=jid, value=value):
            return ["scontrol", "update", f"jobid={_check_job_id(jid)}", f"sitefactor={int(value)}"]
        case UpdateStartTime(job_id=jid):
            return ["scontrol", "update", f"jobid={_check_job_id(jid)}", "StartTime=now"]
        case UpdateComment(job_id=jid, comment=comment):
            return ["scontrol", "update", f"jobid={_check_job_id(jid)}", f"comment={comment}"]
        case UpdateAdminComment(job_id=jid, text=text):
            return ["scontrol", "update", f"jobid={_check_job_id(jid)}", f"admincomment={text}"]
        case DrainNode(node=node, reason=reason):
            return ["scontrol", "update", f"nodename={_check_node(node)}", "state=drain", f"reason={reason}"]
        case DownNode(node=node, reason=reason):
            return ["scontrol", "update", f"nodename={_check_node(node)}", "state=down", f"reason={reason}"]
        case ResumeNode(node=node):
            return ["scontrol", "update", f"nodename={_check_node(node)}", "state=resume"]
        case UpdateNodeWeight(node=node, weight=weight):
            return ["scontrol", "update", f"nodename={_check_node(node)}", f"weight={int(weight)}"]
        case UpdateQosMinGpus(qos=qos, gpus=gpus):
            floor = -1 if gpus is None else int(gpus)
            return ["sacctmgr", "-i", "modify", "qos", _check_qos(qos), "set", f"MinTRESPerJob=gres/gpu={floor}"]
    raise TypeError(f"render_argv: not a nuro.slurm action: {action!r}")


def render_stdin(action: Action) -> str | None:
    """What goes on the command's stdin: the script for Submit, nothing otherwise."""
    return action.script if isinstance(action, Submit) else None


@dataclass(frozen=True)
class ActionResult:
    """The outcome of ``Backend.apply``.

    Attributes:
        ok: True when Slurm accepted the action.
        job_id: the new job's id for Submit; otherwise None.
        message: Slurm's stdout on success, Slurm's error text on failure.
        duration_s: wall time of the command, in seconds.
        error: the classified exception on failure (see ``nuro.slurm.errors``); ``raise_for_error`` raises it.
        argv: the argv that ran.
    """

    action: Action
    ok: bool
    job_id: int | None = None
    message: str = ""
    duration_s: float = 0.0
    error: Exception | None = field(default=None, compare=False)
    argv: tuple[str, ...] = ()

    def raise_for_error(self) -> ActionResult:
        """Raise the stored exception if the action failed; return self otherwise (for chaining)."""
        if not self.ok and self.error is not None:
            raise self.error
        return self

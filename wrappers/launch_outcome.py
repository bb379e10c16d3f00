"""What a training attempt's end means, as pure functions over evidence: done, restart me, or a genuine failure.

``classify(evidence) -> Outcome`` runs on each node after torchrun exits; ``fold(verdicts, srun_rc) -> int`` runs
once in the batch step after srun exits and turns the nodes' verdicts into the one exit status the batch script
acts on (0 finished, 75 requeue within the budget, anything else fail). Both are unit-tested over error texts
captured from real torchrun 2.13 runs on this machine (``tests/fixtures/launch/``).

Why a fold and not srun's own exit status: srun returns the *maximum* over its tasks, counting a killed task as
128+signal. With ``--kill-on-bad-exit`` the first node that exits non-zero gets the others killed, so "node 1 says
restart me (75), node 0 was killed (137)" would read as a failure, and "node 0's user code raised (1), node 1 saw its
peer vanish (75)" would read as a requeue. Each node's launcher therefore writes its verdict to a file before it
exits, and the fold applies a priority instead of a maximum:

| verdicts present | folded exit | why |
|---|---|---|
| any ``failure`` (user code) | the earliest failure's code | the root cause; peers only saw its consequences |
| else any ``requeue`` or ``stopped`` | 75 | a lost peer, a killed worker, a stop signal: restart from the checkpoint |
| else all nodes ``done`` | 0 | every node finished |
| none or too few, srun 0 | 0 | nothing went wrong that anyone saw |
| too few, srun ≠ 0 | 75 when the others said ``done`` | the silent node's launcher died with its node |
| none, srun ≠ 0 | srun's | nothing to go by (e.g. nuro-launch could not start) |
"""

from __future__ import annotations

import enum
import json
import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from nuro.protocol.contract import EXIT_REQUEUE

#: Texts that mean "a peer or the rendezvous went away", not "the user's code is wrong". Each one was seen in a real
#: run (captured under tests/fixtures/launch/) or is the documented NCCL/gloo/c10d wording for the same event.
COMM_ERROR_PATTERNS: tuple[str, ...] = (
    r"Connection closed by peer",  # gloo pair.cc: the peer process died (captured)
    r"Connection reset by peer",  # gloo/TCP: the peer's host or kernel reset the socket
    r"Connection refused",  # store/rendezvous host gone
    r"Broken pipe",
    r"Timed out waiting \d+ms",  # gloo: frozen peer, after NURO_PG_TIMEOUT_S
    r"Socket Timeout",  # c10d TCPStore
    r"recvVector failed|Failed to recv, got 0 bytes",  # c10d TCPStore client lost the store (captured)
    r"DistNetworkError|DistStoreError",
    r"Rendezvous(Timeout|Connection|Closed)Error",  # torch.distributed.elastic.rendezvous
    r"Watchdog caught collective operation timeout",  # NCCL watchdog
    r"NCCL communicator was aborted|ncclRemoteError|ncclSystemError|NCCL Error \d+: remote process exited",
    r"ProcessGroupGloo.*(timeout|closed)",
)
_COMM_RE = re.compile("|".join(COMM_ERROR_PATTERNS), re.IGNORECASE)
#: torchrun's agent itself was signalled (srun's --kill-on-bad-exit TERM, scancel): what it then records in its
#: error file is "SignalException: Process 13244 got signal: 15" (captured on the dev cluster), not a user failure.
#: Signals a process sends itself when it crashes (abort, bad memory access): a failure of the code, unless the text
#: around it is a communication error (NCCL's watchdog aborts the process when a peer is lost).
_CRASH_SIGNALS = frozenset({signal.SIGABRT, signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL})
_AGENT_SIGNALLED_RE = re.compile(r"SignalException: Process \d+ got signal")


class Kind(enum.StrEnum):
    """A node's verdict on an attempt."""

    DONE = "done"  # torchrun exited 0
    REQUEUE = "requeue"  # restart me: acknowledged stop (75), lost peer, worker killed from outside
    STOPPED = "stopped"  # the launcher itself was told to stop (TERM/INT/USR1/USR2)
    FAILURE = "failure"  # the user's code failed on this node; exit with its code


@dataclass(frozen=True)
class WorkerFailure:
    """One failed local worker as torchrun reported it.

    Attributes:
        exitcode: the worker's exit status; negative = killed by that signal (torchrun's convention).
        message: the exception's last line (``ValueError: ...``) or torchrun's "Signal 9 (SIGKILL) received".
        rank: global rank, when known.
    """

    exitcode: int
    message: str = ""
    rank: int | None = None


@dataclass(frozen=True)
class Evidence:
    """Everything the launcher saw about one attempt on one node.

    Attributes:
        torchrun_rc: torchrun's exit status (negative = torchrun killed by that signal).
        failures: the failed local workers (from torchrun's error files and its failure summary).
        stop_signal: the stop signal the launcher itself received first (``TERM``, ``USR1``, ...), if any.
        tail: the end of torchrun's and the workers' stderr, searched for communication errors.
        stopped_ranks: local ranks whose PreemptionGuard had decided to exit 75 after its checkpoint (it leaves a
            marker in ``NURO_LAUNCH_STOP_DIR`` first): how such a worker's process then ended does not matter.
    """

    torchrun_rc: int
    failures: tuple[WorkerFailure, ...] = ()
    stop_signal: str | None = None
    tail: str = ""
    stopped_ranks: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Outcome:
    """A node's verdict: what kind of end, the exit status the launcher uses, and a one-line reason."""

    kind: Kind
    exit_code: int
    why: str
    node: int = 0
    at: float = 0.0
    details: dict = field(default_factory=dict, compare=False)

    def to_json(self) -> str:
        data = asdict(self)
        data["kind"] = self.kind.value
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Outcome:
        data = json.loads(text)
        return cls(
            kind=Kind(data["kind"]),
            exit_code=int(data["exit_code"]),
            why=str(data.get("why", "")),
            node=int(data.get("node", 0)),
            at=float(data.get("at", 0.0)),
            details=data.get("details") or {},
        )


def is_comm_error(text: str) -> bool:
    """Whether ``text`` carries a communication/rendezvous error (a peer or the store went away)."""
    return bool(_COMM_RE.search(text or ""))


def _agent_signalled(f: WorkerFailure) -> bool:
    return bool(_AGENT_SIGNALLED_RE.search(f.message))


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def classify(ev: Evidence) -> Outcome:
    """This node's verdict on the attempt, by the first rule that matches:

    1. torchrun exited 0 → DONE, 0.
    1b. every failed worker is one whose PreemptionGuard had decided to exit 75 after its checkpoint → REQUEUE, 75,
       whatever its exit status (gloo's teardown can still abort the process: SIGABRT after a committed stop).
    2. a local worker failed with a non-communication error and an exit code other than 0/75 → FAILURE with that
       code (a bug in the user's code beats the communication errors its peers then see). torchrun's own
       "SignalException" (the agent was signalled) is not such a failure.
    2b. a local worker crashed (SIGABRT/SIGSEGV/SIGBUS/SIGFPE/SIGILL) and no text mentions a communication error
       → FAILURE with 128+signal (NCCL's watchdog also aborts on a lost peer: then its text says so → rule 5).
    3. a local worker (or the launched command itself) exited 75 → REQUEUE (the PreemptionGuard's acknowledged stop).
    4. the launcher got a stop signal, or the agent reports it was signalled → STOPPED, 75 (scancel, GraceTime,
       srun's kill-on-bad-exit TERM after a peer's end).
    5. a worker or torchrun was killed by a signal, or any failure/tail text is a communication error → REQUEUE.
    6. otherwise → FAILURE with the first worker's code (or torchrun's when no worker failed; 1 if that is 0).
    """
    if ev.torchrun_rc == 0:
        return Outcome(Kind.DONE, 0, "torchrun exited 0: every local worker finished")
    if ev.stopped_ranks and ev.failures and all(f.rank in ev.stopped_ranks for f in ev.failures):
        how = ", ".join(f"rank {f.rank} exit {f.exitcode}" for f in ev.failures if f.exitcode != EXIT_REQUEUE)
        return Outcome(Kind.REQUEUE, EXIT_REQUEUE, "every failed worker had checkpointed and was exiting "
                       f"75{f' (ended at teardown: {how})' if how else ''}: restart me"[:500])  # fmt: skip
    for f in ev.failures:
        if f.exitcode > 0 and f.exitcode != EXIT_REQUEUE and not is_comm_error(f.message) and not _agent_signalled(f):
            return Outcome(Kind.FAILURE, f.exitcode, f"rank {f.rank} failed with exit {f.exitcode}: {f.message}"[:500])
    for f in ev.failures:
        if -f.exitcode in _CRASH_SIGNALS and not is_comm_error(f.message) and not is_comm_error(ev.tail):
            return Outcome(Kind.FAILURE, 128 - f.exitcode,
                           f"rank {f.rank} crashed with {_signame(-f.exitcode)}: {f.message}"[:500])  # fmt: skip
    if ev.torchrun_rc == EXIT_REQUEUE or any(f.exitcode == EXIT_REQUEUE for f in ev.failures):
        return Outcome(Kind.REQUEUE, EXIT_REQUEUE, "a worker exited 75: stopped after its checkpoint, restart me")
    if ev.stop_signal:
        return Outcome(Kind.STOPPED, EXIT_REQUEUE, f"nuro-launch received SIG{ev.stop_signal}: stopped, restart me")
    if any(_agent_signalled(f) for f in ev.failures):
        return Outcome(Kind.STOPPED, EXIT_REQUEUE, "torchrun was signalled from outside: stopped, restart me")
    for f in ev.failures:
        if f.exitcode < 0:
            return Outcome(Kind.REQUEUE, EXIT_REQUEUE,
                           f"rank {f.rank} was killed by {_signame(-f.exitcode)} from outside: restart me")  # fmt: skip
    if ev.torchrun_rc < 0:
        return Outcome(Kind.REQUEUE, EXIT_REQUEUE, f"torchrun was killed by {_signame(-ev.torchrun_rc)}: restart me")
    comm = [f for f in ev.failures if is_comm_error(f.message)]
    if comm or (not ev.failures and is_comm_error(ev.tail)):
        text = comm[0].message if comm else (_COMM_RE.search(ev.tail).group(0))  # type: ignore[union-attr]
        return Outcome(Kind.REQUEUE, EXIT_REQUEUE, f"lost a peer or the rendezvous ({text[:200]}): restart me")
    if ev.failures:
        f = ev.failures[0]
        return Outcome(Kind.FAILURE, f.exitcode if f.exitcode > 0 else 1,
                       f"rank {f.rank} failed with exit {f.exitcode}: {f.message}"[:500])  # fmt: skip
    return Outcome(Kind.FAILURE, ev.torchrun_rc if ev.torchrun_rc > 0 else 1,
                   f"torchrun exited {ev.torchrun_rc} without reporting a worker failure")  # fmt: skip


# --- reading torchrun's reports -------------------------------------------------------------------------------
_ROOT_CAUSE_RE = re.compile(
    r"rank\s*:\s*(?P<rank>-?\d+)[^\n]*\n\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n\s*error_file\s*:[^\n]*\n"
    r"\s*traceback\s*:\s*(?P<tb>.*?)(?=\n\[\d+\]:|\n=====|\Z)",
    re.DOTALL,
)


#: torch.distributed prefixes what a rank prints to stderr with ``[rank<N>]: `` (its uncaught exception included)
_RANK_PREFIX_RE = re.compile(r"^\[rank\d+\]:\s?")


def last_exception_line(traceback_text: str) -> str:
    """The ``Type: message`` line that ends a Python traceback (or the text's last non-empty line). A ``[rankN]: ``
    prefix is looked through: torch adds one to each line, and an error raised inside a DDP communication hook is
    followed by an ``At:`` frame list, so the text's last line is no exception (captured in CI: a lost peer then
    read as the user's failure)."""
    lines = [_RANK_PREFIX_RE.sub("", ln.strip()).strip() for ln in traceback_text.strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if ln]
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", line) or line.startswith("Signal "):
            return line
    return lines[-1] if lines else ""


def failures_from_summary(text: str) -> list[WorkerFailure]:
    """Failed workers from torchrun's ``ChildFailedError`` summary (``Root Cause``/``Failures`` blocks)."""
    out = []
    for m in _ROOT_CAUSE_RE.finditer(text):
        out.append(WorkerFailure(int(m.group("code")), last_exception_line(m.group("tb")), int(m.group("rank"))))
    return out


def failure_from_error_file(text: str, rank: int | None = None) -> WorkerFailure | None:
    """A worker failure from a torchelastic error file (written by ``@record``), or None if unreadable."""
    try:
        msg = json.loads(text)["message"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(msg, str):
        return WorkerFailure(1, last_exception_line(msg), rank)
    message = str(msg.get("message", ""))
    code = msg.get("errorCode")
    return WorkerFailure(int(code) if isinstance(code, int) else 1, last_exception_line(message) or message, rank)


def merge_failures(*groups: Iterable[WorkerFailure]) -> tuple[WorkerFailure, ...]:
    """One failure per rank (the first group that names a rank wins; rankless ones are kept)."""
    seen: set[int] = set()
    out = []
    for group in groups:
        for f in group:
            if f.rank is not None:
                if f.rank in seen:
                    continue
                seen.add(f.rank)
            out.append(f)
    return tuple(out)


# --- the batch step's fold -------------------------------------------------------------------------------------
def fold(verdicts: Sequence[Outcome], srun_rc: int, num_nodes: int) -> tuple[int, str]:
    """The step's exit status from the nodes' verdicts (see the module table). Returns (status, reason)."""
    failures = sorted((v for v in verdicts if v.kind == Kind.FAILURE), key=lambda v: v.at)
    if failures:
        f = failures[0]
        return f.exit_code, f"node {f.node}: {f.why}"
    restart = sorted((v for v in verdicts if v.kind in (Kind.REQUEUE, Kind.STOPPED)), key=lambda v: v.at)
    if restart:
        return EXIT_REQUEUE, f"node {restart[0].node}: {restart[0].why}"
    done = [v for v in verdicts if v.kind == Kind.DONE]
    if done and len(done) >= num_nodes:
        return 0, "every node finished"
    if srun_rc == 0:
        return 0, "srun exited 0"
    if done:
        return EXIT_REQUEUE, f"{num_nodes - len(done)} node(s) never reported (lost with their node): restart me"
    return srun_rc, f"no node reported a verdict; srun exited {srun_rc}"


def awaits_node_loss(status: int, verdicts: Sequence[Outcome], num_nodes: int) -> bool:
    """Whether the batch step waits for Slurm's own verdict on a lost node before the batch script requeues.

    A restart with a node that never reported is most likely a node loss: nuro's failure detector sets that node
    DOWN within a second or two, and Slurm then requeues the job itself (``--requeue``, JobRequeue=1). The batch
    script requeueing it as well spends two of the job's ``NURO_MAX_REQUEUES`` on one failure: seen on 24.11, where
    the survivor's in-band "Connection reset by peer" reached the batch script a second before the detector's
    verdict, and the job ended with restart count 2. One path decides: the step waits (``run_step``), Slurm's
    requeue ends the batch script, and only when no node goes down in time (a launcher died, not its node) does the
    script requeue.
    """
    return status == EXIT_REQUEUE and num_nodes > 1 and len({v.node for v in verdicts}) < num_nodes


__all__ = [
    "COMM_ERROR_PATTERNS",
    "EXIT_REQUEUE",
    "Evidence",
    "Kind",
    "Outcome",
    "WorkerFailure",
    "awaits_node_loss",
    "classify",
    "failure_from_error_file",
    "failures_from_summary",
    "fold",
    "is_comm_error",
    "last_exception_line",
    "merge_failures",
]

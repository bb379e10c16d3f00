"""In-band loss reports: a job's process saw a peer die; its launcher tells the node agent, the agent the controller.

Why: a node is declared lost after its heartbeats stop for ``miss_limit`` intervals (about 1 s). A job running on
it knows sooner: when a host's processes die, the kernel resets their sockets and the surviving ranks' collective
fails at once (gloo: "Connection closed by peer"). That is evidence about *some* node of the job, not proof about
which: so it only shortens how long the controller waits. A report makes the controller judge the job's other nodes
on a shorter silence (``liveness``: two beat intervals instead of ``miss_limit``); a node that keeps beating is never
declared lost for it. A false report (a user's own script sending one, a bug) costs a closer look, nothing more.

The path, and why each hop is trusted:

1. ``nuro-launch`` (the job's user) reads its workers' stderr as it is written; the first line that says a peer died
   (``PEER_DEATH_RE``) sends one datagram ``nuro-peerloss/1 <job id>`` to the node agent's Unix socket
   (``socket_path``: ``<dir>/<node>.report.sock``; the dir is ``$NURO_AGENT_SOCKET_DIR``, else the agent's status
   dir ``$NURO_AGENT_STATUS_DIR``, else ``/run/nuro-agent``; ``socket_dir``).
   Non-blocking, never raises: a missing agent costs the report, never the job.
2. The agent (root) takes the sender's uid from the kernel (``SO_PASSCRED``; a process cannot forge it) and accepts
   the report only for a job whose root-written record (``nuro.protocol.jobrecord``) says this node and that user
   (``accept``). It then beats at once with ``suspect_jobs`` (``nuro.protocol.heartbeat``), for ``SUSPECT_TTL_S``.
3. The controller (``slurm_plugins/controller/detection.py``) looks the job's nodes up in Slurm and judges them.

The same socket carries a job's **progress** (``nuro-progress/1``): rank 0's "step N is committed" (``ckpt``) and
"the checkpoint the stop signal asked for is committed, requeue me" (``ack``). Why here and not in the job comment:
the comment is the job's own 1,024 bytes, which its user may fill, so the controller's reclaim would depend on room
in something the job controls. On this path the size is fixed, the sender's identity is the kernel's and the
job's root-written record, and the time is the agent's clock when the report came (``at`` in the beat), never the
job's. The agent also learns commits as root, from its own upload worker (the job cannot forge those), and carries
both in its heartbeats (``commits``, ``acks``; ``nuro.protocol.heartbeat``). A false progress report only hurries
its own job's requeue or makes it the cheaper victim: the job loses, never another team.

Every report kind is rate-limited per job and per sender uid (``REPORT_RATE``), and a report never makes the agent
beat more than once per ``KICK_EVERY_S`` whatever the number of jobs reporting (one beat's worth of work).
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Mapping
from pathlib import Path

from nuro.protocol.envnames import NURO_AGENT_SOCKET_DIR, NURO_AGENT_STATUS_DIR
from nuro.protocol.heartbeat import is_node_name

PREFIX = b"nuro-peerloss/1 "
MAX_REPORT = 64
MAX_DATAGRAM = 256  # what the agent reads of one datagram (any report fits; more is junk)
#: How long one report keeps a job's nodes under the shorter silence (the agent repeats it in every beat meanwhile).
SUSPECT_TTL_S = 3.0
#: An agent sends at most one immediate beat per job this often (a worker printing the error in a loop).
KICK_EVERY_S = 0.5
DEFAULT_STATUS_DIR = "/run/nuro-agent"
#: What a surviving rank prints when a peer's process or host went away at once (a subset of
#: ``wrappers.launch_outcome.COMM_ERROR_PATTERNS``: not timeouts, which say a peer froze, long after the fact).
PEER_DEATH_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|Failed to recv, got 0 bytes"
    r"|NCCL Error \d+: remote process exited",
    re.IGNORECASE,
)


def socket_dir(env: Mapping[str, str]) -> Path:
    """Where the agents' report sockets are: ``NURO_AGENT_SOCKET_DIR``, else ``NURO_AGENT_STATUS_DIR``, else the
    packaged status dir (the same rule for the agent and the launcher)."""
    return Path(env.get(NURO_AGENT_SOCKET_DIR) or env.get(NURO_AGENT_STATUS_DIR) or DEFAULT_STATUS_DIR)


def socket_path(directory: str | Path, node: str) -> Path:
    """The agent's report socket on ``node``."""
    if not is_node_name(node):
        raise ValueError(f"node name {node!r} is not a valid Slurm node name")
    return Path(directory) / f"{node}.report.sock"


def encode(job_id: int) -> bytes:
    return PREFIX + str(int(job_id)).encode()


def parse(data: bytes) -> int | None:
    """The job id of a well-formed report, else None (anything else on the socket is ignored)."""
    if len(data) > MAX_REPORT or not data.startswith(PREFIX):
        return None
    rest = data[len(PREFIX) :]
    if not rest.isdigit() or len(rest) > 10:
        return None
    job = int(rest)
    return job if 0 < job < 2**32 else None


# -- straggler reports (issue 16 item 2): "a rank of my job on NODE runs SLOWDOWN times slower" ----------------------
STRAGGLER_PREFIX = b"nuro-straggler/1 "
#: How long the agent repeats one straggler report in its beats (the controller needs one beat to judge it).
STRAGGLER_TTL_S = 10.0
MAX_SLOWDOWN = 100.0


def encode_straggler(job_id: int, node: str, slowdown: float) -> bytes:
    """``nuro-straggler/1 <job> <node> <slowdown>``: what a job's rank 0 says when it flags a straggler."""
    if not is_node_name(node):
        raise ValueError(f"node name {node!r} is not a valid Slurm node name")
    return STRAGGLER_PREFIX + f"{int(job_id)} {node} {min(float(slowdown), MAX_SLOWDOWN):.3f}".encode()


def parse_straggler(data: bytes) -> tuple[int, str, float] | None:
    """(job id, node, slowdown) of a well-formed straggler report, else None. The job's own claim: the controller
    believes it only where Slurm and the node's NVML agree (``slurm_plugins/controller/liveness``)."""
    if len(data) > MAX_DATAGRAM or not data.startswith(STRAGGLER_PREFIX):
        return None
    parts = data[len(STRAGGLER_PREFIX) :].split(b" ")
    if len(parts) != 3 or not parts[0].isdigit() or len(parts[0]) > 10:
        return None
    job, node = int(parts[0]), parts[1].decode("ascii", "replace")
    try:
        slowdown = float(parts[2])
    except ValueError:
        return None
    if not 0 < job < 2**32 or not is_node_name(node) or not 1.0 < slowdown <= MAX_SLOWDOWN:
        return None
    return job, node, slowdown


def send_straggler(path: Path, job_id: int, node: str, slowdown: float) -> bool:
    """One straggler report to the agent at ``path``; False (never an exception) when it could not be sent."""
    try:
        return _send(path, encode_straggler(job_id, node, slowdown))
    except ValueError:
        return False


# -- progress reports (issue 30): "step N of my job is committed", "I acknowledge the stop" ---------------------------
PROGRESS_PREFIX = b"nuro-progress/1 "
KIND_CKPT = "ckpt"
KIND_ACK = "ack"
#: ``why`` of an ack: which stop the job answered (``wrappers.sdk.preemption.StopReason.label``), a short word.
_WHY = re.compile(r"[a-z_]{1,16}")
MAX_STEP = 10**15  # the record's integer range (nuro.protocol.jobcomment.MAX_INT_DIGITS)
#: Per job and per sender uid: (reports per second, burst). A training job sends one ``ckpt`` per commit and one
#: ``ack`` per stop; a loss or straggler report is rarer still. More is refused (counted, logged once a minute).
REPORT_RATE = {"job": (2.0, 10.0), "uid": (10.0, 40.0)}


def encode_progress(kind: str, job_id: int, step: int, why: str = "", taken_at: int | None = None) -> bytes:
    """``nuro-progress/1 ckpt <job> <step> [<taken at, Unix s>]`` or ``nuro-progress/1 ack <job> <step> <why>``."""
    if kind not in (KIND_CKPT, KIND_ACK) or not 0 <= int(step) < MAX_STEP or not 0 < int(job_id) < 2**32:
        raise ValueError(f"not a progress report: {kind!r} job={job_id!r} step={step!r}")
    words = [kind, str(int(job_id)), str(int(step))]
    if kind == KIND_CKPT and taken_at is not None:
        words.append(str(max(0, int(taken_at))))
    if kind == KIND_ACK and why:
        if not _WHY.fullmatch(why):
            raise ValueError(f"ack why {why!r} is not a short lower-case word")
        words.append(why)
    return PROGRESS_PREFIX + " ".join(words).encode()


def parse_progress(data: bytes) -> tuple[str, int, int, str] | None:
    """(kind, job id, step, why) of a well-formed progress report, else None; for ``ckpt`` the fourth item is the
    taken-at time's digits ("" when the report has none)."""
    if len(data) > MAX_REPORT or not data.startswith(PROGRESS_PREFIX):
        return None
    parts = data[len(PROGRESS_PREFIX) :].decode("ascii", "replace").split(" ")
    if len(parts) not in (3, 4) or parts[0] not in (KIND_CKPT, KIND_ACK):
        return None
    kind, job, step = parts[0], parts[1], parts[2]
    why = parts[3] if len(parts) == 4 else ""
    if not (job.isdigit() and len(job) <= 10 and step.isdigit() and len(step) <= 15):
        return None
    bad_why = kind == KIND_ACK and why and not _WHY.fullmatch(why)
    bad_taken = kind == KIND_CKPT and why and not (why.isdigit() and len(why) <= 12)
    if bad_why or bad_taken or not 0 < int(job) < 2**32:
        return None
    return kind, int(job), int(step), why


def send_progress(path: Path, kind: str, job_id: int, step: int, why: str = "", taken_at: int | None = None) -> bool:
    """One progress report to the agent at ``path``; False (never an exception) when it could not be sent."""
    try:
        return _send(path, encode_progress(kind, job_id, step, why, taken_at))
    except ValueError:
        return False


def accept(job_id: int, sender_uid: int, record_uid: int | None, record_node: str | None, node: str) -> bool:
    """Whether the agent takes a report: the job has a root-written record on this node, and the sender is its user
    (or root)."""
    return record_uid is not None and record_node == node and sender_uid in (record_uid, 0) and job_id > 0


def send(path: Path, job_id: int) -> bool:
    """One report datagram to the agent at ``path``; False (never an exception) when it could not be sent."""
    return _send(path, encode(job_id))


def _send(path: Path, data: bytes) -> bool:
    """One datagram to the agent's socket, non-blocking; False when it could not be sent (no agent, full queue)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        s.sendto(data, str(path))
        return True
    return False


class LineWatch:
    """Feed it a worker's output lines; the first that says a peer died sends the job's report (once per launcher)."""

    def __init__(self, path: Path, job_id: int) -> None:
        self.path, self.job_id = path, job_id
        self.sent: bool | None = None  # None: nothing seen yet; else whether the datagram went out

    def __call__(self, line: str) -> None:
        if self.sent is None and PEER_DEATH_RE.search(line):
            self.sent = send(self.path, self.job_id)


__all__ = [
    "KIND_ACK", "KIND_CKPT", "PEER_DEATH_RE", "REPORT_RATE", "STRAGGLER_TTL_S", "SUSPECT_TTL_S", "LineWatch", "accept",
    "encode", "encode_progress", "encode_straggler", "parse", "parse_progress", "parse_straggler", "send",
    "send_progress", "send_straggler", "socket_dir", "socket_path",
]  # fmt: skip

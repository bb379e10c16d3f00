"""nuro-launch: runs torchrun on each node of a job, forwards stop signals, turns the end into an exit Slurm acts on.

Two modes, both used by the rendered batch script (``nuro.jobspec.render._launch_lines``):

    # per node, one srun task each: build the torchrun command, run it, classify the end, write a verdict
    srun --ntasks-per-node=1 --kill-on-bad-exit=1 python -m nuro.wrappers.launch --nproc-per-node=8 -- train.py ...

    # in the batch step, around that srun: relay the batch shell's signals, then fold the nodes' verdicts
    python -m nuro.wrappers.launch --step -- srun ... python -m nuro.wrappers.launch ... &

Exit statuses (node mode and step mode alike): 0 = finished; 75 (``EXIT_REQUEUE``) = restart me (the batch script
requeues within ``NURO_MAX_REQUEUES``); anything else = the user's code failed with that status (not requeued).
How an end is classified and why the step folds verdicts instead of trusting srun's maximum: ``launch_outcome``.

Signals (chosen once, documented in docs/launch.md):

| signal to nuro-launch | forwarded to | meaning |
|---|---|---|
| ``USR1`` (``NURO_PREEMPT_SIGNAL``) | every worker (not the agent)| preempted: checkpoint at the agreed step, exit 75|
| ``USR2`` (``NURO_STOP_SIGNAL``) | every worker (not the agent) | time limit near: same protocol |
| ``TERM``, ``INT`` | the agent and every worker | stop now |

The torchrun agent is started with USR1/USR2 *ignored*: it has no handler for them and would die of their default
action (and Slurm's proctrack signals every process of the step, the agent included). Workers inherit "ignored",
so a script without a PreemptionGuard keeps training until the grace backstop; ``PreemptionGuard.start()``
installs real handlers. Workers run in their own session, so forwarding walks the agent's descendants (psutil).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nuro.checkpoint.layout import node_staging_root
from nuro.lifecycle import run_events
from nuro.protocol import jobrecord, peerloss
from nuro.protocol.contract import (
    EXIT_REQUEUE,
    PG_TIMEOUT_S,
    PREEMPT_SIGNAL,
    TIME_LIMIT_SIGNAL,
    rdzv_port,
)
from nuro.protocol.envnames import (
    NURO_JOB_DIR,
    NURO_PG_TIMEOUT_S,
    NURO_RDZV_ADDR,
    NURO_RDZV_PORT,
    NURO_STAGING_DIR,
    NURO_STAGING_ROOT,
)
from nuro.protocol.stopmarkers import move_request, stopped_ranks
from nuro.safeio.atomic import write_atomic
from nuro.slurm import CliBackend, HostlistError, SlurmError, expand_hostlist
from nuro.wrappers import spares
from nuro.wrappers.direct import Workers, plan_workers
from nuro.wrappers.launch_outcome import (
    Evidence,
    Kind,
    Outcome,
    WorkerFailure,
    classify,
    failure_from_error_file,
    failures_from_summary,
    fold,
    last_exception_line,
    merge_failures,
)
from nuro.wrappers.launch_plan import LaunchError, TorchrunPlan, first_node, node_addr, plan_torchrun
from nuro.wrappers.proctree import Leftovers, descendants, forward

log = logging.getLogger("nuro.launch")

#: How long a node whose verdict is only a *consequence* (it lost a peer) waits for the other nodes' verdicts before
#: exiting: its non-zero exit makes srun kill the rest (--kill-on-bad-exit), which could otherwise kill the node with
#: the root cause before it wrote its verdict. Measured: the nodes' torchruns end within ~1 s of each other.
DEFAULT_SETTLE_S = 5.0
#: How long the batch step waits for Slurm's verdict when a node never reported (``awaits_node_loss``): above the
#: failure detector's timeout (1 s in production, 2 s on the test clusters) plus its Slurm call, well below Slurm's
#: own SlurmdTimeout. ``$NURO_NODE_LOSS_WAIT_S`` overrides it; 0 turns the wait off.
DEFAULT_NODE_LOSS_WAIT_S = 10.0
#: Once Slurm has taken the job over (it left RUNNING), how long the step still waits to be ended by it: KillWait
#: plus the epilog's start, generously.
TAKEOVER_WAIT_S = 60.0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: The controller's preemption signal and Slurm's time-limit warning (``nuro.protocol.contract``): the training's
#: PreemptionGuard acts on them, the torchrun agent must not.
_PREEMPT = signal.Signals[f"SIG{PREEMPT_SIGNAL}"]
_TIME_LIMIT = signal.Signals[f"SIG{TIME_LIMIT_SIGNAL}"]
_TRAINING_SIGNALS = (_PREEMPT, _TIME_LIMIT)
_TAIL_BYTES = 64 * 1024


# --- processes and signals -------------------------------------------------------------------------------------
def _ignore_training_signals() -> None:
    """preexec for torchrun: USR1/USR2 ignored (inherited through exec and by the workers); see module docstring."""
    for sig in _TRAINING_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def wait_relaying(
    proc: subprocess.Popen,
    handlers: Mapping[int, Callable[[int, object], None]],
    poll_s: float,
    on_poll: Callable[[], None] | None = None,
) -> int:
    """Wait for ``proc`` with ``handlers`` installed for their signals (restored after), polling every ``poll_s``
    (``on_poll`` runs before each wait); returns its exit status. Both modes wait like this: the handlers relay what
    the batch shell or Slurm sends while the child runs."""
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items()}
    try:
        while True:
            if on_poll is not None:
                on_poll()
            try:
                return proc.wait(timeout=poll_s)
            except subprocess.TimeoutExpired:
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Tail:
    """Copies a pipe to a stream line by line and keeps the last bytes for the classifier."""

    def __init__(self, src, dst, on_line: Callable[[str], None] | None = None) -> None:  # noqa: ANN001 - files
        self.buf: collections.deque[str] = collections.deque()
        self.size = 0
        self.on_line = on_line
        self.thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
        self.thread.start()

    def _pump(self, src, dst) -> None:  # noqa: ANN001
        for line in iter(src.readline, ""):
            if self.on_line is not None:
                self.on_line(line)  # before the copy: a lost peer is reported as soon as a worker says so
            dst.write(line)
            dst.flush()
            self.buf.append(line)
            self.size += len(line)
            while self.size > _TAIL_BYTES and self.buf:
                self.size -= len(self.buf.popleft())

    def text(self, join_s: float = 2.0) -> str:
        self.thread.join(join_s)
        return "".join(self.buf)


@dataclass
class _Signals:
    """What the launcher was told while torchrun ran (set in handlers, read after)."""

    first_stop: str | None = None
    received: list[str] = field(default_factory=list)

    def note(self, signum: int) -> str:
        """Record a signal the launcher got (the first TERM/INT is the stop); its name without ``SIG``."""
        name = signal.Signals(signum).name.removeprefix("SIG")
        self.received.append(name)
        if signum in _STOP_SIGNALS and self.first_stop is None:
            self.first_stop = name  # USR1/USR2 alone are no stop: the guard's 75 (or a clean 0) says what happened
        return name


# --- node mode ---------------------------------------------------------------------------------------------------
def collect_evidence(
    rc: int, tail: str, error_file: Path, log_dir: Path, stop: str | None, stop_dir: Path | None = None
) -> Evidence:
    """Read torchrun's failure summary, its error file, the workers' error files/stderr and the guards' stop
    markers (``rank-<N>`` in ``stop_dir``) into ``Evidence``."""
    summary = failures_from_summary(tail)
    local: list[WorkerFailure] = []
    for err in sorted(log_dir.glob("*/attempt_*/*/error.json")):
        f = failure_from_error_file(err.read_text(errors="replace"))
        if f is not None:
            local.append(f)
    stderr_tails = []
    for path in sorted(log_dir.glob("*/attempt_*/*/stderr.log")):
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - _TAIL_BYTES))
            stderr_tails.append(fh.read().decode(errors="replace"))
    agent = failure_from_error_file(error_file.read_text(errors="replace")) if error_file.exists() else None
    # torchrun's summary has ranks and exit codes; without @record its traceback is only a link: take the
    # message from an error file or the worker's stderr instead.
    fallback = (local[0].message if local else "") or (agent.message if agent else "") or next(
        (last_exception_line(t) for t in stderr_tails if "Traceback" in t), "")  # fmt: skip
    fixed = [
        WorkerFailure(f.exitcode, fallback, f.rank) if ("To enable traceback" in f.message or not f.message) else f
        for f in summary
    ]
    failures = merge_failures(fixed, [] if fixed else ([agent] if agent else local))
    return Evidence(torchrun_rc=rc, failures=failures, stop_signal=stop, tail=tail + "".join(stderr_tails),
                    stopped_ranks=stopped_ranks(stop_dir))  # fmt: skip


def attempt_dir(base: Path, env: Mapping[str, str]) -> Path:
    """Where this attempt's verdicts go: ``<base>/attempt-<SLURM_RESTART_COUNT>``, and ``…-swap-<N>`` for the step
    started again on a spare (``NURO_LAUNCH_SWAP``, ``wrappers.spares``)."""
    swap = spares.swap_index(env)
    return base / (f"attempt-{_attempt(env)}" + (f"-swap-{swap}" if swap else ""))


def _attempt(env: Mapping[str, str]) -> str:
    """This attempt's number as Slurm gives it to the job (``SLURM_RESTART_COUNT``, unset on the first)."""
    return env.get("SLURM_RESTART_COUNT") or "0"


def verdict_base(env: Mapping[str, str], given: str | None) -> Path | None:
    """``--verdict-dir``, else ``$NURO_LAUNCH_DIR``, else ``$NURO_JOB_DIR/launch``, else None (no fold)."""
    if given:
        return Path(given)
    if env.get("NURO_LAUNCH_DIR"):
        return Path(env["NURO_LAUNCH_DIR"])
    if env.get(NURO_JOB_DIR):
        return Path(env[NURO_JOB_DIR]) / "launch"
    return None


def write_verdict(directory: Path, outcome: Outcome) -> Path:
    """Write ``node-<id>.json`` atomically (a half-written verdict must never be folded)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"node-{outcome.node}.json"
    write_atomic(path, outcome.to_json(), durable=False)  # read by the step on this same run, never after a crash
    return path


def read_verdicts(directory: Path) -> list[Outcome]:
    out = []
    for path in sorted(directory.glob("node-*.json")):
        try:
            out.append(Outcome.from_json(path.read_text()))
        except (ValueError, KeyError, OSError) as exc:
            log.warning("unreadable verdict %s (%s): ignored", path, exc)
    return out


def should_settle(kind: Kind, num_nodes: int, stop_signal: str | None) -> bool:
    """Whether this node waits for the others' verdicts before exiting (``settle``).

    Only a *consequence* verdict (REQUEUE, STOPPED: it lost a peer) of a multi-node step waits, so its early exit
    cannot make srun (``--kill-on-bad-exit``) kill the node with the root cause before that one wrote its verdict.
    Never after a TERM/INT to this launcher: Slurm is already tearing the whole step down (scancel, a node failure,
    the time limit), every node got the same signal, and waiting only keeps this node COMPLETING until KillWait's
    SIGKILL. Measured on a node loss (26.05): the surviving node's launcher sat out the whole 5 s settle, which
    delayed the requeued job's next start by as much.
    """
    return kind in (Kind.REQUEUE, Kind.STOPPED) and num_nodes > 1 and stop_signal not in ("TERM", "INT")


def settle(directory: Path, num_nodes: int, timeout_s: float) -> None:
    """Wait until every node wrote a verdict or ``timeout_s`` passed (only for consequence verdicts)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(list(directory.glob("node-*.json"))) < num_nodes:
        time.sleep(0.1)


def with_node_staging_dir(env: Mapping[str, str]) -> Mapping[str, str]:
    """``env`` with this node's ``NURO_STAGING_DIR`` when the batch script could not set it: a ``NURO_STAGING_ROOT``
    naming ``{node}`` (one root per node on one shared disk, as the dev cluster has) resolves only on the node."""
    root, job = env.get(NURO_STAGING_ROOT, ""), env.get("SLURM_JOB_ID", "")
    if env.get(NURO_STAGING_DIR) or not root or not job:
        return env
    try:
        return {**env, NURO_STAGING_DIR: str(node_staging_root(root, env.get("SLURMD_NODENAME")) / job)}
    except ValueError as exc:
        log.warning("no staging dir for this node (%s): checkpoints stage where the SDK's default says", exc)
        return env


def prolog_missing(env: Mapping[str, str]) -> str | None:
    """Why nuro's prolog did not run on this node for this attempt, or None (it did, or this node runs none).

    slurmd runs a job's prolog only the first time it sees the job id (22.05 through 26.05): a node that still
    remembers an earlier attempt starts the new one without it (a survivor of a requeue on 22.05, SchedMD bug 15656;
    a host back from a crash whose slurmd reloaded its old job state, ``nuro.healthcheck.slurmdspool``). Such an
    attempt has no staging dir and no root record of itself, so nothing it saves could ever commit. Judged only
    where nuro's prolog runs (the node's job records dir exists)."""
    root, job, node = env.get(NURO_STAGING_ROOT, ""), env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME")
    if not root or not job.isdigit():
        return None
    try:
        staging = node_staging_root(root, node)
        if not (staging / jobrecord.DIR).is_dir():
            return None
        rec = jobrecord.read(staging, job)
    except (OSError, ValueError):  # unreadable or malformed: the prolog ran; what it wrote is the epilog's to judge
        return None
    attempt = _attempt(env)
    if rec is None:
        return f"no prolog ran on {node} for attempt {attempt} of job {job} (no job record: slurmd skipped it)"
    if str(rec.restart) != attempt:
        return (f"no prolog ran on {node} for attempt {attempt} of job {job} (its job record is attempt "
                f"{rec.restart}'s: slurmd skipped the prolog)")  # fmt: skip
    return None


def run_node(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Node mode: plan, run torchrun with signal forwarding, classify, write the verdict, return the exit status."""
    missing = prolog_missing(env)
    if missing is not None:
        # nothing this attempt saves here could commit: restart at once (a fresh attempt gets its prolog), and say
        # so in this node's verdict, so the step does not wait for it as for a lost node
        log.error("%s: restarting the job instead of training without it", missing)
        base = verdict_base(env, args.verdict_dir)
        if base is not None:
            node_id = int(env["SLURM_NODEID"]) if env.get("SLURM_NODEID", "").isdigit() else 0
            with contextlib.suppress(OSError):
                write_verdict(attempt_dir(base, env), Outcome(Kind.REQUEUE, EXIT_REQUEUE, missing, node=node_id,
                                                              at=time.time()))  # fmt: skip
        return EXIT_REQUEUE
    env = with_node_staging_dir(env)
    # node-local scratch for torchrun's error files and stderr copies; in the job's staging dir when the prolog made
    # one (the epilog cleans it even when Slurm SIGKILLs this launcher before its own clean-up runs)
    work = Path(tempfile.mkdtemp(prefix=f"nuro-launch-{env.get('SLURM_JOB_ID', 'x')}-",
                                 dir=env.get(NURO_STAGING_DIR) or None))  # fmt: skip
    try:
        name = env.get("SLURMD_NODENAME") or socket.gethostname()
        # direct workers never advertise this node's address (rank 0 serves the store at NURO_RDZV_ADDR): no scontrol
        local = "" if args.launcher == "direct" else args.local_addr or env.get("NURO_LOCAL_ADDR") or node_addr(name)
        rdzv = None if env.get(NURO_RDZV_ADDR) else node_addr(first_node(env) or name)
        plan = plan_torchrun(env, args.script, nproc_per_node=args.nproc_per_node, python=args.python,
                             local_addr=local, rdzv_addr=rdzv, error_file=str(work / "agent-error.json"),
                             log_dir=str(work / "logs"), pg_timeout_s=args.pg_timeout_s,
                             stop_dir=str(work / "stops"))  # fmt: skip
        base = verdict_base(env, args.verdict_dir)
        vdir = attempt_dir(base, env) if base else None
        if args.launcher == "torchrun":
            log.warning("node=%d/%d job=%s argv=%s", plan.node_id, plan.num_nodes, env.get("SLURM_JOB_ID"),
                        " ".join(plan.argv))  # fmt: skip
        t0 = time.monotonic()
        if args.launcher == "direct":
            rc, sigs, evidence = _run_direct(plan, args, env, work)
        else:
            rc, tail, sigs = _run_torchrun(plan, env)
            evidence = collect_evidence(rc, tail, work / "agent-error.json", work / "logs", sigs.first_stop,
                                        work / "stops")  # fmt: skip
        outcome = classify(evidence)
        details = {"torchrun_rc": rc, "signals": sigs.received, "ran_s": round(time.monotonic() - t0, 2)}
        move = move_request(work / "stops")
        if move and outcome.kind in (Kind.REQUEUE, Kind.STOPPED):
            details["move_from"] = move  # the training stopped to leave a straggler: the step swaps it out
        outcome = Outcome(
            outcome.kind, outcome.exit_code, outcome.why, node=plan.node_id, at=time.time(), details=details
        )
        log.warning("node=%d verdict=%s exit=%d torchrun_rc=%d why=%s", plan.node_id, outcome.kind.value,
                    outcome.exit_code, rc, outcome.why)  # fmt: skip
        if vdir is not None:
            try:  # the verdict helps the fold; failing to write it must never change this node's exit status
                write_verdict(vdir, outcome)
                if should_settle(outcome.kind, plan.num_nodes, sigs.first_stop):
                    settle(vdir, plan.num_nodes, args.settle_s)
            except OSError as exc:
                log.warning("verdict not written to %s (%s): the step falls back to srun's status", vdir, exc)
        return outcome.exit_code
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_torchrun(plan: TorchrunPlan, env: Mapping[str, str]) -> tuple[int, str, _Signals]:
    """Run torchrun in its own session with USR1/USR2 ignored, forward signals, and reap what it leaves behind.

    Workers that outlive their agent (the agent SIGKILLed, e.g. by the OOM killer) are reparented away from this
    process, where ``proctrack/linuxproc`` no longer sees them either: the PIDs seen while torchrun ran are kept
    (psutil remembers each one's start time, so a reused PID is never hit) and killed once torchrun is gone.
    """
    sigs = _Signals()
    try:
        proc = subprocess.Popen(list(plan.argv), env={**env, **plan.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True,
                                preexec_fn=_ignore_training_signals)  # fmt: skip
    except OSError as exc:
        raise LaunchError(f"cannot start torchrun with {plan.argv[0]!r}: {exc}; check entrypoint.python") from exc
    out, err = _Tail(proc.stdout, sys.stdout), _Tail(proc.stderr, sys.stderr, peer_loss_watch(env))
    left = Leftovers()

    def on_signal(signum: int, _frame: object) -> None:
        name = sigs.note(signum)
        pids = forward(signum, proc.pid, include_root=signum not in _TRAINING_SIGNALS)
        log.warning("forwarded SIG%s to pids=%s", name, pids)

    handlers = dict.fromkeys((*_STOP_SIGNALS, *_TRAINING_SIGNALS), on_signal)
    rc = wait_relaying(proc, handlers, poll_s=1.0, on_poll=lambda: left.remember(proc.pid))
    left.kill("torchrun")
    return rc, out.text() + err.text(), sigs


def peer_loss_watch(env: Mapping[str, str]) -> peerloss.LineWatch | None:
    """What reports a lost peer to this node's agent as soon as a worker prints it (``nuro.protocol.peerloss``);
    None outside a Slurm job."""
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    if not job.isdigit() or not peerloss.is_node_name(node):
        return None
    return peerloss.LineWatch(peerloss.socket_path(peerloss.socket_dir(env), node), int(job))


def _run_direct(
    plan: TorchrunPlan, args: argparse.Namespace, env: Mapping[str, str], work: Path
) -> tuple[int, _Signals, Evidence]:
    """Start this node's workers without torchrun's agent (``wrappers.direct``), forward signals like the torchrun
    path (USR1/USR2 to the workers, TERM/INT too), and kill what they leave behind once they are gone."""
    addr, port = plan.env[NURO_RDZV_ADDR], int(plan.env[NURO_RDZV_PORT])
    specs = plan_workers(
        args.script, python=args.python, node_id=plan.node_id, num_nodes=plan.num_nodes,
        nproc_per_node=args.nproc_per_node, master_addr=addr, master_port=port,
        job_id=int(env["SLURM_JOB_ID"]), error_dir=str(work),
        base_env={k: v for k, v in plan.env.items() if k != "TORCHELASTIC_ERROR_FILE"},
    )  # fmt: skip
    log.warning("node=%d/%d job=%s ranks=%s master=%s:%d argv=%s", plan.node_id, plan.num_nodes,
                env.get("SLURM_JOB_ID"), ",".join(str(s.rank) for s in specs), addr, port,
                " ".join(specs[0].argv))  # fmt: skip
    sigs = _Signals()
    watch = peer_loss_watch(env)
    try:
        workers = Workers(specs, env, _ignore_training_signals, lambda src, dst: _Tail(src, dst, watch))
    except OSError as exc:
        raise LaunchError(f"cannot start the training with {args.python!r}: {exc}; check entrypoint.python") from exc
    left = Leftovers()

    def on_signal(signum: int, _frame: object) -> None:
        log.warning("forwarded SIG%s to pids=%s", sigs.note(signum), workers.signal_all(signum))

    handlers = dict.fromkeys((*_STOP_SIGNALS, *_TRAINING_SIGNALS), on_signal)
    rc = wait_relaying(workers, handlers, poll_s=1.0, on_poll=lambda: left.remember(*workers.pids()))  # type: ignore[arg-type]
    left.kill("the workers")
    return rc, sigs, workers.evidence(rc, sigs.first_stop, stopped_ranks(work / "stops"))


# --- step mode ---------------------------------------------------------------------------------------------------
def await_node_loss(
    job_id: str,
    timeout_s: float,
    job_state: Callable[[str], str] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Wait up to ``timeout_s`` for Slurm to take the job over after a node loss; True when it did.

    Slurm takes a job over when a node of it is set DOWN (nuro's detector does so within seconds): the job leaves
    RUNNING, is requeued, and this batch script is killed. Once the job has left RUNNING the wait goes on (up to
    ``TAKEOVER_WAIT_S``) until that kill comes, so the script never requeues a job Slurm already requeued. An
    unreadable state (slurmctld slow) counts as still running.
    """
    job_state = job_state or CliBackend(timeout_s=5).job_state
    deadline = clock() + timeout_s
    taken = False
    while clock() < deadline:
        try:
            state = job_state(job_id)
        except SlurmError as exc:
            log.warning("job %s state unreadable while waiting for a node verdict (%s)", job_id, exc)
            state = "RUNNING"
        if state and state != "RUNNING" and not taken:
            taken = True
            log.warning("job %s is %s: Slurm requeues it for the lost node; not requeued here", job_id, state)
            deadline = clock() + TAKEOVER_WAIT_S
        sleep(0.5)
    return taken


def node_loss_wait_s(env: Mapping[str, str]) -> float:
    """``$NURO_NODE_LOSS_WAIT_S`` (seconds, ≥ 0), else ``DEFAULT_NODE_LOSS_WAIT_S``; a malformed value is refused."""
    raw = env.get("NURO_NODE_LOSS_WAIT_S", "").strip()
    if not raw:
        return DEFAULT_NODE_LOSS_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 600:
        raise LaunchError(f"NURO_NODE_LOSS_WAIT_S={raw!r}: give seconds between 0 and 600 (default "
                          f"{DEFAULT_NODE_LOSS_WAIT_S:g})")  # fmt: skip
    return value


def _fresh_verdict_dir(vdir: Path | None) -> None:
    if vdir is None:
        return
    shutil.rmtree(vdir, ignore_errors=True)  # a stale verdict of an earlier, identical attempt must not count
    try:
        vdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("cannot create %s (%s): the nodes' verdicts will be missing", vdir, exc)


def _run_srun(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, list[int]]:
    """Run the step's srun, relaying USR2/TERM/INT to it; its exit status (signals as 128+N) and what was relayed
    (USR1 is noted but never relayed: scancel --full gives srun its own copy)."""
    proc = subprocess.Popen(list(argv), env=dict(env))
    seen: list[int] = []

    def relay(signum: int, _frame: object) -> None:
        seen.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signum)

    handlers = {**dict.fromkeys((_TIME_LIMIT, *_STOP_SIGNALS), relay), _PREEMPT: lambda signum, _f: seen.append(signum)}
    rc = wait_relaying(proc, handlers, poll_s=0.5)
    return (128 - rc if rc < 0 else rc), seen


def run_step(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Step mode (batch script): run srun, relay USR2/TERM/INT to it, then fold the nodes' verdicts. With hot
    spares (``NURO_SPARE_NODES``) a step that lost a node runs again on the survivors plus a spare."""
    base = verdict_base(env, args.verdict_dir)
    wait_s = node_loss_wait_s(env)
    state = _spare_state(env)
    while True:
        step_env = dict(env)
        if state is not None:  # the training weighs a move by the spares still left (MovePolicy)
            step_env[spares.ENV_SPARES_LEFT] = str(len(state.spares))
            if state.swaps:
                step_env[spares.ENV_LAUNCH_SWAP] = str(state.swaps)
        vdir = attempt_dir(base, step_env) if base else None
        _fresh_verdict_dir(vdir)
        argv = args.script if state is None else spares.with_nodelist(args.script, state.active)
        rc, seen = _run_srun(argv, step_env)
        if vdir is None:
            return rc
        num_nodes = len(state.active) if state is not None else int(env.get("SLURM_JOB_NUM_NODES") or 1)
        try:
            found = read_verdicts(vdir)
        except OSError as exc:
            log.warning("cannot read the verdicts in %s (%s): using srun's status %d", vdir, exc, rc)
            found = []
        status, why = fold(found, rc, num_nodes)
        print(f"nuro: step ended: srun exit {rc}, launch verdict {status} ({why})", flush=True)
        # TERM/INT relayed: Slurm is already ending the job (scancel, a node it set DOWN): nothing to wait for; a
        # stop signal (preemption, time limit) means leave, not swap
        decided = spares.after_step(
            status, found, num_nodes, state=state, signalled=bool(seen), stopping=any(s in _STOP_SIGNALS for s in seen),
            in_job=bool(env.get("SLURM_JOB_ID")), wait_s=wait_s,
        )  # fmt: skip
        if decided.next is spares.Next.MOVE and state is not None and decided.node is not None:
            first = state.active[0]
            swap = state.replace([decided.node], _allocation(env["SLURM_JOB_ID"], [*state.active, *state.spares]))
            if swap is not None:
                _announce(swap, env, "straggler", f"the training left straggler {decided.node}")
                env = _rendezvous_on(env, swap.nodes[0]) if swap.nodes[0] != first else env
                continue
            print(f"nuro: no spare left to replace straggler {decided.node}: the requeue path follows", flush=True)
        elif decided.next is spares.Next.FIND_LOST and state is not None:
            lost, swap = _swap_for_lost(state, env["SLURM_JOB_ID"], found, wait_s)
            if swap is not None:
                _announce(swap, env, "node_lost", f"node(s) {','.join(swap.lost)} lost")
                continue
            if lost:
                print(f"nuro: node(s) {','.join(lost)} lost and no spare left: the requeue path follows", flush=True)
            return spares.after_lost(status, lost)
        elif decided.next is spares.Next.AWAIT_LOSS:
            print(f"nuro: a node never reported; waiting up to {wait_s:g} s for Slurm's node verdict", flush=True)
            taken = await_node_loss(env["SLURM_JOB_ID"], wait_s)
            print(
                "nuro: Slurm took the job over but never ended this script"
                if taken
                else f"nuro: no node of the job went down in {wait_s:g} s (a launcher died, not its node)",
                flush=True,
            )
        return status


def _announce(swap: spares.Swap, env: Mapping[str, str], why: str, what: str) -> None:
    """Say a swap in the job's output and record it (``spare_swap`` run event)."""
    print(f"nuro: {what}; going on with spare(s) {','.join(swap.spares)} ({swap.spares_left} left) on "
          f"{','.join(swap.nodes)}", flush=True)  # fmt: skip
    run_events.record_later("spare_swap", env=dict(env), why=why, **swap.fields())


def _rendezvous_on(env: Mapping[str, str], first: str) -> dict[str, str]:
    """The step's environment with the rendezvous on ``first``, the new step's node 0 where rank 0 serves the
    store: a straggling batch host can be swapped out of the step (a lost one ends the job with it)."""
    return {**env, NURO_RDZV_ADDR: node_addr(first)}


def _allocation(job_id: str, fallback: list[str]) -> list[str]:
    """The job's nodes now (Slurm's order), else ``fallback`` when Slurm does not answer (or lists none)."""
    try:
        return CliBackend(timeout_s=5).job_nodes(job_id) or fallback
    except SlurmError as exc:
        log.warning("job %s nodes unreadable (%s)", job_id, exc)
        return fallback


def _spare_state(env: Mapping[str, str]) -> spares.SpareState | None:
    """The job's training nodes and spares (``NURO_SPARE_NODES`` > 0), else None: the step runs as rendered."""
    try:
        count = spares.spare_count(env)
        if not count:
            return None
        allocation = expand_hostlist(env.get("SLURM_JOB_NODELIST") or "")
        return spares.SpareState.start(allocation, count)
    except (spares.SpareError, HostlistError) as exc:
        raise LaunchError(str(exc)) from exc


def _swap_for_lost(
    state: spares.SpareState,
    job_id: str,
    found: Sequence[Outcome],
    wait_s: float,
    job_nodes: Callable[[str], list[str]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[str], spares.Swap | None]:
    """Wait up to ``wait_s`` for Slurm to take a silent training node (no verdict) out of the allocation (nuro's
    detector sets a lost node DOWN; with --no-kill Slurm removes it from the job), then swap it for a spare. Only
    nodes Slurm removed are replaced. Returns the lost nodes and the swap: ([], None) when none was lost (a launcher
    died, not its node), (lost, None) when the spares ran out (the job must be requeued: Slurm will not)."""
    job_nodes = job_nodes or (lambda job: _allocation(job, []))
    reported = {v.node for v in found}
    silent = [n for i, n in enumerate(state.active) if i not in reported]
    deadline = clock() + wait_s
    while True:
        allocation = job_nodes(job_id)  # [] while Slurm does not answer
        # the first node gone is enough (no verdict at all: any node may be it); a second one lost at the same time
        # fails the next step, which swaps again
        lost = [n for n in state.gone(allocation) if n in silent] if allocation else []
        if lost or clock() >= deadline:
            break
        sleep(0.2)
    if not lost:
        print(f"nuro: no node of the job left its allocation in {wait_s:g} s (a launcher died, not its node)",
              flush=True)  # fmt: skip
        return [], None
    return lost, state.replace(lost, allocation)


# --- CLI ---------------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="nuro-launch",
        description="Run torchrun on this node (srun task), or with --step wrap the srun in the batch script.",
        epilog="Exit: 0 done, 75 restart me (requeue), other = the training's failure status. See docs/launch.md.",
    )
    p.add_argument("--step", action="store_true", help="Batch-step mode: run the given srun command and fold.")
    p.add_argument("--nproc-per-node", type=int, default=1, help="Workers on this node (GPUs per node; 1 on CPU).")
    p.add_argument("--python", default=sys.executable, help="Interpreter for the training (default: this one).")
    p.add_argument("--launcher", choices=("torchrun", "direct"), default="torchrun",
                   help="torchrun: under torchrun's agent; direct: nuro-launch starts the workers itself with "
                   "torchrun's variables (no agent: ~2 s less to a restarted job's first step). nuro-train renders "
                   "direct.")  # fmt: skip
    p.add_argument("--local-addr", default=None, help="This node's address (default: its Slurm NodeAddr).")
    p.add_argument("--pg-timeout-s", type=int, default=int(os.environ.get(NURO_PG_TIMEOUT_S) or PG_TIMEOUT_S),
                   help="Collective timeout given to the training (NURO_PG_TIMEOUT_S; default 60).")  # fmt: skip
    p.add_argument("--settle-s", type=float, default=DEFAULT_SETTLE_S,
                   help="Seconds a node that only lost a peer waits for other nodes' verdicts.")  # fmt: skip
    p.add_argument(
        "--verdict-dir", default=None, help="Shared dir for per-node verdicts (default $NURO_JOB_DIR/launch)."
    )
    p.add_argument("script", nargs=argparse.REMAINDER, help="-- script.py [args]  (or, with --step, -- srun ...)")
    args = p.parse_args(argv)
    if args.script and args.script[0] == "--":
        args.script = args.script[1:]
    if not args.script:
        p.error("nothing to run: nuro-launch [options] -- script.py [args]")
    if args.nproc_per_node < 1:
        p.error(f"--nproc-per-node={args.nproc_per_node}: must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point ``nuro-launch``."""
    logging.basicConfig(level=logging.WARNING, format="nuro-launch: %(message)s", stream=sys.stderr)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    try:
        code = run_step(args, env) if args.step else run_node(args, env)
    except LaunchError as exc:
        print(f"nuro-launch: {exc}", file=sys.stderr)
        code = 2
    sys.exit(code)


__all__ = [
    "EXIT_REQUEUE",
    "LaunchError",
    "await_node_loss",
    "TorchrunPlan",
    "descendants",
    "forward",
    "main",
    "node_addr",
    "node_loss_wait_s",
    "plan_torchrun",
    "rdzv_port",
]

if __name__ == "__main__":
    main()

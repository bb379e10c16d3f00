"""``nuro-nodeagent``: one per node; heartbeats to the controller, GPU health, a status file, background workers.

Command line (the dev cluster starts it exactly like this)::

    nuro-nodeagent --node NAME --controller HOST:PORT --key-file PATH [--interval-s 0.25] [--probe-interval-s 1.0]
                   [--status-dir DIR]
                   [--probe auto|nvml|none] [--expect-gpus N] [--env-file PATH] [--log-file PATH]
                   [--staging-root DIR]

Threads, and why each is separate:

* **beat loop** (main work, ``Agent.run``; the beat's content: ``nuro.healthcheck.beats``): every ``interval_s`` it
  sends one heartbeat (``nuro.protocol.heartbeat``: HMAC-signed UDP with this node's own key, ``boot`` = agent start
  in ms, ``seq`` + 1 each beat) with ``healthy``/``problems`` from the latest probe evaluation, and rewrites
  ``<status-dir>/<node>.json`` atomically. UDP on a non-blocking socket: a restarting controller or a full socket
  buffer costs one lost datagram, never a stalled agent.
* **probe loop**: reads the GPUs (bounded, see ``NvmlProbe``), the staging disk, and evaluates the pure checks
  every ``probe_interval_s`` (1 s: a beat is cheap, an NVML read is not, so beats go 4× as often). A hung NVML call
  therefore never delays a heartbeat; if the probe loop itself produces nothing for ``stale_after_s``, the
  heartbeat carries the problem "health probe stale for N s".
* **GPU telemetry** (only when ``NURO_METRICS_URL`` is set in the node env): after each probe the report becomes one
  ``gpu`` point per GPU (``gpu_points``), handed to a ``BufferedWriter`` whose own thread writes to the sink. ``add``
  never blocks, so a slow or dead TSDB costs dropped points (counted in its ``nuro_metrics`` self-report,
  ``source=agent``), never a probe or a heartbeat. With ``--probe none`` (the dev cluster) there are no GPUs and
  nothing is written.
* **report socket** (``nuro.healthcheck.reports``; protocol ``nuro.protocol.peerloss``): a Unix datagram socket a
  job's launcher writes to when a worker saw a peer die. The sender's uid comes from the kernel (``SO_PASSCRED``); a
  report for a job whose root-written record names this node and that user makes the next beat go at once, carrying
  ``suspect_jobs`` for ``SUSPECT_TTL_S``, so the controller judges the job's other nodes on a shorter silence. The
  same socket takes a job's **progress** (``nuro-progress/1``: ``ckpt`` after a commit, ``ack`` after the checkpoint
  a stop signal asked for), accepted on the same terms; the agent also learns every commit its own upload worker
  makes (as root: the job cannot forge those). Both travel in the beats (``commits``: the newest per job still
  running here; ``acks`` for ``ACK_TTL_S``), timed by this agent's clock. Every report is rate-limited per job and
  per sender uid (``peerloss.REPORT_RATE``); a refused one is counted and logged at most once a minute, and reports
  make the agent beat early at most once per ``KICK_EVERY_S`` in all (a flood costs at most one extra beat's work).
* **workers**: objects with ``.run(stop: threading.Event)`` (e.g. the checkpoint ``UploadWorker``), each in its own
  thread; a worker that raises is logged and restarted after ``WORKER_RESTART_S``.

SIGTERM/SIGINT stop everything cleanly (exit 0). Logs: one line per state change (health, send errors), not per beat.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from nuro.console import ExitCode
from nuro.healthcheck.beats import build_heartbeat, gpu_points, next_boot, parse_controller, throttled_gpus
from nuro.healthcheck.checks import evaluate
from nuro.healthcheck.probes import GpuProbe, NodeGpuReport
from nuro.healthcheck.reports import InBandReports
from nuro.healthcheck.run import DEFAULT_PATH, HealthSettings, disk_free_bytes, disk_state, make_probe
from nuro.healthcheck.statusfile import STATUS_FORMAT, write_status
from nuro.metrics.buffer import writer_from_env
from nuro.metrics.model import Point
from nuro.protocol import heartbeat as hb
from nuro.protocol.envnames import NURO_AGENT_SOCKET_DIR, NURO_ENV_FILE
from nuro.protocol.gpujobs import gpu_tags
from nuro.protocol.nodeenv import load_node_env

log = logging.getLogger("nuro.nodeagent")

WORKER_RESTART_S = 5.0
METRICS_CLOSE_S = 2.0


class Worker(Protocol):
    """A background job of the agent; ``run`` returns when ``stop`` is set (and should check it at least every
    second or so, so the agent stops promptly)."""

    def run(self, stop: threading.Event) -> None: ...


class MetricsWriter(Protocol):
    """``nuro.metrics.buffer.BufferedWriter`` as the agent uses it: ``add`` never blocks."""

    def add(self, point: Point) -> bool: ...

    def close(self, timeout_s: float) -> Any: ...


@dataclass
class Health:
    """The probe loop's latest verdict (``at`` = monotonic time it was made)."""

    problems: tuple[str, ...] = ()
    report: NodeGpuReport | None = None
    at: float | None = None


@dataclass
class AgentConfig:
    """Everything the agent needs besides its probe, socket and workers.

    Attributes:
        interval_s: seconds between heartbeats.
        probe_interval_s: seconds between probes.
        stale_after_s: a probe verdict older than this is itself a problem; None = 5 probe intervals + the probe
            timeout.
        status_dir: where ``<node>.json`` goes; None = no status file.
        stop_grace_s: the silence announced in the last beat of a clean stop (0: announce none, so the stop is a
            loss like a crash).
    """

    node: str
    controller: tuple[str, int]
    key: bytes
    interval_s: float = hb.DEFAULT_INTERVAL_S
    probe_interval_s: float = hb.DEFAULT_PROBE_INTERVAL_S
    status_dir: str | None = None
    health: HealthSettings = field(default_factory=HealthSettings)
    probe_timeout_s: float = 5.0
    stale_after_s: float | None = None
    stop_grace_s: float = hb.DEFAULT_STOP_GRACE_S
    socket_dir: str | None = None  # the report socket's dir (NURO_AGENT_SOCKET_DIR); None: status_dir

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"--interval-s must be > 0, got {self.interval_s}")
        if self.probe_interval_s <= 0:
            raise ValueError(f"--probe-interval-s must be > 0, got {self.probe_interval_s}")
        if not 0 <= self.stop_grace_s <= hb.MAX_STOP_GRACE_S:
            raise ValueError(f"--stop-grace-s must be within 0..{hb.MAX_STOP_GRACE_S:.0f}, got {self.stop_grace_s}")
        if self.stale_after_s is None:
            self.stale_after_s = 5 * self.probe_interval_s + self.probe_timeout_s


class Agent(InBandReports):
    """The node agent; see the module docstring. ``run(stop)`` blocks until ``stop`` is set.

    Time comes from ``clock`` (wall, for ``sent`` and the status file) and ``monotonic`` (scheduling, staleness),
    both injectable so the loop can be tested with a fake clock (``beat_once``).
    """

    def __init__(
        self,
        config: AgentConfig,
        probe: GpuProbe,
        *,
        workers: Sequence[Worker] = (),
        sock: socket.socket | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        disk_free: Callable[[str], int] = disk_free_bytes,
        metrics: MetricsWriter | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.probe = probe
        self.workers = list(workers)
        self.clock = clock
        self.monotonic = monotonic
        self.disk_free = disk_free
        self.boot_ms = next_boot(int(clock() * 1000), config.status_dir, config.node)
        self.seq = 0
        self._sock = sock or socket.socket(
            socket.AF_INET6 if ":" in config.controller[0] else socket.AF_INET, socket.SOCK_DGRAM
        )
        self._sock.setblocking(False)
        self._addr: tuple[str, int] | None = None
        self._health = Health()
        self._lock = threading.Lock()
        self._last_state: tuple[bool, tuple[str, ...]] | None = None
        self._send_error: str | None = None
        self._first_probe = threading.Event()
        # The status file is written by its own thread while ``run`` beats (``_status_loop``): a file create and
        # rename can block for seconds when the disk is busy writing checkpoints back, and a beat must never wait
        # on the disk (seen in CI: an agent silent 2.7 s, its node declared lost). Without ``run`` (tests, a
        # one-off beat) ``beat_once`` writes it itself.
        self._status_slot: tuple[hb.Heartbeat, float] | None = None
        self._status_ready = threading.Event()
        self._status_async = False
        self.sent_ok = 0
        self._kick = threading.Event()  # a report came in: beat now, not at the next interval
        self._init_reports()  # the in-band report room's state (nuro.healthcheck.reports)

    def wake(self) -> None:
        """End the beat loop's wait now (a stop: ``run`` notices ``stop`` at once)."""
        self._kick.set()

    # -- probing ---------------------------------------------------------------------------------------------------
    def probe_once(self) -> Health:
        """Read the GPUs and the staging disk, evaluate, store the verdict."""
        settings = self.config.health.for_node(self.config.node)
        report = self.probe.read()
        try:
            free: int | None = self.disk_free(settings.staging_root)
        except OSError:
            free = None
        # a disk that running jobs filled is theirs, not the node's: nuro-healthcheck fails those jobs
        free, usage = disk_state(settings, self.config.node, free, reader=self.disk_free)
        problems = evaluate(
            report,
            settings.expected_gpus,
            free,
            settings.staging_min_free_bytes,
            None,  # the agent is the liveness signal; it does not judge itself
            settings.limits,
            staging_root=settings.staging_root,
            job_disk_use=usage,
        )
        health = Health(tuple(p.message for p in problems), report, self.monotonic())
        with self._lock:
            self._health = health
        self._first_probe.set()
        if self.metrics is not None:
            self._emit_telemetry(report)
        return health

    def _emit_telemetry(self, report: NodeGpuReport) -> None:
        """Queue the report's ``gpu`` points (non-blocking); a telemetry bug is logged, never fatal to probing."""
        try:
            jobs = gpu_tags(Path(self.config.health.for_node(self.config.node).staging_root), self.config.node)
            for point in gpu_points(report, self.config.node, int((report.taken_at or self.clock()) * 1e9), jobs):
                self.metrics.add(point)  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - health reporting matters more than telemetry
            log.exception("gpu telemetry point not queued node=%s", self.config.node)

    def _latest_report(self) -> NodeGpuReport | None:
        with self._lock:
            return self._health.report

    def current_problems(self) -> tuple[str, ...]:
        """The latest verdict's problems, plus "health probe stale" when the probe loop stopped producing."""
        with self._lock:
            health = self._health
        if health.at is None:
            return ()  # nothing probed yet: the first beats report healthy rather than invent a problem
        age = self.monotonic() - health.at
        if age > (self.config.stale_after_s or 0):
            return (*health.problems, f"health probe stale for {age:.0f} s")
        return health.problems

    def _probe_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = self.monotonic()
            try:
                self.probe_once()
            except Exception:  # a probe bug must not end health reporting; the staleness check shows it
                log.exception("probe failed; retrying next interval")
            stop.wait(max(0.0, self.config.probe_interval_s - (self.monotonic() - started)))

    # -- beating ---------------------------------------------------------------------------------------------------
    def _resolve(self) -> tuple[str, int] | None:
        if self._addr is None:
            host, port = self.config.controller
            try:
                info = socket.getaddrinfo(host, port, self._sock.family, socket.SOCK_DGRAM)
                self._addr = info[0][4][:2]
            except OSError as exc:
                self._note_send_error(f"cannot resolve {host}: {exc}")
        return self._addr

    def _note_send_error(self, error: str | None) -> None:
        if error != self._send_error:
            if error:
                log.warning("heartbeat send failing node=%s error=%s", self.config.node, error)
            else:
                log.info("heartbeat send recovered node=%s", self.config.node)
            self._send_error = error

    def beat_once(self, stopping_s: float = 0.0) -> hb.Heartbeat:
        """Send one heartbeat and write the status file; never blocks, never raises for network errors."""
        self.seq += 1
        now = self.clock()
        problems = self.current_problems()
        commits, acks = self._fresh_progress()
        beat, data = build_heartbeat(self.config.node, self.boot_ms, self.seq, now, problems, self.config.key,
                                     stopping_s, self._suspect_jobs(), throttled_gpus(self._latest_report()),
                                     self._fresh_stragglers(), commits, acks)  # fmt: skip
        addr = self._resolve()
        if addr is not None:
            try:
                self._sock.sendto(data, addr)
                self.sent_ok += 1
                self._note_send_error(None)
            except OSError as exc:  # EAGAIN (buffer full), ECONNREFUSED, ENETUNREACH: one lost beat
                self._note_send_error(f"{type(exc).__name__}: {exc}")
        state = (beat.healthy, tuple(problems))
        if state != self._last_state:
            if beat.healthy:
                log.info("node=%s healthy", self.config.node)
            else:
                log.warning("node=%s unhealthy problems=%s", self.config.node, "; ".join(problems))
            self._last_state = state
        if self.config.status_dir:
            if self._status_async:
                self._status_slot = (beat, now)  # the newest wins: the writer only ever needs the latest
                self._status_ready.set()
            else:
                self._write_status(beat, now)
        return beat

    def _status_loop(self, stop: threading.Event) -> None:
        """Write the newest beat's status file whenever there is one, until ``stop`` (then the pending one)."""
        written = None
        while True:
            self._status_ready.wait(0.5)
            self._status_ready.clear()
            slot = self._status_slot
            if slot is not None and slot is not written:
                self._write_status(*slot)
                written = slot
            if stop.is_set() and not self._status_ready.is_set():
                return

    def _write_status(self, beat: hb.Heartbeat, now: float) -> None:
        with self._lock:
            report = self._health.report
        status = {
            "v": STATUS_FORMAT,
            "node": beat.node,
            "pid": os.getpid(),
            "boot": beat.boot,
            "seq": beat.seq,
            "last_beat": now,
            "healthy": beat.healthy,
            "problems": list(beat.problems),
            "send_error": self._send_error,
            "gpu_report": report.to_dict() if report else None,  # telemetry for a later metrics sink
        }
        try:
            write_status(self.config.status_dir, beat.node, status)  # type: ignore[arg-type]
        except OSError as exc:
            log.warning("status file not written dir=%s error=%s", self.config.status_dir, exc)

    # -- running ---------------------------------------------------------------------------------------------------
    def _run_worker(self, worker: Worker, stop: threading.Event) -> None:
        name = type(worker).__name__
        while not stop.is_set():
            try:
                worker.run(stop)
            except Exception:
                log.exception("worker %s failed; restarting in %.0f s", name, WORKER_RESTART_S)
            else:
                if not stop.is_set():
                    log.warning("worker %s returned early; restarting in %.0f s", name, WORKER_RESTART_S)
            stop.wait(WORKER_RESTART_S)

    def run(self, stop: threading.Event) -> None:
        """Beat every ``interval_s`` until ``stop`` is set; then join the probe and worker threads (briefly)."""
        threads = [threading.Thread(target=self._probe_loop, args=(stop,), name="probe", daemon=True)]
        status = threading.Thread(target=self._status_loop, args=(stop,), name="status", daemon=True)
        if self.config.status_dir:
            self._status_async = True
            status.start()
        threads += [
            threading.Thread(target=self._run_worker, args=(w, stop), name=f"worker-{type(w).__name__}", daemon=True)
            for w in self.workers
        ]
        reports = self._open_report_socket()
        if reports is not None:
            threads.append(
                threading.Thread(target=self._report_loop, args=(reports, stop), name="reports", daemon=True)
            )
        for t in threads:
            t.start()
        # The first beat waits (at most one probe interval) for the first verdict, so it carries real health.
        self._first_probe.wait(self.config.probe_interval_s)
        log.info(
            "agent started node=%s controller=%s:%d interval_s=%g boot=%d workers=%s",
            self.config.node,
            *self.config.controller,
            self.config.interval_s,
            self.boot_ms,
            ",".join(type(w).__name__ for w in self.workers) or "-",
        )
        next_at = self.monotonic()
        while not stop.is_set():
            self.beat_once()
            next_at += self.config.interval_s
            delay = next_at - self.monotonic()
            if delay < 0:  # fell behind (suspended, overloaded): do not burst to catch up
                next_at = self.monotonic()
                delay = 0
            if self._kick.wait(delay):  # a peer-loss report: beat at once (a stop kicks too)
                self._kick.clear()
                next_at = self.monotonic()
        if self._status_async:
            status.join(timeout=2.0)  # it writes what is pending, then the last beat below writes its own
            self._status_async = False
        if self.config.stop_grace_s > 0:
            # a clean stop (SIGTERM: systemctl stop/restart, an upgrade) says so, so the controller does not take
            # the node for dead while the agent is away; a crash sends nothing and is a loss
            self.beat_once(stopping_s=self.config.stop_grace_s)  # within the cap: AgentConfig checks it
        for t in threads:
            t.join(timeout=2.0)  # a hung NVML call cannot be joined; its thread is a daemon
        if self.metrics is not None:
            try:
                self.metrics.close(METRICS_CLOSE_S)  # bounded: a dead TSDB must not hold up the agent's exit
            except Exception:  # noqa: BLE001
                log.exception("metrics writer close failed")
        self.probe.close()
        self._sock.close()
        if reports is not None:
            reports.close()
        log.info("agent stopped node=%s beats=%d", self.config.node, self.seq)


# -- command line ---------------------------------------------------------------------------------------------------
def _upload_workers(staging_root: str) -> list[Worker]:
    """The checkpoint upload worker for ``--staging-root`` (it also finishes the epilog's hand-offs,
    ``nuro.checkpoint.handoff``), when that module exists in this install."""
    try:
        # lazy: an install may lack the upload worker or boto3 (the agent then runs without uploads), and boto3
        # costs ~0.3 s that an agent without --staging-root never needs
        from nuro.healthcheck.uploads import node_handoff_worker
        from nuro.objectstore import ObjectStore
    except ImportError as exc:
        log.warning(
            "--staging-root %s given but the checkpoint upload worker is not importable (%s): "
            "no checkpoint uploads from this agent",
            staging_root,
            exc,
        )
        return []
    return [node_handoff_worker(ObjectStore.from_env(), Path(staging_root), os.environ)]


def _metrics_writer(node: str) -> MetricsWriter | None:
    """The agent's ``gpu`` points' writer (``buffer.writer_from_env``): None when the node env names no sink or it
    cannot be opened; the agent's real job (heartbeats) goes on either way."""
    writer = writer_from_env({"source": "agent", "node": node}, "gpu telemetry")
    if writer is not None:
        log.info("gpu telemetry on node=%s sink=%s", node, getattr(writer.sink, "name", "?"))
    return writer


#: The node env's heartbeat interval (Ansible renders it from the same variable as the controller's).
ENV_INTERVAL = "NURO_HEARTBEAT_INTERVAL_S"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nuro-nodeagent", description="nuro node agent: heartbeats, GPU health, workers")
    p.add_argument("--node", required=True, help="this node's Slurm name")
    p.add_argument("--controller", required=True, help="HOST:PORT of the controller's heartbeat UDP socket")
    p.add_argument("--key-file", required=True, help="this node's own heartbeat key (mode 600)")
    p.add_argument(
        "--interval-s",
        type=float,
        help=f"seconds between heartbeats (default $NURO_HEARTBEAT_INTERVAL_S or {hb.DEFAULT_INTERVAL_S}; the "
        "controller's heartbeat_interval_s must be the same)",
    )
    p.add_argument(
        "--probe-interval-s", type=float, default=hb.DEFAULT_PROBE_INTERVAL_S, help="seconds between GPU probes"
    )
    p.add_argument("--status-dir", help="write <dir>/<node>.json each beat (default $NURO_AGENT_STATUS_DIR)")
    p.add_argument("--probe", choices=("auto", "nvml", "none"), help="GPU probe (default $NURO_HEALTH_PROBE or auto)")
    p.add_argument("--expect-gpus", type=int, help="GPUs this node must have (default $NURO_EXPECT_GPUS)")
    p.add_argument("--env-file", help="node settings file (KEY=VALUE), like $NURO_ENV_FILE")
    p.add_argument("--log-file", help="append logs here instead of stderr")
    p.add_argument("--staging-root", help="run the checkpoint upload worker over this staging dir")
    p.add_argument("--probe-timeout-s", type=float, default=5.0)
    p.add_argument(
        "--stop-grace-s", type=float, default=hb.DEFAULT_STOP_GRACE_S,
        help="silence the last beat of a clean stop announces, so a restart is no node loss (0: none; at most "
        f"{hb.MAX_STOP_GRACE_S:.0f})",
    )  # fmt: skip
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler: logging.Handler = logging.FileHandler(args.log_file) if args.log_file else logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s nuro-nodeagent %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    try:
        if args.env_file:
            os.environ[NURO_ENV_FILE] = args.env_file
        load_node_env()
        os.environ.setdefault("PATH", DEFAULT_PATH)
        settings = HealthSettings.from_env()
        if args.probe:
            settings = replace(settings, probe=args.probe)
        if args.expect_gpus is not None:
            settings = replace(settings, expected_gpus=args.expect_gpus)
        if args.staging_root:
            settings = replace(settings, staging_root=args.staging_root)
        config = AgentConfig(
            node=args.node,
            controller=parse_controller(args.controller),
            key=hb.load_key(args.key_file),
            interval_s=args.interval_s or float(os.environ.get(ENV_INTERVAL) or hb.DEFAULT_INTERVAL_S),
            probe_interval_s=args.probe_interval_s,
            status_dir=args.status_dir or settings.agent_status_dir,
            health=settings,
            probe_timeout_s=args.probe_timeout_s,
            stop_grace_s=args.stop_grace_s,
            socket_dir=os.environ.get(NURO_AGENT_SOCKET_DIR) or None,
        )
        hb.Heartbeat(config.node, 0, 0, 0.0)  # validates the node name now, not at the first beat
        probe = make_probe(settings.probe, timeout_s=args.probe_timeout_s)
    except (OSError, ValueError) as exc:  # BadHeartbeat is a ValueError
        log.error("cannot start: %s", exc)
        return ExitCode.USAGE
    if config.status_dir:
        Path(config.status_dir).mkdir(parents=True, exist_ok=True)
    workers = _upload_workers(args.staging_root) if args.staging_root else []
    stop = threading.Event()

    # --probe none (the dev cluster): no GPUs, so no telemetry and no sink connection to hold open.
    metrics = _metrics_writer(config.node) if settings.probe != "none" else None
    agent = Agent(config, probe, workers=workers, metrics=metrics)
    for worker in workers:  # root's own commits reach the controller in the beats (``Agent.note_commit``)
        if hasattr(worker, "on_commit") and worker.on_commit is None:
            worker.on_commit = agent.on_upload_commit

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %s: stopping", signal.Signals(signum).name)
        stop.set()
        agent.wake()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.run(stop)
    return ExitCode.OK


__all__ = ["Agent", "AgentConfig", "Health", "Worker", "main"]

if __name__ == "__main__":
    sys.exit(main())

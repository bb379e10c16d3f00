"""``nuro-controller``: the foreground daemon that adds borrowing, reclaim, fair-share priority and second-scale
failure detection to Slurm.

Each cycle (K1): 1 snapshot (one adapter read), 2 decide (pure, ``engine.decide``), 3 apply (``apply.py``),
4 remember (soft state). The one fact only the controller knows, which victims it signalled and when, is kept in its
ledger (``ledger.py``, in ``state_dir``), written before the signals go: a restart loses no in-flight preemption.
Jobs' progress (commits, acks) comes from the node agents' beats (``progress.py``). With the controller stopped
Slurm keeps scheduling and the hard quotas (QOS GrpTRES) still hold; only borrowing, reclaim and fair-share nudges
pause.

    nuro-controller --config /etc/nuro/controller.yaml
    nuro-controller --policy teams.yaml --interval-s 1 [--dry-run] [--once] [--log-format json]
    nuro-controller --heartbeat-port P --heartbeat-key F [--event-log F] [--policy teams.yaml]

Two independent loops: the policy cycle (above; only with a policy) and the failure detector (``detection.py``;
only with a heartbeat port), each in its own thread with its own exception handling, so a slow or failing policy
cycle never delays or stops detection; the main thread only waits for a signal.

No input stops a loop: a job (or node) whose record makes the policy code raise is quarantined by
``isolation.Isolator`` (only that job is skipped, logged once), an apply that raises costs only its decision, and a
cycle that fails as a whole is logged (rate-limited) and retried next interval.

Clocks: durations and silence are measured on ``time.monotonic``; the wall clock (``wall_clock``: the system clock
plus the offset in ``$NURO_CONTROLLER_CLOCK_OFFSET_FILE`` when that test hook is set, as the dev cluster does) is
used for what Slurm and the event log hold (preempt marks, grace ends, reasons, records).

Keys: ``master_key(cfg)`` is the controller's master heartbeat key (bytes); node keys are derived from it
(``nuro.protocol.heartbeat.node_key``), as may other controller-only secrets
(``nuro.protocol.heartbeat.derive_key(master, purpose)``).

Signals: SIGTERM/SIGINT finish the current cycle and exit 0; SIGHUP re-reads the policy (kept if invalid).
Exit codes: 0 stopped cleanly, 2 usage error, 3 invalid config or policy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import click

from nuro.lifecycle.platform_events import EventLog
from nuro.metrics.base import ENV_URL
from nuro.metrics.buffer import writer_from_env
from nuro.policy import Policy, PolicyError, load_policy
from nuro.protocol.heartbeat import BadHeartbeat, load_key
from nuro.runs.pending import ENV_WAITS, WaitsFile
from nuro.slurm import Action, Backend, CliBackend, SlurmError, hostlist
from nuro.slurm.cli_runner import in_daemon_thread
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo
from nuro.slurm.states import JobPhase
from nuro.slurm_plugins.controller import gangfirst, weights
from nuro.slurm_plugins.controller.apply import ApplyBudget, Outcome, apply_within_budget
from nuro.slurm_plugins.controller.config import ConfigError, ControllerConfig, LogFormat, load_config
from nuro.slurm_plugins.controller.decisions import Decisions, Preempt, Requeue, SetSiteFactor
from nuro.slurm_plugins.controller.detection import FailureDetector
from nuro.slurm_plugins.controller.engine import ControllerState, decide, rebuild_state
from nuro.slurm_plugins.controller.heartbeats import HeartbeatReceiver
from nuro.slurm_plugins.controller.isolation import Isolator
from nuro.slurm_plugins.controller.ledger import Ledger
from nuro.slurm_plugins.controller.liveness import LivenessConfig
from nuro.slurm_plugins.controller.progress import EMPTY as NO_PROGRESS
from nuro.slurm_plugins.controller.progress import Progress, ProgressBook, ProgressFile
from nuro.slurm_plugins.controller.ratelog import RateLog, once
from nuro.slurm_plugins.controller.slurm_metrics import SlurmMetricsLoop

log = logging.getLogger("nuro.controller")

CLOCK_OFFSET_ENV = "NURO_CONTROLLER_CLOCK_OFFSET_FILE"


class OffsetClock:
    """The wall clock plus an offset read from a file (a test hook: a clock step without touching the machine's
    clock). The file holds seconds as text; it is re-read at most every ``every_s`` (monotonic), at most 64 bytes;
    a missing or unreadable file means offset 0."""

    def __init__(self, path: str | Path, every_s: float = 0.5) -> None:
        self.path = Path(path)
        self.every_s = every_s
        self.offset = 0.0
        self._read_at = float("-inf")

    def __call__(self) -> float:
        mono = time.monotonic()
        if mono - self._read_at >= self.every_s:
            self._read_at = mono
            try:
                with open(self.path, "rb") as fh:
                    self.offset = float(fh.read(64).decode("ascii", "replace").strip() or 0)
            except (OSError, ValueError):
                self.offset = 0.0
        return time.time() + self.offset


def wall_clock_from_env(environ: dict[str, str] | None = None) -> Callable[[], float]:
    """``time.time``, or an ``OffsetClock`` when ``$NURO_CONTROLLER_CLOCK_OFFSET_FILE`` is set."""
    path = (os.environ if environ is None else environ).get(CLOCK_OFFSET_ENV)
    return OffsetClock(path) if path else time.time


def master_key(cfg: ControllerConfig) -> bytes | None:
    """The controller's master heartbeat key (bytes), or None without a detector. Node keys are derived from it
    (``nuro.protocol.heartbeat.node_key``); another controller-only secret takes
    ``nuro.protocol.heartbeat.derive_key(master, p)``."""
    return load_key(cfg.heartbeat_key_file) if cfg.detector_on and cfg.heartbeat_key_file else None


@dataclass
class CycleReport:
    cycle: int
    snapshot_s: float = 0.0
    decide_s: float = 0.0
    apply_s: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    error: str = ""
    deferred: int = 0  # decisions not sent this cycle: the apply budget was spent (decided again next cycle)
    weights: int = 0  # nodes whose packing weight was set this cycle (``weights.py``)

    @property
    def slurm_s(self) -> float:
        """The cycle's time waiting on Slurm (its reads and its updates): what ``apply_budget_s`` bounds."""
        return self.snapshot_s + self.apply_s


class Controller:
    """One controller: a backend, a policy, soft state. ``cycle()`` is one pass; ``run()`` loops."""

    def __init__(
        self,
        backend: Backend,
        policy: Policy,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
        events: EventLog | None = None,
        apply_budget_s: float | None = None,
        ledger: Ledger | None = None,
        progress: Callable[[], Mapping[int, Progress]] | None = None,
        node_weights: bool = False,
    ) -> None:
        self.backend = backend
        #: set each GPU node's Weight to pack jobs (``weights.py``) after the cycle's decisions
        self.node_weights = node_weights
        #: where in-flight preemptions survive a restart (None: memory only; Slurm's GraceTime is the backstop)
        self.ledger = ledger
        self._for_job: dict[int, int | None] = {}  # victim -> the job it was preempted for (kept in the ledger)
        #: what the node agents reported per job (a ProgressBook's or a ProgressFile's ``view``)
        self.progress = progress or (lambda: NO_PROGRESS)
        self.policy = policy
        self.dry_run = dry_run
        self.clock = clock
        self.events = events
        self.apply_budget_s = apply_budget_s
        self._per_id_s = 0.002  # one job's update, measured and kept across cycles (ApplyBudget)
        self.state: ControllerState | None = None
        self.cycles = 0
        self.isolator = Isolator()
        #: where each cycle's reasons for pending jobs go (``nuro.runs.pending``); None: nowhere
        waits = os.environ.get(ENV_WAITS)
        self.waits_file = WaitsFile(Path(waits)) if waits else None
        self._once = once()  # per-job apply errors: logged when they first appear (or change)
        #: the gang-first floors set on the teams' guaranteed QOS (``gangfirst``); None: not known (a start)
        self._floors: dict[str, int] | None = None
        self._cycle_errors = RateLog(60.0, 64)

    def _held_site_factors(self) -> dict[int, int]:
        """The SiteFactors slurmctld holds now (one ``sprio``); {} when they cannot be read (then set again)."""
        try:
            return self.backend.site_factors()
        except SlurmError as exc:
            log.warning("cycle=%d site factors not read, set again: %s", self.cycles, exc)
            return {}

    def _recovered_state(self, snapshot: ClusterSnapshot, held: dict[int, int]) -> ControllerState:
        """The soft state a (re)started controller starts from: in-flight preemptions from its ledger, and
        the SiteFactors slurmctld already holds for pending jobs (``held``), so the first cycle after a restart
        sends only the values that changed instead of one per job at every team's queue head."""
        entries = self.ledger.load() if self.ledger is not None else {}
        self._for_job = {j: f for j, (_, f) in entries.items()}
        state = rebuild_state(snapshot, {j: at for j, (at, _) in entries.items()})
        if state.preempting:
            log.info("cycle=%d in-flight preemptions from the ledger: %s", self.cycles, dict(state.preempting))
        pending = {j.job_id for j in snapshot.jobs if j.phase == JobPhase.PENDING}
        known = {job_id: value for job_id, value in held.items() if job_id in pending and value}
        if known:
            log.info("cycle=%d %d pending jobs' site factors read from Slurm", self.cycles, len(known))
        return replace(state, site_factors=MappingProxyType(dict(sorted(known.items()))))

    def cycle(self) -> CycleReport:
        """One pass, in numbered phases: (1) snapshot (with the SiteFactors Slurm holds, after a start); (2) decide
        (pure, ``engine.decide``; a job that breaks it is isolated); (3) publish why each pending job waits;
        (4) ledger the victims about to be signalled; (5) apply within the cycle's Slurm budget (``apply.py``: the
        decisions, the packing weights after the requeues and signals, the gang-first floors last); (6) remember
        the state the applied decisions leave. A snapshot or decide that fails skips the cycle (Slurm's own limits
        hold meanwhile)."""
        self.cycles += 1
        report = CycleReport(cycle=self.cycles)
        t0 = time.monotonic()
        # a (re)started controller's sprio read goes side by side with the snapshot: both count in the cycle's budget
        held = in_daemon_thread(self._held_site_factors) if self.state is None else None
        try:
            snapshot = self.backend.read_snapshot()
        except SlurmError as exc:
            # Fail operational: Slurm's own limits hold; we simply skip this cycle.
            report.error = f"snapshot failed, cycle skipped: {exc}"
            log.warning("cycle=%d %s", self.cycles, report.error)
            return report
        if held is not None:
            self.state = self._recovered_state(snapshot, held.result())
        report.snapshot_s = time.monotonic() - t0
        now = self.clock()
        t1 = time.monotonic()
        state = self.state
        progress = self.progress()
        result, new, released, error = self.isolator.run(
            snapshot, lambda snap: decide(snap, self.policy, state, now, progress)
        )
        for skipped in new:
            log.error("cycle=%d %s (logged once)", self.cycles, skipped.describe())
        for skipped in released:
            what = f"job={skipped.job_id}" if skipped.job_id is not None else f"node={skipped.node}"
            log.info("cycle=%d %s: its record changed or it left Slurm, judged again", self.cycles, what)
        report.decide_s = time.monotonic() - t1
        if result is None:
            report.error = f"decide failed, cycle skipped: {error}"
            if self._cycle_errors.allow(error)[0]:
                log.error("cycle=%d %s (logged once a minute)", self.cycles, report.error)
            return report
        decisions = result
        self._publish_waits(snapshot, decisions, progress, now)  # (3)
        t2 = time.monotonic()
        applicable = self.isolator.filter(decisions)
        # the victims about to be signalled are in the ledger before any signal goes (a crash in between must not
        # leave a signalled victim the restarted controller knows nothing of)
        self._for_job.update((d.job_id, d.for_job_id) for d in applicable if isinstance(d, Preempt))
        self._save_ledger(decisions.next_state)
        budget = ApplyBudget.for_cycle(self.apply_budget_s, report.snapshot_s, self._per_id_s)

        def weigh() -> None:
            if self.node_weights:
                report.weights = self.reweigh(snapshot.nodes, budget)

        applied = apply_within_budget(self.backend, applicable, budget, now, dry_run=self.dry_run, cycle=self.cycles,
                                      after_always=weigh, errors=self._once)  # fmt: skip
        report.outcomes, report.deferred, report.error = applied.outcomes, applied.deferred, applied.error
        failed = applied.failed
        for outcome in applied.outcomes:
            if outcome.applied:
                self._record(outcome.decision)
        if not report.error:
            self.refloor(snapshot.jobs, budget)
        self._per_id_s = budget.per_id_s  # the next cycle sizes its first batch by what Slurm answered lately
        if report.deferred:
            log.info("cycle=%d deferred=%d decisions to the next cycle: the cycle's Slurm budget (%.2f s, "
                     "snapshot %.2f s) is spent", self.cycles, report.deferred, self.apply_budget_s,
                     report.snapshot_s)  # fmt: skip
        failed.update(d.job_id for d in decisions if d.job_id in self.isolator.jobs)
        self.state = _state_after(decisions.next_state, decisions, failed)
        self._save_ledger(self.state)
        report.apply_s = time.monotonic() - t2
        log.debug(
            "cycle=%d snapshot_s=%.3f decide_s=%.3f apply_s=%.3f jobs=%d decisions=%d %s",
            self.cycles, report.snapshot_s, report.decide_s, report.apply_s, len(snapshot.jobs), len(decisions),
            decisions.cycle_stats.log_fields(),
        )  # fmt: skip
        return report

    def _publish_waits(
        self, snapshot: ClusterSnapshot, decisions: Decisions, progress: Mapping[int, Progress], now: float
    ) -> None:
        """Why each pending job waits, and the commits heard, for ``nuro-train status`` (best effort: a reader
        without the file shows Slurm's reason only)."""
        if self.waits_file is None:
            return
        try:
            running = {j.job_id for j in snapshot.jobs if j.phase == JobPhase.RUNNING}
            heard = {j: (p.commit_step, p.commit_at) for j, p in progress.items() if j in running}
            self.waits_file.publish(now, decisions.waiting, heard)
        except OSError as exc:
            if self._cycle_errors.allow(f"waits: {exc}")[0]:
                log.warning("cycle=%d reasons not written to %s: %s", self.cycles, self.waits_file.path, exc)

    def reweigh(
        self, nodes: Iterable[NodeInfo], budget: ApplyBudget | None = None,
        target: Callable[[NodeInfo], int | None] = weights.packing_weight,
    ) -> int:  # fmt: skip
        """Set the packing weights that differ (``weights.plan``; ``target``: another rule, e.g. the neutral one at a
        stop) within what is left of ``budget``; returns how many nodes were set. A refused or cut update is planned
        again next cycle from the weights Slurm reports."""
        done = 0
        for update in weights.plan(nodes, target).updates:
            if self.dry_run:
                log.info("cycle=%d dry run: would set weight=%d on %s", self.cycles, update.weight, update.node)
                continue
            if budget is not None and not budget.has_room():
                break
            error = self._apply_budgeted(update, budget)
            if not error:
                done += len(hostlist.expand(update.node))
            elif self._cycle_errors.allow(f"weights: {error}")[0]:
                log.warning("cycle=%d weight=%d not set on %s: %s", self.cycles, update.weight, update.node, error)
        return done

    def refloor(self, jobs: Iterable[JobInfo], budget: ApplyBudget | None = None, clear: bool = False) -> int:
        """Set or clear the gang-first floors of the ``gang_first`` teams' guaranteed QOS (``gangfirst.plan``;
        ``clear``: every floor, as a clean stop does); returns how many QOS were updated. Floors not known to be
        set (a start, or a refused update) are planned afresh for every opted-in team next time."""
        if not any(t.gang_first for t in self.policy.teams):
            return 0
        jobs = [] if clear else list(jobs)
        pending = [j for j in jobs if j.phase == JobPhase.PENDING]
        running = [j for j in jobs if j.phase == JobPhase.RUNNING]
        wanted = gangfirst.holds(self.policy, pending, running, self.clock())
        plan = gangfirst.plan(self.policy, wanted, self._floors)
        done, complete = 0, True
        for update in plan.updates:
            if self.dry_run:
                log.info("cycle=%d dry run: would set %s's gang-first floor to %s GPUs", self.cycles, update.qos,
                         update.gpus)  # fmt: skip
                continue
            if budget is not None and not budget.has_room():
                complete = False
                break
            error = self._apply_budgeted(update, budget)
            if not error:
                done += 1
                log.info("cycle=%d gang-first floor of %s: %s", self.cycles, update.qos,
                         f"{update.gpus} GPUs" if update.gpus else "cleared")  # fmt: skip
            else:
                complete = False
                if self._cycle_errors.allow(f"floors: {error}")[0]:
                    log.warning("cycle=%d gang-first floor of %s not set: %s", self.cycles, update.qos, error)
        self._floors = plan.floors if complete and not self.dry_run else None
        return done

    def _apply_budgeted(self, action: Action, budget: ApplyBudget | None) -> str:
        """Apply one update outside the decision groups within ``budget``'s per-call limit; "" or the error."""
        limit = budget.deferrable_limit_s() if budget is not None else None
        t = time.monotonic()
        try:
            with contextlib.nullcontext() if limit is None else self.backend.call_timeout(limit):
                result = self.backend.apply(action)
            error = "" if result.ok else result.message
        except SlurmError as exc:
            error = str(exc)
        if budget is not None:
            budget.spend(time.monotonic() - t, 0)
        return error

    def _save_ledger(self, state: ControllerState) -> None:
        """Write the in-flight preemptions to the ledger when they changed (dry runs write nothing)."""
        if self.ledger is None or self.dry_run:
            return
        self._for_job = {j: f for j, f in self._for_job.items() if j in state.preempting}
        try:
            self.ledger.save(state.preempting, self._for_job)
        except OSError as exc:
            if self._cycle_errors.allow(f"ledger: {exc}")[0]:
                log.error("cycle=%d preemption ledger not written to %s (a restart would forget the preemptions in "
                          "flight; their GraceTime still holds): %s", self.cycles, self.ledger.path, exc)  # fmt: skip

    def _record(self, decision: object) -> None:
        """Preemptions go to the event log (``nuro-train events`` shows them in the victim's timeline)."""
        if self.events is None or self.dry_run or not isinstance(decision, Preempt | Requeue):
            return
        if isinstance(decision, Preempt):
            kind, fields = "job_preempt_signalled", {"for_job": decision.for_job_id, "gpus": decision.gpus}
        else:
            kind, fields = "job_preempt_requeued", {"acked": decision.acked}
        try:
            self.events.append(kind, jobs=[decision.job_id], reason=decision.reason, **fields)
        except Exception as exc:  # noqa: BLE001 - the journal never stops a cycle half-applied
            log.warning("event log: %s not recorded: %s", kind, exc)

    def reload_policy(self, path: Path) -> None:
        try:
            self.policy = load_policy(path)
            log.info("policy reloaded from %s", path)
        except PolicyError as exc:
            log.error("policy reload refused, keeping the previous one: %s", exc)

    def run(
        self, interval_s: float, stop: threading.Event, on_cycle: Callable[[CycleReport], None] | None = None
    ) -> None:
        """Loop until ``stop``; a cycle that raises is logged (once a minute per error) and the loop goes on."""
        while not stop.is_set():
            started = time.monotonic()
            try:
                report = self.cycle()
                if on_cycle:
                    on_cycle(report)
            except Exception as exc:  # noqa: BLE001 - the policy loop outlives any one cycle's bug
                if self._cycle_errors.allow(f"{type(exc).__name__}: {exc}")[0]:
                    log.exception("cycle=%d failed; continuing (logged once a minute)", self.cycles)
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))


def _state_after(next_state: ControllerState, decisions: tuple, failed: set[int]) -> ControllerState:
    """The engine's next state, minus what did not happen: a victim we failed to signal is not in flight, and a
    SiteFactor Slurm refused is not set (both are decided again next cycle)."""
    not_signalled = {d.job_id for d in decisions if isinstance(d, Preempt) and d.job_id in failed}
    not_set = {d.job_id for d in decisions if isinstance(d, SetSiteFactor) and d.job_id in failed}
    if not not_signalled and not not_set:
        return next_state
    return replace(
        next_state,
        preempting={k: v for k, v in next_state.preempting.items() if k not in not_signalled},
        site_factors={k: v for k, v in next_state.site_factors.items() if k not in not_set},
    )


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(
            {
                "ts": round(record.created, 3),
                "level": record.levelname,
                "logger": record.name,
                "msg": record.getMessage(),
            }
        )


def _setup_logging(fmt: LogFormat, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt is LogFormat.JSON
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


@click.command()
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), help="Controller YAML config."
)
@click.option(
    "--policy", "policy_path", type=click.Path(dir_okay=False, path_type=Path), help="teams.yaml (overrides config)."
)
@click.option("--interval-s", type=click.FloatRange(min=0.05, max=60), default=None, help="Seconds per cycle [1].")
@click.option("--dry-run", is_flag=True, help="Decide and log; change nothing in Slurm.")
@click.option("--once", is_flag=True, help="Run one cycle, print its decisions as JSON, exit.")
@click.option("--log-format", type=click.Choice([f.value for f in LogFormat]), default=None)
@click.option("--heartbeat-port", type=click.IntRange(1, 65535), default=None, help="UDP port for node heartbeats.")
@click.option("--heartbeat-bind", default=None, help="Listen address for heartbeats [127.0.0.1].")
@click.option(
    "--heartbeat-key", "heartbeat_key_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
    help="Shared HMAC key file (mode 600).",
)  # fmt: skip
@click.option(
    "--heartbeat-interval-s", type=click.FloatRange(min=0.05, max=60), default=None, help="Agents' interval [0.25]."
)
@click.option("--miss-limit", type=click.IntRange(2, 100), default=None, help="Silent intervals before lost [4].")
@click.option("--event-log", type=click.Path(dir_okay=False, path_type=Path), default=None, help="JSONL event log.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Root-only dir for the preemption ledger and the agents' progress [none: memory only].",
)
@click.option(
    "--slurm-metrics-url",
    default=None,
    help="slurmctld's http://host:port (25.11+, MetricsType=metrics/openmetrics): its counts and scheduler "
    "statistics go to $NURO_METRICS_URL as `slurmctld` points.",
)
@click.option(
    "--node-weights/--no-node-weights", default=None,
    help="Set each GPU node's Weight to 1 + its free GPUs every cycle, so jobs pack [on].",
)  # fmt: skip
@click.option("-v", "--verbose", is_flag=True)
def main(
    config_path: Path | None,
    policy_path: Path | None,
    interval_s: float | None,
    dry_run: bool,
    once: bool,
    log_format: str | None,
    heartbeat_port: int | None,
    heartbeat_bind: str | None,
    heartbeat_key_file: Path | None,
    heartbeat_interval_s: float | None,
    miss_limit: int | None,
    event_log: Path | None,
    state_dir: Path | None,
    slurm_metrics_url: str | None,
    node_weights: bool | None,
    verbose: bool,
) -> None:
    """Borrowing with lending limits, checkpoint-confirmed reclaim and urgent preemption, fair-share priority, and
    the heartbeat failure detector."""
    try:
        flags = {
            "policy": policy_path, "interval_s": interval_s, "log_format": log_format,
            "heartbeat_port": heartbeat_port, "heartbeat_bind": heartbeat_bind,
            "heartbeat_key_file": heartbeat_key_file, "heartbeat_interval_s": heartbeat_interval_s,
            "miss_limit": miss_limit, "event_log": event_log, "slurm_metrics_url": slurm_metrics_url,
            "state_dir": state_dir, "node_weights": node_weights,
        }  # fmt: skip
        updates = {k: v for k, v in flags.items() if v is not None}
        if dry_run:
            updates["dry_run"] = True
        if config_path:
            base = load_config(config_path).model_dump()
        elif policy_path or heartbeat_port:
            base = {}
        else:
            raise click.UsageError("give --config FILE, --policy teams.yaml, or --heartbeat-port P --heartbeat-key F")
        cfg = ControllerConfig.model_validate({**base, **updates})
        policy = load_policy(cfg.policy) if cfg.policy else None
        key = master_key(cfg)
    except (ConfigError, PolicyError, BadHeartbeat, ValueError) as exc:
        click.echo(f"nuro-controller: {exc}", err=True)
        sys.exit(3)
    _setup_logging(cfg.log_format, verbose)
    if once:
        if policy is None:
            click.echo("nuro-controller: --once runs one policy cycle: give --policy", err=True)
            sys.exit(2)
        _run_once(Controller(_backend(cfg), policy, cfg.dry_run, clock=wall_clock_from_env(),
                             node_weights=cfg.node_weights))  # fmt: skip
    stop = threading.Event()
    wall = wall_clock_from_env()

    def on_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after this cycle", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    detector_thread = None
    book: ProgressBook | None = None
    if key is not None and cfg.heartbeat_port is not None:
        book = ProgressBook()
        try:
            receiver = HeartbeatReceiver(cfg.heartbeat_bind, cfg.heartbeat_port, key, clock=wall, progress=book).start()
        except OSError as exc:
            click.echo(
                f"nuro-controller: cannot listen on udp {cfg.heartbeat_bind}:{cfg.heartbeat_port}: {exc}", err=True
            )
            sys.exit(3)
        if cfg.heartbeat_bind in ("0.0.0.0", "::", ""):
            log.warning(
                "heartbeat_bind=%r takes datagrams from every network of this host: set the cluster address",
                cfg.heartbeat_bind,
            )
        detector = FailureDetector(
            _backend(cfg), receiver,
            LivenessConfig(interval_s=cfg.heartbeat_interval_s, miss_limit=cfg.miss_limit,
                           straggler_clear_s=cfg.straggler_clear_s),
            events=EventLog(cfg.event_log) if cfg.event_log else None, dry_run=cfg.dry_run, clock=wall,
            expedite_requeue=cfg.expedite_requeue,
        )  # fmt: skip
        detector_thread = threading.Thread(
            target=_keep_running, args=("failure detector", lambda: detector.run(cfg.detector_tick_s, stop), stop),
            name="failure-detector", daemon=True,
        )  # fmt: skip
        detector_thread.start()
        log.info(
            "failure detector started: udp %s:%d interval_s=%s miss_limit=%d event_log=%s",
            cfg.heartbeat_bind, receiver.port, cfg.heartbeat_interval_s, cfg.miss_limit, cfg.event_log,
        )  # fmt: skip
    _start_slurm_metrics(cfg, stop)  # its own daemon thread; at most one buffered point is lost at exit
    progress_file = ProgressFile(cfg.state_dir) if cfg.state_dir else None
    if book is not None and progress_file is not None:
        threading.Thread(target=_publish_progress, args=(book, progress_file, stop), name="progress", daemon=True
                         ).start()  # fmt: skip
    if policy is None:
        log.info("no policy: only the failure detector runs")
        _wait_interruptibly(stop)
        if detector_thread is not None:
            detector_thread.join(5)
        log.info("nuro-controller stopped")
        return
    events = EventLog(cfg.event_log) if cfg.event_log else None
    if cfg.state_dir is None:
        log.warning("no state_dir: in-flight preemptions are kept in memory only (a restarted controller forgets "
                    "them; the victims' GraceTime still holds them to account)")  # fmt: skip
    progress = book.view if book is not None else (progress_file.view if progress_file is not None else None)
    if progress is None:
        log.warning("no heartbeat receiver and no state_dir: jobs' acks and commits are not heard; victims are "
                    "requeued at grace end")  # fmt: skip
    controller = Controller(
        _backend(cfg), policy, cfg.dry_run, clock=wall, events=events, apply_budget_s=cfg.apply_budget_s,
        ledger=Ledger(cfg.state_dir) if cfg.state_dir else None, progress=progress, node_weights=cfg.node_weights,
    )  # fmt: skip
    policy_file = cfg.policy
    signal.signal(signal.SIGHUP, lambda *_: controller.reload_policy(policy_file))
    log.info("nuro-controller started: policy=%s interval_s=%s dry_run=%s", cfg.policy, cfg.interval_s, cfg.dry_run)
    policy_thread = threading.Thread(
        target=_keep_running, args=("policy loop", lambda: controller.run(cfg.interval_s, stop), stop),
        name="policy", daemon=True,
    )  # fmt: skip
    policy_thread.start()
    _wait_interruptibly(stop)
    policy_thread.join(max(5.0, cfg.interval_s + 1))
    if cfg.node_weights and not cfg.dry_run:
        _neutral_weights(controller)
    if not cfg.dry_run and controller.refloor((), clear=True):
        log.info("gang-first floors cleared: the teams' small jobs start in their quota again")
    if detector_thread is not None:
        detector_thread.join(5)
    log.info("nuro-controller stopped after %d cycles", controller.cycles)


def _neutral_weights(controller: Controller) -> None:
    """A clean stop leaves Slurm's default weight on every GPU node (``weights.neutral_weight``): packing weights
    outliving the controller would keep steering jobs to nodes that were busy when it stopped."""
    try:
        done = controller.reweigh(controller.backend.nodes(), target=weights.neutral_weight)
    except SlurmError as exc:
        log.warning("node weights left as the last cycle set them (could not read the nodes: %s)", exc)
        return
    if done:
        log.info("node weights: %d GPU nodes back to Slurm's default %d", done, weights.DEFAULT_WEIGHT)


def _start_slurm_metrics(cfg: ControllerConfig, stop: threading.Event) -> threading.Thread | None:
    """The OpenMetrics loop (``slurm_metrics.SlurmMetricsLoop``) in its own thread, when a URL is configured and
    ``$NURO_METRICS_URL`` names a sink; otherwise None (logged)."""
    if not cfg.slurm_metrics_url:
        return None
    writer = writer_from_env({"source": "controller", "node": socket.gethostname()}, "slurmctld metrics")
    if writer is None:
        log.warning("slurmctld metrics not read from %s: $%s names no usable sink", cfg.slurm_metrics_url, ENV_URL)
        return None
    loop = SlurmMetricsLoop(cfg.slurm_metrics_url, writer.add, cfg.slurm_metrics_interval_s)
    thread = threading.Thread(
        target=_keep_running, args=("slurm metrics", lambda: loop.run(stop), stop), name="slurm-metrics", daemon=True
    )
    thread.start()
    log.info("slurmctld metrics: %s every %s s", cfg.slurm_metrics_url, cfg.slurm_metrics_interval_s)
    return thread


def _publish_progress(book: ProgressBook, out: ProgressFile, stop: threading.Event, every_s: float = 0.5) -> None:
    """Write the progress book to the state dir when it changed (``progress.ProgressFile``), until ``stop``."""
    while not stop.wait(every_s):
        try:
            out.publish(book)
        except OSError as exc:
            log.warning("progress file not written to %s: %s", out.path, exc)
            stop.wait(30.0)


def _wait_interruptibly(stop: threading.Event, tick_s: float = 0.5) -> None:
    """Wait in the main thread until ``stop``, waking every ``tick_s``.

    Why not ``stop.wait()``: Python runs signal handlers only in the main thread, and only when it runs bytecode. The
    kernel may deliver SIGTERM to another thread (here one waiting on squeue), which then cannot wake a main thread
    blocked on a lock with no timeout: the handler never runs and the controller never stops (seen in CI, where a
    leaked controller then acted on later tests' jobs). Waking now and then bounds that to ``tick_s``."""
    while not stop.wait(tick_s):
        pass


def _keep_running(name: str, loop: Callable[[], None], stop: threading.Event, pause_s: float = 1.0) -> None:
    """Run ``loop`` until ``stop``; should it ever return or raise early, log it and start it again (a loop that
    dies leaves the other running: the detector never depends on the policy loop, nor the reverse)."""
    while not stop.is_set():
        try:
            loop()
        except Exception:  # noqa: BLE001
            log.exception("%s died; restarting it in %.0f s", name, pause_s)
        else:
            if not stop.is_set():
                log.error("%s returned early; restarting it in %.0f s", name, pause_s)
        stop.wait(pause_s)


def _backend(cfg: ControllerConfig) -> CliBackend:
    """One backend per loop: the detector's Slurm calls never queue behind a policy cycle's."""
    return CliBackend(env=cfg.slurm_env(), timeout_s=cfg.slurm_timeout_s)


def _run_once(controller: Controller) -> None:
    """``--once``: one policy cycle, its decisions as JSON on stdout, exit 1 on a cycle error."""
    report = controller.cycle()
    click.echo(
        json.dumps(
            {
                "error": report.error,
                "decisions": [
                    {
                        "kind": type(o.decision).__name__,
                        **_public(o.decision),
                        "applied": o.applied,
                        "result": o.message,
                    }
                    for o in report.outcomes
                ],
            },
            indent=2,
        )
    )
    sys.exit(1 if report.error else 0)


def _public(decision: object) -> dict:
    return dataclasses.asdict(decision) if dataclasses.is_dataclass(decision) else {}


if __name__ == "__main__":
    main()

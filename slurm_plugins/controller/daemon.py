"""``nuro-controller``: the foreground daemon that adds borrowing, reclaim and fair-share priority to Slurm.

Each cycle (K1): 1 snapshot (one adapter read), 2 decide (pure, ``engine.decide``), 3 apply (``apply.py``),
4 remember (soft state). Nothing is stored that Slurm does not also hold: on start the in-flight preemptions are
rebuilt from the victims' job comments, so a restart loses nothing. With the controller stopped Slurm keeps
scheduling and the hard quotas (QOS GrpTRES) still hold; only borrowing, reclaim and fair-share nudges pause.

    nuro-controller --config /etc/nuro/controller.yaml
    nuro-controller --policy teams.yaml --interval-s 1 [--dry-run] [--once] [--log-format json]

Signals: SIGTERM/SIGINT finish the current cycle and exit 0; SIGHUP re-reads the policy (kept if invalid).
Exit codes: 0 stopped cleanly, 2 usage error, 3 invalid config or policy.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import click

from nuro.policy import Policy, PolicyError, load_policy
from nuro.slurm import Backend, CliBackend, SlurmError
from nuro.slurm_plugins.controller.apply import Outcome, apply_decision
from nuro.slurm_plugins.controller.config import ConfigError, ControllerConfig, LogFormat, load_config
from nuro.slurm_plugins.controller.decisions import Preempt, SetSiteFactor
from nuro.slurm_plugins.controller.engine import ControllerState, decide, rebuild_state

log = logging.getLogger("nuro.controller")


@dataclass
class CycleReport:
    cycle: int
    snapshot_s: float = 0.0
    decide_s: float = 0.0
    apply_s: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    error: str = ""


class Controller:
    """One controller: a backend, a policy, soft state. ``cycle()`` is one pass; ``run()`` loops."""

    def __init__(
        self,
        backend: Backend,
        policy: Policy,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.policy = policy
        self.dry_run = dry_run
        self.clock = clock
        self.state: ControllerState | None = None
        self.cycles = 0

    def cycle(self) -> CycleReport:
        self.cycles += 1
        report = CycleReport(cycle=self.cycles)
        t0 = time.monotonic()
        try:
            snapshot = self.backend.read_snapshot()
        except SlurmError as exc:
            # Fail operational: Slurm's own limits hold; we simply skip this cycle.
            report.error = f"snapshot failed, cycle skipped: {exc}"
            log.warning("cycle=%d %s", self.cycles, report.error)
            return report
        report.snapshot_s = time.monotonic() - t0
        if self.state is None:
            self.state = rebuild_state(snapshot)
            if self.state.preempting:
                log.info("cycle=%d rebuilt in-flight preemptions from Slurm: %s", self.cycles, self.state.preempting)
        now = self.clock()
        t1 = time.monotonic()
        decisions = decide(snapshot, self.policy, self.state, now)
        report.decide_s = time.monotonic() - t1
        t2 = time.monotonic()
        failed: set[int] = set()
        for decision in decisions:
            try:
                outcome = apply_decision(self.backend, decision, now, self.dry_run)
            except SlurmError as exc:
                report.error = f"Slurm unavailable mid-cycle, rest skipped: {exc}"
                log.warning("cycle=%d %s", self.cycles, report.error)
                failed.update(d.job_id for d in decisions[decisions.index(decision) :])
                break
            report.outcomes.append(outcome)
            log.info(
                "cycle=%d decision=%s job=%d applied=%s code=%s reason=%r result=%r",
                self.cycles, type(decision).__name__, decision.job_id, outcome.applied, decision.code,
                decision.reason, outcome.message,
            )  # fmt: skip
            if not outcome.applied:
                failed.add(decision.job_id)
        self.state = _state_after(decisions.next_state, decisions, failed)
        report.apply_s = time.monotonic() - t2
        log.debug(
            "cycle=%d snapshot_s=%.3f decide_s=%.3f apply_s=%.3f jobs=%d decisions=%d %s",
            self.cycles, report.snapshot_s, report.decide_s, report.apply_s, len(snapshot.jobs), len(decisions),
            decisions.cycle_stats.log_fields(),
        )  # fmt: skip
        return report

    def reload_policy(self, path: Path) -> None:
        try:
            self.policy = load_policy(path)
            log.info("policy reloaded from %s", path)
        except PolicyError as exc:
            log.error("policy reload refused, keeping the previous one: %s", exc)

    def run(
        self, interval_s: float, stop: threading.Event, on_cycle: Callable[[CycleReport], None] | None = None
    ) -> None:
        while not stop.is_set():
            started = time.monotonic()
            report = self.cycle()
            if on_cycle:
                on_cycle(report)
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
@click.option("-v", "--verbose", is_flag=True)
def main(
    config_path: Path | None,
    policy_path: Path | None,
    interval_s: float | None,
    dry_run: bool,
    once: bool,
    log_format: str | None,
    verbose: bool,
) -> None:
    """Borrowing with lending limits, checkpoint-confirmed reclaim and urgent preemption, fair-share priority."""
    try:
        if config_path:
            cfg = load_config(config_path)
        elif policy_path:
            cfg = ControllerConfig(policy=policy_path)
        else:
            raise click.UsageError("give --config FILE or --policy teams.yaml")
        updates = {
            k: v
            for k, v in {"policy": policy_path, "interval_s": interval_s, "log_format": log_format}.items()
            if v is not None
        }
        if dry_run:
            updates["dry_run"] = True
        cfg = ControllerConfig.model_validate({**cfg.model_dump(), **updates})
        policy = load_policy(cfg.policy)
    except (ConfigError, PolicyError, ValueError) as exc:
        click.echo(f"nuro-controller: {exc}", err=True)
        sys.exit(3)
    _setup_logging(cfg.log_format, verbose)
    controller = Controller(CliBackend(env=cfg.slurm_env(), timeout_s=cfg.slurm_timeout_s), policy, cfg.dry_run)
    if once:
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
    stop = threading.Event()

    def on_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping after this cycle", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, lambda *_: controller.reload_policy(cfg.policy))
    log.info("nuro-controller started: policy=%s interval_s=%s dry_run=%s", cfg.policy, cfg.interval_s, cfg.dry_run)
    controller.run(cfg.interval_s, stop)
    log.info("nuro-controller stopped after %d cycles", controller.cycles)


def _public(decision: object) -> dict:
    return dataclasses.asdict(decision) if dataclasses.is_dataclass(decision) else {}


if __name__ == "__main__":
    main()

"""nuro-controller's configuration file (YAML), validated up front: a typo fails at start, not mid-incident.

policy: /etc/nuro/teams.yaml      # the teams policy (the same file `nuro-admin policy apply` takes); without it
                                  # only the failure detector runs (then heartbeat_port is required)
slurm_conf: /etc/slurm/slurm.conf # optional: else $SLURM_CONF, else Slurm's default
interval_s: 1.0                   # one cycle (snapshot → decide → apply) per interval
apply_budget_s: 1.0               # Slurm calls a cycle may spend, its snapshot included; QOS moves and
                                  # SiteFactors beyond it are decided again next cycle (the apply keeps at least a
                                  # quarter; requeues and preemption signals always go); null = no limit
slurm_timeout_s: 15               # every Slurm call's limit; a hung call must not eat a preemption's grace
dry_run: false                    # decide and log, apply nothing
log_format: text                  # text | json (one JSON object per line)
heartbeat_port: 6820              # UDP port for node agents' heartbeats; unset = no failure detector
heartbeat_bind: 127.0.0.1         # listen address: the controller's cluster-network address in production (the
                                  # Ansible role renders it), never 0.0.0.0 (datagrams from every network the host
                                  # is on); loopback by default so nothing is exposed by accident
heartbeat_key_file: /etc/nuro/heartbeat.key  # the master HMAC key (mode 600); each agent holds only its node's key,
                                  # derived from it (nuro.protocol.heartbeat.node_key)
heartbeat_interval_s: 0.25        # the agents' send interval (nuro-nodeagent --interval-s must match)
miss_limit: 4                     # intervals of silence before a node is declared lost (0.25 × 4: about 1 s)
detector_tick_s: 0.25             # how often the detector judges (its own loop, independent of interval_s)
straggler_clear_s: 30             # a straggler drain (nuro-straggler:) lifts once the node's GPUs report no slowing
                                  # clock reason for this long
node_weights: true                # set each GPU node's Slurm Weight to 1 + its free GPUs every cycle, so jobs pack
                                  # onto busy nodes and whole nodes stay whole for gangs (controller/weights.py);
                                  # false keeps slurm.conf's Weight
expedite_requeue: true            # before Slurm 25.11: start a job a node loss requeued as soon as it is safe, not
                                  # cred_expire + 1 s later (nuro.slurm_plugins.controller.expedite)
state_dir: /var/lib/nuro/controller  # root-only: the preemption ledger (in-flight preemptions survive a restart)
                                  # and the agents' progress (progress.json); unset = memory only
event_log: /var/log/nuro/events.jsonl  # append-only JSONL journal (nuro.lifecycle.platform_events); unset = log lines
only
slurm_metrics_url: http://ctl:6817  # Slurm 25.11+ with MetricsType=metrics/openmetrics: slurmctld's own address and
                                  # port; its counts and scheduler statistics go to $NURO_METRICS_URL's sink as
                                  # `slurmctld` points (nuro.slurm.openmetrics); unset = not read
slurm_metrics_interval_s: 10      # one scrape (three GETs) per interval

Relative paths are resolved beside the config file.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from nuro.protocol.heartbeat import DEFAULT_INTERVAL_S, DEFAULT_MISS_LIMIT

#: Where the controller's state dir is for the services beside it that read it (the MLflow bridge), and its
#: packaged place (Ansible's ``slurm_controller_state_dir``).
ENV_STATE_DIR = "NURO_CONTROLLER_STATE_DIR"
DEFAULT_STATE_DIR = "/var/lib/nuro/controller"


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class ConfigError(ValueError):
    """The controller config is invalid; the message lists every problem."""


class ControllerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Path | None = None
    slurm_conf: Path | None = None
    interval_s: float = Field(default=1.0, gt=0, le=60)
    apply_budget_s: float | None = Field(default=1.0, gt=0, le=600)
    slurm_timeout_s: float = Field(default=15.0, gt=0, le=300)
    dry_run: bool = False
    log_format: LogFormat = LogFormat.TEXT
    heartbeat_port: int | None = Field(default=None, ge=1, le=65535)
    heartbeat_bind: str = "127.0.0.1"
    heartbeat_key_file: Path | None = None
    heartbeat_interval_s: float = Field(default=DEFAULT_INTERVAL_S, gt=0, le=60)
    miss_limit: int = Field(default=DEFAULT_MISS_LIMIT, ge=2, le=100)
    detector_tick_s: float = Field(default=0.25, gt=0, le=10)
    straggler_clear_s: float = Field(default=30.0, ge=1, le=3600)
    expedite_requeue: bool = True
    node_weights: bool = True
    event_log: Path | None = None
    state_dir: Path | None = None
    slurm_metrics_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+/?$")
    slurm_metrics_interval_s: float = Field(default=10.0, ge=1, le=3600)

    @model_validator(mode="after")
    def _something_to_do(self) -> ControllerConfig:
        if self.policy is None and self.heartbeat_port is None:
            raise ValueError("nothing to run: give a policy (teams.yaml), a heartbeat_port, or both")
        if self.heartbeat_port is not None and self.heartbeat_key_file is None:
            raise ValueError("heartbeat_port needs heartbeat_key_file (the master key the agents' keys derive from)")
        if self.detector_tick_s > self.heartbeat_interval_s:
            raise ValueError(
                f"detector_tick_s={self.detector_tick_s} exceeds heartbeat_interval_s={self.heartbeat_interval_s}: "
                "detection would lag by more than a beat; lower detector_tick_s"
            )
        return self

    @property
    def detector_on(self) -> bool:
        return self.heartbeat_port is not None

    @model_validator(mode="after")
    def _timeouts_fit(self) -> ControllerConfig:
        # A cycle runs a few Slurm calls in sequence; a call allowed to outlast many cycles hides a dead controller.
        if self.slurm_timeout_s < self.interval_s:
            raise ValueError(
                f"slurm_timeout_s={self.slurm_timeout_s} is shorter than interval_s={self.interval_s}: a normal "
                "Slurm call could never finish; raise slurm_timeout_s"
            )
        return self

    def slurm_env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.slurm_conf)} if self.slurm_conf else {}


def load_config(path: str | Path) -> ControllerConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    try:
        cfg = ControllerConfig.model_validate(raw)
    except ValidationError as exc:
        lines = [
            f"  - {'.'.join(str(p) for p in e['loc']) or '(top level)'}: "
            + ("unknown key" if e["type"] == "extra_forbidden" else e["msg"])
            for e in exc.errors()
        ]
        valid = ", ".join(ControllerConfig.model_fields)
        raise ConfigError(
            f"{path}: invalid controller config:\n" + "\n".join(lines) + f"\nvalid keys: {valid}"
        ) from None
    updates = {
        key: (path.parent / value).resolve()
        for key in ("policy", "heartbeat_key_file", "event_log", "state_dir")
        if isinstance(value := getattr(cfg, key), Path) and not value.is_absolute()
    }
    return cfg.model_copy(update=updates) if updates else cfg

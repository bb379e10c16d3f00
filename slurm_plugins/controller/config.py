"""nuro-controller's configuration file (YAML), validated up front: a typo fails at start, not mid-incident.

policy: /etc/nuro/teams.yaml      # required: the teams policy (the same file `nuro-admin policy apply` takes)
slurm_conf: /etc/slurm/slurm.conf # optional: else $SLURM_CONF, else Slurm's default
interval_s: 1.0                   # one cycle (snapshot → decide → apply) per interval
slurm_timeout_s: 15               # every Slurm call's limit; a hung call must not eat a preemption's grace
dry_run: false                    # decide and log, apply nothing
log_format: text                  # text | json (one JSON object per line)
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class ConfigError(ValueError):
    """The controller config is invalid; the message lists every problem."""


class ControllerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: Path
    slurm_conf: Path | None = None
    interval_s: float = Field(default=1.0, gt=0, le=60)
    slurm_timeout_s: float = Field(default=15.0, gt=0, le=300)
    dry_run: bool = False
    log_format: LogFormat = LogFormat.TEXT

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
    if not cfg.policy.is_absolute():
        cfg = cfg.model_copy(update={"policy": (path.parent / cfg.policy).resolve()})
    return cfg

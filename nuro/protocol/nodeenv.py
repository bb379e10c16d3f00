"""Settings for node-side entry points (prolog, epilog, health check) from the file ``$NURO_ENV_FILE`` names.

slurmd runs those hooks with a job-only environment (no SLURM_CONF, no S3 endpoint or key), so the admin's
settings travel in a root-only KEY=VALUE file named by a small wrapper (``nuro.cluster.slurmconf.render_hook_wrapper``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path

from nuro.protocol.envnames import NURO_ENV_FILE

log = logging.getLogger(__name__)
_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")


def read_env_file(path: str | Path) -> dict[str, str]:
    """Parse KEY=VALUE lines (no quoting, no expansion); blank lines and # comments are skipped."""
    env: dict[str, str] = {}
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _KEY.fullmatch(key):
            raise ValueError(f"{path}:{n}: expected KEY=VALUE with an upper-case key, got {line[:60]!r}")
        env[key] = value
    return env


def load_node_env() -> dict[str, str]:
    """Apply ``$NURO_ENV_FILE`` to os.environ (existing variables win) and return what it set."""
    path = os.environ.get(NURO_ENV_FILE)
    if not path:
        return {}
    settings = read_env_file(path)
    for key, value in settings.items():
        os.environ.setdefault(key, value)
    return settings


def env_number(env: Mapping[str, str], name: str, kind: type, default: float | int | None) -> float | int | None:
    """A non-negative ``kind`` (int or float) from node setting ``name``; ``default`` when unset or empty.

    The one reader of numeric node settings. Raises ValueError naming the variable and its bad value: a caller that
    must run on regardless (a daemon's worker) catches it and keeps its default, saying so."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a {kind.__name__}") from None
    if not value >= 0:  # also refuses NaN
        raise ValueError(f"{name}={raw!r} must not be negative")
    return value


def setting(
    env: Mapping[str, str], name: str, kind: type, default: float | int, *, positive: bool = False
) -> float | int:
    """Node setting ``name`` for a hook or daemon that must run on whatever an admin wrote: ``env_number``'s value,
    or ``default`` when unset. The one error policy of node-side settings: a malformed or negative value (or, with
    ``positive``, a zero) keeps ``default`` and says so in the log; it never stops the hook."""
    try:
        value = env_number(env, name, kind, None)
    except ValueError as exc:
        log.warning("%s: using %s", exc, default)
        return default
    if value is None:
        return default
    if positive and not value > 0:
        log.warning("%s=%r is not positive: using %s", name, env.get(name), default)
        return default
    return value

"""The prolog's and epilog's own log file on the node (``NURO_HOOK_LOG``), written beside their stderr.

Why: slurmd discards what a Prolog or Epilog writes to stderr, so what a hook staged, skipped or abandoned (a
checkpoint not staged in time, uploads given up at the deadline, a refused comment) was lost unless the job failed.
``nuro-admin nodes collect-logs`` fetches this file with slurmd's and the agent's and cuts out one job's lines.

``%n`` in the path is replaced by the node's name (as in slurm.conf's ``SlurmdLogFile``), so the dev cluster's
emulated nodes, which share one log directory, keep apart. The path comes from the root-only node settings, never
from the job; the file is opened append-only without following a symlink. A log that cannot be opened costs the log
(one line on stderr), never the job.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

ENV = "NURO_HOOK_LOG"


def hook_log_path(env: Mapping[str, str], node: str) -> str | None:
    """The node's hook log path from ``NURO_HOOK_LOG`` (``%n`` → node name), or None when unset."""
    raw = env.get(ENV, "").strip()
    return raw.replace("%n", node) if raw else None


def attach(hook: str, env: Mapping[str, str] | None = None) -> logging.Handler | None:
    """Add a handler for the root logger that appends to the hook log: ``<time> <node> <hook> <LEVEL> <message>``."""
    env = os.environ if env is None else env
    node = env.get("SLURMD_NODENAME", "") or os.uname().nodename
    path = hook_log_path(env, node)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
        stream = os.fdopen(fd, "a", buffering=1)
    except OSError as exc:
        logging.getLogger("nuro.hooklog").warning("hook log %s not opened (%s): this run logs to stderr only", path,
                                                  exc)  # fmt: skip
        return None
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {node} {hook} %(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)
    return handler


__all__ = ["ENV", "attach", "hook_log_path"]

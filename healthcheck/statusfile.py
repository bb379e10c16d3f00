"""The node agent's status file ``<status-dir>/<node>.json``: written by ``nuro-nodeagent`` every beat, read by the
health check (agent liveness, the XIDs the agent saw) and the dev cluster.

Why a module of its own: the agent writes it and the health check reads it, and the agent also runs the health
check's measurements; with the format here neither imports the other's entry point.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nuro.safeio.atomic import write_atomic

STATUS_FORMAT = 1
MAX_STATUS_BYTES = 1 << 20  # a status file is a few KB (the GPU report included); a bigger one is not ours


def status_path(status_dir: str | Path, node: str) -> Path:
    return Path(status_dir) / f"{node}.json"


def write_status(status_dir: str | Path, node: str, status: dict[str, Any]) -> None:
    """Write ``<dir>/<node>.json`` atomically (temp file + ``os.replace``), so a reader never sees half a file.

    No fsync: the file is soft state rewritten every second, and after a crash a stale or missing file is exactly
    what "agent silent" must report.
    """
    write_atomic(status_path(status_dir, node), json.dumps(status, separators=(",", ":"), ensure_ascii=False),
                 durable=False)  # fmt: skip


def read_status(status_dir: str | Path, node: str) -> dict[str, Any] | None:
    """The agent's last status, or None when there is none (or it is unreadable: treated as never reported)."""
    try:
        with open(status_path(status_dir, node), "rb") as fh:
            data = fh.read(MAX_STATUS_BYTES + 1)
        if len(data) > MAX_STATUS_BYTES:
            return None
        return json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


__all__ = ["MAX_STATUS_BYTES", "STATUS_FORMAT", "read_status", "status_path", "write_status"]

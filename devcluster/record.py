"""The run record: what the supervisor started, written atomically so a reader never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from nuro.devcluster.procs import ProcRef


class Phase(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass
class RunRecord:
    state_dir: str
    nodes: int
    port_base: int
    phase: Phase = Phase.STARTING
    error: str = ""
    supervisor: ProcRef | None = None
    daemons: list[ProcRef] = field(default_factory=list)
    started_at: float = 0.0
    running_at: float = 0.0
    # Nodes crashed on purpose by ``devcluster kill-node``: node → {"at": Unix s, "killed": [{name, pid}, ...]}.
    # Their slurmd and agent leave ``daemons`` (a killed node is not an unhealthy cluster) until revive-node.
    killed_nodes: dict[str, dict] = field(default_factory=dict)
    # Daemons the supervisor restarted after a crash (nuro.devcluster.restart): name → {"count", "pid", "at",
    # "last_exit", "last_exit_at", "last", "gave_up"}. The live PID itself is in ``daemons``.
    restarts: dict[str, dict] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "state_dir": self.state_dir,
            "nodes": self.nodes,
            "port_base": self.port_base,
            "phase": str(self.phase),
            "error": self.error,
            "supervisor": self.supervisor.to_json() if self.supervisor else None,
            "daemons": [d.to_json() for d in self.daemons],
            "started_at": self.started_at,
            "running_at": self.running_at,
            "killed_nodes": self.killed_nodes,
            "restarts": self.restarts,
        }

    @classmethod
    def from_json(cls, data: dict) -> RunRecord:
        return cls(
            state_dir=data["state_dir"],
            nodes=int(data["nodes"]),
            port_base=int(data["port_base"]),
            phase=Phase(data["phase"]),
            error=data.get("error", ""),
            supervisor=ProcRef.from_json(data["supervisor"]) if data.get("supervisor") else None,
            daemons=[ProcRef.from_json(d) for d in data.get("daemons", [])],
            started_at=float(data.get("started_at", 0.0)),
            running_at=float(data.get("running_at", 0.0)),
            killed_nodes=dict(data.get("killed_nodes") or {}),
            restarts=dict(data.get("restarts") or {}),
        )

    def live_processes(self) -> list[ProcRef]:
        """Recorded processes (supervisor included) still alive with the same identity."""
        refs = ([self.supervisor] if self.supervisor else []) + self.daemons
        return [r for r in refs if r.is_alive()]


def write_record(path: Path, record: RunRecord) -> None:
    """Write-then-rename: a crash mid-write leaves the previous record intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cluster.", suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(record.to_json(), fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_record(path: Path) -> RunRecord | None:
    try:
        return RunRecord.from_json(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(
            f"the run record {path} is unreadable ({exc}); if no cluster runs from this state dir, delete it"
        ) from exc

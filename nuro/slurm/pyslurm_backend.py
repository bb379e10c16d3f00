"""Optional pyslurm backend and the ``make_backend`` factory that decides between it and the CLI.

Why optional: pyslurm links libslurm and must be built for the running Slurm's major.minor. PyPI has 25.11.x (fails
to build against 22.05) and ancient 17/18.x; nothing matches Debian's 22.05 (checked on PyPI). So the CLI backend is the
default and pyslurm is used only when ``import pyslurm`` works AND its version's major.minor equals the running
Slurm's. pyslurm is never required: every import of it is guarded.

Only reads go through pyslurm (jobs, nodes, partitions); actions, accounting and the version stay on the CLI, so
both backends submit, cancel and drain in exactly the same, tested way.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from types import ModuleType
from typing import Any

from nuro.slurm import hostlist
from nuro.slurm._fields import as_int, as_str, epoch_to_dt, gpu_count_from_gres, node_state_text
from nuro.slurm.actions import Action, ActionResult, SubmitCommand
from nuro.slurm.backend import Backend, CliBackend
from nuro.slurm.errors import SlurmError, SlurmParseError
from nuro.slurm.models import ClusterSnapshot, JobInfo, NodeInfo, PartitionInfo, SlurmVersion
from nuro.slurm.parse import attach_switches, parse_version
from nuro.slurm.states import to_phase

log = logging.getLogger(__name__)


class BackendPreference(StrEnum):
    """Which backend ``make_backend`` should try first."""

    AUTO = "auto"
    CLI = "cli"
    PYSLURM = "pyslurm"


def import_pyslurm() -> ModuleType | None:
    """``import pyslurm`` or None when it is not installed or fails to load (a libslurm mismatch raises too)."""
    try:
        return importlib.import_module("pyslurm")
    except ImportError as exc:
        log.debug("pyslurm not importable: %s", exc)
        return None
    except Exception as exc:  # a pyslurm built for another libslurm can fail with OSError/undefined symbols
        log.warning("pyslurm is installed but failed to import: %s", exc)
        return None


def pyslurm_version(module: ModuleType) -> SlurmVersion | None:
    """The Slurm release a pyslurm module was built for ("22.5.0" means Slurm 22.05), or None if unknown."""
    for attr in ("__version__", "version"):
        value = getattr(module, attr, None)
        try:
            text = value() if callable(value) else value
            if text:
                return parse_version(str(text))
        except (SlurmParseError, TypeError, RuntimeError) as exc:
            log.debug("pyslurm.%s unusable: %s", attr, exc)
    return None


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    """First present attribute (pyslurm renamed fields between releases)."""
    for name in names:
        value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        if value is not None:
            return value
    return default


def _gres_text(value: Any) -> str:
    """pyslurm gives GRES as {"gpu": 8} or {"gpu:a100": 8}; the CLI as "gpu:8"."""
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return as_str(value)


class PyslurmBackend(Backend):
    """Reads via pyslurm; everything else via the given ``CliBackend``.

    Args:
        cli: the CLI backend used for actions, sacct, version and topology.
        module: the imported pyslurm module (from ``import_pyslurm``).
    """

    name = "pyslurm"

    def __init__(self, cli: CliBackend, module: ModuleType) -> None:
        self.cli = cli
        self.module = module

    def _jobs(self) -> list[JobInfo]:
        jobs = []
        for job in self.module.Jobs.load().values():
            state = as_str(_get(job, "state", "job_state"))
            per_node = _gres_text(_get(job, "gres_per_node", "tres_per_node", default=""))
            node_count = as_int(_get(job, "num_nodes", "node_count"))
            per_node_gpus = gpu_count_from_gres(per_node)
            jobs.append(
                JobInfo(
                    job_id=as_int(_get(job, "id", "job_id")),
                    name=as_str(_get(job, "name")),
                    user=as_str(_get(job, "user_name", "user")),
                    state=state,
                    phase=to_phase(state),
                    reason=as_str(_get(job, "state_reason")),
                    account=as_str(_get(job, "account")),
                    qos=as_str(_get(job, "qos")),
                    partition=as_str(_get(job, "partition")),
                    priority=as_int(_get(job, "priority")),
                    nodes=tuple(hostlist.expand(as_str(_get(job, "nodes", default="")))),
                    node_count=node_count,
                    gres_per_node=per_node,
                    gpus_per_node=per_node_gpus,
                    gpus_total=per_node_gpus * node_count,
                    restart_count=as_int(_get(job, "requeue_count", "restart_cnt")),
                    comment=as_str(_get(job, "comment")),
                    requeue=bool(_get(job, "is_requeueable", "requeue", default=False)),
                    submit_time=epoch_to_dt(_get(job, "submit_time")),
                    start_time=epoch_to_dt(_get(job, "start_time")),
                    end_time=epoch_to_dt(_get(job, "end_time")),
                )
            )
        return jobs

    def _nodes(self) -> list[NodeInfo]:
        nodes = []
        for node in self.module.Nodes.load().values():
            words = as_str(_get(node, "state", default="UNKNOWN")).replace("+", " ").split()
            state = node_state_text(words[0] if words else "UNKNOWN", words[1:])
            gres = _gres_text(_get(node, "configured_gres", "gres", default=""))
            nodes.append(
                NodeInfo(
                    name=as_str(_get(node, "name")),
                    state=state,
                    flags=frozenset(state.split("+")),
                    reason=as_str(_get(node, "reason")) or None,
                    gres=gres,
                    gpus_total=gpu_count_from_gres(gres),
                    gpus_alloc=gpu_count_from_gres(_gres_text(_get(node, "allocated_gres", "gres_used", default=""))),
                    cpus=as_int(_get(node, "total_cpus", "cpus")),
                    cpus_alloc=as_int(_get(node, "allocated_cpus", "alloc_cpus")),
                    partitions=tuple(_get(node, "partitions", default=()) or ()),
                )
            )
        return nodes

    def _partitions(self) -> list[PartitionInfo]:
        parts = []
        for part in self.module.Partitions.load().values():
            parts.append(
                PartitionInfo(
                    name=as_str(_get(part, "name")),
                    nodes=tuple(hostlist.expand(as_str(_get(part, "nodes", default="")))),
                    state=as_str(_get(part, "state", default="UNKNOWN")).upper(),
                    total_cpus=as_int(_get(part, "total_cpus")),
                    total_nodes=as_int(_get(part, "total_nodes")),
                    default=bool(_get(part, "is_default", default=False)),
                )
            )
        return parts

    def read_snapshot(self) -> ClusterSnapshot:
        """Jobs, nodes and partitions from libslurm via pyslurm; switches from the CLI's cached topology."""
        taken_at = datetime.now(UTC)
        try:
            jobs, nodes, parts = self._jobs(), self._nodes(), self._partitions()
        except Exception as exc:  # pyslurm raises its own RPCError etc.; callers expect SlurmError
            raise SlurmError(f"pyslurm read failed: {exc}") from exc
        nodes = attach_switches(nodes, self.cli.topology())
        return ClusterSnapshot(
            nodes=tuple(nodes), jobs=tuple(jobs), partitions=tuple(parts), taken_at=taken_at, source=self.name
        )

    def apply(self, action: Action) -> ActionResult:
        """Delegated to the CLI backend (same argv, same errors)."""
        return self.cli.apply(action)

    def submit_command(self, command: SubmitCommand) -> int:
        """Delegated to the CLI backend (sbatch speaks to the user directly)."""
        return self.cli.submit_command(command)

    def finished_jobs(self, job_ids: Iterable[int | str]) -> list[JobInfo]:
        """Delegated to the CLI backend (sacct --json)."""
        return self.cli.finished_jobs(job_ids)

    def version(self) -> SlurmVersion:
        """Delegated to the CLI backend."""
        return self.cli.version()

    def cred_expire_s(self) -> int:
        """Delegated to the CLI backend (``scontrol show config``)."""
        return self.cli.cred_expire_s()

    def job_restarts(self, job_id: int | str) -> tuple[int, str]:
        """Delegated to the CLI backend (one ``squeue -j`` line)."""
        return self.cli.job_restarts(job_id)


def make_backend(
    env: Mapping[str, str] | None = None,
    prefer: BackendPreference | str = BackendPreference.AUTO,
    timeout_s: float = 30.0,
    bin_dir: str | None = None,
) -> Backend:
    """Build the backend to use and log which one and why.

    Args:
        env: extra environment for Slurm commands (e.g. {"SLURM_CONF": ...}).
        prefer: "cli" always gives ``CliBackend``; "auto" and "pyslurm" give ``PyslurmBackend`` when pyslurm
            imports and its major.minor matches the running Slurm's, else ``CliBackend``. The fallback is logged at
            INFO for "auto" and WARNING for "pyslurm" (which asked for it explicitly).
        timeout_s: per-command timeout of the CLI backend, in seconds.
        bin_dir: where the Slurm client commands live; None means PATH.

    Raises:
        ValueError: for an unknown ``prefer``.
    """
    choice = BackendPreference(prefer)
    cli = CliBackend(env=env, timeout_s=timeout_s, bin_dir=bin_dir)
    if choice is BackendPreference.CLI:
        log.info("slurm backend=cli reason=requested")
        return cli
    level = logging.WARNING if choice is BackendPreference.PYSLURM else logging.INFO
    module = import_pyslurm()
    if module is None:
        log.log(level, "slurm backend=cli reason='pyslurm not importable' (pip install pyslurm matching Slurm)")
        return cli
    built_for = pyslurm_version(module)
    try:
        running = cli.version()
    except SlurmError as exc:
        log.log(level, "slurm backend=cli reason='cannot read the running Slurm version: %s'", exc)
        return cli
    if built_for is None or built_for.major_minor != running.major_minor:
        log.log(
            level,
            "slurm backend=cli reason='pyslurm %s does not match running Slurm %s (major.minor)'",
            built_for,
            running,
        )
        return cli
    log.info("slurm backend=pyslurm reason='pyslurm %s matches Slurm %s'", built_for, running)
    return PyslurmBackend(cli, module)

"""What a training process knows about its run, read once from the environment.

Three layers set the variables, and this module is the one place that reads them:

| source | variables | set by |
|---|---|---|
| nuro | ``NURO_TEAM``, ``NURO_RUN_NAME``, ``NURO_JOB_DIR``, ``NURO_EXIT_REQUEUE``, ``NURO_*_SIGNAL`` | batch script |
| nuro | ``NURO_STAGING_DIR`` (prolog), ``NURO_PG_TIMEOUT_S`` (``nuro-launch``) | the node |
| Slurm | ``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``, ``SLURM_NODEID``, ``SLURM_JOB_NUM_NODES`` | slurmstepd |
| torchrun | ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` | the elastic agent |

Outside Slurm and torchrun (a laptop, a unit test) every field has a single-process default, so the SDK works the
same there: rank 0 of 1, no job id, restart count 0.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from nuro.protocol import contract
from nuro.protocol.envnames import (
    NURO_JOB_DIR,
    NURO_PG_TIMEOUT_S,
    NURO_PREEMPT_SIGNAL,
    NURO_RUN_NAME,
    NURO_STAGING_DIR,
    NURO_TEAM,
)

#: "Stopped on purpose, restart me" (EX_TEMPFAIL) when ``NURO_EXIT_REQUEUE`` is unset; the batch script requeues on it.
DEFAULT_EXIT_REQUEUE = contract.EXIT_REQUEUE
#: Collective/process-group timeout when ``NURO_PG_TIMEOUT_S`` is unset. gloo's default is 30 min and NCCL's 10 min:
#: a frozen peer would hold the whole gang that long (measured with gloo), so nuro always passes an explicit one.
DEFAULT_PG_TIMEOUT_S = float(contract.PG_TIMEOUT_S)


class RunEnvError(ValueError):
    """A variable is present but malformed (a launcher bug, not a user error); the message names it."""


def _int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise RunEnvError(f"{name}={raw!r} is not an integer; it is set by Slurm/torchrun/nuro-launch") from None


def env_seconds(
    env: Mapping[str, str], name: str, *, allow_zero: bool = False, error: type[Exception] = RunEnvError
) -> float | None:
    """A number of seconds from the environment: None when unset or empty; otherwise finite and > 0 (≥ 0 with
    ``allow_zero``), or ``error`` naming the variable. The one parser of every ``NURO_*_S`` a training process
    reads (they used to differ: nan and inf passed one, 0 and negatives another). A value that is set but wrong is an
    error, never a silent default: a typo would otherwise change a timeout or an interval unnoticed."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise error(f"{name}={raw!r} is not a number of seconds {bound}; unset it to use the default")
    return value


@dataclass(frozen=True, kw_only=True)
class RunEnv:
    """The run as one training process sees it.

    Attributes:
        team, run_name: from the job spec; None outside a nuro job.
        job_id: Slurm job id; None outside Slurm (then nothing is written to a job comment).
        restart_count: how many times Slurm requeued this job (``SLURM_RESTART_COUNT``, 0 on the first run).
        rank, world_size, local_rank, local_world_size: torchrun's global/local rank and sizes (0/1 by default).
        node_rank: this node's index in the job (torchrun ``GROUP_RANK``, else ``SLURM_NODEID``, else 0).
        node_name: this node as Slurm names it (``SLURMD_NODENAME``); None outside Slurm.
        num_nodes: nodes in the job (``SLURM_JOB_NUM_NODES``, else 1).
        job_dir: the job's directory on shared storage (``NURO_JOB_DIR``); None outside a nuro job.
        staging_dir: node-local checkpoint staging dir (``NURO_STAGING_DIR``, set by the prolog); None = not staged.
        exit_requeue: the exit status meaning "restart me" (``NURO_EXIT_REQUEUE``, default 75).
        preempt_signal, stop_signal: signal names for "preempted" and "time limit near" (``USR1``/``USR2``).
        pg_timeout_s: timeout for ``init_process_group`` and every collective (``NURO_PG_TIMEOUT_S``, default 60).
    """

    team: str | None = None
    run_name: str | None = None
    job_id: int | None = None
    restart_count: int = 0
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    node_name: str | None = None
    num_nodes: int = 1
    job_dir: str | None = None
    staging_dir: str | None = None
    exit_requeue: int = DEFAULT_EXIT_REQUEUE
    preempt_signal: str = contract.PREEMPT_SIGNAL
    stop_signal: str = contract.TIME_LIMIT_SIGNAL
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RunEnv:
        """Read the run from ``env`` (default ``os.environ``). Raises RunEnvError on a malformed value."""
        e = os.environ if env is None else env
        slurm_node = _int(e, "SLURM_NODEID", 0) or 0
        rank = _int(e, "RANK", 0) or 0
        world = _int(e, "WORLD_SIZE", 1) or 1
        if not 0 <= rank < world:
            raise RunEnvError(f"RANK={rank} is outside WORLD_SIZE={world}")
        return cls(
            team=e.get(NURO_TEAM) or None,
            run_name=e.get(NURO_RUN_NAME) or None,
            job_id=_int(e, "SLURM_JOB_ID", None),
            restart_count=_int(e, "SLURM_RESTART_COUNT", 0) or 0,
            rank=rank,
            world_size=world,
            local_rank=_int(e, "LOCAL_RANK", 0) or 0,
            local_world_size=_int(e, "LOCAL_WORLD_SIZE", 1) or 1,
            node_rank=_int(e, "GROUP_RANK", slurm_node) or 0,
            node_name=e.get("SLURMD_NODENAME") or None,
            num_nodes=_int(e, "SLURM_JOB_NUM_NODES", 1) or 1,
            job_dir=e.get(NURO_JOB_DIR) or None,
            staging_dir=e.get(NURO_STAGING_DIR) or None,
            exit_requeue=_int(e, "NURO_EXIT_REQUEUE", DEFAULT_EXIT_REQUEUE) or DEFAULT_EXIT_REQUEUE,
            preempt_signal=(e.get(NURO_PREEMPT_SIGNAL) or contract.PREEMPT_SIGNAL).removeprefix("SIG"),
            stop_signal=(e.get("NURO_STOP_SIGNAL") or contract.TIME_LIMIT_SIGNAL).removeprefix("SIG"),
            pg_timeout_s=env_seconds(e, NURO_PG_TIMEOUT_S) or DEFAULT_PG_TIMEOUT_S,
        )

    @property
    def is_rank0(self) -> bool:
        """Rank 0 alone writes the job comment (checkpoint record, preemption ack)."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """More than one process: collectives are needed for any decision all ranks must share."""
        return self.world_size > 1

    @property
    def pg_timeout(self) -> timedelta:
        """``pg_timeout_s`` as the ``timedelta`` ``torch.distributed.init_process_group(timeout=...)`` takes."""
        return timedelta(seconds=self.pg_timeout_s)


__all__ = ["DEFAULT_EXIT_REQUEUE", "DEFAULT_PG_TIMEOUT_S", "RunEnv", "RunEnvError"]

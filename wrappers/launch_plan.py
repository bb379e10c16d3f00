"""What ``nuro-launch`` runs on a node, as data (the plan room; ``nuro.wrappers.launch`` runs it): torchrun's argv
and the environment it adds (rendezvous on the allocation's first node, the port and process-group timeout from
``nuro.protocol.contract``), and the node addresses it needs. ``plan_workers`` (``nuro.wrappers.direct``) is the
same for nuro's own worker start.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from nuro.protocol.contract import (
    ENV_RDZV_PORT_BASE,
    ENV_RDZV_PORT_SPAN,
    PG_TIMEOUT_S,
    RDZV_PORT_BASE,
    RDZV_PORT_SPAN,
    rdzv_port,
)
from nuro.protocol.envnames import NURO_LAUNCH_STOP_DIR, NURO_PG_TIMEOUT_S, NURO_RDZV_ADDR, NURO_RDZV_PORT
from nuro.slurm import CliBackend, HostlistError, SlurmError, expand_hostlist, parse_node_addr

log = logging.getLogger("nuro.launch")


class LaunchError(RuntimeError):
    """The launcher cannot start (missing Slurm variables, bad options); the message says what to set."""


@dataclass(frozen=True)
class TorchrunPlan:
    """What the node runs: argv and the environment added to the inherited one. Pure output of ``plan_torchrun``."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    node_id: int
    num_nodes: int


def _need(env: Mapping[str, str], name: str) -> str:
    value = env.get(name)
    if not value:
        raise LaunchError(f"{name} is not set: nuro-launch runs as an srun task inside a Slurm job")
    return value


def plan_torchrun(
    env: Mapping[str, str],
    script: Sequence[str],
    *,
    nproc_per_node: int,
    python: str,
    local_addr: str,
    rdzv_addr: str | None = None,
    error_file: str,
    log_dir: str,
    pg_timeout_s: int = PG_TIMEOUT_S,
    stop_dir: str | None = None,
) -> TorchrunPlan:
    """The torchrun command for this node: a pure function of the Slurm environment and the resolved addresses.

    Args:
        env: the task's environment (``SLURM_JOB_ID``, ``SLURM_STEP_NUM_NODES`` else ``SLURM_JOB_NUM_NODES``,
            ``SLURM_NODEID`` (numbered within the step); optional
            ``NURO_RDZV_ADDR``/``NURO_RDZV_PORT`` exported by the batch script, which resolved the first node).
        script: the training script and its arguments.
        local_addr: this node's address (Slurm's NodeAddr): the address torchrun advertises to its peers.
        rdzv_addr: the first node's address when the env does not carry ``NURO_RDZV_ADDR``.
        error_file: torchrun's own ``TORCHELASTIC_ERROR_FILE`` (the first failure's cause lands there).
        log_dir: where torchrun keeps per-worker error files and stderr copies (read by the classifier).
        pg_timeout_s: process-group/collective timeout for the training (``NURO_PG_TIMEOUT_S``, read by
            ``RunEnv.pg_timeout``) and NCCL's watchdog. gloo's default is 30 min: a frozen peer would hold every
            GPU of the gang that long.
        stop_dir: ``NURO_LAUNCH_STOP_DIR`` for the workers: a PreemptionGuard marks its committed stop there.

    Raises:
        LaunchError: a Slurm variable or the rendezvous address is missing, or ``script`` is empty.
    """
    if not script:
        raise LaunchError("no training script: use nuro-launch [options] -- script.py [args]")
    job_id = int(_need(env, "SLURM_JOB_ID"))
    # the step's nodes, not the job's: a job with hot spares holds more nodes than its step trains on
    num_nodes = int(env.get("SLURM_STEP_NUM_NODES") or _need(env, "SLURM_JOB_NUM_NODES"))
    node_id = int(_need(env, "SLURM_NODEID"))
    addr = env.get(NURO_RDZV_ADDR) or rdzv_addr
    if not addr:
        raise LaunchError("no rendezvous address: export NURO_RDZV_ADDR (the first node's NodeAddr)")
    port = int(
        env.get(NURO_RDZV_PORT)
        or rdzv_port(
            job_id,
            int(env.get(ENV_RDZV_PORT_BASE) or RDZV_PORT_BASE),
            int(env.get(ENV_RDZV_PORT_SPAN) or RDZV_PORT_SPAN),
        )
    )
    argv = (
        python, "-m", "torch.distributed.run",
        f"--nnodes={num_nodes}", f"--node-rank={node_id}", f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={addr}:{port}", f"--rdzv-id={job_id}",
        f"--local-addr={local_addr}",
        "--max-restarts=0",  # Slurm's requeue is the restart: a fresh allocation, a restored checkpoint
        "--monitor-interval=0.5",
        f"--log-dir={log_dir}", "--tee=2",  # workers' stderr also to files: the classifier reads their tracebacks
        *script,
    )  # fmt: skip
    extra = {
        "TORCHELASTIC_ERROR_FILE": error_file,
        NURO_PG_TIMEOUT_S: str(pg_timeout_s),
        # NCCL's watchdog; gloo has no variable: the SDK passes RunEnv.pg_timeout to init_process_group
        "TORCH_NCCL_TIMEOUT": str(pg_timeout_s),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        NURO_RDZV_ADDR: addr,
        NURO_RDZV_PORT: str(port),
        **({NURO_LAUNCH_STOP_DIR: stop_dir} if stop_dir else {}),
    }
    return TorchrunPlan(argv=argv, env=extra, node_id=node_id, num_nodes=num_nodes)


def node_addr(
    name: str, run: Callable[[list[str]], subprocess.CompletedProcess[str]] | None = None, timeout_s: float = 15
) -> str:
    """A node's address, Slurm's NodeAddr (``scontrol show node -o NAME`` through the adapter), else the name itself.

    ``run`` runs one Slurm command (default: ``CliBackend.run``). A Slurm that answered without an address (no such
    node) means the name is the address; one that never answered (no scontrol, a timeout) is worth a warning.
    """
    run = run or CliBackend(timeout_s=timeout_s).run
    try:
        out = run(["scontrol", "show", "node", "-o", name])
    except SlurmError as exc:
        if exc.returncode is None:
            log.warning("scontrol show node %s failed (%s): using the name as the address", name, exc)
        return name
    return parse_node_addr(out.stdout or "") or name


def first_node(env: Mapping[str, str]) -> str | None:
    """The first host of the allocation (``SLURM_JOB_NODELIST`` expanded by ``nuro.slurm.hostlist``), or None
    outside Slurm."""
    try:
        hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST") or "")
    except HostlistError as exc:
        log.warning("unreadable SLURM_JOB_NODELIST (%s): no first node", exc)
        return None
    return hosts[0] if hosts else None


__all__ = ["LaunchError", "TorchrunPlan", "first_node", "node_addr", "plan_torchrun"]

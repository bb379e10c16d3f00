"""The node's training processes started by nuro-launch itself, without torchrun's agent (``--launcher=direct``).

Why: nuro runs torchrun with a static world (``--nnodes=N``, ``--max-restarts=0``: Slurm's requeue is the restart),
so its elastic agent adds nothing but its cost on the resume path: one more Python process that imports all of
torch (~1.5 s of CPU before the first worker even starts) and a c10d rendezvous round before the workers' own.
Measured on the dev cluster (26.05, bench_resume): of the 6 s from a requeued job's allocation to its DDP group, the
agent is about 2 s. Here nuro-launch sets the variables torchrun would have set and starts the workers at once:

- ranks are contiguous per node, ``RANK = SLURM_NODEID × nproc + local rank`` (what the checkpointer assumes);
- ``MASTER_ADDR``/``MASTER_PORT`` are the job's rendezvous address and port (the first node, ``rdzv_port``): rank
  0's ``init_process_group`` (env://) serves the store there, the others connect with the group's timeout;
- ``TORCHELASTIC_ERROR_FILE`` is one file per worker, so ``@record`` (torch.distributed.elastic) still leaves the
  worker's traceback for the classifier; the workers' stderr is copied through (and its tail kept) for the same end;
- when one worker fails, the node's other workers are stopped (TERM, then KILL after ``STOP_GRACE_S``), as torchrun
  does; the other nodes' workers then fail on the lost peer, and srun's ``--kill-on-bad-exit`` ends the step.

What comes out is the same ``Evidence`` the torchrun path gives ``launch_outcome.classify``: one rule set for both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nuro.wrappers.launch_outcome import (
    Evidence,
    WorkerFailure,
    failure_from_error_file,
    last_exception_line,
)
from nuro.wrappers.proctree import forward

#: Seconds the node's other workers get to stop after one failed, before SIGKILL (torchrun waits 30 s; a worker
#: stuck in a collective with a dead peer only ends on KILL, and the requeue waits for this node).
STOP_GRACE_S = 5.0
_POLL_S = 0.1


@dataclass(frozen=True)
class WorkerSpec:
    """One worker: its global and local rank, argv and the variables added to the inherited environment."""

    rank: int
    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    error_file: str


def plan_workers(
    script: Sequence[str],
    *,
    python: str,
    node_id: int,
    num_nodes: int,
    nproc_per_node: int,
    master_addr: str,
    master_port: int,
    job_id: int,
    error_dir: str,
    base_env: Mapping[str, str],
) -> tuple[WorkerSpec, ...]:
    """This node's workers as data (pure): torchrun's variables, contiguous ranks, one error file each.

    ``base_env`` are the variables every worker gets besides its own (the launch plan's: timeouts, stop dir).
    ``OMP_NUM_THREADS=1`` when several workers share the node and the job set none (torchrun's default too).
    """
    world = num_nodes * nproc_per_node
    common = {
        **base_env,
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(nproc_per_node),
        "GROUP_RANK": str(node_id),
        "GROUP_WORLD_SIZE": str(num_nodes),
        "ROLE_NAME": "default",
        "ROLE_WORLD_SIZE": str(world),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": str(job_id),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    if nproc_per_node > 1:
        common.setdefault("OMP_NUM_THREADS", "1")
    out = []
    for local in range(nproc_per_node):
        rank = node_id * nproc_per_node + local
        error_file = str(Path(error_dir) / f"rank-{rank}-error.json")
        env = {**common, "RANK": str(rank), "ROLE_RANK": str(rank), "LOCAL_RANK": str(local),
               "TORCHELASTIC_ERROR_FILE": error_file}  # fmt: skip
        out.append(WorkerSpec(rank, local, (python, "-u", *script), env, error_file))
    return tuple(out)


class Workers:
    """The node's running workers: ``wait(timeout)`` like a Popen (for ``launch.wait_relaying``), ``pids()`` for
    signal forwarding, ``evidence()`` once they are all gone."""

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        env: Mapping[str, str],
        preexec: Callable[[], None] | None,
        tail: Callable[..., object],
    ) -> None:
        self.specs = tuple(specs)
        self.procs: list[subprocess.Popen] = []
        self.tails: list[object] = []
        self.ended: dict[int, tuple[float, int]] = {}  # rank -> (when, status)
        self._stopping_since: float | None = None
        for spec in self.specs:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spec.error_file)  # an earlier attempt's traceback must not be read as this one's
            proc = subprocess.Popen(list(spec.argv), env={**env, **spec.env}, stderr=subprocess.PIPE, text=True,
                                    errors="replace", start_new_session=True, preexec_fn=preexec)  # fmt: skip
            self.procs.append(proc)
            self.tails.append(tail(proc.stderr, sys.stderr))

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    def _reap(self) -> None:
        now = time.monotonic()
        for spec, proc in zip(self.specs, self.procs, strict=True):
            rc = proc.poll()
            if rc is not None and spec.rank not in self.ended:
                self.ended[spec.rank] = (now, rc)
        failed = any(rc != 0 for _, rc in self.ended.values())
        if failed and len(self.ended) < len(self.procs):
            if self._stopping_since is None:
                self._stopping_since = now
                self.signal_all(signal.SIGTERM)
            elif now - self._stopping_since >= STOP_GRACE_S:
                self.signal_all(signal.SIGKILL)

    def signal_all(self, sig: int) -> list[int]:
        """``sig`` to every live worker and its descendants (DataLoader workers); the PIDs signalled."""
        return [pid for root in self.pids() for pid in forward(sig, root, include_root=True)]

    def wait(self, timeout: float | None = None) -> int:
        """Block until every worker ended (0: all finished, 1: one failed, as torchrun's exit); raises
        ``subprocess.TimeoutExpired`` after ``timeout`` like ``Popen.wait``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._reap()
            if len(self.ended) == len(self.procs):
                return 0 if all(rc == 0 for _, rc in self.ended.values()) else 1
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired("nuro-launch workers", timeout or 0.0)
            time.sleep(_POLL_S)

    def evidence(self, rc: int, stop: str | None, stopped: frozenset[int], launcher_tail: str = "") -> Evidence:
        """The failed workers, first to end first (the root cause), each with its error file's message or the last
        exception line of its stderr."""
        failures = []
        texts = {s.rank: t.text() for s, t in zip(self.specs, self.tails, strict=True)}  # type: ignore[attr-defined]
        error_files = {s.rank: s.error_file for s in self.specs}
        for rank, (_, status) in sorted(self.ended.items(), key=lambda kv: kv[1][0]):
            if status == 0:
                continue
            found = None
            with contextlib.suppress(OSError):
                found = failure_from_error_file(Path(error_files[rank]).read_text(errors="replace"), rank)
            text = texts[rank]
            message = found.message if found else (last_exception_line(text) if "Traceback" in text else "")
            failures.append(WorkerFailure(status, message, rank))
        return Evidence(torchrun_rc=rc, failures=tuple(failures), stop_signal=stop,
                        tail=launcher_tail + "".join(texts.values()), stopped_ranks=stopped)  # fmt: skip


__all__ = ["STOP_GRACE_S", "WorkerSpec", "Workers", "plan_workers"]

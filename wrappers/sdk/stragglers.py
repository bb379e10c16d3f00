"""``StragglerWatch``: which rank holds a synchronous job back, measured inside the job, window by window.

Why inside the job: in data-parallel training every rank's *step* takes the same wall time, because the gradient
all-reduce makes the fast ranks wait for the slowest one; step time alone cannot say who is slow (issue 16 item 1).
What differs is how long each rank *waits* in the all-reduce: a straggler arrives last and hardly waits, the others
wait for it. So:

1. ``attach(ddp_model)`` registers a DDP communication hook (torch's own all-reduce, timed) that adds up, per step,
   how long this rank's gradient buckets took from hand-off to result;
2. ``observe(data_wait_s=…)`` at the end of each step turns that into the rank's *busy* time: the step's wall time
   minus its all-reduce wait minus the time it waited for data (a data-wait spike is not a slow GPU);
3. every ``window`` steps the ranks exchange their window's median busy time (one ``all_gather`` of one float, and
   the same call on every rank at the same step), and each rank scores all of them (``slowdowns``: busy time over
   the fastest rank's);
4. a rank at or above ``threshold`` for ``sustain`` windows in a row is a straggler (``StragglerRule``, pure). Rank 0
   records a ``straggler`` run event (rank, node, slowdown; ``nuro-train events`` shows it) once per episode and
   ``straggler_cleared`` when it is back under the threshold for as long; ``fields()`` gives the last window's
   largest slowdown and its rank for the step's ``MetricsLogger.log`` (``straggler_slowdown``, ``straggler_rank``).

The SDK's own per-step collectives (the Checkpointer's "save now?" broadcast, the PreemptionGuard's agreement)
re-synchronise the ranks too, so their waits count as waits (``timed_collective``); a training loop that adds
collectives of its own (a metrics all-reduce) wraps them the same way, or the straggler hides in them.

Noise is not a straggler: a window's median ignores one slow step, and a step that saved a checkpoint can be left
out (``observe(skip=True)``); ``sustain`` windows must agree. Attribution to a GPU is the platform's part: rank 0
reports each flag to its node agent (``nuro-straggler/1``), and the controller drains the flagged node with a
``nuro-straggler:`` reason only when it is this job's node (Slurm) and its own agent's NVML readings show a slowing
clock reason (``slurm_plugins/controller/liveness``); a job's word alone never drains a node.

Acting is opt-in (issue 16 item 2): with ``move=MovePolicy(guard)`` rank 0 weighs each new straggler by cost
(``nuro.policy.straggler_move``: the remaining steps at today's step time against the job's own checkpoint time
plus the restart a move takes), records the decision either way (``straggler_decision`` run event; ``fields()``
gives ``straggler_move`` 1/0 for the metrics), and when moving wins asks the guard for a MOVE stop: every rank
checkpoints at the same step and exits 75, and ``nuro-launch --step`` goes on without that node on a hot spare
(``--spare-nodes``), else the job requeues. Pass ``steps_left`` to ``observe`` so the remaining time is known.

    watch = StragglerWatch(move=MovePolicy(guard, checkpoint_s=ckpt.save_seconds)).attach(ddp_model)
    for step in range(start, steps):
        ...; opt.step()
        watch.observe(data_wait_s=loader.last_wait_s, steps_left=steps - step - 1)
        metrics.log(step, loss=loss.item(), **watch.fields())
        if guard.should_stop(step): guard.checkpoint_and_exit(...)
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from nuro.wrappers.sdk.runenv import env_seconds
from nuro.wrappers.spares import ENV_SPARE_NODES, ENV_SPARES_LEFT

log = logging.getLogger(__name__)

#: Steps per window; the threshold (slowdown over the fastest rank) and the windows in a row that make a straggler.
DEFAULT_WINDOW = 20
DEFAULT_THRESHOLD = 1.2
DEFAULT_SUSTAIN = 2


_waits = [0.0]  # seconds this process spent in timed collectives since the watch last looked


@contextlib.contextmanager
def timed_collective() -> Iterator[None]:
    """Count the time inside as waiting for other ranks (wrap any per-step collective of the training loop)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _waits[0] += time.perf_counter() - t0


def _take_waits() -> float:
    waited, _waits[0] = _waits[0], 0.0
    return waited


def slowdowns(busy: Sequence[float]) -> list[float]:
    """Each rank's busy time over the fastest rank's (1.0 = as fast as the fastest; NaN: no measure this window)."""
    valid = [b for b in busy if math.isfinite(b) and b > 0]
    if not valid:
        return [math.nan] * len(busy)
    fastest = min(valid)
    return [b / fastest if math.isfinite(b) and b > 0 else math.nan for b in busy]


@dataclass
class StragglerRule:
    """Which ranks are stragglers after each window: at or above ``threshold`` for ``sustain`` windows in a row;
    cleared after ``sustain`` windows below. Pure state machine; ``update`` returns what changed."""

    threshold: float = DEFAULT_THRESHOLD
    sustain: int = DEFAULT_SUSTAIN
    _above: dict[int, int] = field(default_factory=dict)
    _below: dict[int, int] = field(default_factory=dict)
    flagged: set[int] = field(default_factory=set)

    def update(self, scores: Sequence[float]) -> tuple[list[int], list[int]]:
        """(newly flagged ranks, newly cleared ranks) after one window's scores."""
        new, cleared = [], []
        for rank, s in enumerate(scores):
            if not math.isfinite(s):
                continue
            if s >= self.threshold:
                self._above[rank] = self._above.get(rank, 0) + 1
                self._below[rank] = 0
                if rank not in self.flagged and self._above[rank] >= self.sustain:
                    self.flagged.add(rank)
                    new.append(rank)
            else:
                self._below[rank] = self._below.get(rank, 0) + 1
                self._above[rank] = 0
                if rank in self.flagged and self._below[rank] >= self.sustain:
                    self.flagged.discard(rank)
                    cleared.append(rank)
        return new, cleared


class MovePolicy:
    """What rank 0 needs to decide a move (``nuro.policy.straggler_move``) and to make it happen (the guard).

    Args:
        guard: the run's ``PreemptionGuard``: a move is its MOVE stop.
        checkpoint_s: the job's own save time, measured (``Checkpointer.save_seconds``) or a number.
        restart_s: what a move's restart costs; default ``NURO_RESTART_COST_S``, else the measured swap
            (``DEFAULT_SWAP_S``) while a hot spare is left (``NURO_SPARES_LEFT``, else ``NURO_SPARE_NODES``), the
            requeue path (``DEFAULT_REQUEUE_S``) without.
        margin: staying must cost this many times the move.
    """

    def __init__(
        self,
        guard: Any,
        *,
        checkpoint_s: Callable[[], float] | float = 0.0,
        restart_s: float | None = None,
        margin: float | None = None,
    ) -> None:
        from nuro.policy import straggler_move as sm  # lazy: only jobs that move pay for it

        self.guard = guard
        self._checkpoint_s = checkpoint_s
        env_cost = env_seconds(os.environ, "NURO_RESTART_COST_S", allow_zero=True, error=ValueError)
        # the spares still left in this step (nuro-launch --step), else the job's: a swap only while one is left
        spares = (os.environ.get(ENV_SPARES_LEFT) or os.environ.get(ENV_SPARE_NODES) or "0").strip()
        default = sm.DEFAULT_SWAP_S if spares.isdigit() and int(spares) > 0 else sm.DEFAULT_REQUEUE_S
        self.restart_s = restart_s if restart_s is not None else (env_cost if env_cost is not None else default)
        self.margin = margin if margin is not None else sm.DEFAULT_MARGIN

    def checkpoint_s(self) -> float:
        value = self._checkpoint_s() if callable(self._checkpoint_s) else self._checkpoint_s
        return float(value) if value and math.isfinite(value) else 0.0

    def decide(self, slowdown: float, remaining_s: float) -> Any:
        from nuro.policy.straggler_move import decide_move  # lazy, as above

        return decide_move(slowdown, remaining_s, self.checkpoint_s(), self.restart_s, self.margin)


def _tell_the_platform(node: str, slowdown: float) -> bool:
    """Report the flag to this node's agent (``nuro-straggler/1``, ``nuro.protocol.peerloss``): the controller
    drains ``node`` with a ``nuro-straggler:`` reason only if it is this job's and its own NVML shows a slowing
    clock reason. Never raises; False outside a Slurm job or without an agent."""
    from nuro.protocol import peerloss  # lazy: only on a flag

    job, here = os.environ.get("SLURM_JOB_ID", ""), os.environ.get("SLURMD_NODENAME", "")
    if not job.isdigit() or not peerloss.is_node_name(here) or not peerloss.is_node_name(node) or not slowdown > 1:
        return False
    return peerloss.send_straggler(peerloss.socket_path(peerloss.socket_dir(os.environ), here), int(job), node,
                                   slowdown)  # fmt: skip


class StragglerWatch:
    """See the module docstring. Every rank makes one and calls ``observe`` once per step (it is a collective every
    ``window`` steps)."""

    def __init__(
        self,
        *,
        window: int = DEFAULT_WINDOW,
        threshold: float = DEFAULT_THRESHOLD,
        sustain: int = DEFAULT_SUSTAIN,
        record: Any = None,
        move: MovePolicy | None = None,
    ) -> None:
        if window < 3:
            raise ValueError(f"window must be at least 3 steps, got {window}")
        self.window = window
        self.rule = StragglerRule(threshold, sustain)
        self._record = record  # run_events.record_later, or a stand-in (tests)
        self.move = move
        self.decision: Any = None  # the last MoveDecision (rank 0, with a MovePolicy)
        self._steps_left: int | None = None
        self._walls: list[float] = []
        self._wait_s = 0.0
        self._last: float | None = None
        self._busy: list[float] = []
        self._calls = 0
        self.nodes: list[str] = []
        self.history: list[list[float]] = []  # every window's slowdowns, by rank

    # -- set-up ---------------------------------------------------------------------------------------------------
    def attach(self, model: Any) -> StragglerWatch:
        """Time ``model``'s (a ``DistributedDataParallel``) gradient all-reduce with torch's default hook."""
        import torch.distributed as dist  # lazy: torch is the optional 'train' extra
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        def hook(state, bucket):  # noqa: ANN001, ANN202 - torch checks the annotations: none is fine, ``Any`` not
            t0 = time.perf_counter()

            def done(fut: Any) -> Any:
                self._wait_s += time.perf_counter() - t0
                return fut.value()

            return default_hooks.allreduce_hook(state, bucket).then(done)

        model.register_comm_hook(state=None, hook=hook)
        names: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(names, os.environ.get("SLURMD_NODENAME") or socket.gethostname())
        self.nodes = [str(n) for n in names]
        return self

    def fields(self) -> dict[str, float]:
        """The last window's largest slowdown and its rank, as ``MetricsLogger.log`` scalars ({} before the first)."""
        last = self.history[-1] if self.history else []
        ranked = [(s, r) for r, s in enumerate(last) if math.isfinite(s)]
        if not ranked:
            return {}
        worst, rank = max(ranked)
        out = {"straggler_slowdown": round(worst, 3), "straggler_rank": float(rank)}
        if self.decision is not None:
            out["straggler_move"] = 1.0 if self.decision.move else 0.0
        return out

    # -- every step ---------------------------------------------------------------------------------------------
    def observe(
        self, data_wait_s: float = 0.0, skip: bool = False, steps_left: int | None = None
    ) -> list[float] | None:
        """End of a step. ``skip``: leave this step out (it saved a checkpoint). ``steps_left``: steps still to run
        (a ``MovePolicy`` weighs a move by them). Every ``window`` calls, the ranks' slowdowns (the same list on every
        rank), else None."""
        now = time.perf_counter()
        waited = self._wait_s + _take_waits()
        self._steps_left = steps_left
        if self._last is not None and not skip:
            self._busy.append(max(0.0, now - self._last - waited - max(0.0, data_wait_s)))
            self._walls.append(now - self._last)
        self._last, self._wait_s = now, 0.0
        self._calls += 1
        if self._calls % self.window:
            return None
        mine = statistics.median(self._busy) if self._busy else math.nan
        self._busy = []
        scores = slowdowns(self._exchange(mine))
        self.history.append(scores)
        self._report(scores)
        _take_waits()
        self._last = time.perf_counter()  # the exchange itself is no step's time
        return scores

    def _exchange(self, mine: float) -> list[float]:
        # lazy: torch is the optional 'train' extra
        import torch
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return [mine]
        out = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.tensor([mine], dtype=torch.float64))
        return [float(t.item()) for t in out]

    def _report(self, scores: list[float]) -> None:
        new, cleared = self.rule.update(scores)
        step_s = statistics.median(self._walls) if self._walls else math.nan  # this window's step time
        self._walls = []
        if os.environ.get("RANK", "0") != "0":
            return
        for rank in new:
            node = self.nodes[rank] if rank < len(self.nodes) else ""
            log.warning("straggler: rank %d on %s is %.2fx the fastest rank", rank, node or "?", scores[rank])
            self._emit("straggler", rank=rank, node_of_rank=node, slowdown=round(scores[rank], 3), window=self.window)
            _tell_the_platform(node, scores[rank])
            if self.move is not None:
                self._decide(rank, node, scores[rank], step_s)
        for rank in cleared:
            node = self.nodes[rank] if rank < len(self.nodes) else ""
            self._emit("straggler_cleared", rank=rank, node_of_rank=node, slowdown=round(scores[rank], 3))

    def _decide(self, rank: int, node: str, slowdown: float, step_s: float) -> None:
        """Rank 0: weigh moving away from ``node`` by cost, record the decision, and ask for the stop if it wins."""
        left = self._steps_left
        remaining = left * step_s if left is not None and math.isfinite(step_s) else 0.0
        self.decision = d = self.move.decide(slowdown, remaining)
        log.warning("straggler decision: %s", d.why)
        self._emit("straggler_decision", rank=rank, node_of_rank=node, steps_left=left, **d.fields())
        if d.move and node:
            self.move.guard.request_move(node)

    def _emit(self, kind: str, **fields: Any) -> None:
        if self._record is None:
            from nuro.lifecycle import run_events  # lazy: boto3 only when there is something to record

            self._record = run_events.record_later
        self._record(kind, **fields)


__all__ = ["MovePolicy", "StragglerRule", "StragglerWatch", "slowdowns", "timed_collective"]

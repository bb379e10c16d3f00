"""PreemptionGuard: every rank stops at the same step, checkpoints, acknowledges, exits "restart me".

Why this shape:

* The controller signals a victim with ``NURO_PREEMPT_SIGNAL`` (USR1, ``scancel --signal=USR1 --full``); the batch
  script forwards ``NURO_STOP_SIGNAL`` (USR2) when the time limit is near; ``nuro-launch`` forwards both to every
  worker. A signal may reach only some ranks, or reach them steps apart, so the signal handler only sets a local
  flag (nothing else is safe in a handler, and NCCL/gloo threads must not be touched there).
* ``should_stop(step)`` is the one place the ranks agree: every ``check_every`` steps all ranks run a one-element
  ``all_reduce(MAX)`` over their flags, so a signal seen by *any* rank stops *all* ranks at the *same* step, which
  is what a consistent sharded checkpoint needs. The decision is sticky: once True it stays True.
* ``checkpoint_and_exit(save_fn, step)``: every rank saves (``save_fn`` returns True once committed), the ranks
  agree that all saves committed (``all_reduce(MIN)``), rank 0 acknowledges through its node agent (the controller
  then requeues at once instead of waiting for the grace backstop), and every rank exits ``NURO_EXIT_REQUEUE`` (75).
  A save that did not commit means no ack (an ack promises a restorable checkpoint): the controller's grace end or
  the batch script requeues the job anyway, and it resumes from the previous committed checkpoint.
* Without a process group (one process, a laptop) the flag is used as is: same API, no collectives (D3).

Example (every rank)::

    guard = PreemptionGuard(check_every=1).start()
    for step in range(start, steps):
        train_step()
        if guard.should_stop(step):
            guard.checkpoint_and_exit(lambda: save_and_wait(model, step), step)   # never returns

Cost of the check, measured with gloo on CPU (2 processes, 2 shared cores): see docs/launch.md.
"""

from __future__ import annotations

import enum
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from nuro.protocol import stopmarkers
from nuro.wrappers.sdk.runenv import RunEnv
from nuro.wrappers.sdk.stragglers import timed_collective

log = logging.getLogger(__name__)


class StopReason(enum.IntEnum):
    """Why a run stops; the integer is what the ranks all_reduce with MAX, so preemption outranks the time limit."""

    NONE = 0
    MOVE = 1  # the job leaves a straggler (``StragglerWatch`` with a ``MovePolicy``): any signal outranks it
    TIME_LIMIT = 2
    PREEMPTED = 3

    @property
    def label(self) -> str:
        """The text recorded in the ack and the logs (``preempted`` / ``time_limit``), as the batch script says."""
        return self.name.lower()


class GuardNotStartedError(RuntimeError):
    """``should_stop``/``checkpoint_and_exit`` called before ``start()``: the signals would have been lost."""


#: ``ack_fn(step, reason, env)``: record that the checkpoint of ``step`` is committed (rank 0 only).
AckFn = Callable[[int, StopReason, RunEnv], object]


def _default_ack(step: int, reason: StopReason, env: RunEnv) -> None:
    """An ack report to this node's agent (``nuro.wrappers.jobchannel.acknowledge_preemption``)."""
    if env.job_id is None:
        return
    from nuro.wrappers.jobchannel import acknowledge_preemption  # only rank 0 inside a Slurm job pays this import

    acknowledge_preemption(step, job_id=int(env.job_id), why=reason.label)


def _signum(name: str) -> signal.Signals:
    try:
        return signal.Signals["SIG" + name.upper().removeprefix("SIG")]
    except KeyError:
        raise ValueError(
            f"unknown signal {name!r} in NURO_PREEMPT_SIGNAL/NURO_STOP_SIGNAL; use a name like USR1"
        ) from None


class PreemptionGuard:
    """Turns stop signals into one agreed stop step for all ranks; see the module docstring for the protocol.

    Args:
        check_every: agree every N steps (all ranks must pass the same step numbers). 1 = every step; the
            collective is tiny (see docs/launch.md for the measured cost), raise it for very short steps.
        env: the run (default ``RunEnv.from_env()``).
        ack_fn: records the ack on rank 0 (default: a progress report to this node's agent).
        exit_fn: how to leave (default ``sys.exit``); tests pass a function that raises.
        process_group: the torch process group to agree over (default: the default group, if initialised).

    Raises:
        ValueError: ``check_every`` < 1 or an unknown signal name in the environment.
    """

    def __init__(
        self,
        *,
        check_every: int = 1,
        env: RunEnv | None = None,
        ack_fn: AckFn | None = None,
        exit_fn: Callable[[int], Any] | None = None,
        process_group: Any = None,
    ) -> None:
        if check_every < 1:
            raise ValueError(f"check_every={check_every}: must be >= 1 (agree every N steps)")
        self.check_every = check_every
        self.env = env or RunEnv.from_env()
        self._ack_fn = ack_fn or _default_ack
        self._exit_fn = exit_fn or sys.exit
        self._group = process_group
        self._signals = {
            _signum(self.env.preempt_signal): StopReason.PREEMPTED,
            _signum(self.env.stop_signal): StopReason.TIME_LIMIT,
        }
        self._local = StopReason.NONE
        self._agreed = StopReason.NONE
        self._move_from: str | None = None
        self._stop_step: int | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._started = False

    # --- signals -----------------------------------------------------------------------------------------------
    def start(self) -> PreemptionGuard:
        """Install the handlers (main thread only, as Python requires); returns self. Call before training starts."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionGuard.start() must run in the main thread (Python delivers signals there)")
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._started = True
        return self

    def close(self) -> None:
        """Restore the previous handlers (tests, or a run that finished)."""
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous.clear()
        self._started = False

    def __enter__(self) -> PreemptionGuard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # A flag only: no logging, no I/O, no collectives inside a signal handler.
        self._local = max(self._local, self._signals.get(signal.Signals(signum), StopReason.NONE))

    def request_stop(self, reason: StopReason = StopReason.PREEMPTED) -> None:
        """Set the local flag without a signal (a controller note, a test). Counts like a signal on this rank."""
        self._local = max(self._local, reason)

    def request_move(self, node: str) -> None:
        """Stop at the next agreed step to go on without ``node`` (a straggler; rank 0's decision, issue 16 item 2).
        The stop checkpoints like a preemption; nuro-launch reads the node from ``NURO_LAUNCH_STOP_DIR`` and the
        batch step swaps it for a hot spare, or the job requeues."""
        self._move_from = node
        self.request_stop(StopReason.MOVE)

    @property
    def local_reason(self) -> StopReason:
        """What this rank has seen so far (not yet agreed)."""
        return self._local

    @property
    def reason(self) -> StopReason:
        """The agreed reason (``NONE`` until ``should_stop`` returned True)."""
        return self._agreed

    @property
    def stop_step(self) -> int | None:
        """The step at which ``should_stop`` first returned True on every rank."""
        return self._stop_step

    # --- agreement ---------------------------------------------------------------------------------------------
    def _dist(self) -> Any | None:
        """``torch.distributed`` when a process group of more than one rank is up, else None (single process)."""
        mod = sys.modules.get("torch.distributed")
        if mod is None:  # torch never imported distributed: nothing to agree with
            return None
        if not (mod.is_available() and mod.is_initialized()) or mod.get_world_size(self._group) <= 1:
            return None
        return mod

    def _reduce(self, dist: Any, value: int, op: str) -> int:
        import torch  # lazy: torch is the optional 'train' extra; only a distributed run gets here

        device = torch.device("cpu")
        if dist.get_backend(self._group) == "nccl":  # NCCL reduces device tensors only
            device = torch.device("cuda", torch.cuda.current_device())
        t = torch.tensor([value], dtype=torch.int32, device=device)
        with timed_collective():  # a per-step sync point: its wait is the straggler watch's evidence too
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op), group=self._group)
            return int(t.item())

    def should_stop(self, step: int) -> bool:
        """True on every rank at the same step once any rank got a stop signal. All ranks must call it each step.

        Every ``check_every``-th step (``step % check_every == 0``) runs one ``all_reduce(MAX)`` of a single int32;
        other steps return the sticky decision without communicating. A dead peer makes the collective raise
        (gloo: "Connection closed by peer") or time out after ``NURO_PG_TIMEOUT_S``: let it propagate, nuro-launch
        classifies it as "restart me".

        Raises:
            GuardNotStartedError: ``start()`` was not called.
        """
        if not self._started:
            raise GuardNotStartedError(
                f"PreemptionGuard.should_stop() called on rank {self.env.rank} before start(): stop signals would be "
                "lost; call guard.start() (or use it as a context manager) before the training loop"
            )
        if self._agreed != StopReason.NONE:
            return True
        if step % self.check_every != 0:
            return False
        dist = self._dist()
        agreed = StopReason(self._reduce(dist, int(self._local), "MAX")) if dist else self._local
        if agreed == StopReason.NONE:
            return False
        self._agreed, self._stop_step = agreed, step
        if self.env.is_rank0:
            log.warning("stop agreed: reason=%s step=%d world=%d job=%s", agreed.label, step, self.env.world_size,
                        self.env.job_id)  # fmt: skip
        return True

    # --- the way out ---------------------------------------------------------------------------------------------
    def checkpoint_and_exit(self, save_fn: Callable[[], object], step: int) -> NoReturn:
        """Save on every rank, agree it committed, ack on rank 0, exit ``NURO_EXIT_REQUEUE`` on every rank.

        Args:
            save_fn: saves this rank's part and returns truthy once the checkpoint is committed, e.g.
                ``def save(): ckpt.save(sd, step, sync=True); return ckpt.wait_committed(step, timeout_s=60)``.
                Falsy or an exception = not committed (logged; no ack, still exit 75: the job restarts from the
                previous committed checkpoint).
            step: the step being saved (the one ``should_stop`` returned True at).
        """
        reason = self._agreed if self._agreed != StopReason.NONE else max(self._local, StopReason.PREEMPTED)
        t0 = time.monotonic()
        try:
            ok = bool(save_fn())
        except Exception:
            log.exception("rank %d: checkpoint of step %d failed; no ack, exiting for requeue", self.env.rank, step)
            ok = False
        dist = self._dist()
        if dist is not None:
            try:
                ok = bool(self._reduce(dist, int(ok), "MIN"))
            except Exception as exc:  # a peer died while saving: its shard is missing, never ack
                log.warning("rank %d: could not agree the checkpoint of step %d committed (%s); no ack",
                            self.env.rank, step, exc)  # fmt: skip
                ok = False
        save_s = time.monotonic() - t0
        if reason == StopReason.MOVE and self.env.is_rank0 and self._move_from:
            stopmarkers.mark_move(
                self._move_from
            )  # before the teardown: the launcher reads it once the workers are gone
        if self.env.is_rank0 and reason != StopReason.MOVE:  # a move is the job's own: no controller awaits an ack
            if ok:
                try:
                    self._ack_fn(step, reason, self.env)
                    log.warning("acked: reason=%s step=%d save_s=%.2f job=%s", reason.label, step, save_s,
                                self.env.job_id)  # fmt: skip
                except Exception as exc:  # the grace backstop still requeues; say so
                    log.warning("ack of step %d failed (%s): the controller requeues at grace end instead", step, exc)
            else:
                log.warning("no ack: the checkpoint of step %d did not commit on every rank (save_s=%.2f)", step,
                            save_s)  # fmt: skip
        if self.env.is_rank0:  # the run's own record of the stop, for `nuro-train events` (never raises)
            from nuro.lifecycle import run_events  # lazy: it pulls in the object store client; only rank 0 at a stop

            run_events.record("preempted", step=step, why=reason.label, acked=ok, save_s=round(save_s, 3))
        stopmarkers.mark_stopped(self.env.rank)  # exiting 75 by the guard's decision, committed or not
        if dist is not None and ok:
            # every rank passed the agreement above, so tearing the group down cannot strand a peer; exiting with a
            # live gloo group aborts the interpreter ("terminate called without an active exception", status -6).
            # Tear down together: without this last collective the other ranks exit while rank 0 is still writing
            # its ack and run event (S3, scontrol), and rank 0 then destroys a group whose peers are gone (seen once
            # in CI: rank 0 ended with SIGABRT after a successful ack, so its node's verdict read "failure 134").
            try:
                self._reduce(dist, 1, "MIN")
            except Exception as exc:
                log.warning("rank %d: final barrier before teardown failed (%s)", self.env.rank, exc)
            try:
                dist.destroy_process_group(self._group)
            except Exception as exc:
                log.warning("rank %d: destroy_process_group failed (%s); exiting anyway", self.env.rank, exc)
        self._exit_fn(self.env.exit_requeue)
        raise SystemExit(self.env.exit_requeue)  # exit_fn returned (a test double): still never fall through


__all__ = ["AckFn", "GuardNotStartedError", "PreemptionGuard", "StopReason"]

"""``MetricsLogger``: loss, throughput and step time of every rank, written to the metrics sink without ever
stalling or failing a training step.

    metrics = MetricsLogger()                      # sink from NURO_METRICS_URL (default: embedded SQLite)
    for step in range(start, steps):
        loss = train_step(batch)
        metrics.log(step, loss=loss.item(), samples=len(batch), lr=sched.get_last_lr()[0])
    metrics.close()                                # bounded flush

What one ``log`` call writes (schema: ``nuro.metrics.model``, measurement ``train``):

| field | meaning |
|---|---|
| ``step`` | the step passed in (int) |
| ``loss`` | the loss passed in, when given |
| ``step_time_s`` | wall time between this call and the previous emitting call, divided by the calls in between |
| ``samples_per_s`` | samples passed since the previous emitting call / that wall time (this rank only) |
| any ``**scalars`` | as floats, e.g. ``lr``, ``grad_norm`` |

Tags: ``team``, ``run``, ``job``, ``restart``, ``rank`` from ``RunEnv`` (a tag whose value is unknown, e.g. the job
id outside Slurm, is left out). The first call after construction has no ``step_time_s``/``samples_per_s``: nothing
says when its step began, and the time since construction would count model set-up and data loading as a step.

Who calls: every rank, in its own training loop, after each optimizer step; no collectives, no synchronisation.
Why non-blocking: points go into a bounded ``BufferedWriter`` whose background thread writes batches to the sink;
when the sink is slow or down the buffer fills and further points are dropped (and counted: the writer reports
written/dropped/errors as ``nuro_metrics`` points tagged ``source=rank<N>``). A sink that cannot even be opened
disables the logger with one warning. Training never waits for, or fails because of, the time-series database.

What does raise: misuse that is visible at the first step — a scalar whose name is not a valid field name
(letters, digits, ``_``, ``.``; so ``loss.val`` rather than ``loss/val``) or that reuses a built-in field name.
Non-finite values (a NaN loss) are not errors: the field is left out of that point and counted in
``stats["nonfinite"]``, because a diverging run is exactly when its other metrics matter.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from nuro.metrics.buffer import BufferedWriter
from nuro.metrics.model import TRAIN, InvalidPoint, Point
from nuro.metrics.sink import sink_from_env
from nuro.wrappers.sdk.runenv import RunEnv

log = logging.getLogger(__name__)

#: Field names the logger computes itself; a scalar may not reuse them.
BUILTIN_FIELDS = ("step", "loss", "step_time_s", "samples_per_s")
DEFAULT_CLOSE_TIMEOUT_S = 5.0
#: close() bound when the interpreter exits without an explicit close().
ATEXIT_CLOSE_S = 2.0


class PointWriter(Protocol):
    """What the logger writes through: ``nuro.metrics.buffer.BufferedWriter`` (or a test double).

    ``add`` must not block; it returns False when the point was dropped. ``close`` flushes for at most
    ``timeout_s`` and then stops the writer.
    """

    def add(self, point: Point) -> bool: ...

    def flush(self, timeout_s: float) -> Any: ...

    def close(self, timeout_s: float) -> Any: ...


def train_tags(env: RunEnv) -> dict[str, str]:
    """The ``train`` tags of this process; unknown values (no team, no job id) are left out, never empty."""
    tags = {
        "team": env.team or "",
        "run": env.run_name or "",
        "job": "" if env.job_id is None else str(env.job_id),
        "restart": str(env.restart_count),
        "rank": str(env.rank),
    }
    return {k: v for k, v in tags.items() if v}


def self_tags(env: RunEnv, node: str) -> dict[str, str]:
    """Tags of the writer's own ``nuro_metrics`` points: ``source=rank<N>``, the node, and the run's ids."""
    tags = {"source": f"rank{env.rank}", "node": node, "team": env.team or "", "run": env.run_name or "",
            "job": "" if env.job_id is None else str(env.job_id)}  # fmt: skip
    return {k: v for k, v in tags.items() if v}


def check_scalar_names(scalars: Mapping[str, object]) -> None:
    """Raise ValueError for a scalar that would clash with a built-in field or is not a valid field name."""
    for name in scalars:
        if name in BUILTIN_FIELDS:
            raise ValueError(f"metrics.log(): {name!r} is computed by MetricsLogger; pass it under another name")
    if scalars:
        try:
            Point(TRAIN, {}, {name: 0.0 for name in scalars}, 0)
        except InvalidPoint as exc:
            raise ValueError(f"metrics.log(): {exc} (e.g. 'loss.val' instead of 'loss/val')") from None


class StepWindow:
    """Step time and throughput since the last emitted point. Pure: time is passed in (monotonic seconds).

    ``observe(now, samples)`` is called once per ``log`` call; ``take(now)`` closes the window when a point is
    emitted and returns ``(step_time_s, samples_per_s)``, each None when unknown.
    """

    def __init__(self) -> None:
        self.start: float | None = None
        self.calls = 0
        self.samples = 0.0
        self.samples_known = True

    def observe(self, samples: float | None) -> None:
        """Count one finished step into the open window."""
        self.calls += 1
        if samples is None:
            self.samples_known = False
        else:
            self.samples += samples

    def take(self, now: float) -> tuple[float | None, float | None]:
        """The window's mean step time and samples/s, then open a new window at ``now``."""
        step_time = samples_per_s = None
        if self.start is not None and self.calls > 0:
            elapsed = now - self.start
            if elapsed > 0:
                step_time = elapsed / self.calls
                if self.samples_known and self.samples > 0:
                    samples_per_s = self.samples / elapsed
        self.start, self.calls, self.samples, self.samples_known = now, 0, 0.0, True
        return step_time, samples_per_s


class MetricsLogger:
    """Per-rank training metrics, buffered and written in the background (module docstring for the contract).

    Args:
        sink: a ``nuro.metrics.sink.MetricsSink``; None = ``sink_from_env()`` (``NURO_METRICS_URL``, default the
            embedded SQLite file; a member's job without a token writes its team's database ``nuro_<team>`` with
            the team's credential from ``NURO_METRICS_CREDENTIALS``, so its ``team`` tag cannot name another
            team's data). A sink the logger opened itself is closed by ``close``.
        env: the run (tags); None = ``RunEnv.from_env()``.
        every_n_steps: emit a point when ``step % every_n_steps == 0``; the calls in between still count towards
            that point's step time and throughput. 1 = every step.
        writer: write through this instead of a new ``BufferedWriter`` (tests, or to share one writer).
        clock: monotonic seconds (step timing); wall_ns: the points' timestamps (Unix ns). Injectable for tests.
    """

    def __init__(
        self,
        sink: Any = None,
        *,
        env: RunEnv | None = None,
        every_n_steps: int = 1,
        writer: PointWriter | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.env = env or RunEnv.from_env()
        self.every_n_steps = every_n_steps
        self.tags = train_tags(self.env)
        self._clock = clock
        self._wall_ns = wall_ns
        self._window = StepWindow()
        self._own_sink = None
        self.nonfinite = 0
        self.emitted = 0
        self.closed = False
        self._writer: PointWriter | None = writer if writer is not None else self._open_writer(sink)
        # A script that ends without close() would lose the last second of points (the writer thread is a daemon).
        atexit.register(self.close, ATEXIT_CLOSE_S)

    def _open_writer(self, sink: Any) -> PointWriter | None:
        """A BufferedWriter over ``sink`` (or the env's sink); None, with one warning, when none can be had."""
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        try:
            if sink is None:
                sink = self._own_sink = sink_from_env()
            return BufferedWriter(sink, self_tags=self_tags(self.env, node))
        except Exception as exc:  # noqa: BLE001 - any failure to open metrics must cost the metrics, not the run
            if self.env.is_rank0:
                log.warning("metrics disabled for this run: cannot open the metrics sink (%s: %s)",
                            type(exc).__name__, exc)  # fmt: skip
            return None

    @property
    def enabled(self) -> bool:
        """Whether points go anywhere (False when the sink could not be opened, or after ``close``)."""
        return self._writer is not None and not self.closed

    def log(self, step: int, loss: float | None = None, samples: float | None = None, **scalars: float) -> bool:
        """Record step ``step`` (call it after every optimizer step); returns whether a point was queued.

        Args:
            step: the global step just finished.
            loss: this rank's loss (anything ``float()`` accepts: a Python float, a 0-d tensor).
            samples: samples this rank processed in this step (for ``samples_per_s``).
            **scalars: more values to record (``lr=…``); names as field names, see the module docstring.

        Never blocks on I/O and never raises for the sink; raises ValueError for a bad scalar name.
        """
        now = self._clock()
        if self._window.start is None:  # first call: open the window (its own step began before we knew)
            self._window.take(now)
        else:
            self._window.observe(samples)
        if step % self.every_n_steps:
            return False
        if scalars:
            check_scalar_names(scalars)
        step_time, samples_per_s = self._window.take(now)
        fields: dict[str, float | int] = {"step": int(step)}
        for name, value in (("loss", loss), ("step_time_s", step_time), ("samples_per_s", samples_per_s),
                            *scalars.items()):  # fmt: skip
            if value is None:
                continue
            v = float(value)
            if math.isfinite(v):
                fields[name] = v
            else:
                self.nonfinite += 1
        if self._writer is None or self.closed:
            return False
        point = Point(TRAIN, self.tags, fields, self._wall_ns())
        self.emitted += 1
        try:
            return bool(self._writer.add(point))
        except Exception as exc:  # noqa: BLE001 - add() is specified not to raise; if it does, keep training
            log.debug("metrics point dropped: %s", exc)
            return False

    @property
    def stats(self) -> dict[str, Any]:
        """The writer's counters (written, dropped, buffered, errors) plus ``emitted`` and ``nonfinite``."""
        base: dict[str, Any] = {}
        writer_stats = getattr(self._writer, "stats", None)
        if writer_stats is not None:
            base = dict(writer_stats if isinstance(writer_stats, Mapping) else vars(writer_stats))
        return {**base, "emitted": self.emitted, "nonfinite": self.nonfinite}

    def close(self, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Flush what is buffered (at most ``timeout_s``), stop the writer, close a sink we opened. Idempotent.

        What cannot be written within the bound is dropped: a finished run must not hang on a dead database.
        """
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        if self._writer is None:
            return
        try:
            self._writer.close(timeout_s)  # flushes for at most timeout_s, then counts the rest as dropped
        except Exception as exc:  # noqa: BLE001
            log.warning("metrics writer close failed: %s", exc)
        if self._own_sink is not None:
            try:
                self._own_sink.close()
            except Exception as exc:  # noqa: BLE001
                log.debug("metrics sink close failed: %s", exc)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BUILTIN_FIELDS", "MetricsLogger", "PointWriter", "StepWindow", "check_scalar_names", "self_tags",
           "train_tags"]  # fmt: skip

"""``BufferedWriter``: the one path from a training loop (or the node agent) to a sink.

Contract: training never blocks or crashes because the TSDB is slow or down. ``add`` only appends to a bounded
in-memory queue (a lock held for microseconds, no I/O); a background thread writes batches. What happens when:

=========================  =========================================================================================
situation                  behaviour
=========================  =========================================================================================
sink slow / down (5xx,     the batch in flight is retried with exponential back-off (``retry_initial_s`` doubling up
refused, timeout)          to ``retry_max_s``); new points queue behind it, order kept; nothing is lost that fits
buffer full                ``add`` returns False and counts the point in ``dropped`` (newest are dropped: the queued
                           points are older and already promised)
sink rejects (4xx)         the batch is split in halves until the refused points are found; those are counted in
                           ``errors`` and dropped, the rest written; never retried forever
``close``                  flushes for up to ``timeout_s``; whatever could not be written is counted as dropped
=========================  =========================================================================================

Self-reporting: every flush that changed a counter also writes one ``nuro_metrics`` point (fields written, dropped,
buffered, errors; tags ``self_tags``). It is not queued with the data: only the newest one is kept, and it goes out
with the first successful write, so drops during an outage show up once the sink is back.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from nuro.metrics.base import ENV_URL, MetricsSink, SinkUnavailable
from nuro.metrics.model import SELF, Point
from nuro.metrics.sink import sink_from_env

log = logging.getLogger(__name__)


class BufferedWriter:
    """Bounded, ordered, non-blocking writer in front of a ``MetricsSink``.

    Args:
        sink: where batches go; its ``close`` is not called (the caller owns it).
        capacity: points held at most (queued + in flight); beyond that ``add`` drops.
        batch: points per ``sink.write`` call; a full batch wakes the writer before ``flush_interval_s``.
        flush_interval_s: the longest a point waits in the queue while the sink is healthy.
        self_tags: tags of the ``nuro_metrics`` self-report (``source``, ``node``, and ``team/run/job`` for a run).
        clock: wall clock in seconds (timestamps of self-reports); tests pass a fake one.
        retry_initial_s, retry_max_s: back-off on ``SinkUnavailable``: first wait, then doubling up to the cap.
    """

    def __init__(
        self,
        sink: MetricsSink,
        *,
        capacity: int = 100_000,
        batch: int = 5_000,
        flush_interval_s: float = 1.0,
        self_tags: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.time,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 15.0,
    ) -> None:
        if capacity < 1 or batch < 1:
            raise ValueError(f"capacity ({capacity}) and batch ({batch}) must be at least 1")
        if flush_interval_s <= 0 or retry_initial_s <= 0 or retry_max_s < retry_initial_s:
            raise ValueError(
                f"need flush_interval_s > 0 and 0 < retry_initial_s <= retry_max_s, got {flush_interval_s}, "
                f"{retry_initial_s}, {retry_max_s}"
            )
        self.sink = sink
        self.capacity = capacity
        self.batch = batch
        self.flush_interval_s = flush_interval_s
        self.self_tags = dict(self_tags or {})
        self.clock = clock
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s

        self._cv = threading.Condition(threading.Lock())
        self._queue: collections.deque[Point] = collections.deque()
        self._inflight: collections.deque[list[Point]] = collections.deque()  # chunks, in order
        self._inflight_n = 0
        self._written = self._dropped = self._errors = self._retries = 0
        self._reported = (0, 0, 0)  # (written, dropped, errors) at the last self-report: idle = silent
        self._pending_self: Point | None = None
        self._flush_requested = 0  # generation counters: flush() waits until done >= its request
        self._flush_done = 0
        self._closing = False
        self._pid = os.getpid()
        self._close_deadline = float("inf")  # monotonic
        self._stop = threading.Event()  # wakes the back-off sleep when close() starts
        self._thread = threading.Thread(target=self._run, name=f"nuro-metrics-writer {sink.name}", daemon=True)
        self._thread.start()

    # -- caller side --------------------------------------------------------------------------------------------
    def add(self, point: Point) -> bool:
        """Queue one point; never blocks on I/O. False = dropped (buffer full, writer closed, or called in a forked
        child, e.g. a DataLoader worker: the writer thread and the sink's connections stay with the parent, so a
        child must make its own writer), counted in stats."""
        if self._pid != os.getpid():  # checked before the lock: the parent's writer thread may hold it at fork
            self._dropped += 1
            return False
        with self._cv:
            if self._closing or len(self._queue) + self._inflight_n >= self.capacity:
                self._dropped += 1
                return False
            self._queue.append(point)
            if len(self._queue) == self.batch:
                self._cv.notify_all()
            return True

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Ask the writer to write everything queued now; True when it all reached the sink within ``timeout_s``.

        Points the sink rejected count as handled (they are in ``errors``). Blocks the caller up to ``timeout_s``,
        so call it at a checkpoint or the end of a run, not every step.
        """
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._flush_requested += 1
            want = self._flush_requested
            self._cv.notify_all()
            while True:
                # Cycles started after this request drain everything queued before it (see _run/_cycle).
                if self._flush_done >= want:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cv.wait(left)

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush for up to ``timeout_s``, then stop the thread; points still unwritten are counted as dropped.

        A write already in progress may add up to the sink's own request timeout. Idempotent.
        """
        with self._cv:
            if self._closing:
                already = True
            else:
                already = False
                self._closing = True
                self._close_deadline = time.monotonic() + timeout_s
                self._cv.notify_all()
        if not already:
            self._stop.set()
        self._thread.join()

    @property
    def stats(self) -> dict[str, int]:
        """Cumulative counts: written, dropped, buffered (now), errors (points rejected), retries (failed writes)."""
        with self._cv:
            return {
                "written": self._written,
                "dropped": self._dropped,
                "buffered": len(self._queue) + self._inflight_n,
                "errors": self._errors,
                "retries": self._retries,
            }

    # -- writer thread ------------------------------------------------------------------------------------------
    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval_s
        while True:
            with self._cv:
                while not (
                    self._closing
                    or self._flush_requested > self._flush_done
                    or len(self._queue) >= self.batch
                    or time.monotonic() >= next_flush
                ):
                    self._cv.wait(max(0.0, next_flush - time.monotonic()))
                closing = self._closing
                generation = self._flush_requested
            complete = self._safe_cycle()
            next_flush = time.monotonic() + self.flush_interval_s
            with self._cv:
                if complete:
                    self._flush_done = max(self._flush_done, generation)
                self._cv.notify_all()
            if closing:
                # add() refuses points now, so this ends: empty, or the close deadline passed.
                while (self._queue or self._inflight_n) and not self._past_deadline():
                    self._safe_cycle()
                with self._cv:
                    if not self._queue and not self._inflight_n:
                        self._flush_done = self._flush_requested
                self._abandon()
                return

    def _safe_cycle(self) -> bool:
        try:
            return self._cycle()
        except Exception:  # a sink bug must not kill the writer (or training): count, log, carry on
            log.exception("metrics writer %s: unexpected error; in-flight points dropped", self.sink.name)
            with self._cv:
                self._errors += self._inflight_n
                self._inflight.clear()
                self._inflight_n = 0
            return True

    def _past_deadline(self) -> bool:
        return self._closing and time.monotonic() >= self._close_deadline

    def _abandon(self) -> None:
        """At close: whatever is still held is lost; count it so the numbers add up."""
        with self._cv:
            lost = len(self._queue) + self._inflight_n
            if lost:
                log.warning("metrics writer %s closed with %d points unwritten (counted as dropped)", self.sink.name,
                            lost)  # fmt: skip
            self._dropped += lost
            self._queue.clear()
            self._inflight.clear()
            self._inflight_n = 0
            self._cv.notify_all()

    def _cycle(self) -> bool:
        """Write what was queued at the start of the cycle, then the self-report. False = gave up (closing)."""
        with self._cv:
            todo = len(self._queue)
        while todo > 0 or self._inflight_n:
            with self._cv:
                if not self._inflight:
                    n = min(self.batch, len(self._queue))
                    if n == 0:
                        break
                    chunk = [self._queue.popleft() for _ in range(n)]
                    self._inflight.append(chunk)
                    self._inflight_n += n
                    todo -= n
            if not self._drain_inflight():
                return False
        self._self_report()
        return True

    def _drain_inflight(self) -> bool:
        """Write the in-flight chunks in order, backing off on outages. False = close deadline passed."""
        delay = self.retry_initial_s
        while self._inflight:
            chunk = self._inflight[0]
            extra = [self._pending_self] if self._pending_self is not None else []
            try:
                self.sink.write(chunk + extra)
            except SinkUnavailable as exc:
                with self._cv:
                    self._retries += 1
                log.warning("metrics sink %s unavailable (%s); retrying %d points in %.1f s", self.sink.name, exc,
                            len(chunk), delay)  # fmt: skip
                if not self._sleep(delay):
                    return False
                delay = min(delay * 2, self.retry_max_s)
                continue
            except Exception as exc:  # SinkRejected, or any other refusal: find the bad points, never loop
                if extra:  # the self-report is not the culprit's responsibility: send it on its own later
                    self._pending_self = None
                    self._self_report_only()
                    continue
                with self._cv:
                    self._inflight.popleft()
                    if len(chunk) == 1:
                        self._errors += 1
                        self._inflight_n -= 1
                        log.warning("metrics sink %s rejected a %s point: %s", self.sink.name,
                                    chunk[0].measurement, exc)  # fmt: skip
                    else:
                        mid = len(chunk) // 2
                        self._inflight.appendleft(chunk[mid:])
                        self._inflight.appendleft(chunk[:mid])
                continue
            with self._cv:
                self._inflight.popleft()
                self._inflight_n -= len(chunk)
                self._written += len(chunk)
                if extra:
                    self._pending_self = None
            delay = self.retry_initial_s
        return True

    def _sleep(self, delay: float) -> bool:
        """Back-off sleep; close() cuts it short once. False = the close deadline has passed."""
        if self._closing:
            left = self._close_deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            return time.monotonic() < self._close_deadline
        self._stop.wait(delay)
        return not self._past_deadline()

    def _make_self_point(self) -> Point | None:  # None = nothing changed since the last one
        with self._cv:
            now = (self._written, self._dropped, self._errors)
            if now == self._reported:
                return None
            self._reported = now
            fields = {"written": now[0], "dropped": now[1], "buffered": len(self._queue) + self._inflight_n,
                      "errors": now[2]}  # fmt: skip
        return Point(SELF, self.self_tags, fields, int(self.clock() * 1e9))

    def _self_report(self) -> None:
        """Queue the newest self-report; it is sent now if the sink answers, else with the next data batch."""
        point = self._make_self_point()
        if point is not None:
            self._pending_self = point
        self._self_report_only()

    def _self_report_only(self) -> None:
        point = self._pending_self
        if point is None:
            return
        try:
            self.sink.write([point])
        except SinkUnavailable:
            return  # kept in _pending_self; goes out with the next successful batch
        except Exception as exc:
            log.warning("metrics sink %s rejected the self-report: %s", self.sink.name, exc)
        self._pending_self = None

    def __enter__(self) -> BufferedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def writer_from_env(self_tags: Mapping[str, str], what: str) -> BufferedWriter | None:
    """A ``BufferedWriter`` to ``$NURO_METRICS_URL``'s sink, or None: when the environment names no sink (only an
    explicit URL turns a daemon's telemetry on; the SQLite default would silently fill a file on every node), or
    when it cannot be opened (logged as ``<what> off``; the daemon's real work goes on without it)."""
    url = os.environ.get(ENV_URL, "").strip()
    if not url:
        return None
    try:
        return BufferedWriter(sink_from_env(), self_tags=self_tags)
    except Exception as exc:  # noqa: BLE001 - telemetry is optional; the caller must start anyway
        log.warning("%s off: cannot open the metrics sink %s (%s)", what, url, exc)
        return None


def write_all(sink: MetricsSink, points: Sequence[Point], batch: int = 5_000) -> None:
    """Unbuffered helper for tools and benches: write ``points`` in batches, errors propagate."""
    for i in range(0, len(points), batch):
        sink.write(points[i : i + batch])

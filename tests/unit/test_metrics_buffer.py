"""BufferedWriter against in-memory fake sinks (pure: no I/O): order, back-off, capacity, rejection, close/flush."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from nuro.metrics.buffer import BufferedWriter
from nuro.metrics.model import SELF, TRAIN, Point, Query, Row
from nuro.metrics.sink import SinkRejected, SinkUnavailable


def pt(i: int, **fields: float) -> Point:
    return Point(TRAIN, {"run": "r1", "rank": "0"}, {"step": i, **fields}, 1_000_000_000 + i)


class FakeSink:
    """Records what it stores; can be switched down (SinkUnavailable) and refuses points whose loss < 0."""

    name = "fake"

    def __init__(self) -> None:
        self.stored: list[Point] = []
        self.calls: list[tuple[float, int]] = []  # (monotonic time, batch size) of every write attempt
        self.down = False
        self.lock = threading.Lock()

    def write(self, points: Sequence[Point]) -> None:
        with self.lock:
            self.calls.append((time.monotonic(), len(points)))
            if self.down:
                raise SinkUnavailable("fake http://x: connection refused")
            if any(p.fields.get("loss", 0) < 0 for p in points):
                raise SinkRejected("fake http://x: 400 field type conflict")
            self.stored.extend(points)

    def query(self, q: Query) -> list[Row]:
        return []

    def close(self) -> None:
        pass

    def data(self) -> list[Point]:
        with self.lock:
            return [p for p in self.stored if p.measurement != SELF]

    def selfs(self) -> list[Point]:
        with self.lock:
            return [p for p in self.stored if p.measurement == SELF]


def test_writes_everything_in_order_in_batches() -> None:
    sink = FakeSink()
    w = BufferedWriter(sink, batch=100, flush_interval_s=0.05, self_tags={"source": "rank0"})
    for i in range(1050):
        assert w.add(pt(i))
    assert w.flush(5)
    w.close()
    assert [p.fields["step"] for p in sink.data()] == list(range(1050))
    assert max(n for _, n in sink.calls) <= 101  # a batch, plus at most the self-report
    assert w.stats == {"written": 1050, "dropped": 0, "buffered": 0, "errors": 0, "retries": 0}
    last = sink.selfs()[-1]
    assert last.tags == {"source": "rank0"} and last.fields["written"] == 1050 and last.fields["dropped"] == 0


class BlockingSink(FakeSink):
    """A sink whose write hangs until released: what a stalled InfluxDB looks like from the writer thread."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, points: Sequence[Point]) -> None:
        self.entered.set()
        assert self.release.wait(60), "never released"
        super().write(points)


def test_add_does_not_wait_for_a_write_in_progress() -> None:
    """The proof is structural, not a stopwatch: the sink's write is stuck until the adds are done, so an add that
    waited for the write (a lock held across I/O) would never return and the watchdog join would give up."""
    sink = BlockingSink()
    w = BufferedWriter(sink, capacity=100, batch=10, flush_interval_s=0.01)
    for i in range(10):
        w.add(pt(i))
    assert sink.entered.wait(10), "the writer never started a write"
    results: list[bool] = []
    adder = threading.Thread(target=lambda: results.extend(w.add(pt(i)) for i in range(10, 500)))
    adder.start()
    adder.join(30)
    hung = adder.is_alive()
    sink.release.set()
    adder.join()
    assert not hung, "add() waited for the sink's write"
    # 10 in flight + 90 queued fill the capacity of 100; the rest are refused at once, counted
    assert results.count(True) == 90 and results.count(False) == 400 and w.stats["dropped"] == 400
    assert w.flush(10)
    w.close()
    assert [p.fields["step"] for p in sink.data()] == list(range(100))


def test_outage_backs_off_exponentially_to_the_cap_and_loses_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    real_sleep = BufferedWriter._sleep

    def recording_sleep(self: BufferedWriter, delay: float) -> bool:
        sleeps.append(delay)
        return real_sleep(self, 0.001)

    monkeypatch.setattr(BufferedWriter, "_sleep", recording_sleep)
    sink = FakeSink()
    sink.down = True
    w = BufferedWriter(sink, batch=10, flush_interval_s=0.01, retry_initial_s=0.02, retry_max_s=0.16)
    for i in range(500):
        assert w.add(pt(i))
    wait_for(lambda: len(sleeps) >= 7)
    sink.down = False
    assert w.flush(5)
    w.close()
    assert sleeps[:7] == [0.02, 0.04, 0.08, 0.16, 0.16, 0.16, 0.16]  # doubles up to the cap, never beyond
    assert w.stats["retries"] == len(sleeps)  # every failed write is followed by its back-off: no busy loop
    assert [p.fields["step"] for p in sink.data()] == list(range(500))  # nothing lost, order kept
    assert w.stats["dropped"] == 0


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_full_buffer_drops_and_the_self_report_shows_it_once_back() -> None:
    sink = FakeSink()
    sink.down = True
    w = BufferedWriter(sink, capacity=100, batch=10, flush_interval_s=0.01, retry_initial_s=0.01, retry_max_s=0.02,
                       self_tags={"source": "agent", "node": "gpu001"})  # fmt: skip
    accepted = [w.add(pt(i)) for i in range(150)]
    assert accepted.count(True) == 100 and accepted[100:] == [False] * 50
    assert w.stats["dropped"] == 50 and w.stats["buffered"] == 100
    assert sink.selfs() == []
    sink.down = False
    assert w.flush(5)
    w.close()
    assert [p.fields["step"] for p in sink.data()] == list(range(100))
    last = sink.selfs()[-1]
    assert last.fields == {"written": 100, "dropped": 50, "buffered": 0, "errors": 0}
    assert last.tags == {"source": "agent", "node": "gpu001"}


def test_rejected_points_are_counted_and_dropped_the_rest_written() -> None:
    sink = FakeSink()
    w = BufferedWriter(sink, batch=64, flush_interval_s=0.01)
    bad = {5, 40, 41}
    for i in range(64):
        w.add(pt(i, loss=-1.0 if i in bad else 0.5))
    assert w.flush(5)
    w.close()
    assert [p.fields["step"] for p in sink.data()] == [i for i in range(64) if i not in bad]
    assert w.stats["errors"] == 3 and w.stats["written"] == 61
    assert len(sink.calls) < 40  # bisection, not one write per point


def test_close_gives_up_at_its_timeout_and_counts_the_rest_as_dropped() -> None:
    sink = FakeSink()
    sink.down = True
    w = BufferedWriter(sink, batch=10, flush_interval_s=0.01, retry_initial_s=0.05, retry_max_s=0.05)
    for i in range(30):
        w.add(pt(i))
    assert w.flush(0.2) is False
    t0 = time.monotonic()
    w.close(timeout_s=0.3)
    assert time.monotonic() - t0 < 10  # gave up at its timeout: retrying forever (the bug) never returns
    assert w.stats == {"written": 0, "dropped": 30, "buffered": 0, "errors": 0, "retries": w.stats["retries"]}
    assert w.add(pt(99)) is False  # closed: refused, counted
    w.close()  # idempotent


def test_close_flushes_what_is_queued() -> None:
    sink = FakeSink()
    w = BufferedWriter(sink, batch=1000, flush_interval_s=60)
    for i in range(10):
        w.add(pt(i))
    w.close()
    assert len(sink.data()) == 10 and w.stats["written"] == 10


def test_a_sink_bug_does_not_kill_the_writer() -> None:
    class Buggy(FakeSink):
        def write(self, points: Sequence[Point]) -> None:
            if any(p.fields["step"] == 3 for p in points):
                raise KeyError("bug")
            super().write(points)

    sink = Buggy()
    w = BufferedWriter(sink, batch=4, flush_interval_s=0.01)
    for i in range(8):
        w.add(pt(i))
    assert w.flush(5)
    w.add(pt(8))
    assert w.flush(5)
    w.close()
    assert [p.fields["step"] for p in sink.data()] == [0, 1, 2, 4, 5, 6, 7, 8]
    assert w.stats["errors"] == 1


def test_idle_writer_sends_no_self_reports() -> None:
    sink = FakeSink()
    w = BufferedWriter(sink, flush_interval_s=0.01)
    time.sleep(0.1)
    w.close()
    assert sink.calls == []


@pytest.mark.parametrize("kw", [{"capacity": 0}, {"batch": 0}, {"flush_interval_s": 0}, {"retry_max_s": 0.1}])
def test_bad_settings_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        BufferedWriter(FakeSink(), **kw)


def test_flush_returns_under_sustained_adds_from_another_thread() -> None:
    sink = FakeSink()
    w = BufferedWriter(sink, batch=50, flush_interval_s=0.01)
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set():
            w.add(pt(i))
            i += 1
            time.sleep(0.0001)

    t = threading.Thread(target=produce)
    t.start()
    time.sleep(0.1)
    before = w.stats["written"] + w.stats["buffered"]
    assert w.flush(5)  # everything queued before the call is written, though the queue never empties
    assert w.stats["written"] >= before
    stop.set()
    t.join()
    w.close()
    steps = [p.fields["step"] for p in sink.data()]
    assert steps == list(range(len(steps)))


def test_a_forked_child_does_not_queue_into_the_parents_writer() -> None:
    import os

    sink = FakeSink()
    w = BufferedWriter(sink, flush_interval_s=0.01)
    pid = os.fork()
    if pid == 0:  # child: no writer thread here; add must refuse instead of queueing forever
        os._exit(0 if w.add(pt(1)) is False and w._dropped == 1 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert w.add(pt(2)) and w.flush(5)
    w.close()
    assert [p.fields["step"] for p in sink.data()] == [2]

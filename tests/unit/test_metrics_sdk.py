"""MetricsLogger with a fake clock and an in-memory writer: step time, throughput, tags, every_n_steps, NaN, misuse,
and that a sink that cannot be opened disables metrics instead of failing training."""

from __future__ import annotations

import pytest

from nuro.metrics.model import TRAIN, Point
from nuro.wrappers.sdk.metrics import MetricsLogger, StepWindow, train_tags
from nuro.wrappers.sdk.runenv import RunEnv

ENV = RunEnv(team="vision", run_name="resnet", job_id=4711, restart_count=2, rank=3, world_size=4)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class MemoryWriter:
    """Keeps what ``add`` got; ``full`` imitates a buffer that drops."""

    def __init__(self) -> None:
        self.points: list[Point] = []
        self.full = False
        self.flushed: list[float] = []  # close() timeouts
        self.closed = False
        self.stats = {"written": 0, "dropped": 0, "buffered": 0, "errors": 0}

    def add(self, point: Point) -> bool:
        if self.full:
            self.stats["dropped"] += 1
            return False
        self.points.append(point)
        return True

    def flush(self, timeout_s: float) -> bool:
        return True

    def close(self, timeout_s: float) -> None:
        self.flushed.append(timeout_s)
        self.closed = True


def make(every: int = 1, env: RunEnv = ENV) -> tuple[MetricsLogger, MemoryWriter, FakeClock]:
    w, c = MemoryWriter(), FakeClock()
    return MetricsLogger(env=env, every_n_steps=every, writer=w, clock=c, wall_ns=lambda: int(c.t * 1e9)), w, c


def test_step_time_and_throughput_between_calls() -> None:
    m, w, clock = make()
    m.log(0, loss=2.0, samples=64)
    clock.t += 0.5
    m.log(1, loss=1.5, samples=64)
    clock.t += 0.25
    m.log(2, loss=1.0, samples=32)
    first, second, third = (p.fields for p in w.points)
    assert first == {"step": 0, "loss": 2.0}  # nothing says when step 0 began
    assert second == {"step": 1, "loss": 1.5, "step_time_s": 0.5, "samples_per_s": 128.0}
    assert third == {"step": 2, "loss": 1.0, "step_time_s": 0.25, "samples_per_s": 128.0}
    assert all(p.measurement == TRAIN for p in w.points)
    assert w.points[1].ts_ns == int(100.5 * 1e9)


def test_tags_come_from_the_run_env() -> None:
    m, w, _ = make()
    m.log(0, loss=1.0)
    assert dict(w.points[0].tags) == {"team": "vision", "run": "resnet", "job": "4711", "restart": "2", "rank": "3"}
    assert train_tags(RunEnv()) == {"restart": "0", "rank": "0"}  # outside Slurm: no empty tag values


def test_every_n_steps_averages_over_the_skipped_calls() -> None:
    m, w, clock = make(every=10)
    for step in range(0, 21):
        m.log(step, loss=float(step), samples=10)
        clock.t += 0.1
    assert [p.fields["step"] for p in w.points] == [0, 10, 20]
    assert w.points[1].fields["step_time_s"] == pytest.approx(0.1)
    assert w.points[1].fields["samples_per_s"] == pytest.approx(100.0)


def test_resume_mid_interval_opens_the_window_at_the_first_call() -> None:
    m, w, clock = make(every=10)
    for step in range(105, 111):
        m.log(step, samples=8)
        clock.t += 0.2
    assert [p.fields["step"] for p in w.points] == [110]
    # 5 steps (106..110) in 1.0 s: the first call (105) only opened the window
    assert w.points[0].fields["step_time_s"] == pytest.approx(0.2)
    assert w.points[0].fields["samples_per_s"] == pytest.approx(40.0)


def test_throughput_is_left_out_when_a_step_did_not_say_its_samples() -> None:
    m, w, clock = make(every=2)
    m.log(0, samples=4)
    clock.t += 1
    m.log(1)
    clock.t += 1
    m.log(2, samples=4)
    assert w.points[-1].fields == {"step": 2, "step_time_s": 1.0}


def test_nan_loss_is_left_out_and_counted_not_raised() -> None:
    m, w, _ = make()
    assert m.log(0, loss=float("nan"), grad_norm=float("inf"), lr=0.1)
    assert w.points[0].fields == {"step": 0, "lr": 0.1}
    assert m.stats["nonfinite"] == 2


def test_custom_scalars_and_tensor_like_values() -> None:
    class Scalar:  # a 0-d tensor as far as float() is concerned
        def __float__(self) -> float:
            return 0.25

    m, w, _ = make()
    m.log(0, loss=Scalar(), lr=1e-3, tokens=512)  # type: ignore[arg-type]
    assert w.points[0].fields == {"step": 0, "loss": 0.25, "lr": 1e-3, "tokens": 512.0}


@pytest.mark.parametrize("name", ["loss/val", "step_time_s", "9lives"])
def test_bad_scalar_names_raise_at_the_first_step(name: str) -> None:
    m, _, _ = make()
    with pytest.raises(ValueError, match="metrics.log"):
        m.log(0, **{name: 1.0})


def test_a_full_buffer_drops_without_blocking_or_raising() -> None:
    m, w, _ = make()
    w.full = True
    assert m.log(0, loss=1.0) is False
    assert m.stats["dropped"] == 1 and m.stats["emitted"] == 1


def test_close_flushes_with_a_bound_and_is_idempotent() -> None:
    m, w, _ = make()
    m.log(0, loss=1.0)
    m.close(timeout_s=2.5)
    m.close()
    assert w.flushed == [2.5] and w.closed
    assert m.log(1, loss=1.0) is False and not m.enabled


def test_an_unopenable_sink_disables_metrics_instead_of_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "nuro.metrics.buffer", None)  # import fails like a broken install
    m = MetricsLogger(sink=object(), env=ENV)
    assert not m.enabled
    assert m.log(0, loss=1.0) is False
    m.close()


def test_window_is_pure() -> None:
    w = StepWindow()
    assert w.take(10.0) == (None, None)
    w.observe(6)
    w.observe(6)
    assert w.take(13.0) == (1.5, 4.0)
    assert w.take(13.0) == (None, None)  # no calls in between: unknown, not zero


class MemorySink:
    """An in-memory MetricsSink: what the real BufferedWriter hands it is kept in order."""

    name = "memory"

    def __init__(self) -> None:
        self.points: list[Point] = []

    def write(self, points) -> None:  # noqa: ANN001
        self.points.extend(points)

    def query(self, q):  # noqa: ANN001, ANN201
        raise NotImplementedError

    def close(self) -> None:
        pass


def test_through_the_real_buffered_writer_with_its_self_report() -> None:
    sink = MemorySink()
    m = MetricsLogger(sink, env=ENV)
    for step in range(5):
        m.log(step, loss=1.0 / (step + 1), samples=8)
    m.close(timeout_s=5)
    train = [p for p in sink.points if p.measurement == TRAIN]
    assert [p.fields["step"] for p in train] == [0, 1, 2, 3, 4]
    selfs = [p for p in sink.points if p.measurement == "nuro_metrics"]
    assert selfs and selfs[-1].tags["source"] == "rank3" and selfs[-1].tags["job"] == "4711"
    assert selfs[-1].fields["dropped"] == 0

"""The node agent's GPU telemetry: report → ``gpu`` points (pure), queued once per probe, never in the beat path."""

from __future__ import annotations

import threading

from nuro.healthcheck.agent import Agent, AgentConfig
from nuro.healthcheck.beats import gpu_points
from nuro.healthcheck.probes import FakeProbe, GpuStatus, NodeGpuReport
from nuro.healthcheck.run import HealthSettings
from nuro.metrics.model import GPU, Point
from tests.unit.test_nodeagent import KEY, FakeSocket


class MemoryWriter:
    def __init__(self) -> None:
        self.points: list[Point] = []
        self.closed_with: float | None = None

    def add(self, point: Point) -> bool:
        self.points.append(point)
        return True

    def close(self, timeout_s: float) -> None:
        self.closed_with = timeout_s


def test_points_carry_every_read_value_as_floats() -> None:
    gpu = GpuStatus(index=3, uuid="GPU-abc", name="NVIDIA H100 80GB HBM3", utilization_pct=97,
                    memory_used_bytes=70 << 30, memory_total_bytes=80 << 30, temperature_c=71, sm_clock_mhz=1980,
                    power_w=612.5)  # fmt: skip
    [p] = gpu_points(NodeGpuReport(probe="nvml", gpus=(gpu,), taken_at=1700000000.5), "gpu007")
    assert p.measurement == GPU and p.ts_ns == 1700000000500000000
    assert dict(p.tags) == {"node": "gpu007", "gpu": "3", "uuid": "GPU-abc", "model": "NVIDIA H100 80GB HBM3"}
    assert p.fields == {"util_pct": 97.0, "mem_used_bytes": float(70 << 30), "mem_total_bytes": float(80 << 30),
                        "temp_c": 71.0, "sm_clock_mhz": 1980.0, "power_w": 612.5}  # fmt: skip
    assert all(isinstance(v, float) for v in p.fields.values())  # one type per field, always


def test_a_lost_gpu_leaves_a_gap_and_unknown_tags_are_left_out() -> None:
    report = NodeGpuReport(
        probe="nvml", taken_at=1.0,
        gpus=(GpuStatus(index=0, error="GPU is lost"), GpuStatus(index=1, utilization_pct=5)),
    )  # fmt: skip
    [p] = gpu_points(report, "n1")
    assert dict(p.tags) == {"node": "n1", "gpu": "1"} and p.fields == {"util_pct": 5.0}


def test_no_gpus_no_points() -> None:
    assert gpu_points(NodeGpuReport(probe="none", taken_at=1.0), "n1") == []


def _agent(probe: FakeProbe, metrics: MemoryWriter | None) -> Agent:
    cfg = AgentConfig(node="gpu007", controller=("127.0.0.1", 9), key=KEY, interval_s=1.0,
                      health=HealthSettings(expected_gpus=len(probe.gpus)))  # fmt: skip
    return Agent(cfg, probe, sock=FakeSocket(), clock=lambda: 1000.0, disk_free=lambda _p: 1 << 40, metrics=metrics)


def test_each_probe_queues_one_point_per_gpu_and_beats_queue_none() -> None:
    writer = MemoryWriter()
    agent = _agent(FakeProbe.healthy(8).with_gpu(2, utilization_pct=88), writer)
    agent.probe_once()
    assert len(writer.points) == 8 and writer.points[2].fields["util_pct"] == 88.0
    agent.beat_once()
    agent.beat_once()
    assert len(writer.points) == 8  # the heartbeat path never touches metrics
    agent.probe_once()
    assert len(writer.points) == 16


def test_a_failing_writer_does_not_stop_health_probing() -> None:
    class Broken(MemoryWriter):
        def add(self, point: Point) -> bool:
            raise RuntimeError("bug in the writer")

    agent = _agent(FakeProbe.healthy(2), Broken())
    health = agent.probe_once()
    assert health.problems == () and agent.current_problems() == ()


def test_without_a_sink_nothing_is_queued_and_run_closes_the_writer_bounded() -> None:
    agent = _agent(FakeProbe.healthy(1), None)
    agent.probe_once()  # no writer: no telemetry, no error
    writer = MemoryWriter()
    agent = _agent(FakeProbe.healthy(1), writer)
    stop = threading.Event()
    t = threading.Thread(target=agent.run, args=(stop,))
    t.start()
    stop.set()
    t.join(5)
    assert writer.closed_with == 2.0

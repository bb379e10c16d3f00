"""slurmctld's OpenMetrics (captured from 26.05) → the ``slurmctld`` point, and the controller's scrape loop."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nuro.metrics.model import SLURMCTLD
from nuro.slurm.openmetrics import ENDPOINTS, FIELDS, OpenMetricsError, cluster_fields, parse
from nuro.slurm_plugins.controller.config import ControllerConfig
from nuro.slurm_plugins.controller.slurm_metrics import SlurmMetricsLoop

V26 = Path(__file__).resolve().parents[1] / "fixtures" / "slurm" / "v26.05"


def _texts() -> dict[str, str]:
    return {e: (V26 / f"openmetrics_{e}.txt").read_text() for e in ENDPOINTS}


def test_captured_26_05_gives_the_queue_gpus_and_scheduler_numbers() -> None:
    fields = cluster_fields(_texts())
    # the capture's scenario (tests/fixtures/slurm/v26.05/README.md): gang + small running, big + held pending
    assert fields["jobs_pending"] == 2 and fields["jobs_running"] == 2 and fields["jobs_held"] == 1
    assert fields["gpus_alloc"] == 17 and fields["gpus_total"] == 32  # 4 nodes x 8, summed over per-node series
    assert fields["nodes"] == 4 and fields["nodes_drain"] == 1 and fields["nodes_mixed"] == 3
    assert fields["sched_cycle_last_us"] == 62 and fields["bf_cycle_last_us"] == 5420
    assert set(fields) == {*FIELDS.values(), "gpus_total"}, "every chosen series is served by 26.05"
    assert all(isinstance(v, int) for v in fields.values())


def test_labelled_series_other_than_the_sums_are_left_out() -> None:
    text = 'slurm_jobs_pending{partition="gpu"} 9\nslurm_jobs_pending 3\nslurm_node_gpus{node="a"} 8\n'
    assert cluster_fields({"x": text}) == {"jobs_pending": 3, "gpus_total": 8}


def test_malformed_text_is_a_clear_error() -> None:
    with pytest.raises(OpenMetricsError, match="not OpenMetrics text"):
        parse("slurm_jobs_pending{partition=gpu 3\n")


def test_loop_writes_one_point_per_scrape_and_survives_a_dead_slurmctld() -> None:
    written = []
    answers = iter(
        [{"jobs_pending": 3}, OpenMetricsError("http://ctl:6817/metrics/jobs: refused"), {"jobs_running": 1}]
    )

    def fetch(url: str) -> dict:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    loop = SlurmMetricsLoop("http://ctl:6817", written.append, clock=lambda: 1.5, fetch=fetch)
    assert loop.once() is not None and loop.once() is None and loop.once() is not None
    assert [(p.measurement, dict(p.tags), dict(p.fields), p.ts_ns) for p in written] == [
        (SLURMCTLD, {"controller": "ctl:6817"}, {"jobs_pending": 3}, 1_500_000_000),
        (SLURMCTLD, {"controller": "ctl:6817"}, {"jobs_running": 1}, 1_500_000_000),
    ]
    assert (loop.scrapes, loop.failures) == (2, 1)
    stop = threading.Event()
    stop.set()
    loop.run(stop)  # returns at once when stopped


@pytest.mark.parametrize("url", ["file:///etc/shadow", "http://ctl:6817/metrics/jobs", "ctl:6817", "http:// x"])
def test_only_a_plain_http_base_url_is_accepted(url: str) -> None:
    with pytest.raises(ValueError, match="slurm_metrics_url"):
        ControllerConfig(heartbeat_port=6820, heartbeat_key_file=Path("/k"), slurm_metrics_url=url)
    ControllerConfig(heartbeat_port=6820, heartbeat_key_file=Path("/k"), slurm_metrics_url="http://ctl:6817")

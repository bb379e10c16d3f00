"""Metrics sinks against real servers started by nuro's own code: influxd 1.6.7 (v1 write, InfluxQL read) and
victoria-metrics (influxdb-client's v2 write_api), plus an outage staged by stopping influxd mid-stream.

Ports 8910-8931 (standalone servers, no dev cluster). Each server starts in ~0.1-0.3 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from nuro.devcluster import tsdb
from nuro.metrics.buffer import BufferedWriter
from nuro.metrics.influx import InfluxV1Sink, InfluxV2Sink
from nuro.metrics.model import GPU, SELF, TRAIN, Point, Query
from nuro.metrics.sink import SinkRejected, sink_from_env
from tests.integration.conftest import wait_until

INFLUX_PORT = 8910
VM_PORT = 8920
OUTAGE_PORT = 8930

HOSTILE = ["it's", "'; DROP DATABASE nuro; --", 'a "q" b', "x y,z=w", "a\\b", "é\\,=", "\\'"]


@pytest.fixture(scope="module")
def influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tsdb.LocalServer]:
    with tsdb.standalone_influx(tmp_path_factory.mktemp("influx"), INFLUX_PORT) as server:
        yield server


@pytest.fixture(scope="module")
def vm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tsdb.LocalServer]:
    with tsdb.standalone_vm(tmp_path_factory.mktemp("vm"), VM_PORT) as server:
        yield server


def as_tuples(items) -> list[tuple]:
    return [(p.ts_ns, dict(p.tags), dict(p.fields)) for p in items]


def test_servers_listen_only_on_their_loopback_ports(influx: tsdb.LocalServer, vm: tsdb.LocalServer) -> None:
    assert tsdb.listening_ports(influx.pid) == {("127.0.0.1", INFLUX_PORT), ("127.0.0.1", INFLUX_PORT + 1)}
    assert tsdb.listening_ports(vm.pid) == {("127.0.0.1", VM_PORT)}


def test_influx1_round_trip_filters_bounds_limit(influx: tsdb.LocalServer) -> None:
    sink = sink_from_env({"NURO_METRICS_URL": tsdb.influx1_url(influx)})
    assert isinstance(sink, InfluxV1Sink) and sink.name == f"influx1 http://127.0.0.1:{INFLUX_PORT}/nuro"
    t0 = time.time_ns()
    pts = [
        Point(TRAIN, {"team": "vision", "run": run, "job": "7", "restart": "0", "rank": str(r)},
              {"step": s, "loss": 1.0 / (s + 1), "step_time_s": 0.25, "samples_per_s": 512.0, "note": 'q"\\'},
              t0 + s * 1000 + r)
        for run in HOSTILE for s in range(5) for r in range(2)
    ]  # fmt: skip
    sink.write(pts)
    for run in HOSTILE:
        mine = [p for p in pts if p.tags["run"] == run]
        assert as_tuples(sink.query(Query(TRAIN, where={"run": run}))) == as_tuples(mine), run
        rank1 = [p for p in mine if p.tags["rank"] == "1" and t0 + 1000 <= p.ts_ns < t0 + 3000]
        got = sink.query(Query(TRAIN, where={"run": run, "rank": "1"}, since_ns=t0 + 1000, until_ns=t0 + 3000))
        assert as_tuples(got) == as_tuples(rank1) and len(got) == 2
        assert as_tuples(sink.query(Query(TRAIN, where={"run": run}, limit=3))) == as_tuples(mine[-3:])
        only = sink.query(Query(TRAIN, where={"run": run}, fields=("loss",), limit=1))
        assert as_tuples(only) == [(mine[-1].ts_ns, dict(mine[-1].tags), {"loss": mine[-1].fields["loss"]})]
    first = sink.query(Query(TRAIN, where={"run": HOSTILE[0]}))[0]
    assert type(first.fields["loss"]) is float and type(first.fields["step"]) is int and first.fields["loss"] == 1.0
    assert sink.query(Query(TRAIN, where={"run": "absent"})) == []
    assert sink.query(Query("never_written")) == []
    sink.close()


def test_influx1_rejections_are_counted_not_retried(influx: tsdb.LocalServer) -> None:
    sink = InfluxV1Sink(influx.url, "nuro")
    base = time.time_ns()
    with BufferedWriter(sink, batch=16, flush_interval_s=0.05) as w:
        for i in range(16):
            w.add(Point(GPU, {"node": "rej", "gpu": "0"}, {"temp_c": "hot" if i == 5 else 40.0 + i}, base + i))
        w.add(Point(GPU, {"node": "rej\\", "gpu": "0"}, {"temp_c": 1.0}, base + 99))  # unencodable tag
        assert w.flush(10)
        assert w.stats["errors"] == 2 and w.stats["written"] == 15
    rows = sink.query(Query(GPU, where={"node": "rej"}))
    assert [r.fields["temp_c"] for r in rows] == [40.0 + i for i in range(16) if i != 5]
    with pytest.raises(SinkRejected, match="404"):  # influxd 1.6.7 has no /api/v2/write (measured)
        InfluxV2Sink(influx.url, "nuro", "nuro").write([Point(GPU, {"node": "v2"}, {"temp_c": 1.0}, base)])


def test_influx2_write_api_into_victoria_metrics(vm: tsdb.LocalServer) -> None:
    sink = sink_from_env({"NURO_METRICS_URL": f"influx2://127.0.0.1:{VM_PORT}?org=nuro&bucket=nuro",
                          "NURO_METRICS_TOKEN": "unused-by-vm"})  # fmt: skip
    assert isinstance(sink, InfluxV2Sink)
    now_ms = time.time_ns() // 1_000_000
    run = 'it\'s "v2"'
    pts = [Point(TRAIN, {"run": run, "rank": "0"}, {"step": i, "loss": 0.5 + i}, (now_ms + i) * 1_000_000)
           for i in range(50)]  # fmt: skip
    with BufferedWriter(sink, batch=20, flush_interval_s=0.05) as w:
        for p in pts:
            w.add(p)
        assert w.flush(10) and w.stats["written"] == 50
    http = urllib3.PoolManager()
    series: dict[str, dict] = {}
    deadline = time.monotonic() + 10

    def complete() -> bool:  # both series, each with all 50 samples (vm exposes a new series' samples in parts)
        return len(series) == 2 and all(len(s.get("timestamps", [])) >= len(pts) for s in series.values())

    while not complete() and time.monotonic() < deadline:  # new series become searchable after ~1 s
        assert http.request("GET", f"{vm.url}/internal/force_flush").status == 200
        match = {"match[]": '{__name__=~"train_.*",rank="0"}'}
        resp = http.request("GET", f"{vm.url}/api/v1/export", fields=match)
        series = {(s := json.loads(ln))["metric"]["__name__"]: s for ln in resp.data.decode().splitlines() if ln}
        time.sleep(0.1)
    loss = series["train_loss"]
    assert loss["metric"] == {"__name__": "train_loss", "rank": "0", "run": run}
    assert loss["timestamps"] == [now_ms + i for i in range(50)]
    assert loss["values"] == [0.5 + i for i in range(50)]
    assert series["train_step"]["values"] == list(range(50))
    sink.close()


def test_outage_nothing_lost_then_drops_reported(tmp_path: Path) -> None:
    server = tsdb.influx_server(tmp_path / "influx", OUTAGE_PORT)
    server.start()
    try:
        tsdb.create_database(server.url, "nuro")
        sink = InfluxV1Sink(server.url, "nuro", timeout_s=2.0)
        tags = {"source": "rank0", "node": "gpu001", "run": "outage"}
        w = BufferedWriter(sink, capacity=3000, batch=500, flush_interval_s=0.05, retry_initial_s=0.05,
                           retry_max_s=0.2, self_tags=tags)  # fmt: skip
        t0 = time.time_ns()

        def add_range(a: int, b: int) -> list[bool]:
            return [w.add(Point(TRAIN, {"run": "outage", "rank": "0"}, {"step": i}, t0 + i)) for i in range(a, b)]

        assert all(add_range(0, 1000))
        assert w.flush(10)
        server.stop()  # outage 1: fits the buffer
        assert all(add_range(1000, 3000))
        wait_until(lambda: w.stats["retries"] >= 2, 20, "two failed writes to the stopped server")
        assert w.stats["buffered"] == 2000
        server.start()
        assert w.flush(15)
        steps = [r.fields["step"] for r in sink.query(Query(TRAIN, where={"run": "outage"}))]
        assert steps == list(range(3000))  # nothing lost, in order
        server.stop()  # outage 2: overflows the buffer
        accepted = add_range(3000, 6500)
        assert accepted.count(False) == 500 and w.stats["dropped"] == 500
        server.start()
        assert w.flush(15)
        w.close()
        steps = [r.fields["step"] for r in sink.query(Query(TRAIN, where={"run": "outage"}))]
        assert steps == list(range(6000))
        report = sink.query(Query(SELF, where={"run": "outage"}, limit=1))[0]
        assert report.tags == tags
        assert report.fields == {"written": 6000, "dropped": 500, "buffered": 0, "errors": 0}
    finally:
        server.stop()


@pytest.mark.slurm
def test_dev_cluster_runs_influxd_and_exports_its_url(cluster) -> None:
    """The session cluster's supervisor started influxd on base+86 (+88 RPC), both loopback only, created ``nuro``,
    and ``devcluster env`` / nuro.env carry NURO_METRICS_URL, which sink_from_env turns into a working sink."""
    from nuro.devcluster.layout import PortPlan
    from nuro.devcluster.record import read_record

    record = read_record(cluster.layout.record)
    ports = PortPlan(record.port_base)
    url = f"influx1://127.0.0.1:{ports.influx}/nuro"
    assert cluster.env["NURO_METRICS_URL"] == url
    assert f"NURO_METRICS_URL={url}\n" in cluster.layout.nuro_env.read_text()
    (influxd,) = [d for d in record.daemons if d.name == "influxd"]
    assert tsdb.listening_ports(influxd.pid) == {("127.0.0.1", ports.influx), ("127.0.0.1", ports.influx_rpc)}
    sink = sink_from_env(cluster.env)
    p = Point(GPU, {"node": "gpu001", "gpu": "0"}, {"util_pct": 12.5}, time.time_ns())
    sink.write([p])
    assert as_tuples(sink.query(Query(GPU, where={"node": "gpu001"}, since_ns=p.ts_ns))) == as_tuples([p])
    sink.close()

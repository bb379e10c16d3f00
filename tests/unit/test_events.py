"""The event log: one JSON object per line, concurrent appenders never interleave, the reader filters."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from nuro.lifecycle.platform_events import EventLog, read_events


def test_append_writes_one_sorted_json_line_with_ts_kind_source(tmp_path: Path) -> None:
    path = tmp_path / "log" / "events.jsonl"
    rec = EventLog(path).append("node_lost", ts=100.0, node="gpu001", last_seq=7, jobs=(3, 4))
    line = path.read_text()
    assert line.endswith("\n") and line.count("\n") == 1
    assert json.loads(line) == rec == {
        "ts": 100.0, "kind": "node_lost", "source": "controller", "node": "gpu001", "last_seq": 7, "jobs": [3, 4]
    }  # fmt: skip


def test_reader_filters_by_time_node_job_and_kind_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path, fsync=False)
    log.append("node_lost", ts=10, node="gpu001")
    log.append("jobs_requeued", ts=11, node="gpu001", jobs=[5], not_requeued=[6])
    log.append("node_resumed", ts=20, node="gpu002")
    with open(path, "a") as fh:
        fh.write('{"ts": 30, "kind": "node_lo')  # a crash mid-write
    assert [e["kind"] for e in read_events(path)] == ["node_lost", "jobs_requeued", "node_resumed"]
    assert [e["ts"] for e in read_events(path, since=11)] == [11, 20]
    assert [e["ts"] for e in read_events(path, until=11)] == [10]
    assert [e["kind"] for e in read_events(path, node="gpu002")] == ["node_resumed"]
    assert [e["kind"] for e in read_events(path, job=5)] == ["jobs_requeued"]
    assert [e["kind"] for e in read_events(path, job=6)] == ["jobs_requeued"]
    assert [e["kind"] for e in read_events(path, kinds=["node_lost"])] == ["node_lost"]
    assert list(read_events(tmp_path / "missing.jsonl")) == []


def _writer(path: str, who: int) -> None:
    log = EventLog(path, source=f"w{who}", fsync=False)
    for i in range(200):
        log.append("node_lost", node=f"gpu{who:03d}", seq=i, pad="x" * 300)


def test_concurrent_appenders_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    procs = [multiprocessing.Process(target=_writer, args=(str(path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    lines = path.read_text().splitlines()
    assert len(lines) == 800
    recs = [json.loads(line) for line in lines]  # every line parses: no torn or merged records
    for w in range(4):
        assert [r["seq"] for r in recs if r["source"] == f"w{w}"] == list(range(200))

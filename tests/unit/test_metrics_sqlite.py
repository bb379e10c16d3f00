"""The embedded SQLite sink on a real file: round trip, filters with hostile values, limits, several processes."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from pathlib import Path

import pytest

from nuro.metrics.buffer import BufferedWriter
from nuro.metrics.model import GPU, TRAIN, Point, Query
from nuro.metrics.sink import SinkUnavailable
from nuro.metrics.sqlite import SQLiteSink

HOSTILE = 'run\'; DROP TABLE points; -- "x" ,= \\ é'


def train(i: int, run: str = "r1", rank: str = "0", **extra: float) -> Point:
    return Point(TRAIN, {"team": "vision", "run": run, "rank": rank},
                 {"step": i, "loss": 1.0 / (i + 1), **extra}, 1_000 + i)  # fmt: skip


def test_round_trip_keeps_types_and_order(tmp_path: Path) -> None:
    sink = SQLiteSink(tmp_path / "m.sqlite")
    pts = [train(i) for i in range(5)] + [
        Point(GPU, {"node": "gpu001", "gpu": "0"}, {"util_pct": 99.5, "ok": True, "note": 'a"b\nc'}, 7)
    ]
    sink.write(list(reversed(pts)))
    rows = sink.query(Query(TRAIN))
    assert [(r.ts_ns, dict(r.tags), dict(r.fields)) for r in rows] == [
        (p.ts_ns, dict(p.tags), dict(p.fields)) for p in pts[:5]
    ]
    assert isinstance(rows[0].fields["step"], int) and isinstance(rows[0].fields["loss"], float)
    (g,) = sink.query(Query(GPU))
    assert g.fields == {"util_pct": 99.5, "ok": True, "note": 'a"b\nc'}
    sink.close()


def test_tag_filter_time_bounds_fields_and_limit(tmp_path: Path) -> None:
    sink = SQLiteSink(tmp_path / "m.sqlite")
    sink.write([train(i, run=HOSTILE if i % 2 else "other", samples_per_s=float(i) if i < 6 else None or 0.0)
                for i in range(10)])  # fmt: skip
    sink.write([Point(TRAIN, {"run": HOSTILE}, {"custom": 1.5}, 2_000)])
    odd = sink.query(Query(TRAIN, where={"run": HOSTILE}))
    assert [r.ts_ns for r in odd] == [1001, 1003, 1005, 1007, 1009, 2000]
    assert sink.query(Query(TRAIN, where={"run": HOSTILE, "rank": "0"}, since_ns=1003, until_ns=1009)) == [
        r for r in odd if 1003 <= r.ts_ns < 1009
    ]
    assert [r.ts_ns for r in sink.query(Query(TRAIN, limit=3))] == [1008, 1009, 2000]  # newest 3, oldest first
    only = sink.query(Query(TRAIN, where={"run": HOSTILE}, fields=("custom",)))
    assert [(r.ts_ns, dict(r.fields)) for r in only] == [(2000, {"custom": 1.5})]
    lim = sink.query(Query(TRAIN, fields=("loss",), limit=2))
    assert [r.ts_ns for r in lim] == [1008, 1009] and set(lim[0].fields) == {"loss"}
    assert sink.query(Query(TRAIN, where={"run": "nope"})) == []
    assert sink.query(Query("absent")) == []
    with pytest.raises(ValueError):
        sink.query(Query(TRAIN, where={'run") OR 1=1 --': "x"}))
    assert sqlite3.connect(tmp_path / "m.sqlite").execute("PRAGMA journal_mode").fetchone() == ("wal",)


def _writer(path: str, rank: int, n: int) -> None:
    sink = SQLiteSink(path)
    with BufferedWriter(sink, batch=50, flush_interval_s=0.01, retry_initial_s=0.01) as w:
        for i in range(n):
            w.add(train(i, rank=str(rank)))
    sink.close()


def test_several_writer_processes_share_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared.sqlite")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, r, 500)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    sink = SQLiteSink(path)
    for r in range(3):
        rows = sink.query(Query(TRAIN, where={"rank": str(r)}))
        assert [row.fields["step"] for row in rows] == list(range(500))


def test_locked_file_is_retryable(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    sink = SQLiteSink(path, busy_timeout_s=0.05)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    with pytest.raises(SinkUnavailable, match="sqlite .*m.sqlite"):
        sink.write([train(0)])
    other.execute("ROLLBACK")
    sink.write([train(0)])
    assert len(sink.query(Query(TRAIN))) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to own files as another user")
def test_root_reading_a_users_file_leaves_it_writable_by_that_user(tmp_path: Path) -> None:
    path = tmp_path / "metrics.sqlite"
    SQLiteSink(path).close()
    os.chown(path, 65534, 65534)
    reader = SQLiteSink(path)  # as root, like an admin running nuro-train metrics
    reader.query(Query("train"))
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            assert extra.stat().st_uid == 65534, f"{extra.name} left owned by root"
    reader.close()

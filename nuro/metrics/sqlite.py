"""The embedded sink: one SQLite file, the default when no TSDB is configured (laptops, CI, the CLI offline).

Layout: one table ``points(measurement, ts_ns, tags JSON, fields JSON)`` with an index on (measurement, ts_ns), the
only access path every ``Query`` uses; tag filters are ``json_extract`` on the rows that index selects. Why JSON and
not a column per tag: the schema has custom fields (any scalar a run logs), and a table per measurement would need
migrations every time one appears.

Several processes may write one file (a run's ranks on several emulated nodes of the dev cluster share a disk):
WAL mode lets readers run beside one writer, every batch is one ``BEGIN IMMEDIATE`` transaction, and a writer that
waits longer than ``busy_timeout_s`` for the lock gets ``SinkUnavailable`` so ``BufferedWriter`` backs off and
retries, rather than a training step waiting on the file.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from nuro.metrics.base import SinkError, SinkUnavailable
from nuro.metrics.model import _NAME, Point, Query, Row

_SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    measurement TEXT NOT NULL,
    ts_ns INTEGER NOT NULL,
    tags TEXT NOT NULL,
    fields TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS points_m_ts ON points (measurement, ts_ns);
"""


def _check_names(q: Query) -> None:
    """Tag and field names go into JSON paths: accept only the names a Point may carry."""
    for name in (*q.where, *q.fields):
        if not _NAME.fullmatch(name):
            raise ValueError(f"query on {q.measurement}: {name!r} is not a valid tag/field name")


class SQLiteSink:
    """``MetricsSink`` over one SQLite file (created with its directory on first use).

    Args:
        path: the database file.
        busy_timeout_s: how long a write waits for another process's transaction before ``SinkUnavailable``.
    """

    def __init__(self, path: Path | str, *, busy_timeout_s: float = 5.0) -> None:
        self.path = Path(path)
        self.name = f"sqlite {self.path}"
        self._lock = threading.Lock()  # one connection, used by the writer thread and readers in turn
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the write lock is taken up front and a
            # busy file fails fast in BEGIN instead of half-way through a batch.
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
            self._init_schema(busy_timeout_s)
            self._keep_owner()
        except sqlite3.Error as exc:
            raise SinkError(f"{self.name}: cannot open ({exc}); check the path and its permissions") from exc

    def _keep_owner(self) -> None:
        """Root opening a user's file (``nuro-train metrics`` run by an admin) creates the ``-wal``/``-shm`` files
        as root; the run's own writers could then no longer write. Hand them to the database file's owner."""
        if os.geteuid() != 0:
            return
        st = self.path.stat()
        for suffix in ("-wal", "-shm"):
            extra = self.path.with_name(self.path.name + suffix)
            try:
                if extra.stat().st_uid != st.st_uid:
                    os.chown(extra, st.st_uid, st.st_gid)
            except FileNotFoundError:
                continue

    def _init_schema(self, busy_timeout_s: float) -> None:
        """WAL + schema. Switching a new file to WAL does not wait on the busy handler: when several ranks open
        the same new file at once, all but one get "database is locked" at once, so retry here for a while."""
        deadline = time.monotonic() + max(busy_timeout_s, 1.0)
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
                self._db.executescript(_SCHEMA)
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def write(self, points: Sequence[Point]) -> None:
        if not points:
            return
        rows = [
            (p.measurement, p.ts_ns, json.dumps(dict(p.tags), sort_keys=True), json.dumps(dict(p.fields)))
            for p in points
        ]
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    self._db.executemany("INSERT INTO points VALUES (?, ?, ?, ?)", rows)
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
            except sqlite3.OperationalError as exc:  # locked/busy, disk full, I/O error: may pass later
                raise SinkUnavailable(f"{self.name}: write of {len(rows)} points failed: {exc}") from exc
            except sqlite3.Error as exc:
                raise SinkError(f"{self.name}: write of {len(rows)} points failed: {exc}") from exc

    def query(self, q: Query) -> list[Row]:
        _check_names(q)
        sql = ["SELECT ts_ns, tags, fields FROM points WHERE measurement = ?"]
        args: list[object] = [q.measurement]
        if q.since_ns is not None:
            sql.append("AND ts_ns >= ?")
            args.append(q.since_ns)
        if q.until_ns is not None:
            sql.append("AND ts_ns < ?")
            args.append(q.until_ns)
        for key, value in q.where.items():
            sql.append("AND json_extract(tags, ?) = ?")
            args += [f'$."{key}"', value]
        # Newest first with a limit, reversed below: "the newest N rows, oldest first". Field selection happens
        # after the fetch (JSON), so with a field filter the limit is applied in Python, not by SQLite.
        sql.append("ORDER BY ts_ns DESC, rowid DESC")
        if q.limit is not None and not q.fields:
            sql.append("LIMIT ?")
            args.append(q.limit)
        with self._lock:
            try:
                cur = self._db.execute(" ".join(sql), args)
                rows = []
                for ts_ns, tags, fields in cur:
                    values = json.loads(fields)
                    if q.fields:
                        values = {k: values[k] for k in q.fields if k in values}
                        if not values:
                            continue
                    rows.append(Row(ts_ns=ts_ns, tags=json.loads(tags), fields=values))
                    if q.limit is not None and len(rows) >= q.limit:
                        break
            except sqlite3.OperationalError as exc:
                raise SinkUnavailable(f"{self.name}: query on {q.measurement} failed: {exc}") from exc
            except sqlite3.Error as exc:
                raise SinkError(f"{self.name}: query on {q.measurement} failed: {exc}") from exc
        rows.reverse()
        return rows

    def close(self) -> None:
        with self._lock:
            self._db.close()

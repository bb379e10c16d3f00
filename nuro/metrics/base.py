"""What every metrics sink and its callers share: the ``MetricsSink`` protocol, its errors and the environment names.

Its own module, below the backends (``influx``, ``sqlite``) and the factory (``nuro.metrics.sink.sink_from_env``),
so the backends can raise these errors without importing the factory that imports them (an import cycle).

A sink only writes and reads; buffering, retries and back-off live in ``nuro.metrics.buffer.BufferedWriter`` so every
sink gets the same "training never blocks on the TSDB" behaviour. Sinks therefore never retry on their own and
classify every failure into one of two errors:

============================  ==========================================================  ======================
error                         when                                                        what the writer does
============================  ==========================================================  ======================
``SinkUnavailable``           connection refused/reset, timeout, HTTP 5xx/429, DB locked  back off, retry batch
``SinkRejected``              HTTP 4xx: the server refuses these points (type conflict…)  bisect, drop bad ones
============================  ==========================================================  ======================
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from nuro.metrics.model import Point, Query, Row

ENV_URL = "NURO_METRICS_URL"
ENV_TOKEN = "NURO_METRICS_TOKEN"
ENV_DB = "NURO_METRICS_DB"
DEFAULT_DB = Path("~/.nuro/metrics.sqlite")


class SinkError(RuntimeError):
    """A sink call failed; the message names the sink (server URL or file) and what it answered."""


class SinkUnavailable(SinkError):
    """Retryable: the server is down, slow or overloaded (connection refused, timeout, 5xx, 429, file locked)."""


class SinkRejected(SinkError):
    """Not retryable: the server refused the points themselves (HTTP 4xx, e.g. a field type conflict).

    Retrying the same points fails the same way, so ``BufferedWriter`` splits the batch to find and drop them.
    """


class MetricsConfigError(ValueError):
    """``NURO_METRICS_URL`` (or a sink argument) is malformed; the message lists the accepted forms."""


@runtime_checkable
class MetricsSink(Protocol):
    """A time-series store. Implementations: ``InfluxV1Sink``, ``InfluxV2Sink``, ``SQLiteSink``.

    ``write`` is all-or-error for a batch as far as the server allows (InfluxDB 1.x may keep the valid part of a
    batch it answers 400 to; rewriting those points is harmless because a point's identity is series + time).
    ``query`` answers one ``Query`` with rows oldest first. Sinks are safe to call from one writer thread plus
    readers; they never retry (``BufferedWriter`` does).
    """

    name: str

    def write(self, points: Sequence[Point]) -> None: ...

    def query(self, q: Query) -> list[Row]: ...

    def close(self) -> None: ...

"""Where metrics go: the ``MetricsSink`` protocol, its errors, and ``sink_from_env``.

A sink only writes and reads; buffering, retries and back-off live in ``nuro.metrics.buffer.BufferedWriter`` so every
sink gets the same "training never blocks on the TSDB" behaviour. Sinks therefore never retry on their own and
classify every failure into one of two errors:

============================  ==========================================================  ======================
error                         when                                                        what the writer does
============================  ==========================================================  ======================
``SinkUnavailable``           connection refused/reset, timeout, HTTP 5xx/429, DB locked  back off, retry batch
``SinkRejected``              HTTP 4xx: the server refuses these points (type conflict…)  bisect, drop bad ones
============================  ==========================================================  ======================

``NURO_METRICS_URL`` picks the sink (the dev cluster exports an ``influx1://`` URL; see docs/metrics.md):

- ``influx1://HOST:PORT/DB`` – InfluxDB v1 API: line protocol ``POST /write?db=DB&precision=ns``, InfluxQL reads.
- ``influx2://HOST:PORT?org=O&bucket=B`` – influxdb-client's v2 ``write_api`` (InfluxDB 2.x/3.x, victoria-metrics),
  token from ``NURO_METRICS_TOKEN``; reads through the v1-compatible InfluxQL ``/query`` (database = bucket).
- ``sqlite:///ABS/PATH.sqlite`` – the embedded sink.
- unset – embedded SQLite at ``$NURO_METRICS_DB``, else ``~/.nuro/metrics.sqlite``.

Credentials (``nuro.metrics.identities``): with ``NURO_METRICS_USER`` set, ``influx1://`` authenticates as that
InfluxDB 1.x user (HTTP Basic, password ``NURO_METRICS_TOKEN``); without it the token goes as ``Authorization:
Token`` (2.x/3.x). With no token set, ``NURO_METRICS_CREDENTIALS`` (a team's ``<team>.env`` or their directory)
supplies the team's URL, user and token, so a member writes only their team's database.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import parse_qs, urlsplit

from nuro.metrics.model import Point, Query, Row

ENV_URL = "NURO_METRICS_URL"
ENV_TOKEN = "NURO_METRICS_TOKEN"
ENV_DB = "NURO_METRICS_DB"
DEFAULT_DB = Path("~/.nuro/metrics.sqlite")

URL_FORMS = (
    "influx1://HOST:PORT/DB, influx2://HOST:PORT?org=ORG&bucket=BUCKET (token in NURO_METRICS_TOKEN) "
    "or sqlite:///ABS/PATH.sqlite"
)


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


def default_sqlite_path(env: Mapping[str, str]) -> Path:
    """``$NURO_METRICS_DB`` or ``~/.nuro/metrics.sqlite``."""
    return Path(env.get(ENV_DB) or DEFAULT_DB).expanduser()


def _host_port(url: str, parts) -> str:
    try:
        port = parts.port
    except ValueError as exc:
        raise MetricsConfigError(f"{ENV_URL}={url!r}: bad port ({exc}); use {URL_FORMS}") from exc
    if not parts.hostname or port is None:
        raise MetricsConfigError(f"{ENV_URL}={url!r}: needs HOST:PORT; use {URL_FORMS}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"http://{host}:{port}"


def sink_from_env(env: Mapping[str, str] | None = None) -> MetricsSink:
    """The sink ``NURO_METRICS_URL`` names (see the module docstring); embedded SQLite when it is unset.

    Raises:
        MetricsConfigError: the URL is malformed or its scheme unknown.
    """
    from nuro.metrics.identities import ENV_USER, resolve

    env = resolve(os.environ if env is None else env)
    url = env.get(ENV_URL, "").strip()
    if not url:
        from nuro.metrics.sqlite import SQLiteSink

        return SQLiteSink(default_sqlite_path(env))
    parts = urlsplit(url)
    if parts.scheme == "influx1":
        from nuro.metrics.influx import InfluxV1Sink

        db = parts.path.strip("/")
        if not db or "/" in db:
            raise MetricsConfigError(f"{ENV_URL}={url!r}: name one database, e.g. influx1://127.0.0.1:8086/nuro")
        user = env.get(ENV_USER) or None
        return InfluxV1Sink(_host_port(url, parts), db, token=env.get(ENV_TOKEN) or None, user=user)
    if parts.scheme == "influx2":
        from nuro.metrics.influx import InfluxV2Sink

        qs = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        missing = [k for k in ("org", "bucket") if not qs.get(k)]
        if missing:
            raise MetricsConfigError(f"{ENV_URL}={url!r}: missing {', '.join(missing)}; use {URL_FORMS}")
        return InfluxV2Sink(_host_port(url, parts), qs["org"], qs["bucket"], token=env.get(ENV_TOKEN, ""))
    if parts.scheme == "sqlite":
        from nuro.metrics.sqlite import SQLiteSink

        if parts.netloc or not parts.path.startswith("/"):
            raise MetricsConfigError(f"{ENV_URL}={url!r}: use an absolute path, sqlite:///ABS/PATH.sqlite")
        return SQLiteSink(Path(parts.path))
    raise MetricsConfigError(f"{ENV_URL}={url!r}: unknown scheme {parts.scheme!r}; use {URL_FORMS}")

"""Where metrics go: ``sink_from_env``, the factory that picks a sink from ``NURO_METRICS_URL``.

The protocol and the errors every sink raises live in ``nuro.metrics.base`` (below the backends, which import them;
this factory imports the backends); they are re-exported here, where callers have always imported them from.

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
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from nuro.metrics.base import (
    DEFAULT_DB,
    ENV_DB,
    ENV_TOKEN,
    ENV_URL,
    MetricsConfigError,
    MetricsSink,
    SinkError,
    SinkRejected,
    SinkUnavailable,
)
from nuro.metrics.identities import ENV_USER, resolve
from nuro.metrics.influx import InfluxV1Sink, InfluxV2Sink
from nuro.metrics.sqlite import SQLiteSink

__all__ = [
    "DEFAULT_DB",
    "ENV_DB",
    "ENV_TOKEN",
    "ENV_URL",
    "URL_FORMS",
    "MetricsConfigError",
    "MetricsSink",
    "SinkError",
    "SinkRejected",
    "SinkUnavailable",
    "default_sqlite_path",
    "sink_from_env",
]

URL_FORMS = (
    "influx1://HOST:PORT/DB, influx2://HOST:PORT?org=ORG&bucket=BUCKET (token in NURO_METRICS_TOKEN) "
    "or sqlite:///ABS/PATH.sqlite"
)


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
    env = resolve(os.environ if env is None else env)
    url = env.get(ENV_URL, "").strip()
    if not url:
        return SQLiteSink(default_sqlite_path(env))
    parts = urlsplit(url)
    if parts.scheme == "influx1":
        db = parts.path.strip("/")
        if not db or "/" in db:
            raise MetricsConfigError(f"{ENV_URL}={url!r}: name one database, e.g. influx1://127.0.0.1:8086/nuro")
        user = env.get(ENV_USER) or None
        return InfluxV1Sink(_host_port(url, parts), db, token=env.get(ENV_TOKEN) or None, user=user)
    if parts.scheme == "influx2":
        qs = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        missing = [k for k in ("org", "bucket") if not qs.get(k)]
        if missing:
            raise MetricsConfigError(f"{ENV_URL}={url!r}: missing {', '.join(missing)}; use {URL_FORMS}")
        return InfluxV2Sink(_host_port(url, parts), qs["org"], qs["bucket"], token=env.get(ENV_TOKEN, ""))
    if parts.scheme == "sqlite":
        if parts.netloc or not parts.path.startswith("/"):
            raise MetricsConfigError(f"{ENV_URL}={url!r}: use an absolute path, sqlite:///ABS/PATH.sqlite")
        return SQLiteSink(Path(parts.path))
    raise MetricsConfigError(f"{ENV_URL}={url!r}: unknown scheme {parts.scheme!r}; use {URL_FORMS}")

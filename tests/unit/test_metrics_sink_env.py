"""sink_from_env: which sink each NURO_METRICS_URL gives, and the errors for malformed ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.metrics.influx import InfluxV1Sink, InfluxV2Sink
from nuro.metrics.sink import MetricsConfigError, MetricsSink, sink_from_env
from nuro.metrics.sqlite import SQLiteSink


def test_unset_is_embedded_sqlite(tmp_path: Path) -> None:
    sink = sink_from_env({"NURO_METRICS_DB": str(tmp_path / "a" / "m.sqlite")})
    assert isinstance(sink, SQLiteSink) and isinstance(sink, MetricsSink)
    assert sink.name == f"sqlite {tmp_path / 'a' / 'm.sqlite'}"
    sink.close()
    home = sink_from_env({"HOME": str(tmp_path)})  # expanduser reads os.environ, so only check the type
    assert isinstance(home, SQLiteSink)
    home.close()


def test_sqlite_url(tmp_path: Path) -> None:
    sink = sink_from_env({"NURO_METRICS_URL": f"sqlite://{tmp_path}/x.sqlite"})
    assert isinstance(sink, SQLiteSink) and sink.path == tmp_path / "x.sqlite"
    sink.close()


def test_influx_urls() -> None:
    v1 = sink_from_env({"NURO_METRICS_URL": "influx1://127.0.0.1:16886/nuro"})
    assert isinstance(v1, InfluxV1Sink) and v1.name == "influx1 http://127.0.0.1:16886/nuro"
    v2 = sink_from_env({"NURO_METRICS_URL": "influx2://localhost:8428?org=o&bucket=b", "NURO_METRICS_TOKEN": "t"})
    assert isinstance(v2, InfluxV2Sink) and v2.name == "influx2 http://localhost:8428?org=o&bucket=b"
    v1.close()
    v2.close()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("influx1://127.0.0.1:8086", "name one database"),
        ("influx1://127.0.0.1/nuro", "HOST:PORT"),
        ("influx1://127.0.0.1:99999/nuro", "port"),
        ("influx2://127.0.0.1:8086?org=o", "missing bucket"),
        ("sqlite://relative/path", "absolute"),
        ("http://127.0.0.1:8086", "unknown scheme"),
    ],
)
def test_malformed_urls(url: str, match: str) -> None:
    with pytest.raises(MetricsConfigError, match=match):
        sink_from_env({"NURO_METRICS_URL": url})

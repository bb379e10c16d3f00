"""InfluxQL building and line-protocol encoding (pure): hostile run names must stay inside their quotes."""

from __future__ import annotations

import pytest

from nuro.metrics.influx import build_influxql, line, parse_rows, quote_ident, quote_str
from nuro.metrics.model import GPU, TRAIN, InvalidPoint, Point, Query


@pytest.mark.parametrize(
    ("value", "quoted"),
    [
        ("plain", "'plain'"),
        ("it's", r"'it\'s'"),
        ("'; DROP DATABASE nuro; --", r"'\'; DROP DATABASE nuro; --'"),
        ("back\\slash", r"'back\\slash'"),
        ("trailing\\", r"'trailing\\'"),
        ("\\'", r"'\\\''"),
        ('dq"x', "'dq\"x'"),
        ("new\nline", r"'new\nline'"),
    ],
)
def test_quote_str(value: str, quoted: str) -> None:
    assert quote_str(value) == quoted


def test_quote_ident() -> None:
    assert quote_ident("run") == '"run"'
    assert quote_ident('a"b') == r'"a\"b"'
    assert quote_ident("a\\") == r'"a\\"'
    assert quote_ident("my db") == '"my db"'


def test_select_with_hostile_tag_values_and_bounds() -> None:
    q = Query(TRAIN, where={"run": "x' OR '1'='1", "team": "vision"}, since_ns=10, until_ns=20)
    assert build_influxql(q) == (
        "SELECT * FROM \"train\" WHERE \"run\" = 'x\\' OR \\'1\\'=\\'1' AND \"team\" = 'vision' "
        "AND time >= 10 AND time < 20"
    )


def test_select_fields_and_limit() -> None:
    q = Query(GPU, where={"node": "gpu001"}, fields=("util_pct", "temp_c"), limit=5)
    assert build_influxql(q) == (
        'SELECT "util_pct", "temp_c", *::tag FROM "gpu" WHERE "node" = \'gpu001\' ORDER BY time DESC LIMIT 5'
    )
    assert build_influxql(Query(TRAIN)) == 'SELECT * FROM "train"'


@pytest.mark.parametrize("bad", [Query('train" ; DROP'), Query(TRAIN, where={"run=1 OR": "x"}),
                                 Query(TRAIN, fields=("a b",))])  # fmt: skip
def test_names_outside_the_schema_alphabet_are_refused(bad: Query) -> None:
    with pytest.raises(ValueError, match="not a valid"):
        build_influxql(bad)


def test_line_protocol_escaping() -> None:
    p = Point(TRAIN, {"team": "vi sion", "run": "a,b=c\\d"}, {"step": 3, "loss": 0.5, "ok": True,
              "note": 'say "hi"\\'}, 1_700_000_000_000_000_123)  # fmt: skip
    assert line(p) == (
        'train,run=a\\,b\\=c\\d,team=vi\\ sion step=3i,loss=0.5,ok=true,note="say \\"hi\\"\\\\" 1700000000000000123'
    )
    assert line(Point(GPU, {"gpu": "0"}, {"power_w": 1e20, "x": False}, 0)) == "gpu,gpu=0 power_w=1e+20,x=false 0"


def test_tag_value_ending_in_backslash_cannot_be_encoded() -> None:
    with pytest.raises(InvalidPoint, match="backslash"):
        line(Point(TRAIN, {"run": "a\\"}, {"step": 1}, 0))


def test_parse_rows_splits_tags_from_fields_and_restores_float_types() -> None:
    body = {
        "results": [
            {"statement_id": 0, "series": [{"name": "train", "columns": ["time", "loss", "rank", "run", "step"],
                                            "values": [[2, 1, "0", "r", 2], [1, 0.5, None, "r", 1], [3, None, "0",
                                                                                                   "r", None]]}]},
            {"statement_id": 1, "series": [{"name": "train", "columns": ["tagKey"], "values": [["rank"], ["run"]]}]},
            {"statement_id": 2, "series": [{"name": "train", "columns": ["fieldKey", "fieldType"],
                                            "values": [["loss", "float"], ["step", "integer"]]}]},
        ]
    }  # fmt: skip
    rows = parse_rows(body)
    assert [(r.ts_ns, dict(r.tags), dict(r.fields)) for r in rows] == [
        (1, {"run": "r"}, {"loss": 0.5, "step": 1}),
        (2, {"rank": "0", "run": "r"}, {"loss": 1.0, "step": 2}),
    ]
    assert isinstance(rows[1].fields["loss"], float)


def test_parse_rows_raises_the_servers_error() -> None:
    from nuro.metrics.sink import SinkError

    with pytest.raises(SinkError, match="database not found"):
        parse_rows({"results": [{"statement_id": 0, "error": "database not found: nuro"}]})

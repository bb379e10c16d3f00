"""The Grafana dashboards as data (fields Grafana needs, queries within the metric schema) and macro expansion.

Whether the queries return rows from real data is tests/integration/test_dashboards_data.py; here every check is
pure and fast, so a broken edit to a dashboard fails at the first unit run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from nuro.devcluster.dashboards import (
    DashboardError,
    TimeRange,
    expand,
    extract_queries,
    format_interval,
    group_by_tags,
    iter_panels,
    load_dashboard,
    measurements,
    output_columns,
    schema_problems,
    variables,
)

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "dashboards"
PATHS = sorted(DASHBOARD_DIR.glob("*.json"))
DATASOURCE_UID = "nuro-influx"
TR = TimeRange(1_700_000_000_000, 1_700_000_060_000)


def test_the_three_views_exist() -> None:
    assert [p.stem for p in PATHS] == ["cluster", "run", "team"]


@pytest.fixture(params=PATHS, ids=[p.stem for p in PATHS])
def dash(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load_dashboard(request.param)


def test_dashboard_has_what_grafana_requires(dash: dict[str, Any]) -> None:
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dash["uid"]), "Grafana uids are at most 40 characters"
    assert dash["title"].startswith("nuro / ")
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert {"from", "to"} <= set(dash["time"])
    assert dash["panels"], "a dashboard without panels"
    ids = [p["id"] for p in iter_panels(dash)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"


def test_panels_have_datasource_targets_and_grid(dash: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for p in iter_panels(dash):
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")), p["title"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, f"{p['title']}: {g} leaves the 24-column grid"
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{p['title']} overlaps another panel at {g}"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["type"] in {"timeseries", "stat", "table"} and p["title"] and p["description"]
        assert p["datasource"] == {"type": "influxdb", "uid": DATASOURCE_UID}
        assert p["targets"], f"{p['title']} has no targets"
        ref_ids = [t["refId"] for t in p["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), f"{p['title']}: refIds repeat"
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"] and t["rawQuery"] is True
            assert t["resultFormat"] == ("table" if p["type"] == "table" else "time_series")


def test_variables_list_tag_values_from_the_datasource(dash: dict[str, Any]) -> None:
    for v in dash["templating"]["list"]:
        assert v["type"] == "query" and v["datasource"]["uid"] == DATASOURCE_UID
        assert v["query"].startswith("SHOW TAG VALUES FROM "), v["name"]
        assert v["refresh"] == 2, "refresh on time-range change, so a new run shows up without a reload"


def test_every_query_stays_within_the_schema(dash: dict[str, Any]) -> None:
    for q in extract_queries(dash):
        assert schema_problems(q.query) == [], f"{q.title}: {q.query}"


def test_panel_queries_use_time_filter_interval_and_aliases(dash: dict[str, Any]) -> None:
    for q in extract_queries(dash):
        if q.kind != "panel":
            continue
        # One $timeFilter per SELECT: an outer query over a subquery needs its own, or InfluxDB scans all time.
        assert q.query.count("$timeFilter") == q.query.upper().count("SELECT "), q.title
        assert "GROUP BY time(" not in q.query.replace("GROUP BY time($__interval)", ""), q.title
        assert output_columns(q.query)[0] == "time"  # raises on an expression without an alias


def test_every_variable_a_query_uses_is_defined(dash: dict[str, Any]) -> None:
    defined = {v.name for v in variables(dash)}
    for q in extract_queries(dash):
        used = set(re.findall(r"\$(\w+)", q.query)) - {"timeFilter", "__interval"}
        assert used <= defined, f"{q.title} uses {used - defined}, not defined in templating"
        if q.kind == "variable":  # a variable may only use those defined before it (Grafana's chain order)
            assert used <= {v.name for v in variables(dash)[: [v.name for v in variables(dash)].index(q.title)]}


def test_views_cover_what_the_issue_asks() -> None:
    by_uid = {d["uid"]: d for d in map(load_dashboard, PATHS)}
    assert [v.name for v in variables(by_uid["nuro-team"])] == ["team"]
    assert [v.name for v in variables(by_uid["nuro-run"])][:3] == ["team", "run", "job"]
    cluster = " ".join(q.query for q in extract_queries(by_uid["nuro-cluster"]))
    for field in ("util_pct", "mem_used_bytes", "temp_c", "jobs_pending", "gpus_alloc", "sched_cycle_last_us"):
        assert field in cluster  # the last three: slurmctld's OpenMetrics (Slurm 25.11+, issue 14)
    run = extract_queries(by_uid["nuro-run"])
    assert {m for q in run for m in measurements(q.query)} == {"train", "gpu", "nuro_metrics"}
    assert any('GROUP BY time($__interval), "rank"' in q.query and '"loss"' in q.query for q in run)
    assert any('GROUP BY time($__interval), "rank"' in q.query and '"samples_per_s"' in q.query for q in run)


def test_datasource_provisioning_matches_the_dashboards() -> None:
    text = (DASHBOARD_DIR / "provisioning" / "datasource.yaml").read_text()
    (ds,) = yaml.safe_load(text)["datasources"]
    assert ds["uid"] == DATASOURCE_UID and ds["type"] == "influxdb"
    assert ds["url"] == "${NURO_INFLUX_URL}"
    assert ds["database"] == ds["jsonData"]["dbName"] == "nuro"
    (provider,) = yaml.safe_load((DASHBOARD_DIR / "provisioning" / "dashboards.yaml").read_text())["providers"]
    assert provider["type"] == "file"


# --- expansion -----------------------------------------------------------------------------------------------------


def test_time_filter_and_interval() -> None:
    q = 'SELECT mean("loss") AS "loss" FROM "train" WHERE $timeFilter GROUP BY time($__interval)'
    assert expand(q, TR, 5) == (
        'SELECT mean("loss") AS "loss" FROM "train" WHERE time >= 1700000000000ms and time <= 1700000060000ms '
        "GROUP BY time(5s)"
    )
    assert expand("$__timeFilter $interval $__interval_ms", TR, 0.5) == (
        "time >= 1700000000000ms and time <= 1700000060000ms 500ms 500"
    )


@pytest.mark.parametrize(("seconds", "text"), [(1, "1s"), (0.2, "200ms"), (60, "1m"), (90, "90s"), (600, "10m")])
def test_format_interval(seconds: float, text: str) -> None:
    assert format_interval(seconds) == text


def test_single_value_variable_is_substituted_verbatim() -> None:
    q = "WHERE \"team\" = '$team' AND \"run\" = '${run}' AND \"job\" = '[[job]]'"
    got = expand(q, TR, 1, {"team": "vision", "run": "r.1/b", "job": ["42"]})
    assert got == "WHERE \"team\" = 'vision' AND \"run\" = 'r.1/b' AND \"job\" = '42'"


def test_multi_value_variable_is_a_regex_alternation() -> None:
    q = '"node" =~ /^$node$/'
    assert expand(q, TR, 1, {"node": ["a01", "b.02"]}, {"node"}) == '"node" =~ /^(a01|b\\.02)$/'
    assert expand(q, TR, 1, {"node": ["a/1"]}, {"node"}) == '"node" =~ /^a\\/1$/'


def test_a_longer_variable_name_is_not_cut_at_a_shorter_one() -> None:
    assert expand("'$run' '$run_id'", TR, 1, {"run": "r", "run_id": "7"}) == "'r' '7'"


@pytest.mark.parametrize(
    ("values", "regex", "message"),
    [
        ({}, set(), r"\$team, which is neither"),
        ({"team": []}, set(), "has no value"),
        ({"team": ["a", "b"]}, set(), "single-value"),
        ({"team": "it's"}, set(), "unescaped"),
    ],
)
def test_expansion_refuses_what_would_reach_influxdb_verbatim(values: dict, regex: set, message: str) -> None:
    with pytest.raises(DashboardError, match=message):
        expand("\"team\" = '$team'", TR, 1, values, regex)


def test_time_range_and_interval_are_checked() -> None:
    with pytest.raises(DashboardError, match="before it starts"):
        TimeRange(2, 1)
    with pytest.raises(DashboardError, match="positive"):
        format_interval(0)


# --- query analysis ------------------------------------------------------------------------------------------------

SUBQUERY = (
    'SELECT sum("p") AS "power_w" FROM (SELECT mean("power_w") AS "p" FROM "gpu" WHERE $timeFilter '
    'GROUP BY time($__interval), "node", "gpu") WHERE $timeFilter GROUP BY time($__interval), "node" fill(none)'
)


def test_columns_and_group_by_of_the_outer_query() -> None:
    assert output_columns(SUBQUERY) == ["time", "power_w"]
    assert group_by_tags(SUBQUERY) == ["node"]
    inner_only = 'SELECT sum("p") AS "x" FROM (SELECT mean("power_w") AS "p" FROM "gpu" GROUP BY "node")'
    assert group_by_tags(inner_only) == []
    top = 'SELECT top("t", 3) AS "t", "node", "gpu" FROM (SELECT max("temp_c") AS "t" FROM "gpu" GROUP BY "node")'
    assert output_columns(top) == ["time", "t", "node", "gpu"]
    assert output_columns('SHOW TAG VALUES FROM "train" WITH KEY = "team"') == ["key", "value"]
    with pytest.raises(DashboardError, match="no alias"):
        output_columns('SELECT mean("loss") FROM "train"')


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ('SELECT mean("loss") AS "l" FROM "training"', "measurement 'training'"),
        ('SELECT mean("los") AS "l" FROM "train"', "'los' is neither"),
        ('SELECT mean("loss") AS "l" FROM "train" GROUP BY "node"', "'node' is neither"),
        ('SELECT mean("util_pct") AS "u" FROM "gpu" WHERE "rank" = \'0\'', "'rank' is neither"),
        ('SHOW TAG VALUES FROM "train" WITH KEY = "loss"', "WITH KEY = 'loss'"),
        ('SELECT mean("loss") AS "l" FROM train', "no FROM"),
        ('SELECT mean("loss") AS "l" FROM "train" GROUP BY rank', "'rank' is unquoted"),
        ('SELECT mean("loss") AS "l" FROM "train" GROUP BY time(1s), "step"', "GROUP BY 'step': not a tag"),
        ('SELECT mean("loss") AS "l" FROM "train" WHERE "step" = \'3\'', "'step' compared with a string"),
        ('SELECT count("u") AS "n" FROM "gpu" WHERE "uuid" =~ /x/ AND "util_pct" =~ /9/', "'util_pct' compared"),
        ('SELECT mean("rank") AS "r" FROM "train"', "function of 'rank': not a field"),
    ],
)
def test_schema_problems_are_named(query: str, problem: str) -> None:
    assert any(problem in p for p in schema_problems(query)), schema_problems(query)


def test_quoted_values_are_not_taken_for_identifiers() -> None:
    assert schema_problems('SELECT last("step") AS "s" FROM "train" WHERE "run" = \'"x"\' AND "job" =~ /"y"/') == []


def test_extract_refuses_builder_targets_and_reads_collapsed_rows() -> None:
    panel = {"type": "stat", "title": "x", "targets": [{"refId": "A", "rawQuery": False, "query": "SELECT 1"}]}
    with pytest.raises(DashboardError, match="raw mode"):
        extract_queries({"uid": "u", "panels": [panel]})
    row = {"type": "row", "title": "r", "collapsed": True, "panels": [{**panel, "targets": [
        {"refId": "A", "rawQuery": True, "query": 'SELECT last("step") AS "s" FROM "train"'}]}]}  # fmt: skip
    (q,) = extract_queries({"uid": "u", "panels": [row]})
    assert (q.dashboard, q.kind, q.title, q.ref_id) == ("u", "panel", "x", "A")


def test_load_dashboard_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(DashboardError, match="bad.json: not valid JSON"):
        load_dashboard(bad)
    bad.write_text(json.dumps([1]))
    with pytest.raises(DashboardError, match="JSON object"):
        load_dashboard(bad)


def test_division_is_not_taken_for_a_regex() -> None:
    q = 'SELECT sum("mem_used_bytes") / sum("mem_total_bytes") AS "r" FROM "gpu" WHERE "node" =~ /^a\\/b$/'
    assert schema_problems(q) == []
    assert schema_problems(q.replace('"mem_total_bytes"', '"mem_free"')) != []

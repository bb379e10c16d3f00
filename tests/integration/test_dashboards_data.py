"""Every query of nuro's Grafana dashboards, expanded as Grafana would, against a real influxd 1.6.7 holding a run.

Why real: InfluxQL that parses in review can still fail on the server (subqueries, ``top()`` with tags, math
between aggregates) or return nothing (a tag compared as a field, a wrong quote). The data is what the SDK and the
node agent write: a 2-node run with 2 ranks (one per node), 8 GPUs per node, 60 s at 1 Hz, plus each writer's
``nuro_metrics`` counters and the controller's ``slurmctld`` points, written as plain line protocol over HTTP. A
second team's run checks that the team and run filters keep it out.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nuro.devcluster.dashboards import (
    DashboardQuery,
    TimeRange,
    expand,
    extract_queries,
    group_by_tags,
    load_dashboard,
    output_columns,
    variables,
)
from nuro.devcluster.tsdb import standalone_influx

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "dashboards").glob("*.json"))
DB = "nuro"
NODES = ("gpu-a01", "gpu-a02")
GPUS_PER_NODE = 8
SECONDS = 60
TEAM, RUN, JOB = "vision", "resnet-sweep-3", "4711"
TEAM_RUN2, TEAM_JOB2 = "resnet-sweep-4", "4712"  # the team's second, shorter run: the team view shows both
OTHER_TEAM, OTHER_RUN, OTHER_JOB = "nlp", "llama-ft", "4800"
INTERVAL_S = 5
HTTP_TIMEOUT_S = 10


# --- the server ---------------------------------------------------------------------------------------------------


def _free_port_pair(lo: int = 9000, hi: int = 9099) -> tuple[int, int]:
    """Two free loopback ports in [lo, hi]: HTTP and influxd's RPC (backup) listener, which cannot be turned off.

    The scan starts at a pid-dependent offset so that two test sessions running at once rarely race for a port.
    """
    free: list[int] = []
    for port in [*range(lo + os.getpid() % 50, hi + 1), *range(lo, lo + os.getpid() % 50)]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        free.append(port)
        if len(free) == 2:
            return free[0], free[1]
    pytest.fail(f"no two free ports in {lo}-{hi} on 127.0.0.1")


@pytest.fixture(scope="module")
def influx_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One influxd 1.6.7 for the module (loopback only, database ``nuro``), stopped by PID at the end."""
    http_port, rpc_port = _free_port_pair()
    with standalone_influx(tmp_path_factory.mktemp("influx"), http_port, db=DB, rpc_port=rpc_port) as server:
        yield server.url


# --- the data ----------------------------------------------------------------------------------------------------


def _post(url: str, path: str, body: bytes = b"") -> None:
    req = urllib.request.Request(url + path, data=body, method="POST")
    try:
        urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S).close()
    except urllib.error.HTTPError as e:
        pytest.fail(f"POST {path}: {e.code} {e.read().decode(errors='replace')}")


def _query(url: str, q: str) -> dict:
    params = urllib.parse.urlencode({"db": DB, "q": q, "epoch": "ms"})
    try:
        with urllib.request.urlopen(f"{url}/query?{params}", timeout=HTTP_TIMEOUT_S) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as e:
        pytest.fail(f"{q}\n-> HTTP {e.code}: {e.read().decode(errors='replace')}")
    result = body["results"][0]
    if "error" in result:
        pytest.fail(f"{q}\n-> influxd: {result['error']}")
    return result


def _train_lines(t0_ns: int, team: str, run: str, job: str, ranks: int, seconds: int) -> list[str]:
    lines = []
    for s in range(seconds):
        for rank in range(ranks):
            step = 10 * s + 10
            loss = 2.5 * 0.97**s + 0.01 * rank
            step_time_s = 0.1 + 0.002 * rank + 0.001 * (s % 5)
            tags = f"team={team},run={run},job={job},restart=0,rank={rank}"
            fields = f"step={step}i,loss={loss:.6f},step_time_s={step_time_s:.4f},samples_per_s={256 / step_time_s:.2f}"
            lines.append(f"train,{tags} {fields} {t0_ns + s * 10**9 + rank * 1000}")
    return lines


def _claim(node: int, gpu: int) -> str:
    """The job tags a GPU's points carry (``nuro.protocol.gpujobs``): GPUs 0-3 of both nodes run our job, 4-5 of the
    first
    node the team's second run, 4-5 of the second another team's job; 6-7 are idle."""
    if gpu < 4:
        return f",job={JOB},team={TEAM},run={RUN}"
    if gpu < 6:
        return (
            f",job={TEAM_JOB2},team={TEAM},run={TEAM_RUN2}"
            if node == 0
            else f",job={OTHER_JOB},team={OTHER_TEAM},run={OTHER_RUN}"
        )
    return ""


def _gpu_lines(t0_ns: int, seconds: int) -> list[str]:
    total = 80 * 2**30
    lines = []
    for s in range(seconds):
        for n, node in enumerate(NODES):
            for g in range(GPUS_PER_NODE):
                tags = f"node={node},gpu={g},uuid=GPU-{n:02d}{g:02d}-nuro,model=NVIDIA\\ H100\\ 80GB\\ HBM3"
                busy = 1.0 if g < 4 else 0.1  # only half of each node's GPUs run our ranks: spread in the graphs
                tags += _claim(n, g)
                fields = (
                    f"util_pct={min(100.0, 90 * busy + (s + g) % 7):.1f},mem_used_bytes={int(total * 0.6 * busy)}i,"
                    f"mem_total_bytes={total}i,temp_c={40 + 30 * busy + n + g % 3 + s % 2:.1f},"
                    f"sm_clock_mhz={1980 - 10 * (g % 2):.0f},power_w={100 + 550 * busy:.1f}"
                )
                lines.append(f"gpu,{tags} {fields} {t0_ns + s * 10**9 + n * 1000 + g}")
    return lines


def _self_lines(t0_ns: int, seconds: int) -> list[str]:
    lines = []
    for s in range(seconds):
        for rank, node in enumerate(NODES):
            tags = f"source=rank{rank},node={node},team={TEAM},run={RUN},job={JOB}"
            dropped = 0 if s < 40 else 5 * (s - 39) * rank  # rank 1's buffer overflows late in the run
            lines.append(
                f"nuro_metrics,{tags} written={s + 1}i,dropped={dropped}i,buffered={s % 3}i,errors=0i "
                f"{t0_ns + s * 10**9 + 500_000_000}"
            )
        for node in NODES:
            lines.append(
                f"nuro_metrics,source=agent,node={node} written={8 * (s + 1)}i,dropped=0i,buffered=0i,errors=0i "
                f"{t0_ns + s * 10**9 + 600_000_000}"
            )
    return lines


def _slurmctld_lines(t0_ns: int, seconds: int) -> list[str]:
    """What nuro-controller writes from slurmctld's OpenMetrics (Slurm 25.11+), every 10 s."""
    lines = []
    for s in range(0, seconds, 10):
        fields = (
            f"jobs_pending={12 - s // 10}i,jobs_running={4 + s // 10}i,gpus_alloc={8 * (4 + s // 10)}i,gpus_total=64i,"
            f"sched_cycle_last_us={900 + 37 * s}i,bf_cycle_last_us={5400 + 11 * s}i"
        )
        lines.append(f"slurmctld,controller=127.0.0.1:6817 {fields} {t0_ns + s * 10**9}")
    return lines


@pytest.fixture(scope="module")
def data(influx_url: str) -> TimeRange:
    """Write the run (plus a second run of the team and another team's run); return the range that covers it."""
    t0_s = int(time.time()) - 2 * SECONDS
    t0_ns = t0_s * 10**9
    lines = [
        *_train_lines(t0_ns, TEAM, RUN, JOB, ranks=2, seconds=SECONDS),
        *_train_lines(t0_ns, TEAM, TEAM_RUN2, TEAM_JOB2, ranks=1, seconds=30),
        *_train_lines(t0_ns, OTHER_TEAM, OTHER_RUN, OTHER_JOB, ranks=1, seconds=10),
        *_gpu_lines(t0_ns, SECONDS),
        *_self_lines(t0_ns, SECONDS),
        *_slurmctld_lines(t0_ns, SECONDS),
    ]
    for i in range(0, len(lines), 5000):
        _post(influx_url, f"/write?db={DB}&precision=ns", "\n".join(lines[i : i + 5000]).encode())
    return TimeRange(t0_s * 1000, (t0_s + SECONDS) * 1000)


# --- the dashboards' queries ---------------------------------------------------------------------------------------

_DASH = {path.stem: load_dashboard(path) for path in DASHBOARDS}
_WANTED = {"team": TEAM, "run": RUN, "job": JOB}
_GPU_INDEXES = {str(g) for g in range(GPUS_PER_NODE)}
# What each group-by tag must take across a panel's series, per dashboard (cluster: All nodes; team: its runs only;
# run: our run's ranks, writers and nodes).
_EXPECTED_TAG_VALUES = {
    "cluster": {"node": set(NODES), "gpu": _GPU_INDEXES},
    "team": {"run": {RUN, TEAM_RUN2}},
    "run": {
        "rank": {"0", "1"},
        "restart": {"0"},
        "source": {"rank0", "rank1"},
        "node": set(NODES),
        "gpu": {"0", "1", "2", "3"},  # the job's own GPUs, not every GPU of its nodes
    },
}


@pytest.fixture(scope="module")
def variable_values(influx_url: str, data: TimeRange) -> dict[str, dict[str, list[str]]]:
    """Each dashboard's variables resolved in order, as Grafana chains them: a single-value variable takes our run's
    team/run/job, a multi-value one "All" (every value its query returns)."""
    resolved: dict[str, dict[str, list[str]]] = {}
    for name, dash in _DASH.items():
        values: dict[str, list[str]] = {}
        regex = {v.name for v in variables(dash) if v.is_regex}
        for var in variables(dash):
            q = expand(var.query, data, INTERVAL_S, values, regex)
            series = _query(influx_url, q).get("series", [])
            got = [row[1] for s in series for row in s["values"]]
            assert got, f"{name}: variable ${var.name} lists no values: {q}"
            if var.is_regex:
                values[var.name] = got
            else:
                want = _WANTED.get(var.name, got[0])
                assert want in got, f"{name}: ${var.name} lists {got}, not {want!r}: {q}"
                values[var.name] = [want]
        resolved[name] = values
    return resolved


def test_run_variables_follow_the_chosen_team_and_run(influx_url: str, data: TimeRange) -> None:
    """The run view's chained variables list only what the chosen team and run have: the team's two runs (not the
    other team's), the run's job, and the two nodes it reports from."""
    listed: dict[str, list[str]] = {}
    for var in variables(_DASH["run"]):
        q = expand(var.query, data, INTERVAL_S, {k: _WANTED[k] for k in listed if k in _WANTED}, {"node"})
        listed[var.name] = sorted(row[1] for s in _query(influx_url, q).get("series", []) for row in s["values"])
    assert listed == {
        "team": sorted([TEAM, OTHER_TEAM]),
        "run": sorted([RUN, TEAM_RUN2]),
        "job": [JOB],
        "node": sorted(NODES),
    }


def _cases() -> list[tuple[str, DashboardQuery]]:
    return [(name, q) for name, dash in _DASH.items() for q in extract_queries(dash) if q.kind == "panel"]


@pytest.mark.parametrize(("dash_name", "dq"), _cases(), ids=[f"{n}:{q.title}:{q.ref_id}" for n, q in _cases()])
def test_panel_query_returns_rows(
    influx_url: str, data: TimeRange, variable_values: dict[str, dict[str, list[str]]], dash_name: str,
    dq: DashboardQuery,
) -> None:  # fmt: skip
    """Each panel query, expanded, returns series with the columns and group-by tags the panel is drawn from,
    every value of those tags the data has (and only those), at least one non-null value."""
    dash = _DASH[dash_name]
    regex = {v.name for v in variables(dash) if v.is_regex}
    q = expand(dq.query, data, INTERVAL_S, variable_values[dash_name], regex)
    series = _query(influx_url, q).get("series", [])
    assert series, f"{dash_name} / {dq.title}: no rows for {q}"
    columns, tags = output_columns(dq.query), set(group_by_tags(dq.query))
    for s in series:
        assert s["columns"] == columns, f"{dash_name} / {dq.title}: columns {s['columns']} != {columns}: {q}"
        assert set(s.get("tags", {})) == tags, f"{dash_name} / {dq.title}: tags {s.get('tags')} != {tags}: {q}"
        assert OTHER_RUN not in s.get("tags", {}).values()
    for tag in tags:
        got = {s["tags"][tag] for s in series}
        assert got == _EXPECTED_TAG_VALUES[dash_name][tag], f"{dash_name} / {dq.title}: {tag} values {got}: {q}"
    values = [v for s in series for row in s["values"] for v in row[1:]]
    assert any(v is not None for v in values), f"{dash_name} / {dq.title}: only nulls for {q}"


@pytest.mark.parametrize(("dash_name", "title", "want"), [("team", "GPUs in use", 10), ("run", "GPU utilisation", 8)])
def test_gpus_counted_are_the_claimed_ones(
    influx_url: str, data: TimeRange, variable_values: dict[str, dict[str, list[str]]], dash_name: str, title: str,
    want: int,
) -> None:  # fmt: skip
    """The team holds GPUs 0-5 of the first node and 0-3 of the second (10); the run's job holds 0-3 of each (8).
    Idle GPUs and another team's never count, though they share the nodes."""
    dq = next(q for q in extract_queries(_DASH[dash_name]) if q.kind == "panel" and q.title == title)
    regex = {v.name for v in variables(_DASH[dash_name]) if v.is_regex}
    q = expand(dq.query, data, INTERVAL_S, variable_values[dash_name], regex)
    series = _query(influx_url, q).get("series", [])
    if dash_name == "run":  # one series per (node, gpu)
        assert len(series) == want, [s["tags"] for s in series]
    else:  # one count over the range
        assert [row[1] for s in series for row in s["values"] if row[1] is not None] == [want], series

"""Read nuro's Grafana dashboards as data: every panel's and variable's InfluxQL, Grafana's macros expanded. Pure.

Why: the dashboards under ``dashboards/`` are JSON that only Grafana runs. To know that each query is valid InfluxQL,
names only measurements, tags and fields of the schema (``nuro.metrics.model``) and returns rows, the tests need the
exact query Grafana would send. This module extracts the queries and expands them the way Grafana's InfluxDB
datasource does, so a real influxd can answer them.

Expansion rules (Grafana's InfluxQL datasource):

=========================  ==========================================================================
``$timeFilter``,           ``time >= <start>ms and time <= <end>ms`` (epoch milliseconds, both ends inclusive)
``$__timeFilter``
``$__interval``,           the panel's group-by interval, e.g. ``5s``, ``1m``, ``500ms``
``$interval``
``$__interval_ms``         the same interval in integer milliseconds
``$var``, ``${var}``,      a template variable: a single-value variable is substituted verbatim (it sits in a
``[[var]]``                ``'…'`` string; a value with ``'`` or ``\\`` is refused); a multi-value or include-all
                           variable is regex-escaped and, with several values, joined as ``(a|b)`` (it sits
                           in a ``/^…$/`` regex)
=========================  ==========================================================================

Example::

    dash = load_dashboard(Path("dashboards/run.json"))
    for q in extract_queries(dash):
        print(expand(q.query, TimeRange(start_ms, end_ms), interval_s=5, values={"team": "vision"}))
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nuro.metrics.model import GPU, GPU_TAGS, SELF, SELF_TAGS, SLURMCTLD, SLURMCTLD_TAGS, TRAIN, TRAIN_TAGS
from nuro.slurm.openmetrics import FIELDS as SLURMCTLD_FIELDS
from nuro.slurm.openmetrics import SUMS as SLURMCTLD_SUMS

# Field names per measurement. model.py names them in its docstring only (tags have constants there); keep this
# table in step with it. ``train`` also carries free-form custom scalars, which no dashboard may rely on.
SCHEMA_FIELDS: Mapping[str, tuple[str, ...]] = {
    TRAIN: ("step", "loss", "step_time_s", "samples_per_s"),
    GPU: ("util_pct", "mem_used_bytes", "mem_total_bytes", "temp_c", "sm_clock_mhz", "power_w"),
    SELF: ("written", "dropped", "buffered", "errors"),
    SLURMCTLD: (*SLURMCTLD_FIELDS.values(), *SLURMCTLD_SUMS.values()),
}
SCHEMA_TAGS: Mapping[str, tuple[str, ...]] = {
    TRAIN: TRAIN_TAGS,
    GPU: GPU_TAGS,
    SELF: SELF_TAGS,
    SLURMCTLD: SLURMCTLD_TAGS,
}

VarValue = str | Sequence[str]


class DashboardError(ValueError):
    """A dashboard or query nuro cannot read or expand; the message names the dashboard, panel or variable."""


@dataclass(frozen=True)
class TimeRange:
    """A dashboard time range in epoch milliseconds, both ends inclusive (as Grafana's ``$timeFilter``)."""

    start_ms: int
    end_ms: int

    def __post_init__(self) -> None:
        if self.end_ms < self.start_ms:
            raise DashboardError(f"time range ends ({self.end_ms} ms) before it starts ({self.start_ms} ms)")


@dataclass(frozen=True)
class TemplateVariable:
    """A dashboard's query variable: its name, the InfluxQL (``SHOW TAG VALUES …``) that lists its values, and
    whether its values are formatted as a regex (``multi`` or ``include_all``) when expanded."""

    name: str
    query: str
    multi: bool
    include_all: bool

    @property
    def is_regex(self) -> bool:
        return self.multi or self.include_all


@dataclass(frozen=True)
class DashboardQuery:
    """One InfluxQL query of a dashboard. ``kind`` is ``"panel"`` (``title`` is the panel title, ``ref_id`` the
    target's refId) or ``"variable"`` (``title`` is the variable name, ``ref_id`` empty)."""

    dashboard: str
    kind: str
    title: str
    ref_id: str
    query: str
    result_format: str = "time_series"


def load_dashboard(path: Path) -> dict[str, Any]:
    """Parse a dashboard JSON file; raise DashboardError (with the path) if it is not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DashboardError(f"{path}: not valid JSON ({e}); fix the file or re-export it from Grafana") from e
    if not isinstance(data, dict):
        raise DashboardError(f"{path}: a dashboard is a JSON object, got {type(data).__name__}")
    return data


def iter_panels(dashboard: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """Every panel, including those nested in collapsed rows (Grafana keeps those under the row's ``panels``)."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: Mapping[str, Any]) -> list[TemplateVariable]:
    """The dashboard's query variables, in order (later ones may refer to earlier ones, as Grafana chains them)."""
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        query = v.get("query")
        if isinstance(query, Mapping):  # newer Grafana stores {"query": "...", "refId": ...}
            query = query.get("query")
        if not isinstance(query, str) or not query.strip():
            raise DashboardError(f"{dashboard.get('uid')}: variable {v.get('name')!r} has no query")
        out.append(TemplateVariable(v["name"], query, bool(v.get("multi")), bool(v.get("includeAll"))))
    return out


def extract_queries(dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    """Every variable query, then every panel target's raw InfluxQL, in dashboard order.

    Raises DashboardError for a target without a raw query: nuro's dashboards keep InfluxQL as text (``rawQuery``)
    so that it can be read, reviewed and tested; a query-builder target would hide it.
    """
    uid = str(dashboard.get("uid", "?"))
    out = [DashboardQuery(uid, "variable", v.name, "", v.query, "table") for v in variables(dashboard)]
    for panel in iter_panels(dashboard):
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets", []):
            query = target.get("query")
            if not target.get("rawQuery") or not isinstance(query, str) or not query.strip():
                raise DashboardError(
                    f"{uid}: panel {panel.get('title')!r} target {target.get('refId')!r} has no raw InfluxQL "
                    "query; switch the target to raw mode (rawQuery: true, query: '...')"
                )
            out.append(
                DashboardQuery(
                    uid,
                    "panel",
                    str(panel.get("title")),
                    str(target.get("refId", "")),
                    query,
                    str(target.get("resultFormat", "time_series")),
                )  # fmt: skip
            )
    return out


def format_interval(interval_s: float) -> str:
    """Grafana's rendering of an interval: whole minutes as ``Nm``, whole seconds as ``Ns``, else ``Nms``."""
    ms = round(interval_s * 1000)
    if ms <= 0:
        raise DashboardError(f"interval must be positive, got {interval_s} s")
    if ms % 60_000 == 0:
        return f"{ms // 60_000}m"
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def _escape_regex(value: str) -> str:
    # InfluxQL regexes are Go RE2 between slashes: escape regex metacharacters and the delimiter itself.
    return re.sub(r"([\\/^$.|?*+()\[\]{}])", r"\\\1", value)


def _format_value(name: str, value: VarValue, is_regex: bool) -> str:
    values = [value] if isinstance(value, str) else list(value)
    if not values:
        raise DashboardError(f"variable ${name} has no value; give at least one")
    if not is_regex:
        if len(values) != 1:
            raise DashboardError(f"variable ${name} is single-value but got {values}; pass one value")
        if "'" in values[0] or "\\" in values[0]:
            # Grafana substitutes a single value verbatim (its influxdb datasource tests: "should return the value
            # as it is"), so a quote would end the InfluxQL string early there too: refuse rather than differ.
            raise DashboardError(f"variable ${name} = {values[0]!r}: Grafana would insert ' or \\ unescaped")
        return values[0]
    escaped = [_escape_regex(v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")


def expand(
    query: str,
    time_range: TimeRange,
    interval_s: float,
    values: Mapping[str, VarValue] | None = None,
    regex_vars: Iterable[str] = (),
) -> str:
    """The concrete InfluxQL Grafana would send for ``query`` (rules in the module docstring).

    Args:
        query: a panel's or variable's InfluxQL with Grafana macros and ``$var`` references.
        time_range: the dashboard's time range.
        interval_s: the group-by interval in seconds (Grafana derives it from the range, the panel's max data
            points and the datasource's min interval; tests pass it directly).
        values: each referenced variable's value; a list for multi-value or include-all ("All" = every value).
        regex_vars: names of the variables formatted as regexes (``TemplateVariable.is_regex``).

    Raises:
        DashboardError: a ``$name`` that is neither a macro nor in ``values`` (it would reach InfluxDB verbatim).
    """
    values = values or {}
    regex = set(regex_vars)
    interval = format_interval(interval_s)
    macros = {
        "__timeFilter": f"time >= {time_range.start_ms}ms and time <= {time_range.end_ms}ms",
        "timeFilter": f"time >= {time_range.start_ms}ms and time <= {time_range.end_ms}ms",
        "__interval_ms": str(round(interval_s * 1000)),
        "__interval": interval,
        "interval": interval,
    }

    def substitute(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in macros:
            return macros[name]
        if name in values:
            return _format_value(name, values[name], name in regex)
        raise DashboardError(f"query refers to ${name}, which is neither a Grafana macro nor a given variable")

    return _VAR.sub(substitute, query)


# --- What a query refers to: measurements, tags, fields, output columns --------------------------------------------

_IDENT = re.compile(r'"([^"]+)"')
_FROM = re.compile(r'\bFROM\s+"([^"]+)"', re.IGNORECASE)
_ALIAS = re.compile(r'\bAS\s+"([^"]+)"', re.IGNORECASE)
_SHOW_KEY = re.compile(r'\bWITH\s+KEY\s*=\s*"([^"]+)"', re.IGNORECASE)
_GROUP_BY = re.compile(r'\bGROUP\s+BY\s+((?:time\([^)]*\)|"[^"]+"|[\s,])+)', re.IGNORECASE)
_TAG_CMP = re.compile(r'"([^"]+)"\s*(?:=~|!~|!=|<>|=)\s*\'')  # after blanking, a regex literal is '' too
_CALL_ARG = re.compile(r'\b[A-Za-z_]\w*\(\s*"([^"]+)"')
# String literals and regex literals (only after =~ or !~: elsewhere "/" divides), blanked before names are checked.
_STRINGS = re.compile(r"'(?:[^'\\]|\\.)*'|(?<=~)\s*/(?:[^/\\]|\\.)*/")
_SUBQUERY = re.compile(r"\(\s*SELECT\b", re.IGNORECASE)


def measurements(query: str) -> list[str]:
    """Measurements named after FROM (subqueries included), in order of appearance."""
    return _FROM.findall(query)


def _outer_select_list(query: str) -> list[str]:
    """The top-level SELECT items of the outermost query (parenthesised subqueries and calls kept whole)."""
    m = re.match(r"\s*SELECT\s+", query, re.IGNORECASE)
    if not m:
        return []
    items, depth, start = [], 0, m.end()
    i = start
    while i < len(query):
        c = query[i]
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif depth == 0 and c == ",":
            items.append(query[start:i].strip())
            start = i + 1
        elif depth == 0 and re.match(r"\s+FROM\b", query[i:], re.IGNORECASE):
            break
        i += 1
    items.append(query[start:i].strip())
    return items


def output_columns(query: str) -> list[str]:
    """The columns InfluxDB returns for ``query``: ``time`` then each outer SELECT item's alias or tag name; for
    ``SHOW TAG VALUES`` ``key`` and ``value``.

    Raises DashboardError for a SELECT expression without ``AS "name"``: InfluxDB would name it after the function
    (``mean``, ``mean_1``), which is fragile; nuro's dashboards alias every expression.
    """
    if re.match(r"\s*SHOW\s+TAG\s+VALUES\b", query, re.IGNORECASE):
        return ["key", "value"]
    columns = ["time"]
    for item in _outer_select_list(query):
        alias = re.search(r'\bAS\s+"([^"]+)"\s*$', item, re.IGNORECASE)
        if alias:
            columns.append(alias.group(1))
        elif re.fullmatch(r'"[^"]+"', item):
            columns.append(item.strip('"'))
        else:
            raise DashboardError(f'SELECT item {item!r} has no alias; write it as {item} AS "name"')
    return columns


def _without_subqueries(query: str) -> str:
    """``query`` with every parenthesised ``(SELECT …)`` replaced by ``()``, leaving the outermost query's text."""
    out, i = [], 0
    while i < len(query):
        if not _SUBQUERY.match(query, i):
            out.append(query[i])
            i += 1
            continue
        depth, j = 0, i
        while j < len(query):
            depth += {"(": 1, ")": -1}.get(query[j], 0)
            j += 1
            if depth == 0:
                break
        out.append("()")
        i = j
    return "".join(out)


def group_by_tags(query: str) -> list[str]:
    """The tags of the outermost GROUP BY (``time(...)`` left out): each series InfluxDB returns carries them."""
    m = re.search(
        r"\bGROUP\s+BY\s+(.*?)(?:\bfill\(|\bORDER\b|\bLIMIT\b|\bSLIMIT\b|$)", _without_subqueries(query), re.I | re.S
    )
    return _IDENT.findall(m.group(1)) if m else []


def schema_problems(query: str) -> list[str]:
    """What in ``query`` is not in nuro's metric schema; empty when every name checks out.

    Checked: every measurement after FROM is one of ``train``, ``gpu``, ``nuro_metrics``; every double-quoted
    identifier is a tag or field of one of the query's measurements or an alias the query defines; and by position,
    because InfluxDB answers a misplaced name with silence rather than an error: GROUP BY and ``WITH KEY`` name
    tags, a string or regex comparison (``"x" = '…'``, ``"x" =~ /…/``) names a tag, and a function's first argument
    names a field (or an alias from a subquery). Unquoted identifiers are refused, so nothing escapes the check.
    """
    problems: list[str] = []
    bare = _STRINGS.sub("''", query)
    names = measurements(bare)
    if not names:
        problems.append('no FROM "measurement" (quote measurement names so they can be checked)')
    unknown = [n for n in names if n not in SCHEMA_FIELDS]
    problems += [f"measurement {n!r} is not in the schema ({', '.join(SCHEMA_FIELDS)})" for n in unknown]
    known = [n for n in names if n in SCHEMA_FIELDS]
    allowed = {x for n in known for x in (*SCHEMA_FIELDS[n], *SCHEMA_TAGS[n])} | set(_ALIAS.findall(bare))
    for key in _SHOW_KEY.findall(bare):
        if not any(key in SCHEMA_TAGS[n] for n in known):
            problems.append(f"WITH KEY = {key!r} is not a tag of {', '.join(known) or 'the measurement'}")
    for ident in _IDENT.findall(bare):
        if ident not in allowed and ident not in names:
            problems.append(f"{ident!r} is neither a tag nor a field of {', '.join(known) or 'the measurement'}")
    tags = {t for n in known for t in SCHEMA_TAGS[n]}
    fields = {f for n in known for f in SCHEMA_FIELDS[n]} | set(_ALIAS.findall(bare))
    group_by = [i for clause in _GROUP_BY.findall(bare) for i in _IDENT.findall(clause)]
    problems += [f"GROUP BY {i!r}: not a tag (group by tags only)" for i in group_by if i in allowed and i not in tags]
    problems += [
        f"{i!r} compared with a string or regex: not a tag"
        for i in _TAG_CMP.findall(bare)
        if i in allowed and i not in tags
    ]
    problems += [f"function of {i!r}: not a field" for i in _CALL_ARG.findall(bare) if i in allowed and i not in fields]
    unquoted = re.findall(r"\b(?:FROM|BY|KEY\s*=)\s+([A-Za-z_]\w*)", bare, re.IGNORECASE)
    problems += [f'identifier {u!r} is unquoted; write "{u}"' for u in unquoted if u.lower() != "time"]
    return problems

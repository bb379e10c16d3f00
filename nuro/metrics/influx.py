"""InfluxDB sinks: ``influx1://`` (v1 HTTP API) and ``influx2://`` (influxdb-client's v2 ``write_api``).

Writes:
- v1 (``InfluxV1Sink``): line protocol ``POST /write?db=DB&precision=ns``. Portable: InfluxDB 1.x, 2.x (v1
  compatibility API) and 3.x all accept it, and it is the only write path Debian's influxd 1.6.7 has.
- v2 (``InfluxV2Sink``): ``influxdb_client`` ``write_api`` (synchronous, no client-side retries: ``BufferedWriter``
  owns retrying) to ``/api/v2/write``; InfluxDB 2.x/3.x and victoria-metrics accept it, influxd 1.6.7 answers 404.

Reads (both): InfluxQL ``GET /query?db=…&epoch=ns``. Flux is not used: 1.6.7 and 3.x lack it, and InfluxQL is the
one read language that 1.x, 2.x (v1 compatibility, database = bucket) and 3.x share.

Quoting (``quote_ident``/``quote_str``, line-protocol ``_esc_*``) is where user-controlled strings (run names, team
names) meet the server, so it is exact and unit-tested with hostile values:

=====================  ====================================================================================
where                  rule
=====================  ====================================================================================
InfluxQL identifier    double quotes; ``\\`` and ``"`` backslash-escaped
InfluxQL string        single quotes; ``\\``, ``'`` and newline backslash-escaped
LP measurement         ``,`` and space backslash-escaped
LP tag key/value,      ``,`` ``=`` and space backslash-escaped; other backslashes are literal (1.6.7 has no escape
field key              for one); a value ending in ``\\`` cannot be written: ``InvalidPoint`` → ``SinkRejected``
LP string field        double quotes; ``\\`` and ``"`` backslash-escaped
=====================  ====================================================================================
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.parse
from collections.abc import Mapping, Sequence

import urllib3

from nuro.metrics.base import SinkError, SinkRejected, SinkUnavailable
from nuro.metrics.model import _NAME, FieldValue, InvalidPoint, Point, Query, Row

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


# -- quoting ------------------------------------------------------------------------------------------------------
def quote_ident(name: str) -> str:
    """An InfluxQL identifier (measurement, tag, field, database), always double-quoted."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def quote_str(value: str) -> str:
    """An InfluxQL string literal (a tag value in WHERE), single-quoted."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


_MEAS_ESC = str.maketrans({",": "\\,", " ": "\\ "})
_KEY_ESC = str.maketrans({",": "\\,", "=": "\\=", " ": "\\ "})


def _esc_key(s: str) -> str:
    if s.endswith("\\"):
        # influxd reads a separator preceded by a backslash as escaped, and has no escape for the backslash itself
        # (1.6.7 stores `\\` as two characters), so a value ending in one cannot be written at all.
        raise InvalidPoint(f"{s!r}: InfluxDB line protocol cannot carry a tag/key ending in a backslash")
    return s.translate(_KEY_ESC)


def _field_value(v: FieldValue) -> str:
    if isinstance(v, bool):  # before int: bool is an int
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        return repr(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def line(p: Point) -> str:
    """One point in line protocol, tags sorted by key (InfluxDB's preferred order), timestamp in ns."""
    head = p.measurement.translate(_MEAS_ESC)
    tags = "".join(f",{_esc_key(k)}={_esc_key(v)}" for k, v in sorted(p.tags.items()))
    fields = ",".join(f"{_esc_key(k)}={_field_value(v)}" for k, v in p.fields.items())
    return f"{head}{tags} {fields} {p.ts_ns}"


def lines(points: Sequence[Point]) -> str:
    return "\n".join(line(p) for p in points)


def _encode(points: Sequence[Point], sink_name: str) -> str:
    try:
        return lines(points)
    except InvalidPoint as exc:
        raise SinkRejected(f"{sink_name}: {exc}") from exc


def build_influxql(q: Query) -> str:
    """The SELECT for one ``Query`` (see ``Query``'s docstring for the meaning of each part)."""
    for name in (q.measurement, *q.where, *q.fields):
        if not _NAME.fullmatch(name):
            raise ValueError(f"query on {q.measurement!r}: {name!r} is not a valid measurement/tag/field name")
    # With named fields the tags are asked for with *::tag so each row still says which series it belongs to.
    cols = ", ".join([quote_ident(f) for f in q.fields] + ["*::tag"]) if q.fields else "*"
    where = [f"{quote_ident(k)} = {quote_str(v)}" for k, v in sorted(q.where.items())]
    if q.since_ns is not None:
        where.append(f"time >= {int(q.since_ns)}")  # a bare integer in a time comparison is ns
    if q.until_ns is not None:
        where.append(f"time < {int(q.until_ns)}")
    sql = f"SELECT {cols} FROM {quote_ident(q.measurement)}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if q.limit is not None:
        sql += f" ORDER BY time DESC LIMIT {int(q.limit)}"
    return sql


def _coerce(value: object, ftype: str | None) -> FieldValue:
    """JSON loses the float/int distinction (1.0 arrives as 1): restore it from SHOW FIELD KEYS."""
    if ftype == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if ftype == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value  # type: ignore[return-value]


def parse_rows(body: Mapping) -> list[Row]:
    """Rows from the JSON of the three statements ``_InfluxQLReader`` sends (SELECT; SHOW TAG KEYS; SHOW FIELD
    KEYS); raises SinkError with the server's message when a statement failed."""
    results = body.get("results") or []
    for res in results:
        if "error" in res:
            raise SinkError(str(res["error"]))
    if len(results) != 3:
        raise SinkError(f"expected 3 statement results, got {len(results)}")
    tag_keys = {v[0] for s in results[1].get("series") or [] for v in s.get("values") or []}
    field_types = {v[0]: v[1] for s in results[2].get("series") or [] for v in s.get("values") or []}
    rows: list[Row] = []
    for series in results[0].get("series") or []:
        cols = series["columns"]
        series_tags = dict(series.get("tags") or {})
        for values in series.get("values") or []:
            tags = dict(series_tags)
            fields: dict[str, FieldValue] = {}
            for col, val in zip(cols[1:], values[1:], strict=True):
                if val is None:
                    continue
                if col in tag_keys:
                    tags[col] = val
                else:
                    fields[col] = _coerce(val, field_types.get(col))
            if fields:
                rows.append(Row(ts_ns=int(values[0]), tags=tags, fields=fields))
    rows.sort(key=lambda r: r.ts_ns)  # oldest first also when the SELECT ran newest first (LIMIT)
    return rows


def basic_auth(user: str, password: str) -> str:
    """The ``Authorization`` header of an InfluxDB 1.x user (auth-enabled influxd): HTTP Basic, password = token."""
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


class _HttpBase:
    """Shared HTTP plumbing: one connection pool, error classification, InfluxQL reads."""

    def __init__(self, base_url: str, db: str, token: str | None, timeout_s: float, user: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.db = db
        self.timeout_s = timeout_s
        if user:  # an InfluxDB 1.x user (auth-enabled): HTTP Basic, password = token
            self._headers = {"Authorization": basic_auth(user, token or "")}
        else:
            self._headers = {"Authorization": f"Token {token}"} if token else {}
        # retries=False: BufferedWriter owns retrying; a sink call must fail fast and say why.
        self._http = urllib3.PoolManager(
            num_pools=2, maxsize=4, retries=False, timeout=urllib3.Timeout(connect=2.0, read=timeout_s)
        )
        self.name = ""

    def _request(self, method: str, path: str, what: str, **kw) -> urllib3.BaseHTTPResponse:
        url = f"{self.base_url}{path}"
        try:
            resp = self._http.request(method, url, headers={**self._headers, **kw.pop("headers", {})}, **kw)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SinkUnavailable(f"{self.name}: {what}: {type(exc).__name__}: {exc}") from exc
        if resp.status < 300:
            return resp
        text = resp.data[:500].decode(errors="replace").strip()
        msg = f"{self.name}: {what}: HTTP {resp.status}: {text}"
        if resp.status in RETRYABLE_STATUS:
            raise SinkUnavailable(msg)
        if resp.status == 404 and "database not found" in text:
            # A missing database is an operator fix (create it), not bad points: keep buffering until it exists.
            raise SinkUnavailable(msg + f" (create it: CREATE DATABASE {quote_ident(self.db)})")
        raise SinkRejected(msg)

    def query(self, q: Query) -> list[Row]:
        sql = f"{build_influxql(q)}; SHOW TAG KEYS FROM {quote_ident(q.measurement)}; "
        sql += f"SHOW FIELD KEYS FROM {quote_ident(q.measurement)}"
        params = urllib.parse.urlencode({"db": self.db, "q": sql, "epoch": "ns"})
        resp = self._request("GET", f"/query?{params}", f"query on {q.measurement}")
        try:
            body = json.loads(resp.data)
        except ValueError as exc:
            raise SinkError(f"{self.name}: query on {q.measurement}: not JSON: {resp.data[:200]!r}") from exc
        try:
            rows = parse_rows(body)
        except SinkError as exc:
            raise SinkError(f"{self.name}: query on {q.measurement} ({sql}) failed: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise SinkError(f"{self.name}: query on {q.measurement}: unexpected answer ({exc})") from exc
        return rows

    def close(self) -> None:
        self._http.clear()


class InfluxV1Sink(_HttpBase):
    """``influx1://HOST:PORT/DB``: line-protocol writes and InfluxQL reads over the v1 HTTP API.

    Args:
        base_url: ``http://HOST:PORT``.
        db: the database (on 2.x: a bucket mapped through the v1 compatibility API).
        token: sent as ``Authorization: Token …`` when given (2.x/3.x); influxd 1.x without auth ignores it.
        timeout_s: per request (read); connecting has 2 s.
        user: an InfluxDB 1.x user (``auth-enabled``): sent as HTTP Basic with ``token`` as the password.
    """

    def __init__(
        self, base_url: str, db: str, *, token: str | None = None, timeout_s: float = 10.0, user: str | None = None
    ) -> None:
        super().__init__(base_url, db, token, timeout_s, user)
        self.name = f"influx1 {self.base_url}/{db}"
        self._write_path = "/write?" + urllib.parse.urlencode({"db": db, "precision": "ns"})

    def sibling(self, db: str) -> InfluxV1Sink:
        """The same server and credential on database ``db`` (a team's reader of the platform ``gpu`` points)."""
        other = InfluxV1Sink(self.base_url, db, timeout_s=self.timeout_s)
        other._headers = dict(self._headers)
        return other

    def write(self, points: Sequence[Point]) -> None:
        if not points:
            return
        body = _encode(points, self.name).encode()
        self._request(
            "POST",
            self._write_path,
            f"write of {len(points)} points",
            body=body,
            headers={"Content-Type": "text/plain; charset=utf-8"},
        )


class InfluxV2Sink(_HttpBase):
    """``influx2://HOST:PORT?org=O&bucket=B``: influxdb-client ``write_api`` writes, InfluxQL reads (db = bucket).

    Args:
        base_url: ``http://HOST:PORT``.
        org, bucket: where points go.
        token: the API token (``NURO_METRICS_TOKEN``); victoria-metrics ignores it.
        timeout_s: per request.
    """

    def __init__(self, base_url: str, org: str, bucket: str, *, token: str = "", timeout_s: float = 10.0) -> None:
        # lazy: influxdb_client takes ~0.4 s to import and only influx2:// sinks use it (not influx1://, not a CLI)
        from influxdb_client import InfluxDBClient
        from influxdb_client.client.write_api import SYNCHRONOUS

        super().__init__(base_url, bucket, token or None, timeout_s)
        self.org, self.bucket = org, bucket
        self.name = f"influx2 {self.base_url}?{urllib.parse.urlencode({'org': org, 'bucket': bucket})}"
        self._client = InfluxDBClient(
            url=self.base_url, token=token, org=org, timeout=int(timeout_s * 1000), retries=False
        )
        self._write_api = self._client.write_api(write_options=SYNCHRONOUS)

    def write(self, points: Sequence[Point]) -> None:
        # lazy: influxdb_client only on the influx2:// path, as in __init__ (already loaded by the time a write comes)
        from influxdb_client import WritePrecision
        from influxdb_client.rest import ApiException

        if not points:
            return
        try:
            self._write_api.write(
                bucket=self.bucket,
                org=self.org,
                record=_encode(points, self.name),
                write_precision=WritePrecision.NS,
            )
        except ApiException as exc:
            text = (exc.body or exc.reason or "")[:500] if isinstance(exc.body or "", str) else str(exc.reason)
            msg = f"{self.name}: write of {len(points)} points: HTTP {exc.status}: {text}"
            if exc.status is None or exc.status in RETRYABLE_STATUS:
                raise SinkUnavailable(msg) from exc
            raise SinkRejected(msg) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise SinkUnavailable(f"{self.name}: write of {len(points)} points: {type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        self._write_api.close()
        self._client.close()
        super().close()

"""Local TSDB servers for the dev cluster and tests: InfluxDB 1.6.7 (``influxd``) and victoria-metrics (Debian).

Why these two (measured): no InfluxDB 2.x/3.x installs here. Debian's ``influxdb`` 1.6.7 speaks the v1 API
(line protocol ``/write``, InfluxQL ``/query``), which is what nuro's ``influx1://`` sink uses and what 2.x/3.x also
serve. victoria-metrics 1.79 accepts influxdb-client's v2 ``write_api`` on ``/api/v2/write``, so it is the only
local server that exercises the ``influx2://`` write path (it is read back with PromQL, not InfluxQL).

What is pinned and why:

- influxd gets a generated config (``influx_config``): HTTP on ``127.0.0.1:PORT`` only; the RPC/backup listener
  (``bind-address``, default ``:8088`` on every interface) moved to ``127.0.0.1:RPC_PORT`` because it cannot be
  disabled and two servers would collide on 8088; graphite/collectd/opentsdb/udp/ifql listeners off (1.6.7 opens
  nothing else, checked with ``ss``); usage reporting, ``_internal`` self-monitoring, pprof, the HTTP access log,
  the query log and continuous queries off (CPU on 2 shared cores); meta/data/wal in the given state dir.
- victoria-metrics: ``-httpListenAddr=127.0.0.1:PORT`` (its only listener unless graphite/influx/opentsdb
  addresses are given), ``-search.latencyOffset=0s`` (by default it hides the newest 30 s, which would make a
  write-then-read test wait), ``-search.disableCache`` (read-your-writes in tests), ``-selfScrapeInterval=0``.
- Processes are started as our children and stopped by PID (``Popen`` handle), never by name.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import urllib3

from nuro.devcluster.install import ensure_packages
from nuro.metrics.influx import quote_ident

log = logging.getLogger(__name__)

INFLUX_PACKAGE = {"influxdb": "/usr/bin/influxd"}
VM_PACKAGE = {"victoria-metrics": "/usr/bin/victoria-metrics"}
_HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=0.5, read=5.0))


class ServerError(RuntimeError):
    """A TSDB server did not start or answer; the message names it, its port and its log file."""


def ensure_influxd() -> Path:
    """``influxd``, installed with apt-get (as root) when missing."""
    ensure_packages(packages=INFLUX_PACKAGE)
    return Path(shutil.which("influxd") or INFLUX_PACKAGE["influxdb"])


def ensure_victoria_metrics() -> Path:
    """``victoria-metrics``, installed with apt-get (as root) when missing."""
    ensure_packages(packages=VM_PACKAGE)
    return Path(shutil.which("victoria-metrics") or VM_PACKAGE["victoria-metrics"])


# -- influxd ------------------------------------------------------------------------------------------------------
def influx_config(state_dir: Path, http_port: int, rpc_port: int, auth: bool = False) -> str:
    """influxd 1.6.7's config: loopback-only HTTP + RPC, everything else off; data under ``state_dir``.

    ``auth``: ``auth-enabled`` (the dev cluster: per-team users, ``nuro.metrics.identities``); standalone servers
    of tests and benches run without it."""
    return f"""\
reporting-enabled = false
bind-address = "127.0.0.1:{rpc_port}"

[meta]
  dir = "{state_dir / "meta"}"
  retention-autocreate = true
  logging-enabled = false

[data]
  dir = "{state_dir / "data"}"
  wal-dir = "{state_dir / "wal"}"
  index-version = "inmem"
  query-log-enabled = false
  cache-max-memory-size = 1073741824
  max-series-per-database = 1000000
  max-values-per-tag = 100000

[coordinator]
  write-timeout = "10s"
  query-timeout = "60s"

[retention]
  enabled = true

[monitor]
  store-enabled = false

[http]
  enabled = true
  bind-address = "127.0.0.1:{http_port}"
  auth-enabled = {"true" if auth else "false"}
  log-enabled = false
  suppress-write-log = true
  pprof-enabled = false
  https-enabled = false
  unix-socket-enabled = false
  max-body-size = 25000000

[ifql]
  enabled = false

[logging]
  level = "warn"
  suppress-logo = true

[continuous_queries]
  enabled = false

[[graphite]]
  enabled = false

[[collectd]]
  enabled = false

[[opentsdb]]
  enabled = false

[[udp]]
  enabled = false
"""


def influx_argv(influxd: Path, config: Path) -> list[str]:
    return [str(influxd), "run", "-config", str(config)]


def write_influx_config(state_dir: Path, http_port: int, rpc_port: int, auth: bool = False) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "influxdb.conf"
    path.write_text(influx_config(state_dir, http_port, rpc_port, auth))
    return path


def influx_ready(base_url: str) -> bool:
    """Ready = ``GET /ping`` answers 204 (influxd answers it only once its HTTP service and meta store are up)."""
    try:
        return _HTTP.request("GET", f"{base_url}/ping").status == 204
    except urllib3.exceptions.HTTPError:
        return False


def create_database(base_url: str, db: str, timeout_s: float = 10.0) -> None:
    """``CREATE DATABASE`` (idempotent in InfluxQL). The name is quoted, so any string is safe."""
    body = urllib.parse.urlencode({"q": f"CREATE DATABASE {quote_ident(db)}"})
    try:
        resp = _HTTP.request(
            "POST",
            f"{base_url}/query",
            body=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            timeout=urllib3.Timeout(connect=1.0, read=timeout_s),
        )
    except urllib3.exceptions.HTTPError as exc:
        raise ServerError(f"influxd {base_url}: CREATE DATABASE {db} failed: {exc}") from exc
    if resp.status != 200 or b'"error"' in resp.data:
        raise ServerError(f"influxd {base_url}: CREATE DATABASE {db} answered {resp.status}: {resp.data[:300]!r}")


# -- victoria-metrics ---------------------------------------------------------------------------------------------
def vm_argv(vm: Path, data_dir: Path, port: int) -> list[str]:
    return [
        str(vm),
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-storageDataPath={data_dir}",
        "-search.latencyOffset=0s",
        "-search.disableCache",
        "-selfScrapeInterval=0",
        "-loggerLevel=WARN",
        "-retentionPeriod=1y",
    ]


def vm_ready(base_url: str) -> bool:
    """Ready = ``GET /health`` answers 200."""
    try:
        return _HTTP.request("GET", f"{base_url}/health").status == 200
    except urllib3.exceptions.HTTPError:
        return False


# -- a server of our own --------------------------------------------------------------------------------------------
@dataclass
class LocalServer:
    """One TSDB process we own: ``start``/``stop`` (by PID) can be repeated, e.g. to stage an outage in a test."""

    kind: str  # "influxd" | "victoria-metrics" | "mlflow"
    argv: list[str]
    port: int
    log_path: Path
    ready_check: object  # Callable[[str], bool]
    env: dict[str, str] | None = field(default=None, repr=False)  # None: ours
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout_s: float = 30.0) -> float:
        """Start and wait until ready; returns the seconds it took. Raises ServerError with the log's tail."""
        if self.proc is not None and self.proc.poll() is None:
            return 0.0
        t0 = time.monotonic()
        log.info("start %s: %s", self.kind, " ".join(self.argv))
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=self.log_path.parent, env=self.env
            )
        while not self.ready_check(self.url):  # type: ignore[operator]
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout_s:
                tail = self.log_path.read_text(errors="replace")[-1500:]
                self.stop()
                raise ServerError(
                    f"{self.kind} did not become ready on {self.url} within {timeout_s:.0f} s "
                    f"(exit {self.proc and self.proc.returncode}); see {self.log_path}:\n{tail}"
                )
            time.sleep(0.05)
        return time.monotonic() - t0

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM our process (by its Popen handle), SIGKILL after ``timeout_s``."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("%s pid=%d ignored SIGTERM for %.0f s: SIGKILL", self.kind, self.proc.pid, timeout_s)
            self.proc.kill()
            self.proc.wait()


def influx_server(state_dir: Path, port: int, rpc_port: int | None = None) -> LocalServer:
    """An influxd on ``port`` (RPC on ``rpc_port``, default port+1) with its config and data in ``state_dir``."""
    config = write_influx_config(state_dir, port, rpc_port if rpc_port is not None else port + 1)
    return LocalServer("influxd", influx_argv(ensure_influxd(), config), port, state_dir / "influxd.log", influx_ready)


def vm_server(state_dir: Path, port: int) -> LocalServer:
    state_dir.mkdir(parents=True, exist_ok=True)
    argv = vm_argv(ensure_victoria_metrics(), state_dir / "vm-data", port)
    return LocalServer("victoria-metrics", argv, port, state_dir / "victoria-metrics.log", vm_ready)


@contextmanager
def standalone_influx(
    state_dir: Path, port: int, db: str = "nuro", rpc_port: int | None = None
) -> Iterator[LocalServer]:
    """influxd of our own for tests and benches, database ``db`` created; stopped by PID on exit.

    Data stays in ``state_dir`` (the caller removes it for a clean server). ``server.url`` is the HTTP base URL;
    ``influx1_url(server, db)`` the ``NURO_METRICS_URL`` for it.
    """
    server = influx_server(state_dir, port, rpc_port)
    server.start()
    try:
        create_database(server.url, db)
        yield server
    finally:
        server.stop()


@contextmanager
def standalone_vm(state_dir: Path, port: int) -> Iterator[LocalServer]:
    """victoria-metrics of our own (v2 write target for influxdb-client); stopped by PID on exit."""
    server = vm_server(state_dir, port)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def influx1_url(server: LocalServer, db: str = "nuro") -> str:
    return f"influx1://127.0.0.1:{server.port}/{db}"


def listening_ports(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP/UDP sockets ``pid`` listens on: tests check a server opens only what we said."""
    found = set()
    for conn in psutil.Process(pid).net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN or (conn.type == 2 and not conn.raddr):  # 2 = SOCK_DGRAM
            found.add((conn.laddr.ip, conn.laddr.port))
    return found

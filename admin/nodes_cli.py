"""``nuro-admin nodes``: run a command on many nodes over SSH, and collect one job's logs from its nodes.

Why in nuro and not pdsh/clush: the admin gets one table (or JSON) with a typed outcome per host (unreachable,
auth failed, host key unknown/changed, timeout, exit status), bounded parallelism, a per-host timeout, an exit code
that says whether any host failed, and host-key checking that stays on. ``collect-logs`` asks Slurm which nodes ran
the job (every attempt, requeues included) so nobody has to work that out by hand during an incident.

Hosts come from ``-w HOSTLIST`` (Slurm syntax, ``gpu[001-004],login1``), from ``--inventory FILE`` (the Ansible
YAML inventory ``nuro.devcluster.sshhosts.write_inventory`` writes, or a simple INI one), or both (``-w`` then
names inventory hosts or groups). Slurm node names map to SSH hosts by the inventory (host name = node name, or
host var ``nuro_slurm_node``) or by ``--host-map gpu001=HOST,...``.

Exit codes: 0 every host succeeded, 1 at least one host failed (each failure is listed per host), 2 usage error.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nuro import remote
from nuro.cluster.inventory import InventoryError, parse_inventory_text
from nuro.console import ExitCode, stdout_console
from nuro.remote import Host, RemoteError
from nuro.slurm import CliBackend, hostlist

log = logging.getLogger(__name__)

DEFAULT_PARALLEL = 16
DEFAULT_KNOWN_HOSTS = Path("~/.ssh/known_hosts")
#: Where a node keeps the logs collect-logs fetches; ``{log_dir}`` and ``{node}`` are filled in per node. The
#: defaults are the dev cluster's (``SlurmdLogFile={log_dir}/slurmd-%n.log``, agents' ``--log-file``).
DEFAULT_SLURMD_LOG = "{log_dir}/slurmd-{node}.log"
DEFAULT_AGENT_LOG = "{log_dir}/agent-{node}.log"
#: The prolog's and epilog's own log (``NURO_HOOK_LOG``: the dev cluster's ``hooks-%n.log``; Ansible's
#: ``/var/log/nuro/hooks.log``).
DEFAULT_HOOKS_LOG = "{log_dir}/hooks-{node}.log"
#: Names the dev cluster's state dir (``nuro-admin devcluster env`` exports it); its nodes log under ``<dir>/log``.
#: Read by name: the product never imports the dev wing.
ENV_DEVCLUSTER_DIR = "NURO_DEVCLUSTER_DIR"

err = Console(stderr=True, soft_wrap=True, highlight=False)


class UsageError(click.UsageError):
    """Bad hosts, inventory or mapping; the message says which and what to pass instead."""


# ---- inventory and host selection (pure) ------------------------------------------------------------------------


@dataclass
class Inventory:
    """SSH hosts by name, groups (name -> host names), and which Slurm node each host is (node -> host name)."""

    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    node_to_host: dict[str, str] = field(default_factory=dict)


_KNOWN_HOSTS_RE = re.compile(r"UserKnownHostsFile=(\S+)")


def _host_from_vars(name: str, hv: dict, defaults: HostDefaults) -> Host:
    known = defaults.known_hosts
    match = _KNOWN_HOSTS_RE.search(str(hv.get("ansible_ssh_common_args") or ""))
    if match:
        known = Path(match.group(1))
    key = hv.get("ansible_ssh_private_key_file")
    return Host(
        name=name,
        address=str(hv.get("ansible_host") or name),
        port=int(hv.get("ansible_port") or defaults.port),
        user=str(hv.get("ansible_user") or defaults.user),
        key_file=Path(key) if key else defaults.key_file,
        known_hosts=known,
    )


@dataclass(frozen=True)
class HostDefaults:
    """What a host without inventory vars gets (``--user``, ``--identity``, ``--known-hosts``, port 22)."""

    user: str = "root"
    port: int = 22
    key_file: Path | None = None
    known_hosts: Path | None = None


def parse_inventory(text: str, defaults: HostDefaults = HostDefaults()) -> Inventory:
    """An Ansible inventory file (YAML or INI, read by :func:`nuro.cluster.inventory.parse_inventory_text`) as SSH
    hosts: each host's ``ansible_*`` vars, else ``defaults``; host var ``nuro_slurm_node`` names its Slurm node.

    Raises:
        UsageError: the text is neither form, or a host line is malformed.
    """
    try:
        hostvars, groups = parse_inventory_text(text)
    except InventoryError as exc:
        raise UsageError(str(exc)) from None
    inv = Inventory(groups=groups)
    for hname, hv in hostvars.items():
        inv.hosts[hname] = _host_from_vars(hname, hv, defaults)
        inv.node_to_host[str(hv.get("nuro_slurm_node") or hname)] = hname
    return inv


def select_hosts(inv: Inventory | None, expr: str | None, defaults: HostDefaults) -> list[Host]:
    """The hosts to act on, in order, no duplicates.

    ``expr`` (a Slurm hostlist) names inventory hosts or groups; a name the inventory lacks (or with no inventory)
    is taken as an address with ``defaults``. Without ``expr``, every inventory host.

    Raises:
        UsageError: neither given, an empty selection, or a malformed hostlist.
    """
    if expr is None:
        if inv is None:
            raise UsageError("name the hosts: -w HOSTLIST (e.g. gpu[001-004]) and/or --inventory FILE")
        names = list(inv.hosts)
    else:
        try:
            names = hostlist.expand(expr)
        except ValueError as exc:
            raise UsageError(f"bad hostlist {expr!r}: {exc}") from None
    out: dict[str, Host] = {}
    for name in names:
        if inv is not None and name in inv.hosts:
            out.setdefault(name, inv.hosts[name])
        elif inv is not None and name in inv.groups:
            for member in inv.groups[name]:
                out.setdefault(member, inv.hosts[member])
        else:
            out.setdefault(
                name,
                Host(name, name, defaults.port, defaults.user, defaults.key_file, defaults.known_hosts),
            )
    if not out:
        raise UsageError(f"no hosts selected (hostlist {expr!r}, inventory hosts: {len(inv.hosts) if inv else 0})")
    return list(out.values())


def parse_host_map(text: str | None) -> dict[str, str]:
    """``gpu001=hostA,gpu002=hostB`` (node=inventory host or address); a node side may be a hostlist with the
    same number of hosts on the right (``gpu[001-002]=h[1-2]``)."""
    if not text:
        return {}
    mapping: dict[str, str] = {}
    try:
        parts = hostlist._split_top_level(text.strip())  # commas inside brackets do not split pairs
    except hostlist.HostlistError as exc:
        raise UsageError(f"--host-map {text!r}: {exc}") from None
    for part in parts:
        if "=" not in part:
            raise UsageError(f"--host-map entry {part!r}: expected NODE=HOST")
        left, right = part.split("=", 1)
        try:
            nodes, hosts = hostlist.expand(left), hostlist.expand(right)
        except hostlist.HostlistError as exc:
            raise UsageError(f"--host-map entry {part!r}: {exc}") from None
        if len(nodes) != len(hosts):
            raise UsageError(f"--host-map entry {part!r}: {len(nodes)} nodes but {len(hosts)} hosts")
        mapping.update(zip(nodes, hosts, strict=True))
    return mapping


def hosts_for_nodes(
    nodes: Iterable[str], inv: Inventory | None, host_map: dict[str, str], defaults: HostDefaults
) -> dict[str, Host]:
    """node -> Host: ``--host-map`` first, then the inventory's node mapping, else the node name as the address."""
    out: dict[str, Host] = {}
    for node in nodes:
        target = host_map.get(node) or (inv.node_to_host.get(node) if inv else None) or node
        if inv is not None and target in inv.hosts:
            out[node] = inv.hosts[target]
        else:
            out[node] = Host(target, target, defaults.port, defaults.user, defaults.key_file, defaults.known_hosts)
    return out


# ---- fan-out and results (pure except the callable) --------------------------------------------------------------


@dataclass(frozen=True)
class HostOutcome:
    """One host's result: ``status`` is "ok", "exit_status" (ran, non-zero) or a ``RemoteError.kind``."""

    host: str
    address: str
    status: str
    exit_status: int | None = None
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def outcome_of(host: Host, fn: Callable[[Host], remote.RunResult]) -> HostOutcome:
    """Run ``fn(host)`` and turn every outcome, typed SSH errors included, into a ``HostOutcome`` (never raises
    for a host's failure, so one bad host cannot abort the fan-out)."""
    t0 = time.monotonic()
    try:
        res = fn(host)
    except RemoteError as exc:
        return HostOutcome(host.name, host.address, exc.kind, error=exc.message, duration_s=time.monotonic() - t0)
    except Exception as exc:  # a bug or an unexpected paramiko error: still reported per host, with its type
        log.exception("host=%s unexpected error", host.name)
        return HostOutcome(
            host.name, host.address, "error", error=f"{type(exc).__name__}: {exc}", duration_s=time.monotonic() - t0
        )
    return HostOutcome(
        host=host.name,
        address=host.address,
        status="ok" if res.exit_status == 0 else "exit_status",
        exit_status=res.exit_status,
        stdout=res.stdout,
        stderr=res.stderr,
        error="" if res.exit_status == 0 else f"exited with status {res.exit_status}",
        duration_s=res.duration_s,
    )


def fan_out(hosts: list[Host], fn: Callable[[Host], remote.RunResult], parallel: int) -> list[HostOutcome]:
    """``fn`` on every host, at most ``parallel`` at once; outcomes in the hosts' order."""
    if parallel < 1:
        raise ValueError(f"parallel must be >= 1, got {parallel}")
    with ThreadPoolExecutor(max_workers=min(parallel, len(hosts)) or 1, thread_name_prefix="nodes") as pool:
        return list(pool.map(lambda h: outcome_of(h, fn), hosts))


def exit_code(outcomes: list[HostOutcome]) -> int:
    """0 when every host succeeded, 1 when any failed (exit status or SSH error)."""
    return ExitCode.OK if outcomes and all(o.ok for o in outcomes) else ExitCode.FAILED


def summarize(outcomes: list[HostOutcome]) -> dict[str, int]:
    """Counts by status, e.g. {"ok": 3, "unreachable": 1}, plus "total"."""
    counts: dict[str, int] = {"total": len(outcomes)}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return counts


def _render_table(outcomes: list[HostOutcome], wall_s: float) -> None:
    out = _console()
    table = Table(show_lines=False)
    for col in ("host", "address", "status", "exit", "time_s"):
        table.add_column(col, no_wrap=True)
    table.add_column("output / error", overflow="fold")
    for o in outcomes:
        text = (o.stdout.rstrip() or o.stderr.rstrip()) if o.status in ("ok", "exit_status") else o.error
        if o.status == "exit_status" and o.stderr.strip():
            text = o.stderr.rstrip()
        style = "green" if o.ok else "red"
        table.add_row(
            o.host,
            o.address,
            f"[{style}]{o.status}[/]",
            "" if o.exit_status is None else str(o.exit_status),
            f"{o.duration_s:.2f}",
            escape(_clip(text)),
        )
    out.print(table)
    s = summarize(outcomes)
    failed = s["total"] - s.get("ok", 0)
    out.print(f"{s['total']} hosts, {s.get('ok', 0)} ok, {failed} failed, {wall_s:.2f} s")


def _report_failures(outcomes: list[HostOutcome]) -> None:
    """One stderr line per failed host, in both output modes (stdout stays clean JSON with --json)."""
    for o in outcomes:
        if not o.ok:
            err.print(f"[red]FAILED[/] {escape(o.host)} ({o.address}): {o.status}: {escape(o.error)}")


def _console() -> Console:
    """stdout (``stdout_console``: rich's default 80 columns would wrap host names in logs and pipes)."""
    return stdout_console(highlight=False)


def _clip(text: str, max_lines: int = 8, max_chars: int = 2000) -> str:
    lines = text.splitlines()
    clipped = "\n".join(lines[:max_lines])[:max_chars]
    return clipped + (f"\n… ({len(lines)} lines)" if len(lines) > max_lines else "")


# ---- log filtering (pure) ----------------------------------------------------------------------------------------


def job_line_pattern(job_id: int) -> re.Pattern[str]:
    """Lines about one job, in the spellings slurmd and nuro use: ``job 42``, ``job=42``, ``JobId=42``,
    ``job_id=42``, ``[42.batch]`` / ``[42.0]`` / ``[42]``, ``StepId=42.0``. Job 42 never matches 420 or 142."""
    j = str(int(job_id))
    return re.compile(
        rf"(?:\bjob(?:[ _]?id)?[ =:]+{j}\b|\bStepId={j}\b|\[{j}(?:\.[\w+]+)?\])",
        re.IGNORECASE,
    )


def job_lines(text: str, job_id: int) -> list[str]:
    """Every line of ``text`` that names ``job_id``."""
    pat = job_line_pattern(job_id)
    return [line for line in text.splitlines() if pat.search(line)]


def prolog_epilog_lines(text: str, job_id: int) -> list[str]:
    """The job's prolog/epilog lines (slurmd: "prolog for job 42 ran for 2 seconds", "error: [job 42] prolog
    failed ...", nuro's hooks: "nuro-prolog: job=42 ...")."""
    return [line for line in job_lines(text, job_id) if re.search(r"prolog|epilog", line, re.IGNORECASE)]


# ---- collect-logs ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeLogs:
    """What collect-logs brought back from one node."""

    node: str
    host: str
    address: str
    status: str  # "ok", or a RemoteError kind when the node could not be reached at all
    files: list[dict] = field(default_factory=list)  # {"name", "remote", "bytes", "error"}
    job_lines: int = 0
    prolog_epilog_lines: int = 0
    hook_lines: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def job_nodes(backend, job_id: int) -> list[str]:
    """Every node any attempt of ``job_id`` ran on (accounting, requeues included), plus squeue's view.

    Raises:
        click.ClickException: Slurm knows no such job, or it never got nodes.
    """
    nodes: list[str] = []
    try:
        for attempt in backend.attempts(job_id):
            nodes.extend(attempt.nodes)
    except Exception as exc:  # accounting may be down; squeue still knows running/recent jobs
        log.warning("job=%d sacct failed, trying squeue: %s", job_id, exc)
    # squeue's view too: right after a job ends, accounting may still hold a partial node list for it
    job = backend.find_job(job_id)
    if job is None and not nodes:
        raise click.ClickException(f"job {job_id}: Slurm knows no such job (squeue and sacct)")
    if job is not None:
        nodes.extend(job.nodes)
    if not nodes:
        raise click.ClickException(f"job {job_id} has no nodes yet (pending?): nothing to collect")
    return list(dict.fromkeys(nodes))


def collect_node(
    node: str, host: Host, job_id: int, out_dir: Path, remote_files: dict[str, str], timeout_s: float
) -> NodeLogs:
    """Fetch ``remote_files`` (local name -> remote path) from ``host`` into ``out_dir/<node>/`` over SFTP, then
    write the job's lines of the slurmd log (all, and prolog/epilog only) next to them."""
    ndir = out_dir / node
    try:
        fetched = remote.fetch(host, {r: ndir / name for name, r in remote_files.items()}, timeout_s=timeout_s)
    except RemoteError as exc:
        return NodeLogs(node, host.name, host.address, exc.kind, error=exc.message)
    files = [
        {"name": name, "remote": f.remote, "bytes": f.size_bytes, "error": f.error}
        for (name, _), f in zip(remote_files.items(), fetched, strict=True)
    ]
    n_job = n_pe = 0
    slurmd = ndir / "slurmd.log"
    if slurmd.exists():
        text = slurmd.read_text(errors="replace")
        lines, pe = job_lines(text, job_id), prolog_epilog_lines(text, job_id)
        (ndir / f"slurmd-job{job_id}.log").write_text("".join(f"{x}\n" for x in lines))
        (ndir / f"prolog-epilog-job{job_id}.log").write_text("".join(f"{x}\n" for x in pe))
        n_job, n_pe = len(lines), len(pe)
    n_hook = 0
    hooks = ndir / "hooks.log"
    if hooks.exists():  # nuro's prolog/epilog's own log: what they staged, skipped or gave up for this job
        mine = job_lines(hooks.read_text(errors="replace"), job_id)
        (ndir / f"hooks-job{job_id}.log").write_text("".join(f"{x}\n" for x in mine))
        n_hook = len(mine)
    return NodeLogs(node, host.name, host.address, "ok", files, n_job, n_pe, n_hook)


# ---- click commands ----------------------------------------------------------------------------------------------


def default_log_dir() -> Path:
    """``--log-dir`` when not given: ``$NURO_DEVCLUSTER_DIR/log``, else ``./.devcluster/log`` (where the default
    ``--slurmd-log``/``--agent-log`` templates point); on a real cluster the admin passes the nodes' own paths."""
    return Path(os.environ.get(ENV_DEVCLUSTER_DIR, ".devcluster")).absolute() / "log"


def _defaults(user: str, identity: Path | None, known_hosts: Path | None) -> HostDefaults:
    return HostDefaults(user=user, key_file=identity, known_hosts=(known_hosts or DEFAULT_KNOWN_HOSTS).expanduser())


def _load_inventory(path: Path | None, defaults: HostDefaults) -> Inventory | None:
    if path is None:
        return None
    try:
        return parse_inventory(path.read_text(), defaults)
    except OSError as exc:
        raise UsageError(f"cannot read inventory {path}: {exc}") from None


_host_options = [
    click.option("-w", "--hosts", "hosts_expr", default=None, help="Slurm hostlist of hosts or inventory groups."),
    click.option(
        "--inventory",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="Ansible inventory (YAML or INI): addresses, users, keys, known_hosts per host.",
    ),
    click.option("--user", default="root", show_default=True, help="SSH user for hosts without inventory vars."),
    click.option(
        "-i",
        "--identity",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Private key for hosts without inventory vars [default: ~/.ssh keys].",
    ),
    click.option(
        "--known-hosts",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="known_hosts for hosts without inventory vars [default: ~/.ssh/known_hosts]. Unknown keys are refused.",
    ),
    click.option(
        "--parallel",
        type=click.IntRange(1, 1024),
        default=DEFAULT_PARALLEL,
        show_default=True,
        help="At most this many hosts at once.",
    ),
    click.option(
        "--timeout",
        "timeout_s",
        type=click.FloatRange(min=0.1),
        default=30.0,
        show_default=True,
        help="Seconds per host (connect + command); past it the host is reported as timeout.",
    ),
    click.option("--json", "as_json", is_flag=True, help="Print per-host results as JSON."),
]


def host_options(fn):
    for opt in reversed(_host_options):
        fn = opt(fn)
    return fn


@click.group()
def nodes() -> None:
    """Run commands on nodes and collect a job's logs over SSH (paramiko; host-key checking on)."""


@nodes.command("exec", context_settings={"ignore_unknown_options": True})
@host_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(
    hosts_expr: str | None,
    inventory: Path | None,
    user: str,
    identity: Path | None,
    known_hosts: Path | None,
    parallel: int,
    timeout_s: float,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Run COMMAND on every selected host: ``nuro-admin nodes exec -w gpu[001-004] -- nvidia-smi -L``.

    Like ssh, the words of COMMAND are joined with spaces and run by the remote user's shell.
    """
    defaults = _defaults(user, identity, known_hosts)
    hosts = select_hosts(_load_inventory(inventory, defaults), hosts_expr, defaults)
    line = " ".join(command)
    log.info("nodes exec hosts=%d parallel=%d timeout_s=%g command=%r", len(hosts), parallel, timeout_s, line)
    t0 = time.monotonic()
    outcomes = fan_out(hosts, lambda h: remote.run(h, line, timeout_s=timeout_s), parallel)
    wall_s = time.monotonic() - t0
    code = exit_code(outcomes)
    if as_json:
        payload = {
            "command": line,
            "ok": code == ExitCode.OK,
            "exit_code": int(code),
            "wall_s": round(wall_s, 3),
            "summary": summarize(outcomes),
            "hosts": [{**asdict(o), "ok": o.ok, "duration_s": round(o.duration_s, 3)} for o in outcomes],
        }
        click.echo(json.dumps(payload, indent=2))
    else:
        _render_table(outcomes, wall_s)
    _report_failures(outcomes)
    sys.exit(code)


@nodes.command("collect-logs")
@click.argument("job_id", type=click.IntRange(min=1))
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to put <node>/ directories [default: ./nuro-logs-job<JOB>].",
)
@click.option("--host-map", default=None, help="NODE=HOST pairs (hostlists allowed): gpu[001-002]=h[1-2].")
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The nodes' log dir for {log_dir} [default: $NURO_DEVCLUSTER_DIR/log, the dev cluster's].",
)
@click.option("--slurmd-log", default=DEFAULT_SLURMD_LOG, show_default=True, help="slurmd log path on a node.")
@click.option("--agent-log", default=DEFAULT_AGENT_LOG, show_default=True, help="Node agent log path on a node.")
@click.option("--hooks-log", default=DEFAULT_HOOKS_LOG, show_default=True,
              help="nuro's prolog/epilog log on a node (the node env's NURO_HOOK_LOG).")  # fmt: skip
@host_options
def collect_logs(
    job_id: int,
    out_dir: Path | None,
    host_map: str | None,
    log_dir: Path | None,
    slurmd_log: str,
    agent_log: str,
    hooks_log: str,
    hosts_expr: str | None,
    inventory: Path | None,
    user: str,
    identity: Path | None,
    known_hosts: Path | None,
    parallel: int,
    timeout_s: float,
    as_json: bool,
) -> None:
    """Fetch JOB_ID's logs from every node it ran on into OUT/<node>/ over SFTP.

    Per node: slurmd.log, agent.log and hooks.log (whole files), slurmd-job<JOB>.log (the slurmd lines naming the
    job), prolog-epilog-job<JOB>.log (its prolog/epilog lines) and hooks-job<JOB>.log (the job's lines of nuro's
    prolog/epilog log: what they staged, skipped or gave up), plus OUT/summary.json. Nodes come from Slurm
    (``sacct -D``: every attempt). ``-w`` limits collection to those nodes.
    """
    defaults = _defaults(user, identity, known_hosts)
    inv = _load_inventory(inventory, defaults)
    mapping = parse_host_map(host_map)
    node_list = job_nodes(CliBackend(), job_id)
    if hosts_expr:
        wanted = set(hostlist.expand(hosts_expr))
        node_list = [n for n in node_list if n in wanted]
    targets = hosts_for_nodes(node_list, inv, mapping, defaults)
    out_dir = (out_dir or Path(f"nuro-logs-job{job_id}")).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = str(log_dir or default_log_dir())

    def files_of(node: str) -> dict[str, str]:
        return {
            "slurmd.log": slurmd_log.format(log_dir=logs, node=node),
            "agent.log": agent_log.format(log_dir=logs, node=node),
            "hooks.log": hooks_log.format(log_dir=logs, node=node),
        }

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=min(parallel, len(targets)) or 1, thread_name_prefix="logs") as pool:
        results = list(
            pool.map(lambda n: collect_node(n, targets[n], job_id, out_dir, files_of(n), timeout_s), list(targets))
        )
    wall_s = time.monotonic() - t0
    code = ExitCode.OK if results and all(r.ok for r in results) else ExitCode.FAILED
    payload = {
        "job_id": job_id,
        "out_dir": str(out_dir),
        "ok": code == ExitCode.OK,
        "exit_code": int(code),
        "wall_s": round(wall_s, 3),
        "nodes": [{**asdict(r), "ok": r.ok} for r in results],
    }
    (out_dir / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(payload, indent=2))
    else:
        out = _console()
        table = Table(title=f"job {job_id} logs -> {out_dir}")
        for col in ("node", "host", "status", "files", "job lines", "prolog/epilog", "hooks", "missing / error"):
            table.add_column(col)
        for r in results:
            got = [f for f in r.files if not f["error"]]
            missing = [f"{f['name']}: {f['error']}" for f in r.files if f["error"]]
            style = "green" if r.ok else "red"
            table.add_row(
                r.node,
                f"{r.host} ({r.address})",
                f"[{style}]{r.status}[/]",
                ", ".join(f"{f['name']} {f['bytes']} B" for f in got),
                str(r.job_lines),
                str(r.prolog_epilog_lines),
                str(r.hook_lines),
                escape(r.error or "; ".join(missing)),
            )
        out.print(table)
        out.print(f"{len(results)} nodes, {sum(r.ok for r in results)} ok, {wall_s:.2f} s")
    for r in results:
        if not r.ok:
            err.print(f"[red]FAILED[/] {r.node} via {r.host} ({r.address}): {r.status}: {escape(r.error)}")
    sys.exit(code)

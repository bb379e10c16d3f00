"""``nuro-admin``: the administrator's CLI: ``devcluster up | down | status | env | kill-node | revive-node``,
``policy ...``, ``nodes exec | collect-logs``.

Exit codes: 0 success, 1 the operation failed or was refused (the message says why and what to do), 2 usage error.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click
from rich.table import Table

from nuro.admin.nodes_cli import nodes as nodes_group
from nuro.admin.policy_cli import policy
from nuro.admin.tracking_cli import tracking_group
from nuro.cluster.description import TOPOLOGIES
from nuro.console import ExitCode, fail, stdout_console

# The one product module that imports the dev wing: it mounts `nuro-admin devcluster` (docs/architecture.md).
from nuro.devcluster import manager, slurmroot
from nuro.devcluster.layout import DEFAULT_NODES, DEFAULT_PORT_BASE, Layout, default_state_dir

state_dir_option = click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the cluster keeps config, state, sockets and logs [env NURO_DEVCLUSTER_DIR, else ./.devcluster].",
)


def _layout(state_dir: Path | None) -> Layout:
    return Layout((state_dir or default_state_dir()).absolute())


@click.group()
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail (the exact argv of every Slurm call).")
def main(verbose: bool) -> None:
    """nuro administration."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )


@main.group()
def devcluster() -> None:
    """A real multi-node Slurm cluster on this machine (munge, MariaDB, slurmdbd, slurmctld, N slurmd): the host's
    22.05, or 24.11/26.05 from a cached Debian root filesystem (--slurm)."""


@devcluster.command()
@click.option(
    "--nodes",
    "-N",
    type=click.IntRange(1, 999),
    default=DEFAULT_NODES,
    show_default=True,
    help="Emulated nodes, 8 fake GPUs each (gpu001..).",
)
@click.option(
    "--port-base",
    type=click.IntRange(1024, 60000),
    default=DEFAULT_PORT_BASE,
    show_default=True,
    help="Loopback ports: base+6 MariaDB, +17 slurmctld, +19 slurmdbd, +33..+43 SeaweedFS (S3 +33), "
    "base+1000.. one per slurmd.",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=180.0,
    show_default=True,
    help="Seconds to wait for daemons, then for all nodes idle.",
)
@click.option(
    "--slurm",
    "slurm_version",
    type=click.Choice(slurmroot.SUPPORTED),
    default=slurmroot.HOST_VERSION,
    show_default=True,
    help="Slurm version: the host's package, or a newer one run from a Debian root filesystem built once "
    "(~1 min) and cached under /var/cache/nuro/rootfs.",
)
@click.option(
    "--topology",
    type=click.Choice(TOPOLOGIES),
    default="tree",
    show_default=True,
    help="Placement plugin over the leaves of 4 nodes: tree (topology/tree, --switches) or block (topology/block, "
    "--segment; Slurm 24.11+).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@state_dir_option
def up(
    nodes: int,
    port_base: int,
    timeout_s: float,
    slurm_version: str,
    topology: str,
    as_json: bool,
    state_dir: Path | None,
) -> None:
    """Install what is missing and start the cluster; returns when every node is idle."""
    layout = _layout(state_dir)
    try:
        res = manager.up(layout, nodes, port_base, timeout_s, slurm=slurm_version, topology=topology)
    except (manager.DevClusterError, RuntimeError, OSError) as exc:
        fail(ExitCode.FAILED, str(exc))
    if as_json:
        click.echo(json.dumps({
            "state_dir": str(res.state_dir), "slurm": slurm_version, "topology": topology, "nodes": res.nodes,
            "already_running": res.already_running,
            "installed": res.installed, "seconds_to_daemons": round(res.seconds_to_daemons, 2),
            "seconds_to_idle": round(res.seconds_to_idle, 2),
        }))  # fmt: skip
        return
    if res.already_running:
        click.echo(f"dev cluster already running from {res.state_dir} ({res.nodes} nodes)")
    else:
        if res.installed:
            click.echo(f"installed: {' '.join(res.installed)}")
        click.echo(
            f"dev cluster up (Slurm {slurm_version}): {res.nodes} nodes × 8 GPUs idle after "
            f"{res.seconds_to_idle:.1f} s "
            f"(daemons started in {res.seconds_to_daemons:.1f} s); state in {res.state_dir}"
        )
    click.echo(f'use it from a shell:  eval "$({sys.argv[0]} devcluster env --state-dir {res.state_dir})"')


@devcluster.command()
@click.option("--purge", is_flag=True, help="Also delete the state dir (database, logs, config).")
@state_dir_option
def down(purge: bool, state_dir: Path | None) -> None:
    """Stop exactly what 'up' started (by recorded PID), nothing else."""
    layout = _layout(state_dir)
    try:
        stopped = manager.down(layout, purge=purge)
    except (manager.DevClusterError, RuntimeError, OSError) as exc:
        fail(ExitCode.FAILED, str(exc))
    click.echo(f"stopped {len(stopped)} processes" if stopped else "nothing was running")


@devcluster.command()
@click.option("--build", is_flag=True, help="Build the root filesystems that are missing (root, ~1 min each).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def rootfs(build: bool, as_json: bool) -> None:
    """The cached Debian root filesystems of the newer Slurm versions: path, Slurm package, build time, size."""
    from nuro.devcluster import rootfs as rootfs_cache  # noqa: PLC0415 - only this command needs it

    rows = []
    for version in slurmroot.SUPPORTED[1:]:
        try:
            path = rootfs_cache.ensure_rootfs(version) if build else rootfs_cache.cache_dir(version)
        except rootfs_cache.RootfsError as exc:
            fail(ExitCode.FAILED, str(exc))
        record = rootfs_cache.read_record(path) if path.is_dir() else None
        rows.append({"slurm": version, "path": str(path), "built": record is not None, **(record or {})})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("slurm", "path", "package", "build s", "disk MB", "built at")
    for r in rows:
        if r["built"]:
            table.add_row(r["slurm"], r["path"], r.get("slurm_package_version", "?"), str(r.get("build_s", "?")),
                          str(int(r.get("disk_bytes", 0)) // 1_000_000), r.get("built_at", "?"))  # fmt: skip
        else:
            table.add_row(r["slurm"], r["path"], "[yellow]not built[/] (devcluster rootfs --build)", "", "", "")
    stdout_console().print(table)


@devcluster.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@state_dir_option
def status(as_json: bool, state_dir: Path | None) -> None:
    """What runs, with PIDs, and every node's state. Exit 0 when up with all processes alive, else 1."""
    info = manager.status(_layout(state_dir))
    healthy = info["phase"] == "running" and all(p["alive"] for p in info["processes"])
    if as_json:
        click.echo(json.dumps(info, indent=2))
        sys.exit(ExitCode.OK if healthy else ExitCode.FAILED)
    out = stdout_console()
    out.print(f"dev cluster [bold]{info['phase']}[/] in {info['state_dir']}", highlight=False)
    if info.get("error"):
        out.print(f"[red]{info['error']}[/]", highlight=False)
    if info["processes"]:
        table = Table("process", "pid", "alive")
        for p in info["processes"]:
            table.add_row(p["name"], str(p["pid"]), "yes" if p["alive"] else "[red]no[/]")
        out.print(table)
    if info["nodes"]:
        counts: dict[str, int] = {}
        for state in info["nodes"].values():
            counts[state] = counts.get(state, 0) + 1
        out.print("nodes: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), highlight=False)
    if info.get("killed_nodes"):
        out.print(f"killed on purpose (revive-node to restart): {', '.join(sorted(info['killed_nodes']))}")
    sys.exit(ExitCode.OK if healthy else ExitCode.FAILED)


@devcluster.command()
@state_dir_option
def env(state_dir: Path | None) -> None:
    """Print shell exports so plain sbatch/squeue/sinfo/sacctmgr use this cluster: eval "$(... env)"."""
    click.echo(manager.render_env_sh(_layout(state_dir)), nl=False)


@devcluster.command("kill-node")
@click.argument("node")
@click.option("--json", "as_json", is_flag=True, help="Print what was killed as JSON.")
@state_dir_option
def kill_node(node: str, as_json: bool, state_dir: Path | None) -> None:
    """Crash NODE like a host: SIGKILL its slurmd, slurmstepds, job processes and node agent (by PID)."""
    try:
        res = manager.kill_node(_layout(state_dir), node)
    except (manager.DevClusterError, RuntimeError, OSError) as exc:
        fail(ExitCode.FAILED, str(exc))
    if as_json:
        click.echo(json.dumps(res))
        return
    what = ", ".join(f"{k['name']} {k['pid']}" for k in res["killed"]) or "nothing was running"
    click.echo(f"killed {node}: {what}")


@devcluster.command("revive-node")
@click.argument("node")
@click.option("--json", "as_json", is_flag=True, help="Print what was started as JSON.")
@state_dir_option
def revive_node(node: str, as_json: bool, state_dir: Path | None) -> None:
    """Restart a killed NODE's slurmd and node agent under the supervisor; the detector resumes it once healthy."""
    try:
        res = manager.revive_node(_layout(state_dir), node)
    except (manager.DevClusterError, RuntimeError, OSError) as exc:
        fail(ExitCode.FAILED, str(exc))
    if as_json:
        click.echo(json.dumps(res))
        return
    click.echo(f"revived {node}: " + ", ".join(f"{k['name']} {k['pid']}" for k in res["started"]))


main.add_command(policy)
main.add_command(nodes_group)
main.add_command(tracking_group)

if __name__ == "__main__":
    main()

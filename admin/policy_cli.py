"""``nuro-admin policy apply teams.yaml [--dry-run] [--prune] [--json]`` and ``nuro-admin policy show [--json]``.

apply: validate teams.yaml → read slurmdbd (sacctmgr) → plan (pure) → print the diff → unless --dry-run, run the
commands one by one, verify that a re-read plan is empty, then install the job_submit policy table (last, so
job_submit.lua never names a QOS that does not exist yet).

Exit codes: 0 ok (also "no changes"), 1 Slurm failure / refused / conflict with objects nuro does not manage,
2 usage error, 3 invalid policy (every problem is printed).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from nuro.console import ExitCode, fail, stdout_console
from nuro.policy.luatable import render_lua_table
from nuro.policy.model import Policy, PolicyError, load_policy
from nuro.policy.plan import Plan, PlanConflict, build_plan
from nuro.policy.sacctmgr import apply_plan, lua_table_path, read_text_or_none, verify, write_atomic
from nuro.policy.slurm_state import policy_in_force, read_cluster_facts, read_state
from nuro.slurm import CliBackend, CliReads
from nuro.slurm.errors import SlurmError

err = Console(stderr=True, soft_wrap=True, highlight=False)

timeout_option = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1.0),
    default=30.0,
    show_default=True,
    help="Seconds each sacctmgr call may take before it is killed and counted as failed.",
)


def _exit(code: ExitCode, as_json: bool, payload: dict, message: str | None = None) -> NoReturn:
    """Exit ``code``: with ``--json`` the whole result (``payload`` plus ``exit_code``: apply's JSON is its result
    whether it failed or not), else ``message`` (rich markup, several lines) on stderr."""
    if message and not as_json:
        err.print(message)
    fail(code, as_json=as_json, payload=payload, keys=("exit_code",))


@click.group()
def policy() -> None:
    """Team policy (teams.yaml) → Slurm accounts, QOS, associations and the job_submit policy table."""


@policy.command()
@click.argument("teams_yaml", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True, help="Print the diff and the exact sacctmgr commands; change nothing.")
@click.option("--prune", is_flag=True, help="Also remove nuro-managed accounts/QOS/associations absent from the file.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result on stdout.")
@click.option(
    "--lua-table",
    "lua_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to write the job_submit policy table [default: nuro_policy.lua beside $SLURM_CONF].",
)
@timeout_option
def apply(teams_yaml: Path, dry_run: bool, prune: bool, as_json: bool, lua_path: Path | None, timeout_s: float) -> None:
    """Make Slurm's accounting match TEAMS_YAML; idempotent (a second apply prints "no changes")."""
    payload: dict = {"policy": str(teams_yaml), "dry_run": dry_run, "prune": prune}
    try:
        pol = load_policy(teams_yaml)
    except PolicyError as exc:
        payload["problems"] = exc.problems
        _exit(ExitCode.INVALID, as_json, payload, f"[bold red]invalid policy:[/] {escape(str(exc))}")
    backend = CliBackend(timeout_s=timeout_s)
    reading = "accounting state"
    try:
        plan = build_plan(pol, read_state(backend), prune=prune)
        reading = "nodes and topology"  # the policy table's cluster facts
        facts = read_cluster_facts(backend)
    except PlanConflict as exc:
        payload["problems"] = exc.problems
        _exit(ExitCode.FAILED, as_json, payload, f"[bold red]error:[/] {escape(str(exc))}")
    except SlurmError as exc:
        payload["error"] = str(exc)
        _exit(ExitCode.FAILED, as_json, payload, f"[bold red]error reading Slurm's {reading}:[/] {escape(str(exc))}")
    lua_file = lua_path or lua_table_path()
    lua_text = render_lua_table(pol, **facts)
    old_lua = read_text_or_none(lua_file)
    lua_state = "unchanged" if old_lua == lua_text else ("new" if old_lua is None else "changed")
    payload.update(plan.to_dict())
    payload["lua_table"] = {"path": str(lua_file), "state": lua_state, "written": False, "cluster": facts}
    if not as_json:
        _print_plan(plan, lua_file, lua_state)
    if dry_run:
        _exit(ExitCode.OK, as_json, payload)
    _apply(pol, plan, backend, payload, as_json, prune)
    if lua_state != "unchanged":
        try:
            write_atomic(lua_file, lua_text)
        except OSError as exc:
            payload["error"] = f"Slurm is updated but the policy table {lua_file} could not be written: {exc}"
            _exit(ExitCode.FAILED, as_json, payload, f"[bold red]error:[/] {escape(payload['error'])}")
        payload["lua_table"]["written"] = True
    if not as_json:
        done = f"applied {len(plan.changes)} command(s)" if plan.changes else "Slurm unchanged"
        click.echo(f"{done}; policy table {lua_file} {'written' if payload['lua_table']['written'] else lua_state}")
    _exit(ExitCode.OK, as_json, payload)


def _print_plan(plan: Plan, lua_file: Path, lua_state: str) -> None:
    click.echo(plan.render(), nl=False)
    if lua_state in ("new", "changed"):
        click.echo(f"{'+' if lua_state == 'new' else '~'} job_submit policy table {lua_file} ({lua_state})")


def _apply(pol: Policy, plan: Plan, backend: CliReads, payload: dict, as_json: bool, prune: bool) -> None:
    """Run the commands and verify; exits 1 with Slurm's message and what was already applied on failure."""
    result = apply_plan(plan, backend)
    payload["result"] = result.to_dict()
    failed = result.failed
    if failed is not None:
        done = "".join(f"\n  done: {shlex.join(c.argv)}" for c in result.applied) or "\n  nothing was applied"
        message = (
            f"[bold red]apply stopped at {failed.op.value} {failed.kind} {failed.name}:[/]\n"
            + escape(f"  command: {shlex.join(failed.argv)}\n  slurm: {payload['result']['error']}{done}\n")
            + "Fix the cause and run apply again: it plans from what Slurm holds now. "
            "The policy table was not written."
        )
        _exit(ExitCode.FAILED, as_json, payload, message)
    try:
        remaining = verify(pol, backend, prune)
    except SlurmError as exc:
        payload["error"] = f"applied, but reading the state back failed: {exc}"
        _exit(ExitCode.FAILED, as_json, payload, f"[bold red]error:[/] {escape(payload['error'])}")
    if not remaining.is_empty:
        payload["remaining"] = remaining.to_dict()
        message = "[bold red]Slurm accepted every command but still differs from the policy:[/]\n" + escape(
            remaining.render()
        )
        _exit(ExitCode.FAILED, as_json, payload, message)


@policy.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@timeout_option
def show(as_json: bool, timeout_s: float) -> None:
    """What is in force, read back from slurmdbd: teams (quota, borrow limit, fairshare, members) and tiers."""
    try:
        view = policy_in_force(read_state(CliBackend(timeout_s=timeout_s)))
    except SlurmError as exc:
        _exit(
            ExitCode.FAILED,
            as_json,
            {"error": str(exc)},
            f"[bold red]error reading Slurm's accounting state:[/] {escape(str(exc))}",
        )
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    out = stdout_console(highlight=False)
    if not view["teams"] and not view["tiers"]:
        click.echo("no nuro policy in force (no account with Organization=nuro-policy); run: nuro-admin policy apply")
        return
    teams = Table("team", "quota GPUs", "borrow limit GPUs", "fairshare", "grace s", "default QOS", "members",
                  title="teams (Slurm accounts)")  # fmt: skip
    for t in view["teams"]:
        teams.add_row(t["name"], _num(t["quota_gpus"]), _num(t["borrow_limit_gpus"]), t["fairshare"],
                      _num(t["grace_s"]), t["default_qos"], ", ".join(t["members"]) or "-")  # fmt: skip
    out.print(teams)
    if view["tiers"]:
        tiers = Table("tier (QOS)", "priority", "accounts", "users", title="priority tiers")
        for t in view["tiers"]:
            tiers.add_row(t["name"], str(t["priority"]), ", ".join(t["allowed_accounts"]) or "-",
                          ", ".join(t["allowed_users"]) or "-")  # fmt: skip
        out.print(tiers)


def _num(value: int | None) -> str:
    return "[red]missing[/]" if value is None else str(value)


__all__ = ["policy"]

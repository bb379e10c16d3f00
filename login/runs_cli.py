"""``nuro-train ls | status | cancel | logs | quota``: follow runs from a login node.

Slurm is the system of record (architecture principle 1): every view is read from one adapter snapshot (jobs with
their nuro record in the comment) or, for finished jobs, accounting. Rich tables for people, ``--json`` for scripts.
A run's checkpoints and lineage are ``nuro.runs.checkpoints``'s (``artifacts`` and ``events`` read them too).

Exit codes: 0 ok, 1 Slurm unreachable or refused, 2 usage, 4 no such job (or not a job you can see).
"""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from nuro.console import ExitCode, fail, stdout_console
from nuro.lifecycle import run_events
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.policy import PolicyError, load_policy
from nuro.policy.classify import build_view
from nuro.protocol import adminnote, jobcomment
from nuro.protocol.envnames import NURO_POLICY
from nuro.runs.checkpoints import checkpoint_lines, find_job, lineage_of
from nuro.runs.pending import ENV_WAITS, pending_view, read_progress, read_waits
from nuro.runs.spares import spare_lines, spare_summary
from nuro.slurm import Backend, CliBackend, InvalidJobId, JobInfo, JobPhase, SlurmError

if TYPE_CHECKING:
    from nuro.tracking.mlflow import MlflowClient

out = stdout_console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _backend() -> CliBackend:
    return CliBackend(timeout_s=30)


def _row(job: JobInfo, heard: dict[int, dict[str, int]] | None = None) -> dict:
    """One job as a flat JSON-able dict, with nuro's record from the comment and its newest committed checkpoint as
    the controller heard it from the node agents (``heard``: ``nuro.runs.pending.read_progress``)."""
    meta = jobcomment.parse(job.comment).record
    ckpt = (heard if heard is not None else _heard()).get(job.job_id)
    return {
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user,
        "team": job.account,
        "qos": job.qos,
        "state": job.state,
        "phase": job.phase.value,
        "reason": job.reason,
        "nodes": list(job.nodes),
        "node_count": job.node_count,
        "gpus": job.gpus_total,
        "restarts": job.restart_count,
        "submitted": job.submit_time.isoformat() if job.submit_time else None,
        "started": job.start_time.isoformat() if job.start_time else None,
        "dataset": meta.get("dataset"),
        "code": meta.get("code"),
        "checkpoint_step": ckpt["step"] if ckpt else None,
        "nuro": meta,
    }


def _heard() -> dict[int, dict[str, int]]:
    """Running jobs' newest commits from the controller's waits file ({} without one)."""
    return read_progress(os.environ.get(ENV_WAITS), time.time())


def _jobs(backend: Backend) -> list[JobInfo]:
    try:
        return backend.jobs()
    except SlurmError as exc:
        fail(ExitCode.FAILED, f"could not read the queue: {exc}")


def _find(backend: Backend, job_id: int) -> JobInfo:
    try:
        return find_job(backend, job_id)
    except LookupError as exc:
        fail(ExitCode.NOT_FOUND, str(exc))
    except SlurmError as exc:
        fail(ExitCode.FAILED, f"could not look up job {job_id}: {exc}")


@click.command("ls")
@click.option("--team", help="Jobs of this team (account).")
@click.option("--all", "all_users", is_flag=True, help="Jobs of every user.")
@click.option("--state", "states", multiple=True, help="Only these phases (PENDING, RUNNING, …); repeatable.")
@click.option("--recent", is_flag=True, help="Also runs that ended in the last few minutes (Slurm's MinJobAge).")
@click.option("--json", "as_json", is_flag=True)
def ls_cmd(team: str | None, all_users: bool, states: tuple[str, ...], recent: bool, as_json: bool) -> None:
    """List active runs (like squeue): yours by default, a team's with --team, everyone's with --all."""
    me = getpass.getuser()
    wanted = {s.upper() for s in states}
    jobs = [
        j
        for j in _jobs(_backend())
        if (all_users or team or j.user == me)
        and (team is None or j.account == team)
        and (j.phase.value in wanted if wanted else (recent or not j.is_finished))
    ]
    heard = _heard()
    rows = [_row(j, heard) for j in sorted(jobs, key=lambda j: j.job_id)]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("job", "name", "user", "team", "qos", "state", "reason", "nodes", "GPUs", "restarts", "ckpt step")
    for r in rows:
        table.add_row(
            str(r["job_id"]), r["name"], r["user"], r["team"], r["qos"], r["state"], r["reason"] or "",
            str(r["node_count"]), str(r["gpus"]), str(r["restarts"]), str(r["checkpoint_step"] or ""),
        )  # fmt: skip
    out.print(table if rows else empty_listing(me, team, all_users, bool(states) or recent))


def empty_listing(me: str, team: str | None, all_users: bool, with_ended: bool) -> str:
    """What an empty ``ls`` looked at, and the flags that look further: after ``make demo`` as root, a bare "no
    runs" hid that the demo's runs are alice's and have ended."""
    scope = "any user" if all_users else f"team {team}" if team else me
    hints = [] if with_ended else ["--recent: also those that ended in the last minutes"]
    hints += [] if all_users or team else ["--team TEAM or --all: other users' runs"]
    return f"no {'' if with_ended else 'active '}runs of {scope}" + (f" ({'; '.join(hints)})" if hints else "")


@click.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def status(job_id: int, as_json: bool) -> None:
    """One run in detail: its nuro record, its last committed checkpoint, and root's note (preempted for which job
    and why, or why a node refused it)."""
    job = _find(_backend(), job_id)
    row = _row(job)
    row["record"] = jobcomment.parse(job.comment).raw
    try:  # root's note lives in the admin comment, a field no job can fill (issue 30)
        row["note"] = adminnote.parse(_backend().job_admin_comment(job_id))
    except SlurmError:
        row["note"] = {}
    if job.phase == JobPhase.PENDING:  # why it waits: Slurm's reason, the controller's, its place in the queue
        waits = read_waits(os.environ.get(ENV_WAITS), time.time())
        row["waiting"] = pending_view(job, _jobs(_backend()), waits)
        if "controller" not in row["waiting"] and os.environ.get("MLFLOW_TRACKING_URI"):
            wait = _controller_wait_from_mlflow(job)
            if wait is not None:
                row["waiting"]["controller"] = wait
    spares = _spares(job, row["nuro"])
    if spares is not None:
        row["spares"] = spares
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    for key, text in status_lines(row):
        out.print(f"[bold]{key:>16}[/]  ", end="", highlight=False)
        out.print(text, highlight=False, markup=False)  # a job's name and record are its user's: never markup
    for line in waiting_lines(row.get("waiting") or {}):
        out.print(f"[bold]{'waiting':>16}[/]  {line}", highlight=False)
    if spares is not None:
        for i, line in enumerate(spare_lines(spares)):
            out.print(f"[bold]{'spares' if i == 0 else '':>16}[/]  {line}", highlight=False)


#: ``status``'s rows that have views of their own below the plain ones.
_OWN_VIEWS = ("nuro", "spares", "waiting")


def plain(value: object) -> str:
    """A record's value as people read it: a dataset as NAME@DIGEST, a commit as REPO@COMMIT, other objects as
    ``key=value`` pairs (nested ones dotted), lists joined by spaces; never a Python repr."""
    if isinstance(value, dict):
        if set(value) == {"name", "digest"}:
            return f"{value['name']}@{value['digest']}"
        if {"repo", "commit"} <= set(value):
            rest = {k: v for k, v in value.items() if k not in ("repo", "commit")}
            return f"{value['repo']}@{value['commit']}" + (f" {plain(rest)}" if rest else "")
        return " ".join(_pairs(value))
    if isinstance(value, list | tuple):
        return " ".join(plain(v) for v in value)
    return str(value)


def _pairs(obj: dict, prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in obj.items():
        if isinstance(v, dict) and v and set(v) != {"name", "digest"} and not {"repo", "commit"} <= set(v):
            out += _pairs(v, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k}={plain(v)}")
    return out


def status_lines(row: dict) -> list[tuple[str, str]]:
    """``status``'s plain rows as (label, text): one line per field; the run record one line per key (those not
    shown above it), root's note one line per note."""
    lines: list[tuple[str, str]] = []
    for key, value in row.items():
        if key in _OWN_VIEWS or value in (None, [], {}, ""):
            continue
        if key == "nodes":
            lines.append((key, ",".join(value)))
        elif key == "record":
            shown = {"team", "name", "dataset", "code"}
            rest = [(k, v) for k, v in (value.get("nuro") or {}).items() if k not in shown]
            rest += [(k, v) for k, v in value.items() if k != "nuro"]  # another key a newer writer added
            lines += [("record" if i == 0 else "", f"{k}: {plain(v)}") for i, (k, v) in enumerate(rest)]
        elif key == "note":
            lines += [("note" if i == 0 else "", f"{k}: {plain(v)}") for i, (k, v) in enumerate(value.items())]
        else:
            lines.append((key, plain(value)))
    return lines


def _mlflow_run(job: JobInfo) -> tuple[MlflowClient, str | None, dict | None]:
    """(client, experiment id, run) of the job's MLflow run in its team's experiment (``$MLFLOW_TRACKING_URI``),
    found by the bridge's ``nuro.job_id`` tag; MlflowError when MLflow cannot be asked."""
    from nuro.tracking import mirror  # lazy: only the commands that talk to MLflow import it
    from nuro.tracking.mlflow import client_from_env

    client = client_from_env()
    exp = client.experiment_id(mirror.experiment_name(job.account), create=False)
    return client, exp, client.find_run(exp, mirror.TAG_JOB, str(job.job_id)) if exp else None


def _controller_wait_from_mlflow(job: JobInfo) -> dict[str, str] | None:
    """The controller's reason as the bridge last tagged the run (``nuro.controller.wait``), for a login node that
    cannot read the controller host's waits file (production: it is on the controller host). None when MLflow has
    none or cannot be asked: ``status`` never fails because the tracking server is down."""
    from nuro.tracking import mirror  # lazy: only a pending job without the waits file talks to MLflow
    from nuro.tracking.mlflow import MlflowError, run_tags

    try:
        _, _, run = _mlflow_run(job)
    except MlflowError as exc:
        err.print(f"[yellow]note:[/] the controller's reason not read from MLflow: {exc}", highlight=False)
        return None
    wait = mirror.wait_of_tag(run_tags(run).get(mirror.TAG_WAIT))
    return {**wait, "via": "mlflow"} if wait is not None else None


def waiting_lines(view: dict) -> list[str]:
    """``pending_view`` as the status table's lines (Slurm's reason, the controller's, the queue position)."""
    lines = []
    if view.get("slurm_reason"):
        lines.append(f"Slurm: {view['slurm_reason']}")
    if view.get("controller"):
        via = " (as of the last MLflow mirror)" if view["controller"].get("via") == "mlflow" else ""
        lines.append(f"nuro-controller: {view['controller']['reason']} ({view['controller']['code']}){via}")
    if view.get("queue_position"):
        lines.append(f"queue position {view['queue_position']} of {view['queue_length']} (by Slurm priority)")
    return lines


def _spares(job: JobInfo, meta: dict) -> dict | None:
    """The job's hot spares (``--spare-nodes``): its swaps from the run's events in S3 and the spares' idle time
    (``nuro.runs.spares``); None for a job without spares. A store that cannot be read leaves the swaps out."""
    spares = meta.get("spares")
    count = spares.get("nodes") if isinstance(spares, dict) else None
    if not isinstance(count, int) or count <= 0:
        return None
    swaps: list = []
    note = None
    team, run = meta.get("team"), meta.get("name")
    if team and run:
        try:
            swaps = [e for e in run_events.read(ObjectStore.from_env(), str(team), str(run), job.job_id)
                     if e.kind == "spare_swap"]  # fmt: skip
        except (ObjectStoreError, ValueError) as exc:
            note = f"swaps unknown: the run's events could not be read ({exc})"
    start = job.start_time.timestamp() if job.start_time else None
    end = job.end_time.timestamp() if job.is_finished and job.end_time else time.time()
    lost = sum(len(run_events.node_names(e.fields.get("lost"))) for e in swaps)
    per_node = job.gpus_total // job.node_count if job.node_count else 0
    summary = spare_summary(count, job.node_count + lost, per_node, start, end, swaps)
    return {**summary, **({"note": note} if note else {})}


@click.command()
@click.argument("job_ids", type=int, nargs=-1, required=True)
def cancel(job_ids: tuple[int, ...]) -> None:
    """Cancel runs (Slurm refuses other users' jobs unless you are an operator).

    A job no one knows exits 4 and one that already ended is said so: scancel itself is silent and exits 0 for both,
    which would read as "cancelled"."""
    backend = _backend()
    for job_id in job_ids:
        job = _find(backend, job_id)
        if job.phase.is_terminal:
            click.echo(f"job {job_id} already ended ({job.state}): nothing to cancel")
            continue
        try:
            backend.cancel(job_id)
        except SlurmError as exc:
            fail(ExitCode.FAILED, f"job {job_id}: {exc}")
        click.echo(f"cancelled {job_id}")


def _follow(path: Path, backend: Backend, job_id: int, poll_s: float = 0.5) -> None:
    """Print new output as it is written, until the job ends (then print the rest)."""
    pos = 0
    while True:
        if path.exists():
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        try:
            state = backend.job_state(job_id)  # one squeue line per poll (job_record lists every job on 22.05)
        except InvalidJobId:
            return
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            if path.exists():
                with open(path, "rb") as fh:
                    fh.seek(pos)
                    sys.stdout.write(fh.read().decode(errors="replace"))
            return
        time.sleep(poll_s)


@click.command()
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the run ends.")
def logs(job_id: int, follow: bool) -> None:
    """Print a run's output file (its StdOut as Slurm records it)."""
    backend = _backend()
    try:
        record = backend.job_record(job_id)
    except InvalidJobId:
        fail(ExitCode.NOT_FOUND, f"no job {job_id} known to slurmctld (finished more than MinJobAge ago?)")
    except SlurmError as exc:
        fail(ExitCode.FAILED, str(exc))
    path = Path(record.get("StdOut", ""))
    if follow:
        _follow(path, backend, job_id)
        return
    if not path.is_file():
        fail(
            ExitCode.NOT_FOUND,
            f"job {job_id}'s output {path} is not readable from here (not written yet, or on another host)",
        )
    sys.stdout.write(path.read_text(errors="replace"))


def quota_rows(jobs: Iterable[JobInfo], policy) -> list[dict]:
    """Per team: guaranteed used / quota, borrowed, lendable now, pending GPUs. Pure: a snapshot and the policy."""
    view = build_view(tuple(jobs), policy)
    rows = []
    for team in policy.teams:
        u = view.usage.get(team.name)
        g_used = u.g_running if u else 0
        g_waiting = u.g_waiting if u else 0
        borrowed = u.b_running if u else 0
        pending = sum(j.gpus_total for j in view.pending if view.cls(j).team == team.name)
        rows.append(
            {
                "team": team.name,
                "quota_gpus": team.quota_gpus,
                "guaranteed_used_gpus": g_used,
                "borrowed_gpus": borrowed,
                "borrow_limit_gpus": team.borrow_limit_gpus,
                "lendable_gpus": min(team.lend_limit_gpus, max(0, team.quota_gpus - g_used - g_waiting)),
                "pending_gpus": pending,
            }
        )
    return rows


@click.command()
@click.option(
    "--policy", "policy_path", type=click.Path(dir_okay=False, path_type=Path), envvar=NURO_POLICY,
    required=True, help="The teams.yaml in force [env NURO_POLICY].",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True)
def quota(policy_path: Path, as_json: bool) -> None:
    """Per team: guaranteed used / quota, borrowed, lendable, pending."""
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        fail(ExitCode.INVALID, str(exc))
    rows = quota_rows(_jobs(_backend()), policy)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table("team", "guaranteed used / quota", "borrowed / limit", "lendable now", "pending")
    for r in rows:
        table.add_row(
            r["team"], f"{r['guaranteed_used_gpus']} / {r['quota_gpus']}",
            f"{r['borrowed_gpus']} / {r['borrow_limit_gpus']}", str(r["lendable_gpus"]), str(r["pending_gpus"]),
        )  # fmt: skip
    out.print(table)


@click.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def lineage(job_id: int, as_json: bool) -> None:
    """What a run was pinned to (dataset digest, code commit), its restarts and checkpoints, and its parents.

    Checkpoints come from the run's S3 manifests (each names its job, restart and parent step); Slurm's comment
    and accounting give the ``resume_from`` chain. Nothing else is consulted.
    """
    try:
        chain = lineage_of(_backend(), job_id, store=True)
    except LookupError as exc:
        fail(ExitCode.NOT_FOUND, str(exc))
    except SlurmError as exc:
        fail(ExitCode.FAILED, f"could not look up job {job_id}: {exc}")
    if as_json:
        click.echo(json.dumps(chain, indent=2))
        return
    for depth, run in enumerate(chain):
        pad = "  " * depth + ("└─ resumed from " if depth else "")
        if "missing" in run:
            out.print(f"{pad}job {run['job_id']}: {run['missing']}", highlight=False)
            continue
        ds, code = run["dataset"] or {}, run["code"] or {}
        out.print(f"{pad}[bold]job {run['job_id']}[/] {run['name']} ({run['team']}, {run['state']}, "
                  f"{run['restarts']} restarts)", highlight=False)  # fmt: skip
        if not ds and not code:  # "-@-" said nothing: a plain sbatch job pins nothing
            out.print(f"{'  ' * depth}   pinned  nothing (no run record: a plain sbatch job)", highlight=False)
        else:
            out.print(f"{'  ' * depth}   dataset {ds.get('name', '-')}@{ds.get('digest', '-')}", highlight=False)
            out.print(f"{'  ' * depth}   code    {code.get('repo', '-')}@{code.get('commit', '-')}"
                      + (f" + diff {code['diff']}" if code.get("diff") else ""), highlight=False)  # fmt: skip
        ck = run["last_checkpoint"]
        last = f"step {ck['step']}" if ck else "none recorded"
        out.print(f"{'  ' * depth}   last checkpoint: {last}", highlight=False)
        for line in checkpoint_lines(run.get("checkpoints")):
            out.print(f"{'  ' * depth}     {line}", highlight=False)
    for note in chain[0].get("notes", []) if chain else []:
        err.print(f"[yellow]note:[/] {note}", highlight=False)


@click.command("open")
@click.argument("job_id", type=int)
@click.option("--browser", is_flag=True, help="Also open the page in a web browser.")
@click.option("--json", "as_json", is_flag=True)
def open_cmd(job_id: int, browser: bool, as_json: bool) -> None:
    """The run's page in the MLflow UI (MLFLOW_TRACKING_URI): prints its URL.

    The run is found in its team's experiment (``nuro/<team>``, the job's Slurm account) by the tag
    ``nuro.job_id``; nuro-mlflow-bridge creates it within one pass of the job appearing in the queue.
    """
    from nuro.tracking import mirror  # lazy: only the commands that talk to MLflow import it
    from nuro.tracking.mlflow import MlflowError, run_url

    job = _find(_backend(), job_id)
    if mirror.mirrored_team(jobcomment.parse(job.comment).record, job.account) is None:  # the bridge's own rule
        fail(ExitCode.NOT_FOUND, f"job {job_id} has no MLflow run: it carries no run record of its team, and "
             "nuro-mlflow-bridge mirrors runs only (nuro-train submit, nuro-sbatch --dataset/--code)")  # fmt: skip
    try:
        client, exp, run = _mlflow_run(job)
    except MlflowError as exc:
        fail(ExitCode.FAILED, str(exc))
    if run is None:
        fail(ExitCode.NOT_FOUND, f"job {job_id} has no MLflow run yet (nuro-mlflow-bridge mirrors a run within a "
             "pass of its appearing in the queue; is it running?)")  # fmt: skip
    run_id = run["info"]["run_id"]
    url = run_url(client.base_url, str(exp), run_id)
    if as_json:
        click.echo(json.dumps({"job_id": job_id, "experiment_id": exp, "run_id": run_id, "url": url}))
    else:
        click.echo(url)
    if browser:
        import webbrowser  # lazy: only --browser

        webbrowser.open(url)


COMMANDS = (ls_cmd, status, cancel, logs, quota, lineage, open_cmd)

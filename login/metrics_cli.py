"""``nuro-train metrics | artifacts | compare``: what a run logged, what it stored, and how two runs differ.

The views themselves (reading Slurm, the metrics sink and S3; summarising; rendering) are ``nuro.runs.report``'s,
shared with the dev wing and the demo; this module parses the flags, turns the readers' errors into exit codes and
prints.

Exit codes: 0 ok, 1 Slurm unreachable, 4 no such job, 5 the metrics sink cannot be read.
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any, NoReturn

import click
from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from nuro.console import ExitCode, fail, stdout_console
from nuro.metrics.model import Row
from nuro.metrics.sink import MetricsConfigError, SinkError
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.runs.report import (
    DEFAULT_HISTORY,
    RunRef,
    compare_rows,
    count_checkpoints,
    gather_artifacts,
    open_sink,
    plot_series,
    plot_text,
    read_rows,
    render_artifacts,
    render_compare,
    render_metrics,
    resolve_run,
    run_summary,
    summarize,
    train_query,
)
from nuro.slurm import CliBackend, SlurmError

out = stdout_console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _resolve_or_exit(backend: CliBackend, job_id: int) -> RunRef:
    try:
        return resolve_run(backend, job_id)
    except LookupError as exc:
        fail(ExitCode.NOT_FOUND, str(exc))
    except SlurmError as exc:
        fail(ExitCode.FAILED, f"Slurm: {exc}")


def _open_sink_or_exit(team: str | None = None) -> Any:
    try:
        return open_sink(team)
    except (SinkError, MetricsConfigError) as exc:
        fail(ExitCode.SINK, f"cannot open the metrics sink: {exc}")


def _unreadable_sink(sink: Any, exc: Exception) -> NoReturn:
    fail(ExitCode.SINK, f"cannot read metrics from {getattr(sink, 'name', 'the sink')}: {exc}")


def _snapshot(
    backend: CliBackend, sink: Any, job_id: int, limit: int | None = DEFAULT_HISTORY
) -> tuple[RunRef, list[Row], list[Row]]:
    ref = _resolve_or_exit(backend, job_id)
    try:
        train, gpus = read_rows(sink, ref, time.time_ns(), limit)
    except SinkError as exc:
        _unreadable_sink(sink, exc)
    return ref, train, gpus


# -- metrics ------------------------------------------------------------------------------------------------------
@click.command("metrics")
@click.argument("job_id", type=int)
@click.option("-f", "--follow", is_flag=True, help="Refresh live until the run ends.")
@click.option("--plot", is_flag=True, help="Draw loss and throughput over steps in the terminal.")
@click.option("--json", "as_json", is_flag=True, help="Latest per rank, GPUs and the whole history as JSON.")
@click.option("--interval-s", type=float, default=2.0, show_default=True, help="Refresh period of --follow.")
@click.option("--limit", type=click.IntRange(min=1), default=DEFAULT_HISTORY, show_default=True,
              help="Read at most the newest N training points (all ranks together).")  # fmt: skip
def metrics(job_id: int, follow: bool, plot: bool, as_json: bool, interval_s: float, limit: int) -> None:
    """Show run JOB_ID's training metrics: latest loss, samples/s and step time per rank, and its GPUs.

    --json prints once (with --plot: the plotted series too); --follow refreshes until the job ends.
    """
    backend = CliBackend(timeout_s=30)
    sink = _open_sink_or_exit(_resolve_or_exit(backend, job_id).team)
    try:
        if follow and not as_json:
            _follow(backend, sink, job_id, plot, interval_s, limit)
            return
        ref, train, gpus = _snapshot(backend, sink, job_id, limit)
        summary = summarize(ref, train, gpus)
        if as_json:
            if plot:
                summary["plot"] = plot_series(train)
            click.echo(json.dumps(summary, indent=2))
            return
        out.print(render_metrics(summary))
        if plot:
            click.echo(plot_text(plot_series(train), width=min(out.width, 120)))
    finally:
        sink.close()


def _follow(backend: CliBackend, sink: Any, job_id: int, plot: bool, interval_s: float, limit: int) -> None:
    def view() -> tuple[Any, bool]:
        ref, train, gpus = _snapshot(backend, sink, job_id, limit)
        group = render_metrics(summarize(ref, train, gpus))
        if plot:
            group = Group(group, Text(plot_text(plot_series(train), width=min(out.width, 120), height=24)))
        return group, ref.finished

    first, done = view()
    with Live(first, console=out, refresh_per_second=4, transient=False) as live:
        while not done:
            time.sleep(interval_s)
            renderable, done = view()
            live.update(renderable)


# -- artifacts ----------------------------------------------------------------------------------------------------
@click.command("artifacts")
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True)
def artifacts(job_id: int, as_json: bool) -> None:
    """List run JOB_ID's checkpoints (step, size, committed at, job, restart, parent) and its other S3 objects."""
    ref = _resolve_or_exit(CliBackend(timeout_s=30), job_id)
    try:
        result = gather_artifacts(ref, ObjectStore.from_env() if ref.team and ref.run else None)
    except (ObjectStoreError, ValueError) as exc:
        fail(ExitCode.FAILED, f"cannot list the run's objects in S3: {exc}")
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    out.print(render_artifacts(result))


# -- compare ------------------------------------------------------------------------------------------------------
@click.command("compare")
@click.argument("job_a", type=int)
@click.argument("job_b", type=int)
@click.option("--json", "as_json", is_flag=True)
def compare(job_a: int, job_b: int, as_json: bool) -> None:
    """Compare two runs: parameters, pinned data and code, final metrics and checkpoints, differences highlighted."""
    backend = CliBackend(timeout_s=30)
    sink = _open_sink_or_exit()
    store = functools.cache(ObjectStore.from_env)  # opened once, and only for a run with checkpoints to count
    notes: list[str] = []
    summaries = []
    try:
        for job_id in (job_a, job_b):
            ref = _resolve_or_exit(backend, job_id)
            try:
                train = sink.query(train_query(ref, None))
            except SinkError as exc:
                _unreadable_sink(sink, exc)
            count, note = count_checkpoints(ref, store)
            notes += [note] if note else []
            summaries.append(run_summary(ref, train, count))
    finally:
        sink.close()
    rows = compare_rows(*summaries)
    if as_json:
        click.echo(json.dumps({"a": summaries[0], "b": summaries[1], "rows": rows, "notes": notes}, indent=2))
        return
    out.print(render_compare(summaries[0], summaries[1], rows))
    for note in notes:
        err.print(f"[yellow]note:[/] {note}", highlight=False)


COMMANDS = (metrics, artifacts, compare)

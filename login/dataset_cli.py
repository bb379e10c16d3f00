"""``dataset``: snapshot a directory into S3, list, show, tag and verify snapshots (mounted under ``nuro-train``).

The store comes from the environment (``NURO_S3_ENDPOINT``, ``NURO_S3_BUCKET``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, or a team's key through ``NURO_S3_CREDENTIALS``; ``eval "$(nuro-admin devcluster env)"``
sets them for the dev cluster). A dataset named ``<team>.<name>`` belongs to that team (only its key writes it or
moves its tags); other names are shared, written by the platform admin and read by every team (docs/security.md).

Exit codes: 0 ok; 1 the store failed or refused (unreachable, access denied, tag conflict) or verification found a
problem; 2 usage error (bad arguments, name, reference, or a file the snapshot cannot contain); 4 not found (no
such dataset, tag or snapshot).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from nuro.console import ExitCode, fail, stdout_console
from nuro.datasets.errors import DatasetError, DatasetNotFound, InvalidInput
from nuro.datasets.manifest import parse_ref
from nuro.datasets.refs import list_datasets, list_snapshots, list_tags, load_manifest, resolve, set_tag
from nuro.datasets.snapshot import snapshot as take_snapshot
from nuro.datasets.verify import verify as verify_snapshot
from nuro.objectstore import NotFound, ObjectStore, ObjectStoreError

PROGRESS_MIN_BYTES = 16 * 1024 * 1024  # smaller snapshots finish before a bar would be readable

err = Console(stderr=True, soft_wrap=True, highlight=False)


def _handles_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map nuro's typed errors to the documented exit codes, with their message (never a traceback)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InvalidInput as exc:
            fail(ExitCode.USAGE, str(exc))
        except (DatasetNotFound, NotFound) as exc:
            fail(ExitCode.NOT_FOUND, str(exc))
        except (DatasetError, ObjectStoreError) as exc:
            fail(ExitCode.FAILED, str(exc))

    return wrapper


def _store() -> ObjectStore:
    return ObjectStore.from_env()


@contextmanager
def _bytes_bar(label: str, enabled: bool) -> Iterator[tuple[Callable[[int, int], None], Callable[[int], None]]]:
    """A rich byte progress bar on stderr; yields (start(total_bytes, n), advance(bytes)). Off when disabled or
    the job is small."""
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=False,
    )  # fmt: skip
    state: dict[str, Any] = {}

    def start(total: int, shards: int) -> None:
        if enabled and total >= PROGRESS_MIN_BYTES:
            progress.start()
            state["task"] = progress.add_task(f"{label} ({shards} shard{'s' if shards != 1 else ''})", total=total)

    def advance(nbytes: int) -> None:
        if "task" in state:
            progress.advance(state["task"], nbytes)

    try:
        yield start, advance
    finally:
        if "task" in state:
            progress.stop()


def _emit(as_json: bool, obj: Any, human: Callable[[], None]) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2, default=str))
    else:
        human()


@click.group()
def dataset() -> None:
    """Immutable, content-addressed dataset snapshots in S3 (jobs pin a digest: NAME@sha256:...)."""


@dataset.command()
@click.argument("path", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", "-n", required=True, help="Dataset name (lower-case letters, digits, . _ -).")
@click.option("--tag", "-t", default=None, help="Also point this tag at the new snapshot (e.g. latest).")
@click.option("--force", is_flag=True, help="Move --tag even if it already points to another snapshot.")
@click.option("--shard-mib", type=click.IntRange(1, 4096), default=64, show_default=True, help="Target shard size.")
@click.option(
    "--samples", metavar="REGEX", default=None,
    help="The sample index: files whose paths give the same key (the regex's groups joined with /) form one "
    "training sample, e.g. '^([^/]+)/[^/]+/(\\d+)\\.' for six camera frames + labels of one timestamp. Stored in "
    "the snapshot, so every reader of the digest groups alike (SnapshotDataset's default). Default: one per file.",
)  # fmt: skip
@click.option("--no-progress", is_flag=True, help="No progress bar (it is shown on stderr from 16 MiB on).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@_handles_errors
def snapshot(
    path: Path, name: str, tag: str | None, force: bool, shard_mib: int, samples: str | None, no_progress: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Snapshot directory PATH: shards are uploaded once (dedup), the manifest last; prints the digest."""
    with _bytes_bar(f"snapshot {name}", not no_progress) as (start, advance):
        res = take_snapshot(
            _store(), path, name, tag, force_tag=force, target_bytes=shard_mib * 1024 * 1024,
            progress=advance, on_plan=start, samples=samples,
        )  # fmt: skip

    def human() -> None:
        click.echo(f"{res.name}@{res.digest}")
        err.print(
            f"{res.files} files, {res.total_bytes / 2**20:.1f} MiB in {res.shards} shards: {res.shards_uploaded} "
            f"uploaded, {res.shards_present} already present"
            + ("" if res.manifest_written else "; identical manifest already stored")
            + (f"; tag {res.tag} → this snapshot" if res.tag else "")
            + (f"; {res.samples} samples by {res.sample_pattern!r}" if res.sample_pattern else "")
        )

    _emit(as_json, res.to_json(), human)


@dataset.command(name="ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_handles_errors
def ls(as_json: bool) -> None:
    """Every dataset with its number of snapshots, newest digest and tags (shared ones and your team's)."""
    store = _store()
    rows = []
    for name in list_datasets(store, [store.config.team] if store.config.team else None):
        snaps = list_snapshots(store, name)
        rows.append({
            "name": name, "snapshots": len(snaps), "newest": snaps[-1][0] if snaps else None,
            "newest_at": snaps[-1][1] if snaps else None, "tags": list_tags(store, name),
        })  # fmt: skip

    def human() -> None:
        table = Table("dataset", "snapshots", "newest", "tags")
        for r in rows:
            tags = ", ".join(f"{t}→{d[7:19]}" for t, d in sorted(r["tags"].items()))
            table.add_row(r["name"], str(r["snapshots"]), (r["newest"] or "")[:19], tags)
        stdout_console().print(table)

    _emit(as_json, rows, human)


@dataset.command()
@click.argument("ref")
@click.option("--files", "show_files", is_flag=True, help="List every file (JSON output always includes them).")
@click.option("--json", "as_json", is_flag=True, help="The summary plus the full manifest as JSON.")
@_handles_errors
def show(ref: str, show_files: bool, as_json: bool) -> None:
    """Show snapshot NAME@TAG or NAME@sha256:... (a tag is resolved to its digest first)."""
    store = _store()
    r = parse_ref(ref)
    digest = resolve(store, r)
    manifest, _ = load_manifest(store, r.name, digest)
    tags = sorted(t for t, d in list_tags(store, r.name).items() if d == digest)
    summary = {
        "ref": f"{r.name}@{digest}", "name": r.name, "digest": digest, "created": manifest.created,
        "files": len(manifest.files), "bytes": manifest.total_bytes, "shards": len(manifest.shards), "tags": tags,
    }  # fmt: skip

    def human() -> None:
        for key in ("ref", "created", "files", "bytes", "shards"):
            click.echo(f"{key:8} {summary[key]}")
        click.echo(f"{'tags':8} {', '.join(tags) or '-'}")
        if show_files:
            table = Table("path", "bytes", "mode", "sha256")
            for f in manifest.files:
                table.add_row(f.path, str(f.length), f"{f.mode:04o}", f.sha256[7:23])
            stdout_console(highlight=False).print(table)

    _emit(as_json, {**summary, "manifest": manifest.to_json_obj()}, human)


@dataset.command()
@click.argument("ref")
@click.argument("tag")
@click.option("--force", is_flag=True, help="Move TAG if it already points to another snapshot.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_handles_errors
def tag(ref: str, tag: str, force: bool, as_json: bool) -> None:
    """Point TAG at snapshot REF (NAME@sha256:..., or NAME@OTHER_TAG to copy a tag). Conditional write: a tag moved
    by someone else meanwhile is never overwritten."""
    store = _store()
    r = parse_ref(ref)
    state = set_tag(store, r.name, tag, resolve(store, r), force=force)
    obj = {"ref": f"{r.name}@{tag}", "digest": state.digest, "previous": state.previous}
    _emit(as_json, obj, lambda: click.echo(f"{r.name}@{tag} → {state.digest}"))


@dataset.command()
@click.argument("ref")
@click.option("--workers", type=click.IntRange(1, 64), default=4, show_default=True, help="Shards checked at once.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@_handles_errors
def verify(ref: str, workers: int, no_progress: bool, as_json: bool) -> None:
    """Re-hash the manifest, every shard and every file of REF. Exit 1 naming each bad file."""
    store = _store()
    r = parse_ref(ref)
    digest = resolve(store, r)
    manifest, _ = load_manifest(store, r.name, digest)
    with _bytes_bar(f"verify {r.name}", not no_progress) as (start, advance):
        start(sum(s.size for s in manifest.shards), len(manifest.shards))
        report = verify_snapshot(store, r.name, digest, workers=workers, progress=advance)

    def human() -> None:
        if report.ok:
            click.echo(f"ok: {r.name}@{digest}: {report.files} files, {report.shards} shards, "
                       f"{report.bytes_checked} bytes verified")  # fmt: skip
        for problem in report.problems:
            err.print(f"[red]bad:[/] {problem}")

    _emit(as_json, report.to_json(), human)
    if not report.ok:
        if not as_json:
            err.print(f"[bold red]verification failed:[/] {len(report.bad_files)} bad files in {r.name}@{digest}")
        sys.exit(ExitCode.FAILED)


if __name__ == "__main__":
    dataset()

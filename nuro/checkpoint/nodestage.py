"""The prolog's and epilog's part of checkpoint staging, on one compute node, as root.

Prolog (``prepare_job_dir`` + ``stage_latest``):
  1. create ``<staging_root>/<job_id>`` (owner = the job's uid/gid, mode 700): the job's ``NURO_STAGING_DIR``;
  2. stage the newest valid checkpoint of the job's team/run into ``<job dir>/restore/step-N``: from this node's
     cache (an earlier job of the run left it, see the epilog) or another job's staging dir when a copy there
     verifies against the manifest, else from S3 — bounded in time. The job's ``Checkpointer.restore`` finds it
     there and only re-hashes it; if staging failed or timed out, the job restores from S3 itself.

Epilog (``finish_job``):
  1. ``UploadWorker.flush``: wait (bounded) until the job's requests are committed; leftovers get
     ``incomplete.json`` — never a manifest;
  2. keep the newest committed copy in ``<staging_root>/cache/<team>/<run>/`` (one step per run, at most
     ``NURO_STAGING_CACHE_RUNS`` runs) so a requeue on this node restores without downloading; then evict the
     least recently cached runs while the disk has less than ``keep_free_bytes`` free (the epilog passes
     ``NURO_STAGING_CACHE_KEEP_FREE_GB``, default twice the health check's ``NURO_STAGING_MIN_FREE_GB``): a cache is
     an optimisation and must never be what drains the node for a full staging disk;
  3. remove the job dir.

Everything read here was written by the job's user: records are parsed strictly, files are opened without
following symlinks (``verify.open_beneath``), only the files a manifest lists (and that hash to it) are moved into
a job's dir, and ownership changes use ``lchown``.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import CheckpointError, ManifestError
from nuro.checkpoint.manifest import dumps, utc_now
from nuro.checkpoint.restore import Restored, restore_latest
from nuro.checkpoint.staging import job_dirs, job_steps, safe_request, write_atomic
from nuro.checkpoint.upload import FlushResult, UploadWorker
from nuro.objectstore import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

DEFAULT_STAGE_TIMEOUT_S = 120.0
DEFAULT_FLUSH_TIMEOUT_S = 120.0
DEFAULT_CACHE_RUNS = 4


def staging_root(env: Mapping[str, str] | None = None) -> Path:
    """``NURO_STAGING_ROOT`` (default ``/var/tmp/nuro-staging``). A ``{node}`` in it becomes ``SLURMD_NODENAME``:
    emulated nodes that share one file system (the dev cluster) each need their own root."""
    e = os.environ if env is None else env
    return L.node_staging_root(e.get("NURO_STAGING_ROOT") or L.DEFAULT_STAGING_ROOT, e.get("SLURMD_NODENAME"))


def _ensure_root(root: Path) -> None:
    """The staging root: root-owned, 0755 (jobs traverse it to their own 0700 dir)."""
    root.mkdir(parents=True, exist_ok=True)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"staging root {root} is not a directory (NURO_STAGING_ROOT)")
    if os.geteuid() == 0 and (st.st_uid != 0 or st.st_mode & 0o022):
        os.chown(root, 0, 0, follow_symlinks=False)
        os.chmod(root, 0o755)


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    if os.geteuid() != 0:
        return
    os.chown(top, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def prepare_job_dir(root: Path, job_id: str, uid: int, gid: int) -> Path:
    """Create the job's staging dir owned by the job's user, mode 700, with ``ckpt/`` and ``restore/``.

    An existing real directory of that user is kept (a requeue whose epilog did not run: its pending uploads are
    still worth committing, and everything in it is verified before use); anything else at that name is removed.
    """
    _ensure_root(root)
    job_dir = root / L.validate_job_id(job_id)
    if os.path.lexists(job_dir):
        st = os.lstat(job_dir)
        if not stat.S_ISDIR(st.st_mode):
            job_dir.unlink()
        elif st.st_uid != uid:
            shutil.rmtree(job_dir)
    job_dir.mkdir(mode=0o700, exist_ok=True)
    os.chmod(job_dir, 0o700)
    for sub in ("ckpt", "restore"):
        path = job_dir / sub
        if path.is_symlink():
            path.unlink()
        path.mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() == 0:
        for path in (job_dir, job_dir / "ckpt", job_dir / "restore"):
            os.chown(path, uid, gid, follow_symlinks=False)
    return job_dir


@dataclass
class StageResult:
    """What the prolog staged: the step and where it came from, or why nothing was staged."""

    step: int | None = None
    source: str = ""
    path: Path | None = None
    skipped: list[str] | None = None
    error: str = ""
    timed_out: bool = False


def _adopt(restored: Restored, job_dir: Path) -> Path:
    """Put a verified local copy that lies outside the job dir into ``<job>/restore/step-N``: files from the node
    cache are moved (it is refilled by the next epilog), from another job's dir copied (that job may still run).
    Only the manifest's files are taken, and each is re-checked after it is placed."""
    from nuro.checkpoint.verify import check_local_file

    target = job_dir / "restore" / L.step_name(restored.step)
    if restored.path == target:
        return target
    target.mkdir(parents=True, exist_ok=True)
    from_cache = restored.path.is_relative_to(job_dir.parent / L.CACHE_DIR)
    for entry in restored.manifest.shards:
        src, dst = restored.path / entry.path, target / entry.path
        dst.parent.mkdir(parents=True, exist_ok=True)
        if from_cache:
            os.replace(src, dst)
        else:
            shutil.copyfile(src, dst, follow_symlinks=False)
        problem = check_local_file(target, entry)
        if problem:
            shutil.rmtree(target, ignore_errors=True)
            raise CheckpointError(f"local copy changed while staged: {problem}")
    if from_cache:
        shutil.rmtree(restored.path, ignore_errors=True)
    write_atomic(target / L.VERIFIED_FILE, dumps({"step": restored.step, "at": utc_now()}))
    return target


def stage_latest(
    store: ObjectStore,
    team: str,
    run: str,
    job_dir: Path,
    uid: int,
    gid: int,
    *,
    timeout_s: float = DEFAULT_STAGE_TIMEOUT_S,
) -> StageResult:
    """Stage the newest valid checkpoint of ``team/run`` into the job's restore dir, within ``timeout_s``.

    Runs in a thread joined with the timeout: a slow store delays the job by at most ``timeout_s``, and then the
    job restores by itself (the half-done download is removed by the epilog with the job dir).
    """
    root = job_dir.parent
    result = StageResult()

    def work() -> None:
        try:
            others = [d / "ckpt" for d in reversed(job_dirs(root)) if d != job_dir]
            local_roots = [L.cache_dir(root, team, run), *others]
            found = restore_latest(store, team, run, local_roots=local_roots, dest=job_dir / "restore")
            if found is None:
                return
            result.skipped = [str(s) for s in found.skipped]
            result.step, result.source = found.step, found.source
            result.path = _adopt(found, job_dir) if found.source == "local" else found.path
            _chown_tree(job_dir / "restore", uid, gid)
        except (CheckpointError, ManifestError, ObjectStoreError, OSError) as exc:
            result.error = str(exc)

    t = threading.Thread(target=work, name="nuro-prolog-stage", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        result.timed_out = True
        result.error = f"staging did not finish within {timeout_s:.0f} s; the job will restore by itself"
    return result


# -- epilog ----------------------------------------------------------------------------------------------------
def _newest_committed(job_dir: Path) -> tuple[Path, int, str, str] | None:
    """(dir, step, team, run) of the job's newest committed local checkpoint, from its upload requests."""
    for s in reversed(job_steps(job_dir)):
        if not s.is_done:
            continue
        try:
            req = safe_request(s, s.parts[0]) if s.parts else None
        except ManifestError:
            continue
        if req is not None:
            return s.path, s.step, req.team, req.run
    return None


def _cache(root: Path, job_dir: Path, max_runs: int, keep_free_bytes: int = 0) -> str | None:
    newest = _newest_committed(job_dir)
    if newest is None:
        return None
    path, step, team, run = newest
    dest_parent = L.cache_dir(root, team, run)
    if dest_parent.exists():
        shutil.rmtree(dest_parent)  # one step per run: the new one replaces it
    dest_parent.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    dest_parent.mkdir(mode=0o700)
    os.replace(path, dest_parent / L.step_name(step))
    _chown_tree(dest_parent, 0, 0)  # root's until the next prolog of the run adopts it
    _evict(root, max_runs, keep_free_bytes)
    return f"{team}/{run}@{step}" if dest_parent.exists() else None


def _disk_free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _evict(
    root: Path, max_runs: int, keep_free_bytes: int = 0, disk_free: Callable[[Path], int] = _disk_free_bytes
) -> list[Path]:
    """Keep the ``max_runs`` most recently cached runs on this node, then drop the least recent ones (the newest
    last) while the disk has less than ``keep_free_bytes`` free. Returns what was removed, in that order."""
    runs = sorted(
        (p for team in (root / L.CACHE_DIR).glob("*") if team.is_dir() for p in team.iterdir() if p.is_dir()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    removed = []
    for old in reversed(runs[max_runs:]):  # over the count
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    kept = runs[:max_runs]
    while kept and keep_free_bytes > 0 and disk_free(root) < keep_free_bytes:  # over the disk
        old = kept.pop()
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return removed


def finish_job(
    store: ObjectStore,
    root: Path,
    job_id: str,
    *,
    flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
    cache_runs: int = DEFAULT_CACHE_RUNS,
    cache_keep_free_bytes: int = 0,
) -> tuple[FlushResult | None, str | None]:
    """Epilog: flush the job's uploads (bounded), cache its newest committed copy, remove its staging dir.

    Returns (flush result, cached "team/run@step" or None). Never raises for a store outage.
    """
    job_dir = root / L.validate_job_id(job_id)
    if not job_dir.is_dir() or job_dir.is_symlink():
        return None, None
    result = UploadWorker(store, root).flush(job_id, flush_timeout_s)
    cached = None
    try:
        if cache_runs > 0:
            cached = _cache(root, job_dir, cache_runs, cache_keep_free_bytes)
    except OSError as exc:
        log.warning("job=%s could not cache its newest checkpoint: %s", job_id, exc)
    shutil.rmtree(job_dir, ignore_errors=True)
    return result, cached


__all__ = ["StageResult", "finish_job", "prepare_job_dir", "stage_latest", "staging_root"]

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

Trust: team and run come only from the job's root-owned record (``nuro.protocol.jobrecord``, written by the prolog from
slurmd's environment), never from the comment or a file the job wrote. Everything inside a job's dir is the job
user's to change at any moment, so root touches it only through directory fds opened with no-follow
(``nuro.safeio.safefs``): symlinks are refused, only regular files are read (a FIFO cannot block, ``/dev/zero`` cannot
fill memory), what root creates is made under temp names ``O_EXCL|O_NOFOLLOW`` and given to the job's user with
``fchown`` on its own fd; there is no chown by path. Only files that hash to the manifest are placed in a job's dir,
and a file with more than one link is never given away (a hard link to a system file must not change owner).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import stat
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nuro.checkpoint import dsfiles
from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import CheckpointError, ManifestError
from nuro.checkpoint.manifest import Manifest
from nuro.checkpoint.restore import restore_latest
from nuro.checkpoint.upload import FlushResult, UploadWorker
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.protocol import jobrecord
from nuro.protocol.envnames import NURO_STAGING_ROOT
from nuro.protocol.jobrecord import JobRecord
from nuro.safeio import safefs
from nuro.safeio.safefs import Dir, UnsafePath

log = logging.getLogger(__name__)

DEFAULT_STAGE_TIMEOUT_S = 120.0
DEFAULT_FLUSH_TIMEOUT_S = 120.0
DEFAULT_CACHE_RUNS = 4


def staging_root(env: Mapping[str, str] | None = None) -> Path:
    """``NURO_STAGING_ROOT`` (default ``/var/tmp/nuro-staging``). A ``{node}`` in it becomes ``SLURMD_NODENAME``:
    emulated nodes that share one file system (the dev cluster) each need their own root."""
    e = os.environ if env is None else env
    return L.node_staging_root(e.get(NURO_STAGING_ROOT) or L.DEFAULT_STAGING_ROOT, e.get("SLURMD_NODENAME"))


@contextlib.contextmanager
def open_root(root: Path) -> Iterator[Dir]:
    """The staging root, open: root-owned, 0755 (jobs traverse it to their own 0700 dir), never a symlink. Its
    own path is the admin's (``NURO_STAGING_ROOT``); everything below it is reached through this fd."""
    root.mkdir(parents=True, exist_ok=True)
    d = Dir(safefs.open_dir(root), root)
    try:
        st = os.fstat(d.fd)
        if os.geteuid() == 0 and (st.st_uid != 0 or st.st_mode & 0o022):
            os.fchown(d.fd, 0, 0)
            os.fchmod(d.fd, 0o755)
        yield d
    finally:
        d.close()


_OWN_DEPTH = 16  # a DCP checkpoint is one or two levels deep


def _own_tree(d: Dir, uid: int, gid: int, depth: int = 0) -> None:
    """Give everything below ``d`` to ``uid:gid`` through no-follow fds (directories 0700, files 0600); anything
    that is not a directory or a single-link regular file, or lies deeper than ``_OWN_DEPTH``, is removed, never
    given to anyone."""
    safefs.fchown(d.fd, uid, gid)
    os.fchmod(d.fd, 0o700)
    for entry in safefs.list_dir(d.fd):
        if entry.is_dir and depth >= _OWN_DEPTH:
            safefs.remove_at(d.fd, entry.name)
            continue
        if entry.is_dir:
            try:
                sub = d.sub(entry.name)
            except (UnsafePath, FileNotFoundError):
                safefs.remove_at(d.fd, entry.name)
                continue
            try:
                _own_tree(sub, uid, gid, depth + 1)
            finally:
                sub.close()
            continue
        try:
            fd = safefs.open_regular(entry.name, dir_fd=d.fd) if entry.is_file else None
        except OSError:
            fd = None
        if fd is None:
            safefs.remove_at(d.fd, entry.name)
            continue
        try:
            if os.fstat(fd).st_nlink != 1:
                os.unlink(entry.name, dir_fd=d.fd)
                continue
            safefs.fchown(fd, uid, gid)
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def _fresh_subdir(parent: Dir, name: str, uid: int, gid: int) -> None:
    """``parent/name`` a real directory of ``uid:gid``, mode 700: a symlink or file there is removed first."""
    st = safefs.lstat_at(parent.fd, name)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=parent.fd)
    sub = parent.mkdir(name, 0o700, (uid, gid))
    try:
        os.fchmod(sub.fd, 0o700)
    finally:
        sub.close()


def prepare_job_dir(root: Path, job_id: str, uid: int, gid: int) -> Path:
    """Create the job's staging dir owned by the job's user, mode 700, with ``ckpt/`` and ``restore/``.

    An existing real directory of that user is kept (a requeue whose epilog did not run: its pending uploads are
    still worth committing, and everything in it is verified before use); anything else at that name is removed.
    """
    name = L.validate_job_id(job_id)
    with open_root(root) as r:
        st = safefs.lstat_at(r.fd, name)
        if st is not None and (not stat.S_ISDIR(st.st_mode) or st.st_uid != uid):
            safefs.remove_at(r.fd, name)
        job = r.mkdir(name, 0o700, (uid, gid))
        try:
            os.fchmod(job.fd, 0o700)
            for sub in (L.CKPT_DIR, L.RESTORE_DIR):
                _fresh_subdir(job, sub, uid, gid)
        finally:
            job.close()
    return root / name


@dataclass
class StageResult:
    """What the prolog staged: the step and where it came from, or why nothing was staged."""

    step: int | None = None
    source: str = ""
    path: Path | None = None
    skipped: list[str] | None = None
    error: str = ""
    timed_out: bool = False
    files: int = 0  # files of the step staged here (this node's share of a DeepSpeed step)
    of_files: int = 0  # files of the step in all


@dataclass(frozen=True)
class GangPosition:
    """Where this node sits in its job: its index in the job's node list (Slurm's order, a step's ``SLURM_NODEID``)
    and how many nodes the job has. The prolog stages only this node's share of a DeepSpeed step from it
    (``dsfiles.node_need``)."""

    index: int
    nodes: int

    def need_of(self, manifest: Manifest) -> Callable[[str], bool] | None:
        """This node's files of ``manifest``'s step; None (all) unless the step was written by a gang this size."""
        if manifest.parts != self.nodes:
            return None
        return dsfiles.node_need([s.path for s in manifest.shards], manifest.world_size, manifest.parts, self.index)


def _same_run_ckpt_dirs(r: Dir, rec: JobRecord) -> list[Dir]:
    """The ``ckpt`` dirs of other jobs on this node whose own records name the same team and run (newest job
    first), opened no-follow. Their files are only ever read, and used only when they hash to the manifest."""
    out: list[Dir] = []
    for entry in reversed(safefs.list_dir(r.fd)):
        if not entry.is_dir or not entry.name.isdigit() or entry.name == str(rec.job_id):
            continue
        try:
            other = jobrecord.read(r.path, entry.name)
        except (OSError, ValueError) as exc:
            log.warning("job record %s ignored: %s", entry.name, exc)
            continue
        if other is None or (other.team, other.run) != (rec.team, rec.run):
            continue
        try:
            out.append(r.sub(f"{entry.name}/ckpt"))
        except OSError:
            continue
    return out


def _stage(
    store: ObjectStore,
    rec: JobRecord,
    root: Path,
    result: StageResult,
    gang: Callable[[], GangPosition | None] | None = None,
) -> None:
    assert rec.team is not None and rec.run is not None
    owner = (rec.uid, rec.gid)
    with contextlib.ExitStack() as stack, open_root(root) as r:
        restore = r.sub(f"{rec.job_id}/restore")
        stack.callback(restore.close)
        cache: list[Dir] = []
        with contextlib.suppress(FileNotFoundError, UnsafePath):
            cache.append(r.sub(f"{L.CACHE_DIR}/{rec.team}/{rec.run}"))
            stack.callback(cache[0].close)
        others = _same_run_ckpt_dirs(r, rec)
        for d in others:
            stack.callback(d.close)
        position = functools.cache(gang) if gang is not None else None  # asked once, and only if needed

        def need_of(manifest: Manifest) -> Callable[[str], bool] | None:
            if position is None or manifest.parts < 2 or not dsfiles.is_deepspeed(s.path for s in manifest.shards):
                return None
            here = position()
            return here.need_of(manifest) if here is not None else None

        found = restore_latest(
            store, rec.team, rec.run, local_roots=others, movable=cache, dest=restore, owner=owner, in_place=False,
            need_of=need_of,
        )  # fmt: skip
        if found is None:
            return
        result.skipped = [str(s) for s in found.skipped]
        result.step, result.source, result.path = found.step, found.source, found.path
        result.files, result.of_files = found.files, len(found.manifest.shards)
        if cache and found.source == "local":  # moved out of the cache (or overtaken by it): drop the rest
            safefs.remove_at(cache[0].fd, L.step_name(found.step))


def stage_latest(
    store: ObjectStore,
    rec: JobRecord,
    root: Path,
    *,
    timeout_s: float = DEFAULT_STAGE_TIMEOUT_S,
    gang: Callable[[], GangPosition | None] | None = None,
) -> StageResult:
    """Stage the newest valid checkpoint of the record's team/run into ``<root>/<job>/restore``, within
    ``timeout_s``. A record without a run stages nothing. ``gang``: where this node sits in its job, asked only when
    the step to stage is a multi-node DeepSpeed one (then only this node's share is staged).

    Runs in a thread joined with the timeout: a slow store delays the job by at most ``timeout_s``, and then the
    job restores by itself (the half-done download is removed by the epilog with the job dir).
    """
    result = StageResult()
    if rec.team is None or rec.run is None:
        return result

    def work() -> None:
        try:
            _stage(store, rec, root, result, gang)
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
def _newest_committed(ckpt: Dir) -> int | None:
    """The newest step of the job's ``ckpt`` dir that carries the committed marker (a regular file)."""
    steps = [(L.parse_step_name(e.name), e.name) for e in safefs.list_dir(ckpt.fd) if e.is_dir]
    for step, name in sorted(((s, n) for s, n in steps if s is not None), reverse=True):
        try:
            with safefs.opened(safefs.open_beneath(ckpt.fd, f"{name}/{L.DONE_FILE}")):
                return step
        except OSError:
            continue
    return None


def _cache(root: Path, job_id: str, rec: JobRecord, max_runs: int, keep_free_bytes: int = 0) -> str | None:
    """Move the job's newest committed step into ``cache/<record team>/<record run>/`` (one step per run), owned
    by root through fds (``_own_tree``), then evict. The team/run are the record's, never a request's."""
    if rec.team is None or rec.run is None:
        return None
    with open_root(root) as r:
        try:
            ckpt = r.sub(f"{job_id}/ckpt")
        except (FileNotFoundError, UnsafePath):
            return None
        try:
            step = _newest_committed(ckpt)
            if step is None:
                return None
            team_dir = r.mkdir(L.CACHE_DIR, 0o700, (0, 0))
            try:
                teams = team_dir.mkdir(rec.team, 0o700, (0, 0))
            finally:
                team_dir.close()
            try:
                safefs.remove_at(teams.fd, rec.run)  # one step per run: the new one replaces it
                run_dir = teams.mkdir(rec.run, 0o700, (0, 0))
            finally:
                teams.close()
            try:
                name = L.step_name(step)
                os.rename(name, name, src_dir_fd=ckpt.fd, dst_dir_fd=run_dir.fd)
                moved = run_dir.sub(name)
                try:
                    _own_tree(moved, 0, 0)  # root's until the next prolog of the run adopts it
                finally:
                    moved.close()
            finally:
                run_dir.close()
        finally:
            ckpt.close()
    removed = _evict(root, max_runs, keep_free_bytes)
    kept = L.cache_dir(root, rec.team, rec.run) not in removed
    return f"{rec.team}/{rec.run}@{step}" if kept else None


def _disk_free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


def _evict(
    root: Path, max_runs: int, keep_free_bytes: int = 0, disk_free: Callable[[Path], int] = _disk_free_bytes
) -> list[Path]:
    """Keep the ``max_runs`` most recently cached runs on this node, then drop the least recent ones (the newest
    last) while the disk has less than ``keep_free_bytes`` free. Returns what was removed, in that order.
    Walked and removed through no-follow fds (the cache is root's, but nothing below a root is taken on trust)."""
    with open_root(root) as r:
        try:
            cache = r.sub(L.CACHE_DIR)
        except (FileNotFoundError, UnsafePath):
            return []
        try:
            runs: list[tuple[float, str, str]] = []
            for team in safefs.list_dir(cache.fd):
                if not team.is_dir:
                    continue
                try:
                    tdir = cache.sub(team.name)
                except OSError:
                    continue
                try:
                    runs += [(e.st.st_mtime, team.name, e.name) for e in safefs.list_dir(tdir.fd) if e.is_dir]
                finally:
                    tdir.close()
            runs.sort(reverse=True)
            removed: list[Path] = []

            def drop(team: str, run: str) -> None:
                with contextlib.suppress(OSError):
                    tdir = cache.sub(team)
                    try:
                        safefs.remove_at(tdir.fd, run)
                    finally:
                        tdir.close()
                removed.append(root / L.CACHE_DIR / team / run)

            for _, team, run in reversed(runs[max_runs:]):  # over the count
                drop(team, run)
            kept = runs[:max_runs]
            while kept and keep_free_bytes > 0 and disk_free(root) < keep_free_bytes:  # over the disk
                _, team, run = kept.pop()
                drop(team, run)
            return removed
        finally:
            cache.close()


def finish_job(
    store: ObjectStore,
    root: Path,
    job_id: str,
    *,
    flush_timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S,
    cache_runs: int = DEFAULT_CACHE_RUNS,
    cache_keep_free_bytes: int = 0,
    lost_nodes: Callable[[Sequence[str]], Collection[str]] | None = None,
) -> tuple[FlushResult | None, str | None]:
    """Epilog: flush the job's uploads (bounded), cache its newest committed copy, remove its staging dir.

    The cache uses the job's record (``nuro.protocol.jobrecord``; the epilog removes the record after this returns).
    ``lost_nodes`` answers which of the named nodes Slurm reports gone (``UploadWorker.flush``): no wait for a step
    whose missing part only a lost node could upload. Returns (flush result, cached "team/run@step" or None). Never
    raises for a store outage.
    """
    name = L.validate_job_id(job_id)
    with open_root(root) as r:
        st = safefs.lstat_at(r.fd, name)
    if st is None or not stat.S_ISDIR(st.st_mode):
        return None, None
    result = UploadWorker(store, root).flush(job_id, flush_timeout_s, lost_nodes=lost_nodes)
    cached = None
    try:
        rec = jobrecord.read(root, name)
        if cache_runs > 0 and rec is not None:
            cached = _cache(root, name, rec, cache_runs, cache_keep_free_bytes)
    except Exception as exc:  # a cache is an optimisation: whatever went wrong, the job dir still goes
        log.warning("job=%s could not cache its newest checkpoint: %s", job_id, exc)
    with open_root(root) as r:
        safefs.remove_at(r.fd, name)
    return result, cached


__all__ = ["StageResult", "finish_job", "open_root", "prepare_job_dir", "stage_latest", "staging_root"]

"""The root-owned per-job record: what root on a node may believe about a job (team, user, run, keep policy).

Why: everything root does for a job on a node (stage its checkpoint, upload and commit its steps, apply retention,
tag its GPUs) must use the job's identity as Slurm knows it, never a field the job's user can write. The user owns
their job comment and their staging dir; they do not own slurmd's prolog environment. So the prolog, first of all,
writes this record from that environment:

- ``job_id``, ``uid``, ``gid``, ``user``, ``node``, ``restart``: slurmd's ``SLURM_JOB_*`` / ``SLURMD_NODENAME``;
- ``account``: ``SLURM_JOB_ACCOUNT``, and ``team`` = that account when it is a valid team name (else None);
- ``run`` and ``keep``: from the nuro record of the job comment (``nuro.protocol.jobcomment``, the one parser; the
bridge
  validated it at submit) **only** when its ``team`` equals the account, else None: a job of team A naming team
  B's run gets nothing of B's, because every S3 prefix root uses is ``checkpoints/<record.team>/<record.run>/``.

Stored at ``<staging_root>/.jobs/<job_id>.json`` (dir root:root 0755, file root:root 0644: the job may read it,
never write it), written atomically without following symlinks, removed by the epilog. ``read`` accepts only a
regular, root-owned, small file that parses exactly, so a planted file is never taken for the record.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from nuro.names import InvalidName, is_decimal, validate_job_id, validate_run, validate_team
from nuro.protocol import jobcomment
from nuro.safeio import safefs

log = logging.getLogger(__name__)

DIR = ".jobs"
MAX_BYTES = 4096
_MAX_KEEP = 1000  # nuro.jobspec.options: checkpoint.keep is 1..1000


class JobRecordError(ValueError):
    """The prolog environment or a stored record is not a valid job record; the message says which field."""


@dataclass(frozen=True)
class JobRecord:
    """One job on one node, as Slurm and the bridge-validated nuro record say. ``team``/``run`` None: root does no
    checkpoint work for the job (a plain job, an account that is no team, a record naming another team)."""

    job_id: int
    uid: int
    gid: int
    user: str
    account: str
    team: str | None
    run: str | None
    restart: int
    node: str
    keep: int | None

    def __post_init__(self) -> None:
        _check(self)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> JobRecord:
        """Strict: an object with exactly the fields, each of its type (``_check``)."""
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise JobRecordError(f"job record is not JSON: {exc}") from None
        keys = {f.name for f in fields(cls)}
        if not isinstance(obj, dict) or set(obj) != keys:
            got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise JobRecordError(f"job record must have exactly the keys {sorted(keys)}, got {got}")
        return cls(**obj)


def _is_int(v: object, lo: int = 0) -> bool:
    return type(v) is int and v >= lo


def _check(rec: JobRecord) -> None:
    problems = []
    for name in ("job_id", "uid", "gid", "restart"):
        if not _is_int(getattr(rec, name)):
            problems.append(f"{name}={getattr(rec, name)!r} is not a non-negative integer")
    for name in ("user", "account", "node"):
        v = getattr(rec, name)
        if not isinstance(v, str) or len(v) > 255 or any(c in v for c in "\0\n/"):
            problems.append(f"{name}={v!r} is not a plain name")
    try:
        if rec.team is not None:
            validate_team(rec.team)
        if rec.run is not None:
            validate_run(rec.run)
            if rec.team is None:
                problems.append("run without a team")
    except InvalidName as exc:
        problems.append(str(exc))
    if rec.keep is not None and not (_is_int(rec.keep, 1) and rec.keep <= _MAX_KEEP):
        problems.append(f"keep={rec.keep!r} is not an integer in 1..{_MAX_KEEP}")
    if problems:
        raise JobRecordError("bad job record: " + "; ".join(problems))


def _env_int(environ: Mapping[str, str], name: str) -> int:
    raw = environ.get(name, "")
    if not raw.isascii() or not raw.isdigit():
        raise JobRecordError(f"{name}={raw!r}: slurmd gives the prolog a number here")
    return int(raw)


def _keep_of(meta: Mapping[str, Any]) -> int | None:
    policy = meta.get("ckpt_policy")
    keep = policy.get("keep") if isinstance(policy, dict) else None
    return keep if _is_int(keep, 1) and keep <= _MAX_KEEP else None


def from_prolog_env(environ: Mapping[str, str]) -> JobRecord:
    """The record of the job slurmd runs this prolog for. Raises JobRecordError when slurmd's own fields are
    missing; a nuro record that does not match the account only leaves ``run``/``keep`` unset (logged)."""
    job_id = _env_int(environ, "SLURM_JOB_ID")
    uid = _env_int(environ, "SLURM_JOB_UID")
    gid_raw = environ.get("SLURM_JOB_GID", "")
    user = environ.get("SLURM_JOB_USER", "")
    if not is_decimal(gid_raw) or not user:
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            raise JobRecordError(f"SLURM_JOB_UID={uid} has no passwd entry and slurmd gave no GID/user") from None
        gid = int(gid_raw) if is_decimal(gid_raw) else pw.pw_gid
        user = user or pw.pw_name
    else:
        gid = int(gid_raw)
    account = environ.get("SLURM_JOB_ACCOUNT", "")
    restart_raw = environ.get("SLURM_JOB_RESTART_COUNT") or environ.get("SLURM_RESTART_COUNT") or "0"
    restart = int(restart_raw) if is_decimal(restart_raw) else 0
    node = environ.get("SLURMD_NODENAME", "")
    team: str | None
    try:
        team = validate_team(account)
    except InvalidName:
        team = None
        if account:
            log.warning("job=%d account %r is not a team name: no checkpoint work as root", job_id, account)
    run = keep = None
    meta = jobcomment.parse(environ.get("SLURM_JOB_COMMENT")).record
    if meta and team is not None:
        if meta.get("team") != team:
            why = "job=%d nuro record names team %r, the job's account is %r: record ignored"
            log.warning(why, job_id, meta.get("team"), team)
        else:
            try:
                run = validate_run(meta.get("name"))
                keep = _keep_of(meta)
            except InvalidName as exc:
                log.warning("job=%d nuro record ignored: %s", job_id, exc)
    return JobRecord(job_id, uid, gid, user, account, team, run, restart, node, keep)


def _jobs_dir(staging_root: Path, *, create: bool) -> int:
    """An fd of ``<root>/.jobs``, root:root 0755 (made so when we are root); never through a symlink."""
    root_fd = safefs.open_dir(staging_root)
    try:
        if create:
            fd = safefs.mkdir_at(root_fd, DIR, 0o755)
            st = os.fstat(fd)
            if os.geteuid() == 0 and (st.st_uid != 0 or st.st_gid != 0 or stat.S_IMODE(st.st_mode) != 0o755):
                os.fchown(fd, 0, 0)
                os.fchmod(fd, 0o755)
            return fd
        return safefs.open_dir(DIR, dir_fd=root_fd)
    finally:
        os.close(root_fd)


def _name(job_id: int | str) -> str:
    return f"{validate_job_id(str(job_id))}.json"


def write(staging_root: Path, rec: JobRecord) -> Path:
    """Store ``rec`` (atomically, no symlink followed); returns its path."""
    fd = _jobs_dir(staging_root, create=True)
    try:
        safefs.write_atomic_at(fd, _name(rec.job_id), rec.to_json(), 0o644)
    finally:
        os.close(fd)
    return staging_root / DIR / _name(rec.job_id)


def read(staging_root: Path, job_id: int | str) -> JobRecord | None:
    """The stored record of ``job_id``, or None when there is none. A file that is not regular, not root's,
    too big or malformed raises (JobRecordError / safefs.UnsafePath): it is never a record."""
    try:
        dfd = _jobs_dir(staging_root, create=False)
    except FileNotFoundError:
        return None
    try:
        fd = safefs.open_regular(_name(job_id), dir_fd=dfd)
    except FileNotFoundError:
        return None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if st.st_uid != 0:
        os.close(fd)
        raise safefs.UnsafePath(str(staging_root / DIR / _name(job_id)), f"owned by uid {st.st_uid}, not root")
    rec = JobRecord.from_json(safefs.read_fd(fd, MAX_BYTES, _name(job_id)))
    if str(rec.job_id) != str(job_id):
        raise JobRecordError(f"{_name(job_id)} holds the record of job {rec.job_id}")
    return rec


def remove(staging_root: Path, job_id: int | str) -> bool:
    """Delete the record (epilog). True when there was one."""
    try:
        dfd = _jobs_dir(staging_root, create=False)
    except FileNotFoundError:
        return False
    try:
        os.unlink(_name(job_id), dir_fd=dfd)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(dfd)


__all__ = ["DIR", "JobRecord", "JobRecordError", "from_prolog_env", "read", "remove", "write"]

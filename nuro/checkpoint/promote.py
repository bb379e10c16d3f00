"""In-memory snapshots on the node side: the prolog makes each job's snapshot dir, the epilog promotes the newest
complete snapshot to a committed checkpoint when it is newer than the newest one in S3, then drops the dir.

Why (issue 31): a persistent checkpoint every 10–30 minutes loses, on average, half an interval of every GPU of the
job at each node failure. The training SDK (``nuro.wrappers.sdk.snapshots``) therefore also takes a snapshot every
few seconds into node memory (``NURO_SNAPSHOT_ROOT``, default ``/dev/shm/nuro-snapshots``: tmpfs, RAM) and sends
each node's share to the next node of the job, so every share is held by two nodes and the loss of any one node
leaves a full copy on the survivors. When the job ends (a requeue after a node loss, above all), the epilog of each
surviving node uploads the shares it holds of the newest complete snapshot, through the same upload worker and the
same commit rule as any checkpoint (every part present, sha256 of every byte, manifest last with If-None-Match), so
the promoted step is verified like any checkpoint and the next attempt restores it like any other; its manifest
says ``tier: memory`` and ``nuro-train events`` shows which copy a resume came from.

Layout: exactly the staging layout (``nuro.checkpoint.layout``) under another root — ``<snapshot root>/<job>/ckpt/
step-N/`` with one upload request per share this node holds (its own part and the previous node's), written only
after every node of the job holds both (so a request there means "this step is complete everywhere"), and the job's
root-owned record under ``<snapshot root>/.jobs/``. A step dir without requests is a snapshot that was still being
taken: the flush gives it up at once (``nuro.checkpoint.lostwriters``), nothing waits for it.

Memory: the SDK keeps at most two snapshots per node (the newest complete one and the one being taken), each its own
share plus its neighbour's, and stops taking them above ``NURO_SNAPSHOT_MAX_BYTES``; the epilog removes the dir
whatever happens.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nuro.checkpoint import layout as L
from nuro.checkpoint.nodestage import open_root, prepare_job_dir
from nuro.checkpoint.restore import latest_committed_step
from nuro.checkpoint.staging import JobDir
from nuro.checkpoint.upload import UploadWorker
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.protocol import jobrecord
from nuro.protocol.jobrecord import JobRecord
from nuro.protocol.nodeenv import setting
from nuro.safeio import safefs

log = logging.getLogger(__name__)

ENV_ROOT = "NURO_SNAPSHOT_ROOT"
ENV_PROMOTE_TIMEOUT = "NURO_SNAPSHOT_PROMOTE_TIMEOUT_S"
DEFAULT_ROOT = "/dev/shm/nuro-snapshots"
DEFAULT_PROMOTE_TIMEOUT_S = 20.0


def snapshot_root(env: Mapping[str, str] | None = None) -> Path:
    """``NURO_SNAPSHOT_ROOT`` (default ``/dev/shm/nuro-snapshots``), ``{node}`` replaced like the staging root's."""
    e = os.environ if env is None else env
    return L.node_staging_root(e.get(ENV_ROOT) or DEFAULT_ROOT, e.get("SLURMD_NODENAME"))


def promote_timeout_s(env: Mapping[str, str]) -> float:
    """``NURO_SNAPSHOT_PROMOTE_TIMEOUT_S`` (default 20 s); a malformed or zero value keeps the default, loudly."""
    return float(setting(env, ENV_PROMOTE_TIMEOUT, float, DEFAULT_PROMOTE_TIMEOUT_S, positive=True))


def prepare(root: Path, rec: JobRecord) -> Path:
    """Prolog: the job's snapshot dir (its user's, 0700, with ``ckpt/``) and root's record of the job beside it."""
    with open_root(root):
        pass
    jobrecord.write(root, rec)
    return prepare_job_dir(root, str(rec.job_id), rec.uid, rec.gid)


@dataclass
class Promoted:
    """What ``promote`` did: the newest committed step before it, the snapshot steps it uploaded and committed,
    those given up, and why nothing was promoted (``why``) when nothing was."""

    newest_before: int | None = None
    committed: list[int] = field(default_factory=list)
    given_up: list[int] = field(default_factory=list)
    why: str = ""


def promote(
    store: ObjectStore, root: Path, job_id: str, timeout_s: float, *, run: tuple[str, str] | None = None
) -> Promoted:
    """Commit the newest complete snapshot of ``job_id`` held on this node when it is newer than the run's newest
    committed checkpoint (older snapshot steps are removed first: nothing is uploaded that a resume would not use).
    Bounded by ``timeout_s``; never raises for a store outage (the snapshot is then simply not used).

    Root (the epilog): whose run it is comes from the job's root-owned record in ``root``. The job itself (a step
    restarted in its allocation: ``Checkpointer.restore`` after a hot spare's swap) passes ``run=(team, run)`` and
    uploads with its own team's credential, as an inline upload does (``trust="request"``)."""
    out = Promoted()
    name = L.validate_job_id(job_id)
    inline = run is not None
    if run is None:
        rec = jobrecord.read(root, name)
        if rec is None or rec.team is None or rec.run is None:
            out.why = "no nuro job record in the snapshot root"
            return out
        run = (rec.team, rec.run)
    try:
        out.newest_before = latest_committed_step(store, *run)
    except ObjectStoreError as exc:
        out.why = f"the store did not answer ({exc})"
        return out
    held = _drop_stale(root, name, out.newest_before)
    if not held:
        out.why = "no snapshot newer than the newest committed checkpoint"
        return out
    worker = UploadWorker(store, root, job_dirs=[root / name], trust="request") if inline else UploadWorker(store, root)
    result = worker.flush(name, timeout_s)
    out.committed, out.given_up = sorted(result.committed), sorted(result.incomplete)
    if not out.committed:
        out.why = "; ".join(result.errors) or "its shares did not commit in time"
    return out


def holds_complete(job_dir: Path) -> bool:
    """Whether this node holds a complete snapshot of the job (a step dir with an upload request): cheap, local."""
    try:
        steps = [p for p in L.job_ckpt_dir(job_dir).iterdir() if L.parse_step_name(p.name) is not None]
    except OSError:
        return False
    return any(n.startswith(".upload-") and n.endswith(".json") for p in steps for n in _names(p))


def _names(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _drop_stale(root: Path, job_id: str, newest: int | None) -> list[int]:
    """Keep only the newest complete snapshot step, and only when it is newer than ``newest`` (the run's newest
    committed step); every other step dir goes: older ones, and those still being taken when the job ended (no
    request: they are never promoted, and no peer waits for them). Returns the steps kept (one or none)."""
    try:
        with JobDir.open(root, job_id) as jd:
            steps = jd.step_names()
            complete = []
            for step, dir_name in steps:
                sd = jd.open_step(step, dir_name)
                if sd.has_request:
                    complete.append(step)
                jd.close_step(sd)
            keep = max(complete, default=None)
            if keep is not None and newest is not None and keep <= newest:
                keep = None
            for step, dir_name in steps:
                if step != keep:
                    jd.remove_step(dir_name)
            return [] if keep is None else [keep]
    except FileNotFoundError:
        return []


def drop(root: Path, job_id: str) -> None:
    """Epilog, last: the job's snapshot dir and record go, whatever happened before (memory is given back)."""
    name = L.validate_job_id(job_id)
    if not root.is_dir():  # snapshots were never taken on this node
        return
    with open_root(root) as r:
        safefs.remove_at(r.fd, name)
    jobrecord.remove(root, name)


__all__ = [
    "DEFAULT_ROOT",
    "Promoted",
    "drop",
    "holds_complete",
    "prepare",
    "promote",
    "promote_timeout_s",
    "snapshot_root",
]

"""A run's checkpoints in S3 and its lineage (the ``resume_from`` chain), as ``nuro-train lineage/artifacts/events``
show them.

No extra database: the S3 listing and the checkpoint manifests are the record of what was committed, Slurm's comment
and accounting the record of which run resumed which (architecture principle 1).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.restore import load_manifest, step_numbers
from nuro.objectstore import NotFound, ObjectStore, ObjectStoreError
from nuro.protocol import jobcomment
from nuro.runs.pending import ENV_WAITS, read_progress
from nuro.slurm import Backend, JobInfo, SlurmError


def find_job(backend: Backend, job_id: int) -> JobInfo:
    """The job from slurmctld, else accounting. Raises LookupError (unknown to both) and SlurmError."""
    job = backend.find_job(job_id)
    if job is None:
        raise LookupError(
            f"no job {job_id} (it may have ended more than MinJobAge ago and accounting does not know it)"
        )
    return job


def checkpoint_record(manifest) -> dict:  # noqa: ANN001 - a nuro.checkpoint.manifest.Manifest
    """One committed checkpoint as the CLI shows it: from its S3 manifest only (the system of record)."""
    return {
        "step": manifest.step,
        "job_id": int(manifest.job_id) if str(manifest.job_id).isdigit() else manifest.job_id,
        "restart": manifest.restart,
        "parent": manifest.parent,
        "committed_at": manifest.created_at,
        "bytes": manifest.total_bytes,
        "world_size": manifest.world_size,
        "tier": manifest.tier,  # "memory": an in-memory snapshot a surviving node promoted after a node loss
    }


def damaged_files(manifest, sizes: Mapping[str, int]) -> list[str]:  # noqa: ANN001 - a Manifest
    """The files of a committed step whose object is missing from the listing ``sizes`` (key → bytes) or has
    another size than the manifest says: torn after its commit (the cheap check: no download, no sha256)."""
    out = []
    for f in manifest.shards:
        size = sizes.get(L.shard_key(manifest.team, manifest.run, manifest.step, f.path))
        if size != f.size:
            out.append(f"{f.path} ({'missing' if size is None else f'{size} bytes, manifest says {f.size}'})")
    return out


def run_checkpoints(
    store: ObjectStore, team: str, run: str, sizes: Mapping[str, int] | None = None
) -> tuple[list[dict], list[dict]]:
    """A run's checkpoints in S3, oldest first: (committed, not committed).

    Committed = a manifest that parses and names this team/run/step (``checkpoint_record``); with ``sizes`` (the
    listing of the run's prefix, key → bytes) each also gets ``damaged``: its files that are missing or resized
    (``damaged_files``). Not committed = a step prefix without one: ``{"step", "status": "incomplete" | "torn",
    "bytes"}`` (given up by its upload, or still uploading / torn). No extra database: the listing and the manifests
    are the record (architecture principle 1). Raises ObjectStoreError when the store cannot be listed; ValueError
    for a team/run name S3 keys cannot hold.
    """
    committed: list[dict] = []
    other: list[dict] = []
    for step in sorted(step_numbers(store, team, run)):
        try:
            manifest = load_manifest(store, team, run, step)
            record = checkpoint_record(manifest)
            if sizes is not None:
                record["damaged"] = damaged_files(manifest, sizes)
            committed.append(record)
            continue
        except NotFound:
            status = "incomplete" if store.exists(L.incomplete_key(team, run, step)) else "torn"
        except ManifestError as exc:
            status = f"bad manifest: {exc}"
        size = sum(o.size for o in store.list(L.step_prefix(team, run, step)))
        if size:  # an emptied prefix of a deleted step (some stores keep listing it) is not an artifact
            other.append({"step": step, "status": status, "bytes": size})
    return committed, other


def _attach_checkpoints(chain: list[dict], store: ObjectStore | None) -> list[str]:
    """Add each run's committed checkpoints (those its job wrote) to the lineage; returns notes for what failed."""
    notes: list[str] = []
    cache: dict[tuple[str, str], list[dict]] = {}
    for run in chain:
        if "missing" in run:
            continue
        team, name = run.get("team_record"), run.get("run")
        if not team or not name:
            run["checkpoints"] = None
            continue
        try:
            store = store or ObjectStore.from_env()
            if (team, name) not in cache:
                cache[(team, name)] = run_checkpoints(store, team, name)[0]
        except (ObjectStoreError, ValueError) as exc:
            notes.append(f"checkpoints of {team}/{name} not shown: {exc}")
            run["checkpoints"] = None
            continue
        run["checkpoints"] = [c for c in cache[(team, name)] if str(c["job_id"]) == str(run["job_id"])]
    return notes


def lineage_of(
    backend: Backend,
    job_id: int,
    max_depth: int = 20,
    store=None,  # noqa: ANN001
    heard: Mapping[int, Mapping[str, int]] | None = None,
) -> list[dict]:
    """The run and its ancestors (``resume_from``), newest first: what each was pinned to and how it went.

    ``last_checkpoint`` is a running job's newest commit as the controller heard it from the node agents (``heard``:
    ``nuro.runs.pending.read_progress``; by default read from ``$NURO_CONTROLLER_WAITS``), None for the others.

    With ``store`` (an ObjectStore, or True for ``ObjectStore.from_env()``), each run also gets ``checkpoints``:
    the committed checkpoints its job wrote, from the S3 manifests (step, parent, job, restart, committed at); a
    store that cannot be read adds ``notes`` to the first entry instead. An ancestor Slurm no longer knows ends the
    chain with a ``missing`` entry; the run itself must be known: raises LookupError (``find_job``) and SlurmError.
    """
    if heard is None:
        heard = read_progress(os.environ.get(ENV_WAITS), time.time())
    chain: list[dict] = []
    seen: set[int] = set()
    current: int | None = job_id
    while current is not None and current not in seen and len(chain) < max_depth:
        seen.add(current)
        job = find_job(backend, current) if not chain else _find_or_none(backend, current)
        if job is None:
            chain.append({"job_id": current, "missing": "not known to slurmctld or accounting"})
            break
        meta = jobcomment.parse(job.comment).record
        ckpt = heard.get(job.job_id)
        chain.append(
            {
                "job_id": job.job_id,
                "name": job.name,
                "team": job.account,
                "team_record": meta.get("team"),
                "run": meta.get("name"),
                "state": job.state,
                "restarts": job.restart_count,
                "dataset": meta.get("dataset"),
                "code": meta.get("code"),
                "resume_from": meta.get("resume_from"),
                "last_checkpoint": {"step": ckpt["step"], "at": float(ckpt["at"])} if ckpt else None,
                "submitted": job.submit_time.isoformat() if job.submit_time else None,
                "ended": job.end_time.isoformat() if job.end_time and job.is_finished else None,
            }
        )
        parent = meta.get("resume_from")
        current = int(parent) if isinstance(parent, int | str) and str(parent).isdigit() else None
    if store is not None and chain:
        notes = _attach_checkpoints(chain, None if store is True else store)
        if notes:
            chain[0]["notes"] = notes
    return chain


def _find_or_none(backend: Backend, job_id: int) -> JobInfo | None:
    try:
        return backend.find_job(job_id)
    except SlurmError:
        return None


def checkpoint_lines(ckpts: list[dict] | None) -> list[str]:
    """The lineage view of one run's committed checkpoints, oldest first. Pure."""
    if ckpts is None:
        return ["checkpoints in S3: not known (no run record, or the store could not be read)"]
    if not ckpts:
        return ["checkpoints in S3: none committed by this job"]
    lines = [f"checkpoints in S3 ({len(ckpts)} committed):"]
    for c in ckpts:
        parent = "—" if c["parent"] is None else f"step {c['parent']}"
        lines.append(f"  step {c['step']:>6}  parent {parent:<11} job {c['job_id']}.{c['restart']}  "
                     f"{c['committed_at']}")  # fmt: skip
    return lines


__all__ = ["checkpoint_lines", "checkpoint_record", "find_job", "lineage_of", "run_checkpoints"]

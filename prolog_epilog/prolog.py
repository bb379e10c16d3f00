"""Slurm Prolog (``PrologFlags=Alloc``: once per allocated node, as root, before the job starts).

For a job that carries nuro metadata (``{"nuro": {...}}`` in its comment) it checks, before any training starts:

1. the metadata is well-formed (a dataset is pinned by digest, never by tag; names match nuro's patterns);
2. the pinned dataset snapshot verifies: its manifest hashes to the digest and every shard to its own digest.
   A verified digest is remembered in the node-local cache (``$NURO_CACHE_DIR``), so each node verifies a
   snapshot once, not once per job.

3. (every job) the node-local checkpoint staging dir ``$NURO_STAGING_ROOT/<job id>`` exists, owned by the job's
   user, mode 700; for a nuro job the newest valid checkpoint of its team/run is staged into ``<dir>/restore/``
   (a verified local copy first, else S3), bounded by ``NURO_PROLOG_STAGE_TIMEOUT_S`` (default 120 s). Staging
   problems are logged and never hold the job: it then restores from S3 by itself (``nuro.checkpoint.nodestage``).
4. (every job with GPUs here) the job's claim on them (``SLURM_JOB_GPUS``) for the node agent, which tags its
   ``gpu`` points with the job, team and run (``nuro.gpujobs``); the epilog removes it.

First of all the node's own health (``nuro.prolog_epilog.health``): an unhealthy node is drained with the precise
reason and the prolog exits 1, so the job does not start there and Slurm requeues it elsewhere.

If a check of the job fails it is **requeued held** with the reason in its comment (``refused: {why, node, at}``), which
``nuro-train status`` shows, and the prolog still exits 0: a non-zero prolog would drain the node, and a user's
tampered dataset is not the node's fault. Plain jobs without nuro metadata pass untouched. Everything read from the
comment is user-controlled: it is parsed as JSON and matched against strict patterns, and never reaches a shell.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

from nuro import jobcomment
from nuro.nodeenv import load_node_env
from nuro.prolog_epilog.health import node_is_healthy

log = logging.getLogger("nuro.prolog")


class Refusal(Exception):
    """The job must not start; the message is for its owner."""


def _dataset_ref(meta: dict) -> tuple[str, str] | None:
    from nuro.datasets.manifest import validate_digest, validate_name

    ds = meta.get("dataset")
    if ds is None:
        return None
    if not isinstance(ds, dict):
        raise Refusal("nuro metadata: 'dataset' must be {name, digest}; resubmit with nuro-train or nuro-sbatch")
    try:
        return validate_name(str(ds.get("name", ""))), validate_digest(str(ds.get("digest", "")))
    except ValueError as exc:
        raise Refusal(f"nuro metadata: bad dataset pin ({exc}); resubmit with nuro-train or nuro-sbatch") from None


def _verify_dataset(name: str, digest: str) -> None:
    from nuro.datasets.verify import verify
    from nuro.objectstore import ObjectStore

    cache = Path(os.environ.get("NURO_CACHE_DIR", "/var/cache/nuro")) / "datasets"
    marker = cache / f"{digest.replace(':', '-')}.verified"
    if marker.exists():
        return
    try:
        report = verify(ObjectStore.from_env(), name, digest)
    except Exception as exc:  # missing or forged manifest, store down: the job cannot use this data
        raise Refusal(f"dataset {name}@{digest} could not be verified: {exc}") from None
    if not report.ok:
        files = ", ".join(report.bad_files[:5]) or "-"
        raise Refusal(
            f"dataset {name}@{digest} failed verification ({len(report.problems)} problem(s); files: {files}). "
            "The stored snapshot was altered: re-snapshot the data and resubmit with the new digest."
        )
    cache.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{time.time():.0f}\n")


def check(comment: str | None) -> None:
    """Raise Refusal if a nuro job must not start. Pure except for the dataset verification."""
    meta = jobcomment.parse(comment).raw.get("nuro")
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise Refusal("nuro metadata must be a JSON object; resubmit with nuro-train or nuro-sbatch")
    ref = _dataset_ref(meta)
    if ref is not None:
        _verify_dataset(*ref)


def refuse(job_id: int, why: str) -> None:
    """Record why in the job's comment and requeue it held (the owner sees it in nuro-train status)."""
    from nuro.slurm import CliBackend, SlurmError

    backend = CliBackend(timeout_s=20)
    node = os.environ.get("SLURMD_NODENAME", "?")
    try:
        comment = backend.job_comment(job_id)
        if jobcomment.parse(comment).raw.get("refused") is None:  # the first node to refuse records it
            backend.update_comment(
                job_id, jobcomment.merge(comment, refused={"why": why[:1000], "node": node, "at": round(time.time())})
            )
        backend.requeue(job_id, hold=True)
    except SlurmError as exc:  # another node's prolog may have requeued it already
        log.warning("job=%d node=%s refuse: %s", job_id, node, exc)


def _job_owner() -> tuple[int, int]:
    """The job's uid/gid from slurmd's prolog environment (gid from the passwd entry when SLURM_JOB_GID is unset)."""
    import pwd

    uid = int(os.environ["SLURM_JOB_UID"])
    gid_raw = os.environ.get("SLURM_JOB_GID", "")
    return uid, int(gid_raw) if gid_raw.isdigit() else pwd.getpwuid(uid).pw_gid


def _run_of(comment: str | None) -> tuple[str, str] | None:
    """(team, run) from the validated ``nuro`` record, or None for a plain job or a record that does not validate."""
    from nuro.checkpoint.errors import InvalidCheckpointInput
    from nuro.checkpoint.layout import validate_run, validate_team

    meta = jobcomment.parse(comment).raw.get("nuro")
    if not isinstance(meta, dict):
        return None
    try:
        return validate_team(meta.get("team")), validate_run(meta.get("name"))
    except InvalidCheckpointInput as exc:
        log.warning("no checkpoint staging: %s", exc)
        return None


def stage(job: str) -> None:
    """Create the job's staging dir and stage its run's newest valid checkpoint (see the module docstring)."""
    from nuro.checkpoint.nodestage import prepare_job_dir, stage_latest, staging_root

    uid, gid = _job_owner()
    job_dir = prepare_job_dir(staging_root(), job, uid, gid)
    run = _run_of(os.environ.get("SLURM_JOB_COMMENT"))
    if run is None:
        return
    from nuro.objectstore import ObjectStore

    timeout_s = float(os.environ.get("NURO_PROLOG_STAGE_TIMEOUT_S") or 120)
    t0 = time.monotonic()
    res = stage_latest(ObjectStore.from_env(), *run, job_dir, uid, gid, timeout_s=timeout_s)
    took = time.monotonic() - t0
    for why in res.skipped or []:
        log.warning("job=%s team=%s run=%s checkpoint skipped: %s", job, *run, why)
    if res.error:
        log.warning("job=%s team=%s run=%s checkpoint not staged (%.1f s): %s", job, *run, took, res.error)
    elif res.step is None:
        log.info("job=%s team=%s run=%s no checkpoint to stage (%.1f s)", job, *run, took)
    else:
        log.info(
            "job=%s team=%s run=%s staged step=%d source=%s path=%s (%.1f s)",
            job, *run, res.step, res.source, res.path, took,
        )  # fmt: skip


def record_gpus(job: str) -> None:
    """Tell the node agent which GPUs this job holds here, so its ``gpu`` points carry the job (``nuro.gpujobs``)."""
    from nuro.checkpoint.nodestage import staging_root
    from nuro.gpujobs import parse_gpu_ids, record

    node = os.environ.get("SLURMD_NODENAME", "")
    gpus = parse_gpu_ids(os.environ.get("SLURM_JOB_GPUS"))
    if not node or not gpus:
        return
    team, run = _run_of(os.environ.get("SLURM_JOB_COMMENT")) or (os.environ.get("SLURM_JOB_ACCOUNT", ""), "")
    record(staging_root(), node, job, gpus, {"team": team, "run": run})


def task_env() -> str:
    """``--task`` (Slurm TaskProlog, as the job's user): the ``export`` line that tells the job's processes their
    staging dir; slurmstepd adds it to each task's environment."""
    from nuro.checkpoint.nodestage import staging_root

    job = os.environ.get("SLURM_JOB_ID", "")
    return f"export NURO_STAGING_DIR={staging_root() / job}" if job.isdigit() else ""


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="nuro-prolog: %(message)s", stream=sys.stderr)
    args = sys.argv[1:] if argv is None else argv
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return 0
    if args[:1] == ["--task"]:
        load_node_env()
        print(task_env(), flush=True)
        return 0
    refused = False
    try:
        load_node_env()
    except (OSError, ValueError) as exc:
        log.error("job=%s cannot read node settings $NURO_ENV_FILE: %s", job, exc)
    if not node_is_healthy(job, "prolog"):
        return 1  # the node is drained with the reason; slurmd does not start the job here, Slurm requeues it
    try:
        check(os.environ.get("SLURM_JOB_COMMENT"))
    except Refusal as exc:
        refused = True
        log.error("job=%s refused: %s", job, exc)
        refuse(int(job), str(exc))
    except Exception as exc:  # never drain a node for a bug of ours; say it loudly instead
        log.exception("job=%s prolog error (job allowed to start): %s", job, exc)
    if not refused:
        try:
            stage(job)
        except Exception as exc:  # staging is an optimisation: the job restores from S3 without it
            log.exception("job=%s checkpoint staging failed (job allowed to start): %s", job, exc)
        try:
            record_gpus(job)
        except Exception as exc:  # telemetry only: the job's GPUs stay untagged
            log.exception("job=%s GPU claim not recorded (job allowed to start): %s", job, exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

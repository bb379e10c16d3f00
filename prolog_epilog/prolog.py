"""Slurm Prolog (``PrologFlags=Alloc``: once per allocated node, as root, before the job starts).

For a job that carries nuro metadata (``{"nuro": {...}}`` in its comment) it checks, before any training starts:

1. the metadata is well-formed (a dataset is pinned by digest, never by tag; names match nuro's patterns);
2. the pinned dataset snapshot verifies: its manifest hashes to the digest and every shard to its own digest.
   A verified digest is remembered in the node-local cache (``$NURO_CACHE_DIR``), so each node verifies a
   snapshot once, not once per job.

0. (every job, first) the job's root-owned record (``nuro.protocol.jobrecord``) from slurmd's own environment: team =
the
   job's Slurm account, run/keep only from a nuro record of that team. Everything root does for the job here and
   later (staging, GPU claims, the upload worker, the epilog) takes team and run from it, never from the comment.
3. (every job) the node-local checkpoint staging dir ``$NURO_STAGING_ROOT/<job id>`` exists, owned by the job's
   user, mode 700; for a job whose record has a run, the newest valid checkpoint of the record's team/run is staged
   into ``<dir>/restore/`` (a verified local copy first, else S3), through no-follow dir fds only, bounded by
   ``NURO_PROLOG_STAGE_TIMEOUT_S`` (default 120 s). Staging problems are logged and never hold the job: it then
   restores from S3 by itself (``nuro.checkpoint.nodestage``).
3b. (a first attempt pinning a dataset, with a node cache) the first shards its loader will read are fetched into
   the team's cache while the job starts, by a process of the job's own user (``nuro.datasets.prefetch``). It ends
   with the job (``nuro.prolog_epilog.prefetchguard``): it joins the job's step cgroup once slurmstepd has made it,
   and its pid is recorded root-only for the epilog, which kills it should it outlive the job.
4. (every job with GPUs here) the job's claim on them (``SLURM_JOB_GPUS``) for the node agent, which tags its
   ``gpu`` points with the job and the record's team and run (``nuro.protocol.gpujobs``); the epilog removes it.

Time: the whole prolog is bounded by ``NURO_PROLOG_DEADLINE_S`` (default 240 s; keep it below slurm.conf's
``PrologEpilogTimeout``, so our deadline, not Slurm's, decides): the dataset verification gets what is left of it
(a pin that cannot be verified in time holds the job, like a pin that fails), staging gets the smaller of its own
timeout and what is left, and every S3 call has its own connect/read timeouts and bounded retries
(``PROLOG_STORE``).

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
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nuro.checkpoint import promote
from nuro.checkpoint.nodestage import GangPosition, open_root, prepare_job_dir, stage_latest, staging_root
from nuro.objectstore import ObjectStore
from nuro.prolog_epilog import hooklog
from nuro.prolog_epilog.health import node_is_healthy
from nuro.protocol import adminnote, jobcomment, jobrecord
from nuro.protocol.contract import COMMENT_RUN, NOTE_REFUSED
from nuro.protocol.envnames import (
    NURO_DATA_CACHE_DIR,
    NURO_DATA_CACHE_GB,
    NURO_S3_BUCKET,
    NURO_S3_CREDENTIALS,
    NURO_S3_ENDPOINT,
    NURO_S3_REGION,
)
from nuro.protocol.gpujobs import claim, parse_gpu_ids
from nuro.protocol.heartbeat import is_node_name
from nuro.protocol.jobrecord import JobRecord
from nuro.protocol.nodeenv import load_node_env, setting
from nuro.slurm import hostlist

log = logging.getLogger("nuro.prolog")

DEFAULT_DEADLINE_S = 240.0
#: Each Slurm call of ``refuse`` (at most four: comment, update, requeuehold, hold).
REFUSE_CALL_TIMEOUT_S = 15.0
#: After a requeuehold, how long the prolog waits before it exits 0. slurmctld tells slurmd to end the job through
#: its own agent, after our call returns; a prolog exit that comes first lets slurmd launch the batch script for a
#: moment (seen once on 24.11 with three clusters on 2 cores: the refused job's script printed before the kill).
REFUSE_SETTLE_S = 2.0
#: Kept out of the checks' share of the deadline: a refusal's Slurm calls and the GPU claim after the checks.
RESERVE_S = 4 * REFUSE_CALL_TIMEOUT_S + REFUSE_SETTLE_S
#: Every S3 call of the prolog: a short connect, a read timeout per socket read, few retries (first try included).
PROLOG_STORE = {"connect_timeout_s": 5.0, "read_timeout_s": 20.0, "max_attempts": 3}


class Deadline:
    """The prolog's time budget on the monotonic clock (``NURO_PROLOG_DEADLINE_S``)."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self.end = time.monotonic() + total_s

    @classmethod
    def from_env(cls) -> Deadline:
        value = _env_number("NURO_PROLOG_DEADLINE_S", DEFAULT_DEADLINE_S)
        return cls(value if value > 0 else DEFAULT_DEADLINE_S)

    def left(self, reserve_s: float = RESERVE_S) -> float:
        return max(0.0, self.end - time.monotonic() - reserve_s)


def bounded(fn: Callable[[], Any], limit_s: float, what: str) -> Any:
    """``fn()`` in a daemon thread, waited for at most ``limit_s``; TimeoutError naming ``what`` past it (the
    thread is left behind and dies with the prolog). Exceptions of ``fn`` are raised here."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name=f"nuro-prolog-{what}", daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        raise TimeoutError(f"{what} did not finish within {limit_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _store() -> Any:
    return ObjectStore.from_env(**PROLOG_STORE)


class Refusal(Exception):
    """The job must not start; the message is for its owner."""


def _dataset_ref(meta: dict) -> tuple[str, str] | None:
    # lazy: only a job that pins a dataset needs it, and the TaskProlog (--task, once per task) must start fast
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


def _verify_dataset(name: str, digest: str, limit_s: float = DEFAULT_DEADLINE_S) -> None:
    # lazy: only a job that pins a dataset needs it, and the TaskProlog (--task, once per task) must start fast
    from nuro.datasets.verify import verify

    cache = Path(os.environ.get("NURO_CACHE_DIR", "/var/cache/nuro")) / "datasets"
    marker = cache / f"{digest.replace(':', '-')}.verified"
    if marker.exists():
        return
    try:
        report = bounded(lambda: verify(_store(), name, digest), limit_s, "dataset verification")
    except TimeoutError as exc:  # a slow or hung store: fail closed, the owner can release the job later
        raise Refusal(
            f"dataset {name}@{digest} could not be verified: {exc} (the store is slow or unreachable); "
            "release the job (scontrol release) to try again"
        ) from None
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


def check(comment: str | None, limit_s: float = DEFAULT_DEADLINE_S) -> None:
    """Raise Refusal if a nuro job must not start. Pure except for the dataset verification (within ``limit_s``)."""
    meta = jobcomment.parse(comment).raw.get(COMMENT_RUN)
    if meta is None:
        return
    if not isinstance(meta, dict):
        raise Refusal("nuro metadata must be a JSON object; resubmit with nuro-train or nuro-sbatch")
    ref = _dataset_ref(meta)
    if ref is not None:
        _verify_dataset(*ref, limit_s=limit_s)


def refuse(job_id: int, why: str) -> None:
    """Record why in the job's admin comment and requeue it held (the owner sees it in nuro-train status).

    The note goes to ``admin_comment`` (``nuro.protocol.adminnote``: only root and SlurmUser may write it, so no job
    can fill it and make the refusal go unrecorded); it replaces the field whole, one ``scontrol update``, no read.
    A refusal Slurm does not take is logged and the requeue goes on: the job never starts unverified either way.

    When the requeue is refused because the job is pending already (another node's prolog requeued it, or
    slurmctld did: a prolog that outlasts ``BatchStartTimeout`` makes it count the batch job as missing and
    requeue it), it is held where it is, so it never starts unverified and never loops through prologs."""
    # lazy: only a refusal talks to Slurm here (its adapter costs ~0.1 s), and the TaskProlog (--task, once per
    # task) must start fast
    from nuro.slurm import CliBackend, SlurmError

    backend = CliBackend(timeout_s=REFUSE_CALL_TIMEOUT_S)
    node = os.environ.get("SLURMD_NODENAME", "?")
    try:
        note = adminnote.render(NOTE_REFUSED, why, at=round(time.time()), node=node if is_node_name(node) else None)
        backend.update_admin_comment(job_id, note)
    except (SlurmError, ValueError) as exc:
        log.warning("job=%d node=%s refuse: reason not recorded: %s", job_id, node, exc)
    try:
        backend.requeue(job_id, hold=True)
        time.sleep(REFUSE_SETTLE_S)  # let slurmctld's terminate reach slurmd before our exit lets the launch go on
    except SlurmError as exc:
        log.info("job=%d node=%s requeuehold refused (%s): holding it where it is", job_id, node, exc)
        try:
            backend.hold(job_id)
        except SlurmError as exc2:  # held or ended already
            log.warning("job=%d node=%s refuse: %s", job_id, node, exc2)


def write_record() -> JobRecord:
    """The job's root-owned record (``nuro.protocol.jobrecord``) from slurmd's environment, stored for every root
    reader."""
    rec = jobrecord.from_prolog_env(os.environ)
    root = staging_root()
    with open_root(root):  # the root dir made root's 0755 before .jobs goes into it
        pass
    jobrecord.write(root, rec)
    return rec


def stage(rec: JobRecord, deadline: Deadline | None = None) -> None:
    """Create the job's staging dir and stage the record's run's newest valid checkpoint (module docstring)."""
    root = staging_root()
    prepare_job_dir(root, str(rec.job_id), rec.uid, rec.gid)
    if rec.team is None or rec.run is None:
        return
    try:  # in-memory snapshots (nuro.checkpoint.promote): without the dir the job only takes no snapshots
        promote.prepare(promote.snapshot_root(), rec)
    except (OSError, ValueError) as exc:
        log.warning("job=%d no snapshot dir on this node (%s): in-memory snapshots are off for it", rec.job_id, exc)
    timeout_s = _env_number("NURO_PROLOG_STAGE_TIMEOUT_S", 120.0)
    if deadline is not None:
        timeout_s = min(timeout_s, deadline.left())
    job, team, run = rec.job_id, rec.team, rec.run
    t0 = time.monotonic()
    res = stage_latest(_store(), rec, root, timeout_s=timeout_s,
                       gang=lambda: gang_position(rec, os.environ, ask_slurm=_job_nodes_from_slurm))  # fmt: skip
    took = time.monotonic() - t0
    for why in res.skipped or []:
        log.warning("job=%s team=%s run=%s checkpoint skipped: %s", job, team, run, why)
    if res.error:
        log.warning("job=%s team=%s run=%s checkpoint not staged (%.1f s): %s", job, team, run, took, res.error)
    elif res.step is None:
        log.info("job=%s team=%s run=%s no checkpoint to stage (%.1f s)", job, team, run, took)
    else:
        log.info(
            "job=%s team=%s run=%s staged step=%d source=%s files=%d/%d path=%s (%.1f s)",
            job, team, run, res.step, res.source, res.files, res.of_files, res.path, took,
        )  # fmt: skip


def gang_position(
    rec: JobRecord, environ: Mapping[str, str], ask_slurm: Callable[[int], list[str]] | None = None
) -> GangPosition | None:
    """This node's place in the job's node list, so only its share of a DeepSpeed step is staged; None when the
    list cannot be had or does not name this node (then every file is staged).

    The list is Slurm's own: slurmd's ``SLURM_JOB_NODELIST`` where it sets one, else one ``squeue -j`` (``ask_slurm``):
    22.05's prolog with ``PrologFlags=Alloc`` gets no node list (measured on the dev cluster). Called only when a
    multi-node DeepSpeed step is about to be staged, so no other job pays for the read."""
    raw = environ.get("SLURM_JOB_NODELIST")
    try:
        nodes = hostlist.expand(raw)
    except ValueError:
        nodes = []
    if not nodes and ask_slurm is not None:
        nodes = ask_slurm(rec.job_id)
    if not rec.node or rec.node not in nodes:
        log.info("job=%s node list %r does not name this node %r: the DeepSpeed step is staged whole", rec.job_id,
                 raw if raw else nodes, rec.node)  # fmt: skip
        return None
    return GangPosition(nodes.index(rec.node), len(nodes))


#: The one Slurm read for a gang's node list (``gang_position``): short, a slow controller only costs staging all.
GANG_CALL_TIMEOUT_S = 5.0


def _job_nodes_from_slurm(job_id: int) -> list[str]:
    from nuro.slurm import CliBackend, SlurmError  # lazy, as in refuse(): the TaskProlog must start fast

    try:
        return CliBackend(timeout_s=GANG_CALL_TIMEOUT_S).job_nodes(job_id)
    except (SlurmError, ValueError) as exc:
        log.warning("job=%s node list not read from Slurm (%s): the DeepSpeed step is staged whole", job_id, exc)
        return []


def record_gpus(rec: JobRecord) -> None:
    """Tell the node agent which GPUs this job holds here, so its ``gpu`` points carry the job
    (``nuro.protocol.gpujobs``),
    tagged with the record's team and run (never the comment's)."""
    gpus = parse_gpu_ids(os.environ.get("SLURM_JOB_GPUS"))
    if rec.node and gpus:
        claim(staging_root(), rec, gpus)


def prepare_data_cache(rec: JobRecord) -> None:
    """The team's shard cache dir on this node (``NURO_DATA_CACHE_DIR``/<account>, root:nuro-<team> 2770), so
    every job of the team shares one copy of each shard and no other team can read it (nuro.datasets.cache)."""
    base = os.environ.get(NURO_DATA_CACHE_DIR)
    if not base or rec.team is None:
        return
    from nuro.datasets.cache import ensure_team_dir  # lazy: the TaskProlog must start fast

    if ensure_team_dir(base, rec.team) is None:
        log.info("job=%s team=%s has no Unix group here: its jobs cache datasets privately", rec.job_id, rec.team)


#: What the prefetch process may see of the prolog's environment: where S3 and the cache are, never a key.
PREFETCH_ENV = (NURO_S3_ENDPOINT, NURO_S3_BUCKET, NURO_S3_REGION, NURO_S3_CREDENTIALS, NURO_DATA_CACHE_DIR,
                NURO_DATA_CACHE_GB, "LANG", "LC_ALL", "TZ")  # fmt: skip


def _data_seed(meta: dict, max_seed: int) -> int:
    data = meta.get("data")
    seed = data.get("seed", 0) if isinstance(data, dict) else 0
    return seed if type(seed) is int and 0 <= seed <= max_seed else 0


def prefetch_plan(rec: JobRecord, comment: str | None, python: str = sys.executable) -> list[str] | None:
    """The dataset prefetch's command (``nuro.datasets.prefetch``) for this job, or None when it gets none: no
    node cache, prefetch off (``NURO_DATA_PREFETCH_SHARDS=0``), no team or no pin, a requeued attempt (its position
    is inside its checkpoint), or a pin of another team's dataset (it would fail the job's own reads anyway, and
    must not reach this team's cache)."""
    # lazy: only a job that pins a dataset needs it, and the TaskProlog (--task, once per task) must start fast
    from nuro.datasets.manifest import owner_team
    from nuro.datasets.prefetch import DEFAULT_SHARDS, DEFAULT_TIMEOUT_S, MAX_SEED, prefetch_command

    count = _env_number("NURO_DATA_PREFETCH_SHARDS", DEFAULT_SHARDS)
    if not os.environ.get(NURO_DATA_CACHE_DIR) or rec.team is None or count < 1 or rec.restart > 0:
        return None
    meta = jobcomment.parse(comment).raw.get(COMMENT_RUN)
    ref = _dataset_ref(meta) if isinstance(meta, dict) else None
    if ref is None:
        return None
    if owner_team(ref[0]) not in (None, rec.team):
        log.warning("job=%s team=%s dataset %s is another team's: not prefetched", rec.job_id, rec.team, ref[0])
        return None
    timeout_s = _env_number("NURO_DATA_PREFETCH_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    report = staging_root() / str(rec.job_id) / "prefetch.json"
    from nuro.prolog_epilog.prefetchguard import ENV_CGROUP_MOUNTPOINT, job_cgroups  # lazy: as above

    mountpoint = os.environ.get(ENV_CGROUP_MOUNTPOINT) or "/sys/fs/cgroup"
    cgroups = job_cgroups(mountpoint, rec.node, rec.uid, rec.job_id) if rec.node else []
    return prefetch_command(python, *ref, rec.team, _data_seed(meta, MAX_SEED), int(count), timeout_s, report,
                            cgroups)  # fmt: skip


def _env_number(name: str, default: float) -> float:
    """A number from the node env (``nodeenv.setting``: a bad value is said in the hook log, ``default`` used)."""
    return float(setting(os.environ, name, float, default))


def start_prefetch(rec: JobRecord, cmd: list[str]) -> int:
    """Start ``cmd`` as the job's user (its uid, primary and supplementary groups: the team's cache dir and key
    file are the team group's), in a session of its own with no terminal or pipe of slurmd's, and return its pid
    without waiting: the fetch overlaps the job's start-up and ends by its own timeout."""
    import pwd  # lazy: the TaskProlog must start fast
    import subprocess

    home = pwd.getpwuid(rec.uid).pw_dir
    env = {k: os.environ[k] for k in PREFETCH_ENV if os.environ.get(k)}
    env.update(NURO_TEAM=str(rec.team), HOME=home, PATH="/usr/bin:/bin")
    proc = subprocess.Popen(  # noqa: S603 - argv rendered from validated fields, no shell
        cmd, user=rec.uid, group=rec.gid, extra_groups=os.getgrouplist(rec.user, rec.gid), env=env, cwd="/",
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    return proc.pid


def task_env() -> str:
    """``--task`` (Slurm TaskProlog, as the job's user): the ``export`` lines that tell the job's processes their
    staging dir and the node's dataset cache; slurmstepd adds them to each task's environment."""
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        return ""
    lines = [f"export NURO_STAGING_DIR={staging_root() / job}"]
    lines += [f"export {k}={os.environ[k]}" for k in (NURO_DATA_CACHE_DIR, NURO_DATA_CACHE_GB) if os.environ.get(k)]
    return "\n".join(lines)


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
    started = time.monotonic()
    try:
        load_node_env()
    except (OSError, ValueError) as exc:
        log.error("job=%s cannot read node settings $NURO_ENV_FILE: %s", job, exc)
    hooklog.attach("nuro-prolog")
    deadline = Deadline.from_env()  # after the env file: it may set the deadline
    if not node_is_healthy(job, "prolog"):
        return 1  # the node is drained with the reason; slurmd does not start the job here, Slurm requeues it
    rec: JobRecord | None = None
    try:
        rec = write_record()
    except Exception as exc:  # slurmd's own fields missing, or the staging root unusable: no root work for it
        log.exception("job=%s job record not written (no staging, no GPU claim): %s", job, exc)
    try:
        check(os.environ.get("SLURM_JOB_COMMENT"), limit_s=deadline.left())
    except Refusal as exc:
        refused = True
        log.error("job=%s refused: %s", job, exc)
        refuse(int(job), str(exc))
    except Exception as exc:  # never drain a node for a bug of ours; say it loudly instead
        log.exception("job=%s prolog error (job allowed to start): %s", job, exc)
    if not refused and rec is not None:
        try:
            stage(rec, deadline)
        except Exception as exc:  # staging is an optimisation: the job restores from S3 without it
            log.exception("job=%s checkpoint staging failed (job allowed to start): %s", job, exc)
        try:
            prepare_data_cache(rec)
        except Exception as exc:  # the cache is an optimisation: the job reads from S3 without it
            log.exception("job=%s dataset cache dir not prepared (job allowed to start): %s", job, exc)
        try:
            cmd = prefetch_plan(rec, os.environ.get("SLURM_JOB_COMMENT"))
            if cmd is not None:
                from nuro.prolog_epilog import prefetchguard  # lazy: the TaskProlog must start fast

                pid = start_prefetch(rec, cmd)
                prefetchguard.record(staging_root(), rec.job_id, pid)  # the epilog ends it, should it outlive the job
                log.info("job=%s dataset prefetch started pid=%d: %s", job, pid, " ".join(cmd[3:]))
        except Exception as exc:  # the loader fetches what it needs itself
            log.exception("job=%s dataset prefetch not started (job allowed to start): %s", job, exc)
        try:
            record_gpus(rec)
        except Exception as exc:  # telemetry only: the job's GPUs stay untagged
            log.exception("job=%s GPU claim not recorded (job allowed to start): %s", job, exc)
    log.info("job=%s prolog done in %.2f s%s", job, time.monotonic() - started, " (refused)" if refused else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())

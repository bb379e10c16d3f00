"""``Checkpointer``: async DCP checkpoints that a node-level worker commits to S3, and restore of the newest valid one.

Path of one save::

    save(state, step)                         # training thread: blocks only while DCP copies the state to memory
      └ dcp.async_save → $NURO_STAGING_DIR/ckpt/step-N/      (background thread, separate gloo group)
          └ local rank 0: hash this node's files, write step-N/.upload-<node>.json (the request, atomically)
              └ UploadWorker (node agent, or this process with upload="inline"): shards → parts/<node>.json →
                manifest.json last (If-None-Match: *) → step-N/.upload.done.json on every node
                  └ rank 0: record_checkpoint(step) to this node's agent (best effort; the agent's own worker
                    reports the commits it makes by itself)

Who calls what: every rank constructs the Checkpointer and calls ``save``/``maybe_save``/``restore``/``close`` in
step with the others (they run collectives when torch.distributed is initialised); ``wait_committed`` and
``latest_committed_step`` may be called on any rank. At world size 1 nothing is collective.

Why every save, the first one too, blocks only about as long as one copy of the state into warm memory (issue 15
item 6; measured on this box, 1 GiB: the first save blocked 0.98 s, later ones 0.31 s, a warm copy 0.15 s):

- one DCP stager per Checkpointer that keeps its staged copy between saves (``DefaultStager``, synchronous, pinned
  host memory when there is a GPU): later saves copy into memory already allocated and faulted in. The cost: one
  staged copy of the state stays in host memory between saves (it is the peak of any async save anyway);
- ``restore`` (which every run calls first, with or without a checkpoint to load) stages the state once on a
  background thread, so the first save after a start finds its buffers ready too;
- ``torch.distributed.checkpoint`` (~0.7 s to import) is imported on a background thread at construction, not by
  the first save.

Why a separate gloo group: ``async_save`` runs its planning and finishing collectives in a background thread. On the
training group they could interleave with the training step's own collectives and deadlock or corrupt both; a
dedicated group is only ever used by one save at a time (each save waits for the previous one), and gloo works for
CPU-staged state whatever backend trains. A second gloo group carries the main thread's small decisions (the
``maybe_save`` interval, the restore step), so they never cross a background save either.

Environment (defaults for the constructor's arguments): ``NURO_TEAM``, ``NURO_RUN_NAME``, ``NURO_STAGING_DIR`` (set by
the prolog; else ``$NURO_STAGING_ROOT/<job id>``), ``NURO_CKPT_KEEP``, ``NURO_CKPT_INTERVAL_S``, ``NURO_UPLOAD``
(``agent`` = the node agent uploads; anything else = upload in this process), ``NURO_S3_*`` for the store, and
Slurm/torchrun ranks via ``RunEnv``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

from nuro.checkpoint import dsfiles, promote
from nuro.checkpoint import layout as L
from nuro.checkpoint.errors import CheckpointError, InvalidCheckpointInput
from nuro.checkpoint.manifest import TIER_MEMORY, Manifest, UploadRequest, utc_now
from nuro.checkpoint.nodestage import staging_root
from nuro.checkpoint.restore import latest_committed_step, load_manifest, restore_latest, restore_step
from nuro.checkpoint.staging import job_dirs, request_parts, write_request
from nuro.checkpoint.upload import FlushResult, UploadWorker
from nuro.checkpoint.verify import scan_dir
from nuro.lifecycle import run_events
from nuro.objectstore import ObjectStore, ObjectStoreError
from nuro.protocol.envnames import NURO_CKPT_INTERVAL_S, NURO_CKPT_KEEP, NURO_RUN_NAME, NURO_TEAM
from nuro.wrappers.jobchannel import record_checkpoint
from nuro.wrappers.sdk import snapshots
from nuro.wrappers.sdk.runenv import RunEnv, env_seconds
from nuro.wrappers.sdk.stragglers import timed_collective

log = logging.getLogger(__name__)

# DCP warns on every single-process save/load that it "assumes" one process; we pass no_dist on purpose.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

UploadMode = Literal["agent", "inline"]
DEFAULT_INTERVAL_S = 600.0
DEFAULT_CLOSE_TIMEOUT_S = 300.0
_POLL_S = 0.1
_RANK_FILE = re.compile(r"__([0-9]+)_")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidCheckpointInput(f"{name}={raw!r} is not an integer") from None


def _import_dcp() -> None:
    """Import torch.distributed.checkpoint (~0.7 s) ahead of the first save; never raises (the save imports it)."""
    with contextlib.suppress(Exception):  # torch missing or broken: the save says so itself
        import torch.distributed.checkpoint  # noqa: F401 - lazy: on a background thread, the whole point


class Checkpointer:
    """Async checkpoints to node-local staging, committed to S3 by an upload worker; restore of the newest valid one.

    Args:
        team, run: where checkpoints live (``checkpoints/<team>/<run>/``); default ``NURO_TEAM`` / ``NURO_RUN_NAME``.
        store: the S3 adapter; default ``ObjectStore.from_env()``.
        staging_dir: this job's node-local dir; default ``NURO_STAGING_DIR``, else ``$NURO_STAGING_ROOT/<job id>``.
        keep: committed checkpoints retention keeps (plus tagged ones); default ``NURO_CKPT_KEEP``; None = all.
        interval_s: ``maybe_save`` saves when this many seconds passed since the last save; default
            ``NURO_CKPT_INTERVAL_S``, else 600.
        process_group: the gloo group to save with; default: a new gloo group (see the module docstring).
        async_save: False makes every ``save`` synchronous (the state is written before ``save`` returns).
        upload: ``"agent"`` (the node agent uploads) or ``"inline"`` (a thread of this process does); default
            ``"agent"`` when ``NURO_UPLOAD=agent``, else ``"inline"``.
        engine: a DeepSpeed engine (``deepspeed.initialize``): ``save``/``restore`` then checkpoint the engine with
            DeepSpeed's own API, and their ``state_dict`` is the client state saved beside it (``save`` stores it,
            ``restore`` updates it in place). See ``nuro.wrappers.sdk.dsengine`` and docs/deepspeed.md.
        snapshot_interval_s: ``maybe_save`` also takes an in-memory snapshot, replicated to the next node, this
            often (``nuro.wrappers.sdk.snapshots``); default ``NURO_SNAPSHOT_INTERVAL_S``, else off (0).

    Raises:
        InvalidCheckpointInput: team/run missing or malformed, or a malformed NURO_* value.
    """

    def __init__(
        self,
        team: str | None = None,
        run: str | None = None,
        store: ObjectStore | None = None,
        staging_dir: str | Path | None = None,
        keep: int | None = None,
        interval_s: float | None = None,
        process_group: Any = None,
        async_save: bool = True,
        upload: UploadMode | None = None,
        *,
        env: RunEnv | None = None,
        engine: Any = None,
        snapshot_interval_s: float | None = None,
    ) -> None:
        self.env = env or RunEnv.from_env()
        team, run = team or self.env.team, run or self.env.run_name
        if not team or not run:
            raise InvalidCheckpointInput(
                "Checkpointer needs a team and a run name: pass team=/run= or run under nuro-train "
                "(which sets NURO_TEAM and NURO_RUN_NAME)"
            )
        self.team, self.run = L.validate_team(team), L.validate_run(run)
        self.store = store or ObjectStore.from_env()
        self.keep = keep if keep is not None else _env_int(NURO_CKPT_KEEP)
        if self.keep is not None and self.keep < 1:
            raise InvalidCheckpointInput(f"keep must be at least 1 (NURO_CKPT_KEEP), got {self.keep}")
        self.interval_s = (
            interval_s
            or env_seconds(os.environ, NURO_CKPT_INTERVAL_S, error=InvalidCheckpointInput)
            or DEFAULT_INTERVAL_S
        )
        self.async_save = async_save
        mode = upload or ("agent" if os.environ.get("NURO_UPLOAD") == "agent" else "inline")
        if mode not in ("agent", "inline"):
            raise InvalidCheckpointInput(f"upload must be 'agent' or 'inline', got {mode!r}")
        self.upload: UploadMode = mode

        self.staging_dir = Path(staging_dir or self.env.staging_dir or self._default_staging_dir())
        self.staging_root = self.staging_dir.parent
        self.job_id = str(self.env.job_id) if self.env.job_id is not None else self.staging_dir.name
        L.validate_job_id(self.job_id)
        try:
            L.job_ckpt_dir(self.staging_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create the checkpoint staging dir {self.staging_dir}: {exc}. Under nuro the prolog creates "
                "it; elsewhere pass staging_dir= or set NURO_STAGING_DIR to a writable node-local directory"
            ) from None

        self._engine, self._writer = engine, None
        if engine is not None:
            from nuro.wrappers.sdk import dsengine  # lazy: DeepSpeed (~1 s to import) only for a DeepSpeed job

            dsengine.check_engine(engine)
            self._writer = dsengine.install_writer(engine) if async_save else None
        self._dist, self._group, self._ctl_group = self._setup_groups(process_group)
        self.rank = self._dist.get_rank() if self._dist else self.env.rank
        self.world_size = self._dist.get_world_size() if self._dist else 1
        self.local_rank = self.env.local_rank if self._dist else 0
        self.local_world_size = self.env.local_world_size if self._dist else 1
        self.node_rank = self.env.node_rank if self._dist else 0
        self._rank_nodes, names = self._gather_nodes()
        # parts = the nodes that actually run ranks (not SLURM_JOB_NUM_NODES: a job may train on fewer nodes)
        nodes = sorted(set(self._rank_nodes))
        self.part, self.parts_expected = nodes.index(self.node_rank), len(nodes)
        #: the Slurm node of each part (``UploadRequest.writers``), () when a node has no Slurm name
        self.writers = _writers(nodes, self._rank_nodes, names)
        self._setup_snapshots(snapshot_interval_s, nodes)

        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nuro-ckpt-finalize")
        self._inflight: tuple[int, Future[None]] | None = None
        self._last_saved_step: int | None = None
        self._last_save_time = time.monotonic()
        self._requested: list[int] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._worker: UploadWorker | None = None
        self._wake = threading.Event()
        self._last_recorded: int | None = None
        self.timings: dict[int, dict[str, float]] = {}
        #: which copy the last ``restore`` loaded on rank 0: "persistent", or "memory" (an in-memory snapshot a
        #: surviving node promoted after a node loss); None elsewhere or before
        self.restored_tier: str | None = None
        #: steps the last ``restore`` passed over because some node could not load them, and why
        self.restore_skipped: list[tuple[int, str]] = []
        self._rank0_skipped: list[tuple[int, str]] = []  # what rank 0's own search passed over (for the run event)
        if self.upload == "inline" and self.local_rank == 0:
            self._worker = UploadWorker(self.store, self.staging_root, job_dirs=[self.staging_dir], trust="request")
            self._start_thread(  # woken by each request it must upload (_finalize), so a commit starts at once
                "nuro-ckpt-upload",
                lambda: self._worker.run(self._stop, 0.5, self._wake),  # type: ignore[union-attr]
            )
        if self.rank == 0 and self.env.job_id is not None:
            self._start_thread("nuro-ckpt-record", self._record_loop)
        self._stager: Any = None  # DCP's DefaultStager, made on first use (it needs torch.distributed.checkpoint)
        self._prestage: threading.Thread | None = None
        if engine is None:
            self._start_thread("nuro-ckpt-import", _import_dcp)  # off the first save's path (see the module docstring)

    # -- set-up ------------------------------------------------------------------------------------------------
    def _default_staging_dir(self) -> Path:
        root = staging_root()
        name = str(self.env.job_id) if self.env.job_id is not None else f"local-{os.getuid()}-{self.run}"
        return root / name

    def _setup_groups(self, process_group: Any) -> tuple[Any, Any, Any]:
        """(torch.distributed or None, the save group, the control group). Collective: every rank calls it."""
        import torch.distributed as dist  # lazy: torch is the optional 'train' extra (seconds to import)

        if not (dist.is_available() and dist.is_initialized()):
            return None, None, None
        timeout = self.env.pg_timeout
        group = process_group or dist.new_group(backend="gloo", timeout=timeout)
        ctl = dist.new_group(backend="gloo", timeout=timeout)
        return dist, group, ctl

    def _setup_snapshots(self, interval_s: float | None, parts: list[int]) -> None:
        """In-memory snapshots (``nuro.wrappers.sdk.snapshots``): settings, this job's snapshot dir and, with more
        than one node, a gloo group of the node leaders (collective: every rank calls it, alike, since the setting
        is the job's)."""
        self.snapshot_settings = snapshots.SnapshotSettings.from_env()
        if interval_s is not None:
            self.snapshot_settings = dataclasses.replace(self.snapshot_settings, interval_s=interval_s)
        raw_dir = os.environ.get(snapshots.ENV_DIR)
        self.snapshot_dir = Path(raw_dir) if raw_dir else promote.snapshot_root(os.environ) / self.job_id
        self.snapshot_bytes = 0  # held on this node after the newest snapshot (its share and its neighbour's)
        self.snapshot_timings: dict[int, dict[str, float]] = {}
        self._snap_on = self.snapshot_settings.interval_s > 0
        self._snap_reported = False
        self._last_snapshot_step: int | None = None
        self._last_snapshot_time = time.monotonic()
        self._leaders: list[int] = []
        self._leaders_group: Any = None
        if not self._snap_on:
            return
        if self._dist and len(parts) > 1:
            first = {}
            for rank, node in enumerate(self._rank_nodes):
                first.setdefault(node, rank)
            self._leaders = [first[n] for n in parts]  # by part: the global rank of each node's leader
            self._leaders_group = self._dist.new_group(ranks=self._leaders, backend="gloo",
                                                       timeout=self.env.pg_timeout)  # fmt: skip

    def _gather_nodes(self) -> tuple[list[int], list[str | None]]:
        """Every rank's node index and Slurm node name (collective): a node's share of a checkpoint is the files of
        its own ranks, and the upload worker learns which node writes which part."""
        if not self._dist:
            return [0], [self.env.node_name]
        pairs: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(pairs, (self.node_rank, self.env.node_name), group=self._ctl_group)
        nodes = [p[0] if isinstance(p, tuple) and len(p) == 2 else None for p in pairs]
        if any(type(n) is not int or n < 0 for n in nodes):
            raise CheckpointError(f"node ranks {nodes}: GROUP_RANK/SLURM_NODEID must be set (torchrun and Slurm do)")
        return [int(n) for n in nodes], [p[1] if isinstance(p[1], str) else None for p in pairs]

    def _owns(self, relpath: str) -> bool:
        """Is ``relpath`` (a file DCP wrote) this node's to upload? ``__<rank>_*`` files belong to that rank's
        node, everything else (``.metadata``) to the coordinator's (rank 0). On a real node the dir holds only its
        own files anyway; this matters where nodes share the staging file system. A DeepSpeed checkpoint's files
        go by ``dsfiles.owner_rank`` (its model states may be on every node; only rank 0's node uploads them)."""
        if self._engine is not None:
            rank = dsfiles.owner_rank(relpath)
            return rank < len(self._rank_nodes) and self._rank_nodes[rank] == self.node_rank
        m = _RANK_FILE.match(relpath)
        if m and int(m.group(1)) < len(self._rank_nodes):
            return self._rank_nodes[int(m.group(1))] == self.node_rank
        return self._rank_nodes[0] == self.node_rank

    def _start_thread(self, name: str, target: Callable[[], None]) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)  # daemon: a forgotten close() must not hang exit
        t.start()
        self._threads.append(t)

    # -- saving ------------------------------------------------------------------------------------------------
    def _staging(self) -> Any:
        """This Checkpointer's one stager: its staged copy is reused by every save (buffers allocated once)."""
        if self._stager is None:
            # lazy: torch is the optional 'train' extra, and DCP costs ~0.7 s to import (see _import_dcp)
            import torch
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            gpu = torch.cuda.is_available()
            options = StagingOptions(
                use_pinned_memory=gpu, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
            )
            self._stager = DefaultStager(options)
        return self._stager

    def _prestage_later(self, state_dict: dict[str, Any]) -> None:
        """Stage ``state_dict`` once on a background thread, so the first save's buffers are already allocated and
        faulted in (its content is staged again by that save). Skipped with ``async_save=False``."""
        if not self.async_save or self._prestage is not None or self._engine is not None:
            return

        def run() -> None:
            try:
                self._staging().stage(state_dict)
            except Exception as exc:  # an optimisation: the first save stages from scratch instead
                log.info("pre-staging the state for the first save failed (that save will be slower): %s", exc)

        self._prestage = threading.Thread(target=run, name="nuro-ckpt-prestage", daemon=True)
        self._prestage.start()

    def save_seconds(self) -> float:
        """This job's measured save time (median seconds to durable on local disk over its saves; 0 before any):
        what one more checkpoint costs, e.g. for ``MovePolicy(checkpoint_s=ckpt.save_seconds)``."""
        done = [t["durable_s"] for t in self.timings.values() if "durable_s" in t]
        return statistics.median(done) if done else 0.0

    def step_dir(self, step: int) -> Path:
        return L.job_ckpt_dir(self.staging_dir) / L.step_name(step)

    def save(self, state_dict: dict[str, Any], step: int, *, sync: bool = False) -> None:
        """Checkpoint ``state_dict`` as ``step`` (every rank, in step). Returns once the state is staged in memory
        (async) or written to the node-local dir (``sync=True`` or ``async_save=False``); upload happens behind.

        A step already saved by this Checkpointer is not saved again (``sync=True`` then waits for that save).
        """
        L.validate_step(step)
        if self._last_saved_step is not None and step <= self._last_saved_step:
            if sync:
                self._wait_inflight()
            log.debug("save step=%d skipped: step %d already saved", step, self._last_saved_step)
            return
        self._wait_inflight()  # one save at a time: bounded memory, and the save group is never shared
        path = self.step_dir(step)
        self._prepare_dir(path)
        t0 = time.monotonic()
        timing = self.timings.setdefault(step, {})
        timing["taken_at"] = time.time()  # when the state was taken: the controller's "a checkpoint after the signal"
        self._last_saved_step = step
        self._last_save_time = t0
        self._write(state_dict, step, path, sync, timing, self._finalize)

    def snapshot(self, state_dict: dict[str, Any], step: int) -> None:
        """Take an in-memory snapshot of ``state_dict`` as ``step`` (every rank, in step; ``maybe_save`` calls it
        when ``snapshot_interval_s`` is due): the same staged copy as an async ``save``, written to node memory and
        sent to the next node in the background; never uploaded while the job runs (``nuro.checkpoint.promote``)."""
        L.validate_step(step)
        if any(s is not None and step <= s for s in (self._last_snapshot_step, self._last_saved_step)):
            return
        self._wait_inflight()
        path = L.job_ckpt_dir(self.snapshot_dir) / L.step_name(step)
        self._prepare_dir(path)
        t0 = time.monotonic()
        timing = self.snapshot_timings.setdefault(step, {})
        self._last_snapshot_step = step
        self._last_snapshot_time = t0
        self._write(state_dict, step, path, False, timing, self._finalize_snapshot)

    def _prepare_dir(self, path: Path) -> None:
        if self.local_rank == 0:
            self._clear_stale(path)
        if self._dist:
            self._dist.barrier(group=self._ctl_group)  # no rank writes before every stale dir is moved away
        path.mkdir(parents=True, exist_ok=True)

    def _write(
        self,
        state_dict: dict[str, Any],
        step: int,
        path: Path,
        sync: bool,
        timing: dict[str, float],
        finalize: Callable[[int, Path, float], None],
    ) -> None:
        """Write the state into ``path`` (DCP, or DeepSpeed with an engine); ``finalize`` once it is there."""
        t0 = time.monotonic()
        if self._engine is not None:
            self._save_engine(state_dict, step, path, sync, timing, finalize)
            return
        import torch.distributed.checkpoint as dcp  # lazy: torch is the optional 'train' extra

        if sync or not self.async_save:
            dcp.save(state_dict, checkpoint_id=str(path), process_group=self._group, no_dist=self._dist is None)
            timing["stall_s"] = timing["durable_s"] = time.monotonic() - t0
            finalize(step, path, t0)
            return
        if self._prestage is not None:
            self._prestage.join()  # one user of the stager at a time (it has long finished in practice)
        res = dcp.async_save(state_dict, checkpoint_id=str(path), process_group=self._group, no_dist=self._dist is None,
                             async_stager=self._staging())  # fmt: skip
        timing["stall_s"] = time.monotonic() - t0
        done = res.upload_completion if hasattr(res, "upload_completion") else res

        def finish() -> None:
            done.result()
            timing["durable_s"] = time.monotonic() - t0
            finalize(step, path, t0)

        self._inflight = (step, self._executor.submit(finish))

    def save_committed(self, state_dict: dict[str, Any], step: int, timeout_s: float = 60.0) -> bool:
        """Save ``step`` now and wait until it is committed in S3 (every rank, in step): what a stop's
        acknowledgement (``PreemptionGuard.checkpoint_and_exit``) and a run's last checkpoint need. False when it was
        not committed within ``timeout_s``."""
        self.save(state_dict, step, sync=True)
        return self.wait_committed(step, timeout_s)

    def _save_engine(
        self,
        client_state: dict[str, Any],
        step: int,
        path: Path,
        sync: bool,
        timing: dict[str, float],
        finalize: Callable[[int, Path, float], None],
    ) -> None:
        """DeepSpeed's save into ``path`` (its tag is the step dir's name); with the writer it returns once the
        state is copied, and the files are handed on (``finalize``) when every rank's writes are done."""
        from nuro.wrappers.sdk import dsengine  # lazy: DeepSpeed only for a DeepSpeed job (imported at __init__)

        t0 = time.monotonic()
        dsengine.save(self._engine, path.parent, path.name, client_state)
        writer = self._writer

        def finish() -> None:
            if writer is not None:
                writer.wait(path.name)
            if self._dist:
                self._dist.barrier(group=self._group)  # every rank's files are on disk before the node's scan
            timing["durable_s"] = time.monotonic() - t0
            finalize(step, path, t0)

        if writer is None or sync:
            finish()
        else:
            self._inflight = (step, self._executor.submit(finish))
        timing["stall_s"] = time.monotonic() - t0  # what the training waited: the copy, or the whole save

    def _clear_stale(self, path: Path) -> None:
        """A step dir left by an earlier attempt is moved aside, never mixed into this save."""
        if path.exists():
            aside = path.with_name(f".stale-{path.name}-{os.getpid()}-{time.time_ns()}")
            log.warning("moving stale checkpoint dir %s aside to %s before saving again", path, aside)
            try:
                os.replace(path, aside)
            except FileNotFoundError:  # another node sharing this file system moved it first
                return
            shutil.rmtree(aside, ignore_errors=True)

    def _finalize(self, step: int, path: Path, t0: float) -> None:
        """After DCP finished on every rank: local rank 0 hands this node's files to the upload worker."""
        if self.local_rank != 0:
            return
        files = tuple(f for f in scan_dir(path) if self._owns(f.path))
        req = UploadRequest(
            team=self.team, run=self.run, step=step, job_id=self.job_id, restart=self.env.restart_count,
            part=self.part, parts_expected=self.parts_expected,
            world_size=self.world_size, files=files, created_at=utc_now(), keep=self.keep, writers=self.writers,
        )  # fmt: skip
        write_request(path, req)
        self._wake.set()
        self._requested.append(step)
        self.timings.setdefault(step, {})["requested_s"] = time.monotonic() - t0
        log.info("checkpoint staged step=%d files=%d bytes=%d", step, len(files), sum(f.size for f in files))

    def _finalize_snapshot(self, step: int, path: Path, t0: float) -> None:
        """After the snapshot is in node memory on every rank: each node's leader sends its share to the next node
        and takes the previous node's; once every leader holds both (barrier), it writes the requests of both shares
        (what makes the step promotable: ``nuro.checkpoint.promote``) and removes older snapshots."""
        if self.local_rank != 0:
            return
        timing = self.snapshot_timings.setdefault(step, {})
        own = tuple(f for f in scan_dir(path) if self._owns(f.path))
        shares = [(self.part, own)]
        if self._leaders_group is not None:
            to_part, from_part = snapshots.ring(self.parts_expected, self.part)
            blob = snapshots.pack([(f, (path / f.path).read_bytes()) for f in own])
            theirs = snapshots.unpack(snapshots.exchange(
                self._dist, self._leaders_group, self._leaders[to_part], self._leaders[from_part], blob))  # fmt: skip
            del blob
            snapshots.write_share(path, theirs)
            shares.append((from_part, tuple(f for f, _ in theirs)))
            self._dist.barrier(group=self._leaders_group)  # every node holds its share and its neighbour's
        for part, files in shares:
            write_request(path, UploadRequest(
                team=self.team, run=self.run, step=step, job_id=self.job_id, restart=self.env.restart_count,
                part=part, parts_expected=self.parts_expected, world_size=self.world_size, files=files,
                created_at=utc_now(), keep=self.keep, tier=TIER_MEMORY,
            ))  # fmt: skip
        for old in L.job_ckpt_dir(self.snapshot_dir).iterdir():
            old_step = L.parse_step_name(old.name)
            if old_step is not None and old_step < step:
                shutil.rmtree(old, ignore_errors=True)
        self.snapshot_bytes = snapshots.held_bytes(self.snapshot_dir)
        timing["replicated_s"] = time.monotonic() - t0
        first = not self._snap_reported
        if 2 * self.snapshot_bytes > self.snapshot_settings.max_bytes and self._snap_on:
            self._snap_on = False  # rank 0's node decides for the job (maybe_save broadcasts its decision)
            log.warning(
                "in-memory snapshots stop: this node holds %d bytes per snapshot, and two of them would pass "
                "%s=%d", self.snapshot_bytes, snapshots.ENV_MAX_BYTES, self.snapshot_settings.max_bytes,
            )  # fmt: skip
            first = True
        if first and self.rank == 0:  # what snapshots cost in memory, for nuro-train events (said once, or at the stop)
            self._snap_reported = True
            run_events.record_later(
                "snapshots", store=self.store, env=self._event_env(), step=step, held_bytes=self.snapshot_bytes,
                interval_s=self.snapshot_settings.interval_s, max_bytes=self.snapshot_settings.max_bytes,
                replicated_s=round(timing["replicated_s"], 3), on=self._snap_on,
            )  # fmt: skip
        log.debug("snapshot step=%d held=%d bytes replicated in %.3f s", step, self.snapshot_bytes,
                  timing["replicated_s"])  # fmt: skip

    def _wait_inflight(self) -> None:
        if self._inflight is not None:
            step, fut = self._inflight
            self._inflight = None
            try:
                fut.result()
            except Exception as exc:
                raise CheckpointError(f"the async save of step {step} failed: {exc}") from exc

    def maybe_save(self, state_fn: Callable[[], dict[str, Any]], step: int) -> bool:
        """Save when ``interval_s`` has passed since the last save (every rank, in step; rank 0's clock decides,
        so all ranks save at the same step). ``state_fn`` is called only when saving. True if it saved."""
        now = time.monotonic()
        kind = 0
        if now - self._last_save_time >= self.interval_s:
            kind = 1
        elif self._snap_on and now - max(self._last_save_time, self._last_snapshot_time) >= (
            self.snapshot_settings.interval_s
        ):
            kind = 2
        kind = self._broadcast(kind)
        if kind == 1:
            self.save(state_fn(), step)
        elif kind == 2:
            self.snapshot(state_fn(), step)
        return kind == 1

    def _broadcast(self, value: int) -> int:
        if not self._dist:
            return value
        import torch  # lazy: torch is the optional 'train' extra; only a distributed run gets here

        t = torch.tensor([value], dtype=torch.int64)
        with timed_collective():  # a per-step sync point: its wait is the straggler watch's evidence too
            self._dist.broadcast(t, src=0, group=self._ctl_group)
        return int(t.item())

    # -- commit ------------------------------------------------------------------------------------------------
    def is_committed(self, step: int) -> bool:
        """True once ``step``'s manifest is in S3 (this node's marker, else one HEAD)."""
        path = self.step_dir(step)
        if (path / L.DONE_FILE).is_file():
            return True
        if (path / L.ABANDONED_FILE).is_file():
            return False
        if path.is_dir() and request_parts(path):
            return False  # the node's worker marks it when it sees the manifest
        try:
            return self.store.exists(L.manifest_key(self.team, self.run, step))
        except ObjectStoreError:
            return False

    def wait_committed(self, step: int, timeout_s: float) -> bool:
        """Wait until ``step`` is committed in S3; False at the timeout or if its upload was given up."""
        deadline = time.monotonic() + timeout_s
        if self._inflight is not None and self._inflight[0] == step:
            self._wait_inflight()
        while True:
            if self.is_committed(step):
                return True
            if (self.step_dir(step) / L.ABANDONED_FILE).is_file() or time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)

    def latest_committed_step(self) -> int | None:
        """The newest step whose manifest is in S3 (not verified; ``restore`` verifies)."""
        return latest_committed_step(self.store, self.team, self.run)

    def _record_loop(self) -> None:
        """Rank 0 in a Slurm job: report each newly committed step to this node's agent (the controller's view)."""
        while not self._stop.wait(1.0):
            self._record_new_commits()
        self._record_new_commits()

    def _record_new_commits(self) -> None:
        # the node's worker marks each committed step; a pruned (older) step is superseded by a newer one anyway
        done = [s for s in list(self._requested) if (self.step_dir(s) / L.DONE_FILE).is_file()]
        newest = max(done, default=None)
        if newest is None or (self._last_recorded is not None and newest <= self._last_recorded):
            return
        try:
            taken = self.timings.get(newest, {}).get("taken_at")
            record_checkpoint(newest, taken_at=int(taken) if taken is not None else None)
            self._last_recorded = newest
        except Exception as exc:  # best effort: the checkpoint is committed whatever the report
            if self._last_recorded is None:  # said once: without an agent every later report fails alike
                log.warning("could not report committed step %d to the node agent: %s", newest, exc)
            self._last_recorded = newest

    # -- restore -----------------------------------------------------------------------------------------------
    def local_roots(self) -> list[Path]:
        """Where a valid local copy may already be: the prolog's restore dir, this job's saves, the node cache,
        other jobs' saves on this node (newest job dirs first)."""
        roots = [
            L.job_restore_dir(self.staging_dir),
            L.job_ckpt_dir(self.staging_dir),
            L.cache_dir(self.staging_root, self.team, self.run),
        ]
        others = [L.job_ckpt_dir(d) for d in reversed(job_dirs(self.staging_root)) if d != self.staging_dir]
        return roots + others

    def restore(self, state_dict: dict[str, Any]) -> int | None:
        """Load the newest valid checkpoint into ``state_dict`` in place (every rank, in step); its step, or None
        when the run has no valid checkpoint yet. Later saves of steps at or below it are skipped.

        Every node must be able to load the step chosen: rank 0 picks the newest step valid on its node (its local
        copies first), each other node's leader materialises that step too, and if any node cannot (a shard torn in
        S3 that rank 0 had a good local copy of), all ranks fall back together to the newest valid step below it.
        """
        self._promote_held_snapshots()
        max_step: int | None = None
        self.restore_skipped = []
        self._rank0_skipped = []
        while True:
            path, step = self._choose_step(max_step)
            if not self._dist or step < 0:
                break
            errors, path = self._materialise_everywhere(step, path)
            if not errors:
                break
            why = "; ".join(errors)
            self.restore_skipped.append((step, why))
            log.warning("restore: step %d cannot be loaded on every node (%s); all ranks fall back below it", step,
                        why)  # fmt: skip
            max_step = step - 1
        self._record_skipped(step)
        if step < 0 or path is None:
            self._prestage_later(state_dict)
            return None
        if self._engine is not None:
            from nuro.wrappers.sdk import dsengine  # lazy: DeepSpeed only for a DeepSpeed job

            state_dict.update(dsengine.load(self._engine, path))
        else:
            import torch.distributed.checkpoint as dcp  # lazy: torch is the optional 'train' extra

            dcp.load(state_dict, checkpoint_id=str(path), process_group=self._group, no_dist=self._dist is None)
        self._prestage_later(state_dict)
        self._last_saved_step = step
        log.info("restored step=%d from %s", step, path)
        return step

    def _promote_held_snapshots(self) -> None:
        """A step started again inside its allocation (a hot spare's swap: no epilog ran) finds the snapshots the job
        took before on the surviving nodes: each node's leader that holds a complete one newer than the newest
        committed checkpoint uploads the shares it holds (``nuro.checkpoint.promote``, inline, with the team's own
        credential), so the restore below finds it committed. Every rank waits for every node (collective)."""
        if self.local_rank == 0 and promote.holds_complete(self.snapshot_dir):
            t0 = time.monotonic()
            try:
                got = promote.promote(self.store, self.snapshot_dir.parent, self.snapshot_dir.name,
                                      promote.promote_timeout_s(os.environ), run=(self.team, self.run))  # fmt: skip
                log.info("in-memory snapshot promotion on this node: committed %s in %.2f s %s", got.committed,
                         time.monotonic() - t0, got.why)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - an optimisation: the restore then takes the newest checkpoint
                log.warning("in-memory snapshot not promoted: %s: %s", type(exc).__name__, exc)
        if self._dist:
            self._dist.barrier(group=self._ctl_group)

    def _choose_step(self, max_step: int | None) -> tuple[Path | None, int]:
        """Rank 0's newest valid step at or below ``max_step`` (its path there), broadcast: (path, step) with step
        -1 for none. Raises CheckpointError when rank 0 could not look (store or disk error)."""
        path, step, error = None, -1, ""
        if self.rank == 0:
            try:
                found = restore_latest(
                    self.store, self.team, self.run, local_roots=self.local_roots(),
                    dest=L.job_restore_dir(self.staging_dir), max_step=max_step, need=self._need(),
                )  # fmt: skip
                if found is not None:
                    path, step = found.path, found.step
                    self.restored_tier = found.manifest.tier
                    self._rank0_skipped += [(s.step, s.reason) for s in found.skipped]
                    error = self._format_problem(found.manifest)
            except (CheckpointError, ObjectStoreError, OSError) as exc:
                error = f"rank 0: {exc}"
        if self._dist:
            step = self._broadcast(step if not error else -2)
            if step == -2:
                raise CheckpointError("restore failed: " + (error or "rank 0 could not restore (see its log)"))
        elif error:
            raise CheckpointError(f"restore failed: {error}")
        return path, step

    def _need(self) -> Callable[[str], bool] | None:
        """The files of a step this node must have: for a DeepSpeed engine the model states and its own ranks'
        shards (``dsfiles.needed``); None (all of them) for DCP."""
        if self._engine is None:
            return None
        mine = frozenset(r for r, node in enumerate(self._rank_nodes) if node == self.node_rank)
        return lambda relpath: dsfiles.needed(relpath, mine)

    def _format_problem(self, manifest: Manifest) -> str:
        """Why this Checkpointer cannot load ``manifest``'s step ('' when it can): a DeepSpeed checkpoint is
        loaded only into an engine, and only at the world size that wrote it (ZeRO shards are per rank)."""
        paths = [s.path for s in manifest.shards]
        step = manifest.step
        if self._engine is None:
            if dsfiles.is_deepspeed(paths):
                return (f"rank 0: step {step} was saved by a DeepSpeed engine; restore it with "
                        "Checkpointer(engine=engine)")  # fmt: skip
            return ""
        if not dsfiles.is_deepspeed(paths):
            return (f"rank 0: step {step} is a DCP checkpoint (a DDP run); a DeepSpeed engine loads only DeepSpeed "
                    "checkpoints: start a new run name (nuro-train --name) or restore it without engine=")  # fmt: skip
        if dsfiles.model_parallel(paths):
            return f"rank 0: step {step} holds model-parallel files, which nuro cannot split by node"
        if manifest.world_size != self.world_size:
            return (
                f"rank 0: step {step} was saved by {manifest.world_size} ranks and this run has {self.world_size}: "
                "a ZeRO checkpoint is sharded per rank, so resume with the same --nodes and --gpus-per-node (or "
                "consolidate it with the step's zero_to_fp32.py and start a new run from the weights)"
            )
        return ""

    def _record_skipped(self, restored: int) -> None:
        """Rank 0 records the committed steps this restore passed over (``checkpoint_skipped`` run event), so
        ``nuro-train artifacts`` and ``events`` show them as skipped, not only this job's output."""
        if self.rank != 0:
            return
        skipped = {step: why for step, why in [*self._rank0_skipped, *self.restore_skipped]}
        if skipped:
            steps = [{"step": step, "reason": why[:300]} for step, why in sorted(skipped.items(), reverse=True)]
            run_events.record_later("checkpoint_skipped", store=self.store, env=self._event_env(), steps=steps,
                                    restored=restored)  # fmt: skip

    def _event_env(self) -> dict[str, str]:
        """The run events' identity: this Checkpointer's run, also where no Slurm variables are set."""
        return {
            NURO_TEAM: self.team,
            NURO_RUN_NAME: self.run,
            "SLURM_JOB_ID": self.job_id,
            "RANK": "0",
            "SLURM_RESTART_COUNT": str(self.env.restart_count),
            "SLURMD_NODENAME": os.environ.get("SLURMD_NODENAME", ""),
        }

    def _materialise_everywhere(self, step: int, path: Path | None) -> tuple[list[str], Path | None]:
        """Each node's leader (other than rank 0's) materialises ``step``; every rank learns every node's outcome.
        Returns (the errors, this node's path of the step)."""
        error = ""
        if self.local_rank == 0 and self.rank != 0:
            try:
                manifest = load_manifest(self.store, self.team, self.run, step)
                path = restore_step(
                    self.store,
                    manifest,
                    local_roots=self.local_roots(),
                    dest=L.job_restore_dir(self.staging_dir),
                    need=self._need(),
                ).path
            except (CheckpointError, ObjectStoreError, OSError) as exc:
                error = f"rank {self.rank}: {exc}"
        gathered: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(gathered, (str(path) if path else None, error), group=self._ctl_group)
        errors = [e for _, e in gathered if e]
        node_leader = self.rank - self.local_rank  # torchrun numbers the ranks of a node contiguously
        return errors, Path(gathered[node_leader][0]) if gathered[node_leader][0] else None

    # -- shutdown ----------------------------------------------------------------------------------------------
    def flush(self, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> FlushResult | None:
        """Wait for the pending save, then (inline mode, local rank 0) for this job's uploads to commit."""
        self._wait_inflight()
        if self._worker is None:
            return None
        deadline = time.monotonic() + timeout_s
        while self._worker.pending(self.job_id) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        return FlushResult(
            self.job_id,
            committed=[s for s in self._requested if self.is_committed(s)],
            incomplete=self._worker.pending(self.job_id),
        )

    def close(self, timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S) -> FlushResult | None:
        """Finish: wait for pending saves and (inline) uploads, up to ``timeout_s``; stop the threads. Leftover
        requests stay on disk for the node agent or the epilog."""
        try:
            result = self.flush(timeout_s)
        finally:
            self._stop.set()
            self._wake.set()
            for t in self._threads:
                t.join(timeout=30)
            self._executor.shutdown(wait=True)
            if self._prestage is not None:
                self._prestage.join(timeout=30)
            if self._stager is not None:
                self._stager.close()  # frees the staged copy
                self._stager = None
            if self._writer is not None:
                from nuro.wrappers.sdk import dsengine  # lazy: DeepSpeed only for a DeepSpeed job

                dsengine.remove_writer(self._engine, self._writer)
        return result

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _writers(parts: list[int], rank_nodes: list[int], names: list[str | None]) -> tuple[str, ...]:
    """The Slurm node name of each part (part i = the i-th node index that runs ranks), or () when any is unknown or
    not a node name: the list is all or nothing (``UploadRequest.writers``)."""
    by_node: dict[int, str | None] = {}
    for node, name in zip(rank_nodes, names, strict=True):
        by_node.setdefault(node, name)
    out = [by_node.get(p) for p in parts]
    try:
        return tuple(L.validate_node(n) for n in out)
    except InvalidCheckpointInput:
        return ()

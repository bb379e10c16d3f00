"""Training data from the job's pinned snapshot: ``SnapshotDataset`` (a map-style torch dataset of verified samples
read through the node's shard cache) and ``SnapshotLoader`` (a ``DataLoader`` over nuro's world-size-independent
order, whose position goes into the checkpoint so a requeued or resized run continues exactly where it stopped).

    ds = SnapshotDataset(samples=r"^([^/]+)/[^/]+/(\\d+)\\.", transform=decode)   # NURO_DATASET(_DIGEST) pin it
    loader = SnapshotLoader(ds, batch_size=32, num_workers=4)     # seed: NURO_DATA_SEED (--data-seed), else 0
    state = {"model": model.state_dict(), "loader": loader.state_dict()}
    if ckpt.restore(state) is not None:
        loader.load_state_dict(state["loader"])
    for batch in loader.batches():        # across epochs; loader.epoch says which
        ...; opt.step()
        state["loader"] = loader.state_dict()   # counts every batch handed out: save after the step that used it
        ckpt.maybe_save(lambda: state, step)
        metrics.log(step, loss=loss, samples=len(batch), data_wait_s=loader.last_wait_s)

Why a new reader rather than ``PinnedDataset.read`` per file: that costs one ranged GET per file for every rank and
every epoch. Here a node fetches each shard once (``nuro.datasets.cache``), every later read of it, by any rank,
DataLoader worker or job of the team on that node, is a local ``pread``. Every file's bytes are still checked
against the manifest's sha256 before the user's code sees them; a damaged cached copy is fetched again once and a
shard that is wrong in the store fails the job with the shard named (``IntegrityError``). Without a cache directory
(``NURO_DATA_CACHE_DIR`` unset) reads fall back to one ranged GET per file.

The order (``nuro.datasets.order``): a seeded block shuffle over shards, shared round-robin by the ranks from one
global position, the same for any world size.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from nuro.datasets.cache import CachedShard, ShardCache, cache_from_env
from nuro.datasets.errors import DatasetNotFound, InvalidInput
from nuro.datasets.manifest import FileEntry, Manifest, shard_key
from nuro.datasets.order import DEFAULT_WINDOW, LoaderState, epoch_order, rank_positions
from nuro.datasets.reader import check_file, file_ok, pin_from_env, read_range
from nuro.datasets.refs import load_manifest
from nuro.objectstore import ObjectStore
from nuro.protocol.envnames import NURO_DATA_SEED
from nuro.wrappers.sdk.runenv import RunEnv

#: Shards one process keeps open (and shared-locked against eviction) at a time.
DEFAULT_OPEN_SHARDS = 8


class SnapshotDataset:
    """Samples of a pinned snapshot, by index: ``ds[i]`` is ``transform({path: bytes})`` (the dict itself without a
    transform). A torch map-style dataset (``__len__``/``__getitem__``), safe in DataLoader worker processes.

    Args:
        name, digest: the snapshot; default ``NURO_DATASET`` / ``NURO_DATASET_DIGEST`` (the submit-time pin).
        samples: a regular expression grouping files into samples (``nuro.datasets.samples``); None = the
            snapshot's own sample index (``nuro-train dataset snapshot --samples``), else one sample per file.
        transform: turns a sample's ``{path: bytes}`` into what the model eats (runs in the loader's workers).
        store: the S3 adapter; default ``ObjectStore.from_env()`` (made again in each worker process).
        cache: the node's shard cache; default from ``NURO_DATA_CACHE_DIR`` (per team) and ``NURO_DATA_CACHE_GB``;
            None there means one ranged GET per file.
    """

    def __init__(
        self,
        name: str | None = None,
        digest: str | None = None,
        *,
        samples: str | None = None,
        transform: Callable[[dict[str, bytes]], Any] | None = None,
        store: ObjectStore | None = None,
        cache: ShardCache | None | bool = True,
        team: str | None = None,
        open_shards: int = DEFAULT_OPEN_SHARDS,
    ) -> None:
        if not name or not digest:
            name, digest = pin_from_env()
        self.name, self.digest = name, digest
        self._store_config = store.config if store is not None else None  # a worker makes its own client of it
        self._store: ObjectStore | None = store
        self._pid = os.getpid()
        self.manifest: Manifest = load_manifest(self.store, name, digest)[0]
        self.files: dict[str, FileEntry] = {f.path: f for f in self.manifest.files}
        #: the shard each sample is read from (its first file's): what the block shuffle groups by
        self.samples, self.groups = self.manifest.sample_shards(samples)
        self.shard_sizes = {s.digest: s.size for s in self.manifest.shards}
        self.transform = transform
        if cache is True:  # the team's dir: the job's Slurm account (the prolog made that one), else NURO_TEAM
            cache = cache_from_env(team or os.environ.get("SLURM_JOB_ACCOUNT") or RunEnv.from_env().team)
        self.cache: ShardCache | None = cache or None
        self.open_shards = max(1, open_shards)
        self._open: OrderedDict[str, CachedShard] = OrderedDict()

    # -- per process --------------------------------------------------------------------------------------------
    def _this_process(self) -> None:
        """In a forked DataLoader worker, forget the parent's S3 client (a boto3 client's connection pool must not
        be shared across processes: interleaved responses fail their checksums) and its open shards."""
        if os.getpid() != self._pid:
            self._pid, self._open, self._store = os.getpid(), OrderedDict(), None

    @property
    def store(self) -> ObjectStore:
        """This process's S3 client (``_this_process``)."""
        self._this_process()
        if self._store is None:
            cfg = self._store_config
            self._store = ObjectStore(cfg) if cfg is not None else ObjectStore.from_env()
        return self._store

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_store=None, _open=OrderedDict(), _pid=-1)  # rebuilt in the worker (spawn)
        return state

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> Any:
        sample = {path: self.read(path) for path in self.samples[index]}
        return self.transform(sample) if self.transform is not None else sample

    # -- reading ------------------------------------------------------------------------------------------------
    def read(self, path: str) -> bytes:
        """One file's bytes, verified against the manifest."""
        entry = self.files.get(path)
        if entry is None:
            raise DatasetNotFound(f"{self.name}@{self.digest} has no file {path!r}")
        if self.cache is None:
            return check_file(self.name, self.digest, entry, read_range(self.store, self.name, entry))
        shard = self._shard(entry.shard)
        data = shard.read(entry.offset, entry.length)
        if file_ok(entry, data):
            return data
        self._open.pop(entry.shard, None)
        self.cache.discard(shard)  # damaged on this node's disk: fetch it again, once
        return check_file(self.name, self.digest, entry, self._shard(entry.shard).read(entry.offset, entry.length))

    def _shard(self, digest: str) -> CachedShard:
        assert self.cache is not None
        self._this_process()
        shard = self._open.get(digest)
        if shard is not None:
            self._open.move_to_end(digest)
            return shard
        key = shard_key(digest, self.name)
        shard = self.cache.open(digest, self.shard_sizes[digest], lambda: self.store.iter_chunks(key))
        self._open[digest] = shard
        while len(self._open) > self.open_shards:
            self._open.popitem(last=False)[1].close()
        return shard

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()


def data_seed(env: Mapping[str, str] | None = None) -> int:
    """The run's data-order seed: ``NURO_DATA_SEED`` (the run record's, exported by the job), else 0."""
    raw = (os.environ if env is None else env).get(NURO_DATA_SEED, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise InvalidInput(f"NURO_DATA_SEED={raw!r} is not a non-negative integer")
    return int(raw)


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


class SnapshotLoader:
    """Batches of this rank's share of the global order, through a torch ``DataLoader`` (its workers read).

    Args:
        dataset: a ``SnapshotDataset``.
        batch_size: samples per rank per step.
        seed: the order's seed (part of the state: a resumed run must use the same one); default
            ``NURO_DATA_SEED`` (``nuro-train submit --data-seed``, recorded with the run; the prolog prefetches the
            shards this order reads first), else 0.
        rank, world_size: default torchrun's (``RANK``/``WORLD_SIZE``), else 0 of 1.
        window: shards shuffled together (``nuro.datasets.order``).
        collate_fn: default torch's ``default_collate`` with a transform, else a plain list of sample dicts.
        **dataloader_kwargs: ``num_workers``, ``pin_memory``, ``prefetch_factor``… passed to ``DataLoader``.
    """

    def __init__(
        self,
        dataset: SnapshotDataset,
        batch_size: int,
        *,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        window: int = DEFAULT_WINDOW,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if batch_size < 1:
            raise InvalidInput(f"batch_size must be at least 1, got {batch_size}")
        env = RunEnv.from_env()
        self.dataset, self.batch_size, self.window = dataset, batch_size, window
        self.rank = env.rank if rank is None else rank
        self.world_size = env.world_size if world_size is None else world_size
        if len(dataset) < self.world_size:
            raise InvalidInput(f"{dataset.name} has {len(dataset)} samples, fewer than the {self.world_size} ranks")
        self.state = LoaderState(dataset.digest, len(dataset), data_seed() if seed is None else seed)
        if collate_fn is None and dataset.transform is None:
            collate_fn = _as_list
        self.collate_fn = collate_fn
        self.dataloader_kwargs = dataloader_kwargs
        self.last_wait_s = 0.0  # how long the last batch kept the training loop waiting
        self.wait_s_total = 0.0
        self.last_indices: list[int] = []  # the dataset indices of the last batch (what this rank just read)

    @property
    def epoch(self) -> int:
        return self.state.epoch

    def state_dict(self) -> dict[str, Any]:
        """Where the run is (global, the same on every rank): save it with the model."""
        return self.state.to_dict()

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        """Continue from a saved position; refuses a state of another snapshot or seed."""
        saved = LoaderState.from_dict(obj)
        self.state.check_same_data(saved)
        self.state = saved

    def _indices(self) -> list[int]:
        s = self.state
        order = epoch_order(self.dataset.groups, s.seed, s.epoch, self.window)
        return [order[p] for p in rank_positions(s.samples, s.position, self.rank, self.world_size)]

    def __iter__(self) -> Iterator[Any]:
        """The rest of the current epoch; afterwards the state is at the start of the next one."""
        from torch.utils.data import DataLoader  # lazy: torch is the optional 'train' extra

        indices = self._indices()
        if not indices:  # a position saved at another world size may leave less than a round: next epoch
            self.state = self.state.advanced(self.state.samples, self.world_size)
            return
        kwargs: dict[str, Any] = {"collate_fn": self.collate_fn} if self.collate_fn else {}
        loader = DataLoader(
            self.dataset, batch_size=self.batch_size, sampler=indices, **kwargs, **self.dataloader_kwargs
        )
        it = iter(loader)
        left = len(indices)
        while left > 0:
            t0 = time.perf_counter()
            batch = next(it)
            self.last_wait_s = time.perf_counter() - t0
            self.wait_s_total += self.last_wait_s
            n = min(self.batch_size, left)
            done = len(indices) - left
            self.last_indices = indices[done : done + n]
            left -= n
            self.state = self.state.advanced(n * self.world_size, self.world_size)
            yield batch

    def batches(self) -> Iterator[Any]:
        """Batches forever, epoch after epoch (step-based training)."""
        while True:
            yield from self


__all__ = ["SnapshotDataset", "SnapshotLoader", "data_seed"]

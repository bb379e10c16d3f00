"""Which sample each rank reads, in which order: a pure function of the snapshot, a seed, the epoch and a position.

Why one *global* order instead of torch's ``DistributedSampler`` (a permutation cut into ``world_size`` slices): the
slices depend on the world size, so a run resized after a node loss (8 ranks → 6) would read different samples
than it would have, and a position saved at 8 ranks means nothing at 6. Here the epoch's order is fixed by
``(seed, epoch)`` alone; ranks share it round-robin from a global ``position``: rank ``r`` of ``W`` reads positions
``position + r``, ``position + r + W``, ... So every global batch of ``B`` samples per rank consumes exactly the
``B * W`` positions ``[position, position + B * W)``, whatever ``W`` is, and the position after any number of steps
is one integer that a resumed run of any size continues from: no sample repeated, none skipped.

The end of an epoch: the last ``(n - position) mod W`` samples (fewer than one per rank) are not read in that epoch,
like ``drop_last``: every rank must take the same number of steps, or a DDP collective waits forever.

Why a *block* shuffle: a full permutation makes every rank read from every shard at once, so a node's cache would
need the whole dataset before its first epoch ends. Shards are visited in a seeded random order and the samples of
each window of ``window`` consecutive shards are shuffled together; all ranks read the same window at a time, so a
node touches ``window`` shards at once and each shard is fetched once per node (``nuro.datasets.cache``).

The order is ``random.Random`` seeded with a string (``sha512`` of it, defined by the language, not by a library
version), so it is the same on every machine and Python release.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nuro.datasets.errors import InvalidInput

LOADER_FORMAT = "nuro.loader/v1"
DEFAULT_WINDOW = 4


def epoch_order(groups: Sequence[int], seed: int, epoch: int, window: int = DEFAULT_WINDOW) -> list[int]:
    """The global order of sample indices in ``epoch``.

    Args:
        groups: ``groups[i]`` is the shard (any integer id) sample ``i`` is read from.
        seed, epoch: the order is a function of these two only.
        window: shards whose samples are shuffled together (1 = shard by shard, large = a full shuffle).
    """
    if window < 1:
        raise InvalidInput(f"window must be at least 1 shard, got {window}")
    rng = random.Random(f"nuro.order:{seed}:{epoch}")
    by_group: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    keys = sorted(by_group)
    rng.shuffle(keys)
    order: list[int] = []
    for start in range(0, len(keys), window):
        block = [i for k in keys[start : start + window] for i in by_group[k]]
        rng.shuffle(block)
        order.extend(block)
    return order


def epoch_end(total: int, world: int) -> int:
    """The position where the epoch ends for ``world`` ranks: the last whole round of ``world`` samples."""
    return total - total % world if world > 0 else 0


def rank_positions(total: int, position: int, rank: int, world: int) -> range:
    """The positions of the epoch order ``rank`` reads from ``position`` on (round-robin, equal count per rank)."""
    if world < 1 or not 0 <= rank < world:
        raise InvalidInput(f"rank {rank} of world size {world} is not a valid rank")
    if not 0 <= position <= total:
        raise InvalidInput(f"position {position} is outside the epoch of {total} samples")
    per_rank = (total - position) // world
    return range(position + rank, position + per_rank * world, world)


@dataclass(frozen=True)
class LoaderState:
    """Where a run is in its data: what goes into the checkpoint next to the model (``SnapshotLoader.state_dict``).

    ``dataset`` (the snapshot digest), ``samples`` and ``seed`` pin the order; ``epoch`` and ``position`` (global
    samples consumed in that epoch, by all ranks together) say where to continue.
    """

    dataset: str
    samples: int
    seed: int
    epoch: int = 0
    position: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"format": LOADER_FORMAT, "dataset": self.dataset, "samples": self.samples, "seed": self.seed,
                "epoch": self.epoch, "position": self.position}  # fmt: skip

    @classmethod
    def from_dict(cls, obj: Any) -> LoaderState:
        if not isinstance(obj, dict) or obj.get("format") != LOADER_FORMAT:
            raise InvalidInput(f"not a nuro loader state (format {LOADER_FORMAT}): {obj!r:.200}")
        try:
            state = cls(str(obj["dataset"]), *(_nonneg(obj[k], k) for k in ("samples", "seed", "epoch", "position")))
        except KeyError as exc:
            raise InvalidInput(f"loader state lacks {exc}") from None
        if state.position > state.samples:
            raise InvalidInput(f"loader state position {state.position} is past the epoch's {state.samples} samples")
        return state

    def check_same_data(self, other: LoaderState) -> None:
        """A saved state continues only the run it was saved from: same snapshot, same samples, same seed."""
        mine, theirs = (self.dataset, self.samples, self.seed), (other.dataset, other.samples, other.seed)
        if mine != theirs:
            raise InvalidInput(
                f"the checkpoint's loader state is for dataset {other.dataset} ({other.samples} samples, seed "
                f"{other.seed}), this loader reads {self.dataset} ({self.samples} samples, seed {self.seed}): resume "
                "with the snapshot and seed the run was started with, or start a new run"
            )

    def advanced(self, consumed: int, world: int) -> LoaderState:
        """After ``consumed`` more global positions; past the epoch's end for ``world`` ranks, the next epoch."""
        position = self.position + consumed
        if position >= epoch_end(self.samples, world):
            return LoaderState(self.dataset, self.samples, self.seed, self.epoch + 1, 0)
        return LoaderState(self.dataset, self.samples, self.seed, self.epoch, position)


def _nonneg(value: Any, name: str) -> int:
    if type(value) is not int or value < 0:
        raise InvalidInput(f"loader state {name} must be a non-negative integer, got {value!r}")
    return value

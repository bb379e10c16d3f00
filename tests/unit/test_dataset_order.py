"""The data order is a pure function of (samples, seed, epoch): one global order, shared round-robin by any number
of ranks from one position, so a run resized mid-epoch continues with exactly the samples not yet seen."""

from __future__ import annotations

import pytest

from nuro.datasets.errors import InvalidInput
from nuro.datasets.order import LoaderState, epoch_end, epoch_order, rank_positions
from nuro.datasets.samples import group_samples

GROUPS = [i // 10 for i in range(100)]  # 100 samples in 10 shards of 10


def _read(order: list[int], state: LoaderState, world: int, batch: int, steps: int | None = None):
    """What ``world`` ranks read step by step from ``state`` (like SnapshotLoader), and the state after."""
    per_rank = [[order[p] for p in rank_positions(state.samples, state.position, r, world)] for r in range(world)]
    seen: list[int] = []
    k = 0
    while per_rank[0][k * batch :] and (steps is None or k < steps):
        n = len(per_rank[0][k * batch : (k + 1) * batch])
        for r in range(world):
            seen += per_rank[r][k * batch : (k + 1) * batch]
        state = state.advanced(n * world, world)
        k += 1
    return seen, state


def test_the_order_is_a_permutation_fixed_by_seed_and_epoch() -> None:
    a = epoch_order(GROUPS, seed=7, epoch=0)
    assert sorted(a) == list(range(100))
    assert a == epoch_order(GROUPS, seed=7, epoch=0)
    assert a != epoch_order(GROUPS, seed=7, epoch=1) and a != epoch_order(GROUPS, seed=8, epoch=0)


def test_a_window_of_shards_is_read_before_the_next() -> None:
    order = epoch_order(GROUPS, seed=1, epoch=0, window=2)
    windows = [{GROUPS[i] for i in order[w : w + 20]} for w in range(0, 100, 20)]
    assert all(len(w) == 2 for w in windows)  # 20 samples = 2 whole shards at a time
    assert set().union(*windows) == set(range(10))


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_world_size_reads_the_same_global_order(world: int) -> None:
    order = epoch_order(GROUPS, 3, 0)
    state = LoaderState("sha256:x", 96, 3)  # 96: divisible by 2, 4 and 8
    seen, after = _read(order[:96], state, world, batch=4)
    assert sorted(seen) == sorted(order[:96])
    # each global batch is a contiguous stretch of the global order, whatever the world size
    assert [sorted(seen[i : i + 4 * world]) for i in range(0, 96, 4 * world)] == [
        sorted(order[i : i + 4 * world]) for i in range(0, 96, 4 * world)
    ]
    assert (after.epoch, after.position) == (1, 0)


def test_ranks_share_disjointly_and_equally() -> None:
    shares = [set(rank_positions(100, 0, r, 8)) for r in range(8)]
    assert all(len(s) == 12 for s in shares)
    assert len(set().union(*shares)) == 96 and epoch_end(100, 8) == 96  # the last 4 (< one per rank) wait


@pytest.mark.parametrize(("before", "after"), [(8, 6), (4, 8), (2, 3), (8, 1)])
def test_a_resized_run_continues_with_exactly_the_samples_not_yet_seen(before: int, after: int) -> None:
    n = 96
    order = epoch_order(GROUPS[:n], 5, 0)
    state = LoaderState("sha256:x", n, 5)
    first, mid = _read(order, state, before, batch=2, steps=3)
    assert mid.position == 3 * 2 * before
    mid = LoaderState.from_dict(mid.to_dict())  # through the checkpoint
    rest, end = _read(order, mid, after, batch=2)
    assert not set(first) & set(rest)  # no repeats
    assert sorted(first + rest) == sorted(order[: epoch_end(n - mid.position, after) + mid.position])  # no skips
    assert end.epoch == 1


def test_saved_state_is_checked() -> None:
    s = LoaderState("sha256:a", 10, 1, epoch=2, position=4)
    assert LoaderState.from_dict(s.to_dict()) == s
    with pytest.raises(InvalidInput, match="format"):
        LoaderState.from_dict({"position": 3})
    with pytest.raises(InvalidInput, match="non-negative"):
        LoaderState.from_dict({**s.to_dict(), "position": -1})
    with pytest.raises(InvalidInput, match="past the epoch"):
        LoaderState.from_dict({**s.to_dict(), "position": 11})
    with pytest.raises(InvalidInput, match="resume with the snapshot and seed"):
        s.check_same_data(LoaderState("sha256:b", 10, 1))
    with pytest.raises(InvalidInput, match="not a valid rank"):
        rank_positions(10, 0, 3, 3)


def test_samples_group_files_by_the_patterns_key() -> None:
    paths = [f"drive-1/{cam}/{f:06d}.jpg" for cam in ("front", "left") for f in (1, 2)] + ["drive-1/README"]
    assert group_samples(paths)[0] == ("drive-1/README",)
    groups = group_samples(paths, r"^([^/]+)/[^/]+/(\d+)\.")
    assert groups == [
        ("drive-1/front/000001.jpg", "drive-1/left/000001.jpg"),
        ("drive-1/front/000002.jpg", "drive-1/left/000002.jpg"),
    ]
    with pytest.raises(InvalidInput, match="matches none"):
        group_samples(paths, r"\.png$")
    with pytest.raises(InvalidInput, match="bad sample pattern"):
        group_samples(paths, "(")

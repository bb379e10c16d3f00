"""Team-owned datasets: the name says the owner, the keys sit under the owner's own prefix (docs/security.md)."""

from __future__ import annotations

import pytest

from nuro.datasets.errors import InvalidInput
from nuro.datasets.manifest import manifest_key, owner_team, shard_key, tag_key, tags_prefix

D = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("name", "owner"),
    [("perception.imagenet", "perception"), ("sim_2.a.b", "sim_2"), ("imagenet", None), ("imagenet-1k.v2", None),
     ("1k.data", None), ("a.b", "a")],
)  # fmt: skip
def test_owner_is_the_part_before_the_first_dot_when_it_is_a_team_name(name: str, owner: str | None) -> None:
    assert owner_team(name) == owner


def test_team_dataset_keys_live_under_the_team_prefix_and_shared_ones_do_not_move() -> None:
    assert manifest_key("perception.imagenet", D) == f"team-datasets/perception/perception.imagenet/manifests/{D}.json"
    assert tag_key("perception.imagenet", "v1") == "team-datasets/perception/perception.imagenet/tags/v1"
    assert tags_prefix("perception.imagenet") == "team-datasets/perception/perception.imagenet/tags/"
    assert shard_key(D, "perception.imagenet") == "team-datasets/perception/shards/sha256/" + "b" * 64
    # shared datasets: the layout of before, so existing snapshots and digests stay valid
    assert manifest_key("imagenet", D) == f"datasets/imagenet/manifests/{D}.json"
    assert shard_key(D, "imagenet") == shard_key(D) == "datasets/shards/sha256/" + "b" * 64


def test_a_name_cannot_reach_another_prefix() -> None:
    for bad in ("../x", "perception/../controls.x", "Perception.x", ".x"):
        with pytest.raises(InvalidInput):
            manifest_key(bad, D)

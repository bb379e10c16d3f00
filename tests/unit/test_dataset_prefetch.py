"""The prolog's dataset prefetch, pure parts: which shards a run reads first (the same as its ranks' loaders, for any
world size), the command rendered for the job's user, and when a job gets none (restart, another team's data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.datasets.errors import InvalidInput
from nuro.datasets.manifest import FileEntry, ShardRef, build_manifest, sha256_digest
from nuro.datasets.order import epoch_order, rank_positions
from nuro.datasets.prefetch import first_shards, prefetch_command
from nuro.jobspec.pins import DatasetPin
from nuro.jobspec.record import job_env, run_record
from nuro.prolog_epilog import prolog
from nuro.protocol import jobcomment
from nuro.protocol.jobrecord import JobRecord
from nuro.wrappers.sdk.data import data_seed


def _digest(i: int) -> str:
    return sha256_digest(f"shard-{i}".encode())


def _manifest(shards: int = 10, per_shard: int = 3, samples: str | None = None, split: bool = False):
    files = []
    for s in range(shards):
        for f in range(per_shard):
            files.append(FileEntry(f"s{s:02d}/f{f}.bin", _digest(s), f * 10, 10, sha256_digest(b"x" * 10)))
    if split:  # each sample's second file lives in the next shard
        for s in range(shards):
            files.append(FileEntry(f"s{s:02d}/f0.json", _digest((s + 1) % shards), 900, 5, sha256_digest(b"y" * 5)))
    return build_manifest("demo", "2026-12-04T00:00:00Z", files, [ShardRef(_digest(s), 1000) for s in range(shards)],
                          samples)  # fmt: skip


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_the_first_shards_are_what_every_rank_reads_first_at_any_world_size(world: int) -> None:
    m = _manifest()
    samples, groups = m.sample_shards()
    order = epoch_order(groups, 7, 0)
    first = first_shards(m, seed=7, count=4)
    shard_of = {f.path: f.shard for f in m.files}
    batch = 12 // world  # one window of 4 shards x 3 samples is the first global step
    for rank in range(world):
        positions = rank_positions(len(samples), 0, rank, world)[:batch]
        assert {shard_of[p] for i in positions for p in samples[order[i]]} <= set(first)
    assert len(first) == 4 == len(set(first))


def test_the_list_follows_first_use_is_bounded_and_depends_on_the_seed() -> None:
    m = _manifest()
    assert first_shards(m, 7, 0) == []
    assert sorted(first_shards(m, 7, 99)) == sorted(s.digest for s in m.shards)
    assert first_shards(m, 7, 4) == first_shards(m, 7, 99)[:4] == first_shards(m, 7, 4)
    assert {tuple(first_shards(m, seed, 4)) for seed in range(6)} != {tuple(first_shards(m, 0, 4))}


def test_every_shard_of_a_grouped_sample_is_fetched() -> None:
    m = _manifest(samples=r"^(s\d+)/f0\.", split=True)  # one sample per shard dir: its f0.bin and f0.json
    samples, groups = m.sample_shards()
    first_sample = samples[epoch_order(groups, 3, 0)[0]]
    shard_of = {f.path: f.shard for f in m.files}
    assert first_shards(m, 3, 2) == [shard_of[p] for p in first_sample]  # f0.bin's shard, then f0.json's


def test_the_command_is_data_for_the_jobs_user() -> None:
    cmd = prefetch_command("/v/python", "demo", "sha256:" + "a" * 64, "perception", 7, 4, 120.0, Path("/s/9/p.json"))
    assert cmd[:3] == ["/v/python", "-m", "nuro.datasets.prefetch"]
    assert cmd[cmd.index("--seed") + 1] == "7" and cmd[cmd.index("--timeout-s") + 1] == "120"


def _rec(team: str | None = "perception", restart: int = 0) -> JobRecord:
    return JobRecord(81, 1001, 1001, "alice", "perception", team, None, restart, "gpu001", None)


def _comment(name: str, seed: object = None) -> str:
    meta: dict = {"v": 1, "dataset": {"name": name, "digest": "sha256:" + "b" * 64}}
    if seed is not None:
        meta["data"] = {"seed": seed}
    return jobcomment.merge(None, nuro=meta)  # the canonical form Slurm carries


@pytest.fixture
def node_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("NURO_DATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NURO_STAGING_ROOT", str(tmp_path / "staging"))
    monkeypatch.delenv("NURO_DATA_PREFETCH_SHARDS", raising=False)
    return tmp_path


def test_a_first_attempt_of_its_teams_or_shared_data_is_prefetched(node_env: Path) -> None:
    cmd = prolog.prefetch_plan(_rec(), _comment("perception.multicam", 11), python="py")
    assert cmd is not None and cmd[cmd.index("--team") + 1] == "perception"
    assert cmd[cmd.index("--seed") + 1] == "11" and cmd[cmd.index("--shards") + 1] == "4"
    assert cmd[cmd.index("--report") + 1] == str(node_env / "staging" / "81" / "prefetch.json")
    shared = prolog.prefetch_plan(_rec(), _comment("imagenet", "7; rm -rf /"), python="py")
    assert shared is not None and shared[shared.index("--seed") + 1] == "0"  # a seed that is no integer: 0


def test_no_prefetch_for_another_teams_data_a_requeue_no_team_or_no_cache(
    node_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert prolog.prefetch_plan(_rec(), _comment("prediction.lidar")) is None
    assert prolog.prefetch_plan(_rec(restart=1), _comment("perception.multicam")) is None
    assert prolog.prefetch_plan(_rec(team=None), _comment("imagenet")) is None
    assert prolog.prefetch_plan(_rec(), jobcomment.merge(None, nuro={"v": 1})) is None
    assert prolog.prefetch_plan(_rec(), None) is None
    monkeypatch.setenv("NURO_DATA_PREFETCH_SHARDS", "0")
    assert prolog.prefetch_plan(_rec(), _comment("imagenet")) is None
    monkeypatch.setenv("NURO_DATA_PREFETCH_SHARDS", "2")
    monkeypatch.delenv("NURO_DATA_CACHE_DIR")
    assert prolog.prefetch_plan(_rec(), _comment("imagenet")) is None


def test_the_prefetch_sees_no_key_of_the_node() -> None:
    assert not [k for k in prolog.PREFETCH_ENV if "KEY" in k or "TOKEN" in k or k.startswith("AWS_")]


def test_the_seed_is_recorded_with_the_run_and_exported() -> None:
    pin = DatasetPin("perception.multicam", "sha256:" + "c" * 64)
    kw = {"team": "perception", "dataset": pin, "code": None, "ckpt_interval_s": 60, "ckpt_keep": 3, "max_requeues": 3}
    meta = run_record(**kw, data_seed=42)
    assert meta["data"] == {"seed": 42} and job_env(meta)["NURO_DATA_SEED"] == "42"
    plain = run_record(**kw)
    assert "data" not in plain and "NURO_DATA_SEED" not in job_env(plain)  # seed 0: the record's bytes as before


def test_the_loaders_default_seed_is_the_runs() -> None:
    assert data_seed({}) == 0 and data_seed({"NURO_DATA_SEED": "42"}) == 42
    with pytest.raises(InvalidInput, match="NURO_DATA_SEED"):
        data_seed({"NURO_DATA_SEED": "-1"})

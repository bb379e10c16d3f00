"""Which files of a DeepSpeed checkpoint each rank's node uploads and needs (nuro.checkpoint.dsfiles), from the
names DeepSpeed 0.19.8 wrote here (docs/deepspeed.md)."""

from __future__ import annotations

from nuro.checkpoint import dsfiles

ZERO2 = ["mp_rank_00_model_states.pt"] + [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)]
ZERO3 = [f"zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt" for r in range(2) for kind in ("model", "optim")]
DCP = [".metadata", "__0_0.distcp", "__1_0.distcp"]


def test_ranks_of_files() -> None:
    assert dsfiles.file_rank("mp_rank_00_model_states.pt") is None
    assert dsfiles.file_rank("zero_pp_rank_12_mp_rank_00_optim_states.pt") == 12
    assert dsfiles.file_rank("bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt") == 3
    assert dsfiles.file_rank("zero_pp_rank_1_mp_rank_00_model_states.pt") == 1  # ZeRO-3's per-rank partition
    assert dsfiles.file_rank("zero_pp_rank_1_mp_rank_00_optim_states.pt.tmp") is None


def test_a_node_needs_the_model_states_and_only_its_own_shards() -> None:
    node1 = {2, 3}
    assert [p for p in ZERO2 if dsfiles.needed(p, node1)] == [ZERO2[0], ZERO2[3], ZERO2[4]]
    assert [p for p in ZERO3 if dsfiles.needed(p, {0})] == ZERO3[:2]


def test_only_rank_0s_node_uploads_the_model_states() -> None:
    assert [dsfiles.owner_rank(p) for p in ZERO2] == [0, 0, 1, 2, 3]


def test_formats_are_told_apart() -> None:
    assert dsfiles.is_deepspeed(ZERO2) and dsfiles.is_deepspeed(ZERO3)
    assert not dsfiles.is_deepspeed(DCP) and not dsfiles.is_deepspeed([])
    assert not dsfiles.model_parallel(ZERO2)
    assert dsfiles.model_parallel(["mp_rank_01_model_states.pt"]) and dsfiles.is_deepspeed(
        ["zero_pp_rank_0_mp_rank_01_optim_states.pt"]
    )


def test_the_prolog_tells_a_nodes_share_from_the_manifest_alone() -> None:
    """4 ranks on 2 nodes: node 1 ran ranks 2 and 3 (nuro's launchers number ranks contiguously per node)."""
    paths = [dsfiles.MODEL_STATES] + [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)]
    need = dsfiles.node_need(paths, world_size=4, parts=2, node_index=1)
    assert need is not None and [p for p in paths if need(p)] == [paths[0], paths[3], paths[4]]
    assert [p for p in paths if dsfiles.node_need(paths, 4, 2, 0)(p)] == paths[:3]  # type: ignore[misc]
    # every file where the share cannot be told: DCP, uneven split, a node outside the gang, model parallelism
    assert dsfiles.node_need(["__0_0.distcp", ".metadata"], 2, 2, 0) is None
    assert dsfiles.node_need(paths, 4, 3, 0) is None
    assert dsfiles.node_need(paths, 4, 2, 2) is None and dsfiles.node_need(paths, 4, 2, -1) is None
    assert dsfiles.node_need([*paths, "mp_rank_01_model_states.pt"], 4, 2, 0) is None
    # a forged manifest's world size costs root nothing (a range is checked, never built)
    huge = dsfiles.node_need(paths, 2 * 10**15, 2, 1)
    assert huge is not None and huge("zero_pp_rank_1000000000000001_mp_rank_00_optim_states.pt") and not huge(paths[1])


def test_gang_position_comes_from_slurms_node_list() -> None:
    from nuro.checkpoint.manifest import FileEntry, Manifest
    from nuro.prolog_epilog.prolog import gang_position
    from nuro.protocol.jobrecord import JobRecord

    rec = JobRecord(7, 1000, 1000, "alice", "perception", "perception", "run", 0, "gpu003", None)
    env = {"SLURM_JOB_NODELIST": "gpu[002-003]"}
    gang = gang_position(rec, env)
    assert gang is not None and (gang.index, gang.nodes) == (1, 2)
    names = (
        dsfiles.MODEL_STATES,
        "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt",
    )
    shards = tuple(FileEntry(p, 1, "0" * 64) for p in names)
    m = Manifest("perception", "run", 5, "6", 0, "2026-12-04T00:00:00Z", None, 2, 2, shards, 3)
    need = gang.need_of(m)
    assert need is not None and [s.path for s in shards if need(s.path)] == [shards[0].path, shards[2].path]
    assert gang_position(rec, {"SLURM_JOB_NODELIST": "gpu[002-005]"}).need_of(m) is None  # another gang size
    assert gang_position(rec, {}) is None and gang_position(rec, {"SLURM_JOB_NODELIST": "gpu[1-"}) is None
    assert gang_position(rec, {"SLURM_JOB_NODELIST": "gpu001"}) is None  # not this node's job
    # 22.05's prolog at allocation has no node list: Slurm is asked, once
    asked: list[int] = []
    gang = gang_position(rec, {}, ask_slurm=lambda job: asked.append(job) or ["gpu002", "gpu003"])
    assert gang is not None and (gang.index, gang.nodes, asked) == (1, 2, [7])
    assert gang_position(rec, {"SLURM_JOB_NODELIST": "gpu[002-003]"}, ask_slurm=lambda job: 1 / 0) is not None

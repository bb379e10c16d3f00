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

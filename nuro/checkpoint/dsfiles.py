"""Which files of a DeepSpeed checkpoint belong to which rank, and which ones a node needs to load it. Pure.

``engine.save_checkpoint(dir, tag)`` writes ``dir/<tag>/`` (DeepSpeed 0.19.8, measured, docs/deepspeed.md):

- ``mp_rank_00_model_states.pt``: weights, global step, client state, config (rank 0; with
  ``checkpoint.use_node_local_storage`` also each node's local rank 0); DeepSpeed's ``zero_to_fp32.py`` goes beside
  the tag dirs, not into one (it ships with DeepSpeed: ``python -m deepspeed.utils.zero_to_fp32``);
- ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt`` (``bf16_zero_...`` with bf16): rank r's ZeRO optimizer shard;
  under ZeRO-3 also ``zero_pp_rank_<r>_mp_rank_00_model_states.pt``, rank r's parameter partition.

``load_checkpoint(dir, tag)`` on rank r opens the rank-less files and only its own ``pp_rank_<r>`` files (it checks
nothing about the others), so a node needs the rank-less files plus its own ranks' files, not the whole step: at
16 nodes that is 1/16 of the optimizer state per node instead of all of it.

Only data parallelism is covered (``mp_rank_00``): with tensor or pipeline parallelism the ``mp_rank`` and the data
parallel rank in a name no longer equal the global rank, so such a checkpoint is refused by the Checkpointer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable

MODEL_STATES = "mp_rank_00_model_states.pt"
_RANK_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_00_(?:optim|model)_states\.pt$")
_MP_FILE = re.compile(r"mp_rank_([0-9]+)_")


def file_rank(relpath: str) -> int | None:
    """The data-parallel rank whose shard ``relpath`` is, or None for a file every rank reads (model states)."""
    m = _RANK_FILE.match(relpath)
    return int(m.group(1)) if m else None


def is_deepspeed(paths: Iterable[str]) -> bool:
    """Does a checkpoint with these files come from ``engine.save_checkpoint`` (not from DCP)?"""
    return any(
        p == MODEL_STATES or _RANK_FILE.match(p) or (_MP_FILE.search(p) and p.endswith("_states.pt")) for p in paths
    )


def model_parallel(paths: Iterable[str]) -> bool:
    """Files of a model-parallel rank other than 0 (tensor/pipeline parallelism): not covered here."""
    return any((m := _MP_FILE.search(p)) and int(m.group(1)) != 0 for p in paths)


def needed(relpath: str, ranks: Collection[int]) -> bool:
    """Must a node running ``ranks`` have ``relpath`` to load the checkpoint? Rank-less files always."""
    rank = file_rank(relpath)
    return rank is None or rank in ranks


def node_need(paths: Collection[str], world_size: int, parts: int, node_index: int) -> Callable[[str], bool] | None:
    """The files node ``node_index`` of a job on ``parts`` nodes needs of a step with these ``paths``, written at
    ``world_size`` by ``parts`` nodes; None (every file) when that cannot be told.

    For the prolog, which knows the job's node list but not its ranks: nuro's launchers number ranks contiguously
    per node (``RANK = SLURM_NODEID × ranks per node + local rank``, the same count on every node), so node i of
    the same gang ran ranks ``i·k … i·k + k − 1`` with ``k = world_size / parts``. Anything else (a DCP step, model
    parallelism, an uneven split, a node outside the gang) gets every file: a wrong subset would only make the job
    download the rest itself, but every file is never wrong."""
    if parts < 1 or world_size % parts or not 0 <= node_index < parts:
        return None
    if not is_deepspeed(paths) or model_parallel(paths):
        return None
    k = world_size // parts
    mine = range(node_index * k, node_index * k + k)  # a range, not a set: the manifest's world size is the job's word
    return lambda relpath: needed(relpath, mine)


def owner_rank(relpath: str) -> int:
    """The rank whose node uploads ``relpath``: a shard's own rank; rank 0 for the rank-less files (other nodes
    may hold copies of them with ``use_node_local_storage``, which must not be uploaded twice)."""
    rank = file_rank(relpath)
    return 0 if rank is None else rank


__all__ = ["MODEL_STATES", "file_rank", "is_deepspeed", "model_parallel", "needed", "node_need", "owner_rank"]

"""The stop markers a job's ranks leave for ``nuro-launch`` in ``NURO_LAUNCH_STOP_DIR``: writer and reader in one
place (the launcher reads, the SDK's ``PreemptionGuard`` writes; before, the launcher imported the SDK for the name).

* ``rank-<N>`` holding ``committed``: rank N's guard decided to exit 75 after its checkpoint; however the process
  ends from there on, its node's verdict is "restart me".
* ``move`` holding a node name: rank 0 asked to leave a straggling node (a MOVE stop); the launcher swaps that node
  for a spare.

Each file appears whole or not at all (written beside, then renamed). Standard library only: the SDK imports this
in every rank.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from nuro.names import is_decimal, is_node
from nuro.protocol.envnames import NURO_LAUNCH_STOP_DIR
from nuro.safeio.atomic import write_atomic

log = logging.getLogger(__name__)

#: The file naming the node a MOVE stop leaves.
MOVE_MARKER = "move"
_RANK_PREFIX = "rank-"
_COMMITTED = "committed"


def write(name: str, text: str, what: str) -> None:
    """``<NURO_LAUNCH_STOP_DIR>/<name>`` holding ``text``, whole or not at all (no stop dir outside nuro-launch: no
    marker). Never raises: a marker that cannot be written is logged, the stop goes on."""
    stop_dir = os.environ.get(NURO_LAUNCH_STOP_DIR)
    if not stop_dir:
        return
    try:
        os.makedirs(stop_dir, exist_ok=True)
        write_atomic(Path(stop_dir, name), text + "\n", durable=False)  # read by this step's launcher only
    except OSError as exc:
        log.warning("%s marker not written to %s (%s)", what, stop_dir, exc)


def mark_stopped(rank: int) -> None:
    """Rank ``rank`` leaves by its guard's decision (exit 75). Never raises."""
    write(f"{_RANK_PREFIX}{rank}", _COMMITTED, f"rank {rank}: stop")


def mark_move(node: str) -> None:
    """The job leaves ``node`` (a straggler's). Never raises."""
    write(MOVE_MARKER, node, "move")


def stopped_ranks(stop_dir: Path | None) -> frozenset[int]:
    """The ranks whose guard left its ``rank-<N>`` marker in ``stop_dir`` (decided to exit 75)."""
    names = (p.name.removeprefix(_RANK_PREFIX) for p in (stop_dir.glob(f"{_RANK_PREFIX}*") if stop_dir else ()))
    return frozenset(int(n) for n in names if is_decimal(n))


def move_request(stop_dir: Path) -> str | None:
    """The node a MOVE stop leaves (rank 0's ``PreemptionGuard.request_move`` marker), if well-formed."""
    try:
        node = (stop_dir / MOVE_MARKER).read_text(errors="replace").strip()
    except OSError:
        return None
    return node if is_node(node) else None


__all__ = ["MOVE_MARKER", "mark_move", "mark_stopped", "move_request", "stopped_ranks", "write"]

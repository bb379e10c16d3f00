"""Which staged steps can never commit, so that nothing waits for them. Pure: the caller reads S3 and Slurm.

Why (issue 31): a checkpoint step commits only when every node's share (its *part*) is in S3. When a node of the
job dies while the job saves, its part never arrives, and the epilog of every surviving node used to wait for it
until the flush timeout (60 s in the dev cluster, 120 s by default): the requeued job became eligible only after
the slowest epilog, 85 s after the failure in the DeepSpeed demo. Two facts settle such a step at once:

- **torn here**: at the epilog the job's processes on this node are gone, so a step dir of this job that has no
  upload request from this node will never get one; this node's part of that step can never be uploaded.
- **writer lost**: a part missing from S3 whose writer node (``UploadRequest.writers``) Slurm reports DOWN or not
  responding will never arrive either (a live node's epilog uploads its part, or says "torn" as above).

Either gives the step up (``incomplete.json``, never a manifest), and the other nodes' workers see that and stop
waiting too. A part that is merely slow (its node alive, uploading) is still waited for, up to the flush timeout.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

#: Slurm node states (``NodeInfo.flags`` words) of a node whose epilog will never run for the job.
LOST_NODE_FLAGS = frozenset({"DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "POWERED_DOWN", "POWER_DOWN"})


def missing_parts(parts_expected: int, present: Iterable[int]) -> list[int]:
    """Parts of a step not (yet) in S3, in order."""
    return sorted(set(range(parts_expected)) - set(present))


def writers_to_ask(writers: Sequence[str], missing: Iterable[int]) -> list[str]:
    """The nodes whose state decides a step: the writers of its missing parts (none when writers are unknown)."""
    return sorted({writers[p] for p in missing if 0 <= p < len(writers)})


def lost_writer_reason(writers: Sequence[str], missing: Iterable[int], lost: Collection[str]) -> str | None:
    """Why the step can never commit, or None while every missing part's writer may still deliver it.

    ``writers``: the node of each part (the request's; empty = unknown, then nothing is decided here); ``missing``:
    parts not in S3; ``lost``: nodes Slurm reports gone (``node_is_lost``)."""
    gone = [(p, writers[p]) for p in sorted(set(missing)) if 0 <= p < len(writers) and writers[p] in lost]
    if not gone:
        return None
    named = ", ".join(f"{node} (part {p})" for p, node in gone)
    return f"its writer node {named} was lost before its share was uploaded: the step can never commit"


def node_is_lost(flags: Collection[str]) -> bool:
    """Slurm says the node is gone: DOWN, not responding or failing (a drained node still runs its epilog)."""
    return bool(LOST_NODE_FLAGS.intersection(flags))


TORN_REASON = "this node's share was never finished (the job ended while it was written): the step can never commit"

__all__ = ["LOST_NODE_FLAGS", "TORN_REASON", "lost_writer_reason", "missing_parts", "node_is_lost", "writers_to_ask"]

"""The job's comment channel (``nuro-job``): concurrent writers in one process keep each other's keys."""

from __future__ import annotations

import threading
import time

from nuro.protocol import jobcomment
from nuro.wrappers import jobchannel


class SlowComment:
    """A job comment behind a read-merge-write as slow as slurmctld under load: the window where a second writer
    in the same process read the comment before the first one's write and dropped its key."""

    def __init__(self) -> None:
        self.comment = jobcomment.merge(None, nuro={"v": 1, "team": "perception"})

    def merge_comment(self, job_id: int, **updates: object) -> str:
        current = self.comment
        time.sleep(0.05)
        self.comment = jobcomment.merge(current, **updates)
        return self.comment


def test_the_ack_and_the_checkpoint_mark_written_together_both_stay() -> None:
    """Rank 0's checkpoint recorder thread and the preemption guard write after the same commit (CI: the ack was
    lost to the step's ckpt mark and the run requeued with no ack on record)."""
    backend = SlowComment()
    threads = [
        threading.Thread(target=jobchannel.record_checkpoint, args=(58,), kwargs={"job_id": 8, "backend": backend}),
        threading.Thread(target=jobchannel.acknowledge_preemption, args=(58,),
                         kwargs={"job_id": 8, "backend": backend, "why": "preempted"}),
    ]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    marks = jobcomment.parse(backend.comment)
    assert marks.checkpoint is not None and marks.checkpoint.step == 58
    assert marks.ack is not None and marks.ack.step == 58
    assert marks.record["team"] == "perception"

"""The job's comment channel (``nuro-job``): concurrent writers in one process keep each other's keys."""

from __future__ import annotations

import threading
import time

from nuro.protocol import jobcomment
from nuro.slurm import Backend
from nuro.wrappers import jobchannel


class SlowComment:
    """A job comment as slow to read as slurmctld under load: the window where a second writer in the same process
    read the comment before the first one's write and dropped its key. Its read-merge-write is the backends' own."""

    merge_comment = Backend.merge_comment

    def __init__(self) -> None:
        self.comment = jobcomment.merge(None, nuro={"v": 1, "team": "perception"})

    def job_comment(self, job_id: int) -> str:
        current = self.comment
        time.sleep(0.05)
        return current

    def update_comment(self, job_id: int, comment: str) -> None:
        self.comment = comment


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

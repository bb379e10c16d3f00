"""Root's notes to a job's owner (``admin_comment``): every writer's note fits Slurm's 1,024 bytes whatever its text,
and a note Slurm refuses never stops the action it explains (issue 30)."""

from __future__ import annotations

import logging

import pytest

from nuro.protocol import adminnote, jobcomment
from nuro.slurm import SlurmError
from nuro.slurm_plugins.controller.apply import apply_decision
from nuro.slurm_plugins.controller.decisions import Preempt


@pytest.mark.parametrize("why", ["", "short", "x" * 5000, "é" * 3000, "\u2603" * 2000 + "\n" * 10, '"\\' * 900])
@pytest.mark.parametrize("key", adminnote.KEYS)
def test_every_note_fits_slurms_cap_and_reads_back(key: str, why: str) -> None:
    note = adminnote.render(key, why, at=1_800_000_000, node="gpu001", **{"for": 4_294_967_295})
    assert len(note.encode()) <= jobcomment.SLURM_TEXT_MAX == 1024
    back = adminnote.parse(note)[key]
    assert back["at"] == 1_800_000_000 and back["why"] == why.replace("\n", " ") or back["why"].endswith("...")


def test_anything_else_in_the_field_is_no_note() -> None:
    assert adminnote.parse(None) == {} and adminnote.parse("an admin's own words") == {}
    assert adminnote.parse('{"preempt":"x","other":{"a":1}}') == {}
    with pytest.raises(ValueError, match="not one of"):
        adminnote.render("ack", "x")


class Refusing:
    """Slurm refusing the note (e.g. a site's own admin tooling wrote something odd) but taking the signal."""

    def __init__(self) -> None:
        self.signalled: list[tuple[int, str]] = []

    def update_admin_comment(self, job_id: int, text: str) -> None:
        raise SlurmError("Pathname of a file, directory or other parameter too long", argv=["scontrol"])

    def signal(self, job_id: int, sig: str, full: bool = False) -> None:
        self.signalled.append((job_id, sig))


def test_a_refused_note_never_stops_the_signal_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    backend = Refusing()
    decision = Preempt(job_id=7, team="perception", gpus=8, work_lost_gpu_s=0.0, for_job_id=9, reason="reclaim")
    with caplog.at_level(logging.WARNING):
        first = apply_decision(backend, decision, 1_800_000_000)  # type: ignore[arg-type]
        second = apply_decision(backend, decision, 1_800_000_001)  # type: ignore[arg-type]
    assert first.applied and second.applied and backend.signalled == [(7, "USR1"), (7, "USR1")]
    assert "owner's note not written" in first.message
    assert sum("preemption note not written" in r.message for r in caplog.records) == 1

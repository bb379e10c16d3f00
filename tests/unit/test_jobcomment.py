"""The job comment record: parse tolerantly, merge without losing the other side's keys."""

from __future__ import annotations

import json

import pytest

from nuro import jobcomment


def test_parse_reads_checkpoint_preempt_and_ack() -> None:
    rec = jobcomment.parse(
        '{"nuro":{"team":"perception"},"ckpt":{"step":40,"at":100.5},"preempt":{"at":200,"for":7,"why":"reclaim"},'
        '"ack":{"step":42,"at":205.25}}'
    )
    assert rec.checkpoint == jobcomment.Mark(step=40, at=100.5)
    assert rec.preempt == jobcomment.PreemptRequest(at=200.0, for_job=7, why="reclaim")
    assert rec.ack == jobcomment.Mark(step=42, at=205.25)
    assert rec.acked_since(200.0) and rec.acked_since(205.25) and not rec.acked_since(206)


@pytest.mark.parametrize("text", [None, "", "plain words", "[1,2]", "{bad json", '{"ckpt":"x","ack":{"at":"soon"}}'])
def test_anything_else_is_an_empty_record(text: str | None) -> None:
    rec = jobcomment.parse(text)
    assert rec.checkpoint is None and rec.ack is None and rec.preempt is None


def test_merge_keeps_other_keys_and_deletes_with_none() -> None:
    base = '{"nuro":{"run":"r1"},"preempt":{"at":1}}'
    merged = jobcomment.merge(base, ack={"step": 3, "at": 2.0})
    assert json.loads(merged) == {"nuro": {"run": "r1"}, "preempt": {"at": 1}, "ack": {"step": 3, "at": 2.0}}
    assert json.loads(jobcomment.merge(merged, preempt=None)) == {"nuro": {"run": "r1"}, "ack": {"step": 3, "at": 2.0}}
    assert " " not in merged and "\n" not in merged  # one compact line: a single scontrol argument


def test_merge_keeps_a_plain_text_comment() -> None:
    assert json.loads(jobcomment.merge("my note", ckpt={"step": 1, "at": 1})) == {
        "user_comment": "my note",
        "ckpt": {"step": 1, "at": 1},
    }


def test_merge_refuses_to_grow_past_the_limit() -> None:
    with pytest.raises(ValueError, match="bytes, above nuro's 8192"):
        jobcomment.merge("{}", blob="x" * 9000)

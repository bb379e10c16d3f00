"""The job comment record: one strict parser (canonical form only), merge without losing the other side's keys."""

from __future__ import annotations

import json

import pytest

from nuro.protocol import jobcomment


def test_parse_reads_checkpoint_preempt_and_ack() -> None:
    rec = jobcomment.parse(
        '{"ack":{"at":205,"step":42},"ckpt":{"at":100,"step":40},"nuro":{"team":"perception"},'
        '"preempt":{"at":200,"for":7,"sig":"ab","why":"reclaim"}}'
    )
    assert rec.not_record is None
    assert rec.checkpoint == jobcomment.Mark(step=40, at=100.0)
    assert rec.preempt == jobcomment.PreemptRequest(at=200.0, for_job=7, why="reclaim", sig="ab")
    assert rec.ack == jobcomment.Mark(step=42, at=205.0)
    assert rec.acked_since(200.0) and rec.acked_since(205) and not rec.acked_since(206)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (None, None),
        ("", None),
        ("plain words", "it does not start with {"),
        ("[1,2]", "it does not start with {"),
        ("{bad json", "unexpected 'b' at byte 2"),
        ('{"ack":{"at":"soon"},"ckpt":"x"}', None),  # a record, but no usable marks
        ('{"ckpt": {"at": 1, "step": 2}}', "a space or line break at byte 9 (the canonical form has none)"),
        ('{"ckpt":{"at":1.5,"step":2}}', "a number at byte 15 that is not a whole number (nuro writes integers only)"),
        ('{"ckpt":{"step":2,"at":1}}', 'key "at" at byte 19 is out of order (after "step")'),
        ('{"ckpt":{"at":1,"step":2},"ckpt":{"at":9,"step":9}}', 'key "ckpt" given twice at byte 27'),
    ],
)
def test_anything_else_is_an_empty_record(text: str | None, why: str | None) -> None:
    rec = jobcomment.parse(text)
    assert rec.checkpoint is None and rec.ack is None and rec.preempt is None
    assert rec.not_record == why


def test_escaped_key_is_not_the_key() -> None:
    """A JSON library reads "nu\\u0072o" as "nuro"; the one parser does not read it at all."""
    text = '{"nu\\u0072o":{"team":"prediction"}}'
    assert json.loads(text) == {"nuro": {"team": "prediction"}}
    assert jobcomment.record(text) is None and jobcomment.parse(text).raw == {}
    assert "needless escape \\u0072 at byte 5" in jobcomment.reason(text)


def test_merge_keeps_other_keys_and_deletes_with_none() -> None:
    base = '{"nuro":{"run":"r1"},"preempt":{"at":1}}'
    merged = jobcomment.merge(base, ack={"step": 3, "at": 2})
    assert json.loads(merged) == {"nuro": {"run": "r1"}, "preempt": {"at": 1}, "ack": {"step": 3, "at": 2}}
    assert json.loads(jobcomment.merge(merged, preempt=None)) == {"nuro": {"run": "r1"}, "ack": {"step": 3, "at": 2}}
    assert merged == jobcomment.canonical(json.loads(merged)) and jobcomment.record(merged) is not None


def test_merge_keeps_a_plain_text_comment() -> None:
    assert json.loads(jobcomment.merge("my note", ckpt={"step": 1, "at": 1})) == {
        "user_comment": "my note",
        "ckpt": {"step": 1, "at": 1},
    }
    # a non-canonical JSON comment is kept as text too: nothing in it is read as a record
    spaced = '{"nuro": {"team": "x"}}'
    assert json.loads(jobcomment.merge(spaced, ack={"at": 1}))["user_comment"] == spaced


def test_merge_refuses_what_would_not_read_back() -> None:
    with pytest.raises(ValueError, match="not a whole number"):
        jobcomment.merge(None, ack={"step": 1, "at": 1.5})
    with pytest.raises(ValueError, match="more than 15 digits"):
        jobcomment.merge(None, ckpt={"step": 10**15, "at": 1})


def test_merge_refuses_to_grow_past_the_limit() -> None:
    with pytest.raises(ValueError, match="bytes, above nuro's 8192"):
        jobcomment.merge("{}", blob="x" * 9000)

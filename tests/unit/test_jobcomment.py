"""The job comment record: one strict parser (canonical form only), within Slurm's 1,024 bytes."""

from __future__ import annotations

import json

import pytest

from nuro.protocol import jobcomment


def test_parse_reads_the_run_record_and_keeps_other_keys_untouched() -> None:
    rec = jobcomment.parse('{"ack":{"at":205,"step":42},"nuro":{"team":"perception"}}')
    assert rec.not_record is None
    assert rec.record == {"team": "perception"}
    assert rec.raw["ack"] == {"at": 205, "step": 42}  # kept, never read: progress travels through the agents


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
    assert rec.record == {}
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


def test_merge_refuses_to_grow_past_slurms_cap() -> None:
    with pytest.raises(ValueError, match="1,030 bytes, 6 over the 1,024 Slurm allows in a job comment; longest"):
        jobcomment.merge(None, blob="x" * 1019)
    assert len(jobcomment.merge(None, blob="x" * 1013)) == 1024  # exactly the cap: a record


def test_the_budget_is_slurms_cap_and_the_message_says_what_to_shorten() -> None:
    """Issue 30: slurmctld refuses a comment over 1,024 bytes for everyone; nothing is appended after submit, so the
    record may use it all, and a longer one is refused up front with the bytes over and the longest fields."""
    assert jobcomment.MAX_COMMENT_BYTES == jobcomment.SLURM_TEXT_MAX == 1024
    rec = {"nuro": {"team": "perception", "code": {"repo": "r" * 300}, "entry": {"args": ["a" * 40] * 20}}}
    text = jobcomment.canonical(rec)
    report = jobcomment.size_report(text)
    assert report.startswith(f"{len(text):,} bytes, {len(text) - 1024:,} over the 1,024 Slurm allows")
    assert "longest: nuro.entry.args 861 bytes, nuro.code.repo 302 bytes" in report
    assert jobcomment.size_report('{"nuro":{}}') == "11 of 1,024 bytes (1,013 left)"
    assert jobcomment.reason(text).endswith("(shorten the run name, the code repo path or the entry's arguments)")

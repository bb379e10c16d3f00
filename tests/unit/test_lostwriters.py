"""The pure rules that settle a staged step which can never commit (``nuro.checkpoint.lostwriters``), and the
``writers`` field of the upload request they read."""

from __future__ import annotations

import pytest

from nuro.checkpoint.errors import ManifestError
from nuro.checkpoint.lostwriters import lost_writer_reason, missing_parts, node_is_lost, writers_to_ask
from nuro.checkpoint.manifest import UploadRequest, parse_request
from nuro.wrappers.sdk.checkpointer import _writers


def test_missing_parts_are_the_expected_ones_not_in_s3() -> None:
    assert missing_parts(3, [0, 2]) == [1]
    assert missing_parts(2, [1, 0, 7]) == []


def test_only_the_writers_of_missing_parts_are_asked_and_unknown_writers_decide_nothing() -> None:
    assert writers_to_ask(("n1", "n2", "n3"), [2, 1]) == ["n2", "n3"]
    assert writers_to_ask((), [0, 1]) == []
    assert lost_writer_reason((), [1], {"n2"}) is None


def test_a_missing_part_whose_writer_is_lost_settles_the_step() -> None:
    writers = ("n1", "n2", "n3")
    assert lost_writer_reason(writers, [1], set()) is None  # alive: its epilog may still upload it
    assert lost_writer_reason(writers, [1], {"n3"}) is None  # n3's part is in S3 already
    reason = lost_writer_reason(writers, [1, 2], {"n2", "n3"})
    assert reason == (
        "its writer node n2 (part 1), n3 (part 2) was lost before its share was uploaded: the step can never commit"
    )


@pytest.mark.parametrize(
    ("flags", "lost"),
    [
        ({"IDLE"}, False),
        ({"ALLOCATED", "DRAIN"}, False),  # drained, alive: its epilog runs
        ({"DOWN"}, True),
        ({"IDLE", "NOT_RESPONDING"}, True),
        ({"MIXED", "FAIL"}, True),
    ],
)
def test_lost_means_down_or_not_responding(flags: set[str], lost: bool) -> None:
    assert node_is_lost(flags) is lost


def _request(**extra: object) -> dict:
    return {
        "format": "nuro.checkpoint-upload/v1", "team": "vision", "run": "r", "step": 5, "job_id": "12",
        "restart": 0, "part": 0, "parts_expected": 2, "world_size": 2, "files": [], "created_at": "x", **extra,
    }  # fmt: skip


def test_the_request_names_one_writer_per_part_or_none() -> None:
    assert parse_request(_request()).writers == ()
    assert parse_request(_request(writers=["gpu001", "gpu002"])).writers == ("gpu001", "gpu002")
    with pytest.raises(ManifestError, match="one node per part"):
        parse_request(_request(writers=["gpu001"]))
    with pytest.raises(ManifestError, match="bad node name"):
        parse_request(_request(writers=["gpu001", "../x"]))
    req = parse_request(_request(writers=["a", "b"]))
    assert parse_request(UploadRequest.to_json_obj(req)) == req


def test_the_sdk_names_each_parts_node_all_or_nothing() -> None:
    # ranks 0-1 on node index 0 (gpu003), ranks 2-3 on node index 2 (gpu007): parts are node indices 0 and 2
    assert _writers([0, 2], [0, 0, 2, 2], ["gpu003", "gpu003", "gpu007", "gpu007"]) == ("gpu003", "gpu007")
    assert _writers([0, 1], [0, 1], ["gpu003", None]) == ()
    assert _writers([0], [0], [None]) == ()

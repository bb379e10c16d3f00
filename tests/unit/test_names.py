"""One home for the names nuro accepts (nuro/names.py): every Python check uses it, and the Lua bridge agrees."""

from __future__ import annotations

import pytest

from nuro import names
from nuro.checkpoint import layout
from nuro.checkpoint.errors import InvalidCheckpointInput
from tests import luabridge
from tests.unit.test_comment_bridge import STRICT, _disagreements

C = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "3f" * 32
TEAMS = ["perception", "a", "a" * 31, "a" * 32, "A", "1a", "a-b", "a_b", "a.b", "", "é"]
DATASETS = ["ds", "imagenet-mini_v2.1", "0x", "a" * 63, "a" * 64, "Ds", "-x", ".x", "a/b", "a b", ""]
DIGESTS = [DIGEST, "sha256:" + "3F" * 32, "sha256:" + "3f" * 31, "sha256:" + "3f" * 33, "md5:" + "3f" * 16]


def record(team: str = "perception", name: str = "ds", digest: str = DIGEST) -> str:
    return (f'{{"nuro":{{"code":{{"commit":"{C}","repo":"/r"}},"dataset":{{"digest":"{digest}","name":"{name}"}},'
            f'"team":"{team}","v":1}}}}')  # fmt: skip


def test_the_patterns_say_what_the_validators_say() -> None:
    assert [names.is_team(t) for t in TEAMS] == [True, True, True, False, False, False, False, True, False, False,
                                                  False]  # fmt: skip
    assert names.is_dataset("imagenet-mini_v2.1") and not names.is_dataset("a" * 64)
    assert names.is_digest(DIGEST) and not names.is_digest(DIGESTS[1])
    with pytest.raises(names.InvalidName, match="bad team 'A'"):
        names.validate_team("A")
    with pytest.raises(InvalidCheckpointInput, match="bad run name"):  # the checkpoint layer's type, same words
        layout.validate_run("-x")
    assert issubclass(InvalidCheckpointInput, names.InvalidName), "whoever catches a refused name catches both"


@pytest.mark.skipif(luabridge.LUA is None, reason="lua5.1 not installed (apt-get install lua5.1)")
def test_the_lua_bridge_accepts_and_refuses_the_same_names() -> None:
    """Team, dataset name and digest at and past every edge, through the real job_submit.lua and the Python
    admission (both with pinning required): the same verdicts and messages."""
    comments = [record(team=t) for t in TEAMS if '"' not in t] + [record(name=n) for n in DATASETS]
    comments += [record(digest=d) for d in DIGESTS]
    assert _disagreements(comments, STRICT) == []


def test_node_settings_have_one_error_policy(caplog: pytest.LogCaptureFixture) -> None:
    """``nodeenv.setting``: unset gives the default; a malformed, negative or (positive) zero value keeps the
    default and says so; a hook never stops on what an admin wrote. The readers of the hooks and the agent use it."""
    from nuro.checkpoint import handoff, promote
    from nuro.healthcheck.uploads import cache_runs
    from nuro.protocol.nodeenv import setting

    assert setting({}, "NURO_X_S", float, 5.0) == 5.0 and setting({"NURO_X_S": " 7.5 "}, "NURO_X_S", float, 5.0) == 7.5
    for bad in ("seven", "-1", "nan"):
        assert setting({"NURO_X_S": bad}, "NURO_X_S", float, 5.0) == 5.0
    assert setting({"NURO_X_S": "0"}, "NURO_X_S", float, 5.0) == 0.0
    assert setting({"NURO_X_S": "0"}, "NURO_X_S", float, 5.0, positive=True) == 5.0
    assert "NURO_X_S='seven' is not a float: using 5.0" in caplog.text
    assert handoff.timeout_s({"NURO_HANDOFF_TIMEOUT_S": "0"}) == handoff.DEFAULT_TIMEOUT_S
    assert promote.promote_timeout_s({"NURO_SNAPSHOT_PROMOTE_TIMEOUT_S": "x"}) == promote.DEFAULT_PROMOTE_TIMEOUT_S
    assert cache_runs({"NURO_STAGING_CACHE_RUNS": "two"}) == cache_runs({}), "the epilog no longer stops on it"


def test_a_decimal_is_ascii_digits_only() -> None:
    """``str.isdigit`` passes "²" and Arabic-Indic digits; ``int()`` then refuses "²" with a ValueError."""
    assert names.is_decimal("0") and names.is_decimal("1234")
    assert not any(names.is_decimal(v) for v in ("", "²", "١٢", "-1", "1 ", "1.0", 12))

"""``env_seconds``: the one parser of the ``NURO_*_S`` values a training process reads, and its three callers."""

from __future__ import annotations

import pytest

from nuro.checkpoint.errors import InvalidCheckpointInput
from nuro.wrappers.sdk.runenv import RunEnvError, env_seconds


@pytest.mark.parametrize(("raw", "want"), [("", None), ("  ", None), ("30", 30.0), (" 7.5 ", 7.5), ("1e3", 1000.0)])
def test_unset_is_none_and_numbers_are_read(raw: str, want: float | None) -> None:
    assert env_seconds({"X_S": raw}, "X_S") == want
    assert env_seconds({}, "X_S") is None


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "-1", "0", "7.5s", "ten"])
def test_a_set_value_that_is_no_positive_finite_number_is_an_error_naming_it(raw: str) -> None:
    with pytest.raises(RunEnvError, match=r"X_S=.* is not a number of seconds > 0; unset it to use the default"):
        env_seconds({"X_S": raw}, "X_S")


def test_zero_only_where_allowed_and_the_callers_error_type() -> None:
    assert env_seconds({"X_S": "0"}, "X_S", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="≥ 0"):
        env_seconds({"X_S": "-0.5"}, "X_S", allow_zero=True, error=ValueError)


def test_the_process_group_timeout_rejects_nan_instead_of_passing_it_to_torch() -> None:
    from nuro.wrappers.sdk.runenv import RunEnv

    with pytest.raises(RunEnvError, match="NURO_PG_TIMEOUT_S"):
        RunEnv.from_env({"NURO_PG_TIMEOUT_S": "nan"})


def test_a_checkpoint_interval_of_zero_is_an_error_not_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from nuro.wrappers.sdk.checkpointer import Checkpointer
    from nuro.wrappers.sdk.runenv import RunEnv

    monkeypatch.setenv("NURO_CKPT_INTERVAL_S", "0")  # it used to fall back to the default silently
    with pytest.raises(InvalidCheckpointInput, match="NURO_CKPT_INTERVAL_S='0' is not a number of seconds > 0"):
        Checkpointer("team", "run", store=object(), env=RunEnv.from_env({}))  # type: ignore[arg-type]

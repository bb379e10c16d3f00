"""The one comment parser, both languages: nuro.protocol.jobcomment (Python) and the real job_submit.lua under lua5.1.

Claims: the shared vectors (tests/vectors/comment.json) hold on both sides; and on thousands of random and adversarial
comments (a seeded generator plus hypothesis) the bridge's scanner, the Python definition (json round trip) and the
Python scanner say the same (record or not, and the same first problem), and a whole submission through the bridge
gets the same verdict and message as nuro.policy.admission.decide: 0 disagreements. The real-sbatch run of the same
generator is tests/integration/isolation/test_comment_parse.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nuro.policy import load_policy
from nuro.policy.admission import JobRequest, decide
from nuro.policy.luatable import policy_table, render_lua_table
from nuro.policy.model import Policy
from nuro.protocol import jobcomment
from tests import luabridge

REPO = Path(__file__).resolve().parents[2]
VECTORS = json.loads((REPO / "tests/vectors/comment.json").read_text())["vectors"]
POLICY = load_policy(REPO / "examples/policy/teams.yaml")
STRICT = Policy.model_validate({**POLICY.model_dump(), "require_pinning": True})
needs_lua = pytest.mark.skipif(luabridge.LUA is None, reason="lua5.1 not installed (apt-get install lua5.1)")


def _disagreements(comments: list[str], policy: Policy) -> list[str]:
    """Every comment on which the two languages (or the Python definition and its scanner) differ."""
    lua = luabridge.run_bridge(comments, render_lua_table(policy))
    table = policy_table(policy)
    problems = []
    for c, got in zip(comments, lua, strict=True):
        py = luabridge.python_scan(c)
        want = decide(JobRequest(user="alice", gpus_per_node=1, comment=c), table)
        code = "SUCCESS" if want.accepted else want.code
        if py.record != (py.why is None):
            problems.append(f"python definition {py.record} vs python scan {py.why!r}: {c!r}")
        if (got.record, got.why) != (py.record, py.why):
            problems.append(f"lua {got.record}/{got.why!r} vs python {py.record}/{py.why!r}: {c!r}")
        if (got.code, got.message) != (code, want.message):
            problems.append(f"submit: lua {got.code} {got.message!r} vs python {code} {want.message!r}: {c!r}")
    return problems


@pytest.mark.parametrize("vector", VECTORS, ids=[v["id"] for v in VECTORS])
def test_python_parser_matches_vector(vector: dict) -> None:
    c = vector["comment"]
    assert (jobcomment.record(c) is not None) is vector["record"]
    assert jobcomment.scan(c) == vector["reason"]
    parsed = jobcomment.parse(c)
    assert parsed.not_record == vector["reason"]
    if vector["record"]:
        assert jobcomment.canonical(parsed.raw) == c


@needs_lua
def test_lua_scanner_matches_vectors() -> None:
    got = luabridge.run_bridge([v["comment"] for v in VECTORS], render_lua_table(POLICY), scan_only=True)
    wrong = [
        f"{v['id']}: lua {g.record}/{g.why!r}, want {v['record']}/{v['reason']!r}"
        for v, g in zip(VECTORS, got, strict=True)
        if (g.record, g.why) != (v["record"], v["reason"])
    ]
    assert not wrong, "\n".join(wrong)


COUNT = 2500


@needs_lua
@pytest.mark.parametrize("policy", [POLICY, STRICT], ids=["pinning-optional", "pinning-required"])
def test_bridge_and_python_agree_on_generated_comments(policy: Policy) -> None:
    comments = luabridge.comments(random.Random(11), COUNT)
    records = sum(jobcomment.record(c) is not None for c in comments)
    assert len(comments) > COUNT * 0.9 and records > COUNT * 0.2 and records < len(comments) * 0.8
    problems = _disagreements(comments, policy)
    assert not problems, f"{len(problems)} disagreements of {len(comments)}:\n" + "\n".join(problems[:20])


# --- hypothesis: JSON values in every spelling, and token soup ------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers(-(10**16), 10**16) | st.text(max_size=6)
_json = st.recursive(
    _scalars,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=4), kids, max_size=3),
    max_leaves=8,
)
_spelled = st.builds(
    lambda obj, seps, sort, ascii_: json.dumps(obj, separators=seps, sort_keys=sort, ensure_ascii=ascii_),
    st.dictionaries(st.sampled_from(["nuro", "ack", "preempt", "a", "b", "é", ""]) | st.text(max_size=3), _json,
                    max_size=4),
    st.sampled_from([(",", ":"), (", ", ": "), (",", ": ")]),
    st.booleans(),
    st.booleans(),
)  # fmt: skip
_soup = st.lists(st.sampled_from(luabridge._TOKENS), max_size=14).map(lambda t: "{" + "".join(t))
_edited = st.tuples(st.randoms(use_true_random=False), st.integers(1, 3)).map(lambda a: luabridge.comments(a[0], a[1]))


@needs_lua
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_spelled | _soup, min_size=20, max_size=40), _edited)
def test_bridge_and_python_agree_hypothesis(batch: list[str], edited: list[str]) -> None:
    batch = batch + edited
    problems = _disagreements(batch, STRICT)
    assert not problems, "\n".join(problems[:10])


def test_python_scanner_agrees_with_the_definition() -> None:
    """Fast, Python only: the scanner and the json round trip on 20,000 generated comments."""
    for c in luabridge.comments(random.Random(5), 20000):
        assert (jobcomment.record(c) is not None) == (jobcomment.scan(c) is None), repr(c)

"""Admission rules: the Python preview against the shared vectors, the Lua bridge under a stub ``slurm`` against the
same vectors (when lua5.1 is installed), and the generated policy table (golden, escaping, determinism).

The real check of the Lua is tests/integration/test_job_submit_bridge.py (real sbatch); the stub run here only gives
fast feedback and pins the job_desc shapes measured on 22.05.8 (NO_VAL markers, "gres:gpu:N" strings).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from nuro import names
from nuro.policy import load_policy, parse_policy
from nuro.policy.admission import JobRequest, Reason, decide, gpu_count, parse_sbatch_args, read_nuro
from nuro.policy.luatable import (
    PIN_FIELDS,
    RULES,
    TABLE_FILE,
    cluster_facts,
    lua_string,
    policy_table,
    render_lua_table,
    topology_hint,
)
from nuro.policy.model import NAME, Policy
from tests.luabridge import LUA, STUB_PRELUDE, lua_value

REPO = Path(__file__).resolve().parents[2]
VECTORS = json.loads((REPO / "tests/vectors/admission.json").read_text())
POLICY = load_policy(REPO / VECTORS["policy"])
NO_VAL, NO_VAL16 = 4294967294, 65534


def _ids(vectors: list[dict]) -> list[str]:
    return [v["id"] for v in vectors]


def vector_policy(vector: dict) -> Policy:
    """The example policy with the vector's ``policy_update`` (e.g. require_pinning) applied and re-validated."""
    update = vector.get("policy_update")
    return Policy.model_validate({**POLICY.model_dump(), **update}) if update else POLICY


@pytest.mark.parametrize("vector", VECTORS["vectors"], ids=_ids(VECTORS["vectors"]))
def test_python_decide_matches_vector(vector: dict) -> None:
    got = decide(parse_sbatch_args(vector["user"], vector["args"]), vector_policy(vector))
    want = vector["expect"]
    if want["verdict"] == "reject":
        assert not got.accepted, f"accepted, expected: {want['message']}"
        assert got.message == want["message"]
        assert got.code == want["code"]
        return
    assert got.accepted, got.message
    for key in ("qos", "account", "requeue", "switches", "switch_wait_s"):
        if key not in want:
            continue
        expected = None if key in vector.get("slurm_defaults", ()) else want[key]
        assert getattr(got, key) == expected, f"{key}: {getattr(got, key)!r} != {expected!r}"


def test_vectors_cover_every_rule_and_both_verdicts() -> None:
    reasons = set()
    for v in VECTORS["vectors"]:
        got = decide(parse_sbatch_args(v["user"], v["args"]), vector_policy(v))
        if got.reason:
            reasons.add(got.reason)
    assert reasons == set(Reason)
    assert {v["expect"]["verdict"] for v in VECTORS["vectors"]} == {"accept", "reject"}
    assert len(VECTORS["vectors"]) >= 20
    pinned = [v for v in VECTORS["vectors"] if v.get("policy_update", {}).get("require_pinning")]
    assert {v["expect"]["verdict"] for v in pinned} == {"accept", "reject"}


def test_golden_policy_table(golden) -> None:
    golden("nuro_policy.lua", render_lua_table(POLICY))


def test_table_is_deterministic_regardless_of_yaml_order() -> None:
    raw = {
        "cluster_gpus": 16,
        "teams": {
            "b": {"members": ["y", "x"], "quota_gpus": 8},
            "a": {"members": ["z"], "quota_gpus": 8, "borrow_limit_gpus": 4},
        },
        "tiers": {"urgent": {"priority": 10, "allowed_users": ["y", "x"], "allowed_accounts": ["b", "a"]}},
    }
    reordered = {
        "tiers": raw["tiers"],
        "teams": {"a": raw["teams"]["a"], "b": {"members": ["x", "y"], "quota_gpus": 8}},
        "cluster_gpus": 16,
    }
    one, two = render_lua_table(parse_policy(raw)), render_lua_table(parse_policy(reordered))
    assert one == two
    assert 'who = "accounts a, b and users x, y"' in one


def test_digest_changes_with_the_policy() -> None:
    base = policy_table(POLICY)
    assert base["digest"].startswith("sha256:") and len(base["digest"]) == 7 + 64
    assert policy_table(POLICY, leaf_size=8)["digest"] != base["digest"]
    assert policy_table(POLICY)["digest"] == base["digest"]


def test_rule_templates_format_the_same_in_both_languages() -> None:
    for name, (code, message) in RULES.items():
        assert code.startswith("ESLURM_"), name
        assert message.startswith("nuro: ") and "%" not in message.replace("%s", "").replace("%d", ""), name


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        (None, 0),
        ("", 0),
        ("gres:gpu:8", 8),
        ("gpu:8", 8),
        ("gres:gpu:a100:2", 2),
        ("gres/gpu=4", 4),
        ("gres:gpu", 1),
        ("gres:gpu:2,gres:mps:100", 2),
        ("gres:mps:100", 0),
        ("gres:gpu:2,gres:gpu:a100:1", 3),
    ],
)
def test_gpu_count(spec: str | None, gpus: int) -> None:
    assert gpu_count(spec) == gpus


def test_sbatch_args_forms() -> None:
    req = parse_sbatch_args("alice", ["-N", "2-6", "-n8", "--gpus-per-node", "4", "-Aperception", "--qos=urgent"])
    assert (req.nodes, req.max_nodes, req.tasks, req.gpus_per_node) == (2, 6, 8, 4)
    assert (req.account, req.qos, req.node_count) == ("perception", "urgent", 6)
    assert parse_sbatch_args("a", ["--switches=1@1-2:03:04"]).switch_wait_s == 86400 + 2 * 3600 + 3 * 60 + 4
    assert parse_sbatch_args("a", ["--switches=1@7"]).switch_wait_s == 420
    with pytest.raises(ValueError, match="--exclusive"):
        parse_sbatch_args("a", ["--exclusive"])


def test_decide_reads_a_prebuilt_table() -> None:
    table = policy_table(POLICY)
    got = decide(JobRequest(user="alice", nodes=6, max_nodes=6, gpus_per_node=8), table)
    assert got.reason is Reason.GPU_CAP and got.gpus == 48 and got.team == "perception"
    ok = decide(JobRequest(user="alice", nodes=2, max_nodes=2), table)
    assert ok.changes == ("qos=g-perception", "account=perception", "requeue=1", "switches=1@60s")


# --- the Lua bridge under a stub `slurm` ------------------------------------------------------------------------

needs_lua = pytest.mark.skipif(LUA is None, reason="lua5.1 not installed (apt-get install lua5.1)")

_STUB = (
    STUB_PRELUDE
    + r"""
local function s(v) if v == nil then return "" end return tostring(v) end
for _, case in ipairs(dofile(arg[2])) do
  user_msg, errors = {}, {}
  local d = case.desc
  local rc = slurm_job_submit(d, {}, case.uid)
  local name = "SUCCESS"
  for k, v in pairs(CODES) do if v == rc then name = k end end
  print(table.concat({case.id, name, s(d.qos), s(d.account), s(d.requeue), s(d.req_switch), s(d.wait4switch),
    table.concat(user_msg, "\n"), table.concat(errors, "\n"), s(d.segment_size)}, "\t"))
end
"""
)


def _job_desc(user: str, req: JobRequest) -> dict:
    """The job_desc fields slurmctld 22.05.8 hands job_submit.lua for these sbatch options (measured; see docs)."""

    def tres(n: int) -> str | None:
        return f"gres:gpu:{n}" if n else None

    return {
        "comment": req.comment,
        "user_name": user,
        "user_id": 0 if user == "root" else 1000,
        "name": "wrap",
        "account": req.account,
        "qos": req.qos,
        "min_nodes": req.nodes if req.nodes is not None else NO_VAL,
        "max_nodes": req.max_nodes if req.max_nodes is not None else NO_VAL,
        "num_tasks": req.tasks if req.tasks is not None else NO_VAL,
        "ntasks_per_node": req.tasks_per_node if req.tasks_per_node is not None else NO_VAL16,
        "sockets_per_node": req.sockets_per_node if req.sockets_per_node is not None else NO_VAL16,
        "tres_per_node": tres(req.gpus_per_node),
        "tres_per_job": tres(req.gpus_per_job),
        "tres_per_task": tres(req.gpus_per_task),
        "tres_per_socket": tres(req.gpus_per_socket),
        "requeue": NO_VAL16 if req.requeue is None else int(req.requeue),
        "req_switch": req.switches if req.switches is not None else NO_VAL,
        "wait4switch": req.switch_wait_s if req.switch_wait_s is not None else NO_VAL,
    }


def _run_lua(tmp_path: Path, cases: list[dict], table_text: str | None) -> dict[str, list[str]]:
    bridge = tmp_path / "job_submit.lua"
    shutil.copy(REPO / "slurm_plugins/job_submit.lua", bridge)
    if table_text is not None:
        (tmp_path / TABLE_FILE).write_text(table_text)
    cases_file = tmp_path / "cases.lua"
    cases_file.write_text("return {\n" + ",\n".join(lua_value(c) for c in cases) + "\n}\n")
    stub = tmp_path / "stub.lua"
    stub.write_text(_STUB)
    out = subprocess.run([LUA, str(stub), str(bridge), str(cases_file)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    rows = [line.split("\t") for line in out.stdout.splitlines()]
    return {row[0]: row[1:] for row in rows}


@needs_lua
def test_lua_bridge_matches_vectors(tmp_path: Path) -> None:
    groups: dict[str, list[dict]] = {}
    for v in VECTORS["vectors"]:
        req = parse_sbatch_args(v["user"], v["args"])
        case = {"id": v["id"], "uid": 0 if v["user"] == "root" else 1000, "desc": _job_desc(v["user"], req)}
        groups.setdefault(json.dumps(v.get("policy_update", {}), sort_keys=True), []).append(case)
    got: dict[str, list[str]] = {}
    for n, (update, cases) in enumerate(sorted(groups.items())):
        (tmp_path / str(n)).mkdir()
        policy = vector_policy({"policy_update": json.loads(update)})
        got.update(_run_lua(tmp_path / str(n), cases, render_lua_table(policy)))
    problems = []
    for v in VECTORS["vectors"]:
        code, qos, account, requeue, switch, wait, msg, errors, _segment = got[v["id"]]
        want = v["expect"]
        if errors:
            problems.append(f"{v['id']}: logged errors: {errors}")
        if want["verdict"] == "reject":
            if (code, msg) != (want["code"], want["message"]):
                problems.append(f"{v['id']}: got {code} {msg!r}, want {want['code']} {want['message']!r}")
            continue
        defaults = v.get("slurm_defaults", ())
        final = {
            "code": code,
            "qos": qos or None,
            "account": account or None,
            "requeue": None if requeue == str(NO_VAL16) else requeue == "1",
            "switches": None if switch == str(NO_VAL) else int(switch),
            "switch_wait_s": None if wait == str(NO_VAL) else int(wait),
        }
        expected = {"code": "SUCCESS"}
        for key in ("qos", "account", "requeue", "switches", "switch_wait_s"):
            if key in want:
                expected[key] = None if key in defaults else want[key]
        if {k: final[k] for k in expected} != expected:
            problems.append(f"{v['id']}: got {final}, want {expected}")
    assert not problems, "\n".join(problems)


@needs_lua
@pytest.mark.parametrize(
    "table_text", [None, "return {", "return { format = 99 }"], ids=["missing", "broken", "format"]
)
def test_lua_bridge_without_usable_table_lets_jobs_through(tmp_path: Path, table_text: str | None) -> None:
    req = parse_sbatch_args("alice", ["-N6", "--gpus-per-node=8", "--qos=g-prediction", "--no-requeue"])
    got = _run_lua(tmp_path, [{"id": "x", "uid": 1000, "desc": _job_desc("alice", req)}], table_text)
    code, qos, account, requeue, switch, _wait, msg, errors, _segment = got["x"]
    assert (code, qos, account, requeue, switch, msg) == ("SUCCESS", "g-prediction", "", "0", str(NO_VAL), "")
    assert "no usable policy table" in errors and "job passes unchanged" in errors


@needs_lua
def test_lua_string_escaping_round_trips(tmp_path: Path) -> None:
    texts = ["plain", 'quote " and \\ backslash', "new\nline\ttab\r", "ünï 💡", "\x00\x01 then 7", "]]--[["]
    script = tmp_path / "s.lua"
    script.write_text(
        "local t = {" + ", ".join(lua_string(t) for t in texts) + "}\n"
        "for _, s in ipairs(t) do io.write((s:gsub('.', function(c) return string.format('%02x', c:byte()) end)), "
        "'\\n') end\n"
    )
    out = subprocess.run([LUA, str(script)], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.split() == [t.encode().hex() for t in texts]


# --- the nuro record reader (both languages) and the modify hook under the stub ----------------------------------

_D, _C = "sha256:" + "3f" * 32, "0123456789abcdef0123456789abcdef01234567"
_GOOD = (
    f'{{"nuro":{{"code":{{"commit":"{_C}","repo":"/r"}},"dataset":{{"digest":"{_D}","name":"ds"}},'
    '"team":"perception","v":1}}'
)


def test_pin_patterns_agree_with_the_manifest_and_the_policy_model() -> None:
    digest, name = "sha256:" + "0a" * 32, "imagenet-mini_v2.1"
    assert names.is_digest(digest) and names.is_dataset(name)
    rec = read_nuro(_GOOD.replace(_D, digest).replace('"ds"', f'"{name}"'))
    assert rec is not None and rec.bad is None and (rec.digest, rec.name) == (digest, name)
    for bad in ("A" + name, "-x", "a" * 64, "a/b", ""):
        assert not names.is_dataset(bad)
        assert read_nuro(_GOOD.replace('"ds"', f'"{bad}"')).bad == "nuro.dataset.name"
    assert re.fullmatch(NAME, "a" * 31) and not re.fullmatch(NAME, "a" * 32)
    assert read_nuro(_GOOD.replace('"perception"', '"' + "a" * 32 + '"')).bad == "nuro.team"
    assert set(PIN_FIELDS) == {"nuro", "nuro.dataset", "nuro.dataset.digest", "nuro.dataset.name",
                               "nuro.code.commit", "nuro.team"}  # fmt: skip


def test_read_nuro_raw_is_the_record_as_sent() -> None:
    comment = '{"ack":{"at":1},' + _GOOD[1:-1] + ',"preempt":{"why":"x}"}}'
    rec = read_nuro(comment)
    assert rec is not None and rec.bad is None and rec.raw == _GOOD[1:-1]
    assert read_nuro(None) is None and read_nuro("plain text") is None and read_nuro('{"nuros":1}') is None


_MODIFY_STUB = r"""
slurm = { SUCCESS = 0, NO_VAL = 4294967294, NO_VAL16 = 65534, INFINITE = 4294967295, ESLURM_ACCESS_DENIED = 2002,
  ESLURM_ACCOUNTING_POLICY = 2050, ESLURM_INVALID_ACCOUNT = 2045 }
local logged = {}
slurm.log_info = function(fmt, ...) table.insert(logged, string.format(fmt, ...)) end
slurm.log_debug, slurm.log_error, slurm.log_user = function() end, error, function() end
dofile(arg[1])
for _, case in ipairs(dofile(arg[2])) do
  logged = {}
  local rc = slurm_job_modify(case.desc, case.rec, {}, 1000)
  print(case.id .. "	" .. rc .. "	" .. ((logged[1] or ""):match("rule=(%S+)") or ""))
end
"""


@needs_lua
def test_lua_modify_keeps_the_record(tmp_path: Path) -> None:
    """pin_changed and pin_required on scontrol update (the real run is in the integration test)."""
    rec = {"job_id": 7, "user_id": 1000, "account": "perception", "qos": "g-perception", "comment": _GOOD,
           "tres_per_node": "gres:gpu:8", "min_nodes": 1, "max_nodes": 1}  # fmt: skip
    cpu = {**rec, "comment": None, "tres_per_node": None}
    user = {"user_id": 1000, "user_name": "alice"}
    with_ack = '{"ack":{"at":5,"step":9},' + _GOOD[1:]
    cases = [
        ("ack-added", {**user, "comment": with_ack}, rec, "0", ""),
        ("time-only", {**user, "time_limit": 60}, rec, "0", ""),
        ("digest-changed", {**user, "comment": _GOOD.replace("3f", "4f")}, rec, "2002", "pin_changed"),
        ("record-dropped", {**user, "comment": '{"ack":{"at":5}}'}, rec, "2002", "pin_changed"),
        ("comment-emptied", {**user, "comment": ""}, rec, "2002", "pin_changed"),
        ("cpu-to-gpu", {**user, "tres_per_node": "gres:gpu:1"}, cpu, "2002", "pin_required"),
        ("cpu-comment", {**user, "comment": "notes"}, cpu, "0", ""),
        ("pin-added-later", {**user, "tres_per_node": "gres:gpu:1", "comment": _GOOD}, cpu, "0", ""),
    ]
    (tmp_path / "job_submit.lua").write_text((REPO / "slurm_plugins/job_submit.lua").read_text())
    strict = Policy.model_validate({**POLICY.model_dump(), "require_pinning": True})
    (tmp_path / TABLE_FILE).write_text(render_lua_table(strict))
    (tmp_path / "cases.lua").write_text(
        "return {\n" + ",\n".join(lua_value({"id": i, "desc": d, "rec": r}) for i, d, r, _, _ in cases) + "\n}\n"
    )
    (tmp_path / "stub.lua").write_text(_MODIFY_STUB)
    out = subprocess.run(
        [LUA, str(tmp_path / "stub.lua"), str(tmp_path / "job_submit.lua"), str(tmp_path / "cases.lua")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = {row.split("\t")[0]: row.split("\t")[1:] for row in out.stdout.splitlines()}
    assert got == {i: [code, rule] for i, _, _, code, rule in cases}


MODIFY = json.loads((REPO / "tests/vectors/modify.json").read_text())["vectors"]


@needs_lua
def test_lua_modify_matches_vectors(tmp_path: Path) -> None:
    """The shared modify vectors (b-<team> and urgent on update, preempt marks, the canonical form) under the stub;
    the same vectors run through real scontrol update in tests/integration/test_job_submit_bridge.py."""
    cases = []
    for v in MODIFY:
        rec = {"job_id": 7, "user_id": 1000, "tres_per_node": "gres:gpu:1", "min_nodes": 1, "max_nodes": 1, **v["job"]}
        update = {("time_limit" if k == "timelimit" else k): (int(x) if k == "timelimit" else x)
                  for k, x in v["update"].items()}  # fmt: skip
        cases.append({"id": v["id"], "desc": {"user_id": 1000, "user_name": v["user"], **update}, "rec": rec})
    (tmp_path / "job_submit.lua").write_text((REPO / "slurm_plugins/job_submit.lua").read_text())
    (tmp_path / TABLE_FILE).write_text(render_lua_table(POLICY))
    (tmp_path / "cases.lua").write_text("return {\n" + ",\n".join(lua_value(c) for c in cases) + "\n}\n")
    (tmp_path / "stub.lua").write_text(_MODIFY_STUB)
    out = subprocess.run(
        [LUA, str(tmp_path / "stub.lua"), str(tmp_path / "job_submit.lua"), str(tmp_path / "cases.lua")],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = {row.split("\t")[0]: row.split("\t")[1:] for row in out.stdout.splitlines()}
    want = {v["id"]: ["0", ""] if v["expect"]["verdict"] == "accept" else ["2002", v["expect"]["rule"]] for v in MODIFY}
    assert got == want


# --- rule 7 on topology/block: the segment hint ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "version", "hint"),
    [
        ("tree", (22, 5, 8), "switches"),
        ("tree", (26, 5, 5), "switches"),
        ("block", (24, 11, 5), "none"),  # 24.11's Lua has no segment_size
        ("block", (25, 11, 1), "none"),
        ("block", (25, 11, 2), "segment"),  # CHANGELOG/slurm-25.11.md: segment_size exposed in job_desc
        ("block", (26, 5, 5), "segment"),
        ("none", (26, 5, 5), "none"),
    ],
)
def test_topology_hint_follows_the_plugin_and_the_lua_api(kind: str, version: tuple, hint: str) -> None:
    assert topology_hint(kind, version) == hint


def test_cluster_facts_come_from_the_leaves_and_the_nodes() -> None:
    switches = ["leaf1"] * 4 + ["leaf2"] * 6 + [None]
    facts = cluster_facts(switches, [8] * 10 + [4], "tree", (22, 5, 8))
    assert facts == {"leaf_size": 6, "gpus_per_node": 8, "hint": "switches"}
    # no leaves at all (no topology plugin): no job gets a hint
    assert cluster_facts([None, None], [0, 0], "none", (26, 5, 5)) == {
        "leaf_size": 1,
        "gpus_per_node": 1,
        "hint": "none",
    }
    table = policy_table(POLICY, **cluster_facts(["b1"] * 4 + ["b2"] * 4, [8] * 8, "block", (26, 5, 5)))
    assert (table["topology_hint"], table["leaf_nodes"]) == ("segment", 4)
    with pytest.raises(ValueError, match="hint must be one of"):
        policy_table(POLICY, hint="leaf")


SEGMENT_CASES = [
    # (id, sbatch args, expected segment, expected changes tail)
    ("two-nodes", ["-N2", "--gpus-per-node=8"], 2, "segment=2"),
    ("leaf-whole", ["-N4", "--gpus-per-node=1"], 4, "segment=4"),
    ("node-range", ["-N2-3", "--gpus-per-node=1"], None, None),  # a range: no segment divides every size
    ("own-segment", ["-N4", "--gpus-per-node=1", "--segment=2"], 2, None),  # the user's own wins
    ("own-switches", ["-N2", "--gpus-per-node=1", "--switches=1"], None, None),
    ("above-leaf", ["-N5", "--gpus-per-node=1"], None, None),
    ("one-node", ["-N1", "--gpus-per-node=8"], None, None),
]


@pytest.mark.parametrize(("case_id", "args", "segment", "change"), SEGMENT_CASES, ids=[c[0] for c in SEGMENT_CASES])
def test_block_clusters_get_a_segment_hint_not_switches(case_id, args, segment, change) -> None:
    table = policy_table(POLICY, hint="segment")
    got = decide(parse_sbatch_args("alice", args), table)
    assert got.accepted
    assert got.segment == segment
    assert got.switches == (1 if "--switches=1" in args else None)
    hints = [c for c in got.changes if c.startswith(("segment=", "switches="))]
    assert hints == ([change] if change else [])


def test_no_hint_table_adds_no_topology_change() -> None:
    got = decide(parse_sbatch_args("alice", ["-N2", "--gpus-per-node=8"]), policy_table(POLICY, hint="none"))
    assert got.accepted and got.switches is None and got.segment is None
    assert got.changes == ("qos=g-perception", "account=perception", "requeue=1")


@needs_lua
def test_lua_bridge_sets_the_same_segment_hint(tmp_path: Path) -> None:
    """The Lua under the stub with a block table: segment_size as the preview decides (the live check on 26.05 is
    tests/integration/test_job_submit_bridge.py)."""
    cases = []
    for case_id, args, _segment, _change in SEGMENT_CASES:
        req = parse_sbatch_args("alice", args)
        desc = _job_desc("alice", req)
        desc["segment_size"] = req.segment if req.segment is not None else 0  # 25.11+: 0 when not asked
        cases.append({"id": case_id, "uid": 1000, "desc": desc})
    got = _run_lua(tmp_path, cases, render_lua_table(POLICY, hint="segment"))
    table = policy_table(POLICY, hint="segment")
    for case_id, args, _segment, _change in SEGMENT_CASES:
        code, _qos, _account, _requeue, switch, _wait, _msg, errors, segment = got[case_id]
        want = decide(parse_sbatch_args("alice", args), table)
        assert (code, errors) == ("SUCCESS", ""), case_id
        assert int(segment) == (want.segment or 0), case_id
        assert (None if switch == str(NO_VAL) else int(switch)) == want.switches, case_id

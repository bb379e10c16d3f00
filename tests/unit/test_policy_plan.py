"""The pure policy planner, from real ``sacctmgr -P -n`` captures (tests/fixtures/slurm/sacctmgr_policy_*.txt).

Fixture states, captured by tests/integration/test_policy_apply.py with NURO_RECORD_POLICY_FIXTURES=1:
  empty    a fresh cluster plus the integration fixture's account ``nurotest`` (users nuro-alice, nuro-bob)
  applied  after ``policy apply examples/policy/teams.yaml``
  drift    applied, plus a team ``legacy`` (member nuro-bob), then hand edits: g-perception GrpTRES 20 + cpu=100,
           Priority 5, Preempt=b-prediction; perception Fairshare 10; alice's QOS cut to g-perception; chen added
           to perception
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from nuro.admin.admin_cli import main
from nuro.policy.model import Policy, PolicyError, load_policy, parse_policy
from nuro.policy.plan import Op, PlanConflict, build_plan, desired_state
from nuro.policy.sacctmgr import lua_table_path, write_atomic
from nuro.policy.slurm_state import SlurmState, parse_state, policy_in_force, slurm_duration
from nuro.slurm.parse_text import parse_slurm_duration_s

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "policy" / "teams.yaml"
FIXTURES = REPO / "tests" / "fixtures" / "slurm"
#: Command tokens that would touch objects nuro does not manage.
UNMANAGED_TARGETS = ("name=root", "name=nurotest", "name=normal", "name=nuro-alice", "account=nurotest")


def state(scenario: str) -> SlurmState:
    text = {
        w: (FIXTURES / f"sacctmgr_policy_{scenario}_{w}.txt").read_text() for w in ("qos", "account", "assoc", "user")
    }
    return parse_state(text["qos"], text["account"], text["assoc"], text["user"])


def example() -> Policy:
    return load_policy(EXAMPLE)


def example_with(edit) -> Policy:
    data = yaml.safe_load(EXAMPLE.read_text())
    edit(data)
    return parse_policy(data)


def commands(plan) -> list[str]:
    return [" ".join(c.argv) for c in plan.changes]


# -- reading -----------------------------------------------------------------------------------------------------
def test_parse_state_normalises_what_sacctmgr_prints() -> None:
    s = state("applied")
    assert s.qos["b-perception"].grace_s == 60 and s.qos["b-perception"].preempt_mode == "requeue"
    assert dict(s.qos["g-perception"].grp_tres) == {"gres/gpu": "24"}
    assert s.accounts["perception"].is_managed and not s.accounts["nurotest"].is_managed
    assert s.qos["urgent"].is_managed and not s.qos["normal"].is_managed
    assert s.assocs[("alice", "perception")].qos == {"g-perception", "b-perception", "urgent"}
    assert s.users["chen"].default_account == "controls"
    drift = state("drift")
    assert drift.qos["g-perception"].preempt == {"b-prediction"}
    assert dict(drift.qos["g-perception"].grp_tres) == {"cpu": "100", "gres/gpu": "20"}
    # chen was added to perception without a QOS list: sacctmgr shows the inherited one.
    assert drift.assocs[("chen", "perception")].qos == {"g-perception", "b-perception", "urgent"}
    # PreemptExemptTime: the example's min_run_s (120) on every managed QOS; normal's is unset (empty field).
    assert {q.name: q.preempt_exempt_s for q in s.managed_qos} == dict.fromkeys(desired_state(example()).qos, 120)
    assert s.qos["normal"].preempt_exempt_s is None and state("empty").qos["normal"].preempt_exempt_s is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("00:01:00", 60), ("01:00:00", 3600), ("1-02:03:04", 93784), ("05:00", 300), ("", None), ("UNLIMITED", None)],
)
def test_slurm_duration(text: str, seconds: int | None) -> None:
    assert parse_slurm_duration_s(text) == seconds


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, ""), (0, "00:00:00"), (120, "00:02:00"), (3599, "00:59:59"), (86400, "1-00:00:00"), (90061, "1-01:01:01")],
)
def test_preempt_exempt_time_is_written_as_sacctmgr_prints_it(seconds: int | None, text: str) -> None:
    """22.05 prints PreemptExemptTime as [D-]HH:MM:SS and "" when unset; writing that spelling keeps re-applies
    empty (the read side parses it back to the same seconds)."""
    assert slurm_duration(seconds) == text
    assert parse_slurm_duration_s(text) == seconds


def test_policy_in_force_reads_the_applied_policy_back() -> None:
    view = policy_in_force(state("applied"))
    perception = next(t for t in view["teams"] if t["name"] == "perception")
    assert perception == {"name": "perception", "quota_gpus": 24, "borrow_limit_gpus": 16, "grace_s": 60,
                          "fairshare": "24", "default_qos": "g-perception", "members": ["alice", "bob"]}  # fmt: skip
    assert [t["name"] for t in view["teams"]] == ["controls", "perception", "prediction", "simulation"]
    assert view["tiers"] == [
        {"name": "urgent", "priority": 100000, "allowed_accounts": ["perception"], "allowed_users": ["priya"]}
    ]
    assert policy_in_force(state("empty")) == {"teams": [], "tiers": []}


# -- desired state and plans -------------------------------------------------------------------------------------
def test_desired_state_has_no_preempt_lists_and_tiers_only_where_allowed() -> None:
    want = desired_state(example())
    assert all(not q.preempt for q in want.qos.values())
    assert want.accounts["perception"].qos == {"g-perception", "b-perception", "urgent"}
    assert want.accounts["prediction"].qos == {"g-prediction", "b-prediction"}
    assert want.assocs[("priya", "prediction")].qos == {"g-prediction", "b-prediction", "urgent"}
    assert want.assocs[("chen", "controls")].qos == {"g-controls", "b-controls"}


def test_plan_from_an_empty_cluster_is_golden(golden) -> None:
    plan = build_plan(example(), state("empty"))
    assert plan.counts() == {"add": 18, "modify": 0, "delete": 0}
    golden("policy_example_from_empty.txt", plan.render())
    kinds = [c.kind for c in plan.changes]
    assert kinds == sorted(kinds, key=["qos", "account", "user"].index), "QOS before accounts before users"


def test_plan_is_empty_when_slurm_matches() -> None:
    plan = build_plan(example(), state("applied"))
    assert plan.is_empty and plan.kept == ()
    assert plan.render() == "no changes: Slurm already matches the policy\n"
    assert build_plan(example(), state("applied"), prune=True).is_empty


def test_a_changed_policy_gives_a_diff(golden) -> None:
    def edit(d: dict) -> None:
        d["grace_s"] = 90
        d["teams"]["perception"]["quota_gpus"] = 20
        d["teams"]["simulation"]["borrow_limit_gpus"] = 8
        d["teams"]["simulation"]["members"] = ["sam", "dana"]
        d["tiers"]["urgent"]["allowed_users"] = ["sam"]

    plan = build_plan(example_with(edit), state("applied"))
    golden("policy_changed_diff.txt", plan.render())
    mods = {(c.kind, c.name): c for c in plan.changes}
    assert mods[("qos", "g-perception")].argv[-1] == "GrpTRES=gres/gpu=20"
    assert mods[("qos", "b-perception")].details == ("GraceTime: 60 -> 90",)
    # Dropping urgent from priya's list sends her DefaultQOS along (22.05 ignores a list without the default).
    assert mods[("association", "priya@prediction")].argv[-2:] == ("QOS=b-prediction,g-prediction",
                                                                  "DefaultQOS=g-prediction")  # fmt: skip
    assert mods[("user", "dana")].op is Op.ADD


def test_min_run_s_sets_preempt_exempt_time_on_every_managed_qos() -> None:
    """g-/b- carry the team's min_run_s, a tier QOS its own (else the policy's, never a team's); a changed value
    is one modify per QOS, and once Slurm holds it the plan is empty again."""

    def edit(d: dict) -> None:
        d["teams"]["perception"]["min_run_s"] = 300
        d["teams"]["controls"]["min_run_s"] = 0

    policy = example_with(edit)
    want = desired_state(policy)
    got = {name: q.preempt_exempt_s for name, q in want.qos.items()}
    assert got == {"g-perception": 300, "b-perception": 300, "g-prediction": 120, "b-prediction": 120,
                   "g-controls": 0, "b-controls": 0, "g-simulation": 120, "b-simulation": 120,
                   "urgent": 120}  # fmt: skip
    plan = build_plan(policy, state("applied"))
    assert {(c.op, c.name, c.details, c.argv[-1]) for c in plan.changes} == {
        (Op.MODIFY, q, (f"PreemptExemptTime: 00:02:00 -> {t}",), f"PreemptExemptTime={t}")
        for q, t in [("g-perception", "00:05:00"), ("b-perception", "00:05:00"), ("g-controls", "00:00:00"),
                     ("b-controls", "00:00:00")]
    }  # fmt: skip
    tier = example_with(lambda d: d["tiers"]["urgent"].update(min_run_s=86400))
    (change,) = build_plan(tier, state("applied")).changes
    assert change.name == "urgent" and change.argv[-1] == "PreemptExemptTime=1-00:00:00"
    applied = state("applied")
    read_back = {
        n: dataclasses.replace(applied.qos[n], preempt_exempt_s=q.preempt_exempt_s) for n, q in want.qos.items()
    }
    held = dataclasses.replace(applied, qos={**applied.qos, **read_back})
    assert build_plan(policy, held).is_empty


def test_qos_applied_before_the_backstop_gets_it_added() -> None:
    """A cluster applied by an older nuro has PreemptExemptTime unset (an empty field): each managed QOS gets one
    modify, and unmanaged ones (normal) are left alone."""
    text = (FIXTURES / "sacctmgr_policy_applied_qos.txt").read_text().replace("|00:02:00|", "||")
    others = {w: (FIXTURES / f"sacctmgr_policy_applied_{w}.txt").read_text() for w in ("account", "assoc", "user")}
    old = parse_state(text, others["account"], others["assoc"], others["user"])
    plan = build_plan(example(), old)
    assert [c.name for c in plan.changes] == list(desired_state(example()).qos)
    assert {c.details for c in plan.changes} == {("PreemptExemptTime: (unset) -> 00:02:00",)}
    assert plan.changes[0].argv == ("sacctmgr", "-i", "modify", "qos", "where", "name=g-perception", "set",
                                    "PreemptExemptTime=00:02:00")  # fmt: skip


def test_removed_team_is_only_kept_without_prune(golden) -> None:
    policy = example_with(lambda d: d["teams"].pop("controls"))
    kept = build_plan(policy, state("applied"))
    assert kept.is_empty
    assert kept.kept == ("user chen", "account controls", "qos b-controls", "qos g-controls")
    pruned = build_plan(policy, state("applied"), prune=True)
    golden("policy_prune_controls.txt", pruned.render())
    assert [c.op for c in pruned.changes] == [Op.DELETE] * 4


def test_drift_is_repaired_and_strays_pruned_last(golden) -> None:
    repair = build_plan(example(), state("drift"))
    golden("policy_drift_repair.txt", repair.render())
    g = next(c for c in repair.changes if c.name == "g-perception")
    # cpu=-1 clears a TRES limit nuro does not want; "Preempt=" clears the hand-made list.
    assert "GrpTRES=cpu=-1,gres/gpu=24" in g.argv and "Preempt=" in g.argv and "Priority=0" in g.argv
    assert set(repair.kept) == {"association chen@perception", "association nuro-bob@legacy", "account legacy",
                                "qos b-legacy", "qos g-legacy"}  # fmt: skip
    pruned = build_plan(example(), state("drift"), prune=True)
    golden("policy_drift_prune.txt", pruned.render())
    ops = [c.op for c in pruned.changes]
    assert ops == sorted(ops, key=[Op.MODIFY, Op.DELETE].index), "removals come last"
    bob = [c for c in pruned.changes if "name=nuro-bob" in c.argv]
    # nuro-bob keeps the unmanaged nurotest association, which becomes his default before legacy goes.
    assert [c.argv[-1] for c in bob] == ["DefaultAccount=nurotest", "account=legacy"]


@pytest.mark.parametrize("scenario", ["empty", "applied", "drift"])
@pytest.mark.parametrize("prune", [False, True])
def test_never_touches_what_nuro_does_not_manage(scenario: str, prune: bool) -> None:
    def drop_perception(d: dict) -> None:
        d["teams"].pop("perception")
        d["tiers"]["urgent"]["allowed_accounts"] = []

    for policy in (example(), example_with(drop_perception)):
        for line in commands(build_plan(policy, state(scenario), prune=prune)):
            assert not set(UNMANAGED_TARGETS) & set(line.split()), line


@pytest.mark.parametrize("name", ["nurotest", "root"])
def test_a_team_named_like_an_unmanaged_account_is_refused(name: str) -> None:
    policy = example_with(lambda d: d["teams"].update({name: {"quota_gpus": 0}}))
    with pytest.raises(PlanConflict) as exc:
        build_plan(policy, state("applied"))
    assert f"account '{name}' exists" in str(exc.value) and "rename the team" in str(exc.value)


def test_plans_are_frozen() -> None:
    plan = build_plan(example(), state("empty"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.changes[0].argv = ("true",)  # type: ignore[misc]
    assert isinstance(plan.changes, tuple) and all(isinstance(c.argv, tuple) for c in plan.changes)


# -- lua table file and CLI edges (no cluster) -------------------------------------------------------------------
def test_lua_table_lives_beside_slurm_conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "etc" / "slurm.conf"))
    assert lua_table_path() == tmp_path / "etc" / "nuro_policy.lua"
    target = lua_table_path()
    write_atomic(target, "return {}\n")
    write_atomic(target, "return {format = 1}\n")
    assert target.read_text() == "return {format = 1}\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(target.parent) == ["nuro_policy.lua"], "no temp file left behind"


def test_invalid_policy_exits_3_and_lists_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "teams.yaml"
    bad.write_text("cluster_gpus: 8\nteams:\n  a: {quota_gpus: -1, colour: red}\n")
    result = CliRunner().invoke(main, ["policy", "apply", str(bad), "--json"])
    assert result.exit_code == 3, result.output
    assert "teams.a.colour: unknown key" in result.output and "teams.a.quota_gpus" in result.output
    bad.write_text("teams:\n  a: {quota_gpus: 8}\n")  # a missing key is named, not shown with its whole mapping
    result = CliRunner().invoke(main, ["policy", "apply", str(bad)])
    assert "cluster_gpus: required, and missing" in result.output and "got" not in result.output, result.output
    bad.write_text("teams: [\n")  # a YAML error names the file and line, its lines kept under the problem's dash
    result = CliRunner().invoke(main, ["policy", "apply", str(bad)])
    assert result.exit_code == 3 and f'      in "{bad}", line 2' in result.output, result.output
    result = CliRunner().invoke(main, ["policy", "apply", str(tmp_path)])  # click refuses a directory itself
    assert result.exit_code == 2 and "is a directory" in result.output
    with pytest.raises(PolicyError, match="cannot read the file: Is a directory"):  # the library says it too
        load_policy(tmp_path)


def test_usage_error_exits_2() -> None:
    assert CliRunner().invoke(main, ["policy", "apply"]).exit_code == 2

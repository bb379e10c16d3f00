"""The job spec: one option table → YAML schema, validation, click options, docs."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from nuro.jobspec import (
    SPEC_OPTIONS,
    SpecError,
    build_spec,
    click_options,
    flag_values,
    load_spec_file,
    options_markdown,
    split_code_flag,
)
from nuro.jobspec.fields import TEAM_PATTERN, is_digest_ref
from nuro.policy.model import NAME

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32
BASE = {
    "name": "resnet50-ddp",
    "team": "perception",
    "dataset": f"imagenet@{DIGEST}",
    "code.repo": "/shared/alice/vision",
    "entrypoint.script": "train.py",
}


def problems_of(*layers) -> list[str]:
    with pytest.raises(SpecError) as info:
        build_spec(*layers)
    return info.value.problems


def test_minimal_spec_gets_the_table_defaults() -> None:
    spec = build_spec(BASE)
    assert (spec.nodes, spec.gpus_per_node, spec.time_limit_s, spec.ckpt_interval_s, spec.ckpt_keep) == (
        1, 8, 3600, 1800, 3,
    )  # fmt: skip
    assert spec.tier is None and spec.code_commit is None and spec.allow_dirty is False
    assert spec.launcher == "torchrun" and spec.total_gpus == 8


def test_yaml_file_with_groups(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "name: r1\nteam: perception\nnodes: 2\ntime_limit: '2-12:00:00'\n"
        f"dataset: imagenet@{DIGEST}\n"
        "code: {repo: /shared/vision, commit: 9c1e2d4}\n"
        "entrypoint: {script: ddp/train.py, args: [--epochs, 90], deepspeed_config: ds/z3.json}\n"
        "env: {NCCL_DEBUG: WARN, OMP_NUM_THREADS: 4}\n"
        "checkpoint: {interval_s: 600, keep: 5}\nresume_from: '1234'\n"
    )
    spec = build_spec(load_spec_file(path))
    assert spec.time_limit_s == 2 * 86400 + 12 * 3600
    assert spec.code_commit == "9c1e2d4" and spec.args == ("--epochs", "90")
    assert spec.env == (("NCCL_DEBUG", "WARN"), ("OMP_NUM_THREADS", "4"))
    assert spec.launcher == "deepspeed" and spec.ckpt_interval_s == 600 and spec.resume_from == "1234"


def test_flags_override_the_file() -> None:
    spec = build_spec(BASE, {"nodes": "4", "gpus_per_node": "2"})
    assert (spec.nodes, spec.gpus_per_node) == (4, 2)


def test_unknown_keys_list_every_valid_key_with_its_default(tmp_path: Path) -> None:
    path = tmp_path / "typo.yaml"
    path.write_text("name: r1\nnode: 2\ncheckpoint: {interval: 60}\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    text = str(info.value)
    assert "unknown key 'node'; valid keys: name (default: required), team (default: required)" in text
    assert "nodes (default: 1)" in text and "checkpoint.interval_s (default: 1800)" in text
    assert (
        "unknown key 'checkpoint.interval'; valid keys under checkpoint: checkpoint.interval_s, checkpoint.keep" in text
    )


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of({"nodes": 0, "gpus_per_node": "many"})
    fields = {p.split(":")[0] for p in problems}
    assert {"name", "team", "dataset", "code.repo", "entrypoint.script", "nodes", "gpus_per_node"} <= fields


@pytest.mark.parametrize(
    ("layer", "want"),
    [
        ({"nodes": 0}, "nodes: must be from 1 to 1024, got 0"),
        ({"nodes": True}, "nodes: must be a whole number from 1 to 1024, got True"),
        ({"gpus_per_node": 17}, "gpus_per_node: must be from 0 to 16, got 17"),
        ({"time_limit": "0:30"}, "time_limit: must be from 1 minute(s) to 30 days, got 0:30"),
        ({"time_limit": "1:2:3"}, "time_limit: must be a Slurm time limit"),
        ({"time_limit": "31-00:00:00"}, "must be from 1 minute(s) to 30 days"),
        ({"checkpoint.interval_s": 0}, "checkpoint.interval_s: must be from 1 to 604800, got 0"),
        ({"dataset": "imagenet"}, "dataset: must be NAME@TAG or NAME@sha256:<64 lower-case hex>"),
        ({"dataset": "imagenet@sha256:abc"}, "dataset: must be NAME@TAG or NAME@sha256"),
        ({"code.commit": "HEAD"}, "code.commit: must be a commit id of 7 to 64 lower-case hex digits"),
        ({"code.repo": "vision"}, "code.repo: must be an absolute path (starting with /)"),
        ({"entrypoint.args": "--epochs 90"}, "entrypoint.args: must be a list of arguments, got str"),
        ({"env": {"lower": "x"}}, "env: name must be an upper-case name"),
        ({"env": {"SLURM_JOB_ID": "1"}}, "env: SLURM_JOB_ID is reserved"),
        ({"env": {"LD_PRELOAD": "/x.so", "PATH": "/bin"}}, "env: PATH is reserved"),
        ({"stop_warning_s": 3600, "time_limit": 60}, "stop_warning_s: 3600 s must be shorter than time_limit (3600 s)"),
        ({"code.allow_dirty": True, "code.commit": "abcdef1"}, "code.allow_dirty: only applies to HEAD"),
        ({"entrypoint.script": ".git/hooks/x"}, "entrypoint.script: must not point into .git"),
        ({"resume_from": "run-7"}, "resume_from: must be the Slurm job id of an earlier run (digits only)"),
    ],
)
def test_precise_errors_name_the_field(layer: dict, want: str) -> None:
    problems = problems_of(BASE, layer)
    assert any(want in p for p in problems), problems


@pytest.mark.parametrize("value", ["90", 90, "1:30", "4:00:00", "2-12", "2-12:30", "2-12:30:15"])
def test_time_limit_forms(value: object) -> None:
    assert build_spec(BASE, {"time_limit": value, "stop_warning_s": 30}).time_limit_s > 0


def test_spec_file_problems(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("name: " + "x" * 70000)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    for path, want in ((big, "at most 65536"), (bad, "not valid UTF-8 YAML"), (listy, "must be a mapping")):
        with pytest.raises(SpecError, match=re.escape(want)):
            load_spec_file(path)
    with pytest.raises(SpecError, match="cannot read the spec file"):
        load_spec_file(tmp_path / "missing.yaml")
    with pytest.raises(SpecError) as err:  # the YAML error names the file, not pyyaml's "<unicode string>"
        load_spec_file(bad)
    assert f'in "{bad}", line 2' in str(err.value) and "unicode string" not in str(err.value)


def test_code_flag_takes_repo_at_commit_and_relative_paths(tmp_path: Path) -> None:
    assert split_code_flag("/r/vision@abcdef1") == {"code.repo": "/r/vision", "code.commit": "abcdef1"}
    assert split_code_flag("vision", cwd="/home/a") == {"code.repo": "/home/a/vision"}
    assert split_code_flag(".", cwd="/home/a/vision") == {"code.repo": "/home/a/vision"}
    with pytest.raises(SpecError, match="must not contain '..'"):
        split_code_flag("../other", cwd="/home/a/vision")


def test_team_pattern_is_the_policy_models() -> None:
    assert TEAM_PATTERN == NAME


def test_digest_refs() -> None:
    assert is_digest_ref(f"imagenet@{DIGEST}")
    assert not is_digest_ref("imagenet@v3") and not is_digest_ref(f"imagenet@{DIGEST}\n")


def test_docs_carry_the_generated_options_table() -> None:
    doc = (REPO / "docs" / "submit.md").read_text()
    assert options_markdown() in doc, "docs/submit.md is out of date: paste options_markdown() output into it"


def test_click_options_are_generated_and_only_given_flags_override() -> None:
    seen = {}

    @click.command()
    @click_options()
    def cmd(**kwargs):
        seen.update(flag_values(kwargs))

    result = CliRunner().invoke(cmd, ["--nodes", "2", "--env", "A=1", "--env", "B=2", "--arg", "--lr=3e-4", "--help"])
    assert result.exit_code == 0
    for opt in SPEC_OPTIONS:
        assert opt.flag in result.output
    result = CliRunner().invoke(cmd, ["--nodes", "2", "--env", "A=1", "--env", "B=2", "--arg", "--lr=3e-4"])
    assert result.exit_code == 0, result.output
    assert seen == {"nodes": "2", "env": ["A=1", "B=2"], "entrypoint.args": ["--lr=3e-4"]}
    seen.clear()
    CliRunner().invoke(cmd, ["--allow-dirty"])
    assert seen == {"code.allow_dirty": True}

"""nuro-sbatch's command line: sbatch 22.05's option table, the platform-flag rules, conflicts, the dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nuro.jobspec.preview import decide_words, load_policy_source
from nuro.jobspec.sbatch_args import (
    SBATCH_LONG,
    SbatchArgError,
    admission_args,
    parse_options,
    script_directives,
)
from nuro.login.sbatch_cli import UsageError, conflicts, insert_preamble, platform_values, spare_args, split_argv
from tests.unit.test_codepin import git

REPO = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "3f" * 32


def test_table_is_sbatch_22_05s() -> None:
    assert len(SBATCH_LONG) == 106  # common_options entries sbatch accepts in 22.05.8
    assert SBATCH_LONG["nodes"].has_arg == "r" and SBATCH_LONG["nodes"].short == "N"
    assert SBATCH_LONG["exclusive"].has_arg == "o" and SBATCH_LONG["hold"].has_arg == "n"


@pytest.mark.parametrize(
    ("argv", "want"),
    [
        (["-N", "2"], [("nodes", "2", ("-N", "2"))]),
        (["-N2"], [("nodes", "2", ("-N2",))]),
        (["-HvN2"], [("nodes", "2", ("-HvN2",))]),
        (["--nodes", "2-4"], [("nodes", "2-4", ("--nodes", "2-4"))]),
        (["--gpus-per-node=8"], [("gpus-per-node", "8", ("--gpus-per-node=8",))]),
        (["--exclusive", "--hold"], [("exclusive", None, ("--exclusive",)), ("hold", None, ("--hold",))]),
        (["--exclusive=user"], [("exclusive", "user", ("--exclusive=user",))]),
        (["--acco", "x"], [("account", "x", ("--acco", "x"))]),
        (["--future-opt=3"], [(None, "3", ("--future-opt=3",))]),
        (["-o", "-dash-file"], [("output", "-dash-file", ("-o", "-dash-file"))]),
    ],
)
def test_options_are_read_like_getopt_long(argv: list[str], want: list) -> None:
    assert [(w.name, w.value, w.tokens) for w in parse_options(argv)] == want


@pytest.mark.parametrize(
    ("argv", "want"),
    [(["--acc=x"], "ambiguous"), (["--hold=1"], "takes no value"), (["-N"], "needs a value"),
     (["-Z"], "not an sbatch option"), (["--future-flag"], "not an sbatch 22.05 option")],
)  # fmt: skip
def test_unreadable_options(argv: list[str], want: str) -> None:
    with pytest.raises(SbatchArgError, match=want):
        parse_options(argv)


def test_directives_stop_at_the_first_command() -> None:
    text = "#!/bin/bash\n#SBATCH -N 2 # two nodes\n\n#SBATCH --qos=urgent\n# note\necho hi\n#SBATCH -A late\n"
    assert script_directives(text) == ["-N", "2", "--qos=urgent"]


def test_admission_args_last_wins_and_normalises() -> None:
    words = parse_options(["-N2", "--gpus-per-node=4", "--hold", "-N", "3", "--no-requeue", "-J", "x"])
    assert admission_args(words) == ["--nodes=3", "--gpus-per-node=4", "--no-requeue"]


def test_platform_flags_before_the_script_the_rest_untouched() -> None:
    p = split_argv(["-N2", "--team", "perception", "--hold", f"--dataset=imagenet@{DIGEST}", "job.sh", "--team",
                    "x", "-N", "9"])  # fmt: skip
    assert p.platform == {"--team": "perception", "--dataset": f"imagenet@{DIGEST}"}
    assert [t for w in p.words for t in w.tokens] == ["-N2", "--hold"]
    assert p.script == "job.sh" and p.script_args == ["--team", "x", "-N", "9"]


def test_double_dash_and_stdin_scripts() -> None:
    p = split_argv(["--team=perception", "--", "-weird-name.sh", "a"])
    assert p.double_dash and p.script == "-weird-name.sh" and p.script_args == ["a"]
    p = split_argv(["--team=perception", "-N2"])
    assert p.script is None and p.script_args == []


@pytest.mark.parametrize(
    ("argv", "want"),
    [(["--tea", "x", "job.sh"], "abbreviates nuro's --team"), (["--comm=x", "job.sh"], "abbreviates nuro's --commit"),
     (["--team", "a", "--team", "b"], "given twice"), (["--allow-dirty=yes"], "takes no value"),
     (["--dataset"], "needs a value")],
)  # fmt: skip
def test_flag_rule_violations_are_usage_errors(argv: list[str], want: str) -> None:
    with pytest.raises(UsageError, match=want):
        split_argv(argv)


def test_heterogeneous_jobs_pass_through_only_without_platform_flags() -> None:
    with pytest.raises(SbatchArgError, match="heterogeneous jobs"):
        split_argv(["--team=perception", "-N1", ":", "-N2", "job.sh"])


def test_values_are_checked_by_the_spec_kinds() -> None:
    argv = ["--team=perception", "--code=/r/vision@abcdef1", "--ckpt-interval=600", f"--dataset=imagenet@{DIGEST}",
            "job.sh"]  # fmt: skip
    values, problems = platform_values(split_argv(argv))
    assert problems == []
    assert values == {"team": "perception", "code.repo": "/r/vision", "code.commit": "abcdef1",
                      "checkpoint.interval_s": 600, "dataset": f"imagenet@{DIGEST}"}  # fmt: skip
    _, problems = platform_values(split_argv(["--commit=abcdef1", "--allow-dirty", "job.sh"]))
    assert "code.commit: needs --code REPO" in problems and "code.allow_dirty: needs --code REPO" in problems


def test_dataset_and_code_go_together() -> None:
    _, problems = platform_values(split_argv(["--team=perception", "--code=/r/vision", "job.sh"]))
    assert problems == [
        "--code: needs --dataset too: a run record pins both the dataset and the code (the job_submit bridge "
        "refuses a record without either); give neither for a job without a record"
    ]
    _, problems = platform_values(split_argv(["--team=perception", "--tier=urgent", "job.sh"]))
    assert problems == []


def test_conflicts_with_plain_sbatch_options_are_refused() -> None:
    words = parse_options(["-A", "prediction", "--qos=g-perception", "--comment=hello"])
    problems = conflicts({"team": "perception", "tier": "urgent"}, words, "perception")
    assert problems == [
        "--team perception conflicts with --account=prediction: give one of them",
        "--tier urgent conflicts with --qos=g-perception: give one of them",
        "--comment cannot be combined with platform flags: the job comment is nuro's run record",
    ]
    assert conflicts({"team": "perception"}, parse_options(["--account=perception"]), "perception") == []


def test_preamble_needs_a_shell_script() -> None:
    with pytest.raises(UsageError, match="needs a sh or bash batch script"):
        insert_preamble("#!/usr/bin/env python3\nprint(1)\n", "# x\n")
    assert insert_preamble("#!/bin/sh\necho hi", "# x\n") == "#!/bin/sh\n# x\necho hi"


def nuro_sbatch(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "nuro.login.sbatch_cli", *args]
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "vision"
    (r / "src").mkdir(parents=True)
    git(r, "init", "-q")
    (r / "src" / "train.py").write_text("print('hi')\n")
    (r / "job.sh").write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gpus-per-node=8\npython train.py\n")
    git(r, "add", ".")
    git(r, "commit", "-qm", "one")
    return r


@pytest.fixture
def no_sbatch_path(tmp_path: Path) -> str:
    """A PATH with git but no Slurm client: anything that tried to submit would fail loudly."""
    bin_dir = tmp_path / "gitonly"
    bin_dir.mkdir()
    (bin_dir / "git").symlink_to(subprocess.run(["which", "git"], capture_output=True, text=True).stdout.strip())
    return str(bin_dir)


def test_dry_run_prints_the_argv_the_preamble_and_the_bridge_decision(repo: Path) -> None:
    out = nuro_sbatch("--team", "perception", f"--dataset=imagenet@{DIGEST}", "--code", "..", "--run-root=/runs",
                      "--dry-run", "--policy", str(REPO / "examples/policy/teams.yaml"), "--hold", "../job.sh",
                      cwd=repo / "src")  # fmt: skip
    assert out.returncode == 3 and "a relative path must not contain '..'" in out.stderr
    out = nuro_sbatch("--team", "perception", f"--dataset=imagenet@{DIGEST}", "--code", str(repo),
                      "--run-root=/runs", "--dry-run", "--policy", str(REPO / "examples/policy/teams.yaml"),
                      "--hold", "../job.sh", "x", cwd=repo / "src")  # fmt: skip
    assert out.returncode == 0, out.stderr
    head = git(repo, "rev-parse", "HEAD").strip()
    assert out.stdout.startswith('sbatch argv: sbatch --account=perception \'--comment={"nuro":')
    assert f'"commit":"{head}"' in out.stdout and f'"digest":"{DIGEST}"' in out.stdout
    assert "--hold job.sh x\n" in out.stdout  # the private copy keeps the script's name (Slurm's job name)
    # the whole script as submitted: the user's header, nuro's preamble, the user's lines (issue 33: no placeholder)
    script = out.stdout.split("script job.sh as submitted (nuro's preamble after the #SBATCH header):\n", 1)[1]
    assert script.startswith("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gpus-per-node=8\n"), script
    assert "\npython train.py\n" in script and script.index("nuro_fail") < script.index("python train.py")
    assert 'cd "$NURO_CODE_DIR"/src || nuro_fail' in out.stdout  # submitted from src/: run in src/ of the checkout
    assert "bridge preview (policy" in out.stdout


def test_hostile_values_never_reach_sbatch(repo: Path, tmp_path: Path, no_sbatch_path: str) -> None:
    marker = tmp_path / "pwned"
    attempts = (["--dataset", f"x;touch {marker}"], ["--team", f"$(touch {marker})"],
                ["--code", f"{repo}`touch {marker}`"], ["--run-root", f"/tmp/x\ntouch {marker}"],
                ["--resume-from", "1;touch"])  # fmt: skip
    for args in attempts:
        out = nuro_sbatch(*args, "--team=perception" if args[0] != "--team" else "--hold", "job.sh", cwd=repo,
                          env={"PATH": no_sbatch_path})  # fmt: skip
        assert out.returncode == 3, (args, out.stderr)
        assert "invalid platform flags" in out.stderr and args[0] in out.stderr
    assert not marker.exists()


def test_dirty_tree_is_refused_before_sbatch(repo: Path, no_sbatch_path: str) -> None:
    (repo / "src" / "train.py").write_text("print('changed')\n")
    out = nuro_sbatch("--team=perception", f"--code={repo}", f"--dataset=imagenet@{DIGEST}", "job.sh", cwd=repo,
                      env={"PATH": no_sbatch_path})  # fmt: skip
    assert out.returncode == 3 and "uncommitted changes: src/train.py (M)" in out.stderr


def test_platform_help_lists_every_platform_flag_with_its_help() -> None:
    from nuro.login.sbatch_cli import OWN_FLAGS, PLATFORM, platform_help

    text = platform_help()
    for flag, opt in PLATFORM.items():
        assert f"  {flag} " in text or f"  {flag}\n" in text, flag
        assert opt.help.split()[0] in text
    for flag in OWN_FLAGS:
        assert f"  {flag}" in text
    assert "Default: 1800 s." in text and text.endswith("sbatch's own options:\n")
    assert max(len(line) for line in text.splitlines()) <= 104


@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--team=perception", "--help"], ["-N", "2", "--help"]])
def test_help_shows_nuro_flags_then_sbatchs_own(argv: list[str], tmp_path: Path) -> None:
    """The real sbatch (22.05 prints its help once it has any configuration: a two-line slurm.conf will do)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    out = nuro_sbatch(*argv, cwd=tmp_path, env={"SLURM_CONF": str(conf)})
    assert out.returncode == 0, out.stderr
    nuro_part, _, sbatch_part = out.stdout.partition("sbatch's own options:\n")
    assert "--team TEAM" in nuro_part and "--code REPO[@COMMIT]" in nuro_part and "--dry-run" in nuro_part
    assert sbatch_part.startswith("Usage: sbatch") and "--account=name" in sbatch_part


def test_help_without_a_slurm_configuration_still_shows_nuros_part(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("NotAKey=1\n")  # sbatch refuses at once (a missing file it would retry for 60 s)
    out = nuro_sbatch("--help", cwd=tmp_path, env={"SLURM_CONF": str(conf)})
    assert out.returncode == 0
    assert "--team TEAM" in out.stdout and "sbatch --help exited" in out.stdout


def test_help_into_a_reader_that_stops_early_ends_quietly(tmp_path: Path) -> None:
    """``nuro-sbatch --help | head -1``: the reader is gone before sbatch's part ends; nuro-sbatch stops as a command
    killed by SIGPIPE does (141), with no traceback. The stand-in sbatch waits until the reader has closed."""
    go, bin_dir = tmp_path / "go", tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\nfor i in $(seq 200); do [ -e {go} ] && exit 1; sleep 0.05; done\n")
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.Popen([sys.executable, "-m", "nuro.login.sbatch_cli", "--help"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().startswith(b"usage: nuro-sbatch")
    proc.stdout.close()
    go.touch()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 141 and b"Traceback" not in err, err.decode()


def test_spare_nodes_add_the_spares_and_no_kill_after_the_users_words(repo: Path) -> None:
    out = nuro_sbatch("--team", "perception", f"--dataset=imagenet@{DIGEST}", "--code", str(repo),
                      "--run-root=/runs", "--spare-nodes", "1", "--dry-run", "--policy",
                      str(REPO / "examples/policy/teams.yaml"), "../job.sh", cwd=repo / "src")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert " --nodes=3 --no-kill job.sh\n" in out.stdout  # job.sh has -N 2
    assert "export NURO_SPARE_NODES=1" in out.stdout and '"spares":{"nodes":1}' in out.stdout
    # the bridge's preview (as a team member: root is let through unjudged) counts the spare's GPUs
    source = load_policy_source(str(REPO / "examples/policy/teams.yaml"))
    words = parse_options(["-N", "2", "--gpus-per-node=8", "--account=perception"])
    assert decide_words([*words, *parse_options(spare_args(1, words))], "alice", source).gpus == 24
    out = nuro_sbatch("--team", "perception", "--spare-nodes", "1", "-N", "2-4", "--dry-run", "../job.sh",
                      cwd=repo / "src")  # fmt: skip
    assert out.returncode == 2 and "--spare-nodes needs a fixed node count, got --nodes=2-4" in out.stderr
    with pytest.raises(UsageError, match="needs a fixed node count, got --nodes=²"):  # isdigit alone passes "²"
        spare_args(1, parse_options(["-N", "²"]))

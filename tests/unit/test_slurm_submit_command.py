"""``SubmitCommand``: a user's own sbatch command line, rendered untouched and run with sbatch speaking directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from nuro.slurm import CliBackend, SlurmCommandNotFound, SubmitCommand, render_argv

FAKE_SBATCH = """#!/bin/sh
printf 'args:'; printf ' [%s]' "$@"; printf '\\n'
printf 'team=%s\\n' "$NURO_TEAM"
[ "$1" = "--stdin" ] && cat
echo "sbatch: warning: from the fake" >&2
exit 7
"""


def test_renders_the_users_argv_untouched() -> None:
    cmd = SubmitCommand(["--account=p", "-N", "2", "--", "job.sh", "x y"])
    assert render_argv(cmd) == ["sbatch", "--account=p", "-N", "2", "--", "job.sh", "x y"]
    assert cmd.args == ("--account=p", "-N", "2", "--", "job.sh", "x y") and cmd.stdin is None


def test_sbatch_speaks_directly_and_its_status_is_returned(tmp_path: Path, capfdbinary: pytest.CaptureFixture) -> None:
    (tmp_path / "sbatch").write_text(FAKE_SBATCH)
    (tmp_path / "sbatch").chmod(0o755)
    backend = CliBackend(env={"NURO_TEAM": "perception"}, bin_dir=str(tmp_path))
    assert backend.submit_command(SubmitCommand(("--stdin", "a b"), b"#!/bin/sh\n\xff\n")) == 7
    out, err = capfdbinary.readouterr()
    assert out == b"args: [--stdin] [a b]\nteam=perception\n#!/bin/sh\n\xff\n"  # the script's bytes, undecoded
    assert err == b"sbatch: warning: from the fake\n"


def test_a_missing_sbatch_is_classified(tmp_path: Path) -> None:
    with pytest.raises(SlurmCommandNotFound):
        CliBackend(bin_dir=str(tmp_path)).submit_command(SubmitCommand(("job.sh",)))

"""Code pinning against real git repositories in tmp dirs (git is a local tool, not a service: no mocks needed)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from nuro.jobspec.codepin import MAX_DIFF_BYTES, CodePinError, pin_code
from nuro.jobspec.render import HELPER_LINES, checkout_lines, code_exports


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "vision"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "train.py").write_text("print('v1')\n")
    (r / "VERSION").write_text("A\n")
    (r / ".gitignore").write_text("outputs/\n")
    (r / "model.bin").write_bytes(bytes(range(256)))
    git(r, "add", ".")
    git(r, "commit", "-qm", "one")
    return r


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").strip()


def test_clean_tree_pins_head(repo: Path) -> None:
    pin = pin_code(str(repo), require_paths=["train.py"])
    assert pin.commit == head(repo) and not pin.dirty and pin.diff is None and pin.diff_sha256 is None


def test_dirty_tree_is_refused_with_the_paths(repo: Path) -> None:
    (repo / "VERSION").write_text("B\n")
    (repo / "new.py").write_text("x = 1\n")
    (repo / "outputs").mkdir()
    (repo / "outputs" / "big.ckpt").write_bytes(b"0" * 10)  # ignored: not a change
    with pytest.raises(CodePinError, match=r"uncommitted changes: VERSION \(M\), new.py \(\?\?\)\. Commit or stash"):
        pin_code(str(repo))


def test_allow_dirty_captures_tracked_and_untracked_changes_without_touching_the_index(repo: Path) -> None:
    (repo / "VERSION").write_text("B\n")
    (repo / "new.py").write_text("x = 1\n")
    (repo / "model.bin").write_bytes(bytes(reversed(range(256))))
    git(repo, "add", "VERSION")  # a staged change stays staged, the rest stays unstaged
    before = git(repo, "status", "--porcelain")
    pin = pin_code(str(repo), allow_dirty=True, require_paths=["new.py"])
    assert git(repo, "status", "--porcelain") == before
    assert pin.dirty and pin.commit == head(repo) and pin.diff is not None
    assert pin.diff_sha256 == "sha256:" + hashlib.sha256(pin.diff).hexdigest()
    text = pin.diff.decode(errors="replace")
    assert "+B" in text and "new file mode" in text and "+x = 1" in text and "GIT binary patch" in text


def test_explicit_commit_ignores_the_work_tree(repo: Path) -> None:
    first = head(repo)
    (repo / "VERSION").write_text("B\n")
    git(repo, "commit", "-qam", "two")
    (repo / "VERSION").write_text("C\n")  # dirty, but irrelevant for an explicit commit
    pin = pin_code(str(repo), first[:9])
    assert pin.commit == first and not pin.dirty


@pytest.mark.parametrize(
    ("setup", "kwargs", "want"),
    [
        ("subdir", {}, "is inside the repository"),
        ("norepo", {}, "git rev-parse failed"),
        ("empty", {}, "has no commits yet"),
        ("ok", {"commit": "deadbeef"}, "commit deadbeef is not in"),
        ("ok", {"require_paths": ["missing.py"]}, "missing.py is not a file in commit"),
        ("ok", {"require_paths": ["outputs"]}, "outputs is not a file"),
    ],
)
def test_errors_say_what_to_do(tmp_path: Path, repo: Path, setup: str, kwargs: dict, want: str) -> None:
    path = repo
    if setup == "subdir":
        (repo / "src").mkdir()
        path = repo / "src"
    elif setup == "norepo":
        path = tmp_path / "plain"
        path.mkdir()
    elif setup == "empty":
        path = tmp_path / "empty"
        path.mkdir()
        git(path, "init", "-q")
    with pytest.raises(CodePinError, match=want):
        pin_code(str(path), **kwargs)


def test_a_too_large_change_is_refused_before_objects_are_written(repo: Path) -> None:
    (repo / "data.bin").write_bytes(b"x" * (MAX_DIFF_BYTES + 1))
    objects_before = sorted(p.name for p in (repo / ".git" / "objects").iterdir())
    with pytest.raises(CodePinError, match="untracked files .* add up to"):
        pin_code(str(repo), allow_dirty=True)
    assert sorted(p.name for p in (repo / ".git" / "objects").iterdir()) == objects_before


def test_caller_git_environment_cannot_redirect_the_pin(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = head(repo)
    monkeypatch.setenv("GIT_DIR", "/nonexistent")
    monkeypatch.setenv("GIT_WORK_TREE", "/")
    assert pin_code(str(repo)).commit == want


def run_checkout(pin, job_root: Path, job_id: str = "7", extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """The rendered checkout step, run by /bin/sh (dash) as the job would, with a hostile git environment."""
    script = "\n".join(["set -u", *code_exports(pin, str(job_root)), *HELPER_LINES, *checkout_lines(pin)]) + "\n"
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job_id, "GIT_DIR": "/nonexistent", **(extra_env or {})}
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)


def test_checkout_step_materialises_exactly_the_pinned_commit_and_patch(repo: Path, tmp_path: Path) -> None:
    (repo / "VERSION").write_text("B\n")
    (repo / "new.py").write_text("x = 1\n")
    (repo / "model.bin").write_bytes(b"\x00\xff" * 100)
    pin = pin_code(str(repo), allow_dirty=True)
    (repo / "VERSION").write_text("LATER\n")  # edits after submit never reach the job
    out = run_checkout(pin, tmp_path / "runs")
    assert out.returncode == 0, out.stderr
    code = tmp_path / "runs" / "7" / "code"
    assert f"checked out commit {pin.commit}" in out.stdout
    assert (code / "VERSION").read_text() == "B\n" and (code / "new.py").read_text() == "x = 1\n"
    assert (code / "model.bin").read_bytes() == b"\x00\xff" * 100
    assert not (code / ".git").exists()
    again = run_checkout(pin, tmp_path / "runs")  # a requeue reuses the checkout
    assert again.returncode == 0 and "reusing the checkout" in again.stdout


def test_checkout_step_refuses_a_tampered_patch(repo: Path, tmp_path: Path) -> None:
    (repo / "VERSION").write_text("B\n")
    pin = pin_code(str(repo), allow_dirty=True)
    from dataclasses import replace

    forged = replace(pin, diff=pin.diff.replace(b"+B", b"+E"))  # digest left as recorded
    out = run_checkout(forged, tmp_path / "runs")
    assert out.returncode == 1 and "does not match its recorded digest" in out.stderr
    assert not (tmp_path / "runs" / "7" / "code").exists()


def test_checkout_step_fails_clearly_when_the_commit_is_gone(repo: Path, tmp_path: Path) -> None:
    pin = pin_code(str(repo))
    from dataclasses import replace

    out = run_checkout(replace(pin, commit="0" * 40), tmp_path / "runs")
    assert out.returncode == 1 and "git archive of commit 0000" in out.stderr

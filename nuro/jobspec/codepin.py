"""Code pinning: which exact code a run executes, decided on the login node at submit time.

``pin_code(repo)`` returns the commit SHA of a clean work tree. A dirty tree is refused unless ``allow_dirty``; then
the uncommitted changes are captured as a patch (bytes + sha256) that the caller may store (S3, when configured) and
that the renderer ships inside the job script, so the job runs HEAD + exactly that patch. Nothing here writes to the
user's branch, index or work tree; every git call is an argument list with a scrubbed environment (no ``GIT_DIR``
from the caller's shell can redirect it) and an explicit timeout.

What the capture contains: ``git diff HEAD`` of the whole work tree *including untracked, non-ignored files* (they
are part of "what I would run" and a plain ``git diff HEAD`` silently drops them). It is built in a temporary index
(``GIT_INDEX_FILE``: ``read-tree HEAD`` + ``add -A`` + ``diff --cached --binary``), so the user's own index is left
alone; the only side effect is blob objects for the changed files in the repository's object store.

When ``commit`` is given (even if it is HEAD), the work tree is irrelevant (that commit is archived as it is) and
its state is not checked. The renderer checks the commit out on the nodes with ``git archive`` (see
``nuro.jobspec.render``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace

log = logging.getLogger(__name__)

#: The largest uncommitted-changes patch nuro ships inside a job script (base64 grows it by 4/3; Slurm 22.05's
#: default max_script_size is 4 MB). Larger changes belong in a commit.
MAX_DIFF_BYTES = 1024 * 1024
#: Paths shown when a dirty tree is refused.
_SHOW_PATHS = 10
#: git environment variables that would redirect or reconfigure the calls below; dropped from the caller's env.
_GIT_ENV_DROP_PREFIX = "GIT_"


class CodePinError(ValueError):
    """The code cannot be pinned; the message says why and what to do."""


@dataclass(frozen=True)
class CodePin:
    """The code a run executes.

    Attributes:
        repo: the repository's top level (absolute path the nodes read from).
        commit: the full commit id that is checked out on the nodes.
        dirty: True when uncommitted changes ship with the job (``allow_dirty``).
        diff: the patch applied on top of ``commit`` (``git apply`` format, binary-safe); None when clean.
        diff_sha256: ``sha256:<hex>`` of ``diff``; recorded in the job comment and checked by the job.
        diff_uri: where the caller stored the patch (e.g. ``s3://nuro/code-diffs/<team>/sha256/<hex>.patch``), or None.
    """

    repo: str
    commit: str
    dirty: bool = False
    diff: bytes | None = None
    diff_sha256: str | None = None
    diff_uri: str | None = None

    def with_diff_uri(self, uri: str) -> CodePin:
        return replace(self, diff_uri=uri)


def digest_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_GIT_ENV_DROP_PREFIX)}
    # C locale: messages we show are stable; no optional locks: `status` must not write the user's index.
    env.update({"LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0"})
    return env


class _Git:
    """git -C <repo> with argument lists, a timeout and a scrubbed environment."""

    def __init__(self, repo: str, git: str, timeout_s: float, extra_env: dict[str, str] | None = None) -> None:
        self.repo, self.git, self.timeout_s = repo, git, timeout_s
        self.env = {**_git_env(), **(extra_env or {})}

    def run(self, *args: str, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        argv = [self.git, "-C", self.repo, *args]
        log.debug("git argv=%s", argv)
        try:
            proc = subprocess.run(
                argv, input=stdin, capture_output=True, env=self.env, timeout=self.timeout_s, check=False
            )
        except FileNotFoundError as exc:
            raise CodePinError(f"git not found ({self.git!r}); install git on the login node") from exc
        except subprocess.TimeoutExpired as exc:
            raise CodePinError(f"git {args[0]} in {self.repo} took longer than {self.timeout_s:.0f} s") from exc
        if check and proc.returncode != 0:
            message = proc.stderr.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            raise CodePinError(f"git {args[0]} failed in {self.repo}: {message}")
        return proc

    def text(self, *args: str) -> str:
        return self.run(*args).stdout.decode(errors="replace").strip()

    def start(self, *args: str, stdin: bytes | None = None) -> tuple[subprocess.Popen[bytes], bytes | None, tuple]:
        """Start a git call without waiting (``finish`` collects it): independent calls overlap, so pinning costs
        about one git start-up instead of one per call."""
        argv = [self.git, "-C", self.repo, *args]
        log.debug("git argv=%s", argv)
        try:
            proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=self.env,
            )  # fmt: skip
        except FileNotFoundError as exc:
            raise CodePinError(f"git not found ({self.git!r}); install git on the login node") from exc
        return proc, stdin, args

    def finish(self, started: tuple[subprocess.Popen[bytes], bytes | None, tuple]) -> subprocess.CompletedProcess:
        proc, stdin, args = started
        try:
            out, err = proc.communicate(stdin, timeout=self.timeout_s)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.communicate()
            raise CodePinError(f"git {args[0]} in {self.repo} took longer than {self.timeout_s:.0f} s") from exc
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


STATUS_ARGS = ("status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=none")


def _status_paths(out: bytes) -> list[tuple[str, str]]:
    """(XY status, path) for every change in ``git status --porcelain=v1 -z`` output, untracked files included."""
    entries: list[tuple[str, str]] = []
    fields = out.decode(errors="replace").split("\0")
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        if code[0] in "RC":  # renames/copies carry the source path as the next field
            i += 1
        entries.append((code, path))
    return entries


def _capture_diff(git: _Git, repo: str, changes: list[tuple[str, str]], require_paths: Sequence[str]) -> bytes:
    """HEAD → work tree (untracked, non-ignored files included) as a binary-safe patch, via a temporary index."""
    untracked = sum(
        os.path.getsize(os.path.join(repo, p))
        for code, p in changes
        if code == "??" and os.path.isfile(os.path.join(repo, p))
    )
    if untracked > MAX_DIFF_BYTES:
        raise CodePinError(
            f"untracked files in {repo} add up to {untracked} bytes, above the {MAX_DIFF_BYTES} bytes nuro ships "
            "with a job; commit the code you need, and add data or outputs to .gitignore"
        )
    with tempfile.TemporaryDirectory(prefix="nuro-codepin-") as tmp:
        temp = _Git(repo, git.git, git.timeout_s, {"GIT_INDEX_FILE": os.path.join(tmp, "index")})
        temp.run("read-tree", "HEAD")
        temp.run("add", "-A", "--", ".")
        _check_paths(temp, "", require_paths)  # ":<path>" = the temporary index: HEAD + the changes
        # Explicit prefixes and no external diff/textconv: the patch must apply with plain `git apply -p1`
        # whatever the user's diff.* configuration says.
        diff = temp.run(
            "-c", "diff.noprefix=false", "diff", "--cached", "--binary", "--no-color", "--no-ext-diff",
            "--no-textconv", "--no-relative", "--src-prefix=a/", "--dst-prefix=b/", "HEAD",
        ).stdout  # fmt: skip
    if len(diff) > MAX_DIFF_BYTES:
        raise CodePinError(
            f"the uncommitted changes in {repo} are {len(diff)} bytes as a patch, above the {MAX_DIFF_BYTES} bytes "
            "nuro ships with a job; commit them (and pin that commit) instead of --allow-dirty"
        )
    return diff


def _paths_query(rev: str, paths: Sequence[str]) -> bytes:
    return "".join(f"{rev}:{p}\n" for p in paths).encode()


def _check_paths(git: _Git, commit: str, paths: Sequence[str], answer: bytes | None = None) -> None:
    """Every path is a file in ``commit`` (or, for commit "", in the index git uses). ``answer``: the output of a
    ``cat-file --batch-check`` already run for these paths."""
    if not paths:
        return
    if answer is None:
        answer = git.run("cat-file", "--batch-check", stdin=_paths_query(commit, paths)).stdout
    lines = answer.decode(errors="replace").splitlines()
    for path, line in zip(paths, lines, strict=True):
        parts = line.split()
        if len(parts) != 3 or parts[1] != "blob":
            raise CodePinError(
                f"{path} is not a file in {('commit ' + commit[:12]) if commit else 'the work tree'} of {git.repo}; "
                "entry paths are relative to the repository's top level and must be committed (or shipped with "
                "--allow-dirty)"
            )


def pin_code(
    repo: str,
    commit: str | None = None,
    *,
    allow_dirty: bool = False,
    require_paths: Sequence[str] = (),
    git: str = "git",
    timeout_s: float = 30.0,
) -> CodePin:
    """Pin the code of ``repo``.

    Args:
        repo: the repository's top level (absolute; a subdirectory is refused so entry paths mean one thing).
        commit: a (possibly abbreviated) commit id to run; None pins HEAD, which must be clean unless allow_dirty.
        allow_dirty: pin HEAD plus the uncommitted changes, captured as a patch.
        require_paths: files (relative to the top level) that must exist in the pinned code, e.g. the entry script.
            With allow_dirty they may also be new files in the patch.
        git: the git executable.
        timeout_s: limit for each git call, in seconds.

    Returns:
        The CodePin; ``diff``/``diff_sha256`` set only when uncommitted changes ship with the job.

    Raises:
        CodePinError: not a repository, not its top level, unknown or ambiguous commit, a dirty tree without
            allow_dirty, a patch above MAX_DIFF_BYTES, or a required path missing.
    """
    g = _Git(repo, git, timeout_s)
    if not os.path.exists(os.path.join(repo, ".git")):  # not a top level (or no repository): say which, slowly
        top = g.text("rev-parse", "--show-toplevel")
        raise CodePinError(f"{repo} is inside the repository {top}; give its top level ({top}) as the code repo")
    rev = "HEAD" if commit is None else commit
    # Two git calls at once (git start-up dominates): one cat-file resolves the commit and looks up the paths in
    # it, one status lists what changed. About one git start-up of latency on a submit.
    query = f"{rev}^{{commit}}\n".encode() + _paths_query(rev, require_paths)
    lookup_call = g.start("cat-file", "--batch-check", stdin=query)
    status_call = g.start(*STATUS_ARGS) if commit is None else None
    lookup = g.finish(lookup_call)
    status = g.finish(status_call) if status_call else None
    first, _, rest = lookup.stdout.partition(b"\n")
    fields = first.decode(errors="replace").split()
    if lookup.returncode != 0 or len(fields) != 3 or fields[1] != "commit":
        _diagnose(g, repo, commit)
    target = fields[0]
    changes = _status_paths(status.stdout) if status is not None and status.returncode == 0 else []
    if status is not None and status.returncode != 0:
        raise CodePinError(f"git status failed in {repo}: {status.stderr.decode(errors='replace').strip()}")
    if not changes:  # an explicit commit ignores the work tree; a clean HEAD is itself
        _check_paths(g, target, require_paths, rest)
        return CodePin(repo=repo, commit=target)
    if not allow_dirty:
        shown = ", ".join(f"{path} ({code.strip()})" for code, path in changes[:_SHOW_PATHS])
        more = f" and {len(changes) - _SHOW_PATHS} more" if len(changes) > _SHOW_PATHS else ""
        raise CodePinError(
            f"{repo} has uncommitted changes: {shown}{more}. Commit or stash them, or pass --allow-dirty to run "
            "HEAD plus these changes (the diff is recorded with the run)"
        )
    diff = _capture_diff(g, repo, changes, require_paths)
    log.info("code pinned repo=%s commit=%s dirty=1 diff_bytes=%d", repo, target, len(diff))
    return CodePin(repo=repo, commit=target, dirty=True, diff=diff, diff_sha256=digest_bytes(diff))


def read_pinned(pin: CodePin, path: str, *, max_bytes: int, git: str = "git", timeout_s: float = 30.0) -> bytes:
    """The bytes of ``path`` as the job will see it: from the pinned commit, or from the work tree when uncommitted
    changes ship with the job (the patch is the work tree against HEAD). ``path`` was checked by ``pin_code``.

    Raises:
        CodePinError: unreadable, or larger than ``max_bytes``.
    """
    if pin.dirty:
        try:
            with open(os.path.join(pin.repo, path), "rb") as fh:
                data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise CodePinError(f"cannot read {path} in {pin.repo}: {exc.strerror}") from None
    else:
        data = _Git(pin.repo, git, timeout_s).run("cat-file", "blob", f"{pin.commit}:{path}").stdout
    if len(data) > max_bytes:
        raise CodePinError(f"{path} is larger than {max_bytes} bytes")
    return data


def _diagnose(g: _Git, repo: str, commit: str | None) -> None:
    """The precise error when the commit lookup failed (the slow path: only when pinning already failed)."""
    g.text("rev-parse", "--show-toplevel")  # raises git's own words: not a repository, dubious ownership, ...
    if g.run("rev-parse", "--verify", "--quiet", "HEAD^{commit}", check=False).returncode != 0:
        raise CodePinError(f"{repo} has no commits yet; commit your code first")
    raise CodePinError(
        f"commit {commit} is not in {repo} (or the abbreviation is ambiguous); give a longer id or fetch it"
    )


__all__ = ["MAX_DIFF_BYTES", "CodePin", "CodePinError", "digest_bytes", "pin_code", "read_pinned"]

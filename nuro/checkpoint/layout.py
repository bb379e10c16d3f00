"""Where checkpoints live: S3 keys and node-local staging paths. Pure: nothing here touches a store or a disk.

S3 (all under the bucket)::

    checkpoints/<team>/<run>/step-<N:012d>/shards/<relpath>   every file DCP wrote (from every node)
    checkpoints/<team>/<run>/step-<N:012d>/parts/<part>.json  one per node: what it uploaded (size + sha256)
    checkpoints/<team>/<run>/step-<N:012d>/manifest.json      written LAST with If-None-Match: * = committed
    checkpoints/<team>/<run>/step-<N:012d>/incomplete.json    the upload was given up (never valid)
    checkpoints/<team>/<run>/tags/<tag>                       {"step": N}: kept by retention whatever K is

Node-local staging (``NURO_STAGING_ROOT``, default ``/var/tmp/nuro-staging``)::

    <root>/<job_id>/ckpt/step-<N:012d>/...           what DCP wrote on this node
    <root>/<job_id>/ckpt/step-<N:012d>/.upload-<part>.json  a node's upload request (atomic, after DCP finished)
    <root>/<job_id>/restore/step-<N:012d>/           a checkpoint the prolog staged for this job
    <root>/cache/<team>/<run>/step-<N:012d>/         the newest committed copy an ended job left on this node
    <root>/.jobs/<job_id>.json                       the job's root-owned record (``nuro.protocol.jobrecord``): whose
                                                     checkpoints root stages, uploads and prunes for the job

Steps are zero-padded to 12 digits so keys and directory names sort in step order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from nuro import names
from nuro.checkpoint.errors import InvalidCheckpointInput

PREFIX = "checkpoints/"
DEFAULT_STAGING_ROOT = "/var/tmp/nuro-staging"
CACHE_DIR = "cache"
#: Root's hand-off markers below the staging root (``nuro.checkpoint.handoff``): ``.handoff/<job id>``.
HANDOFF_DIR = ".handoff"
STEP_WIDTH = 12
MAX_STEP = 10**STEP_WIDTH - 1

_STEP_DIR = re.compile(r"step-([0-9]{12})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def node_staging_root(raw: str, node: str | None) -> Path:
    """A ``NURO_STAGING_ROOT`` value with ``{node}`` replaced by the node's name: emulated nodes that share one file
    system (the dev cluster) each need their own root."""
    if "{node}" in raw:
        if not node or "/" in node or node.startswith("."):
            raise InvalidCheckpointInput(f"NURO_STAGING_ROOT={raw} needs SLURMD_NODENAME, got {node!r}")
        raw = raw.replace("{node}", node)
    return Path(raw)


def _checked(check: Callable[[object], str], value: object) -> str:
    """``nuro.names``'s check, refusing as every checkpoint input is refused (``InvalidCheckpointInput``)."""
    try:
        return check(value)
    except names.InvalidName as exc:
        raise InvalidCheckpointInput(str(exc)) from None


def validate_team(team: object) -> str:
    return _checked(names.validate_team, team)


def validate_run(run: object) -> str:
    return _checked(names.validate_run, run)


def validate_tag(tag: object) -> str:
    return _checked(names.validate_tag, tag)


def validate_job_id(job_id: object) -> str:
    return _checked(names.validate_job_id, job_id)


def validate_node(node: object) -> str:
    return _checked(names.validate_node, node)


def validate_step(step: object) -> int:
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        raise InvalidCheckpointInput(f"bad step {step!r}: expected an integer between 0 and {MAX_STEP}")
    return step


def path_problem(path: object) -> str | None:
    """Why ``path`` cannot name a file inside a checkpoint, or None: relative POSIX, no '..', '.', empty parts or
    control characters, at most 1024 bytes. It is joined to a local directory as root, so it must not escape it."""
    if not isinstance(path, str) or not path:
        return "empty path"
    if len(path.encode("utf-8", "surrogatepass")) > 1024:
        return "longer than 1024 bytes"
    if _CONTROL.search(path):
        return "contains a control character"
    if path.startswith("/"):
        return "absolute path"
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "contains an empty, '.' or '..' component"
    return None


def validate_path(path: object) -> str:
    problem = path_problem(path)
    if problem:
        raise InvalidCheckpointInput(f"bad checkpoint file path {path!r}: {problem}")
    return path  # type: ignore[return-value]


def step_name(step: int) -> str:
    return f"step-{validate_step(step):0{STEP_WIDTH}d}"


def parse_step_name(name: str) -> int | None:
    """The step of a ``step-<12 digits>`` name (a directory or a key component), else None."""
    m = _STEP_DIR.fullmatch(name.rstrip("/"))
    return int(m.group(1)) if m else None


def run_prefix(team: str, run: str) -> str:
    return f"{PREFIX}{validate_team(team)}/{validate_run(run)}/"


def step_prefix(team: str, run: str, step: int) -> str:
    return f"{run_prefix(team, run)}{step_name(step)}/"


def shard_key(team: str, run: str, step: int, relpath: str) -> str:
    return f"{step_prefix(team, run, step)}shards/{validate_path(relpath)}"


def part_key(team: str, run: str, step: int, part: int) -> str:
    return f"{step_prefix(team, run, step)}parts/{part}.json"


def parts_prefix(team: str, run: str, step: int) -> str:
    return f"{step_prefix(team, run, step)}parts/"


def manifest_key(team: str, run: str, step: int) -> str:
    return f"{step_prefix(team, run, step)}manifest.json"


def incomplete_key(team: str, run: str, step: int) -> str:
    return f"{step_prefix(team, run, step)}incomplete.json"


def tag_key(team: str, run: str, tag: str) -> str:
    return f"{run_prefix(team, run)}tags/{validate_tag(tag)}"


def tags_prefix(team: str, run: str) -> str:
    return f"{run_prefix(team, run)}tags/"


# -- node-local ------------------------------------------------------------------------------------------------
# Per step dir: one request per part (node), so nodes that share a file system (emulated nodes, a shared scratch)
# never overwrite each other's request; "committed" and "given up" are facts about the step, one marker each.
DONE_FILE = ".upload.done.json"
ABANDONED_FILE = ".upload.abandoned.json"
VERIFIED_FILE = ".verified.json"
_REQUEST = re.compile(r"\.upload-([0-9]{1,6})\.json")


def request_file(part: int) -> str:
    return f".upload-{part}.json"


def lock_file(part: int) -> str:
    return f".upload-{part}.lock"


def state_file(part: int) -> str:
    return f".upload-{part}.state"


def parse_request_file(name: str) -> int | None:
    """The part number of a request file name, else None."""
    m = _REQUEST.fullmatch(name)
    return int(m.group(1)) if m else None


def is_control_file(relpath: str) -> bool:
    """Files of ours inside a step directory (markers, locks, and their ``.<name>.tmp.*`` temp files): never part
    of the checkpoint."""
    return "/" not in relpath and relpath.lstrip(".").startswith(("upload", "verified"))


#: A job's staging folders (``<root>/<job_id>/<name>``): what DCP writes, what the prolog staged for a restore.
CKPT_DIR = "ckpt"
RESTORE_DIR = "restore"


def job_ckpt_dir(job_dir: Path) -> Path:
    return job_dir / CKPT_DIR


def job_restore_dir(job_dir: Path) -> Path:
    return job_dir / RESTORE_DIR


def cache_dir(staging_root: Path, team: str, run: str) -> Path:
    return staging_root / CACHE_DIR / validate_team(team) / validate_run(run)

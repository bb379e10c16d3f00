"""Small converters for Slurm field values (times, GRES/TRES strings, exit statuses). Pure, shared by parse.py.

Why separate: every parser meets the same encodings (epoch 0 for "unset", "gpu:a100:8(S:0-1)", "gres/gpu=16",
wait(2) statuses), and each must be decoded one way only.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime

log = logging.getLogger(__name__)

_NO_TIME = {"", "0", "unknown", "none", "n/a", "(null)", "invalid"}
_UINT32_INFINITE = 0xFFFFFFFF
_UINT32_NO_VAL = 0xFFFFFFFE


def epoch_to_dt(value: object) -> datetime | None:
    """Slurm epoch seconds → aware UTC datetime; 0, None and Slurm's INFINITE/NO_VAL → None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, dict):  # newer Slurm: {"set": true, "infinite": false, "number": 123}
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    try:
        seconds = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    if seconds <= 0 or seconds in (_UINT32_INFINITE, _UINT32_NO_VAL):
        return None
    return datetime.fromtimestamp(seconds, tz=UTC)


def text_to_dt(value: str | None) -> datetime | None:
    """scontrol/squeue text time ("2024-05-01T12:00:00", local time of the Slurm client) → aware UTC.

    Text output carries no zone; it is the local zone of the machine running the command, which is this one.
    """
    if value is None or value.strip().lower() in _NO_TIME:
        return None
    try:
        naive = datetime.strptime(value.strip(), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return naive.astimezone().astimezone(UTC)


#: How data_parser's ``+complex`` output (24.11+) writes an infinite number: a string, where the default output has
#: ``{"infinite": true}``.
_INFINITE_TEXT = {"infinity", "-infinity", "infinite", "unlimited", "nan"}


def as_int(value: object, default: int = 0) -> int:
    """Int from a JSON number, a numeric string, or newer Slurm's {"set","number"} wrapper; else ``default``.
    Infinite or unset (``{"infinite": true}``, ``"Infinity"`` of the ``+complex`` output, ``None``) is ``default``."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return default
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, str) and value.strip().lower() in _INFINITE_TEXT:
        return default
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        try:
            return int(float(str(value)))
        except (ValueError, OverflowError):
            return default


def as_str(value: object) -> str:
    """String or "" for None / "(null)"."""
    if value is None:
        return ""
    text = str(value)
    return "" if text == "(null)" else text


def _split_gres(text: str) -> list[str]:
    """Split "gpu:8(S:0-1),shard:4" on commas outside parentheses."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


def gpu_count_from_gres(text: str | None, name: str = "gpu") -> int:
    """Total count of GRES ``name`` in a GRES/TRES-per-node string; 0 when absent.

    Handles "gpu:8", "gpu:a100:8(S:0-1)", "gres:gpu:8" (22.05 tres_per_node), "gres/gpu:8", "gres/gpu=8",
    "gpu:(null):0(IDX:N/A)" (22.05 gres_used on an idle node) and "gpu:2(IDX:0-1)". A bare "gpu" counts 1.
    """
    if not text or text in ("(null)", "N/A"):
        return 0
    total = 0
    for item in _split_gres(text):
        if "=" in item:  # TRES form: gres/gpu=8 or gres/gpu:a100=8
            key, _, count = item.partition("=")
            key = key.removeprefix("gres/").removeprefix("gres:")
            if key.split(":")[0] == name and count.isdigit():
                total += int(count)
            continue
        item = re.sub(r"\([^()]*\)$", "", item.replace("(null)", ""))
        if item.startswith("gres/"):
            item = item[len("gres/") :]
        parts = [p for p in item.split(":") if p]
        if parts and parts[0] == "gres":
            parts = parts[1:]
        if not parts or parts[0] != name:
            continue
        # name[:type][:count]; a missing count means 1 (Slurm's default for "--gres=gpu").
        total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1
    return total


def tres_to_dict(text: str | None) -> dict[str, str]:
    """Parse "cpu=32,mem=125G,node=2,billing=32,gres/gpu=16" → {"cpu": "32", ..., "gres/gpu": "16"}."""
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def gpus_from_tres(text: str | None) -> int:
    """GPU count in a TRES string: "gres/gpu" plus typed "gres/gpu:a100" entries (typed ones only if untyped absent)."""
    tres = tres_to_dict(text)
    if "gres/gpu" in tres:
        return as_int(tres["gres/gpu"])
    return sum(as_int(v) for k, v in tres.items() if k.startswith("gres/gpu:"))


def decode_wait_status(raw: object) -> tuple[int | None, int | None]:
    """A wait(2) status as squeue/scontrol report it → (exit code, signal).

    squeue JSON ``exit_code`` is the raw status: 0 ok, 256 = exit 1, 9 = killed by SIGKILL. Slurm's NO_VAL
    (job not finished) gives (None, None).
    """
    if raw is None or isinstance(raw, bool):
        return None, None
    status = as_int(raw, default=-1)
    if status < 0 or status in (_UINT32_NO_VAL, _UINT32_INFINITE):
        return None, None
    signal = status & 0x7F
    if signal:
        return None, signal
    return (status >> 8) & 0xFF, None


def decode_exit_pair(text: str | None) -> tuple[int | None, int | None]:
    """sacct/scontrol "ExitCode=1:0" form → (1, None); "0:9" → (0, 9)."""
    if not text or ":" not in text:
        return None, None
    code, _, sig = text.partition(":")
    return (as_int(code) if code.isdigit() else None), (as_int(sig) or None if sig.isdigit() else None)


def node_state_text(base: str, flags: list[str] | tuple[str, ...]) -> str:
    """Compose "IDLE+DRAIN" from a base state and flags, as ``scontrol show node`` writes State=."""
    words = [base.upper()] + [f.upper() for f in flags if f and f.upper() != base.upper()]
    return "+".join(w for w in words if w)


_STD_PATTERN = re.compile(r"%(%|[Aajux])")


def expand_std_path(
    pattern: str,
    *,
    job_id: int,
    user: str,
    name: str,
    work_dir: str,
    array_job_id: int | None = None,
    array_task_id: int | None = None,
) -> str:
    """A job's StdOut/StdErr path as ``scontrol show job`` prints it, from the raw pattern JSON gives.

    Why: 22.05's ``squeue --json`` has the raw ``--output`` pattern ("/tmp/o-%j.log", "" for the default) while
    scontrol expands it (``_fname_format`` in src/api/job_info.c): %A, %a, %j, %u, %x and %% here; an empty pattern is
    Slurm's default ``slurm-%j.out`` (``slurm-%A_%a.out`` for an array task); a relative path is under the work dir.
    Other letters (%N, %n, %t, %s, zero padding) are left as they are, as scontrol leaves them.
    """
    if not pattern:
        pattern = "slurm-%A_%a.out" if array_job_id else "slurm-%j.out"
    values = {
        "%": "%",
        "A": str(array_job_id if array_job_id else job_id),
        "a": str(array_task_id if array_task_id is not None else ""),
        "j": str(job_id),
        "u": user,
        "x": name,
    }
    path = _STD_PATTERN.sub(lambda m: values[m.group(1)], pattern)
    return path if path.startswith("/") else f"{work_dir.rstrip('/')}/{path}"

"""nuro's run record in the Slurm job comment: canonical JSON, immutable from submit on, within Slurm's 1,024 bytes.

Slurm is the system of record for jobs (architecture principle 1), so the run's metadata (team, dataset digest, code
commit, checkpoint policy, …) travels with the job itself, readable by one ``squeue --json``:

| key | written by | meaning |
|---|---|---|
| ``nuro`` | submit (nuro-train / nuro-sbatch), never changed afterwards | the run record |

**Nothing else is written into a comment after submit.** slurmctld caps ``comment``, ``admin_comment`` and ``extra``
at 1,024 bytes for everyone, root included, on submit and on every update (``_test_job_desc_fields`` in
slurmctld's job_mgr.c, measured on 22.05), and the job's user may fill the comment up to that cap. So platform
state never depends on room in it: the controller keeps the preemptions it has in flight in a file of its own
(``slurm_plugins/controller/ledger.py``), a job's committed checkpoints and its acknowledgement reach the controller
through the node agent (``nuro.protocol.peerloss`` progress reports, the agent's upload worker, heartbeats), and
root's notes to the job's owner (a preemption, a refusal) go to the ``admin_comment`` that only root and SlurmUser
may write (``nuro.protocol.adminnote``). docs/controller.md has each field's byte budget.

The record's budget is ``MAX_COMMENT_BYTES`` (= Slurm's cap: nothing is appended later, so the record may use it all);
the job_submit bridge refuses a longer record on submit and on update, saying how many bytes over it is
(``scan``), and the submit commands say which fields are longest before they call sbatch (``size_report``).

**The one parser.** Every reader of a job comment (the job_submit bridge, prolog, controller, CLI, admission preview)
agrees on what it says because a comment is a nuro record only in the *canonical form*, the exact bytes
``canonical(obj)`` writes: ``json.dumps(obj, separators=(",", ":"), sort_keys=True)`` (ASCII, ``\\uXXXX`` escapes in
lower case), no key given twice at any depth, and this number subset (decision): **integers only, at most 15 digits**
(``|n| < 10**15``, exact in both Python and Lua 5.1's doubles; no fractions, exponents or ``-0``), so Lua can check
the form without formatting floats. Writers therefore round timestamps to whole seconds; ``merge`` refuses anything
that would not read back. Plus: at most ``MAX_COMMENT_BYTES`` bytes and ``MAX_DEPTH`` levels of nesting. Anything
else (plain text, JSON with a space, a duplicate or escaped key, ``1.5``) is **not a record**: readers see an empty
record, and ``reason(comment)`` says precisely why (the same text job_submit.lua puts in its refusal, produced by
``scan``, a line-by-line mirror of the bridge's scanner). tests/vectors/comment.json and a property test hold the
Python definition, ``scan`` and the Lua bridge to 0 disagreements.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from nuro.protocol.contract import COMMENT_RUN

#: Slurm's cap on a job's comment, admin_comment and extra (bytes, for everyone, root included: job_mgr.c).
SLURM_TEXT_MAX = 1024
#: The run record's budget: all of Slurm's cap, since nothing is appended to the comment after submit.
MAX_COMMENT_BYTES = SLURM_TEXT_MAX
#: What ``scan`` tells a user whose record is over the budget to shorten (the bridge says the same words).
SHORTEN_HINT = "shorten the run name, the code repo path or the entry's arguments"
MAX_DEPTH = 32  # containers nested at most this deep (the top object is level 1)
MAX_INT_DIGITS = 15  # |n| < 10**15: exact in a double, so Lua 5.1 and Python agree
_INT_LIMIT = 10**MAX_INT_DIGITS


@dataclass(frozen=True)
class JobComment:
    """The parsed comment. Unknown keys are kept in ``raw`` and written back untouched.

    ``not_record`` is why the comment is not a nuro record (None when it is one, or when there is no comment).
    """

    raw: dict[str, Any]
    not_record: str | None = field(default=None, compare=False)

    @property
    def record(self) -> dict[str, Any]:
        """The run record (``nuro``: what submit wrote), or {} for a comment without one."""
        rec = self.raw.get(COMMENT_RUN)
        return rec if isinstance(rec, dict) else {}


def may_hold(comment: str, key: str) -> bool:
    """Whether ``comment`` may carry the top-level ``key``: a substring test that lets a reader skip parsing the
    comments of most jobs (the controller reads every running job's each cycle); ``parse`` decides."""
    return f'"{key}"' in comment


# --- the canonical form ---------------------------------------------------------------------------------------------


def canonical(obj: Any) -> str:
    """The canonical text of ``obj``: the only form in which a comment is a nuro record."""
    return json.dumps(obj, separators=(",", ":"), sort_keys=True)


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Duplicate("duplicate key")
    return obj


def _refuse(_: str) -> Any:
    raise ValueError("not an integer")


def _fits(v: Any, depth: int) -> bool:
    """Integers within MAX_INT_DIGITS, nesting within MAX_DEPTH (floats never get here: parse_float refuses)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return True
    if isinstance(v, int):
        return -_INT_LIMIT < v < _INT_LIMIT
    if isinstance(v, dict | list):
        if depth > MAX_DEPTH:
            return False
        items = v.values() if isinstance(v, dict) else v
        return all(_fits(x, depth + 1) for x in items)
    return False


def _byte_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def record(comment: str | None) -> dict[str, Any] | None:
    """The comment's record when it is in canonical form, else None. The definition every reader shares."""
    if not comment or comment[0] != "{" or _byte_len(comment) > MAX_COMMENT_BYTES or not comment.isascii():
        return None
    try:
        obj = json.loads(comment, object_pairs_hook=_no_duplicates, parse_float=_refuse, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not _fits(obj, 1) or canonical(obj) != comment:
        return None
    return obj


def parse(comment: str | None) -> JobComment:
    """Parse a job comment. Anything that is not a canonical record (a plain user comment) yields an empty record
    whose ``not_record`` says why."""
    if not comment:
        return JobComment({})
    obj = record(comment)
    if obj is None:
        return JobComment({}, not_record=reason(comment) or "not in canonical form")
    return JobComment(obj)


def reason(comment: str | None) -> str | None:
    """Why ``comment`` is not a nuro record (the bridge's words), or None when it is one."""
    if not comment:
        return "it is empty"
    return scan(comment)


def merge(comment: str | None, **updates: Any) -> str:
    """The comment with ``updates`` set (``None`` deletes a key), in canonical form.

    Raises:
        ValueError: the result would be too big, or would not read back as a record (a float, a number of more than
            15 digits, nesting deeper than MAX_DEPTH): writers round timestamps to whole seconds.
    """
    data = dict(parse(comment).raw)
    if comment and not data and comment.strip():
        data = {"user_comment": comment}  # keep a plain-text comment rather than dropping it
    for key, value in updates.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    text = canonical(data)
    size = _byte_len(text)
    if size > MAX_COMMENT_BYTES:
        raise ValueError(f"the job comment would be {size_report(text)} ({SHORTEN_HINT})")
    if record(text) is None:
        raise ValueError(f"job comment would not be a nuro record ({scan(text)}): {text[:200]}")
    return text


def size_report(comment: str, top: int = 3) -> str:
    """How much of the budget ``comment`` uses, and (over it) its longest fields: what submit prints before sbatch.

    E.g. ``1,130 bytes, 106 over the 1,024 Slurm allows in a job comment; longest: nuro.entry.args 512 bytes,
    nuro.code.repo 230 bytes`` or ``486 of 1,024 bytes (538 left)``."""
    size = _byte_len(comment)
    if size <= MAX_COMMENT_BYTES:
        return f"{size:,} of {MAX_COMMENT_BYTES:,} bytes ({MAX_COMMENT_BYTES - size:,} left)"
    try:
        obj = json.loads(comment)
    except ValueError:
        obj = None
    sizes: list[tuple[int, str]] = []

    def walk(v: Any, path: str) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else str(k))
        else:
            sizes.append((_byte_len(canonical(v)), path))

    walk(obj, "")
    longest = ", ".join(f"{p} {n:,} bytes" for n, p in sorted(sizes, reverse=True)[:top])
    return (f"{size:,} bytes, {size - MAX_COMMENT_BYTES:,} over the {MAX_COMMENT_BYTES:,} Slurm allows in a job "
            f"comment" + (f"; longest: {longest}" if longest else ""))  # fmt: skip


# --- the scanner: why a comment is not canonical (line-by-line mirror of job_submit.lua's scan) ----------------------

_STR_SPECIAL = re.compile(r"[^ !#-\[\]-~]")  # anything but printable ASCII without " and \
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")
_NUMBER = re.compile(r"-?[0-9]+")
_NAMED = {'"': 0x22, "\\": 0x5C, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9}
_SPACE = " \t\n\r"


class _Stop(Exception):
    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _at(i: int) -> str:
    return f"at byte {i + 1}"


def _key_text(raw: str) -> str:
    return raw if len(raw) <= 40 else raw[:37] + "..."


def scan(c: str) -> str | None:
    """None when ``c`` is canonical, else the first problem, e.g. ``a space or line break at byte 9``.

    A single left-to-right pass with the same checks, order and words as ``scan`` in job_submit.lua."""
    size = _byte_len(c)
    if size > MAX_COMMENT_BYTES:
        return (
            f"it is {size} bytes, {size - MAX_COMMENT_BYTES} over the {MAX_COMMENT_BYTES} Slurm allows in a job "
            f"comment ({SHORTEN_HINT})"
        )
    if not c:
        return "it is empty"
    if c[0] != "{":
        return "it does not start with {"
    try:
        end = _value(c, 0, 0)
    except _Stop as stop:
        return stop.why
    if end < len(c):
        return f"text after the closing }} {_at(end)}"
    return None


def _value(c: str, i: int, depth: int) -> int:
    if i >= len(c):
        raise _Stop("it ends early")
    ch = c[i]
    if ch == "{":
        return _object(c, i, depth + 1)
    if ch == "[":
        return _array(c, i, depth + 1)
    if ch == '"':
        return _string(c, i)[0]
    if ch == "-" or "0" <= ch <= "9":
        return _number(c, i)
    for word in ("true", "false", "null"):
        if c.startswith(word, i):
            return i + len(word)
    raise _Stop(_unexpected(c, i))


def _unexpected(c: str, i: int) -> str:
    if i >= len(c):
        return "it ends early"
    if c[i] in _SPACE:
        return f"a space or line break {_at(i)} (the canonical form has none)"
    if not " " < c[i] <= "~":
        return f"a character outside printable ASCII {_at(i)}"
    return f"unexpected '{c[i]}' {_at(i)}"


def _object(c: str, i: int, depth: int) -> int:
    if depth > MAX_DEPTH:
        raise _Stop(f"nesting deeper than {MAX_DEPTH} levels {_at(i)}")
    i += 1
    if c.startswith("}", i):
        return i + 1
    prev: list[int] | None = None
    prev_raw = ""
    while True:
        if not c.startswith('"', i):
            raise _Stop(_unexpected(c, i))
        key_at = i
        i, key = _string(c, i, want_key=True)
        raw = c[key_at + 1 : i - 1]
        if prev is not None:
            order = _compare(prev, key)
            if order == 0:
                raise _Stop(f'key "{_key_text(raw)}" given twice {_at(key_at)}')
            if order > 0:
                raise _Stop(f'key "{_key_text(raw)}" {_at(key_at)} is out of order (after "{_key_text(prev_raw)}")')
        prev, prev_raw = key, raw
        if not c.startswith(":", i):
            raise _Stop(_unexpected(c, i))
        i = _value(c, i + 1, depth)
        if c.startswith("}", i):
            return i + 1
        if not c.startswith(",", i):
            raise _Stop(_unexpected(c, i))
        i += 1


def _array(c: str, i: int, depth: int) -> int:
    if depth > MAX_DEPTH:
        raise _Stop(f"nesting deeper than {MAX_DEPTH} levels {_at(i)}")
    i += 1
    if c.startswith("]", i):
        return i + 1
    while True:
        i = _value(c, i, depth)
        if c.startswith("]", i):
            return i + 1
        if not c.startswith(",", i):
            raise _Stop(_unexpected(c, i))
        i += 1


def _compare(a: list[int], b: list[int]) -> int:
    return (a > b) - (a < b)


def _string(c: str, i: int, want_key: bool = False) -> tuple[int, list[int]]:
    """End of the string literal at ``i`` and (for keys) its code points, surrogate pairs combined as JSON does."""
    j = i + 1
    units: list[int] = []
    while True:
        m = _STR_SPECIAL.search(c, j)
        if m is None:
            raise _Stop(f"a string {_at(i)} that never ends")
        k = m.start()
        if want_key:
            units.extend(ord(x) for x in c[j:k])
        ch = c[k]
        if ch == '"':
            return k + 1, _combine(units)
        if ch != "\\":
            raise _Stop(f"a character outside printable ASCII {_at(k)} (write it as a \\u escape)")
        if k + 1 >= len(c):
            raise _Stop(f"a string {_at(i)} that never ends")
        e = c[k + 1]
        if e == "u":
            hexs = c[k + 2 : k + 6]
            if not _HEX4.fullmatch(hexs):
                raise _Stop(f"a bad \\u escape {_at(k)}")
            if hexs != hexs.lower():
                raise _Stop(f"an upper-case \\u escape {_at(k)} (nuro writes lower case)")
            v = int(hexs, 16)
            if 0x20 <= v <= 0x7E or v in (8, 9, 10, 12, 13):
                raise _Stop(f"a needless escape \\u{hexs} {_at(k)} (write the character itself or its short escape)")
            units.append(v)
            j = k + 6
        elif e in _NAMED and e != "/":
            units.append(_NAMED[e])
            j = k + 2
        else:
            raise _Stop(f"the escape \\{e if ' ' < e <= '~' else '?'} {_at(k)} (not in the canonical form)")


def _combine(units: list[int]) -> list[int]:
    """UTF-16 units to code points: a high surrogate followed by a low one is one character (as json.loads reads)."""
    out: list[int] = []
    n, k = len(units), 0
    while k < n:
        u = units[k]
        if 0xD800 <= u <= 0xDBFF and k + 1 < n and 0xDC00 <= units[k + 1] <= 0xDFFF:
            out.append(0x10000 + ((u - 0xD800) << 10) + (units[k + 1] - 0xDC00))
            k += 2
        else:
            out.append(u)
            k += 1
    return out


def _number(c: str, i: int) -> int:
    m = _NUMBER.match(c, i)
    if m is None:
        raise _Stop(_unexpected(c, i))
    end, digits = m.end(), m.group().lstrip("-")
    if end < len(c) and c[end] in ".eE":
        raise _Stop(f"a number {_at(i)} that is not a whole number (nuro writes integers only)")
    if len(digits) > 1 and digits[0] == "0":
        raise _Stop(f"a number with a leading zero {_at(i)}")
    if m.group() == "-0":
        raise _Stop(f"minus zero {_at(i)}")
    if len(digits) > MAX_INT_DIGITS:
        raise _Stop(f"a number of more than {MAX_INT_DIGITS} digits {_at(i)}")
    return end


__all__ = [
    "MAX_COMMENT_BYTES",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "SHORTEN_HINT",
    "SLURM_TEXT_MAX",
    "JobComment",
    "canonical",
    "may_hold",
    "merge",
    "parse",
    "reason",
    "record",
    "scan",
    "size_report",
]

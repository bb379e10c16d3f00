"""Strict value kinds for the job spec: every user-controlled string is checked against an allow-list pattern.

Why allow-lists and not escaping: job spec values end up in an sbatch script, in ``#SBATCH`` lines (which sbatch
parses with its own quote rules), in the job comment that the prolog and the controller parse as root, in paths on
shared file systems and in environment variables. Proving one escaping scheme right for all of those is harder than
refusing everything that is not plainly a name, a number or a path (architecture principle 4). The renderer still
``shlex.quote``s, as a second line of defence.

Each kind turns a raw value (from YAML or a command-line flag, so strings are accepted for numbers too) into a
checked Python value, or raises ``FieldError`` with a message that says what is allowed and shows the first
offending character. Values are shown with ``ascii()`` and truncated, so a 10 KB string, a newline or a right-to-left
override cannot garble the terminal that prints the error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nuro import names

#: Team / tier names: Slurm account/QOS names (``nuro.names.TEAM``, as ``nuro.policy.model.NAME``), anchored.
TEAM_PATTERN = rf"^{names.TEAM}$"

_SAFE_CHAR = re.compile(r"[A-Za-z0-9._-]")
SHOW_MAX = 40


class FieldError(ValueError):
    """A value is not acceptable; the message says why and what is allowed (without the field name)."""


def show(value: object) -> str:
    """The value as an error message shows it: ASCII only, control and bidi characters escaped, at most ~40 chars."""
    text = ascii(value)
    if len(text) > SHOW_MAX:
        size = len(value) if isinstance(value, str | bytes | list | dict) else None
        text = text[:SHOW_MAX] + "..." + (f" ({size} chars)" if size is not None else "")
    return text


def _first_bad(text: str, allowed: re.Pattern[str]) -> str:
    for i, ch in enumerate(text):
        if not allowed.fullmatch(ch):
            return f"; found {ascii(ch)} at position {i}"
    return ""


def check_string(value: object, *, pattern: str, what: str, max_len: int, chars: str | None = None) -> str:
    """The value as a str when it is a str of at most ``max_len`` characters that fully matches ``pattern``.

    Args:
        pattern: the allow-list (matched with ``re.fullmatch`` in ASCII mode: ``$`` cannot accept a trailing newline
            and ``\\d`` cannot accept non-ASCII digits).
        what: the rule in words, e.g. "letters, digits and . _ - (at most 63), starting with a letter or digit".
        chars: a one-character class (e.g. ``[A-Za-z0-9._-]``) used to point at the first character not allowed.
    """
    if not isinstance(value, str):
        raise FieldError(f"must be a string ({what}), got {type(value).__name__} {show(value)}")
    if not value:
        raise FieldError(f"must not be empty ({what})")
    if len(value) > max_len:
        raise FieldError(f"is {len(value)} characters long, at most {max_len} allowed ({what}); got {show(value)}")
    if "\x00" in value:
        raise FieldError(f"contains a NUL byte ({what}); got {show(value)}")
    if not re.fullmatch(pattern, value, flags=re.ASCII):
        hint = _first_bad(value, re.compile(chars, re.ASCII)) if chars else ""
        raise FieldError(f"must be {what}{hint}; got {show(value)}")
    return value


@dataclass(frozen=True)
class Kind:
    """A value kind: ``parse`` checks and converts, ``metavar`` names it in --help, ``doc`` describes it."""

    metavar: str = "TEXT"
    doc: str = ""

    def parse(self, raw: Any) -> Any:  # pragma: no cover - every kind overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class Text(Kind):
    pattern: str = r"^$"
    max_len: int = 64
    chars: str | None = None

    def parse(self, raw: Any) -> str:
        return check_string(raw, pattern=self.pattern, what=self.doc, max_len=self.max_len, chars=self.chars)


@dataclass(frozen=True)
class Int(Kind):
    minimum: int = 0
    maximum: int = 2**31 - 1
    metavar: str = "INT"

    def parse(self, raw: Any) -> int:
        if isinstance(raw, str) and re.fullmatch(r"[0-9]{1,10}", raw, flags=re.ASCII):
            raw = int(raw)
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise FieldError(f"must be a whole number from {self.minimum} to {self.maximum}, got {show(raw)}")
        if not self.minimum <= raw <= self.maximum:
            raise FieldError(f"must be from {self.minimum} to {self.maximum}, got {raw}")
        return raw


@dataclass(frozen=True)
class Flag(Kind):
    metavar: str = ""

    def parse(self, raw: Any) -> bool:
        if isinstance(raw, bool):
            return raw
        raise FieldError(f"must be true or false, got {show(raw)}")


_TIME_FORMS = (
    (r"([0-9]{1,6})", lambda m: int(m[1]) * 60),  # minutes
    (r"([0-9]{1,6}):([0-5][0-9])", lambda m: int(m[1]) * 60 + int(m[2])),  # M:S
    (r"([0-9]{1,4}):([0-5][0-9]):([0-5][0-9])", lambda m: int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])),
    (r"([0-9]{1,3})-([0-9]{1,2})", lambda m: int(m[1]) * 86400 + int(m[2]) * 3600),
    (r"([0-9]{1,3})-([0-9]{1,2}):([0-5][0-9])", lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60),
    (
        r"([0-9]{1,3})-([0-9]{1,2}):([0-5][0-9]):([0-5][0-9])",
        lambda m: int(m[1]) * 86400 + int(m[2]) * 3600 + int(m[3]) * 60 + int(m[4]),
    ),
)


@dataclass(frozen=True)
class Choice(Kind):
    """One of a fixed set of words."""

    choices: tuple[str, ...] = ()

    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str) or raw not in self.choices:
            raise FieldError(f"must be one of {', '.join(self.choices)}; got {show(raw)}")
        return raw


@dataclass(frozen=True)
class TimeLimit(Kind):
    """A Slurm time limit in one of sbatch's forms (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S), or an int of minutes."""

    metavar: str = "TIME"
    minimum_s: int = 60
    maximum_s: int = 30 * 86400

    def parse(self, raw: Any) -> int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        what = "a Slurm time limit: minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S (e.g. 90, 4:00:00, 2-12:00:00)"
        text = check_string(raw, pattern=r"^[0-9:-]+$", what=what, max_len=16, chars=r"[0-9:-]")
        for form, seconds in _TIME_FORMS:
            m = re.fullmatch(form, text, flags=re.ASCII)
            if m:
                total = seconds(m)
                if not self.minimum_s <= total <= self.maximum_s:
                    raise FieldError(
                        f"must be from {self.minimum_s // 60} minute(s) to {self.maximum_s // 86400} days, got {text}"
                    )
                return total
        raise FieldError(f"must be {what}; got {show(text)}")


_PATH_PART = r"[A-Za-z0-9_+][A-Za-z0-9._+-]{0,127}|\.[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,126}"
_PATH_CHARS = r"[A-Za-z0-9._+/-]"


def _check_parts(text: str, what: str) -> None:
    for part in text.strip("/").split("/"):
        if part in ("", ".", ".."):
            raise FieldError(f"must be {what}; '..', '.' and empty components (//) are not allowed; got {show(text)}")


@dataclass(frozen=True)
class AbsPath(Kind):
    """An absolute path of plain components: no '..', no '.', no '//', no spaces or shell characters."""

    metavar: str = "PATH"
    max_len: int = 512

    def parse(self, raw: Any) -> str:
        what = "an absolute path (starting with /) of letters, digits and . _ + - components"
        if isinstance(raw, str) and raw and not raw.startswith("/"):
            raise FieldError(f"must be {what}, not a relative path; got {show(raw)}")
        text = check_string(raw, pattern=rf"^(/(?:{_PATH_PART}))+$", what=what, max_len=self.max_len, chars=_PATH_CHARS)
        _check_parts(text, what)
        return text


@dataclass(frozen=True)
class RelPath(Kind):
    """A path relative to the code checkout: plain components, never absolute, never leaving the checkout."""

    metavar: str = "PATH"
    max_len: int = 256

    def parse(self, raw: Any) -> str:
        what = "a relative path inside the repository (letters, digits and . _ + - components)"
        if isinstance(raw, str) and raw.startswith("/"):
            raise FieldError(f"must be {what}, not an absolute path; got {show(raw)}")
        if isinstance(raw, str) and ".." in raw.split("/"):
            raise FieldError(f"must be {what}; '..' would leave the checkout; got {show(raw)}")
        text = check_string(
            raw, pattern=rf"^(?:{_PATH_PART})(?:/(?:{_PATH_PART}))*$", what=what, max_len=self.max_len,
            chars=_PATH_CHARS,
        )  # fmt: skip
        _check_parts(text, what)
        return text


#: Dataset names and tags as nuro.datasets writes them; a digest is the manifest's sha256.
DATASET_NAME = r"[a-z0-9][a-z0-9._-]{0,62}"  # as nuro.datasets.manifest._NAME
DATASET_TAG = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
DIGEST = r"sha256:[0-9a-f]{64}"


@dataclass(frozen=True)
class DatasetRef(Kind):
    """``name@tag`` (resolved to a digest at submit) or ``name@sha256:<64 hex>`` (already immutable)."""

    metavar: str = "NAME@REF"

    def parse(self, raw: Any) -> str:
        what = "NAME@TAG or NAME@sha256:<64 lower-case hex> (name: a-z 0-9 . _ -, tag: A-Z a-z 0-9 . _ -)"
        return check_string(
            raw, pattern=rf"^{DATASET_NAME}@(?:{DIGEST}|{DATASET_TAG})$", what=what, max_len=200,
            chars=r"[A-Za-z0-9._@:-]",
        )  # fmt: skip


def is_digest_ref(ref: str) -> bool:
    """True for ``name@sha256:<hex>``: a reference that can never change meaning."""
    return re.fullmatch(rf"{DATASET_NAME}@{DIGEST}", ref, flags=re.ASCII) is not None


@dataclass(frozen=True)
class Commit(Kind):
    """A commit id: 7 to 64 lower-case hex digits (abbreviated, SHA-1 or SHA-256). Names like HEAD are resolved
    by omitting the commit (the repository's HEAD is pinned)."""

    metavar: str = "SHA"

    def parse(self, raw: Any) -> str:
        what = "a commit id of 7 to 64 lower-case hex digits (leave it out to pin the repository's HEAD)"
        return check_string(raw, pattern=r"^[0-9a-f]{7,64}$", what=what, max_len=64, chars=r"[0-9a-f]")


ARG_PATTERN = r"^[A-Za-z0-9_.,:=+/@%-]*$"
ARG_CHARS = r"[A-Za-z0-9_.,:=+/@%-]"
_ARG_TRAVERSAL = re.compile(r"(^|[/=])\.\.($|/)")


@dataclass(frozen=True)
class ArgList(Kind):
    """Arguments for the entry script: each from letters, digits and ``_ . , : = + / @ % -``; no spaces."""

    metavar: str = "ARG"
    max_items: int = 64
    max_len: int = 256
    max_total: int = 2048

    def parse(self, raw: Any) -> tuple[str, ...]:
        if isinstance(raw, str | bytes) or not isinstance(raw, list | tuple):
            raise FieldError(f"must be a list of arguments, got {type(raw).__name__} {show(raw)}")
        if len(raw) > self.max_items:
            raise FieldError(f"has {len(raw)} arguments, at most {self.max_items} allowed")
        out: list[str] = []
        for i, item in enumerate(raw):
            if isinstance(item, int | float) and not isinstance(item, bool):
                item = str(item)
            what = "letters, digits and _ . , : = + / @ % - (no spaces or shell characters)"
            if isinstance(item, str) and item == "":
                out.append(item)
                continue
            try:
                text = check_string(item, pattern=ARG_PATTERN, what=what, max_len=self.max_len, chars=ARG_CHARS)
            except FieldError as exc:
                raise FieldError(f"[{i}] {exc}") from None
            if _ARG_TRAVERSAL.search(text):
                raise FieldError(f"[{i}] must not contain a '..' path component; got {show(text)}")
            out.append(text)
        if sum(len(a) + 1 for a in out) > self.max_total:
            raise FieldError(f"are {sum(len(a) + 1 for a in out)} characters together, at most {self.max_total}")
        return tuple(out)


ENV_NAME = r"^[A-Z_][A-Z0-9_]{0,63}$"
#: Names a job's env may not set: nuro's and Slurm's own variables, and those that change how the platform's part
#: of the batch script runs (shell start-up and parsing, git's repository discovery).
ENV_RESERVED_PREFIXES = ("NURO_", "SLURM_", "SBATCH_", "SRUN_", "GIT_", "BASH_FUNC_")
ENV_RESERVED = frozenset({"BASH_ENV", "ENV", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "PATH", "HOME"})


@dataclass(frozen=True)
class EnvMap(Kind):
    """Environment variables for the training processes: ``KEY=VALUE`` strings or a mapping."""

    metavar: str = "KEY=VALUE"
    max_items: int = 64

    def parse(self, raw: Any) -> tuple[tuple[str, str], ...]:
        if isinstance(raw, list | tuple):
            items: dict[Any, Any] = {}
            for entry in raw:
                if not isinstance(entry, str) or "=" not in entry:
                    raise FieldError(f"entries must look like KEY=VALUE, got {show(entry)}")
                key, _, value = entry.partition("=")
                items[key] = value
        elif isinstance(raw, Mapping):
            items = dict(raw)
        else:
            raise FieldError(f"must be a mapping of KEY: VALUE, got {type(raw).__name__} {show(raw)}")
        if len(items) > self.max_items:
            raise FieldError(f"has {len(items)} variables, at most {self.max_items} allowed")
        out: list[tuple[str, str]] = []
        for key, value in items.items():
            name_what = "an upper-case name: A-Z 0-9 _ (at most 64), not starting with a digit"
            try:
                name = check_string(key, pattern=ENV_NAME, what=name_what, max_len=64, chars=r"[A-Z0-9_]")
            except FieldError as exc:
                raise FieldError(f"name {exc}") from None
            if name in ENV_RESERVED or name.startswith(ENV_RESERVED_PREFIXES):
                raise FieldError(
                    f"{name} is reserved (nuro sets NURO_*, Slurm sets SLURM_*; {', '.join(sorted(ENV_RESERVED))} and "
                    f"GIT_*, SBATCH_*, SRUN_*, BASH_FUNC_* would change how the job script itself runs)"
                )
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if value == "":
                out.append((name, ""))
                continue
            what = "letters, digits and _ . , : = + / @ % - (no spaces or shell characters), at most 1024"
            try:
                text = check_string(value, pattern=ARG_PATTERN, what=what, max_len=1024, chars=ARG_CHARS)
            except FieldError as exc:
                raise FieldError(f"{name} {exc}") from None
            if _ARG_TRAVERSAL.search(text):
                raise FieldError(f"{name} must not contain a '..' path component; got {show(text)}")
            out.append((name, text))
        return tuple(sorted(out))

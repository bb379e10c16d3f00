"""How every nuro CLI fails: one table of exit codes and one way to say why.

Scripts branch on the exit status and people read the message, so both must mean the same in every command
(``nuro-train``, ``nuro-sbatch``, ``nuro-admin``, ``nuro-healthcheck``). Text goes to stderr, one line per problem,
prefixed with the command's name (``nuro-sbatch: ...``) or ``error:``; with ``--json`` one object goes to stdout
instead, carrying ``exit_code`` and the messages, so a script never has to parse stderr.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from enum import IntEnum
from typing import Any, NoReturn, ParamSpec

_P = ParamSpec("_P")

#: The standard keys of a JSON failure object, in order (``say``'s ``keys``).
JSON_KEYS = ("exit_code", "error", "errors")


class ExitCode(IntEnum):
    """The exit statuses of nuro's CLIs. 2 is also click's own status for a usage error."""

    OK = 0
    FAILED = 1  # Slurm, the object store or the node refused or failed; the message says which
    USAGE = 2  # bad flags or arguments
    INVALID = 3  # the run spec or the team policy is invalid (the message lists every problem)
    NOT_FOUND = 4  # the run, job, snapshot or object does not exist
    SINK = 5  # the metrics store cannot be reached


def say(
    code: int,
    *lines: str,
    prog: str | None = None,
    as_json: bool = False,
    payload: Mapping[str, Any] | None = None,
    keys: Sequence[str] = JSON_KEYS,
    indent: int | None = 2,
) -> int:
    """Report a failure and return ``code`` (for a ``main`` that returns its status).

    Text: each line on stderr as ``<prog>: <line>``, or ``error: <line>`` without a program name. JSON: one object on
    stdout, ``payload`` plus ``exit_code``, ``error`` (the lines joined) and ``errors`` (the lines); ``keys`` names
    which of those three it carries, in that order (a CLI whose scripts already read a subset keeps its shape);
    ``indent=None`` prints the object on one line (for a CLI whose failure was always one line).
    """
    if as_json:
        standard = {"exit_code": int(code), "error": "\n".join(lines), "errors": list(lines)}
        doc = {**(payload or {}), **{key: standard[key] for key in keys}}
        print(json.dumps(doc, indent=indent), flush=True)
    else:
        for line in lines:
            print(f"{prog or 'error'}: {line}", file=sys.stderr, flush=True)
    return int(code)


def fail(code: int, *lines: str, **options: Any) -> NoReturn:
    """``say`` (same keywords) and exit with ``code``."""
    sys.exit(say(code, *lines, **options))


#: The width of what a CLI prints to a pipe or a file: rich's default there is 80 columns, which cut job names, users
#: and states to "ali…" in ``nuro-train ls | cat``; 160 holds every table nuro prints whole.
PIPED_WIDTH = 160


def stdout_console(**options: Any) -> Any:
    """A rich ``Console`` for a CLI's standard output: the terminal's width, or ``PIPED_WIDTH`` when stdout is not
    a terminal. ``options`` go to rich (``soft_wrap``, ``highlight``)."""
    from rich.console import Console  # lazy: rich costs ~40 ms and the node agent imports this module for ExitCode

    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH, **options)


def problem_list(source: str, problems: Sequence[str]) -> str:
    """``source: N problem(s):``, then ``  - problem`` per problem, its further lines indented beneath it (a YAML
    error carries its snippet and caret over several lines): the one shape of an invalid spec's or policy's errors."""
    lines = [f"{source}: {len(problems)} problem(s):"]
    for problem in problems:
        first, *rest = str(problem).splitlines() or [""]
        lines += [f"  - {first}", *(f"    {line}" for line in rest)]
    return "\n".join(lines)


def quiet_on_closed_pipe(main: Callable[_P, int]) -> Callable[_P, int]:
    """Wrap a CLI's ``main`` so that a reader that stops early (``nuro-sbatch --help | head``) ends it quietly with
    the status a command killed by SIGPIPE has (141, as sbatch's own help then exits), not a traceback. click
    commands get the same from click itself."""

    @functools.wraps(main)
    def wrapped(*args: _P.args, **kwargs: _P.kwargs) -> int:
        try:
            return main(*args, **kwargs)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush at exit must not fail again
            return 128 + signal.SIGPIPE

    return wrapped


__all__ = [
    "JSON_KEYS",
    "PIPED_WIDTH",
    "ExitCode",
    "fail",
    "problem_list",
    "quiet_on_closed_pipe",
    "say",
    "stdout_console",
]

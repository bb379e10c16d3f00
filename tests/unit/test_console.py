"""nuro.console: what every CLI prints to a pipe is as wide as its tables (``nuro-train ls | cat`` cut names to
"ali…" at rich's default 80 columns)."""

from __future__ import annotations

import subprocess
import sys

from nuro.console import PIPED_WIDTH, problem_list


def test_a_piped_console_is_wide_enough_for_the_tables() -> None:
    code = "from nuro.console import stdout_console; print(stdout_console().width)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == PIPED_WIDTH == 160


def test_a_problem_list_keeps_a_multi_line_problem_under_its_dash() -> None:
    """A YAML error carries its snippet and caret on more lines: they stay under their problem, not at the margin."""
    text = problem_list("teams.yaml", ["not valid YAML: while parsing\n  in line 2\n  ^", "teams.a: bad"])
    assert text.splitlines() == [
        "teams.yaml: 2 problem(s):",
        "  - not valid YAML: while parsing",
        "      in line 2",
        "      ^",
        "  - teams.a: bad",
    ]

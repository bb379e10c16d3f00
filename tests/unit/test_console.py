"""nuro.console: what every CLI prints to a pipe is as wide as its tables (``nuro-train ls | cat`` cut names to
"ali…" at rich's default 80 columns)."""

from __future__ import annotations

import subprocess
import sys

from nuro.console import PIPED_WIDTH


def test_a_piped_console_is_wide_enough_for_the_tables() -> None:
    code = "from nuro.console import stdout_console; print(stdout_console().width)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == PIPED_WIDTH == 160

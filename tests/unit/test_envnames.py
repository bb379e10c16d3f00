"""One home for the ``NURO_*`` names (nuro/protocol/envnames.py): no variable name is a string literal in two
product modules; a name two parts share is imported from there."""

from __future__ import annotations

import io
import tokenize
from collections import defaultdict
from pathlib import Path

from nuro.protocol import envnames

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("nuro", "login", "wrappers", "slurm_plugins", "prolog_epilog", "healthcheck", "admin")


def literal_homes() -> dict[str, set[str]]:
    """Each ``NURO_*`` name written as a whole string literal, and the product modules that write it so."""
    homes: dict[str, set[str]] = defaultdict(set)
    for folder in PRODUCT:
        for path in (ROOT / folder).rglob("*.py"):
            src = path.read_text()
            for tok in tokenize.generate_tokens(io.StringIO(src).readline):
                if tok.type == tokenize.STRING and tok.string[:1] in "\"'" and tok.string[1:6] == "NURO_":
                    name = tok.string[1:-1]
                    if name.isidentifier() and name.isupper():
                        homes[name].add(str(path.relative_to(ROOT)))
    return homes


def test_no_nuro_variable_is_spelled_in_two_modules() -> None:
    twice = {name: sorted(where) for name, where in literal_homes().items() if len(where) > 1}
    assert not twice, f"import these from nuro.protocol.envnames instead: {twice}"


def test_the_shared_names_are_their_own_values() -> None:
    shared = {k: v for k, v in vars(envnames).items() if k.startswith("NURO_")}
    assert len(shared) >= 29 and all(k == v for k, v in shared.items())
    assert all(where == {"nuro/protocol/envnames.py"} for n, where in literal_homes().items() if n in shared)

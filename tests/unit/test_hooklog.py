"""The hooks' own log file: ``%n`` per node, append-only, never through a symlink, never fatal."""

from __future__ import annotations

import logging
from pathlib import Path

from nuro.prolog_epilog import hooklog


def test_the_path_names_the_node_and_is_off_when_unset() -> None:
    assert hooklog.hook_log_path({"NURO_HOOK_LOG": "/var/log/nuro/hooks-%n.log"}, "gpu007") == (
        "/var/log/nuro/hooks-gpu007.log"
    )
    assert hooklog.hook_log_path({}, "gpu007") is None and hooklog.attach("nuro-prolog", {}) is None


def test_lines_are_appended_with_node_and_hook(tmp_path: Path) -> None:
    path = tmp_path / "hooks-%n.log"
    (tmp_path / "hooks-gpu003.log").write_text("earlier line\n")
    handler = hooklog.attach("nuro-epilog", {"NURO_HOOK_LOG": str(path), "SLURMD_NODENAME": "gpu003"})
    try:
        logging.getLogger("nuro.epilog").warning("job=42 uploads given up at the deadline")
    finally:
        logging.getLogger().removeHandler(handler)  # type: ignore[arg-type]
        handler.close()  # type: ignore[union-attr]
    lines = (tmp_path / "hooks-gpu003.log").read_text().splitlines()
    assert lines[0] == "earlier line"
    assert lines[1].endswith(" gpu003 nuro-epilog WARNING job=42 uploads given up at the deadline"), lines


def test_a_symlink_in_its_place_is_not_followed_and_costs_only_the_log(tmp_path: Path, caplog) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("")
    (tmp_path / "hooks-gpu003.log").symlink_to(target)
    caplog.set_level(logging.WARNING)
    assert hooklog.attach("nuro-prolog", {"NURO_HOOK_LOG": str(tmp_path / "hooks-%n.log"),
                                          "SLURMD_NODENAME": "gpu003"}) is None  # fmt: skip
    assert target.read_text() == "" and "not opened" in caplog.text

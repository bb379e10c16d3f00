"""Samples of a snapshot: which files make one training example. Pure: a function of the manifest's paths.

A sample is one file (the default) or a group of files that belong together, e.g. the six camera frames, the
calibration and the labels of one timestamp. Groups are named by a regular expression over the paths: files with
the same key (the pattern's groups joined with ``/``, or its whole match when it has none) form one sample. Files
it does not match are not samples (a README, an index). Samples are sorted by key and files within a sample by
path, so sample ``i`` is the same on every node and in every run of the same snapshot. For::

    drive-0001/cam_front/000123.jpg   drive-0001/cam_left/000123.jpg   drive-0001/labels/000123.json

``'^([^/]+)/[^/]+/(\\d+)\\.'`` keys all three on ``drive-0001/000123``: one sample of three files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from nuro.datasets.errors import InvalidInput

Sample = tuple[str, ...]


def compile_pattern(pattern: str) -> re.Pattern[str]:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise InvalidInput(f"bad sample pattern {pattern!r}: {exc}") from None
    return rx


def sample_key(rx: re.Pattern[str], path: str) -> str | None:
    """The key grouping ``path`` into a sample, or None when the path is not part of any sample."""
    m = rx.search(path)
    if m is None:
        return None
    return "/".join(g or "" for g in m.groups()) if rx.groups else m.group(0)


def group_samples(paths: Iterable[str], pattern: str | None = None) -> list[Sample]:
    """The snapshot's samples in their fixed order: one per file without ``pattern``, else one per key."""
    ordered = sorted(paths)
    if pattern is None:
        return [(p,) for p in ordered]
    rx = compile_pattern(pattern)
    groups: dict[str, list[str]] = {}
    for path in ordered:
        key = sample_key(rx, path)
        if key is not None:
            groups.setdefault(key, []).append(path)
    if not groups:
        raise InvalidInput(
            f"sample pattern {pattern!r} matches none of the snapshot's {len(ordered)} files "
            f"(e.g. {ordered[:3]}): check it with `re.search(pattern, path)`"
        )
    return [tuple(groups[k]) for k in sorted(groups)]

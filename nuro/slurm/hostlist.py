"""Slurm hostlist expressions ("gpu[001-004,007],login1") ↔ lists of node names. Pure functions.

Why our own: squeue/sacct/scontrol report node sets compressed, and nuro needs per-node views (which switch, which
GPUs) without shelling out to ``scontrol show hostnames`` for every job.

Supported, as Slurm writes them (src/common/hostlist.c):

* ranges and single numbers in brackets, zero padding kept: ``gpu[001-003]`` → gpu001, gpu002, gpu003;
  a range past the padding width grows (``n[098-100]`` → n098, n099, n100);
* several bracket groups in one name expand as a product: ``r[1-2]n[1-2]`` → r1n1, r1n2, r2n1, r2n2;
* commas inside brackets do not split hosts; text after a bracket is kept (``rack[1-2]-ib``);
* empty strings, ``(null)`` and ``None assigned`` (sacct for jobs that never ran) mean no hosts.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

log = logging.getLogger(__name__)

_EMPTY = {"", "(null)", "none", "none assigned", "n/a"}
_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


class HostlistError(ValueError):
    """A hostlist expression that Slurm itself would reject (unbalanced brackets, bad range)."""


def _split_top_level(expr: str) -> list[str]:
    """Split on commas (and whitespace) that are not inside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets are not valid in a hostlist: {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist: {expr!r}")
        if (ch == "," or ch.isspace()) and depth == 0:
            if current:
                parts.append("".join(current))
            current = []
            continue
        current.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in hostlist: {expr!r}")
    if current:
        parts.append("".join(current))
    return parts


def _expand_range_list(body: str, expr: str) -> list[str]:
    """``"001-003,007"`` → ["001", "002", "003", "007"] keeping the zero padding of the low end."""
    out: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise HostlistError(f"empty range in hostlist: {expr!r}")
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"bad range {item!r} in hostlist: {expr!r}")
        if not sep:
            out.append(lo)
            continue
        start, end = int(lo), int(hi)
        if end < start:
            raise HostlistError(f"descending range {item!r} in hostlist: {expr!r}")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(start, end + 1))
    return out


def _expand_one(host: str, expr: str) -> list[str]:
    """Expand one host pattern that may hold several bracket groups (product, left to right)."""
    results = [""]
    pos = 0
    for match in re.finditer(r"\[([^\]]*)\]", host):
        literal = host[pos : match.start()]
        values = _expand_range_list(match.group(1), expr)
        results = [r + literal + v for r in results for v in values]
        pos = match.end()
    tail = host[pos:]
    return [r + tail for r in results]


def expand(expr: str | None) -> list[str]:
    """Expand a Slurm hostlist expression into node names, in Slurm's order, duplicates kept.

    >>> expand("gpu[001-003,007],login1")
    ['gpu001', 'gpu002', 'gpu003', 'gpu007', 'login1']

    Raises:
        HostlistError: for malformed expressions.
    """
    if expr is None or expr.strip().lower() in _EMPTY:
        return []
    hosts: list[str] = []
    for part in _split_top_level(expr.strip()):
        hosts.extend(_expand_one(part, expr))
    return hosts


def _ranges(numbers: list[int], width: int) -> str:
    """[1, 2, 3, 7] → "1-3,7" with each number padded to ``width``."""
    items: list[str] = []
    start = prev = numbers[0]
    for n in numbers[1:] + [None]:  # type: ignore[list-item]
        if n is not None and n == prev + 1:
            prev = n
            continue
        lo, hi = str(start).zfill(width), str(prev).zfill(width)
        items.append(lo if start == prev else f"{lo}-{hi}")
        if n is not None:
            start = prev = n
    return ",".join(items)


def compress(hosts: Iterable[str]) -> str:
    """Compress node names into a hostlist expression; ``expand(compress(x))`` gives the same set of names.

    Names are grouped by prefix and zero-padding width (in order of first appearance), and numbers sorted and
    de-duplicated within a group, as Slurm does. Names without a trailing number are kept verbatim.

    >>> compress(["gpu003", "gpu001", "gpu002", "gpu007", "login1"])
    'gpu[001-003,007],login1'
    """
    groups: dict[tuple[str, int], set[int]] = {}
    order: list[tuple[str, int] | str] = []
    plain_seen: set[str] = set()
    for host in hosts:
        host = host.strip()
        if not host:
            continue
        m = _TRAILING_NUMBER.match(host)
        if not m:
            if host not in plain_seen:
                plain_seen.add(host)
                order.append(host)
            continue
        prefix, digits = m.group(1), m.group(2)
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        if width == 0:
            # An unpadded number as wide as an existing padded group belongs to it (n098, n099, n100).
            padded = (prefix, len(digits))
            if padded in groups:
                width = len(digits)
        key = (prefix, width)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add(int(digits))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, width = item
        numbers = sorted(groups[item])
        if len(numbers) == 1:
            out.append(f"{prefix}{str(numbers[0]).zfill(width)}")
        else:
            out.append(f"{prefix}[{_ranges(numbers, width)}]")
    return ",".join(out)

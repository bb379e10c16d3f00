"""Rate-limited and once-only logging for the controller's loops: a bad input is logged, not every cycle.

Why: a daemon that logs the same bad record each second (a malformed job comment, a flood of forged datagrams)
fills the disk and hides the one line that matters. ``RateLog.allow(key)`` says whether a line about ``key`` may be
written now (at most once per ``every_s``; ``every_s=inf``: once for as long as the key is remembered) and how many
were suppressed since the last one. Keys are bounded (``max_keys``): when full, the oldest key is forgotten, so a
flood of distinct keys (spoofed source addresses) costs bounded memory and at worst an extra line per new key.

Pure: time comes from ``clock`` (monotonic by default), so it is unit-tested with a fake clock.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable


class RateLog:
    """Decides which log lines get written; see the module docstring."""

    def __init__(
        self, every_s: float = 60.0, max_keys: int = 1024, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if every_s <= 0 or max_keys < 1:
            raise ValueError(f"every_s={every_s} must be > 0 and max_keys={max_keys} >= 1")
        self.every_s = every_s
        self.max_keys = max_keys
        self.clock = clock
        self._last: OrderedDict[Hashable, float] = OrderedDict()
        self._suppressed: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> tuple[bool, int]:
        """(write the line now?, lines about ``key`` suppressed since the last one written)."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and (math.isinf(self.every_s) or now - last < self.every_s):
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False, 0
        if last is None and len(self._last) >= self.max_keys:
            old, _ = self._last.popitem(last=False)
            self._suppressed.pop(old, None)
        self._last[key] = now
        self._last.move_to_end(key)
        return True, self._suppressed.pop(key, 0)

    def forget(self, key: Hashable) -> None:
        """Forget ``key`` (its problem is gone): the next line about it is written at once."""
        self._last.pop(key, None)
        self._suppressed.pop(key, None)

    def keys(self) -> list[Hashable]:
        return list(self._last)

    def __len__(self) -> int:
        return len(self._last)


def once() -> RateLog:
    """A ``RateLog`` that lets one line per key through until the key is forgotten."""
    return RateLog(every_s=math.inf, max_keys=4096)


__all__ = ["RateLog", "once"]
